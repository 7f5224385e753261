"""The sampler's support inside the ops (top_k, top_p, min_p; issue 42): every backend that can run here against the
float64 reference (reference.sampler_support, then the naive ops), forward and every gradient; the reference against
a re-implementation of vLLM's own procedure (sort, cumulative sum, masks); the threshold search's recursion forced
small; ties, targets outside the support, ignored rows, per-row settings; the defaults exactly as without; bad values
refused by name; no (N, V) tensor and zero-gradient rows still dropped; torch.library and torch.compile."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import assert_refused
from torch.utils._python_dispatch import TorchDispatchMode

import sgrpo_kernels as sk
from sgrpo_kernels import reference as ref
from sgrpo_kernels import support
from sgrpo_kernels.backends import Options
from sgrpo_kernels.backends import torch_chunked as tc
from sgrpo_kernels.truncation import Sampling

IGNORE = -100
N, D, V = 13, 7, 211  # V prime; D not a multiple of any block


def _tol(backend: str) -> dict:
    # torch computes fp64 inputs in fp64; triton computes them in fp32 (docs/ops.md)
    return dict(atol=1e-10, rtol=1e-9) if backend == "torch" else dict(atol=2e-5, rtol=2e-5)


def _linear_inputs(seed=0, n=N, d=D, v=V, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(n, d, generator=g, dtype=torch.float64) * scale
    w = torch.randn(v, d, generator=g, dtype=torch.float64)
    b = torch.randn(v, generator=g, dtype=torch.float64)
    t = torch.randint(0, v, (n,), generator=g)
    t[3] = IGNORE
    gl, ge = torch.randn(n, generator=g, dtype=torch.float64), torch.randn(n, generator=g, dtype=torch.float64)
    gl[5], ge[5] = 0.0, 0.0  # a row without gradient
    return h, w, b, t, gl, ge


def _run_linear(fn, h, w, b, t, gl, ge, device="cpu", **kw):
    leaves = [x.to(device).clone().requires_grad_(True) for x in (h, w, b)]
    logp, ent = fn(leaves[0], leaves[1], t.to(device), bias=leaves[2], **kw)
    grads = torch.autograd.grad((logp * gl.to(device)).sum() + (ent * ge.to(device)).sum(), leaves)
    return [x.detach().cpu().double() for x in (logp, ent, *grads)]


def _run_logits(fn, x, t, gl, ge, device="cpu", **kw):
    leaf = x.to(device).clone().requires_grad_(True)
    logp, ent = fn(leaf, t.to(device), **kw)
    (grad,) = torch.autograd.grad((logp * gl.to(device)).sum() + (ent * ge.to(device)).sum(), [leaf])
    return [y.detach().cpu().double() for y in (logp, ent, grad)]


def _assert_all_close(got, want, names, **tol):
    for name, a, e in zip(names, got, want):
        torch.testing.assert_close(a, e, **tol, msg=lambda m, name=name: f"{name}: {m}")


def _per_row(seed):
    g = torch.Generator().manual_seed(seed)
    k = torch.randint(1, V + 5, (N,), generator=g)  # some rows k >= V: no top-k there
    p = torch.rand(N, generator=g, dtype=torch.float64).clamp(min=0.05)
    p[::4] = 1.0  # no top-p there
    mp = torch.rand(N, generator=g, dtype=torch.float64) * 0.2
    mp[1::3] = 0.0
    return k, p, mp


K, P, MP = _per_row(7)
SETTINGS = {  # id -> keywords; "large k" and "top_p 0.97" need the threshold search beyond the top-C list
    "k=1": dict(top_k=1),
    "k=3": dict(top_k=3),
    "large-k": dict(top_k=150),
    "k=V-1": dict(top_k=V - 1),
    "p=1e-9": dict(top_p=1e-9),
    "p=0.5": dict(top_p=0.5),
    "p=0.97": dict(top_p=0.97),
    "min_p=0.05": dict(min_p=0.05),
    "min_p=0.9": dict(min_p=0.9),
    "k+p": dict(top_k=40, top_p=0.8),
    "all3": dict(top_k=100, top_p=0.9, min_p=0.01),
    "all3-large": dict(top_k=180, top_p=0.99, min_p=1e-4),
    "per-row": dict(top_k=K, top_p=P, min_p=MP),
    "per-row-k+scalar-p": dict(top_k=K, top_p=0.7),
}


INTERPRETED = ("k=1", "large-k", "p=0.97", "all3", "per-row")  # the settings the Triton interpreter runs


# --------------------------------------------------------------------------------------- against the reference


@pytest.mark.parametrize("temperature", [1.0, 0.6])
@pytest.mark.parametrize("setting", list(SETTINGS))
def test_linear_matches_reference(dev_backend, setting, temperature):
    device, backend = dev_backend
    if device == "cpu" and backend == "triton" and (temperature != 1.0 or setting not in INTERPRETED):
        pytest.skip("interpreter time: the kernels apply the same threshold in every case; torch covers the rest")
    kw = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in SETTINGS[setting].items()}
    h, w, b, t, gl, ge = _linear_inputs(seed=len(setting), scale=2.0)
    want = _run_linear(ref.linear_logprobs, h, w, b, t, gl, ge, out_dtype=None, temperature=temperature,
                       **SETTINGS[setting])
    for budget in (None, 3000) if backend == "torch" else (None,):  # one tile; many tiles (search and backends)
        got = _run_linear(sk.linear_logprobs, h, w, b, t, gl, ge, device=device, backend=backend, memory_budget=budget,
                          temperature=temperature, **kw)
        _assert_all_close(got, want, ("logp", "entropy", "grad_hidden", "grad_weight", "grad_bias"), **_tol(backend))
    assert (got[0][t == IGNORE] == 0).all() and (got[1][t == IGNORE] == 0).all()
    full = _run_linear(ref.linear_logprobs, h, w, b, t, gl, ge, out_dtype=None, temperature=temperature)
    if setting in ("k=1", "p=1e-9", "min_p=0.9"):  # the support really is cut: not the full-vocabulary numbers
        assert (got[1] - full[1]).abs().max() > 0.1


@pytest.mark.parametrize("setting", ["k=1", "large-k", "p=0.5", "p=0.97", "all3", "per-row"])
def test_logits_matches_reference(dev_backend, setting):
    device, backend = dev_backend
    kw = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in SETTINGS[setting].items()}
    g = torch.Generator().manual_seed(3)
    x = torch.randn(N, V, generator=g, dtype=torch.float64) * 3
    t = torch.randint(0, V, (N,), generator=g)
    t[2] = IGNORE
    gl, ge = torch.randn(N, generator=g, dtype=torch.float64), torch.randn(N, generator=g, dtype=torch.float64)
    want = _run_logits(ref.logprobs_from_logits, x, t, gl, ge, out_dtype=None, temperature=0.8, **SETTINGS[setting])
    for inplace in (False, True):
        fn = (lambda z, tt, **k: sk.logprobs_from_logits(z * 1.0, tt, inplace_backward=True, **k)) if inplace \
            else sk.logprobs_from_logits
        got = _run_logits(fn, x, t, gl, ge, device=device, backend=backend, temperature=0.8, **kw)
        _assert_all_close(got, want, ("logp", "entropy", "grad_logits"), **_tol(backend))
    assert (got[2][t == IGNORE] == 0).all()


def test_softcap_head_matches_reference(dev_backend):
    """The support is found on the head's output (cap, then temperature), as the sampler sees it."""
    device, backend = dev_backend
    h, w, b, t, gl, ge = _linear_inputs(seed=11, scale=3.0)
    x = h @ w.T + b
    cap = 2.5 * torch.tanh(0.5 * x / 2.5)
    want = _run_logits(ref.logprobs_from_logits, cap, t, gl, ge, out_dtype=None, temperature=0.7, top_k=5, top_p=0.6)
    leaves = [y.to(device).clone().requires_grad_(True) for y in (h, w, b)]
    logp, ent = sk.linear_logprobs(leaves[0], leaves[1], t.to(device), bias=leaves[2], backend=backend,
                                   temperature=0.7, logit_scale=0.5, softcap=2.5, top_k=5, top_p=0.6)
    torch.testing.assert_close(logp.cpu().double(), want[0], **_tol(backend))
    torch.testing.assert_close(ent.cpu().double(), want[1], **_tol(backend))


