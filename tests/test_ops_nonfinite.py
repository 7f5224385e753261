"""Non-finite inputs: every backend that can run here gives what float64 gives, forward and every gradient: NaN where
float64 gives NaN, -inf where it gives -inf, the other rows of the batch unchanged. A NaN anywhere in a row (a NaN
hidden state, weight or bias entry, or logit) makes that row NaN; a +inf logit gives logp -inf (NaN at a +inf target)
and entropy NaN; a row of -inf logits only gives NaN; -inf on some tokens (a masked vocabulary) stays finite. A
diverged model must not look confident (logp 0, or an entropy above ln V).

The float64 specification: logp = z_y - logsumexp(z) (torch.logsumexp: -inf when another logit is +inf, where
torch.log_softmax gives NaN for the whole row), the entropy and every gradient of reference.py (log_softmax)."""

from __future__ import annotations

import math

import pytest
import torch

import sgrpo_kernels as sk
from sgrpo_kernels import reference as ref

# numpy, running the Triton interpreter, warns about the NaN and inf these tests feed it on purpose
pytestmark = pytest.mark.filterwarnings("ignore:(invalid value|All-NaN):RuntimeWarning")

IGNORE = -100
NAN, INF = float("nan"), math.inf
V = 40  # more than one Triton vocab tile (the interpreter's BLOCK_V = 32): the forward's split and merge run too


def _exact_logits(x: torch.Tensor, t: torch.Tensor, gl: torch.Tensor, ge: torch.Tensor, temperature: float = 1.0,
                  **sampling):
    """float64 (logp, entropy, grad_logits) of `x` (N, V), over the sampler's support with top_k / top_p / min_p."""
    leaf = x.detach().double().requires_grad_(True)
    kw = dict(temperature=temperature, out_dtype=None, **sampling)
    _, ent = ref.logprobs_from_logits(leaf, t, **kw)
    logp_ls, _ = ref.logprobs_from_logits(leaf, t, return_entropy=False, **kw)
    (grad,) = torch.autograd.grad((logp_ls * gl.double()).sum() + (ent * ge.double()).sum(), [leaf])
    z = leaf.detach() / temperature
    if sampling:
        z = z.masked_fill(~ref.sampler_support(z, t, **sampling), -INF)
    live = t != IGNORE
    logp = z.gather(1, t.clamp(min=0).unsqueeze(1)).squeeze(1) - torch.logsumexp(z, 1)
    # ignored rows have no gradient (the op contract; the naive path's log_softmax backward makes 0 * NaN of them)
    return torch.where(live, logp, 0.0), ent.detach(), torch.where(live.unsqueeze(1), grad, 0.0)


def _close(got, want, names):
    for name, a, e in zip(names, got, want):
        torch.testing.assert_close(a.detach().cpu().double(), e, atol=2e-5, rtol=2e-5, equal_nan=True,
                                   msg=lambda m, name=name: f"{name}: {m}")


