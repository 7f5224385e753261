"""Accuracy at extreme logits (large |z|: big logits, low temperatures) and with ties at the top, on every backend that
can run here: torch, triton (under TRITON_INTERPRET=1, and on CUDA when there is a GPU) and npu (its orchestration with
the AscendC kernels run by the CPU emulation, csrc/emu).

logp = z_y - lse with lse = m + log s loses log s once ulp(m) is comparable to it (ulp(1e8) = 8 in fp32): two tied top
logits at 1e8 gave logp = 0 instead of -log 2, and the backward's p = exp(z - lse) gave p = 1 to both. The ops keep
m and log s apart (the contract's `stats`, backends/contract.py) and form every log-probability as (z - m) - log s.

The rule (docs/design.md, "Accuracy"): against float64 (reference.py on the float64 copy of the inputs), the error is
never worse than twice the error of the same-dtype naive computation (reference.py on the inputs as they are) plus a
few fp32 ulps. The random cases use power-of-two temperatures and exactly representable logit products, so every
implementation sees the same z = logits / temperature and the comparison measures the softmax numerics alone (a
decimal temperature rounds z once more, differently in a multiplying kernel and a dividing reference); decimal
temperatures are covered by the reproductions and the tie cases, whose tied logits round alike.
"""

from __future__ import annotations

import math
import os
import shutil

import pytest
import torch
from emu_loader import emu_module

import sgrpo_kernels as sk
from sgrpo_kernels import backends
from sgrpo_kernels import reference as ref
from sgrpo_kernels.backends import Options
from sgrpo_kernels.backends import npu_backend as npu

IGNORE = -100
EPS32 = torch.finfo(torch.float32).eps
SLACK = 16 * EPS32  # the "few ulps" of the rule, relative to the magnitude of the exact value

_INTERP = os.environ.get("TRITON_INTERPRET") == "1"
_TRITON = backends.available_backends().get("triton") == "available"
_CUDA = torch.cuda.is_available() and not _INTERP
BACKENDS = [  # (device, backend)
    pytest.param(("cpu", "torch"), id="torch"),
    pytest.param(("cpu", "triton"), id="triton", marks=pytest.mark.skipif(
        not (_INTERP and _TRITON), reason="triton runs on CPU tensors only under TRITON_INTERPRET=1")),
    pytest.param(("cpu", "npu"), id="npu-emu", marks=pytest.mark.skipif(
        shutil.which("g++") is None, reason="g++ not found")),
    pytest.param(("cuda", "torch"), id="cuda-torch", marks=[pytest.mark.gpu, pytest.mark.skipif(
        not _CUDA, reason="needs a CUDA device")]),
    pytest.param(("cuda", "triton"), id="cuda-triton", marks=[pytest.mark.gpu, pytest.mark.skipif(
        not (_CUDA and _TRITON), reason="needs a CUDA device and triton")]),
]
POW2_TEMPERATURES = [1.0, 2.0**-7, 2.0**-13]  # 1 .. 1.2e-4, exact scalings


# ------------------------------------------------------------------------------------------------ runners


def _on(device, *tensors):
    return [x.to(device) if x is not None else None for x in tensors]