# ------------------------------------------------------------------------------------------- the support itself


def _vllm_mask(z: torch.Tensor, k: int | None, p: float | None, min_p: float | None) -> torch.Tensor:
    """vLLM's procedure as its sampler runs it (re-implemented here): min_p on probabilities, then an ascending sort,
    top-k by the k-th largest value, top-p by the cumulative sum `<= 1 - p` (the largest always kept)."""
    z = z.clone()
    if min_p:
        probs = z.softmax(-1)
        z[probs < min_p * probs.amax(-1, keepdim=True)] = -math.inf
    zs, idx = z.sort(-1)
    if k is not None:
        kth = zs.gather(-1, torch.full((z.shape[0], 1), z.shape[1] - k))
        zs[zs < kth] = -math.inf
    if p is not None:
        cum = zs.softmax(-1).cumsum(-1)
        drop = cum <= 1 - p
        drop[:, -1] = False
        zs[drop] = -math.inf
    return torch.empty_like(zs).scatter_(-1, idx, zs) > -math.inf


@pytest.mark.parametrize("kw", [dict(k=5), dict(k=60), dict(p=0.3), dict(p=0.9), dict(min_p=0.02),
                                dict(k=50, p=0.8), dict(k=30, p=0.95, min_p=0.01)], ids=str)
