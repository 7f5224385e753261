"""Defects an adversarial review of the ops' public API found (2026-11-30), each a test that failed before its fix."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from conftest import assert_refused

import sgrpo_kernels as sk

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
def test_triton_reads_no_weight_row_for_an_ignored_target_outside_the_vocabulary():
    """An ignore_index >= 0 outside [0, V) (10**9) made the Triton forward load W[10**9] for the ignored row: the
    interpreter segfaulted (exit 139); on CUDA an out-of-bounds read. In a child process, so that a regression fails
    this test instead of killing the suite."""
    code = textwrap.dedent("""
        import torch, sgrpo_kernels as sk
        torch.manual_seed(0)
        h, w = torch.randn(4, 3, requires_grad=True), torch.randn(7, 3, requires_grad=True)
        t = torch.tensor([1, 10**9, 3, 4])
        got = sk.linear_logprobs(h, w, t, ignore_index=10**9, backend="triton")
        want = sk.linear_logprobs(h, w, t, ignore_index=10**9, backend="torch")
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
        g1 = torch.autograd.grad(got.logp.sum() + got.entropy.sum(), [h, w])
        g2 = torch.autograd.grad(want.logp.sum() + want.entropy.sum(), [h, w])
        for a, b in zip(g1, g2):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
        print("ok", got.logp[1].item())
    """)
    env = {**os.environ, "TRITON_INTERPRET": "1", "SGRPO_TRITON_AUTOTUNE": "0",
           "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}  # fmt: skip
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and res.stdout.strip() == "ok 0.0", (res.returncode, res.stdout, res.stderr[-2000:])


def test_logit_scale_over_temperature_below_float32s_smallest_normal_is_refused():
    """temperature / logit_scale was passed on unchecked: 1e-39 gave NaN rows on Triton, finite ones on torch (the same
    value as `temperature=` alone is refused)."""
    h, w, t = torch.randn(4, 3), torch.randn(7, 3), torch.tensor([0, 1, 2, 3])
    assert_refused(lambda: sk.linear_logprobs(h, w, t, logit_scale=1e39), ValueError,
                   ["temperature / logit_scale = 1.0 / 1e+39", "must be >= 1.1754944e-38"])  # fmt: skip
    sk.linear_logprobs(h, w, t, logit_scale=1e30)  # 1e-30: still a normal float32


def test_a_softcap_beyond_float32_is_refused():
    """softcap = 1e39 multiplied by inf in float32: NaN logits (the cap is the identity there)."""
    h, w, t = torch.randn(4, 3), torch.randn(7, 3), torch.tensor([0, 1, 2, 3])
    assert_refused(lambda: sk.linear_logprobs(h, w, t, softcap=1e39), ValueError,
                   ["softcap must be <= 3.4028235e+38", "1e+39"])  # fmt: skip


@pytest.mark.parametrize("op", ["linear", "logits"])
def test_a_per_row_sampler_tensor_that_requires_grad_is_a_constant(op):
    """A top_p tensor with requires_grad failed in backward (no autograd formula for the threshold op), or with a
    misleading 'saved no statistics' when no model input required grad."""
    torch.manual_seed(0)
    h, w, t = torch.randn(4, 3, requires_grad=True), torch.randn(7, 3), torch.tensor([0, 1, 2, 3])
    top_p = torch.full((4,), 0.7, requires_grad=True)

    def run(p, hidden):
        if op == "linear":
            return sk.linear_logprobs(hidden, w, t, top_p=p)
        return sk.logprobs_from_logits(hidden @ w.T, t, top_p=p)

    got, want = run(top_p, h), run(top_p.detach(), h)
    g_got = torch.autograd.grad(got.logp.sum(), h)[0]
    g_want = torch.autograd.grad(want.logp.sum(), h)[0]
    assert torch.equal(got.logp, want.logp) and torch.equal(g_got, g_want)
    assert top_p.grad is None
    assert not run(top_p, h.detach()).logp.requires_grad  # no model input requires grad: nothing to backward through


def test_inplace_backward_refuses_logits_whose_elements_overlap():
    """Logits from .expand() (stride 0) were accepted; backward then failed deep in the backend naming nothing."""
    hid = torch.randn(1, 3, requires_grad=True)
    logits = (hid @ torch.randn(7, 3).T).expand(4, 7)
    assert_refused(lambda: sk.logprobs_from_logits(logits, torch.tensor([0, 1, 2, 3]), inplace_backward=True),
                   ValueError, ["inplace_backward=True", "stride (0, 1)", "overlapping", "inplace_backward=False"])
    out = sk.logprobs_from_logits(logits, torch.tensor([0, 1, 2, 3]))  # without it: fine
    out.logp.sum().backward()
    assert hid.grad is not None and torch.isfinite(hid.grad).all()


@pytest.mark.parametrize("op", ["linear", "logits"])
def test_a_python_int_top_k_of_at_least_v_runs_the_full_op(op, monkeypatch):
    """docs/ops.md: top_k >= V cuts nothing and runs exactly the full op. It went through the support search (an
    extra pass) and was refused under process_group, where top_p = 1.0 ran."""
    import sgrpo_kernels.ops as ops

    def no_search(*args, **kwargs):
        raise AssertionError("the support search ran for a top_k that cuts nothing")

    monkeypatch.setattr(ops, "linear_threshold", no_search)
    monkeypatch.setattr(ops, "logits_threshold", no_search)
    torch.manual_seed(0)
    h, w, t = torch.randn(4, 3), torch.randn(7, 3), torch.tensor([0, 1, 2, 3])
    for k in (7, 8, 2**70):
        if op == "linear":
            got, want = sk.linear_logprobs(h, w, t, top_k=k), sk.linear_logprobs(h, w, t)
        else:
            got, want = sk.logprobs_from_logits(h @ w.T, t, top_k=k), sk.logprobs_from_logits(h @ w.T, t)
        assert all(torch.equal(a, b) for a, b in zip(got, want))
    with pytest.raises(AssertionError, match="support search ran"):  # top_k = V - 1 cuts: it searches
        sk.linear_logprobs(h, w, t, top_k=6) if op == "linear" else sk.logprobs_from_logits(h @ w.T, t, top_k=6)


def test_under_process_group_a_top_k_that_cuts_nothing_passes_and_one_that_cuts_is_refused():
    """The sharded call checks the settings against the global vocabulary (known after shard_range)."""
    from sgrpo_kernels.truncation import Sampling

    lead, dev = torch.Size([4]), torch.device("cpu")
    for k in (7, 2**70):
        Sampling.from_args(k, None, None, lead, dev).refuse_if_unsupported("op", "torch", True, vocab=7)
    for sampling in (Sampling.from_args(6, None, None, lead, dev), Sampling.from_args(7, 0.9, None, lead, dev),
                     Sampling.from_args(torch.full((4,), 7), None, None, lead, dev)):  # fmt: skip
        assert_refused(lambda s=sampling: s.refuse_if_unsupported("op", "torch", True, vocab=7), ValueError,
                       ["op:", "not supported with process_group"])  # fmt: skip


def test_numpy_scalars_are_taken_as_the_numbers_they_are():
    """numpy float32 2.0 was refused as 'logit_scale must be a finite number > 0'; float32 temperatures and top_p, and
    an int64 ignore_index, were TypeErrors, while np.float64 and an int64 top_k were accepted."""
    np = pytest.importorskip("numpy")
    torch.manual_seed(0)
    h, w, t = torch.randn(4, 3), torch.randn(7, 3), torch.tensor([0, 1, 2, 3])
    for name, value, plain in (("logit_scale", np.float32(2.0), 2.0), ("softcap", np.float32(30.0), 30.0),
                               ("temperature", np.float32(0.5), 0.5), ("ignore_index", np.int64(2), 2),
                               ("top_p", np.float32(0.5), 0.5)):  # fmt: skip
        got, want = sk.linear_logprobs(h, w, t, **{name: value}), sk.linear_logprobs(h, w, t, **{name: plain})
        assert all(torch.equal(a, b) for a, b in zip(got, want)), name
    assert_refused(lambda: sk.linear_logprobs(h, w, t, temperature=np.bool_(True)), TypeError, "temperature")


# ------------------------------------------------------------------------- second review (2026-11-30): four defects


def _inplace_loss(h, w, t):
    out = sk.logprobs_from_logits(h @ w.T, t, inplace_backward=True, temperature=0.7)
    return (out.logp + 0.5 * out.entropy).sum()


def test_inplace_backward_compiles_fullgraph_to_the_eager_gradient():
    """The overlap check called torch._debug_has_internal_overlap, which Dynamo cannot trace: fullgraph compile failed
    ('Unsupported torch.* op returned non-Tensor'). inductor too (checked by hand; aot_eager here: seconds)."""
    torch.manual_seed(0)
    w, t = torch.randn(300, 4), torch.randint(0, 300, (6,))
    h = torch.randn(6, 4, requires_grad=True)
    torch._dynamo.reset()
    compiled = torch.compile(_inplace_loss, fullgraph=True, backend="aot_eager")
    got = torch.autograd.grad(compiled(h, w, t), h)[0]
    want = torch.autograd.grad(_inplace_loss(h, w, t), h)[0]
    assert torch.equal(got, want)


def test_inplace_backward_refuses_an_as_strided_view_whose_elements_overlap():
    """Strides (1, 1) put row r's element j on row r + 1's element j - 1: the old check called that 'too hard' and let
    it through, and the in-place gradient overwrote itself. An expand() (stride 0) is still refused in eager."""
    hid = torch.randn(1, 3, requires_grad=True)
    flat = (hid @ torch.randn(12, 3).T).reshape(-1)
    t = torch.tensor([0, 1, 2, 3])
    words = ["inplace_backward=True", "stride (1, 1)", "overlapping", "inplace_backward=False"]
    overlapping = flat.as_strided((4, 5), (1, 1))
    assert_refused(lambda: sk.logprobs_from_logits(overlapping, t, inplace_backward=True), ValueError, words)
    assert_refused(lambda: sk.logprobs_from_logits(flat[:5].expand(4, 5), t, inplace_backward=True),
                   ValueError, ["stride (0, 1)", "overlapping"])  # fmt: skip
    sk.logprobs_from_logits(flat.as_strided((4, 3), (3, 1)), t[:4] % 3, inplace_backward=True)  # distinct: runs


@pytest.mark.parametrize("temperature", [1e-36, 2.0**-126])
def test_the_torch_backend_gradient_stays_finite_at_the_smallest_temperatures(temperature):
    """1/T was folded into the row factors: log p's floor (-1e4) times 1e36 overflowed to inf and p = 0 times inf gave
    NaN for the tokens of probability 0 (float64 and triton: finite)."""
    x0 = torch.tensor([[0.0, -1.0, -2.0], [0.5, 0.0, -3.0]])
    t = torch.tensor([0, 1])
    x = x0.clone().requires_grad_()
    out = sk.logprobs_from_logits(x, t, temperature=temperature, backend="torch")
    (out.logp + out.entropy).sum().backward()
    x64 = x0.double().requires_grad_()
    logp = torch.log_softmax(x64 / temperature, -1)
    p = logp.exp()
    (logp[[0, 1], [0, 1]] - (p * torch.where(p > 0, logp, 0)).sum(-1)).sum().backward()
    assert torch.isfinite(x.grad).all(), x.grad
    torch.testing.assert_close(x.grad, x64.grad.float(), rtol=1e-5, atol=0.0)
    h = torch.tensor([[1.0, 0.0], [0.0, 1.0]], requires_grad=True)
    w = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, -1.0]], requires_grad=True)
    out = sk.linear_logprobs(h, w, t, temperature=temperature, backend="torch")
    (out.logp + out.entropy).sum().backward()
    assert torch.isfinite(h.grad).all() and torch.isfinite(w.grad).all(), (h.grad, w.grad)


def test_forward_mode_ad_and_torch_func_gradients_are_refused_and_vmap_still_runs():
    """torch.func.jvp of linear_logprobs gave zeros (float64: nonzero) and torch.func.grad failed naming an
    autograd.Function; both are refused naming the argument. vmap of the forward is unchanged."""
    import torch.autograd.forward_ad as fwad

    torch.manual_seed(0)
    h, w, t, v = torch.randn(3, 4), torch.randn(40, 4), torch.randint(0, 40, (3,)), torch.randn(3, 4)
    words = ["torch.func transforms other than vmap", "forward_ad", "unsupported"]
    calls = {
        "jvp": lambda: torch.func.jvp(lambda a: sk.linear_logprobs(a, w, t).logp, (h,), (v,)),
        "grad": lambda: torch.func.grad(lambda b: sk.linear_logprobs(h, b, t).logp.sum())(w),
        "jacrev": lambda: torch.func.jacrev(lambda x: sk.logprobs_from_logits(x, t).logp)(h @ w.T),
    }
    for what, call in calls.items():
        name = {"jvp": "hidden", "grad": "weight", "jacrev": "logits"}[what]
        assert_refused(call, TypeError, [f"{name} carries", *words])
    with fwad.dual_level():
        assert_refused(lambda: sk.logprobs_from_logits(fwad.make_dual(h @ w.T, v @ w.T), t), TypeError,
                       ["logits carries", *words])  # fmt: skip
    batched = torch.func.vmap(lambda a, b: sk.linear_logprobs(a, w, b).logp)(torch.stack([h, -h]), t.expand(2, 3))
    assert torch.equal(batched[0], sk.linear_logprobs(h, w, t).logp)
    assert torch.equal(batched[1], sk.linear_logprobs(-h, w, t).logp)
