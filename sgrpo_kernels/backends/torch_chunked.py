"""The `torch` backend: chunked PyTorch, any device, the CPU default and the universal fallback.

Never allocates an (N, V) tensor for `linear_logprobs`: logits exist one (token chunk x vocab chunk) tile at a time,
sized from a memory budget. Forward keeps per-row online statistics in fp32 (fp64 for fp64 inputs, which also get
fp64 outputs and so fp64-accurate gradients):
  m = running max,  s = sum exp(z - m),  u = sum exp(z - m) * (z - m),  z_y = target logit
so that logp = (z_y - m) - log s and H = log s - u / s (tracking u relative to m avoids cancelling two large numbers
when |z| is large; so does forming logp from z_y - m: m + log s would round log s away). The forward keeps
stats = [m; log s] for the backward, which recomputes each tile and applies (docs/design.md)
  dL/dz = g_logp * (1[j = y] - p) - g_H * p * (log p + H),   log p = (z - m) - log s
after dropping rows whose two upstream gradients are zero (and ignored rows) before any matrix product.
-inf logits (masked vocabulary, -inf bias) are allowed: they get p = 0 and contribute 0, never NaN.
Tile buffers are allocated once per call and reused, so large tiles do not pay fresh page faults every step.
The sampler's support (`threshold=`, contract): in each logits tile, once divided by the temperature, the tokens with
z < threshold of their row, except the row's target, are cut: the running max skips them and their exp(z - m) and
gradient are zeroed, exactly as if they were -inf logits (the tile is not filled with -inf: CPU exp takes a slow path
on -inf and on the floor of log p); the statistics and the backward see the truncated distribution, and the support
is held fixed in the backward.
"""

from __future__ import annotations

import torch

from sgrpo_kernels.backends.contract import Options, stats_dtype

DEVICE_TYPES = ("*",)
APPLIES_THRESHOLD = True  # the sampler's support (contract: `threshold=`)
DEFAULT_MEMORY_BUDGET = 128 * 2**20  # bytes for the temporaries of one call (tiles + weight-chunk copies)
_TILE_TEMPS = 2  # (rows x vocab-chunk) buffers per call: logits tile and exp tile, in compute dtype
_MIN_VCHUNK = 256
_LOGP_FLOOR = -1.0e4  # exp(-1e4) == 0 in fp32 and fp64: clamping log p there changes no probability
# Above this 1 / temperature (temperature below ~1e-6) the backward's row coefficients stay in units of z and 1 / T
# multiplies the tile last: folded into them, 1 / T = 1e36 times log p's floor overflowed to inf, and p = 0 times inf
# gave NaN. Below it the arithmetic is the one it always was (bit for bit: training runs are fingerprinted).
_LATE_INV_T = 2.0**20


def is_available() -> tuple[bool, str]:
    return True, ""