class Runner:
    """One backend's forward and backward: the public ops for torch / triton, the npu backend's entry points with the
    emulated kernels for npu (no NPU device here, so the registry cannot resolve it). Takes and returns CPU tensors."""

    def __init__(self, name: str, kernels=None, memory_budget: int | None = None, device: str = "cpu"):
        self.name, self.kernels, self.memory_budget, self.device = name, kernels, memory_budget, device

    def logits(self, x, t, gl, ge, tau, **sampling):
        """-> logp, entropy, d(sum gl logp + ge H)/dx. `sampling`: top_k / top_p / min_p (not on npu)."""
        x, t, gl, ge = _on(self.device, x, t, gl, ge)
        if self.name == "npu":
            opts = Options(temperature=tau)
            with npu.use_kernels(self.kernels):
                logp, ent, stats = npu.logprobs_from_logits_fwd(x, t, opts)
                grad = npu.logprobs_from_logits_bwd(gl, ge, x.clone(), t, stats, ent, opts)
            return logp, ent, grad
        leaf = x.clone().requires_grad_(True)
        logp, ent = sk.logprobs_from_logits(leaf, t, temperature=tau, backend=self.name,
                                            memory_budget=self.memory_budget, **sampling)
        (grad,) = torch.autograd.grad((logp * gl).sum() + (ent * ge).sum(), [leaf])
        return _on("cpu", logp.detach(), ent.detach(), grad)

    def linear(self, h, w, b, t, gl, ge, tau):
        """-> logp, entropy, [grad_hidden, grad_weight, grad_bias]."""
        h, w, b, t, gl, ge = _on(self.device, h, w, b, t, gl, ge)
        if self.name == "npu":
            opts = Options(temperature=tau, memory_budget=self.memory_budget or 0)
            with npu.use_kernels(self.kernels):
                logp, ent, stats = npu.linear_logprobs_fwd(h, w, t, b, opts)
                grads = npu.linear_logprobs_bwd(gl, ge, h, w, t, b, stats, ent, opts)
            return logp, ent, list(grads)
        leaves = [x.clone().requires_grad_(True) for x in (h, w, b)]
        logp, ent = sk.linear_logprobs(leaves[0], leaves[1], t, bias=leaves[2], temperature=tau, backend=self.name,
                                       memory_budget=self.memory_budget)
        grads = torch.autograd.grad((logp * gl).sum() + (ent * ge).sum(), leaves)
        logp, ent = _on("cpu", logp.detach(), ent.detach())
        return logp, ent, _on("cpu", *grads)


@pytest.fixture(scope="module")
def emu_kernels():
    emu = emu_module()
    return emu.EmuKernels(emu.load(emu.build()), cores=5, ub_budget=48 * 1024, max_tile=512)  # many tiles and tails


@pytest.fixture(params=BACKENDS)
def runner(request) -> Runner:
    device, name = request.param
    if name == "npu":
        return Runner("npu", request.getfixturevalue("emu_kernels"), memory_budget=3000)  # several vocab chunks
    return Runner(name, memory_budget=4096 if name == "torch" else None, device=device)  # torch: many tiles


def reference_logits(x, t, gl, ge, tau, dtype, **sampling):
    """reference.py in `dtype` (float64: the exact answer; x.dtype: the naive computation): logp, entropy, grad."""
    leaf = x.to(dtype).requires_grad_(True)
    logp, ent = ref.logprobs_from_logits(leaf, t, temperature=tau, out_dtype=None, **sampling)
    (grad,) = torch.autograd.grad((logp * gl.to(dtype)).sum() + (ent * ge.to(dtype)).sum(), [leaf])
    return logp.detach(), ent.detach(), grad


def reference_linear(h, w, b, t, gl, ge, tau, dtype):
    leaves = [x.to(dtype).requires_grad_(True) for x in (h, w, b)]
    logp, ent = ref.linear_logprobs(leaves[0], leaves[1], t, bias=leaves[2], temperature=tau, out_dtype=None)
    grads = torch.autograd.grad((logp * gl.to(dtype)).sum() + (ent * ge.to(dtype)).sum(), leaves)
    return logp.detach(), ent.detach(), list(grads)


# ------------------------------------------------------------------------------------------------ the rule


def assert_no_worse(what: str, ours, naive, exact, rows: bool = False, whole: bool = False) -> None:
    """|ours - exact| <= 2 |naive - exact| + SLACK (1 + |exact|): elementwise; per row of a 2-D tensor (max over the
    row) with rows=True; over the whole tensor (max) with whole=True (sums over many terms: grad_hidden, grad_W)."""
    assert torch.isfinite(ours).all(), f"{what}: non-finite values"
    err, err_n, mag = (ours.double() - exact).abs(), (naive.double() - exact).abs(), exact.abs()
    if rows:
        err, err_n, mag = err.amax(-1), err_n.amax(-1), mag.amax(-1)
    elif whole:
        err, err_n, mag = err.max(), err_n.max(), mag.max()
    bound = 2 * err_n + SLACK * (1 + mag)
    bad = ~(err <= bound)
    if bad.any():
        i = int(torch.argmax((err - bound).flatten()))
        pytest.fail(f"{what}: {int(bad.sum())} of {bad.numel()} exceed the bound; worst: error {err.flatten()[i]:.3g}, "
                    f"naive error {err_n.flatten()[i]:.3g}, |exact| {mag.flatten()[i]:.3g}")