def test_reference_is_vllms_procedure_without_ties(kw):
    """On tie-free rows the specification keeps exactly vLLM's set (the target aside)."""
    g = torch.Generator().manual_seed(1)
    z = torch.randn(40, 300, generator=g, dtype=torch.float64) * 2.5
    want = _vllm_mask(z, kw.get("k"), kw.get("p"), kw.get("min_p"))
    t = want.to(torch.int8).argmax(-1)  # a kept target: it adds nothing
    got = ref.sampler_support(z, t, top_k=kw.get("k"), top_p=kw.get("p"), min_p=kw.get("min_p"))
    assert torch.equal(got, want)
    assert (got.sum(-1) < 300).all()  # every row cut


def test_ties_at_the_threshold_are_kept_whole():
    z = torch.tensor([[5.0, 3.0, 3.0, 3.0, 1.0, 0.0]], dtype=torch.float64)
    t = torch.tensor([0])
    # top_k = 2: the 2nd largest value is 3.0, shared by three tokens: all three kept (vLLM keeps them too)
    assert ref.sampler_support(z, t, top_k=2).tolist() == [[True, True, True, True, False, False]]
    # top_p just above the top token's mass: the next tie group is kept whole (vLLM: an order-dependent part of it)
    p_top = float(torch.softmax(z, -1)[0, 0])
    assert ref.sampler_support(z, t, top_p=p_top + 1e-6).tolist() == [[True, True, True, True, False, False]]
    assert ref.sampler_support(z, t, top_p=p_top).tolist() == [[True, False, False, False, False, False]]
    # a row of equal logits: nothing can be cut
    flat = torch.zeros(1, 6, dtype=torch.float64)
    assert ref.sampler_support(flat, t, top_k=1, top_p=0.1).all()


def test_ties_through_the_ops(dev_backend):
    device, backend = dev_backend
    g = torch.Generator().manual_seed(4)
    x = torch.randn(N, V, generator=g, dtype=torch.float64)
    for i in range(N):  # a tie group straddling the k-th place, and one at the top
        cols = torch.randperm(V, generator=g)[:6]
        x[i, cols[:4]] = x[i].sort(descending=True).values[2]
        x[i, cols[4:]] = x[i].max() + 1
    t = torch.randint(0, V, (N,), generator=g)
    gl, ge = torch.ones(N, dtype=torch.float64), torch.ones(N, dtype=torch.float64)
    for kw in (dict(top_k=3), dict(top_k=2), dict(top_p=0.3), dict(top_k=4, top_p=0.5)):
        want = _run_logits(ref.logprobs_from_logits, x, t, gl, ge, out_dtype=None, **kw)
        got = _run_logits(sk.logprobs_from_logits, x, t, gl, ge, device=device, backend=backend, **kw)
        _assert_all_close(got, want, ("logp", "entropy", "grad"), **_tol(backend))


