// C API of the CPU-emulated kernels, for ctypes (csrc/emu/sgrpo_emu.py). Test double only: see kernel_operator.h here.
// Build (what sgrpo_emu.py runs):
//   g++ -std=c++17 -O1 -shared -fPIC -DSGRPO_EMU -I csrc/emu -I csrc/ascend csrc/emu/sgrpo_emu_capi.cpp
//       csrc/ascend/sgrpo_logits_stats.cpp csrc/ascend/sgrpo_logits_grad.cpp -o libsgrpo_emu.so
#include <cstring>
#include <string>

#include "kernel_operator.h"
#include "sgrpo_launch.h"
#include "sgrpo_tiling.h"

// The emulated UB (the hardware's size) and the budget the tiling plans for are stated apart (kernel_operator.h stands
// in for CANN's header and knows nothing of sgrpo): they must agree.
static_assert(sgrpo::kUbBytes == sgrpo_emu::kUbBytes, "sgrpo_tiling.h kUbBytes != emulated UB size");

namespace {
std::string g_error;

template <class F>
int guarded(F&& f) {
  g_error.clear();
  try {
    return f();
  } catch (const std::exception& e) {
    g_error = e.what();
    return 1;
  }
}
}  // namespace

extern "C" {

const char* sgrpo_emu_last_error() { return g_error.c_str(); }

uint32_t sgrpo_emu_ub_bytes() { return sgrpo::kUbBytes; }

// out[5] = block_dim, tile, n_tiles, tail, ub_bytes
void sgrpo_emu_tiling(int64_t n_rows, int64_t vocab, uint32_t in_bytes, uint32_t cores, int32_t grad, uint32_t budget,
                      uint32_t max_tile, uint32_t* out) {
  const sgrpo::KernelTiling t = sgrpo::MakeTiling(static_cast<uint64_t>(n_rows), static_cast<uint32_t>(vocab),
                                                  in_bytes, cores, grad != 0, budget, max_tile);
  out[0] = t.block_dim;
  out[1] = t.tile;
  out[2] = t.n_tiles;
  out[3] = t.tail;
  out[4] = t.ub_bytes;
}

int sgrpo_emu_logits_stats(uint32_t block_dim, int32_t dtype, void* logits, void* targets, void* state, void* logp,
                           void* entropy, void* stats, int64_t n_rows, int64_t ld, int64_t vocab, int64_t v0,
                           int64_t tile, int64_t flags, float inv_tau, int64_t ignore_index) {
  return guarded([&]() {
    return sgrpo_logits_stats_launch(nullptr, block_dim, dtype, static_cast<uint8_t*>(logits),
                                     static_cast<uint8_t*>(targets), static_cast<uint8_t*>(state),
                                     static_cast<uint8_t*>(logp), static_cast<uint8_t*>(entropy),
                                     static_cast<uint8_t*>(stats), n_rows, ld, vocab, v0, tile, flags, inv_tau,
                                     ignore_index) == 0
               ? 0
               : 2;
  });
}

int sgrpo_emu_logits_grad(uint32_t block_dim, int32_t dtype, void* logits, void* out, void* targets, void* stats,
                          void* entropy, void* grad_logp, void* grad_entropy, int64_t n_rows, int64_t ld_in,
                          int64_t ld_out, int64_t vocab, int64_t v0, int64_t tile, int64_t flags, float inv_tau,
                          int64_t ignore_index) {
  return guarded([&]() {
    return sgrpo_logits_grad_launch(nullptr, block_dim, dtype, static_cast<uint8_t*>(logits),
                                    static_cast<uint8_t*>(out), static_cast<uint8_t*>(targets),
                                    static_cast<uint8_t*>(stats), static_cast<uint8_t*>(entropy),
                                    static_cast<uint8_t*>(grad_logp), static_cast<uint8_t*>(grad_entropy), n_rows,
                                    ld_in, ld_out, vocab, v0, tile, flags, inv_tau, ignore_index) == 0
               ? 0
               : 2;
  });
}

}  // extern "C"
