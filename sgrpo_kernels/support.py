"""The sampler's support, found without materializing (N, V): per row, the logit threshold t of vLLM's min_p, top_k
and top_p, so that the kept tokens are {j : z_j >= t} (plus the sampled target, which the ops add themselves).

Bottom layer (imports nothing from sgrpo_kernels): the ops call :func:`find_thresholds` with a *tile function* that
computes one (row subset x vocab chunk) tile of z = head(logits) / temperature in the compute dtype; the backends only
ever see the resulting threshold vector. The rules, in vLLM's order (docs/ops.md, "Sampler support"):

    min_p:  keep z_j >= m + log(min_p)              (m = max_j z_j; vLLM: p_j >= min_p * p_max)
    top_k:  of those, keep z_j >= the k-th largest   (all ties at the k-th value kept, as vLLM's top-k)
    top_p:  of those (mass renormalized over them, Z), keep z_j >= the largest value v with mass(z >= v) >= p * Z
            (vLLM keeps token j iff the mass above it in its sort order is < p: the same set, except that a tie at
            the boundary is kept whole here where vLLM keeps an order-dependent part of it)

How a threshold is found, per row (the passes recompute the tiles; only O(N * C) state is kept):
  1. one pass: the row max m, sum exp(z - m), the smallest finite z and a running top-C list of values (C = 64, or
     k + 1 up to 1024 for top_k; a tile's values above the list's last one are merged in with torch.topk); rows with
     top_p alone also count the tokens (and their mass) in B = 256 bins of equal width over the range of the row's
     first tile (values outside it in two end bins);
  2. every threshold that the top-C list decides (top_k with k <= C; top_p whose kept set lies inside the list; min_p
     is closed-form) is read off it: most rows of a trained model, no further pass;
  3. a top_p-alone row the list does not decide (a flat distribution) reads the bin holding the threshold off the
     histogram of step 1, and one more pass gathers that bin (when it holds <= G = 4096 tokens) and the largest value
     of the bins below it: two passes in all;
  4. the other rows (large k, top_p after a min_p / top_k cut, rows step 3 leaves: a bin too full, a first tile with
     no finite value) run a B-way search on the value axis (B bins between a lower bound and m): one pass counts the
     tokens (and their mass) per bin; the bin holding the threshold is gathered exactly in one more pass when it holds
     <= G tokens, else the search recurses into it. Each recursion narrows the range by B (and a bin of equal values
     ends it), so the number of passes is bounded; two passes (histogram + gather) is the common case.
The threshold handed to the backends is the midpoint between the last kept value and the next value below it (the
next value comes from the same list or bin, or one more pass): a backend's own logits, off by less than half that gap,
keep the same tokens (the logits op's backends divide by T as the tile does: same bits). Nothing to cut: -inf.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import torch
from torch import Tensor

__all__ = ["BINS", "GATHER", "TOP_C", "find_thresholds"]

TOP_C = 64  # the running top list of pass 1 (raised to k + 1 for top_k up to MAX_C)
MAX_C = 1024
BINS = 256  # bins per search pass
GATHER = 4096  # most tokens a bin may hold to be gathered exactly (V / 8 for small vocabularies: O(N) memory stays
# below (N, V) at any V)
MAX_PASSES = 64  # a safety bound; each search pass narrows the range B-fold, so real rows need a handful
_TILE_TEMPS = 6  # (rows x chunk) temporaries of a pass, in compute dtype
DEFAULT_MEMORY_BUDGET = 128 * 2**20

TileFn = Callable[[Tensor, int, int], Tensor]  # (row indices, v0, v1) -> z tile (rows, v1 - v0), may be modified


# ---------------------------------------------------------------------------------------------------- the sweeps


def _spans(rows: Tensor, vocab: int, budget: int, elem: int) -> Iterator[tuple[int, int, int, int]]:
    """(r0, r1, v0, v1) tiles over `rows` x [0, V) whose temporaries fit `budget` bytes."""
    n = rows.numel()
    budget = budget if budget > 0 else DEFAULT_MEMORY_BUDGET
    per_row = _TILE_TEMPS * elem
    vc = min(vocab, max(256, budget // max(n * per_row, 1)))
    rc = max(1, min(n, budget // (vc * per_row)))
    for r0 in range(0, n, rc):
        for v0 in range(0, vocab, vc):
            yield r0, min(r0 + rc, n), v0, min(v0 + vc, vocab)


class _Search:
    """One call's search: the tile function, the vocabulary, the memory budget and the compute dtype."""

    def __init__(self, tile: TileFn, vocab: int, budget: int, dtype: torch.dtype, device: torch.device):
        self.tile, self.vocab, self.budget, self.dtype, self.device = tile, vocab, budget, dtype, device

    def sweep(self, rows: Tensor, fn: Callable[[slice, Tensor], None]) -> None:
        """fn(local row slice, z tile) for every tile of `rows` (indices into the op's rows)."""
        for r0, r1, v0, v1 in _spans(rows, self.vocab, self.budget, torch.finfo(self.dtype).bits // 8):
            fn(slice(r0, r1), self.tile(rows[r0:r1], v0, v1))

    def full(self, n: int, value: float) -> Tensor:
        return torch.full((n,), value, device=self.device, dtype=self.dtype)

    # -- pass 1: row max, sum exp(z - m) (when `with_sum`), smallest finite value, top-C list, and (`with_hist`)
    # the count and mass of the bins of _bin_index over each row's range in its first tile (see _from_first_pass)
    def first_pass(self, rows: Tensor, c: int, with_sum: bool = True, with_hist: bool = False):
        n = rows.numel()
        m, s, zmin = self.full(n, -math.inf), self.full(n, 0.0), self.full(n, math.inf)
        tops: dict[int, Tensor] = {}  # row-block start -> its running top list
        hist = _Hist(n, self.dtype, self.device) if with_hist else None

        def fn(sl: slice, z: Tensor) -> None:
            m_old = m[sl].clone()
            m_new = torch.maximum(m_old, z.amax(1))
            shift = torch.where(torch.isfinite(m_new), m_new, torch.zeros_like(m_new))
            scale = torch.where(m_old == m_new, torch.ones_like(m_old), torch.exp(m_old - shift))
            low = z.amin(1)
            if bool(torch.isinf(low).any()):  # -inf logits (masked vocabulary): the smallest finite one
                low = torch.where(torch.isfinite(z), z, math.inf).amin(1)
            first = sl.start not in tops
            tops[sl.start] = _merge_top(tops.get(sl.start), z, c)
            if with_sum:
                e = torch.exp(z - shift.unsqueeze(1))
                s[sl] = s[sl] * scale + e.sum(1)
                if hist is not None:
                    if first:  # a row block's first tile: its range (m_new: the tile's max)
                        hist.set_range(sl, low, m_new)
                    hist.add(sl, z, e, scale)
            m[sl] = m_new
            zmin[sl] = torch.minimum(zmin[sl], low)

        self.sweep(rows, fn)
        return m, s, zmin, torch.cat([tops[k] for k in sorted(tops)], 0), hist

    def masked_sum(self, rows: Tensor, lo: Tensor, m: Tensor) -> Tensor:
        """sum over z >= lo of exp(z - m), per row."""
        out = self.full(rows.numel(), 0.0)

        def fn(sl: slice, z: Tensor) -> None:
            e = torch.exp(z - m[sl].unsqueeze(1)).masked_fill_(z < lo[sl].unsqueeze(1), 0.0)
            out[sl] += e.sum(1)

        self.sweep(rows, fn)
        return out

    def below(self, rows: Tensor, t: Tensor) -> Tensor:
        """max over z < t, per row (-inf when none)."""
        out = self.full(rows.numel(), -math.inf)

        def fn(sl: slice, z: Tensor) -> None:
            out[sl] = torch.maximum(out[sl], z.masked_fill_(z >= t[sl].unsqueeze(1), -math.inf).amax(1))

        self.sweep(rows, fn)
        return out


def _merge_top(prev: Tensor | None, z: Tensor, c: int) -> Tensor:
    """The c largest of prev (r, c), sorted descending, and the tile z (r, vc): a full torch.topk only while the list
    fills or when many values enter; else just the values above the list's last (a value equal to it leaves the
    multiset of the c largest as it is), which after the first tiles are a handful per row."""
    if prev is None or prev.shape[1] < c:
        both = z if prev is None else torch.cat((prev, z), 1)
        return torch.topk(both, min(c, both.shape[1]), dim=1).values
    rr, cc = torch.nonzero(z > prev[:, -1:], as_tuple=True)  # row-major: each row's newcomers in order
    if rr.numel() == 0:
        return prev
    per_row = torch.bincount(rr, minlength=z.shape[0])
    width = int(per_row.max())
    if 4 * width > z.shape[1]:
        return torch.topk(torch.cat((prev, z), 1), c, dim=1).values
    rank = torch.arange(rr.numel(), device=rr.device) - (torch.cumsum(per_row, 0) - per_row)[rr]
    new = torch.full((z.shape[0], width), -math.inf, device=z.device, dtype=z.dtype)
    new[rr, rank] = z[rr, cc]
    return torch.topk(torch.cat((prev, new), 1), c, dim=1).values


class _Hist:
    """Pass 1's histogram (top_p rows): per row, the count and the mass exp(z - m) of the bins of _bin_index over the
    range [smallest finite, max] of the row's first tile (values outside it in the end bins 0 and BINS + 1). `ok`:
    rows whose first tile gave a range (else lo = 0, inv_w = 1, a harmless map whose counts are not used)."""

    def __init__(self, n: int, dtype: torch.dtype, device: torch.device):
        self.lo, self.inv_w = torch.zeros(n, device=device, dtype=dtype), torch.ones(n, device=device, dtype=dtype)
        self.ok = torch.zeros(n, device=device, dtype=torch.bool)
        self.cnt = torch.zeros((n, BINS + 2), device=device, dtype=dtype)
        self.mass = torch.zeros_like(self.cnt)

    def set_range(self, sl: slice, low: Tensor, high: Tensor) -> None:
        inv_w = BINS / (high - low)
        ok = torch.isfinite(low) & (high > low) & torch.isfinite(inv_w) & (inv_w > 0)
        self.ok[sl] = ok
        self.lo[sl] = torch.where(ok, low, torch.zeros_like(low))
        self.inv_w[sl] = torch.where(ok, inv_w, torch.ones_like(inv_w))

    def take(self, idx: Tensor) -> _Hist:
        out = _Hist.__new__(_Hist)
        out.lo, out.inv_w, out.ok, out.cnt, out.mass = (x[idx] for x in (self.lo, self.inv_w, self.ok, self.cnt,
                                                                        self.mass))
        return out

    def add(self, sl: slice, z: Tensor, e: Tensor, scale: Tensor) -> None:
        """z (r, vc) and e = exp(z - the running max); `scale` rescales the mass so far to that max, as the sum's."""
        b = _bin_index(z, self.lo[sl], self.inv_w[sl])
        self.cnt[sl].scatter_add_(1, b, torch.ones_like(z))
        self.mass[sl].mul_(scale.unsqueeze(1)).scatter_add_(1, b, e)


# ------------------------------------------------------------------------------------------ reading a sorted list


def _resolve_sorted(vals: Tensor, lo: Tensor, target: Tensor, m: Tensor | None, base: Tensor) -> tuple[Tensor, Tensor]:
    """vals (r, L) sorted descending. Among the listed values >= lo, the largest v with F(>= v) >= target, where
    F(>= v) = base + (count, or mass exp(z - m) when m is given) of listed values >= v (ties counted whole).
    -> (threshold, found)."""
    if vals.shape[1] == 0:
        return lo.clone(), torch.zeros_like(lo, dtype=torch.bool)
    valid = (vals >= lo.unsqueeze(1)) & (vals > -math.inf)  # (-inf: padding, or a masked token of no mass)
    w = torch.ones_like(vals) if m is None else torch.exp(vals - m.unsqueeze(1))
    cum = base.unsqueeze(1) + torch.cumsum(w.masked_fill_(~valid, 0.0), 1)
    neg = vals.neg().contiguous()  # ascending: the last index of each tie group
    last = (torch.searchsorted(neg, neg, right=True) - 1).clamp_(min=0)
    hit = (cum.gather(1, last) >= target.unsqueeze(1)) & valid
    found = hit.any(1)
    first = hit.to(torch.int8).argmax(1)
    return torch.where(found, vals.gather(1, first.unsqueeze(1)).squeeze(1), lo), found


def _next_below(vals: Tensor, t: Tensor, complete: Tensor) -> tuple[Tensor, Tensor]:
    """The largest listed value < t, and whether the list decides it (a listed value below t, or a complete list)."""
    pos = (vals >= t.unsqueeze(1)).sum(1)
    inside = pos < vals.shape[1]
    nxt = vals.gather(1, pos.clamp(max=max(vals.shape[1] - 1, 0)).unsqueeze(1)).squeeze(1) if vals.shape[1] else t
    return torch.where(inside, nxt, torch.full_like(t, -math.inf)), inside | complete


# ------------------------------------------------------------------------------------------------- the bin search


def _bin_index(z: Tensor, lo: Tensor, inv_w: Tensor) -> Tensor:
    """Bin of each value, a monotone map: 0 below lo, 1 .. BINS across [lo, hi) (BINS equal bins, up to rounding),
    BINS + 1 from hi up. Only monotonicity matters: the passes that count a bin and gather it use this same map
    (_gather_bin compares the same u with the bin's edges). NaN: bin 0, not NaN's out-of-bounds int64 (pass 1 sees
    every row; _nonfinite_rows then keeps a NaN row out of the searches)."""
    return _bin_u(z, lo, inv_w).nan_to_num_(nan=0.0).clamp_(0, BINS + 1).to(torch.int64)


def _bin_u(z: Tensor, lo: Tensor, inv_w: Tensor) -> Tensor:
    return torch.addcmul((1.0 - lo * inv_w).unsqueeze(1), z, inv_w.unsqueeze(1))


def _histogram(srch: _Search, rows: Tensor, lo: Tensor, inv_w: Tensor, m: Tensor | None):
    """One pass: per row and bin (BINS + 2 columns, see _bin_index) the count, the mass exp(z - m) (the count again
    without m), the largest and the smallest value."""
    cnt = torch.zeros((rows.numel(), BINS + 2), device=lo.device, dtype=lo.dtype)
    mass = torch.zeros_like(cnt) if m is not None else cnt
    bmax, bmin = torch.full_like(cnt, -math.inf), torch.full_like(cnt, math.inf)

    def fn(sl: slice, z: Tensor) -> None:
        b = _bin_index(z, lo[sl], inv_w[sl])
        cnt[sl].scatter_add_(1, b, torch.ones_like(z))
        if m is not None:
            mass[sl].scatter_add_(1, b, torch.exp(z - m[sl].unsqueeze(1)))
        bmax[sl].scatter_reduce_(1, b, z, "amax")
        bmin[sl].scatter_reduce_(1, b, z, "amin")

    srch.sweep(rows, fn)
    return cnt, mass, bmax, bmin


def _quantile(srch: _Search, rows: Tensor, lo: Tensor, hi: Tensor, target: Tensor, m: Tensor | None
              ) -> tuple[Tensor, Tensor, Tensor]:
    """Per row, the largest value v >= lo with F(>= v) >= target (F: count of values, or their mass exp(z - m) when m
    is given, counting values >= lo only), or lo when F(>= lo) < target; hi = the row max.
    -> (v, the largest value below v, whether that one is known from the passes made)."""
    out, nxt, known = lo.clone(), torch.full_like(lo, -math.inf), torch.zeros_like(lo, dtype=torch.bool)
    lo, hi = lo.clone(), hi.clone()
    todo = torch.arange(rows.numel(), device=lo.device)
    tiny = torch.finfo(lo.dtype).tiny
    cols = torch.arange(BINS + 2, device=lo.device)
    for _ in range(MAX_PASSES):
        if todo.numel() == 0:
            return out, nxt, known
        r, a, b, tg = rows[todo], lo[todo], hi[todo], target[todo]
        mr = m[todo] if m is not None else None
        inv_w = BINS / (b - a).clamp(min=tiny)
        inv_w = torch.where((b > a) & torch.isfinite(inv_w), inv_w, torch.zeros_like(inv_w))
        cnt, mass, bmax, bmin = _histogram(srch, r, a, inv_w, mr)
        f = mass[:, 1:].flip(1).cumsum(1).flip(1)  # f[:, j - 1] = F(values in bins >= j), bins 1 .. BINS + 1
        j = (f >= tg.unsqueeze(1)).sum(1)  # the bin holding the threshold (0: F(>= lo) < target)
        nothing, at_top = j == 0, j == BINS + 1  # lo itself; hi itself (the row max, or the previous bin's top)
        jj = j.unsqueeze(1)
        c, b_lo, b_hi = cnt.gather(1, jj).squeeze(1), bmin.gather(1, jj).squeeze(1), bmax.gather(1, jj).squeeze(1)
        val = torch.where(nothing, a, torch.where(at_top, b, b_hi))
        done = nothing | at_top | (b_lo == b_hi)  # (a bin of equal values: that value)
        gather = ~done & (c <= _gather_cap(srch.vocab))
        below = torch.where(cols < jj, bmax, -math.inf)  # the bins under the threshold's
        if bool(gather.any()):
            g = torch.nonzero(gather).squeeze(1)
            base = f[g].gather(1, j[g].unsqueeze(1)).squeeze(1)  # F(values in bins above j)
            cands = _gather_bin(srch, r[g], a[g], inv_w[g], j[g])[0]
            v, found = _resolve_sorted(cands, torch.full_like(base, -math.inf), tg[g], None if mr is None else mr[g],
                                       base)
            val[g] = torch.where(found, v, b_lo[g])  # (not found: rounding between the two passes' sums)
            under, _ = _next_below(cands, val[g], torch.zeros_like(found))
            below[g, 0] = torch.maximum(below[g, 0], under)  # a value of the bin itself below the threshold
            done |= gather
        # the largest value below the threshold, when no bin under it reaches the threshold (rounding) to hide it
        clean = (below < val.unsqueeze(1)).all(1) & ~nothing
        fin = todo[done]
        out[fin], nxt[fin], known[fin] = val[done], below.amax(1)[done], clean[done]
        keep = ~done
        lo[todo[keep]], hi[todo[keep]] = b_lo[keep], b_hi[keep]
        todo = todo[keep]
    raise RuntimeError(f"sampler support search did not converge in {MAX_PASSES} passes")


def _from_first_pass(srch: _Search, rows: Tensor, hist: _Hist, target: Tensor, m: Tensor
                     ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """_quantile(lo = the smallest value, mass) from pass 1's histogram: one gather pass, of the bin holding the
    threshold, which also gives the largest value of the bins below it. -> (v, the largest value below v, whether
    that one is known, done); not done (the threshold's bin too full, or the gather disagreeing with the histogram's
    count or sums): run _quantile."""
    f = hist.mass.flip(1).cumsum(1).flip(1)  # f[:, j] = F(values in bins >= j), every value counted (bin 0 too)
    j = (f >= target.unsqueeze(1)).sum(1) - 1  # the bin holding the threshold (-1: F(all) < target, rounding)
    jj = j.clamp(min=0).unsqueeze(1)
    cnt = hist.cnt.gather(1, jj).squeeze(1)
    v, nxt = torch.full_like(target, -math.inf), torch.full_like(target, -math.inf)
    known, done = torch.zeros_like(hist.ok), hist.ok & (j >= 0) & (cnt <= _gather_cap(srch.vocab))
    if not bool(done.any()):
        return v, nxt, known, done
    g = torch.nonzero(done).squeeze(1)
    base = torch.cat((f, torch.zeros_like(f[:, :1])), 1)[g].gather(1, jj[g] + 1).squeeze(1)  # F(bins above j)
    cands, fill, low = _gather_bin(srch, rows[g], hist.lo[g], hist.inv_w[g], j[g], under=True)
    val, found = _resolve_sorted(cands, torch.full_like(base, -math.inf), target[g], m[g], base)
    under, _ = _next_below(cands, val, torch.zeros_like(found))
    v[g], nxt[g] = val, torch.maximum(under, low)
    known[g] = nxt[g] < val
    done[g] = found & (fill.to(cnt.dtype) == cnt[g])
    return v, nxt, known, done


def _gather_bin(srch: _Search, rows: Tensor, lo: Tensor, inv_w: Tensor, which: Tensor, under: bool = False
                ) -> tuple[Tensor, Tensor, Tensor | None]:
    """The values of bin `which` of each row, sorted descending, padded with -inf: (r, cap); how many the bin holds;
    with `under`, the largest value of the bins below it (-inf when none)."""
    n, cap = rows.numel(), _gather_cap(srch.vocab)
    buf = torch.full((n, cap + 1), -math.inf, device=lo.device, dtype=lo.dtype)  # the last column: overflow
    fill = torch.zeros(n, device=lo.device, dtype=torch.int64)
    low = torch.full_like(lo, -math.inf) if under else None

    # bin j of _bin_index is u in [j, j + 1) (bin 0: u < 1, bin BINS + 1: u >= BINS + 1): float compares of its u
    edge = which.to(lo.dtype)
    floor = torch.where(which == 0, -math.inf, edge).unsqueeze(1)
    ceil = torch.where(which == BINS + 1, math.inf, edge + 1).unsqueeze(1)

    def fn(sl: slice, z: Tensor) -> None:
        u = _bin_u(z, lo[sl], inv_w[sl])
        ge = u >= floor[sl]
        hit = ge & (u < ceil[sl])
        rr, cc = torch.nonzero(hit, as_tuple=True)  # row-major: each row's hits in order
        per_row = hit.sum(1)
        first = torch.cumsum(per_row, 0) - per_row  # where each row's hits start in (rr, cc)
        rank = torch.arange(rr.numel(), device=rr.device) - first[rr]
        pos = (fill[sl][rr] + rank).clamp_(max=cap)
        buf[sl][rr, pos] = z[rr, cc]
        fill[sl] += per_row
        if low is not None:
            low[sl] = torch.maximum(low[sl], z.masked_fill(ge, -math.inf).amax(1))

    srch.sweep(rows, fn)
    return buf[:, :cap].sort(1, descending=True).values, fill, low


def _gather_cap(vocab: int) -> int:
    return min(GATHER, max(TOP_C, vocab // 8))


# -------------------------------------------------------------------------------------------------------- the API


def _nonfinite_rows(m: Tensor, far: Tensor, hk: Tensor, hp: Tensor, hm: Tensor, mp: Tensor
                    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Rows whose max m is not finite, kept out of the searches (their bins would be NaN: an out-of-bounds index).
    A NaN logit, or -inf logits only, make the row NaN whatever is cut: nothing cut (threshold -inf). +inf logits
    hold all the mass: top_p keeps just them, as does a top_k beyond the top list (z >= m: min_p's closed form with
    min_p = 1; a top_k the list decides is read off it). -> (has_k, has_p, has_m, min_p)."""
    hot, live = m == math.inf, m > -math.inf  # (live: False for NaN too)
    fold = hot & (hp | (hk & far))
    return hk & ~(hot & far) & live, hp & ~hot & live, (hm | fold) & live, torch.where(hot, torch.ones_like(mp), mp)


def find_thresholds(tile: TileFn, n: int, vocab: int, top_k: Tensor, top_p: Tensor, min_p: Tensor, *,
                    dtype: torch.dtype, device: torch.device, memory_budget: int = 0) -> Tensor:
    """Per-row threshold (n,) in `dtype`: the sampler keeps z_j >= threshold (-inf: everything).

    top_k (n,) int64 (>= vocab: no top-k), top_p (n,) (1: none), min_p (n,) (0: none), already validated; rows the op
    ignores should carry the no-op values. `tile(rows, v0, v1)` returns z for those rows and columns (may be
    modified in place by the caller)."""
    thr = torch.full((n,), -math.inf, device=device, dtype=dtype)
    has_k, has_p, has_m = top_k < vocab, top_p < 1.0, min_p > 0.0
    rows = torch.nonzero(has_k | has_p | has_m).squeeze(1)
    if rows.numel() == 0:
        return thr
    srch = _Search(tile, vocab, memory_budget, dtype, device)
    k, p, mp = top_k[rows], top_p[rows].to(dtype), min_p[rows].to(dtype)
    hk, hp, hm = has_k[rows], has_p[rows], has_m[rows]
    kmax = int(torch.where(hk, k, 0).max())
    c = min(vocab, max(TOP_C, min(kmax + 1, MAX_C)))
    # pass 1 keeps a histogram when some row has top_p alone: most such rows need no more than one gather pass
    m, s, zmin, top, hist = srch.first_pass(rows, c, with_sum=bool(hp.any()), with_hist=bool((hp & ~hk & ~hm).any()))
    hk, hp, hm, mp = _nonfinite_rows(m, k > c, hk, hp, hm, mp)  # (kept out of the searches)
    complete = torch.full_like(hk, vocab <= c)
    ninf = torch.full_like(m, -math.inf)

    # min_p: closed form; top_k: the k-th listed value, or the count search
    t1 = torch.where(hm, m + torch.log(torch.where(hm, mp, torch.ones_like(mp))), ninf)
    lo_k = torch.maximum(t1, zmin)
    tk = torch.where(hk & (k <= c), top.gather(1, (k.clamp(1, c) - 1).unsqueeze(1)).squeeze(1), ninf)
    far = hk & (k > c)
    found_next = []  # (rows, threshold, next value below, known) from the searches
    if bool(far.any()):
        g = torch.nonzero(far).squeeze(1)
        tk[g], nx, kn = _quantile(srch, rows[g], lo_k[g], m[g], k[g].to(dtype), None)
        found_next.append((g, tk[g], nx, kn))
    t2 = torch.maximum(t1, tk)

    # top_p over the kept set {z >= t2}: its mass Z, then the mass quantile p * Z
    tp = ninf.clone()
    if bool(hp.any()):
        inside = complete | (top[:, -1] < t2)  # the list holds every value >= t2
        listed = torch.where(top >= t2.unsqueeze(1), torch.exp(top - m.unsqueeze(1)), torch.zeros_like(top)).sum(1)
        z_mass = torch.where(t2 == -math.inf, s, listed)
        need = hp & (t2 > -math.inf) & ~inside
        if bool(need.any()):
            g = torch.nonzero(need).squeeze(1)
            z_mass[g] = srch.masked_sum(rows[g], t2[g], m[g])
        target = p * z_mass
        val, found = _resolve_sorted(top, t2, target, m, torch.zeros_like(m))
        tp = torch.where(hp & (found | inside), val, tp)
        miss = hp & ~(found | inside)
        if hist is not None and bool((miss & (t2 == -math.inf)).any()):  # every value counts: pass 1's histogram
            g = torch.nonzero(miss & (t2 == -math.inf)).squeeze(1)
            v, nx, kn, done = _from_first_pass(srch, rows[g], hist.take(g), target[g], m[g])
            g, v, nx, kn = g[done], v[done], nx[done], kn[done]
            tp[g] = v
            found_next.append((g, v, nx, kn))
            miss[g] = False
        if bool(miss.any()):
            g = torch.nonzero(miss).squeeze(1)
            tp[g], nx, kn = _quantile(srch, rows[g], torch.maximum(t2[g], zmin[g]), m[g], target[g], m[g])
            found_next.append((g, tp[g], nx, kn))
    t = torch.maximum(t2, tp)

    # a token value (top_k / top_p) -> the midpoint to the next value below it; min_p's bound is used as it is
    is_value = (t > t1) & (t > -math.inf)
    nxt, known = _next_below(top, t, complete)
    for g, tg, nx, kn in found_next:  # a search that ended at the final threshold knows its next value
        use = (tg == t[g]) & kn & ~known[g]
        nxt[g] = torch.where(use, nx, nxt[g])
        known[g] = known[g] | use
    ask = is_value & ~known
    if bool(ask.any()):
        g = torch.nonzero(ask).squeeze(1)
        nxt[g] = srch.below(rows[g], t[g])
    mid = t * 0.5 + nxt * 0.5
    mid = torch.where(mid > nxt, mid, t)
    final = torch.where(is_value, torch.where(nxt == -math.inf, ninf, torch.maximum(mid, t1)), t)
    thr[rows] = final
    return thr
