// torch_npu binding of the sgrpo AscendC kernels: schemas `sgrpo_npu::*`, PrivateUse1 (NPU) and Meta implementations.
//
// Launches go through at_npu::native::OpCommand with a custom handler, so they are ordered with the matmuls and other
// ops that torch_npu has queued on the same stream (a raw <<<>>> launch from here could overtake them).
// Needs torch + torch_npu headers (C++17 for torch 2.x headers, C++20 with recent torch_npu) and CANN (acl, platform).
// Not compiled on machines without CANN; see csrc/README.md, csrc/scripts/check_binding_cpu.sh (stub
// headers) and csrc/scripts/check_binding_torch_npu.sh (the real torch_npu headers).
#include <ATen/ATen.h>
#include <torch/library.h>

#include <cstdlib>

#include "acl/acl.h"
#include "sgrpo_launch.h"
#include "sgrpo_tiling.h"
#include "tiling/platform/platform_ascendc.h"
#include "torch_npu/csrc/core/npu/NPUStream.h"
#include "torch_npu/csrc/framework/OpCommand.h"

namespace sgrpo_npu {
namespace {

int32_t DtypeCode(const at::Tensor& t, const char* name) {
  switch (t.scalar_type()) {
    case at::kFloat:
      return sgrpo::kFloat32;
    case at::kHalf:
      return sgrpo::kFloat16;
    case at::kBFloat16:
      return sgrpo::kBFloat16;
    default:
      TORCH_CHECK(false, "sgrpo_npu: ", name, " has dtype ", t.scalar_type(), "; expected float32, float16 or bfloat16");
  }
  return -1;
}

uint32_t AivCores() {
  if (const char* env = std::getenv("SGRPO_NPU_CORES")) return static_cast<uint32_t>(std::atoi(env));
  static const uint32_t cores = platform_ascendc::PlatformAscendCManager::GetInstance()->GetCoreNumAiv();
  return cores;
}

uint8_t* Ptr(const at::Tensor& t) { return t.numel() == 0 ? nullptr : static_cast<uint8_t*>(t.data_ptr()); }

void CheckRowVec(const at::Tensor& t, int64_t n, const char* name, at::ScalarType dtype) {
  TORCH_CHECK(t.dim() == 1 && t.size(0) == n && t.is_contiguous() && t.scalar_type() == dtype, "sgrpo_npu: ", name,
              " must be a contiguous (", n, ",) ", dtype, " tensor, got ", t.sizes(), " ", t.scalar_type());
}

// The [2, n] fp32 row statistics (stats[0] = row max m, stats[1] = ln s), contiguous: the kernels address the two rows
// as stats and stats + n.
void CheckStats(const at::Tensor& t, int64_t n) {
  TORCH_CHECK(t.dim() == 2 && t.size(0) == 2 && t.size(1) == n && t.is_contiguous() && t.scalar_type() == at::kFloat,
              "sgrpo_npu: stats must be a contiguous (2, ", n, ") float32 tensor, got ", t.sizes(), " ",
              t.scalar_type());
}

void CheckLogits(const at::Tensor& logits, const char* name) {
  TORCH_CHECK(logits.dim() == 2 && logits.stride(1) == 1, "sgrpo_npu: ", name,
              " must be 2-D with unit column stride, got sizes ", logits.sizes(), " strides ", logits.strides());
  TORCH_CHECK(logits.size(1) < (int64_t{1} << 31), "sgrpo_npu: vocab ", logits.size(1), " too large");
}

}  // namespace

// Folds one [N, Vc] logits (chunk) into the per-row running state and/or finalizes logp, entropy, stats (flags).
void logits_stats(const at::Tensor& logits, const at::Tensor& targets, at::Tensor& state, at::Tensor& logp,
                  at::Tensor& entropy, at::Tensor& stats, int64_t v0, int64_t flags, double inv_tau,
                  int64_t ignore_index) {
  CheckLogits(logits, "logits");
  const int64_t n = logits.size(0), v = logits.size(1);
  CheckRowVec(targets, n, "targets", at::kLong);
  if (flags & (sgrpo::kHasPrev | sgrpo::kWriteState)) {
    TORCH_CHECK(state.dim() == 2 && state.size(0) == n && state.size(1) == sgrpo::kStateFloats &&
                    state.is_contiguous() && state.scalar_type() == at::kFloat,
                "sgrpo_npu: state must be a contiguous (", n, ", 8) float32 tensor");
  }
  if (flags & sgrpo::kFinalize) CheckRowVec(logp, n, "logp", at::kFloat);
  if (flags & sgrpo::kWriteEntropy) CheckRowVec(entropy, n, "entropy", at::kFloat);
  if (flags & sgrpo::kWriteStats) CheckStats(stats, n);
  if (n == 0 || v == 0) return;
  const int32_t dtype = DtypeCode(logits, "logits");
  const sgrpo::KernelTiling t = sgrpo::MakeTiling(n, static_cast<uint32_t>(v), logits.element_size(), AivCores(), false);
  TORCH_CHECK(t.tile > 0, "sgrpo_npu: no UB tiling fits vocab ", v);
  aclrtStream stream = c10_npu::getCurrentNPUStream().stream();
  uint8_t *pl = Ptr(logits), *pt = Ptr(targets), *ps = Ptr(state), *pp = Ptr(logp), *pe = Ptr(entropy), *pz = Ptr(stats);
  const int64_t ld = logits.stride(0);
  const float itau = static_cast<float>(inv_tau);
  at_npu::native::OpCommand cmd;
  cmd.Name("sgrpo_logits_stats");
  cmd.SetCustomHandler([=]() -> int {
    return sgrpo_logits_stats_launch(stream, t.block_dim, dtype, pl, pt, ps, pp, pe, pz, n, ld, v, v0, t.tile, flags,
                                     itau, ignore_index);
  });
  cmd.Run();
}

void logits_grad_impl(const at::Tensor& logits, at::Tensor& out, const at::Tensor& targets, const at::Tensor& stats,
                      const c10::optional<at::Tensor>& entropy, const at::Tensor& grad_logp,
                      const c10::optional<at::Tensor>& grad_entropy, int64_t v0, double inv_tau,
                      int64_t ignore_index) {
  CheckLogits(logits, "logits");
  CheckLogits(out, "out");
  TORCH_CHECK(out.sizes() == logits.sizes() && out.scalar_type() == logits.scalar_type(),
              "sgrpo_npu: out must match logits in shape and dtype");
  const int64_t n = logits.size(0), v = logits.size(1);
  CheckRowVec(targets, n, "targets", at::kLong);
  CheckStats(stats, n);
  CheckRowVec(grad_logp, n, "grad_logp", at::kFloat);
  const bool has_ge = grad_entropy.has_value() && grad_entropy->defined();
  if (has_ge) {
    TORCH_CHECK(entropy.has_value() && entropy->defined(), "sgrpo_npu: grad_entropy needs entropy");
    CheckRowVec(*grad_entropy, n, "grad_entropy", at::kFloat);
    CheckRowVec(*entropy, n, "entropy", at::kFloat);
  }
  if (n == 0 || v == 0) return;
  const int32_t dtype = DtypeCode(logits, "logits");
  const sgrpo::KernelTiling t = sgrpo::MakeTiling(n, static_cast<uint32_t>(v), logits.element_size(), AivCores(), true);
  TORCH_CHECK(t.tile > 0, "sgrpo_npu: no UB tiling fits vocab ", v);
  aclrtStream stream = c10_npu::getCurrentNPUStream().stream();
  uint8_t *pl = Ptr(logits), *po = Ptr(out), *pt = Ptr(targets), *pz = Ptr(stats), *pg = Ptr(grad_logp);
  uint8_t* pe = has_ge ? Ptr(*entropy) : nullptr;
  uint8_t* pge = has_ge ? Ptr(*grad_entropy) : nullptr;
  const int64_t ld_in = logits.stride(0), ld_out = out.stride(0);
  const int64_t flags = has_ge ? sgrpo::kHasGradEntropy : 0;
  const float itau = static_cast<float>(inv_tau);
  at_npu::native::OpCommand cmd;
  cmd.Name("sgrpo_logits_grad");
  cmd.SetCustomHandler([=]() -> int {
    return sgrpo_logits_grad_launch(stream, t.block_dim, dtype, pl, po, pt, pz, pe, pg, pge, n, ld_in, ld_out, v, v0,
                                    t.tile, flags, itau, ignore_index);
  });
  cmd.Run();
}

void logits_grad(const at::Tensor& logits, at::Tensor& out, const at::Tensor& targets, const at::Tensor& stats,
                 const c10::optional<at::Tensor>& entropy, const at::Tensor& grad_logp,
                 const c10::optional<at::Tensor>& grad_entropy, int64_t v0, double inv_tau, int64_t ignore_index) {
  logits_grad_impl(logits, out, targets, stats, entropy, grad_logp, grad_entropy, v0, inv_tau, ignore_index);
}

void logits_grad_(at::Tensor& logits, const at::Tensor& targets, const at::Tensor& stats,
                  const c10::optional<at::Tensor>& entropy, const at::Tensor& grad_logp,
                  const c10::optional<at::Tensor>& grad_entropy, int64_t v0, double inv_tau, int64_t ignore_index) {
  logits_grad_impl(logits, logits, targets, stats, entropy, grad_logp, grad_entropy, v0, inv_tau, ignore_index);
}

// Meta: the ops only mutate their (already allocated) outputs, so shape propagation has nothing to do.
void logits_stats_meta(const at::Tensor&, const at::Tensor&, at::Tensor&, at::Tensor&, at::Tensor&, at::Tensor&,
                       int64_t, int64_t, double, int64_t) {}
void logits_grad_meta(const at::Tensor&, at::Tensor&, const at::Tensor&, const at::Tensor&,
                      const c10::optional<at::Tensor>&, const at::Tensor&, const c10::optional<at::Tensor>&, int64_t,
                      double, int64_t) {}
void logits_grad__meta(at::Tensor&, const at::Tensor&, const at::Tensor&, const c10::optional<at::Tensor>&,
                       const at::Tensor&, const c10::optional<at::Tensor>&, int64_t, double, int64_t) {}

}  // namespace sgrpo_npu