def check_logits(runner: Runner, x, t, gl, ge, tau, **sampling):
    logp, ent, grad = runner.logits(x, t, gl, ge, tau, **sampling)
    exact = reference_logits(x, t, gl, ge, tau, torch.float64, **sampling)
    naive = reference_logits(x, t, gl, ge, tau, x.dtype, **sampling)
    for what, o, n, e in zip(("logp", "entropy"), (logp, ent), naive[:2], exact[:2]):
        assert_no_worse(what, o, n, e)
        assert (o[t == IGNORE] == 0).all(), f"{what}: ignored rows must give 0"
    assert (logp <= 0).all() and (ent >= 0).all()
    assert_no_worse("grad_logits", grad, naive[2], exact[2], rows=True)
    assert (grad[t == IGNORE] == 0).all()


def check_linear(runner: Runner, h, w, b, t, gl, ge, tau):
    logp, ent, grads = runner.linear(h, w, b, t, gl, ge, tau)
    exact = reference_linear(h, w, b, t, gl, ge, tau, torch.float64)
    naive = reference_linear(h, w, b, t, gl, ge, tau, h.dtype)
    assert_no_worse("logp", logp, naive[0], exact[0])
    assert_no_worse("entropy", ent, naive[1], exact[1])
    assert (logp <= 0).all() and (ent >= 0).all()
    for what, o, n, e in zip(("grad_hidden", "grad_weight", "grad_bias"), grads, naive[2], exact[2]):
        assert_no_worse(what, o, n, e, whole=True)


# ------------------------------------------------------------------------------------------------ the cases


@pytest.mark.parametrize("top", [1e8, -1e8, 3e30])
def test_tied_top_logits_reproduction(runner, top):
    """Issue 11: logits [1e8, 1e8, 0] (and [-1e8, -1e8, -2e8], [3e30, 3e30, 0], where m + log s rounds away log 2 too):
    logp and entropy are -log 2 and log 2, and the gradient is that of two tokens at p = 1/2."""
    x = torch.tensor([[top, top, top - abs(top)], [top, top, top - abs(top) * 1e-3]])
    t = torch.tensor([0, 1])
    gl, ge = torch.tensor([1.0, -0.5]), torch.tensor([0.25, 2.0])
    logp, ent, grad = runner.logits(x, t, gl, ge, 1.0)
    exact = reference_logits(x, t, gl, ge, 1.0, torch.float64)
    assert exact[0][0].item() == pytest.approx(-math.log(2), abs=1e-12)  # the reference is right in the first place
    torch.testing.assert_close(logp.double(), exact[0], atol=1e-6, rtol=0)
    torch.testing.assert_close(ent.double(), exact[1], atol=1e-6, rtol=0)
    torch.testing.assert_close(grad.double(), exact[2], atol=1e-6, rtol=0)
    # row 0: d logp / dz = 1[j = y] - p = [1/2, -1/2, 0]; d H / dz = -p (log p + H) = 0
    torch.testing.assert_close(grad[0].double(), torch.tensor([0.5, -0.5, 0.0], dtype=torch.float64), atol=1e-6,
                               rtol=0)