@pytest.mark.parametrize("kw", [dict(top_k=3), dict(top_p=0.5), dict(min_p=0.1, top_p=0.9)], ids=str)
def test_masked_vocabulary_and_large_logits_through_the_ops(kw):
    """fp32 logits up to ~150 (exp overflows before a row's first kept token is seen) and -inf columns, over several
    vocab tiles (tiles with every token of a row cut): the torch backend zeroes the cut tokens' exp rather than
    writing -inf into the tile; outputs and gradient as the float64 naive path's."""
    g = torch.Generator().manual_seed(15)
    n, v = 9, 700
    x = torch.randn(n, v, generator=g) * 40
    x[:, 300:340] = -math.inf
    x[2, :600] = -math.inf
    t = torch.randint(0, 300, (n,), generator=g)
    gl, ge = torch.randn(n, generator=g, dtype=torch.float64), torch.randn(n, generator=g, dtype=torch.float64)
    want = _run_logits(ref.logprobs_from_logits, x.double(), t, gl, ge, out_dtype=None, **kw)
    got = _run_logits(sk.logprobs_from_logits, x, t, gl.float(), ge.float(), backend="torch", memory_budget=4096, **kw)
    _assert_all_close(got, want, ("logp", "entropy", "grad"), atol=1e-4, rtol=1e-4)


def test_target_outside_the_support_counts(dev_backend):
    """A target the filter would drop belongs to the support anyway (it was sampled): its logp is finite and the
    renormalization includes it."""
    device, backend = dev_backend
    z = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0, -1.0]], dtype=torch.float64).repeat(3, 1)
    t = torch.tensor([5, 0, 3])
    logp, ent = sk.logprobs_from_logits(z.to(device), t.to(device), backend=backend, top_k=2)
    for row, y in enumerate(t.tolist()):
        kept = [0, 1] + ([y] if y > 1 else [])
        lse = torch.logsumexp(z[row, kept], 0)
        assert abs(float(logp[row]) - float(z[row, y] - lse)) < 1e-6
        q = torch.softmax(z[row, kept], 0)
        assert abs(float(ent[row]) + float((q * q.log()).sum())) < 1e-6


