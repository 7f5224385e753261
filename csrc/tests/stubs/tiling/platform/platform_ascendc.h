// Stub of CANN platform_ascendc.h for the CPU binding test (see ../../README.md).
#pragma once
#include <cstdint>
namespace platform_ascendc {
class PlatformAscendCManager {
 public:
  static PlatformAscendCManager* GetInstance() {
    static PlatformAscendCManager m;
    return &m;
  }
  uint32_t GetCoreNumAiv() const { return 8; }
};
}  // namespace platform_ascendc
