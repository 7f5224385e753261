// Stub of torch_npu OpCommand.h for the CPU binding test: runs the custom handler at once and raises on failure.
#pragma once
#include <functional>
#include <stdexcept>
#include <string>
namespace at_npu {
namespace native {
class OpCommand {
 public:
  OpCommand& Name(const std::string& name) {
    name_ = name;
    return *this;
  }
  OpCommand& SetCustomHandler(std::function<int()> f) {
    handler_ = std::move(f);
    return *this;
  }
  void Run() {
    if (handler_ && handler_() != 0) throw std::runtime_error(name_ + ": custom handler failed");
  }

 private:
  std::string name_;
  std::function<int()> handler_;
};
}  // namespace native
}  // namespace at_npu