@pytest.mark.parametrize("tau", [1e-7, 1e-2])
def test_linear_reproduction(runner, tau):
    """Issue 11: h = [2], W = [[10], [10], [1]] at temperature 1e-7 (z = [2e8, 2e8, 2e7]): logp = -log 2, entropy log 2,
    grad_W = (1[j = y] - p) h / tau = [1e7, -1e7, 0], grad_h = 0."""
    h = torch.tensor([[2.0]])
    w = torch.tensor([[10.0], [10.0], [1.0]])
    b = torch.zeros(3)
    t = torch.tensor([0])
    logp, ent, (gh, gw, gb) = runner.linear(h, w, b, t, torch.ones(1), torch.ones(1), tau)
    exact = reference_linear(h, w, b, t, torch.ones(1), torch.ones(1), tau, torch.float64)
    torch.testing.assert_close(logp.double(), exact[0], atol=1e-6, rtol=0)
    torch.testing.assert_close(ent.double(), exact[1], atol=1e-6, rtol=0)
    for got, want in zip((gh, gw, gb), exact[2]):
        torch.testing.assert_close(got.double(), want, atol=1e-6 / tau, rtol=1e-6)
    if tau == 1e-7:
        assert logp.item() == pytest.approx(-math.log(2), abs=1e-6)
        torch.testing.assert_close(gw.double().flatten(), torch.tensor([1e7, -1e7, 0.0], dtype=torch.float64),
                                   atol=1.0, rtol=1e-6)


# ------------------------------------------------------------------------------------------------ random cases


def _logits_case(n, v, scale, *, ties, seed):
    """Random fp32 logits: normal * scale, a third of the rows shifted far negative (m < 0 at large |z|), ties at the
    top when asked (the row max copied to 1-3 other columns); targets: argmax, runner-up, a tied column, random,
    ignore_index; upstream gradients random with some zero rows."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, v, generator=g) * scale
    x[::3] -= 4 * scale
    top = x.argmax(-1)
    if ties:
        for i in range(n):
            cols = torch.randperm(v, generator=g)[: 1 + i % 3]
            x[i, cols] = x[i, top[i]].item()
    order = x.argsort(-1, descending=True)
    t = torch.randint(0, v, (n,), generator=g)
    t[0::5] = order[0::5, 0]
    t[1::5] = order[1::5, 1]
    t[2::5] = order[2::5, 2]
    t[4::7] = IGNORE
    gl, ge = torch.randn(n, generator=g), torch.randn(n, generator=g)
    gl[3::8], ge[3::8] = 0.0, 0.0
    return x, t, gl, ge


@pytest.mark.parametrize("ties", [False, True], ids=["no-ties", "ties"])
@pytest.mark.parametrize("scale", [3.0, 1e4, 1e30])
@pytest.mark.parametrize("tau", POW2_TEMPERATURES)
def test_logits_large_and_tied(runner, tau, scale, ties):
    x, t, gl, ge = _logits_case(20, 300, scale, ties=ties, seed=int(math.log2(tau) * -7 + math.log10(scale)))
    check_logits(runner, x, t, gl, ge, tau)


@pytest.mark.parametrize("sampling", [dict(top_k=3), dict(top_p=0.7), dict(min_p=0.1),
                                      dict(top_k=50, top_p=0.9, min_p=1e-3)], ids=str)
@pytest.mark.parametrize("scale", [3.0, 1e4, 1e30])
@pytest.mark.parametrize("tau", [1.0, 2.0**-13])
def test_logits_large_and_tied_truncated(runner, tau, scale, sampling):
    """The sampler's support (top_k / top_p / min_p, issue 42) at large logits, low temperatures and ties at the top,
    targets inside and outside the support: the same rule against the float64 reference."""
    if runner.name == "npu":
        pytest.skip("the npu backend refuses top_k / top_p / min_p (tests/test_ops_truncated.py)")
    x, t, gl, ge = _logits_case(20, 300, scale, ties=True, seed=int(math.log10(scale)) + 17)
    check_logits(runner, x, t, gl, ge, tau, **sampling)


@pytest.mark.parametrize("tau", [1e-2, 1e-4])
@pytest.mark.parametrize("top", [30.0, 1e8, 1e30])
def test_logits_decimal_temperature_ties(runner, tau, top):
    """Decimal temperatures: a tie of 2-4 columns at the top, the rest far below (p = 0 in fp32), so z's own rounding
    cannot matter (tied logits round alike): logp = -log k on a tied target, and the exact gradient."""
    g = torch.Generator().manual_seed(5)
    n, v = 12, 200
    x = torch.rand(n, v, generator=g) * top * 0.5 - top  # [-top, -top / 2]
    x[::2] += 2 * top  # rows whose top is positive
    t = torch.randint(0, v, (n,), generator=g)
    for i in range(n):
        k = 2 + i % 3
        cols = torch.randperm(v, generator=g)[:k]
        x[i, cols] = x[i].max() + top  # a gap of `top` to the rest
        t[i] = cols[i % k] if i % 4 else t[i]
    gl, ge = torch.randn(n, generator=g), torch.randn(n, generator=g)
    check_logits(runner, x, t, gl, ge, tau)
    logp, _, _ = runner.logits(x, t, gl, ge, tau)
    tied = torch.arange(n) % 4 != 0
    k = 2 + torch.arange(n) % 3
    torch.testing.assert_close(logp[tied].double(), -torch.log(k[tied].double()), atol=1e-6, rtol=0)


def _linear_case(n, d, v, hscale, *, ties, seed):
    """hidden, weight and bias on coarse grids (multiples of 1/8 and 1/4 of at most 6 bits, times a power of two): every
    product and sum over D is exact in fp32 in any order, so all implementations share z exactly. ties: weight rows
    (and bias entries) duplicated in pairs, so every row's top logit is tied."""
    g = torch.Generator().manual_seed(seed)
    h = torch.randint(-32, 33, (n, d), generator=g).float() / 8 * hscale
    w = torch.randint(-8, 9, (v, d), generator=g).float() / 4
    b = torch.randint(-8, 9, (v,), generator=g).float() / 4 * hscale
    if ties:
        w[1::2], b[1::2] = w[0::2], b[0::2]
    z = h @ w.T + b
    order = z.argsort(-1, descending=True)
    t = torch.randint(0, v, (n,), generator=g)
    t[0::4] = order[0::4, 0]
    t[1::4] = order[1::4, 1]
    t[5::6] = IGNORE
    gl, ge = torch.randn(n, generator=g), torch.randn(n, generator=g)
    gl[2::7], ge[2::7] = 0.0, 0.0
    return h, w, b, t, gl, ge


