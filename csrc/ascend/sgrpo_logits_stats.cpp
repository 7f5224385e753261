// Online row statistics over a logits matrix (or one [N, Vc] vocab chunk of it), AIV-only AscendC kernel.
//
// For every row r with target y (z = logits / tau, m = running max):
//   s = sum_j exp(z_j - m),   t = sum_j exp(z_j - m) * (z_j - m),   z_y = the target's scaled logit
// Each UB tile k of the row gives (m_k, s_k, t_k) relative to its own max; the row's entries (and the state carried in
// from previous vocab chunks) are merged with vector ops, no scalar exp:
//   M = max_k m_k,  d_k = m_k - M,  s = sum_k e^{d_k} s_k,  t = sum_k e^{d_k} (t_k + d_k s_k)
// Finalize (last chunk): entropy = ln s - t / s,  logp = (z_y - M) - ln s (the shifted form: M + ln s would round ln s
// away at large |M|), and the row statistics for the backward, stats[0] = M and stats[1] = ln s (a [2, N] fp32 tensor);
// ignore_index rows give 0 everywhere.
// Rows are split over the AIV cores (CoreRows), a row streams through UB in `tile` elements, double buffered.
#include "sgrpo_kernel_common.h"
#include "sgrpo_launch.h"

using namespace AscendC;

namespace sgrpo {

template <typename T>
class LogitsStatsKernel : public RowGroupKernel<LogitsStatsKernel<T>> {
 public:
  __aicore__ inline LogitsStatsKernel() {}

  __aicore__ inline void Init(GM_ADDR logits, GM_ADDR targets, GM_ADDR state, GM_ADDR logp, GM_ADDR entropy,
                              GM_ADDR stats, const StatsArgs& a) {
    args_ = a;
    vocab_ = static_cast<uint32_t>(a.vocab);
    tile_ = static_cast<uint32_t>(a.tile);
    nTiles_ = NumTiles(vocab_, tile_);
    entries_ = StatEntries(nTiles_);
    this->SplitRows(a.n_rows);
    const uint64_t n = static_cast<uint64_t>(a.n_rows);
    logitsGm_.SetGlobalBuffer((__gm__ T*)logits, n == 0 ? 0 : (n - 1) * a.ld + a.vocab);
    targetsGm_.SetGlobalBuffer((__gm__ int32_t*)targets, 2 * n);
    if (a.flags & (kHasPrev | kWriteState)) stateGm_.SetGlobalBuffer((__gm__ float*)state, n * kStateFloats);
    if (a.flags & kFinalize) logpGm_.SetGlobalBuffer((__gm__ float*)logp, n);
    if (a.flags & kWriteEntropy) entropyGm_.SetGlobalBuffer((__gm__ float*)entropy, n);
    if (a.flags & kWriteStats) statsGm_.SetGlobalBuffer((__gm__ float*)stats, 2 * n);  // [2, N]: M, then ln s

    // Exactly the buffers counted by StatsUbBytes() in sgrpo_tiling.h.
    pipe_.InitBuffer(inQue_, kBufferNum, AlignedBytes(tile_, sizeof(T)));
    pipe_.InitBuffer(zBuf_, AlignedBytes(tile_, 4));
    pipe_.InitBuffer(eBuf_, AlignedBytes(tile_, 4));
    pipe_.InitBuffer(workBuf_, AlignedBytes(StatsWorkFloats(tile_, nTiles_), 4));
    pipe_.InitBuffer(entMaxBuf_, AlignedBytes(entries_, 4));
    pipe_.InitBuffer(entSumBuf_, AlignedBytes(entries_, 4));
    pipe_.InitBuffer(entTBuf_, AlignedBytes(entries_, 4));
    pipe_.InitBuffer(entScaleBuf_, AlignedBytes(entries_, 4));
    pipe_.InitBuffer(redBuf_, AlignedBytes(kScratchFloats, 4));
    pipe_.InitBuffer(tgtBuf_, AlignedBytes(kRowGroup, 8));
    pipe_.InitBuffer(stateBuf_, AlignedBytes(kRowGroup * kStateFloats, 4));
    pipe_.InitBuffer(rowBuf_, 8 * AlignedBytes(kRowGroup, 4));
  }

 private:
  friend class RowGroupKernel<LogitsStatsKernel<T>>;  // calls ProcessGroup from Process()

