// Host-side entry points of the AscendC kernels: defined in sgrpo_logits_stats.cpp / sgrpo_logits_grad.cpp, called by
// the torch_npu binding (sgrpo_binding.cpp) and by the CPU emulation's C API (csrc/emu/sgrpo_emu_capi.cpp). One
// declaration for all of them, so a signature change cannot drift between the definition and its callers.
#pragma once

#include <cstdint>

extern "C" int sgrpo_logits_stats_launch(void* stream, uint32_t block_dim, int32_t dtype, uint8_t* logits,
                                         uint8_t* targets, uint8_t* state, uint8_t* logp, uint8_t* entropy,
                                         uint8_t* stats, int64_t n_rows, int64_t ld, int64_t vocab, int64_t v0,
                                         int64_t tile, int64_t flags, float inv_tau, int64_t ignore_index);
extern "C" int sgrpo_logits_grad_launch(void* stream, uint32_t block_dim, int32_t dtype, uint8_t* logits, uint8_t* out,
                                        uint8_t* targets, uint8_t* stats, uint8_t* entropy, uint8_t* grad_logp,
                                        uint8_t* grad_entropy, int64_t n_rows, int64_t ld_in, int64_t ld_out,
                                        int64_t vocab, int64_t v0, int64_t tile, int64_t flags, float inv_tau,
                                        int64_t ignore_index);