def _logits_batch():
    """One batch, one case per row (row i: `cases[i]`), and the float64 answer of each row's case."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(9, V, generator=g) * 2
    t = torch.tensor([3, 5, 7, 9, 11, 13, 15, 17, IGNORE])
    x[1, 20] = NAN  # a NaN logit
    x[2, 21] = INF  # +inf on another token: logp -inf, entropy NaN
    x[3, 9] = INF  # +inf at the target: logp NaN
    x[4] = -INF  # every logit -inf: no distribution, NaN
    x[5, 13] = -INF  # -inf at the target: logp -inf, the rest finite
    x[6, 25:] = -INF  # a masked vocabulary: finite
    x[7, 2], x[7, 30] = INF, NAN  # +inf and NaN: NaN
    x[8, 4] = NAN  # an ignored row: 0, no gradient, whatever its logits
    gl = torch.linspace(0.5, 1.5, 9)
    ge = torch.linspace(-0.7, 0.3, 9)
    return x, t, gl, ge


@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_logits_nonfinite_rows_match_float64(dev_backend, temperature):
    device, backend = dev_backend
    x, t, gl, ge = _logits_batch()
    leaf = x.to(device).requires_grad_(True)
    logp, ent = sk.logprobs_from_logits(leaf, t.to(device), backend=backend, temperature=temperature)
    (grad,) = torch.autograd.grad((logp * gl.to(device)).sum() + (ent * ge.to(device)).sum(), [leaf])
    want = _exact_logits(x, t, gl, ge, temperature)
    _close((logp, ent, grad), want, ("logp", "entropy", "grad_logits"))
    assert torch.isnan(logp[[1, 3, 4, 7]]).all() and torch.isneginf(logp[[2, 5]]).all()  # the spec, spelled out
    assert torch.isnan(ent[[1, 2, 3, 4, 7]]).all() and logp[8] == 0 and ent[8] == 0
    # the finite rows are exactly those of a batch without the others
    fin = [0, 6]
    alone = sk.logprobs_from_logits(x[fin].to(device), t[fin].to(device), backend=backend, temperature=temperature)
    assert torch.equal(logp[fin].detach(), alone.logp) and torch.equal(ent[fin].detach(), alone.entropy)


@pytest.mark.parametrize("sampling", [dict(top_k=3), dict(top_p=0.9), dict(min_p=0.1)], ids=["top_k", "top_p", "min_p"])
def test_truncated_inf_rows_match_float64(dev_backend, sampling):
    """+inf and -inf rows under the sampler's support: as float64, the gradient 0 outside the support (the triton
    backward gave 0 * NaN there on a +inf row, from its NaN entropy)."""
    device, backend = dev_backend
    x, t, gl, ge = _logits_batch()
    keep = [0, 2, 3, 4, 5, 6, 8]  # (the NaN rows: test_truncated_nan_row_is_nan_and_the_others_unchanged)
    x, t, gl, ge = x[keep], t[keep], gl[keep], ge[keep]
    leaf = x.to(device).requires_grad_(True)
    logp, ent = sk.logprobs_from_logits(leaf, t.to(device), backend=backend, **sampling)
    (grad,) = torch.autograd.grad((logp * gl.to(device)).sum() + (ent * ge.to(device)).sum(), [leaf])
    _close((logp, ent, grad), _exact_logits(x, t, gl, ge, **sampling), ("logp", "entropy", "grad_logits"))


def _linear_case(kind: str):
    g = torch.Generator().manual_seed(1)
    h, w, b = torch.randn(4, 8, generator=g), torch.randn(V, 8, generator=g), torch.randn(V, generator=g)
    t = torch.tensor([1, 2, 3, 4])
    if kind == "nan_hidden":
        h[1, 2] = NAN  # row 1 NaN, the others finite
    elif kind == "nan_weight":
        w[30, 0] = NAN  # every row NaN
    elif kind == "inf_bias":
        b[35] = INF  # +inf on a non-target token of every row: logp -inf, entropy NaN
    elif kind == "masked_bias":
        b[20:] = -INF  # finite
    elif kind == "dead_bias":
        b[:] = -INF  # every row NaN
    elif kind == "inf_hidden":
        h[2, 0] = INF  # row 2: +-inf logits (and NaN where W is 0): NaN or -inf as float64
    return h, w, b, t


@pytest.mark.parametrize("kind", ["nan_hidden", "nan_weight", "inf_bias", "masked_bias", "dead_bias", "inf_hidden"])
def test_linear_nonfinite_inputs_match_float64(dev_backend, kind):
    device, backend = dev_backend
    h, w, b, t = _linear_case(kind)
    gl, ge = torch.tensor([1.0, -0.5, 0.25, 2.0]), torch.tensor([0.3, 0.6, -1.0, 0.1])
    leaves = [x.to(device).requires_grad_(True) for x in (h, w, b)]
    logp, ent = sk.linear_logprobs(leaves[0], leaves[1], t.to(device), bias=leaves[2], backend=backend)
    grads = torch.autograd.grad((logp * gl.to(device)).sum() + (ent * ge.to(device)).sum(), leaves)
    exact = [x.double().requires_grad_(True) for x in (h, w, b)]
    z = exact[0] @ exact[1].T + exact[2]
    want_logp, want_ent, _ = _exact_logits(z.detach(), t, gl, ge)
    _, ref_ent = ref.logprobs_from_logits(z, t, out_dtype=None)
    ref_logp, _ = ref.logprobs_from_logits(z, t, out_dtype=None, return_entropy=False)
    want_grads = torch.autograd.grad((ref_logp * gl.double()).sum() + (ref_ent * ge.double()).sum(), exact)
    _close((logp, ent, *grads), (want_logp, want_ent, *want_grads), ("logp", "entropy", "grad_h", "grad_w", "grad_b"))
    assert not bool(((logp == 0) & ~torch.isfinite(want_logp.to(device))).any())  # never "confident"


def test_sgrpo_loss_nan_hidden_is_nan(dev_backend):
    """A NaN hidden state reaches the loss (it was 0.0 on the triton backend: a diverged model looked confident)."""
    device, backend = dev_backend
    g = torch.Generator().manual_seed(2)
    h, w = torch.randn(2, 3, 8, generator=g), torch.randn(16, 8, generator=g)
    h[0, 1, 0] = NAN
    ids = torch.randint(0, 16, (2, 3), generator=g)
    mask = torch.ones(2, 3, dtype=torch.bool)
    loss, _ = sk.sgrpo_loss(h.to(device), w.to(device), ids.to(device), torch.tensor([1.0, -1.0], device=device),
                            mask.to(device), sk.rl.preset("dapo"), backend=backend)
    assert torch.isnan(loss)


# ------------------------------------------------------------------------------ the sampler's support (top_k ...)

SAMPLING = [dict(top_p=0.9), dict(top_k=3), dict(min_p=0.1), dict(top_k=5, top_p=0.8),
            dict(top_p=torch.tensor([0.9, 0.5, 0.7, 1.0, 0.95, 0.6]))]


@pytest.mark.parametrize("sampling", SAMPLING, ids=["top_p", "top_k", "min_p", "top_k_top_p", "top_p_rows"])
def test_truncated_nan_row_is_nan_and_the_others_unchanged(dev_backend, sampling):
    """One NaN row in a batch: that row NaN, every other row as float64 gives it (top_p raised an out-of-bounds
    index error from the search's histogram for the whole batch, on every backend)."""
    device, backend = dev_backend
    g = torch.Generator().manual_seed(3)
    x = torch.randn(6, V, generator=g) * 2
    x[2, 7] = NAN
    t = torch.tensor([0, 1, 2, 3, 4, 5])
    gl, ge = torch.linspace(0.5, 1.5, 6), torch.linspace(-0.7, 0.3, 6)
    leaf = x.to(device).requires_grad_(True)
    kw = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in sampling.items()}
    logp, ent = sk.logprobs_from_logits(leaf, t.to(device), backend=backend, **kw)
    (grad,) = torch.autograd.grad((logp * gl.to(device)).sum() + (ent * ge.to(device)).sum(), [leaf])
    assert torch.isnan(logp[2]) and torch.isnan(ent[2]) and torch.isnan(grad[2]).all()
    fin = [0, 1, 3, 4, 5]
    exact = x[fin].double().requires_grad_(True)
    rows = {k: (v[fin] if isinstance(v, torch.Tensor) else v) for k, v in sampling.items()}
    want_logp, want_ent = ref.logprobs_from_logits(exact, t[fin], out_dtype=None, **rows)
    (want_grad,) = torch.autograd.grad((want_logp * gl[fin].double()).sum() + (want_ent * ge[fin].double()).sum(),
                                       [exact])
    _close((logp[fin], ent[fin], grad[fin]), (want_logp.detach(), want_ent.detach(), want_grad),
           ("logp", "entropy", "grad_logits"))