  __aicore__ inline LocalTensor<float> RowVec(uint32_t which) {
    return rowBuf_.Get<float>()[which * kRowGroup];  // kRowGroup floats = 256 B: every slot stays 32 B aligned
  }

  __aicore__ inline void ProcessGroup(uint64_t row0, uint32_t gn) {
    LocalTensor<int32_t> tgt = tgtBuf_.Get<int32_t>();
    LocalTensor<float> st = stateBuf_.Get<float>();
    CopyInPad(tgt, targetsGm_[2 * row0], 2 * gn);
    if (args_.flags & kHasPrev) DataCopy(st, stateGm_[row0 * kStateFloats], gn * kStateFloats);  // 32 B per row
    PipeSync<HardEvent::MTE2_S>();

    LocalTensor<float> rowM = RowVec(0), rowS = RowVec(1), rowT = RowVec(2), rowZy = RowVec(3);
    for (uint32_t i = 0; i < gn; ++i) {
      const int64_t y = TargetAt(tgt, i);
      if (y == args_.ignore_index) {  // benign values; masked at finalize, never read by the backward
        rowM.SetValue(i, 0.0f);
        rowS.SetValue(i, 1.0f);
        rowT.SetValue(i, 0.0f);
        rowZy.SetValue(i, 0.0f);
        continue;
      }
      ProcessRow(row0 + i, i, y, st);
    }
    if (args_.flags & kWriteState) {
      for (uint32_t i = 0; i < gn; ++i) {
        st.SetValue(i * kStateFloats + 0, rowM.GetValue(i));
        st.SetValue(i * kStateFloats + 1, rowS.GetValue(i));
        st.SetValue(i * kStateFloats + 2, rowT.GetValue(i));
        st.SetValue(i * kStateFloats + 3, rowZy.GetValue(i));
      }
      PipeSync<HardEvent::S_MTE3>();
      DataCopy(stateGm_[row0 * kStateFloats], st, gn * kStateFloats);
      PipeSync<HardEvent::MTE3_MTE2>();  // the next group reloads stateBuf_
    }
    if (args_.flags & kFinalize) Finalize(row0, gn, tgt);
  }

  __aicore__ inline void ProcessRow(uint64_t row, uint32_t i, int64_t y, const LocalTensor<float>& st) {
    LocalTensor<float> entMax = entMaxBuf_.Get<float>(), entSum = entSumBuf_.Get<float>();
    LocalTensor<float> entT = entTBuf_.Get<float>();
    uint32_t ne = 0;
    float zy = 0.0f;
    if (args_.flags & kHasPrev) {
      entMax.SetValue(0, st.GetValue(i * kStateFloats + 0));
      entSum.SetValue(0, st.GetValue(i * kStateFloats + 1));
      entT.SetValue(0, st.GetValue(i * kStateFloats + 2));
      zy = st.GetValue(i * kStateFloats + 3);
      ne = 1;
    }
    const int64_t local = y - args_.v0;  // target column inside this chunk, if any
    const uint64_t rowOff = row * static_cast<uint64_t>(args_.ld);
    CopyIn(rowOff, 0);
    for (uint32_t k = 0; k < nTiles_; ++k) {
      if (k + 1 < nTiles_) CopyIn(rowOff, k + 1);  // prefetch the next tile into the other buffer
      ComputeTile(k, ne + k, local, zy);
    }
    PipeSync<HardEvent::S_V>();  // entries were written by the scalar unit
    float m, s, t;
    Combine(ne + nTiles_, m, s, t);
    LocalTensor<float> rowM = RowVec(0), rowS = RowVec(1), rowT = RowVec(2), rowZy = RowVec(3);
    rowM.SetValue(i, m);
    rowS.SetValue(i, s);
    rowT.SetValue(i, t);
    rowZy.SetValue(i, zy);
  }

  __aicore__ inline void CopyIn(uint64_t rowOff, uint32_t k) {
    const TileRange tr = VocabTile(vocab_, tile_, k);
    LocalTensor<T> x = inQue_.AllocTensor<T>();
    CopyInPad(x, logitsGm_[rowOff + tr.start], tr.count);
    inQue_.EnQue(x);
  }

