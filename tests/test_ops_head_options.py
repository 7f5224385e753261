"""Head options of real models in `linear_logprobs` / `sgrpo_loss`: `logit_scale` (Cohere, Granite) and `softcap`
(Gemma 2/3's final_logit_softcapping), in the model's order (scale, softcap, temperature), forward and every gradient
against float64 autograd on the full logits (torch in float64, triton's fp32 kernels through the interpreter); the npu
backend, which does not apply a softcap yet, refuses it by name."""

from __future__ import annotations

import pytest
import torch

import sgrpo_kernels as sk
from sgrpo_kernels import rl
from sgrpo_kernels.backends import HeadOptions, available_backends

IGNORE = -100


def reference(h, w, b, t, temperature, scale, softcap):
    logits = h @ w.T + (b if b is not None else 0)
    logits = scale * logits
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    z = logits / temperature
    logp_all = torch.log_softmax(z, -1)
    valid = t != IGNORE
    logp = torch.where(valid, logp_all.gather(1, t.clamp(min=0)[:, None])[:, 0], torch.zeros(()))
    ent = torch.where(valid, -(logp_all.exp() * logp_all).sum(-1), torch.zeros(()))
    return logp, ent


def inputs(n=9, d=6, v=37, bias=True, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    h = (torch.randn(n, d, generator=g, dtype=dtype) * 2).requires_grad_()
    w = (torch.randn(v, d, generator=g, dtype=dtype) * 2).requires_grad_()  # logits ~ +-20: the cap matters
    b = torch.randn(v, generator=g, dtype=dtype).requires_grad_() if bias else None
    t = torch.randint(0, v, (n,), generator=g)
    t[2] = IGNORE
    g1, g2 = torch.randn(n, generator=g, dtype=dtype), torch.randn(n, generator=g, dtype=dtype)
    g1[0] = g2[0] = 0.0  # a zero-gradient row
    return h, w, b, t, g1, g2


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize(("temperature", "scale", "softcap"), [(1.0, 1.0, 30.0), (0.7, 0.0625, 5.0), (1.3, 2.5, 3.0),
                                                               (0.7, 0.25, None), (1.0, 3.0, None)])  # fmt: skip
def test_head_options_against_float64(bias, temperature, scale, softcap):
    h, w, b, t, g1, g2 = inputs(bias=bias)
    params = [h, w] + ([b] if bias else [])
    ref = reference(h, w, b, t, temperature, scale, softcap)
    ref_grads = torch.autograd.grad((ref[0] * g1).sum() + (ref[1] * g2).sum(), params)
    out = sk.linear_logprobs(h, w, t, bias=b, temperature=temperature, logit_scale=scale, softcap=softcap,
                             backend="torch")  # fmt: skip
    grads = torch.autograd.grad((out[0] * g1).sum() + (out[1] * g2).sum(), params)
    torch.testing.assert_close(out[0], ref[0], rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(out[1], ref[1], rtol=1e-10, atol=1e-12)
    for name, got, want in zip(("hidden", "weight", "bias"), grads, ref_grads):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-11, msg=name)


def test_softcap_changes_the_result():
    """The cap is not a no-op at these logits (so the comparison above tests it)."""
    h, w, b, t, *_ = inputs()
    capped = sk.linear_logprobs(h, w, t, bias=b, softcap=3.0, backend="torch")[0]
    plain = sk.linear_logprobs(h, w, t, bias=b, backend="torch")[0]
    assert (capped - plain).abs().max() > 0.1


def test_fp32_with_small_tiles_matches_float64():
    h, w, b, t, g1, g2 = inputs(n=33, v=301)
    ref = reference(h, w, b, t, 0.9, 0.5, 4.0)
    h32, w32, b32 = (x.detach().float().requires_grad_() for x in (h, w, b))
    out = sk.linear_logprobs(h32, w32, t, bias=b32, temperature=0.9, logit_scale=0.5, softcap=4.0, backend="torch",
                             memory_budget=4096)  # fmt: skip
    torch.testing.assert_close(out[0].double(), ref[0], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(out[1].double(), ref[1], rtol=1e-4, atol=1e-4)
    (gh,) = torch.autograd.grad((out[0] * g1.float()).sum() + (out[1] * g2.float()).sum(), [h32])
    (rh,) = torch.autograd.grad((ref[0] * g1).sum() + (ref[1] * g2).sum(), [h])
    torch.testing.assert_close(gh.double(), rh, rtol=1e-3, atol=1e-4)


def test_sgrpo_loss_passes_the_head_options():
    h, w, b, *_ = inputs(n=8)
    hidden = h.detach().view(2, 4, -1).requires_grad_()
    targets = torch.randint(0, w.shape[0], (2, 4))
    mask = torch.ones(2, 4, dtype=torch.bool)
    cfg = rl.preset("grpo_ef")  # uses the entropies too
    adv = torch.tensor([1.0, -1.0], dtype=torch.float64)
    loss, _ = sk.sgrpo_loss(hidden, w, targets, adv, mask, cfg, bias=b, logit_scale=0.5, softcap=4.0, backend="torch")
    logp, ent = reference(hidden.reshape(8, -1), w, b, targets.reshape(-1), 1.0, 0.5, 4.0)
    want, _ = rl.policy_loss(logp.view(2, 4), adv, mask, cfg, entropy=ent.view(2, 4))
    torch.testing.assert_close(loss, want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("value", [0.0, -1.0, float("nan"), float("inf"), True, "2"])
def test_bad_head_options_are_refused(value):
    h, w, b, t, *_ = inputs()
    with pytest.raises(ValueError, match="softcap must be a finite number > 0 or None"):
        sk.linear_logprobs(h, w, t, softcap=value)
    with pytest.raises(ValueError, match="logit_scale must be a finite number > 0"):
        sk.linear_logprobs(h, w, t, logit_scale=value)


TRITON = [b for b, s in available_backends().items() if b == "triton" and s == "available"]


@pytest.mark.parametrize("backend", TRITON)
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize(
    ("temperature", "scale", "softcap", "budget"),
    [(1.0, 1.0, 30.0, 0), (0.7, 0.0625, 5.0, 0), (1.3, 2.5, 3.0, 512), (0.9, 1.0, 0.05, 0)],
)
def test_triton_softcap_against_float64(backend, bias, temperature, scale, softcap, budget):
    """fp32 kernels (their own tanh and its slope) against float64 autograd: values, and the gradients of hidden,
    weight and bias through log p and H; an ignored row, a zero-gradient row; budget 512 B forces several vocab chunks
    in the backward; softcap 0.05 saturates every logit (the slope's 4e / (1 + e)^2 branch)."""
    h, w, b, t, g1, g2 = inputs(bias=bias)
    params = [h, w] + ([b] if bias else [])
    ref = reference(h, w, b, t, temperature, scale, softcap)
    ref_grads = torch.autograd.grad((ref[0] * g1).sum() + (ref[1] * g2).sum(), params)
    p32 = [x.detach().float().requires_grad_() for x in params]
    out = sk.linear_logprobs(p32[0], p32[1], t, bias=p32[2] if bias else None, temperature=temperature,
                             logit_scale=scale, softcap=softcap, backend=backend, memory_budget=budget)  # fmt: skip
    grads = torch.autograd.grad((out[0] * g1.float()).sum() + (out[1] * g2.float()).sum(), p32)
    torch.testing.assert_close(out[0].double(), ref[0], rtol=1e-5, atol=2e-5)
    torch.testing.assert_close(out[1].double(), ref[1], rtol=1e-5, atol=2e-5)
    for name, got, want in zip(("hidden", "weight", "bias"), grads, ref_grads):
        scale_ = want.abs().max()
        torch.testing.assert_close(got.double() / scale_, want / scale_, rtol=0, atol=3e-5, msg=name)
    assert out[0][2] == 0 and out[1][2] == 0  # the ignored row


@pytest.mark.parametrize("backend", TRITON)
def test_triton_softcap_tanh_near_zero_and_saturated(backend):
    """The kernels' tanh on both branches (|y| < 0.1: series; else the exp form) and the far tails: a one-column
    hidden state sweeps the capped logits over y = -40 .. 40, compared with float64 torch.tanh (forward) and the
    float64 gradient of the log-probability of column 0."""
    y = torch.cat([torch.linspace(-40, 40, 41), torch.linspace(-0.2, 0.2, 41)]).double()
    h = y[:, None].clone().requires_grad_()
    w = torch.tensor([[1.0], [0.0]], dtype=torch.float64)  # logits (y, 0): log p_0 = log sigmoid(z(y))
    t = torch.zeros(len(y), dtype=torch.long)
    ref = reference(h, w, None, t, 1.0, 1.0, 2.0)[0]
    (rg,) = torch.autograd.grad(ref.sum(), [h])
    h32 = h.detach().float().requires_grad_()
    out = sk.linear_logprobs(h32, w.float(), t, softcap=2.0, backend=backend, return_entropy=False)[0]
    (g,) = torch.autograd.grad(out.sum(), [h32])
    torch.testing.assert_close(out.double(), ref, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(g.double(), rg, rtol=1e-5, atol=1e-9)  # saturated: slopes ~1e-34, relative accuracy


@pytest.mark.parametrize("backend", TRITON)
def test_a_logit_scale_alone_is_folded_into_the_temperature(backend):
    h, w, b, t, *_ = inputs(dtype=torch.float32)
    out = sk.linear_logprobs(h, w, t, logit_scale=0.5, temperature=0.7, backend=backend)[0]
    torch.testing.assert_close(out, sk.linear_logprobs(h, w, t, temperature=1.4, backend="torch")[0])


def test_head_slope_is_the_derivative_of_the_head():
    """HeadOptions.head_slope (the vocab-parallel backward's correction at column 0) against autograd, saturated
    logits included; only a softcap makes the head nonlinear."""
    x = torch.linspace(-60, 60, 121, dtype=torch.float64, requires_grad=True)
    opts = HeadOptions(temperature=0.7, logit_scale=0.5, softcap=4.0)
    (want,) = torch.autograd.grad((opts.softcap * torch.tanh(opts.logit_scale * x / opts.softcap)).sum(), [x])
    torch.testing.assert_close(opts.head_slope(x.detach()), want, rtol=1e-9, atol=1e-15)
    assert opts.nonlinear_head and not HeadOptions(logit_scale=0.5).nonlinear_head


@pytest.mark.parametrize("softcap", [None, 4.0])
def test_the_backend_sees_the_scale_folded_only_without_a_softcap(monkeypatch, softcap):
    from sgrpo_kernels.backends import torch_chunked

    seen = []
    real = torch_chunked.linear_logprobs_fwd
    monkeypatch.setattr(torch_chunked, "linear_logprobs_fwd", lambda *a: seen.append(a[-1]) or real(*a))
    h, w, b, t, *_ = inputs()
    sk.linear_logprobs(h, w, t, temperature=0.7, logit_scale=0.25, softcap=softcap, backend="torch")
    folded = (0.7 / 0.25, 1.0, 0.0) if softcap is None else (0.7, 0.25, softcap)
    assert (seen[0].temperature, seen[0].logit_scale, seen[0].softcap) == folded


def test_npu_backend_refuses_softcap_before_any_kernel():
    """The npu module is importable without an NPU; its entry points refuse a softcap before touching the device."""
    from sgrpo_kernels.backends import npu_backend
    from sgrpo_kernels.backends.contract import Options

    h, w, b, t, *_ = inputs(dtype=torch.float32)
    opts = Options(softcap=5.0)
    with pytest.raises(NotImplementedError, match="the npu backend does not apply a logit softcap"):
        npu_backend.linear_logprobs_fwd(h.detach(), w.detach(), t, None, opts)
    with pytest.raises(NotImplementedError, match="the npu backend does not apply a logit softcap"):
        npu_backend.linear_logprobs_bwd(torch.ones(len(t)), None, h.detach(), w.detach(), t, None,
                                        torch.zeros(2, len(t)), None, opts)  # fmt: skip