def test_truncated_linear_nan_hidden_row(dev_backend):
    """The same through linear_logprobs: a NaN hidden state under top_p gives a NaN row, the others as float64."""
    device, backend = dev_backend
    h, w, b, t = _linear_case("nan_hidden")
    logp, ent = sk.linear_logprobs(h.to(device), w.to(device), t.to(device), bias=b.to(device), backend=backend,
                                   top_p=0.9)
    assert torch.isnan(logp[1]) and torch.isnan(ent[1])
    fin = [0, 2, 3]
    want = ref.linear_logprobs(h[fin].double(), w.double(), t[fin], bias=b.double(), out_dtype=None, top_p=0.9)
    _close((logp[fin], ent[fin]), want, ("logp", "entropy"))


@pytest.mark.parametrize("vocab, sampling", [
    (211, dict(top_p=0.9)), (211, dict(top_k=100, top_p=0.5)), (211, dict(min_p=0.1, top_p=0.9)),
    (1031, dict(top_k=1030)), (1031, dict(top_k=1030, top_p=0.8)),
], ids=["top_p", "top_k_top_p", "min_p_top_p", "far_top_k", "far_top_k_top_p"])
def test_truncated_search_with_nonfinite_rows(dev_backend, vocab, sampling):
    """Rows the support search cannot bin (a +inf, -inf-only or NaN row: NaN bin indices, out of bounds) stay out of
    it, so the batch runs (each case raised before): the finite rows as float64, the +inf rows' support just their
    +inf tokens (float64's for top_p; a top_k beyond the search's top list keeps those too), the others NaN."""
    device, backend = dev_backend
    g = torch.Generator().manual_seed(4)
    x = torch.randn(6, vocab, generator=g) * 2
    x[1, 7] = INF  # +inf on another token
    x[2, 9], x[2, 100] = INF, INF  # +inf at the target and elsewhere
    x[3] = -INF
    x[4, 3] = NAN
    t = torch.tensor([1, 2, 100, 5, 6, 7])
    gl, ge = torch.linspace(0.5, 1.5, 6), torch.linspace(-0.7, 0.3, 6)
    leaf = x.to(device).requires_grad_(True)
    logp, ent = sk.logprobs_from_logits(leaf, t.to(device), backend=backend, **sampling)
    (grad,) = torch.autograd.grad((logp * gl.to(device)).sum() + (ent * ge.to(device)).sum(), [leaf])
    want_logp, want_ent, want_grad = _exact_logits(x, t, gl, ge, **sampling)
    fwd = [0, 1, 2, 3]  # (float64's support of a NaN row is arbitrary: row 4 is checked below)
    rows = fwd if sampling.get("top_k", 0) <= 1024 else [0]  # (a far top_k: the grad's NaN columns differ)
    _close((logp[fwd], ent[fwd]), (want_logp[fwd], want_ent[fwd]), ("logp", "entropy"))
    _close((grad[rows],), (want_grad[rows],), ("grad_logits",))
    assert torch.isnan(logp[4]) and torch.isnan(ent[4]) and torch.isnan(grad[4]).all()


