// Gradient w.r.t. the logits of (logp, entropy), AIV-only AscendC kernel; in place when out == logits.
//
// Per row with target y, z = logits / tau, the forward's row statistics m = max z and ln s (a [2, N] fp32 tensor:
// stats[0] = m, stats[1] = ln s), upstream g_logp, g_H (docs/design.md):
//   log p_j = (z_j - m) - ln s      (never z_j - lse: lse = m + ln s rounds ln s away at large |m|)
//   dL/dlogit_j = ( g_logp * (1[j = y] - p_j) - g_H * p_j * (log p_j + H) ) / tau
//               = ( p_j * (-g_logp - g_H * (log p_j + H)) + g_logp * 1[j = y] ) / tau
// Rows whose target is ignore_index, or whose g_logp and g_H are both exactly 0, get a zero row without reading logits.
// Used for logprobs_from_logits backward (whole rows) and, per [N, Vc] chunk with column offset v0, for the LM-head
// backward, where the host then runs grad_hidden += dZ @ W_c and grad_W_c = dZ^T @ h on the cube unit.
#include "sgrpo_kernel_common.h"
#include "sgrpo_launch.h"

using namespace AscendC;

namespace sgrpo {

template <typename T>
class LogitsGradKernel : public RowGroupKernel<LogitsGradKernel<T>> {
 public:
  __aicore__ inline LogitsGradKernel() {}

  __aicore__ inline void Init(GM_ADDR logits, GM_ADDR out, GM_ADDR targets, GM_ADDR stats, GM_ADDR entropy,
                              GM_ADDR grad_logp, GM_ADDR grad_entropy, const GradArgs& a) {
    args_ = a;
    vocab_ = static_cast<uint32_t>(a.vocab);
    tile_ = static_cast<uint32_t>(a.tile);
    nTiles_ = NumTiles(vocab_, tile_);
    this->SplitRows(a.n_rows);
    const uint64_t n = static_cast<uint64_t>(a.n_rows);
    logitsGm_.SetGlobalBuffer((__gm__ T*)logits, n == 0 ? 0 : (n - 1) * a.ld_in + a.vocab);
    outGm_.SetGlobalBuffer((__gm__ T*)out, n == 0 ? 0 : (n - 1) * a.ld_out + a.vocab);
    targetsGm_.SetGlobalBuffer((__gm__ int32_t*)targets, 2 * n);
    statsGm_.SetGlobalBuffer((__gm__ float*)stats, 2 * n);  // [2, N]: m, then ln s
    gLogpGm_.SetGlobalBuffer((__gm__ float*)grad_logp, n);
    if (a.flags & kHasGradEntropy) {
      entGm_.SetGlobalBuffer((__gm__ float*)entropy, n);
      gEntGm_.SetGlobalBuffer((__gm__ float*)grad_entropy, n);
    }
    // Exactly the buffers counted by GradUbBytes() in sgrpo_tiling.h.
    pipe_.InitBuffer(inQue_, kBufferNum, AlignedBytes(tile_, sizeof(T)));
    pipe_.InitBuffer(outQue_, kBufferNum, AlignedBytes(tile_, sizeof(T)));
    pipe_.InitBuffer(dBuf_, AlignedBytes(tile_, 4));
    pipe_.InitBuffer(pBuf_, AlignedBytes(tile_, 4));
    pipe_.InitBuffer(tgtBuf_, AlignedBytes(kRowGroup, 8));
    pipe_.InitBuffer(rowBuf_, 5 * AlignedBytes(kRowGroup, 4));
  }

 private:
  friend class RowGroupKernel<LogitsGradKernel<T>>;  // calls ProcessGroup from Process()