  __aicore__ inline void ComputeTile(uint32_t k, uint32_t entry, int64_t local, float& zy) {
    const TileRange tr = VocabTile(vocab_, tile_, k);
    const int32_t c = static_cast<int32_t>(tr.count);
    LocalTensor<float> z = zBuf_.Get<float>(), e = eBuf_.Get<float>(), work = workBuf_.Get<float>();
    LocalTensor<float> red = redBuf_.Get<float>();
    LocalTensor<T> x = inQue_.DeQue<T>();
    ToScaledFloat(z, x, args_.inv_tau, tr.count);
    inQue_.FreeTensor(x);
    ReduceMax(red, z, work, c);
    PipeSync<HardEvent::V_S>();
    if (local >= static_cast<int64_t>(tr.start) && local < static_cast<int64_t>(tr.start + tr.count)) {
      zy = z.GetValue(static_cast<uint32_t>(local - tr.start));
    }
    const float mk = red.GetValue(0);
    Adds(z, z, -mk, c);  // d = z - m_k
    Exp(e, z, c);
    ReduceSum(red[8], e, work, c);
    Mul(z, e, z, c);  // e * d
    ReduceSum(red[16], z, work, c);
    PipeSync<HardEvent::V_S>();
    entMaxBuf_.Get<float>().SetValue(entry, mk);
    entSumBuf_.Get<float>().SetValue(entry, red.GetValue(8));
    entTBuf_.Get<float>().SetValue(entry, red.GetValue(16));
  }

  __aicore__ inline void Combine(uint32_t n, float& m, float& s, float& t) {
    LocalTensor<float> entMax = entMaxBuf_.Get<float>(), entSum = entSumBuf_.Get<float>();
    LocalTensor<float> entT = entTBuf_.Get<float>(), d = entScaleBuf_.Get<float>();
    LocalTensor<float> work = workBuf_.Get<float>(), red = redBuf_.Get<float>();
    const int32_t c = static_cast<int32_t>(n);
    ReduceMax(red, entMax, work, c);
    PipeSync<HardEvent::V_S>();
    m = red.GetValue(0);
    Adds(d, entMax, -m, c);      // d_k = m_k - M <= 0
    Mul(entMax, d, entSum, c);   // d_k s_k
    Add(entT, entT, entMax, c);  // t_k + d_k s_k
    Exp(d, d, c);                // e^{d_k}
    Mul(entSum, entSum, d, c);
    ReduceSum(red[8], entSum, work, c);
    Mul(entT, entT, d, c);
    ReduceSum(red[16], entT, work, c);
    PipeSync<HardEvent::V_S>();
    s = red.GetValue(8);
    t = red.GetValue(16);
  }

  __aicore__ inline void Finalize(uint64_t row0, uint32_t gn, const LocalTensor<int32_t>& tgt) {
    LocalTensor<float> rowM = RowVec(0), rowS = RowVec(1), rowT = RowVec(2), rowZy = RowVec(3);
    LocalTensor<float> lnS = RowVec(4), zyM = RowVec(5), ent = RowVec(6), logp = RowVec(7);
    const int32_t c = static_cast<int32_t>(gn);
    PipeSync<HardEvent::S_V>();
    Ln(lnS, rowS, c);
    Div(ent, rowT, rowS, c);  // t / s
    Sub(ent, lnS, ent, c);    // H = ln s - t / s
    Sub(zyM, rowZy, rowM, c);
    Sub(logp, zyM, lnS, c);   // logp = (z_y - M) - ln s
    PipeSync<HardEvent::V_S>();
    for (uint32_t i = 0; i < gn; ++i) {
      if (TargetAt(tgt, i) == args_.ignore_index) {
        logp.SetValue(i, 0.0f);
        ent.SetValue(i, 0.0f);
        rowM.SetValue(i, 0.0f);
        lnS.SetValue(i, 0.0f);
      } else {
        // log p <= 0 and H >= 0 exactly, whatever the rounding of the hardware Ln on a confident row (s ~ 1)
        if (logp.GetValue(i) > 0.0f) logp.SetValue(i, 0.0f);
        if (ent.GetValue(i) < 0.0f) ent.SetValue(i, 0.0f);
      }
    }
    PipeSync<HardEvent::S_MTE3>();
    CopyOutPad(logpGm_[row0], logp, gn);
    if (args_.flags & kWriteEntropy) CopyOutPad(entropyGm_[row0], ent, gn);
    if (args_.flags & kWriteStats) {
      CopyOutPad(statsGm_[row0], rowM, gn);
      CopyOutPad(statsGm_[static_cast<uint64_t>(args_.n_rows) + row0], lnS, gn);
    }
    PipeSync<HardEvent::MTE3_V>();  // the next group rewrites the row vectors
  }

