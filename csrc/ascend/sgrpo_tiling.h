// Tiling for the sgrpo AscendC vector kernels: plain C++ shared by the kernels (device), the launchers / binding (host)
// and the g++ unit tests (csrc/tests/test_tiling.cpp). No AscendC or torch dependency.
//
// Work split: rows of the [N, V] logits (or [N, Vc] logits chunk) are split over AIV cores (the first N % cores cores get
// one extra row); every core streams each of its rows through UB in `tile` sized vocab pieces (the last one is the tail).
// UB use is computed here once and checked against the 192 KiB budget of a 910B vector core.
// The constants below that Python needs (kernel flags, kStateFloats, dtype codes, kUbBytes, kMaxTile) are restated once
// in sgrpo_kernels/backends/npu_backend.py (this header is not installed with the package); tests/test_npu_constants.py
// parses this file and fails when the two differ.
#ifndef SGRPO_ASCEND_TILING_H
#define SGRPO_ASCEND_TILING_H

#if defined(__CCE_AICORE__) || defined(__CCE_KT_TEST__)
#define SGRPO_AICORE __aicore__
#else
#include <cstdint>
#define SGRPO_AICORE
#endif

namespace sgrpo {

constexpr uint32_t kUbBytes = 192u * 1024u;  // unified buffer of one 910B AIV core
constexpr uint32_t kUbReserveBytes = 0u;     // nothing reserved by the framework for these kernels
constexpr uint32_t kAlignBytes = 32u;        // UB address / DataCopy length granularity
constexpr uint32_t kTileQuantum = 64u;       // tile sizes are multiples of 64 elements: 32 B aligned for 1/2/4 B types
constexpr uint32_t kMaxTile = 8192u;         // largest vocab tile (elements); bigger buys nothing on 910B
constexpr uint32_t kRowGroup = 64u;          // rows whose per-row scalars (targets, stats, outputs) share one UB load
constexpr uint32_t kStateFloats = 8u;        // packed per-row running state: m, s, t, z_target, 4 pad (32 B per row)
constexpr uint32_t kBufferNum = 2u;          // double buffering of the vocab tiles
constexpr uint32_t kScratchFloats = 32u;     // reduce results: 4 slots of 8 floats (32 B each)

// Flags of the statistics kernel.
constexpr uint32_t kHasPrev = 1u;       // read the running state of the rows from GM (not the first vocab chunk)
constexpr uint32_t kWriteState = 2u;    // write the running state back (not the last vocab chunk)
constexpr uint32_t kFinalize = 4u;      // write logp (and entropy / stats) from the final state (last vocab chunk)
constexpr uint32_t kWriteEntropy = 8u;  // with kFinalize: write entropy
constexpr uint32_t kWriteStats = 16u;   // with kFinalize: write the [2, N] row statistics (max m, then ln s)
// Flags of the gradient kernel.
constexpr uint32_t kHasGradEntropy = 1u;  // grad_entropy and entropy are valid (else g_H = 0)

// dtype codes shared by host and kernels.
constexpr int32_t kFloat32 = 0;
constexpr int32_t kFloat16 = 1;
constexpr int32_t kBFloat16 = 2;

SGRPO_AICORE inline uint32_t DtypeBytes(int32_t dtype) { return dtype == kFloat32 ? 4u : 2u; }

SGRPO_AICORE inline uint64_t CeilDiv(uint64_t a, uint64_t b) { return (a + b - 1) / b; }
SGRPO_AICORE inline uint64_t RoundUp(uint64_t a, uint64_t b) { return CeilDiv(a, b) * b; }
// Bytes of `elems` elements rounded up to whole 32 B blocks.
SGRPO_AICORE inline uint32_t AlignedBytes(uint64_t elems, uint32_t elem_bytes) {
  return static_cast<uint32_t>(RoundUp(elems * elem_bytes, kAlignBytes));
}

// Rows [start, start + count) of core `core` when n_rows rows are split over `cores` cores.
struct RowRange {
  uint64_t start;
  uint64_t count;
};
SGRPO_AICORE inline RowRange CoreRows(uint64_t n_rows, uint32_t cores, uint32_t core) {
  RowRange r;
  const uint64_t base = n_rows / cores;
  const uint64_t extra = n_rows % cores;
  r.count = base + (core < extra ? 1u : 0u);
  r.start = core * base + (core < extra ? core : extra);
  return r;
}

// Vocab tile k of a row of `vocab` columns: [start, start + count).
struct TileRange {
  uint32_t start;
  uint32_t count;
};
SGRPO_AICORE inline TileRange VocabTile(uint32_t vocab, uint32_t tile, uint32_t k) {
  TileRange t;
  t.start = k * tile;
  const uint32_t rest = vocab - t.start;
  t.count = rest < tile ? rest : tile;
  return t;
}
SGRPO_AICORE inline uint32_t NumTiles(uint32_t vocab, uint32_t tile) {
  return static_cast<uint32_t>(CeilDiv(vocab, tile));
}

// fp32 elements of the shared tmp buffer of ReduceMax / ReduceSum over `count` floats: one partial per 256 B repeat,
// doubled for ReduceMax's (value, index) pairs, rounded to 32 B, plus one block of slack.
SGRPO_AICORE inline uint32_t ReduceWorkFloats(uint32_t count) {
  return static_cast<uint32_t>(RoundUp(2 * CeilDiv(count, 64), 8) + 8);
}

// Per-row stat arrays of the statistics kernel hold one entry per vocab tile plus the previous state.
SGRPO_AICORE inline uint32_t StatEntries(uint32_t n_tiles) { return static_cast<uint32_t>(RoundUp(n_tiles + 1, 8)); }

// Reduce tmp of the statistics kernel: serves reductions over a tile and over the per-row entries.
SGRPO_AICORE inline uint32_t StatsWorkFloats(uint32_t tile, uint32_t n_tiles) {
  const uint32_t entries = StatEntries(n_tiles);
  return ReduceWorkFloats(tile > entries ? tile : entries);
}

// UB bytes of the statistics kernel (sgrpo_logits_stats.cpp, Init() allocates exactly these buffers).
SGRPO_AICORE inline uint32_t StatsUbBytes(uint32_t tile, uint32_t in_bytes, uint32_t n_tiles) {
  const uint32_t entries = StatEntries(n_tiles);
  uint32_t b = 0;
  b += kBufferNum * AlignedBytes(tile, in_bytes);         // input tiles (double buffered)
  b += 2 * AlignedBytes(tile, 4);                         // fp32 z and exp tiles
  b += AlignedBytes(StatsWorkFloats(tile, n_tiles), 4);   // reduce tmp (tiles and the per-row entry reductions)
  b += 4 * AlignedBytes(entries, 4);                      // tile max / sum / t + scale scratch
  b += AlignedBytes(kScratchFloats, 4);                   // reduce results
  b += AlignedBytes(kRowGroup, 8);                        // targets of a row group (int64)
  b += AlignedBytes(kRowGroup * kStateFloats, 4);         // packed state in / out
  b += 8 * AlignedBytes(kRowGroup, 4);                    // per-row m, s, t, zy, ln s, zy - m, H, logp
  return b;
}

// UB bytes of the gradient kernel (sgrpo_logits_grad.cpp).
SGRPO_AICORE inline uint32_t GradUbBytes(uint32_t tile, uint32_t in_bytes) {
  uint32_t b = 0;
  b += kBufferNum * AlignedBytes(tile, in_bytes);  // input tiles
  b += kBufferNum * AlignedBytes(tile, in_bytes);  // output tiles
  b += 2 * AlignedBytes(tile, 4);                  // fp32 d and p tiles
  b += AlignedBytes(kRowGroup, 8);                 // targets
  b += 5 * AlignedBytes(kRowGroup, 4);             // m, ln s, grad_logp, entropy, grad_entropy
  return b;
}

// Scalar arguments of the statistics kernel (the kernel entry takes them one by one).
struct StatsArgs {
  int64_t n_rows;        // rows of the logits (chunk)
  int64_t ld;            // elements between rows in GM (>= vocab)
  int64_t vocab;         // columns of the logits (chunk)
  int64_t v0;            // vocab id of column 0 (chunk offset); targets are global vocab ids
  int64_t tile;          // KernelTiling::tile
  int64_t flags;         // kHasPrev | kWriteState | kFinalize | kWriteEntropy | kWriteStats
  float inv_tau;         // 1 / temperature
  int64_t ignore_index;  // rows with this target: logp = entropy = stats = 0
};

// Scalar arguments of the gradient kernel.
struct GradArgs {
  int64_t n_rows;
  int64_t ld_in;   // row stride of the logits
  int64_t ld_out;  // row stride of the gradient (may alias the logits: in-place)
  int64_t vocab;
  int64_t v0;
  int64_t tile;
  int64_t flags;  // kHasGradEntropy
  float inv_tau;
  int64_t ignore_index;
};

struct KernelTiling {
  uint32_t block_dim;  // cores launched (<= cores, never more than rows; >= 1)
  uint32_t tile;       // vocab elements per UB tile (multiple of kTileQuantum); 0 = does not fit
  uint32_t n_tiles;    // tiles per row
  uint32_t tail;       // elements of the last tile (1..tile)
  uint32_t ub_bytes;   // UB bytes the kernel allocates
};

SGRPO_AICORE inline uint32_t BlockDim(uint64_t n_rows, uint32_t cores) {
  if (cores == 0) cores = 1;
  if (n_rows == 0) return 1;
  return n_rows < cores ? static_cast<uint32_t>(n_rows) : cores;
}

// Largest tile (multiple of kTileQuantum, <= max_tile, not wider than the row needs) whose UB use fits the budget.
// grad = false: statistics kernel; grad = true: gradient kernel.
SGRPO_AICORE inline KernelTiling MakeTiling(uint64_t n_rows, uint32_t vocab, uint32_t in_bytes, uint32_t cores,
                                            bool grad, uint32_t ub_budget = kUbBytes - kUbReserveBytes,
                                            uint32_t max_tile = kMaxTile) {
  KernelTiling t;
  t.block_dim = BlockDim(n_rows, cores);
  t.tile = 0;
  t.n_tiles = 0;
  t.tail = 0;
  t.ub_bytes = 0;
  if (vocab == 0 || in_bytes == 0) return t;
  uint32_t cap = static_cast<uint32_t>(RoundUp(vocab, kTileQuantum));
  if (max_tile < cap) cap = max_tile;
  cap = cap / kTileQuantum * kTileQuantum;
  for (uint32_t tile = cap; tile >= kTileQuantum; tile -= kTileQuantum) {
    const uint32_t n = NumTiles(vocab, tile);
    const uint32_t bytes = grad ? GradUbBytes(tile, in_bytes) : StatsUbBytes(tile, in_bytes, n);
    if (bytes <= ub_budget) {
      t.tile = tile;
      t.n_tiles = n;
      t.tail = vocab - (n - 1) * tile;
      t.ub_bytes = bytes;
      return t;
    }
  }
  return t;
}

}  // namespace sgrpo

#endif  // SGRPO_ASCEND_TILING_H