@pytest.mark.parametrize("ties", [False, True], ids=["no-ties", "ties"])
@pytest.mark.parametrize("hscale", [1.0, 2.0**20, 2.0**100], ids=["1", "1e6", "1e30"])
@pytest.mark.parametrize("tau", POW2_TEMPERATURES)
def test_linear_large_and_tied(runner, tau, hscale, ties):
    h, w, b, t, gl, ge = _linear_case(12, 16, 200, hscale, ties=ties, seed=int(math.log2(hscale)) + 3)
    check_linear(runner, h, w, b, t, gl, ge, tau)


@pytest.mark.parametrize("scale", [3.0, 1e30, 1e200])
def test_float64_stays_float64_exact(scale):
    """fp64 inputs on the torch backend: fp64 statistics, within a few fp64 ulps of the reference even at |z| = 1e200
    (where m + log s would lose log s in fp64 too)."""
    g = torch.Generator().manual_seed(9)
    x = torch.randn(16, 100, generator=g, dtype=torch.float64) * scale
    x[:, :2] = x.max(-1, keepdim=True).values  # a tie at the top of every row
    t = torch.randint(0, 100, (16,), generator=g)
    t[::4], t[1::4], t[3] = 0, 1, IGNORE
    gl, ge = torch.randn(16, generator=g, dtype=torch.float64), torch.randn(16, generator=g, dtype=torch.float64)
    logp, ent, grad = Runner("torch").logits(x, t, gl, ge, 0.01)
    exact = reference_logits(x, t, gl, ge, 0.01, torch.float64)
    eps64 = torch.finfo(torch.float64).eps
    for got, want in zip((logp, ent), exact[:2]):
        assert got.dtype == torch.float64
        assert ((got - want).abs() <= 64 * eps64 * (1 + want.abs())).all()
    assert ((grad - exact[2]).abs().amax(-1) <= 64 * eps64 * (1 + exact[2].abs().amax(-1))).all()
