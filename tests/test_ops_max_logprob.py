"""`return_max_logprob`: log p_max = max_j log p_j per row from the forward's own statistics, on every backend that
runs here, for both ops, against float64; 0 on ignored rows; no gradient; refusals by name."""

from __future__ import annotations

import pytest
import torch

import sgrpo_kernels as sk
from sgrpo_kernels.backends import available_backends

BACKENDS = [b for b, s in available_backends().items() if s == "available" and b in ("torch", "triton")]
IGNORE = -100


def _inputs(n=11, d=8, v=53, seed=0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(n, d, generator=g, dtype=torch.float64) * 2
    w = torch.randn(v, d, generator=g, dtype=torch.float64)
    t = torch.randint(0, v, (n,), generator=g)
    t[3] = IGNORE
    return h, w, t


def _want(logits, t, temperature):
    lp = torch.log_softmax(logits / temperature, -1)
    return torch.where(t != IGNORE, lp.max(-1).values, torch.zeros(()))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("temperature", [1.0, 0.6])
@pytest.mark.parametrize("grad", [False, True])
def test_max_logprob_against_float64(backend, temperature, grad):
    h, w, t = _inputs()
    want = _want(h @ w.T, t, temperature)
    dtype = torch.float64 if backend == "torch" else torch.float32  # triton computes in fp32
    tol = dict(rtol=1e-10, atol=1e-12) if dtype == torch.float64 else dict(rtol=1e-5, atol=1e-6)
    hh = h.to(dtype).requires_grad_(grad)
    logp, ent, mx = sk.linear_logprobs(hh, w.to(dtype), t, temperature=temperature, backend=backend,
                                       return_max_logprob=True)  # fmt: skip
    torch.testing.assert_close(mx.double(), want, **tol)
    assert not mx.requires_grad and mx[3] == 0 and not torch.signbit(mx[3])
    assert bool((mx >= logp).all())  # the sampled token is never more probable than the most probable one
    logits = (h @ w.T).to(dtype).requires_grad_(grad)
    out = sk.logprobs_from_logits(logits, t, temperature=temperature, backend=backend, return_max_logprob=True)
    torch.testing.assert_close(out[2].double(), want, **tol)
    if grad:  # the other outputs keep their gradients
        (logp.sum() + ent.sum()).backward()
        assert hh.grad is not None and torch.isfinite(hh.grad).all()


def test_max_logprob_keeps_shapes_and_the_two_tuple_by_default():
    h, w, t = _inputs(n=12)
    out = sk.linear_logprobs(h.view(3, 4, -1), w, t.view(3, 4))
    assert len(out) == 2
    logp, ent, mx = sk.linear_logprobs(h.view(3, 4, -1), w, t.view(3, 4), return_max_logprob=True,
                                       return_entropy=False)  # fmt: skip
    assert ent is None and mx.shape == (3, 4)


def test_max_logprob_is_refused_with_a_bad_flag_or_a_process_group():
    h, w, t = _inputs()
    with pytest.raises((TypeError, ValueError), match="return_max_logprob"):
        sk.linear_logprobs(h, w, t, return_max_logprob="yes")
    with pytest.raises(ValueError, match="return_max_logprob=True is not supported with process_group"):
        sk.linear_logprobs(h, w, t, return_max_logprob=True, process_group=object())


def test_max_logprob_by_name():
    """The three outputs by name (LogProbsWithMax); the default result's max_logprob is None."""
    h, w, t = _inputs(n=6)
    out = sk.linear_logprobs(h, w, t, return_max_logprob=True, return_entropy=False)
    assert isinstance(out, sk.LogProbsWithMax) and out.entropy is None
    torch.testing.assert_close(out.max_logprob, _want(h @ w.T, t, 1.0), rtol=1e-10, atol=1e-12)
    assert out.logp is out[0] and out.max_logprob is out[2]
    assert sk.linear_logprobs(h, w, t).max_logprob is None
    assert sk.logprobs_from_logits(h @ w.T, t).max_logprob is None