def test_boundary_values_one_ulp_apart_keep_the_searchs_tokens(dev_backend):
    """fp32 logits whose x / T are adjacent floats at the support's boundary: the midpoint threshold rounds onto the
    kept value, so a backend must compute z = x / T exactly as the search does (and as vLLM's sampler does). The
    Triton kernels multiplied by 1 / T, one ulp lower here, and dropped the kept token: logp 0.0, entropy 0.0 (top_k),
    and the same through min_p's bound, which is used as it is."""
    device, backend = dev_backend
    x1, x2, temp = -3.661336898803711, -3.66133713722229, 0.7  # x1 / 0.7 and x2 / 0.7: adjacent fp32 values
    cases = [  # (logits row, target, settings, the kept tokens)
        ([0.0, x1, x2, -10.0], 0, dict(top_k=2), [0, 1]),
        ([x1, -10.0, -12.0], 1, dict(min_p=0.9999999), [0, 1]),  # the bound rounds onto z_0 = the row's max
    ]
    for row, y, kw, kept in cases:
        x = torch.tensor([row], dtype=torch.float32)
        assert x1 / temp != x2 / temp and float(torch.tensor(x1) / temp) != float(torch.tensor(x2) / temp)
        leaf = x.clone().to(device).requires_grad_(True)
        logp, ent = sk.logprobs_from_logits(leaf, torch.tensor([y], device=device), backend=backend,
                                            temperature=temp, **kw)
        (grad,) = torch.autograd.grad(logp.sum() + ent.sum(), [leaf])
        z = x.double()[0, kept] / temp
        q = torch.softmax(z, 0)
        want_grad = torch.zeros(len(row), dtype=torch.float64)  # d(logp + H)/dx over the kept tokens, 0 elsewhere
        logq = q.log()
        h = -(q * logq).sum()
        want_grad[kept] = ((torch.arange(len(kept)) == kept.index(y)).double() - q - q * (logq + h)) / temp
        logp, ent = float(logp.detach()), float(ent.detach())
        assert abs(logp - float(logq[kept.index(y)])) < 1e-5, (kw, logp)
        assert abs(ent - float(h)) < 1e-5, (kw, ent)
        torch.testing.assert_close(grad.cpu().double()[0], want_grad, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("seed", [2, 3])
@pytest.mark.parametrize("bins, gather", [(3, 2), (5, 9)])
def test_search_recursion_forced_small(monkeypatch, seed, bins, gather):
    """The threshold search with a tiny top list, few bins and a small gather: several recursion levels, ties, -inf
    logits and equal-value bins; the kept set equals the specification's on every row. (Before the fix that came with
    this test, the gathered bins of a batch read another row's count above the bin.)"""
    monkeypatch.setattr(support, "TOP_C", 2)
    monkeypatch.setattr(support, "MAX_C", 2)
    monkeypatch.setattr(support, "BINS", bins)
    monkeypatch.setattr(support, "GATHER", gather)
    g = torch.Generator().manual_seed(seed)
    n, v = 60, 97
    z = torch.randn(n, v, generator=g, dtype=torch.float64) * 2
    z[::5] = z[::5].round()  # many ties
    z[1::7, :30] = -math.inf  # masked vocabulary
    z[2::9] = 1.0  # a flat row
    k = torch.randint(1, v + 3, (n,), generator=g)
    p = torch.rand(n, generator=g, dtype=torch.float64).clamp(min=1e-3)
    mp = torch.where(torch.arange(n) % 3 == 0, torch.rand(n, generator=g, dtype=torch.float64) * 0.3, 0.0)
    t = torch.randint(0, v, (n,), generator=g)

    def tile(rows, v0, v1):
        return z[rows, v0:v1].clone()

    for kk, pp, mm in ((k, torch.ones_like(p), torch.zeros_like(mp)), (torch.full_like(k, v), p, torch.zeros_like(mp)),
                       (k, p, mp)):
        thr = support.find_thresholds(tile, n, v, kk, pp, mm, dtype=torch.float64, device=z.device, memory_budget=2000)
        got = (z >= thr.unsqueeze(1)) | (torch.arange(v) == t.unsqueeze(1))
        want = ref.sampler_support(z, t, top_k=kk, top_p=pp, min_p=mm)
        got &= z > -math.inf  # (a -inf token has no mass either way)
        want &= z > -math.inf
        assert torch.equal(got, want), torch.nonzero((got != want).any(1)).squeeze(1).tolist()


def test_threshold_is_a_midpoint_between_kept_and_dropped():
    """The threshold sits halfway between the last kept value and the first dropped one, so a backend's own
    recomputation of the logits (rounded an ulp differently) keeps the same tokens."""
    z = torch.tensor([[3.0, 2.0, 1.0, 0.0]], dtype=torch.float64)
    thr = support.find_thresholds(lambda r, a, b: z[r, a:b].clone(), 1, 4, torch.tensor([2]), torch.ones(1),
                                  torch.zeros(1), dtype=torch.float64, device=z.device)
    assert float(thr) == 1.5


@pytest.mark.parametrize("seed", [0, 1])
def test_first_pass_histogram_and_its_fallbacks(monkeypatch, seed):
    """top_p alone: pass 1's histogram over each row's first tile (4 tiles a row here) decides most rows with one
    gather pass; the threshold in the end bins (values outside the first tile's range), a bin too full to gather, a
    first tile all -inf (no range) and ties all give the specification's set, some through the fallback search."""
    monkeypatch.setattr(support, "TOP_C", 2)
    monkeypatch.setattr(support, "MAX_C", 2)
    decided = []
    first_pass = support._from_first_pass

    def spy(*args):
        out = first_pass(*args)
        decided.extend(out[3].tolist())
        return out

    monkeypatch.setattr(support, "_from_first_pass", spy)
    g = torch.Generator().manual_seed(seed)
    n, v = 48, 1000
    ramp = torch.linspace(0, 8, v, dtype=torch.float64)
    z = torch.randn(n, v, generator=g, dtype=torch.float64)
    z[0::6] *= 0.05  # near-flat
    z[1::6] += ramp  # the largest values in the last tile: above the first tile's range
    z[2::6] -= ramp  # the smallest in the last tiles: below it
    z[3::6, :300] = -math.inf  # the first tile masked: no range
    z[4::6] = (z[4::6] * 2).round()  # ties: bins of equal values
    z[5::6] *= 3
    p = torch.rand(n, generator=g, dtype=torch.float64) * 0.5 + 0.5
    p[2::12] = 0.9999  # deep into the low values
    k, mp, t = torch.full((n,), v), torch.zeros(n, dtype=torch.float64), torch.randint(0, v, (n,), generator=g)
    sweeps = []

    def tile(rows, v0, v1):
        sweeps.append(v0)
        return z[rows, v0:v1].clone()

    thr = support.find_thresholds(tile, n, v, k, p, mp, dtype=torch.float64, device=z.device, memory_budget=2000)
    assert len(set(sweeps[i] for i in range(4))) == 4  # several tiles a row
    got = ((z >= thr.unsqueeze(1)) | (torch.arange(v) == t.unsqueeze(1))) & (z > -math.inf)
    want = ref.sampler_support(z, t, top_p=p) & (z > -math.inf)
    assert torch.equal(got, want), torch.nonzero((got != want).any(1)).squeeze(1).tolist()
    assert any(decided) and not all(decided), decided  # both the histogram's answer and the fallback ran


@pytest.mark.parametrize("c", [1, 3, 8])
def test_top_list_merge_is_topk(c):
    """The running top list (only the values above its last enter) equals torch.topk of everything seen, ties and
    -inf included."""
    g = torch.Generator().manual_seed(c)
    z = torch.randn(7, 300, generator=g).mul_(2).round_()
    z[:, 100:160] = -math.inf
    z[2] = 1.0
    z[3, ::7] = 50.0  # many newcomers in one tile
    prev = None
    for v0 in range(0, 300, 37):
        prev = support._merge_top(prev, z[:, v0:v0 + 37], c)
        assert torch.equal(prev, torch.topk(z[:, :v0 + 37], c, dim=1).values)


# -------------------------------------------------------------------------------------------------- the defaults


@pytest.mark.parametrize("kw", [dict(top_k=None, top_p=None, min_p=None), dict(top_p=1.0), dict(min_p=0.0),
                                dict(top_k=V + 3, top_p=1.0, min_p=0.0)], ids=str)
def test_options_that_cut_nothing_give_exactly_the_full_op(dev_backend, kw):
    device, backend = dev_backend
    h, w, b, t, gl, ge = _linear_inputs(seed=5)
    h, w, b = (x.float() for x in (h, w, b))
    full = _run_linear(sk.linear_logprobs, h, w, b, t, gl.float(), ge.float(), device=device, backend=backend)
    got = _run_linear(sk.linear_logprobs, h, w, b, t, gl.float(), ge.float(), device=device, backend=backend, **kw)
    for a, e in zip(got, full):
        assert torch.equal(a, e)


def test_per_row_settings_that_cut_nothing_run_the_masked_path_bit_identically(dev_backend):
    """Tensors are never skipped as no-ops: the threshold search and the masked kernels run, with -inf thresholds."""
    device, backend = dev_backend
    h, w, b, t, gl, ge = _linear_inputs(seed=6)
    h, w, b = (x.float() for x in (h, w, b))
    full = _run_linear(sk.linear_logprobs, h, w, b, t, gl.float(), ge.float(), device=device, backend=backend)
    kw = dict(top_k=torch.full((N,), V, device=device), top_p=torch.ones(N, device=device))
    got = _run_linear(sk.linear_logprobs, h, w, b, t, gl.float(), ge.float(), device=device, backend=backend, **kw)
    for a, e in zip(got, full):
        assert torch.equal(a, e)


# ------------------------------------------------------------------------------------------- bad values refused

_LEAD = (N,)


@pytest.mark.parametrize("kw, exc, words", [
    (dict(top_k=0), ValueError, ["top_k", ">= 1", "0"]),
    (dict(top_k=-1), ValueError, ["top_k", "-1"]),
    (dict(top_k=2.0), TypeError, ["top_k", "float"]),
    (dict(top_k=True), TypeError, ["top_k", "bool"]),
    (dict(top_k=torch.zeros(N, dtype=torch.int64)), ValueError, ["top_k", ">= 1"]),
    (dict(top_k=torch.ones(N)), TypeError, ["top_k", "integer"]),
    (dict(top_k=torch.ones(N + 1, dtype=torch.int64)), ValueError, ["top_k", f"({N + 1},)", f"({N},)"]),
    (dict(top_p=0.0), ValueError, ["top_p", "(0, 1]", "0.0"]),
    (dict(top_p=1.5), ValueError, ["top_p", "(0, 1]", "1.5"]),
    (dict(top_p=float("nan")), ValueError, ["top_p", "nan"]),
    (dict(top_p="0.9"), TypeError, ["top_p", "str"]),
    (dict(top_p=torch.full((N,), 1.2, dtype=torch.float64)), ValueError, ["top_p", "(0, 1]", "1.2"]),
    (dict(top_p=torch.ones(N, dtype=torch.float64).index_fill(0, torch.tensor([5]), 1.2)), ValueError,
     ["top_p", "found 1 value(s)", "[1.2] at row(s) [5]"]),  # which row (it named the value only)
    (dict(top_p=torch.ones(N, dtype=torch.int64)), TypeError, ["top_p", "floating"]),
    (dict(top_p=torch.ones(2, N, dtype=torch.float64)), ValueError, ["top_p", f"({N},)"]),
    (dict(min_p=1.0), ValueError, ["min_p", "[0, 1)", "1.0"]),
    (dict(min_p=-0.1), ValueError, ["min_p", "[0, 1)"]),
    (dict(min_p=torch.full((N,), -0.5, dtype=torch.float64)), ValueError, ["min_p", "[0, 1)", "-0.5"]),
], ids=lambda x: str(x)[:40] if not isinstance(x, (type, list)) else "")
def test_bad_values_are_refused_by_name(kw, exc, words):
    h, w, b, t, _, _ = _linear_inputs()
    assert_refused(lambda: sk.linear_logprobs(h, w, t, bias=b, **kw), exc, words)
    x = h @ w.T
    assert_refused(lambda: sk.logprobs_from_logits(x, t, **kw), exc, words)


def test_refused_on_the_npu_backend_and_with_process_group():
    s = Sampling.from_args(5, 0.9, None, torch.Size(_LEAD), torch.device("cpu"))
    assert_refused(lambda: s.refuse_if_unsupported("linear_logprobs", "npu", False), ValueError,
                   ["'npu' backend", "top_k=5", "top_p=0.9"])
    assert_refused(lambda: s.refuse_if_unsupported("logprobs_from_logits", "torch", True), ValueError,
                   ["process_group", "top_k=5"])
    s.refuse_if_unsupported("linear_logprobs", "torch", False)  # the torch backend applies it


# ----------------------------------------------------------------------------------- memory and row skipping


class _Shapes(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.max_numel, self.matmuls = 0, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for o in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(o, torch.Tensor):
                self.max_numel = max(self.max_numel, o.numel())
        if func.overloadpacket in (torch.ops.aten.mm, torch.ops.aten.addmm, torch.ops.aten.addmm_):
            a = args[1] if "addmm" in str(func.overloadpacket) else args[0]
            self.matmuls.append(tuple(a.shape))  # (M, K)
        return out


@pytest.mark.parametrize("kw", [dict(top_k=300), dict(top_p=0.95), dict(top_k=50, top_p=0.9, min_p=0.001)], ids=str)
def test_no_full_logits_anywhere(kw):
    """Search, forward and backward of the torch path: no tensor of N x V elements (the largest is weight-sized)."""
    n, d, v = 64, 16, 8192
    h, w, b, t, gl, ge = _linear_inputs(seed=8, n=n, d=d, v=v)
    h, w, b = (x.float().requires_grad_(True) for x in (h, w, b))
    with _Shapes() as rec:
        logp, ent = sk.linear_logprobs(h, w, t, bias=b, backend="torch", memory_budget=64 * 1024, **kw)
        torch.autograd.grad((logp * gl.float()).sum() + (ent * ge.float()).sum(), [h, w, b])
    assert rec.max_numel <= v * d, rec.max_numel
    assert rec.max_numel < n * v


def test_zero_gradient_rows_are_still_dropped_before_the_matmuls():
    h, w, b, t, gl, ge = _linear_inputs(seed=9, n=40)
    h, w, b, gl, ge = (x.float() for x in (h, w, b, gl, ge))
    t[3] = 0
    dead = torch.arange(40) % 4 != 0
    gl[dead], ge[dead] = 0.0, 0.0
    opts = Options(memory_budget=1 << 30)
    thr = support.find_thresholds(lambda r, a, c: (h[r] @ w[a:c].T + b[a:c]), 40, V, torch.full((40,), 7),
                                  torch.ones(40), torch.zeros(40), dtype=torch.float32, device=h.device)
    logp, ent, stats = tc.linear_logprobs_fwd(h, w, t, b, opts, threshold=thr)
    with _Shapes() as rec:
        grads = tc.linear_logprobs_bwd(gl, ge, h, w, t, b, stats, ent, opts, threshold=thr)
    # the recompute and grad_hidden (M = rows) and grad_weight (K = rows) products all see the 10 live rows, not 40
    assert len(rec.matmuls) == 3 and all(10 in mk for mk in rec.matmuls), rec.matmuls
    dense = tc.linear_logprobs_bwd(torch.where(dead, 1e-30, gl), ge, h, w, t, b, stats, ent, opts, threshold=thr)
    for a, e in zip(grads, dense):
        torch.testing.assert_close(a, e)


# ------------------------------------------------------------------------------------- torch.library / compile


def test_opcheck_threshold_ops():
    from sgrpo_kernels.custom_ops import Call

    h, w, b, t, _, _ = _linear_inputs(seed=10)
    h, w, b = (x.float() for x in (h, w, b))
    call = Call("torch", True, Options(temperature=0.9)).pack()
    kpm = (torch.full((N,), 5), torch.full((N,), 0.8, dtype=torch.float64), torch.zeros(N, dtype=torch.float64))
    torch.library.opcheck(torch.ops.sgrpo.linear_support_threshold.default, (h, w, t, b, *kpm, *call))
    torch.library.opcheck(torch.ops.sgrpo.logits_support_threshold.default, (h @ w.T, t, *kpm, *call))
    thr = torch.ops.sgrpo.linear_support_threshold(h, w, t, b, *kpm, *call)
    leaves = [x.clone().requires_grad_(True) for x in (h, w, b)]
    torch.library.opcheck(torch.ops.sgrpo.linear_logprobs_support_fwd.default, (*leaves[:2], t, leaves[2], thr, *call))
    z = (h @ w.T).requires_grad_(True)
    torch.library.opcheck(torch.ops.sgrpo.logprobs_from_logits_support_fwd.default, (z, t, thr, *call))
    _, ent, stats = torch.ops.sgrpo.linear_logprobs_support_fwd(h, w, t, b, thr, *call)
    gl = torch.randn(N)
    torch.library.opcheck(torch.ops.sgrpo.linear_logprobs_support_bwd.default,
                          (gl, gl, h, w, t, b, stats, ent, thr, *call))


def test_torch_compile_fullgraph(dev_backend):
    device, backend = dev_backend
    h, w, b, t, _, _ = _linear_inputs(seed=12)
    h, w, b = (x.float().to(device).requires_grad_(True) for x in (h, w, b))
    t = t.to(device)
    k = torch.randint(1, 30, (N,), device=device)

    def f(h, w, b):
        lp, ent = sk.linear_logprobs(h, w, t, bias=b, backend=backend, top_k=k, top_p=0.9, min_p=0.01)
        return (lp * 0.3 + ent * 0.7).sum()

    eager = f(h, w, b)
    grads_e = torch.autograd.grad(eager, [h, w, b])
    compiled = torch.compile(f, fullgraph=True, backend="eager")(h, w, b)
    grads_c = torch.autograd.grad(compiled, [h, w, b])
    torch.testing.assert_close(compiled, eager)
    for a, e in zip(grads_c, grads_e):
        torch.testing.assert_close(a, e)


@pytest.mark.parametrize("kw", [dict(top_p=0.9), dict(top_k=500), dict(top_k=100, top_p=0.95, min_p=1e-3)], ids=str)
def test_passes_over_the_vocabulary_are_few(kw):
    """On near-uniform rows (the search's worst case: the kept set is most of V) the search reads the vocabulary at
    most three times: the first pass, one histogram, one gather (the next value below comes from them); top_p alone
    twice (pass 1 keeps the histogram)."""
    n, v = 16, 5000
    g = torch.Generator().manual_seed(13)
    z = torch.randn(n, v, generator=g, dtype=torch.float64) * 0.1
    sweeps = []

    def tile(rows, v0, v1):
        if v0 == 0:
            sweeps.append(rows.numel())
        return z[rows, v0:v1].clone()

    k = torch.full((n,), kw.get("top_k", v))
    p = torch.full((n,), kw.get("top_p", 1.0), dtype=torch.float64)
    mp = torch.full((n,), kw.get("min_p", 0.0), dtype=torch.float64)
    t = torch.zeros(n, dtype=torch.int64)
    thr = support.find_thresholds(tile, n, v, k, p, mp, dtype=torch.float64, device=z.device,
                                  memory_budget=n * 48 * 500)  # (500 columns a tile: pass 1's histogram over 10)
    assert len(sweeps) <= (2 if kw == dict(top_p=0.9) else 3), sweeps
    want = ref.sampler_support(z, t, top_k=k, top_p=p, min_p=mp)
    assert torch.equal((z >= thr.unsqueeze(1)) | (torch.arange(v) == 0), want)