def chunk_sizes(n_rows: int, vocab: int, memory_budget: int, elem_bytes: int = 4, col_bytes: int = 0
                ) -> tuple[int, int]:
    """(rows per tile, vocab columns per tile) so that the temporaries fit `memory_budget` bytes.

    A tile costs rows * cols * _TILE_TEMPS * elem_bytes; each vocab column of a chunk also costs `col_bytes`
    (weight-chunk copies and gradient accumulators, D-sized per column).
    """
    budget = memory_budget if memory_budget > 0 else DEFAULT_MEMORY_BUDGET
    per_elem = _TILE_TEMPS * elem_bytes
    v_chunk = min(vocab, max(_MIN_VCHUNK, budget // (max(n_rows, 1) * per_elem + col_bytes)))
    if v_chunk < vocab:
        v_chunk = max(_MIN_VCHUNK, v_chunk // 128 * 128)
    rows = max(1, min(max(n_rows, 1), (budget - v_chunk * col_bytes) // (v_chunk * per_elem)))
    return rows, v_chunk


def _spans(total: int, step: int):
    for start in range(0, total, step):
        yield start, min(start + step, total)


class _Tiles:
    """Two reusable (rows x cols) buffers; `view(k, r, c)` is a contiguous (r, c) view of buffer k."""

    def __init__(self, rows: int, cols: int, device: torch.device, dtype: torch.dtype):
        self.bufs = [torch.empty(rows * cols, device=device, dtype=dtype) for _ in range(_TILE_TEMPS)]

    def view(self, k: int, r: int, c: int) -> torch.Tensor:
        return self.bufs[k][: r * c].view(r, c)


def _logits_tile(h: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, opts: Options, out: torch.Tensor):
    """out = head(h @ w.T + b) / temperature, written into a reused buffer; head(x) = softcap * tanh(logit_scale * x /
    softcap) with a softcap, else x."""
    if b is not None:
        torch.addmm(b, h, w.T, out=out)
    else:
        torch.mm(h, w.T, out=out)
    if opts.softcap:
        out.mul_(opts.logit_scale / opts.softcap).tanh_().mul_(opts.softcap)
    if opts.temperature != 1.0:
        out.div_(opts.temperature)
    return out


def _cut(z: torch.Tensor, threshold: torch.Tensor | None, targets: torch.Tensor, v0: int) -> torch.Tensor | None:
    """(rows, vc) bool for z of vocab columns [v0, v0 + vc): z < threshold (rows,), except at the target; None without
    a threshold. The tile keeps its values: the callers zero exp(z - m) there, which is the same as writing -inf into
    z, without handing exp the -inf (or the floor of log p) that sends CPU exp to its slow path."""
    if threshold is None:
        return None
    cut = z < threshold.unsqueeze(1)
    local = targets - v0
    rows = torch.nonzero((local >= 0) & (local < z.shape[1])).squeeze(1)
    cut[rows, local[rows]] = False
    return cut


def _softcap_slope_(z: torch.Tensor, opts: Options) -> torch.Tensor:
    """In place: z (a tile from _logits_tile) -> d head / d logits = logit_scale * (1 - tanh^2), tanh = z T / c."""
    return z.mul_(opts.temperature / opts.softcap).square_().neg_().add_(1.0).mul_(opts.logit_scale)


class _OnlineStats:
    """Per-row running softmax statistics over vocab chunks (see module docstring)."""

    def __init__(self, n: int, device: torch.device, dtype: torch.dtype):
        self.m = torch.full((n,), float("-inf"), device=device, dtype=dtype)
        self.s = torch.zeros(n, device=device, dtype=dtype)
        self.u = torch.zeros(n, device=device, dtype=dtype)
        self.zy = torch.zeros(n, device=device, dtype=dtype)

    def update(self, rows: slice, z: torch.Tensor, targets: torch.Tensor, v0: int, with_entropy: bool,
               e: torch.Tensor, threshold: torch.Tensor | None = None) -> None:
        """Fold tile z (rows, vc) covering vocab columns [v0, v0 + vc) into the statistics of `rows`, as if z were -inf
        where the sampler's support cuts it (see _cut; `threshold` (rows,) or None).

        Consumes z; `e` is a same-shape scratch buffer.
        """
        vc = z.shape[1]
        local = targets - v0
        hit = (local >= 0) & (local < vc)
        zy = z.gather(1, local.clamp(0, vc - 1).unsqueeze(1)).squeeze(1)
        self.zy[rows] = torch.where(hit, zy, self.zy[rows])

        m_old = self.m[rows]
        top = z.amax(dim=1)
        cut = _cut(z, threshold, targets, v0)
        if cut is not None:  # the max of the kept values: the tile's max unless it is cut, then the target's or -inf
            top = torch.where(top >= threshold, top, torch.where(hit, zy, float("-inf")))
        m_new = torch.maximum(m_old, top)
        # equal maxima (including both -inf: nothing finite seen yet) keep the old sums as they are
        same = m_old == m_new
        scale = torch.where(same, torch.ones_like(m_old), torch.exp(m_old - m_new))
        z.sub_(torch.where(torch.isfinite(m_new), m_new, torch.zeros_like(m_new)).unsqueeze(1))  # z - m_new
        torch.exp(z, out=e)
        if cut is not None:
            e.masked_fill_(cut, 0.0)  # (e * z there: 0, not the nan of -inf * 0 that nansum drops: the same sum)
        s_old = self.s[rows]  # a view: read it before s is written
        if with_entropy:
            # u_new = exp(m_old - m_new) * (u_old + s_old * (m_old - m_new)) + sum e * (z - m_new);
            # nansum: e * z is 0 * -inf = nan exactly where a logit is -inf, whose term is 0
            # (s_old = u_old = 0 while m_old is -inf, so the shift must be 0 there, not -inf)
            shift = torch.where(same | torch.isinf(m_old), torch.zeros_like(m_old), m_old - m_new)
            self.u[rows] = scale * (self.u[rows] + s_old * shift) + z.mul_(e).nansum(dim=1)
        self.s[rows] = s_old * scale + e.sum(dim=1)
        self.m[rows] = m_new

    def finalize(self, with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(logp, stats (2, n) = [m; log s], entropy or None); logp in the shifted form (z_y - m) - log s."""
        log_s = torch.log(self.s)
        logp = (self.zy - self.m) - log_s
        entropy = log_s - self.u / self.s if with_entropy else None
        return logp, torch.stack((self.m, log_s)), entropy


def _grad_tile_(
    z: torch.Tensor,  # (rows, vc) logits tile / temperature, overwritten
    p: torch.Tensor,  # (rows, vc) scratch buffer; holds the result
    targets: torch.Tensor,  # (rows,)
    v0: int,
    stats: torch.Tensor,  # (2, rows): row max m, log s
    entropy: torch.Tensor | None,
    g_logp: torch.Tensor,  # (rows,)
    g_ent: torch.Tensor | None,
    temperature: float,
) -> torch.Tensor:
    """dL/dlogits for one tile (including the 1/temperature of z = logits / temperature), written into `p`.

    dz = g_logp * 1[j = y] - p * (g_logp + g_H * (log p + H)), divided by the temperature, with
    log p = (z - m) - log s and p = exp(z - m) / s: the row constants (H - log s, 1/s, the signs and 1/temperature)
    ride on per-row factors, so the tile is touched few times and z - m is never added to a large number. Past
    _LATE_INV_T the factors leave 1/temperature out and the tile is multiplied by it last: p * coef is then finite
    (p <= 1), and so is dz unless the true gradient overflows.
    """
    vc = z.shape[1]
    inv_t = 1.0 / temperature
    late = inv_t > _LATE_INV_T
    k = 1.0 if late else inv_t  # the 1/temperature the row factors carry
    m, log_s = stats[0], stats[1]
    inv_s = torch.exp(-log_s)
    z.sub_(m.unsqueeze(1))  # z - m <= 0
    if g_ent is not None:
        z.clamp_(min=_LOGP_FLOOR)  # -inf logits: p = 0 either way, and (log p + H) stays finite
        torch.exp(z, out=p)
        # p (-(g_H (log p + H) + g_logp) / T) = exp(z - m) (-(g_H ((z - m) + (H - log s)) + g_logp) / (s T))
        coef = z.add_((entropy - log_s).unsqueeze(1)).mul_((g_ent * inv_s * -k).unsqueeze(1))
        coef.sub_((g_logp * inv_s * k).unsqueeze(1))
    else:
        torch.exp(z, out=p)
        coef = (g_logp * inv_s * -k).unsqueeze(1)
    dz = p.mul_(coef)
    if late:
        dz.mul_(inv_t)
    local = targets - v0
    hit = (local >= 0) & (local < vc)
    rows = torch.nonzero(hit).squeeze(1)
    dz.index_put_((rows, local[rows]), g_logp[rows] * inv_t, accumulate=True)
    return dz


def _active_rows(
    targets: torch.Tensor, ignore_index: int, g_logp: torch.Tensor | None = None, g_ent: torch.Tensor | None = None
) -> torch.Tensor | None:
    """Indices of rows that need work, or None when every row does (saves the gathers)."""
    keep = targets != ignore_index
    if g_logp is not None:
        live = g_logp != 0
        if g_ent is not None:
            live = live | (g_ent != 0)
        keep = keep & live
    if bool(keep.all()):
        return None
    return torch.nonzero(keep).squeeze(1)


def _scatter_rows(values: torch.Tensor, idx: torch.Tensor | None, n: int) -> torch.Tensor:
    if idx is None:
        return values
    out = values.new_zeros((n, *values.shape[1:]))
    out[idx] = values
    return out


def _entropy_grad(g_ent: torch.Tensor | None, entropy: torch.Tensor | None, opts: Options) -> torch.Tensor | None:
    """None when the entropy term cannot contribute (not requested, or its upstream gradient is all zero)."""
    if g_ent is None or entropy is None or entropy.numel() == 0 or not opts.return_entropy:
        return None
    return g_ent if bool((g_ent != 0).any()) else None


def _outputs(logp, stats, entropy, idx, n, opts: Options):
    """Scatter the active rows back (stats (2, rows) by columns); the statistics are already in the output dtype (fp32,
    fp64 for fp64 inputs)."""
    logp = _scatter_rows(logp, idx, n)
    ent = _scatter_rows(entropy, idx, n) if opts.return_entropy else logp.new_empty((0,))
    stats = _scatter_rows(stats.T, idx, n).T.contiguous() if opts.need_stats else logp.new_empty((2, 0))
    return logp, ent, stats


def _elem_bytes(dtype: torch.dtype) -> int:
    return torch.finfo(dtype).bits // 8


# ----------------------------------------------------------------------------------------------------------- linear


def _rows_of(threshold: torch.Tensor | None, idx: torch.Tensor | None, cdt: torch.dtype) -> torch.Tensor | None:
    if threshold is None:
        return None
    return (threshold if idx is None else threshold.index_select(0, idx)).to(cdt)


def linear_logprobs_fwd(hidden, weight, targets, bias, opts: Options, threshold=None):
    n, d = hidden.shape
    vocab = weight.shape[0]
    cdt = stats_dtype(hidden.dtype)
    idx = _active_rows(targets, opts.ignore_index)
    h = (hidden if idx is None else hidden.index_select(0, idx)).to(cdt)
    t = targets if idx is None else targets.index_select(0, idx)
    thr = _rows_of(threshold, idx, cdt)
    na = h.shape[0]
    col_bytes = d * _elem_bytes(cdt) if weight.dtype != cdt else 0  # the compute-dtype copy of a weight chunk
    rows_per_tile, v_chunk = chunk_sizes(na, vocab, opts.memory_budget, _elem_bytes(cdt), col_bytes)
    stats = _OnlineStats(na, h.device, cdt)
    tiles = _Tiles(min(rows_per_tile, na), min(v_chunk, vocab), h.device, cdt)
    for v0, v1 in _spans(vocab, v_chunk):
        w = weight[v0:v1].to(cdt)
        b = bias[v0:v1].to(cdt) if bias is not None else None
        for r0, r1 in _spans(na, rows_per_tile):
            z = _logits_tile(h[r0:r1], w, b, opts, tiles.view(0, r1 - r0, v1 - v0))
            stats.update(slice(r0, r1), z, t[r0:r1], v0, opts.return_entropy, tiles.view(1, r1 - r0, v1 - v0),
                         thr[r0:r1] if thr is not None else None)
    logp, row_stats, entropy = stats.finalize(opts.return_entropy)
    return _outputs(logp, row_stats, entropy, idx, n, opts)


def linear_logprobs_bwd(grad_logp, grad_entropy, hidden, weight, targets, bias, stats, entropy, opts: Options,
                        threshold=None):
    n, d = hidden.shape
    vocab = weight.shape[0]
    cdt = stats_dtype(hidden.dtype)
    g_ent = _entropy_grad(grad_entropy, entropy, opts)
    idx = _active_rows(targets, opts.ignore_index, grad_logp, g_ent)

    def rows(x: torch.Tensor | None) -> torch.Tensor | None:
        return x if x is None or idx is None else x.index_select(0, idx)

    h = rows(hidden).to(cdt)
    t, gl, ge = rows(targets), rows(grad_logp).to(cdt), rows(g_ent)
    st = (stats if idx is None else stats.index_select(1, idx)).to(cdt)
    ent = rows(entropy).to(cdt) if ge is not None else None
    ge = ge.to(cdt) if ge is not None else None
    thr = _rows_of(threshold, idx, cdt)
    na = h.shape[0]

    need_h, need_w = opts.need_grad_hidden, opts.need_grad_weight
    cast_w = weight.dtype != cdt
    grad_h = torch.zeros(na, d, device=h.device, dtype=cdt) if need_h else None
    # fp32/fp64 weights accumulate straight into grad_weight; low precision goes through an fp32 chunk accumulator
    grad_w = (torch.zeros_like(weight) if not cast_w else torch.empty_like(weight)) if need_w else None
    # grad_bias accumulates in the compute dtype (fp32 for low precision) across row tiles, cast once at the end
    grad_b = torch.zeros(vocab, device=h.device, dtype=cdt) if (bias is not None and need_w) else None
    col_bytes = (2 * d * _elem_bytes(cdt) if cast_w else 0) if need_w else (d * _elem_bytes(cdt) if cast_w else 0)
    rows_per_tile, v_chunk = chunk_sizes(na, vocab, opts.memory_budget, _elem_bytes(cdt), col_bytes)
    tiles = _Tiles(min(rows_per_tile, max(na, 1)), min(v_chunk, vocab), h.device, cdt)
    for v0, v1 in _spans(vocab, v_chunk):
        w = weight[v0:v1].to(cdt)
        b = bias[v0:v1].to(cdt) if bias is not None else None
        gw = None
        if need_w:
            gw = torch.zeros(v1 - v0, d, device=h.device, dtype=cdt) if cast_w else grad_w[v0:v1]
        for r0, r1 in _spans(na, rows_per_tile):
            sl = slice(r0, r1)
            z = _logits_tile(h[sl], w, b, opts, tiles.view(0, r1 - r0, v1 - v0))
            cut = _cut(z, thr[sl] if thr is not None else None, t[sl], v0)
            dz = _grad_tile_(
                z, tiles.view(1, r1 - r0, v1 - v0), t[sl], v0, st[:, sl], ent[sl] if ent is not None else None, gl[sl],
                ge[sl] if ge is not None else None, opts.temperature,
            )
            if cut is not None:
                dz.masked_fill_(cut, 0.0)
            if opts.softcap:  # chain rule through the cap: the tile again (one more matmul), as its slope
                dz.mul_(_softcap_slope_(_logits_tile(h[sl], w, b, opts, tiles.view(0, r1 - r0, v1 - v0)), opts))
            if need_h:
                grad_h[sl].addmm_(dz, w)
            if need_w:
                gw.addmm_(dz.T, h[sl])
                if grad_b is not None:
                    grad_b[v0:v1] += dz.sum(dim=0)
        if need_w and cast_w:
            grad_w[v0:v1] = gw
    grad_hidden = _scatter_rows(grad_h, idx, n).to(hidden.dtype) if need_h else None
    return grad_hidden, grad_w, grad_b.to(bias.dtype) if grad_b is not None else None


# ----------------------------------------------------------------------------------------------------------- logits


def logprobs_from_logits_fwd(logits, targets, opts: Options, threshold=None):
    n, vocab = logits.shape
    cdt = stats_dtype(logits.dtype)
    idx = _active_rows(targets, opts.ignore_index)
    t = targets if idx is None else targets.index_select(0, idx)
    thr = _rows_of(threshold, idx, cdt)
    na = t.shape[0]
    rows_per_tile, v_chunk = chunk_sizes(na, vocab, opts.memory_budget, _elem_bytes(cdt))
    stats = _OnlineStats(na, logits.device, cdt)
    tiles = _Tiles(min(rows_per_tile, max(na, 1)), min(v_chunk, vocab), logits.device, cdt)
    for r0, r1 in _spans(na, rows_per_tile):
        src = logits[r0:r1] if idx is None else logits.index_select(0, idx[r0:r1])
        for v0, v1 in _spans(vocab, v_chunk):
            z = tiles.view(0, r1 - r0, v1 - v0).copy_(src[:, v0:v1])
            if opts.temperature != 1.0:
                z.div_(opts.temperature)
            stats.update(slice(r0, r1), z, t[r0:r1], v0, opts.return_entropy, tiles.view(1, r1 - r0, v1 - v0),
                         thr[r0:r1] if thr is not None else None)
    logp, row_stats, entropy = stats.finalize(opts.return_entropy)
    return _outputs(logp, row_stats, entropy, idx, n, opts)


def logprobs_from_logits_bwd(grad_logp, grad_entropy, logits, targets, stats, entropy, opts: Options,
                             threshold=None):
    n, vocab = logits.shape
    cdt = stats_dtype(logits.dtype)
    g_ent = _entropy_grad(grad_entropy, entropy, opts)
    idx = _active_rows(targets, opts.ignore_index, grad_logp, g_ent)
    out = logits if opts.inplace_backward else torch.empty_like(logits)
    if idx is not None:  # rows without gradient get exact zeros
        inactive = torch.ones(n, dtype=torch.bool, device=logits.device)
        inactive[idx] = False
        out[inactive] = 0
    na = n if idx is None else idx.numel()
    rows_per_tile, v_chunk = chunk_sizes(na, vocab, opts.memory_budget, _elem_bytes(cdt))
    tiles = _Tiles(min(rows_per_tile, max(na, 1)), min(v_chunk, vocab), logits.device, cdt)
    for r0, r1 in _spans(na, rows_per_tile):
        # contiguous row ranges are sliced (no copy); compacted rows are gathered
        ri = slice(r0, r1) if idx is None else idx[r0:r1]
        t = targets[ri]
        st, gl = stats[:, ri].to(cdt), grad_logp[ri].to(cdt)
        ge = g_ent[ri].to(cdt) if g_ent is not None else None
        ent = entropy[ri].to(cdt) if g_ent is not None else None
        th = threshold[ri].to(cdt) if threshold is not None else None
        for v0, v1 in _spans(vocab, v_chunk):
            z = tiles.view(0, r1 - r0, v1 - v0).copy_(logits[ri, v0:v1])
            if opts.temperature != 1.0:
                z.div_(opts.temperature)
            cut = _cut(z, th, t, v0)
            dz = _grad_tile_(z, tiles.view(1, r1 - r0, v1 - v0), t, v0, st, ent, gl, ge, opts.temperature)
            if cut is not None:
                dz.masked_fill_(cut, 0.0)
            out[ri, v0:v1] = dz.to(out.dtype)
    return out