  __aicore__ inline void ProcessGroup(uint64_t row0, uint32_t gn) {
    LocalTensor<int32_t> tgt = tgtBuf_.Get<int32_t>();
    LocalTensor<float> rows = rowBuf_.Get<float>();
    LocalTensor<float> rowM = rows[0], lnS = rows[kRowGroup], gLogp = rows[2 * kRowGroup];
    LocalTensor<float> ent = rows[3 * kRowGroup], gEnt = rows[4 * kRowGroup];
    PipeSync<HardEvent::S_MTE2>();  // the previous group's scalars were read
    CopyInPad(tgt, targetsGm_[2 * row0], 2 * gn);
    CopyInPad(rowM, statsGm_[row0], gn);
    CopyInPad(lnS, statsGm_[static_cast<uint64_t>(args_.n_rows) + row0], gn);
    CopyInPad(gLogp, gLogpGm_[row0], gn);
    if (args_.flags & kHasGradEntropy) {
      CopyInPad(ent, entGm_[row0], gn);
      CopyInPad(gEnt, gEntGm_[row0], gn);
    }
    PipeSync<HardEvent::MTE2_S>();
    for (uint32_t i = 0; i < gn; ++i) {
      const int64_t y = TargetAt(tgt, i);
      const float gl = gLogp.GetValue(i);
      const float gh = (args_.flags & kHasGradEntropy) ? gEnt.GetValue(i) : 0.0f;
      const float h = (args_.flags & kHasGradEntropy) ? ent.GetValue(i) : 0.0f;
      const bool active = y != args_.ignore_index && (gl != 0.0f || gh != 0.0f);
      const uint64_t r = row0 + i;
      if (!active) {
        ZeroRow(r);
      } else {
        GradRow(r, y - args_.v0, rowM.GetValue(i), lnS.GetValue(i), h, gl, gh);
      }
    }
  }

  __aicore__ inline void ZeroRow(uint64_t row) {
    for (uint32_t k = 0; k < nTiles_; ++k) {
      const TileRange tr = VocabTile(vocab_, tile_, k);
      LocalTensor<T> o = outQue_.AllocTensor<T>();
      Duplicate(o, T{}, static_cast<int32_t>(tr.count));
      outQue_.EnQue(o);
      CopyOut(row, tr);
    }
  }

  __aicore__ inline void GradRow(uint64_t row, int64_t local, float m, float ln_s, float h, float gl, float gh) {
    const uint64_t inOff = row * static_cast<uint64_t>(args_.ld_in);
    CopyIn(inOff, 0);
    for (uint32_t k = 0; k < nTiles_; ++k) {
      const TileRange tr = VocabTile(vocab_, tile_, k);
      if (k + 1 < nTiles_) CopyIn(inOff, k + 1);
      ComputeTile(tr, local, m, ln_s, h, gl, gh);
      CopyOut(row, tr);
    }
  }

  __aicore__ inline void CopyIn(uint64_t rowOff, uint32_t k) {
    const TileRange tr = VocabTile(vocab_, tile_, k);
    LocalTensor<T> x = inQue_.AllocTensor<T>();
    CopyInPad(x, logitsGm_[rowOff + tr.start], tr.count);
    inQue_.EnQue(x);
  }

  __aicore__ inline void ComputeTile(const TileRange& tr, int64_t local, float m, float ln_s, float h, float gl,
                                     float gh) {
    const int32_t c = static_cast<int32_t>(tr.count);
    LocalTensor<float> d = dBuf_.Get<float>(), p = pBuf_.Get<float>();
    LocalTensor<T> x = inQue_.DeQue<T>();
    ToScaledFloat(d, x, args_.inv_tau, tr.count);
    inQue_.FreeTensor(x);
    Adds(d, d, -m, c);     // z - m
    Adds(d, d, -ln_s, c);  // log p = (z - m) - ln s
    Exp(p, d, c);          // p
    Adds(d, d, h, c);      // log p + H
    Muls(d, d, -gh, c);
    Adds(d, d, -gl, c);
    Mul(d, d, p, c);  // p * (-g_logp - g_H (log p + H))
    if (local >= static_cast<int64_t>(tr.start) && local < static_cast<int64_t>(tr.start + tr.count)) {
      const uint32_t j = static_cast<uint32_t>(local - tr.start);
      PipeSync<HardEvent::V_S>();
      d.SetValue(j, d.GetValue(j) + gl);
      PipeSync<HardEvent::S_V>();
    }
    LocalTensor<T> o = outQue_.AllocTensor<T>();
    FromFloat(o, d, args_.inv_tau, tr.count);  // d logit = dz / tau, rounded to the input dtype
    outQue_.EnQue(o);
  }

  __aicore__ inline void CopyOut(uint64_t row, const TileRange& tr) {
    LocalTensor<T> o = outQue_.DeQue<T>();
    CopyOutPad(outGm_[row * static_cast<uint64_t>(args_.ld_out) + tr.start], o, tr.count);
    outQue_.FreeTensor(o);
  }