  TPipe pipe_;
  TQue<QuePosition::VECIN, kBufferNum> inQue_;
  TBuf<TPosition::VECCALC> zBuf_, eBuf_, workBuf_, entMaxBuf_, entSumBuf_, entTBuf_, entScaleBuf_, redBuf_;
  TBuf<TPosition::VECCALC> tgtBuf_, stateBuf_, rowBuf_;
  GlobalTensor<T> logitsGm_;
  GlobalTensor<int32_t> targetsGm_;
  GlobalTensor<float> stateGm_, logpGm_, entropyGm_, statsGm_;
  StatsArgs args_;
  uint32_t vocab_ = 0, tile_ = 0, nTiles_ = 0, entries_ = 0;
};

template <typename T>
__aicore__ inline void RunLogitsStats(GM_ADDR logits, GM_ADDR targets, GM_ADDR state, GM_ADDR logp, GM_ADDR entropy,
                                      GM_ADDR stats, int64_t n_rows, int64_t ld, int64_t vocab, int64_t v0, int64_t tile,
                                      int64_t flags, float inv_tau, int64_t ignore_index) {
  StatsArgs a{n_rows, ld, vocab, v0, tile, flags, inv_tau, ignore_index};
  LogitsStatsKernel<T> op;
  op.Init(logits, targets, state, logp, entropy, stats, a);
  op.Process();
}

}  // namespace sgrpo

#define SGRPO_STATS_ENTRY(NAME, T)                                                                                  \
  extern "C" __global__ __aicore__ void NAME(GM_ADDR logits, GM_ADDR targets, GM_ADDR state, GM_ADDR logp,        \
                                             GM_ADDR entropy, GM_ADDR stats, int64_t n_rows, int64_t ld,           \
                                             int64_t vocab, int64_t v0, int64_t tile, int64_t flags, float inv_tau, \
                                             int64_t ignore_index) {                                                \
    sgrpo::RunLogitsStats<T>(logits, targets, state, logp, entropy, stats, n_rows, ld, vocab, v0, tile, flags,     \
                             inv_tau, ignore_index);                                                                \
  }
SGRPO_STATS_ENTRY(sgrpo_logits_stats_fp32, float)
SGRPO_STATS_ENTRY(sgrpo_logits_stats_fp16, half)
SGRPO_STATS_ENTRY(sgrpo_logits_stats_bf16, bfloat16_t)
#undef SGRPO_STATS_ENTRY

// Host launcher (called by the torch_npu binding inside an OpCommand custom handler, or by the CPU emulation wrapper).
// Returns 0, or -1 for an unknown dtype.
extern "C" int sgrpo_logits_stats_launch(void* stream, uint32_t block_dim, int32_t dtype, uint8_t* logits,
                                         uint8_t* targets, uint8_t* state, uint8_t* logp, uint8_t* entropy,
                                         uint8_t* stats, int64_t n_rows, int64_t ld, int64_t vocab, int64_t v0,
                                         int64_t tile, int64_t flags, float inv_tau, int64_t ignore_index) {
  (void)stream;
  switch (dtype) {
    case sgrpo::kFloat32:
      SGRPO_LAUNCH(sgrpo_logits_stats_fp32, block_dim, stream, logits, targets, state, logp, entropy, stats, n_rows, ld,
                   vocab, v0, tile, flags, inv_tau, ignore_index);
      return 0;
    case sgrpo::kFloat16:
      SGRPO_LAUNCH(sgrpo_logits_stats_fp16, block_dim, stream, logits, targets, state, logp, entropy, stats, n_rows, ld,
                   vocab, v0, tile, flags, inv_tau, ignore_index);
      return 0;
    case sgrpo::kBFloat16:
      SGRPO_LAUNCH(sgrpo_logits_stats_bf16, block_dim, stream, logits, targets, state, logp, entropy, stats, n_rows, ld,
                   vocab, v0, tile, flags, inv_tau, ignore_index);
      return 0;
    default:
      return -1;
  }
}
