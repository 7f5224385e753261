// Stub of torch_npu NPUStream.h for the CPU binding test (see csrc/tests/stubs/README.md).
#pragma once
#include "acl/acl.h"
namespace c10_npu {
struct NPUStream {
  aclrtStream stream() const { return nullptr; }
};
inline NPUStream getCurrentNPUStream() { return NPUStream{}; }
}  // namespace c10_npu