  TPipe pipe_;
  TQue<QuePosition::VECIN, kBufferNum> inQue_;
  TQue<QuePosition::VECOUT, kBufferNum> outQue_;
  TBuf<TPosition::VECCALC> dBuf_, pBuf_, tgtBuf_, rowBuf_;
  GlobalTensor<T> logitsGm_, outGm_;
  GlobalTensor<int32_t> targetsGm_;
  GlobalTensor<float> statsGm_, gLogpGm_, entGm_, gEntGm_;
  GradArgs args_;
  uint32_t vocab_ = 0, tile_ = 0, nTiles_ = 0;
};

template <typename T>
__aicore__ inline void RunLogitsGrad(GM_ADDR logits, GM_ADDR out, GM_ADDR targets, GM_ADDR stats, GM_ADDR entropy,
                                     GM_ADDR grad_logp, GM_ADDR grad_entropy, int64_t n_rows, int64_t ld_in,
                                     int64_t ld_out, int64_t vocab, int64_t v0, int64_t tile, int64_t flags,
                                     float inv_tau, int64_t ignore_index) {
  GradArgs a{n_rows, ld_in, ld_out, vocab, v0, tile, flags, inv_tau, ignore_index};
  LogitsGradKernel<T> op;
  op.Init(logits, out, targets, stats, entropy, grad_logp, grad_entropy, a);
  op.Process();
}

}  // namespace sgrpo

#define SGRPO_GRAD_ENTRY(NAME, T)                                                                                 \
  extern "C" __global__ __aicore__ void NAME(GM_ADDR logits, GM_ADDR out, GM_ADDR targets, GM_ADDR stats,       \
                                             GM_ADDR entropy, GM_ADDR grad_logp, GM_ADDR grad_entropy,           \
                                             int64_t n_rows, int64_t ld_in, int64_t ld_out, int64_t vocab,       \
                                             int64_t v0, int64_t tile, int64_t flags, float inv_tau,             \
                                             int64_t ignore_index) {                                              \
    sgrpo::RunLogitsGrad<T>(logits, out, targets, stats, entropy, grad_logp, grad_entropy, n_rows, ld_in, ld_out, \
                            vocab, v0, tile, flags, inv_tau, ignore_index);                                       \
  }
SGRPO_GRAD_ENTRY(sgrpo_logits_grad_fp32, float)
SGRPO_GRAD_ENTRY(sgrpo_logits_grad_fp16, half)
SGRPO_GRAD_ENTRY(sgrpo_logits_grad_bf16, bfloat16_t)
#undef SGRPO_GRAD_ENTRY

extern "C" int sgrpo_logits_grad_launch(void* stream, uint32_t block_dim, int32_t dtype, uint8_t* logits, uint8_t* out,
                                        uint8_t* targets, uint8_t* stats, uint8_t* entropy, uint8_t* grad_logp,
                                        uint8_t* grad_entropy, int64_t n_rows, int64_t ld_in, int64_t ld_out,
                                        int64_t vocab, int64_t v0, int64_t tile, int64_t flags, float inv_tau,
                                        int64_t ignore_index) {
  (void)stream;
  switch (dtype) {
    case sgrpo::kFloat32:
      SGRPO_LAUNCH(sgrpo_logits_grad_fp32, block_dim, stream, logits, out, targets, stats, entropy, grad_logp,
                   grad_entropy, n_rows, ld_in, ld_out, vocab, v0, tile, flags, inv_tau, ignore_index);
      return 0;
    case sgrpo::kFloat16:
      SGRPO_LAUNCH(sgrpo_logits_grad_fp16, block_dim, stream, logits, out, targets, stats, entropy, grad_logp,
                   grad_entropy, n_rows, ld_in, ld_out, vocab, v0, tile, flags, inv_tau, ignore_index);
      return 0;
    case sgrpo::kBFloat16:
      SGRPO_LAUNCH(sgrpo_logits_grad_bf16, block_dim, stream, logits, out, targets, stats, entropy, grad_logp,
                   grad_entropy, n_rows, ld_in, ld_out, vocab, v0, tile, flags, inv_tau, ignore_index);
      return 0;
    default:
      return -1;
  }
}
