// g++ unit test of csrc/ascend/sgrpo_tiling.h (driven by tests/test_ascend_tiling.py; also runnable by hand:
//   g++ -std=c++17 -O1 -I csrc/ascend csrc/tests/test_tiling.cpp -o /tmp/t && /tmp/t).
// Checks, over a grid of shapes, dtypes and core counts: UB use within 192 KiB, 32 B alignment of every tile buffer,
// every row covered by exactly one core, every vocab column by exactly one tile, tails in [1, tile].
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "sgrpo_tiling.h"

static int g_failures = 0;
static long g_checks = 0;
#define CHECK(cond, ...)                                 \
  do {                                                   \
    ++g_checks;                                          \
    if (!(cond)) {                                       \
      ++g_failures;                                      \
      if (g_failures < 20) {                             \
        std::printf("FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
        std::printf(__VA_ARGS__);                        \
        std::printf("\n");                               \
      }                                                  \
    }                                                    \
  } while (0)

static void check_rows(uint64_t n_rows, uint32_t cores) {
  const uint32_t bd = sgrpo::BlockDim(n_rows, cores);
  CHECK(bd >= 1 && bd <= (cores ? cores : 1), "block_dim %u cores %u", bd, cores);
  if (n_rows > 0) CHECK(bd <= n_rows, "block_dim %u > rows %llu", bd, (unsigned long long)n_rows);
  std::vector<int> seen(n_rows, 0);
  uint64_t next = 0, max_c = 0, min_c = ~0ull;
  for (uint32_t c = 0; c < bd; ++c) {
    const sgrpo::RowRange r = sgrpo::CoreRows(n_rows, bd, c);
    CHECK(r.start == next, "core %u starts at %llu, expected %llu", c, (unsigned long long)r.start,
          (unsigned long long)next);
    for (uint64_t i = r.start; i < r.start + r.count && i < n_rows; ++i) seen[i]++;
    next = r.start + r.count;
    if (r.count > max_c) max_c = r.count;
    if (r.count < min_c) min_c = r.count;
  }
  CHECK(next == n_rows, "rows end at %llu of %llu", (unsigned long long)next, (unsigned long long)n_rows);
  CHECK(max_c - min_c <= 1, "unbalanced split %llu..%llu", (unsigned long long)min_c, (unsigned long long)max_c);
  for (uint64_t i = 0; i < n_rows; ++i) CHECK(seen[i] == 1, "row %llu covered %d times", (unsigned long long)i, seen[i]);
}

static void check_vocab(uint64_t n_rows, uint32_t vocab, uint32_t in_bytes, uint32_t cores, bool grad,
                        uint32_t budget) {
  const sgrpo::KernelTiling t = sgrpo::MakeTiling(n_rows, vocab, in_bytes, cores, grad, budget);
  if (t.tile == 0) {  // allowed only when no tile size fits the budget at all
    for (uint32_t tile = sgrpo::kTileQuantum; tile <= sgrpo::kMaxTile; tile += sgrpo::kTileQuantum) {
      const uint32_t n = sgrpo::NumTiles(vocab, tile);
      const uint32_t bytes = grad ? sgrpo::GradUbBytes(tile, in_bytes) : sgrpo::StatsUbBytes(tile, in_bytes, n);
      CHECK(bytes > budget, "tile %u fits V=%u bytes=%u grad=%d but tiling said none", tile, vocab, in_bytes, grad);
    }
    return;
  }
  CHECK(t.ub_bytes <= budget, "UB %u > %u (V=%u tile=%u)", t.ub_bytes, budget, vocab, t.tile);
  CHECK(t.ub_bytes <= sgrpo::kUbBytes, "UB %u > 192 KiB", t.ub_bytes);
  CHECK(t.tile % sgrpo::kTileQuantum == 0, "tile %u", t.tile);
  CHECK((t.tile * in_bytes) % sgrpo::kAlignBytes == 0, "tile bytes %u", t.tile * in_bytes);
  CHECK((t.tile * 4) % sgrpo::kAlignBytes == 0, "fp32 tile bytes %u", t.tile * 4);
  CHECK(t.tile <= sgrpo::kMaxTile, "tile %u > max", t.tile);
  CHECK(t.tile < vocab + sgrpo::kTileQuantum, "tile %u much wider than V=%u", t.tile, vocab);
  CHECK(t.n_tiles == sgrpo::NumTiles(vocab, t.tile), "n_tiles");
  CHECK(t.tail >= 1 && t.tail <= t.tile, "tail %u tile %u", t.tail, t.tile);
  // Recompute UB use from the allocation list of the kernel and compare.
  const uint32_t again = grad ? sgrpo::GradUbBytes(t.tile, in_bytes) : sgrpo::StatsUbBytes(t.tile, in_bytes, t.n_tiles);
  CHECK(again == t.ub_bytes, "ub bytes mismatch");
  // Greedy: the next larger tile must not fit (unless capped).
  const uint32_t bigger = t.tile + sgrpo::kTileQuantum;
  if (bigger <= sgrpo::kMaxTile && t.tile < vocab) {
    const uint32_t nb = sgrpo::NumTiles(vocab, bigger);
    const uint32_t bytes = grad ? sgrpo::GradUbBytes(bigger, in_bytes) : sgrpo::StatsUbBytes(bigger, in_bytes, nb);
    CHECK(bytes > budget, "tile %u not maximal (V=%u)", t.tile, vocab);
  }
  // Every column exactly once, tiles contiguous, only the last one short.
  uint64_t next = 0;
  for (uint32_t k = 0; k < t.n_tiles; ++k) {
    const sgrpo::TileRange r = sgrpo::VocabTile(vocab, t.tile, k);
    CHECK(r.start == next, "tile %u starts at %u", k, r.start);
    CHECK(r.count >= 1 && r.count <= t.tile, "tile %u count %u", k, r.count);
    if (k + 1 < t.n_tiles) CHECK(r.count == t.tile, "inner tile %u short", k);
    else CHECK(r.count == t.tail, "tail %u != %u", r.count, t.tail);
    // Every UB buffer offset of the kernel is a sum of 32 B-rounded sizes, so its start stays aligned.
    CHECK(sgrpo::AlignedBytes(r.count, in_bytes) % 32 == 0, "aligned bytes");
    next = r.start + r.count;
  }
  CHECK(next == vocab, "columns end at %llu of %u", (unsigned long long)next, vocab);
  check_rows(n_rows, t.block_dim);
}

int main() {
  const uint32_t vocabs[] = {1, 2, 7, 31, 63, 64, 65, 127, 1000, 4097, 8191, 8192, 8193, 32000, 50257, 65536,
                             128256, 151936, 152064, 256000, 1000003, 4000000};
  const uint32_t bytes[] = {2, 4};
  const uint64_t rows[] = {0, 1, 2, 5, 47, 48, 49, 97, 1000, 8191};
  const uint32_t cores[] = {1, 2, 3, 20, 40, 48};
  const uint32_t budgets[] = {sgrpo::kUbBytes, 96u * 1024u, 40u * 1024u};
  for (uint32_t v : vocabs)
    for (uint32_t b : bytes)
      for (uint32_t budget : budgets)
        for (int grad = 0; grad < 2; ++grad) check_vocab(97, v, b, 48, grad != 0, budget);
  for (uint64_t n : rows)
    for (uint32_t c : cores) check_rows(n, c);
  for (uint64_t n : rows) check_vocab(n, 151936, 2, 40, false, sgrpo::kUbBytes);
  // A budget too small for even one 64-wide tile reports tile = 0 instead of overflowing.
  const sgrpo::KernelTiling none = sgrpo::MakeTiling(8, 151936, 4, 8, false, 4096);
  CHECK(none.tile == 0, "tiny budget must not fit");
  // 910B default: the statistics kernel streams a 151936-wide bf16 row in 8192-wide tiles.
  const sgrpo::KernelTiling qwen = sgrpo::MakeTiling(8192, 151936, 2, 48, false);
  CHECK(qwen.tile == 8192 && qwen.n_tiles == 19, "qwen tile %u n %u", qwen.tile, qwen.n_tiles);
  std::printf("tiling: %ld checks, %d failures\n", g_checks, g_failures);
  return g_failures == 0 ? 0 : 1;
}