TORCH_LIBRARY(sgrpo_npu, m) {
  m.def(
      "logits_stats(Tensor logits, Tensor targets, Tensor(a!) state, Tensor(b!) logp, Tensor(c!) entropy, "
      "Tensor(d!) stats, int v0, int flags, float inv_tau, int ignore_index) -> ()");
  m.def(
      "logits_grad(Tensor logits, Tensor(a!) out, Tensor targets, Tensor stats, Tensor? entropy, Tensor grad_logp, "
      "Tensor? grad_entropy, int v0, float inv_tau, int ignore_index) -> ()");
  m.def(
      "logits_grad_(Tensor(a!) logits, Tensor targets, Tensor stats, Tensor? entropy, Tensor grad_logp, "
      "Tensor? grad_entropy, int v0, float inv_tau, int ignore_index) -> ()");
}

TORCH_LIBRARY_IMPL(sgrpo_npu, PrivateUse1, m) {
  m.impl("logits_stats", &sgrpo_npu::logits_stats);
  m.impl("logits_grad", &sgrpo_npu::logits_grad);
  m.impl("logits_grad_", &sgrpo_npu::logits_grad_);
}

TORCH_LIBRARY_IMPL(sgrpo_npu, Meta, m) {
  m.impl("logits_stats", &sgrpo_npu::logits_stats_meta);
  m.impl("logits_grad", &sgrpo_npu::logits_grad_meta);
  m.impl("logits_grad_", &sgrpo_npu::logits_grad__meta);
}

#ifdef SGRPO_BINDING_CPU_TEST
// Test-only build (csrc/scripts/check_binding_cpu.sh, tests/test_npu_binding_cpu.py): the same implementations
// registered for CPU tensors, with stub torch_npu/CANN headers and the CPU-emulated kernel launchers linked in.
TORCH_LIBRARY_IMPL(sgrpo_npu, CPU, m) {
  m.impl("logits_stats", &sgrpo_npu::logits_stats);
  m.impl("logits_grad", &sgrpo_npu::logits_grad);
  m.impl("logits_grad_", &sgrpo_npu::logits_grad_);
}
#endif