# --------------------------------------------------------------------------------------- settings out of range


@pytest.mark.parametrize("top_k", [2**63, 2**70])
def test_top_k_beyond_int64_keeps_every_token(dev_backend, top_k):
    """top_k >= V keeps every token, however large (2**70 was an OverflowError): the full op's bits, float64's
    values."""
    device, backend = dev_backend
    h, w, b, t = _linear_case("none")
    args = (h.to(device), w.to(device), t.to(device))
    got = sk.linear_logprobs(*args, bias=b.to(device), backend=backend, top_k=top_k)
    full = sk.linear_logprobs(*args, bias=b.to(device), backend=backend)
    assert torch.equal(got.logp, full.logp) and torch.equal(got.entropy, full.entropy)
    _close(got, ref.linear_logprobs(h.double(), w.double(), t, bias=b.double(), out_dtype=None), ("logp", "entropy"))
    x = (h @ w.T).to(device)
    assert torch.equal(sk.logprobs_from_logits(x, t.to(device), backend=backend, top_k=top_k).logp,
                       sk.logprobs_from_logits(x, t.to(device), backend=backend).logp)


@pytest.mark.parametrize("temperature", [1e-45, 1e-39, 1e-300])
def test_subnormal_temperature_refused_by_name(temperature):
    """A temperature below float32's smallest normal number (2**-126) is refused, naming it and the bound: the ops
    compute logits / temperature in float32, where it is rounded and its inverse is inf (1e-45 gave NaN where float64
    is finite)."""
    h, w, b, t = _linear_case("none")
    for call in (lambda: sk.linear_logprobs(h, w, t, temperature=temperature),
                 lambda: sk.logprobs_from_logits(h @ w.T, t, temperature=temperature)):
        with pytest.raises(ValueError, match=r"temperature must be >= 1\.1754944e-38") as info:
            call()
        assert repr(temperature) in str(info.value)


def test_smallest_normal_temperature_matches_float64(dev_backend):
    """Just above the bound, logits small enough not to overflow float32 (|x| / T < 3.4e38) give float64's answer."""
    device, backend = dev_backend
    g = torch.Generator().manual_seed(5)
    x = torch.randn(3, V, generator=g) * 0.1
    t = torch.tensor([0, 1, 2])
    tau = 2.0**-126 * 4
    logp, ent = sk.logprobs_from_logits(x.to(device), t.to(device), backend=backend, temperature=tau)
    want = ref.logprobs_from_logits(x.double(), t, temperature=tau, out_dtype=None)
    torch.testing.assert_close(logp.cpu().double(), want[0], rtol=1e-5, atol=0)
    torch.testing.assert_close(ent.cpu().double(), want[1], rtol=0, atol=1e-6)
