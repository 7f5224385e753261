"""Probability compensation (grpo-stability-experiments.md 2.2): A_it = A_i * min(2 - p_it / p_max_it, C_max), against
a hand-computed float64 loss and its gradient, both modes, the default cap 1 + epsilon_high, through sgrpo_loss with
the op's max_logprob; bad settings refused by name."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

import sgrpo_kernels as sk
from sgrpo_kernels import rl

D = torch.float64


def _cfg(**kw):
    return rl.LossConfig(name="pc", **kw)


def test_compensated_loss_by_hand():
    """B = 2 completions of T = 2 tokens, A = (+1, -1), on-policy (ratio 1), seq-mean-token-mean, no clip active:
    L = -(1/2) sum_i (1/T) sum_t A_i C_it rho_it, so dL/dlogp_it = -A_i C_it / (2 T)."""
    logp = torch.tensor([[math.log(0.5), math.log(0.1)], [math.log(0.2), math.log(0.6)]], dtype=D, requires_grad=True)
    mx = torch.tensor([[math.log(0.5), math.log(0.8)], [math.log(0.7), math.log(0.6)]], dtype=D)
    adv = torch.tensor([1.0, -1.0], dtype=D)
    mask = torch.ones(2, 2, dtype=torch.bool)
    # "positive", cap 1.2 (= 1 + epsilon_high): C row 0 = min(2 - 1, 1.2) = 1, min(2 - 0.125, 1.2) = 1.2; row 1: 1
    loss, _ = rl.policy_loss(logp, adv, mask, _cfg(prob_compensation="positive"), max_logprob=mx)
    (g,) = torch.autograd.grad(loss, [logp])
    want = torch.tensor([[-1.0, -1.2], [1.0, 1.0]], dtype=D) / 4.0
    torch.testing.assert_close(g, want, rtol=0, atol=1e-15)
    assert loss.item() == pytest.approx(-(1.0 + 1.2) / 4 + (1.0 + 1.0) / 4, abs=1e-15)
    # "all", cap 2: row 1 too: C = 2 - 0.2/0.7 and 2 - 1 = 1; row 0: 1 and 2 - 0.125 = 1.875
    cfg = _cfg(prob_compensation="all", prob_compensation_max=2.0)
    loss, _ = rl.policy_loss(logp, adv, mask, cfg, max_logprob=mx)
    (g,) = torch.autograd.grad(loss, [logp])
    want = torch.tensor([[-1.0, -1.875], [2 - 0.2 / 0.7, 1.0]], dtype=D) / 4.0
    torch.testing.assert_close(g, want, rtol=0, atol=1e-15)


def test_compensation_off_is_the_plain_loss_and_cap_defaults_to_the_clip():
    g = torch.Generator().manual_seed(0)
    logp = -torch.rand(4, 5, generator=g, dtype=D) * 3
    mx = torch.maximum(logp, -torch.rand(4, 5, generator=g, dtype=D))
    adv, mask = torch.tensor([1.0, -0.5, 0.3, 0.0], dtype=D), torch.ones(4, 5, dtype=torch.bool)
    base = rl.policy_loss(logp, adv, mask, _cfg())[0]
    assert rl.policy_loss(logp, adv, mask, _cfg(), max_logprob=mx)[0] == base  # ignored when off
    assert _cfg(prob_compensation="positive", epsilon_high=0.28).compensation_cap == pytest.approx(1.28)
    assert _cfg(prob_compensation="positive", epsilon_high=5.0).compensation_cap == 2.0
    capped = rl.policy_loss(logp, adv, mask, _cfg(prob_compensation="positive", prob_compensation_max=1.0),
                            max_logprob=mx)[0]  # fmt: skip
    torch.testing.assert_close(capped, base)  # C_max = 1: no compensation at all


def test_sgrpo_loss_passes_the_ops_max_logprob():
    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(2, 3, 8, generator=g, dtype=D, requires_grad=True)
    w = torch.randn(29, 8, generator=g, dtype=D)
    ids = torch.randint(0, 29, (2, 3), generator=g)
    mask = torch.ones(2, 3, dtype=torch.bool)
    adv = torch.tensor([1.0, -1.0], dtype=D)
    cfg = dataclasses.replace(rl.preset("grpo_tc"), prob_compensation="all", prob_compensation_max=2.0)
    loss, _ = sk.sgrpo_loss(hidden, w, ids, adv, mask, cfg, backend="torch")
    lp_all = torch.log_softmax(hidden @ w.T, -1)
    logp = lp_all.gather(-1, ids[..., None])[..., 0]
    want, _ = rl.policy_loss(logp, adv, mask, cfg, max_logprob=lp_all.max(-1).values)
    torch.testing.assert_close(loss, want, rtol=1e-12, atol=1e-14)
    (gh,) = torch.autograd.grad(loss, [hidden])
    (wh,) = torch.autograd.grad(want, [hidden])
    torch.testing.assert_close(gh, wh, rtol=1e-10, atol=1e-12)


def test_bad_compensation_settings_are_refused():
    with pytest.raises(ValueError, match="LossConfig.prob_compensation"):
        _cfg(prob_compensation="negative")
    with pytest.raises(ValueError, match="LossConfig.prob_compensation_max"):
        _cfg(prob_compensation="all", prob_compensation_max=2.5)
    with pytest.raises(ValueError, match="prob_compensation_max=1.5 is set but prob_compensation is None"):
        _cfg(prob_compensation_max=1.5)
    with pytest.raises(ValueError, match="max_logprob \\[B, T\\] is required"):
        rl.policy_loss(torch.zeros(1, 2, dtype=D), torch.ones(1, dtype=D), torch.ones(1, 2, dtype=torch.bool),
                       _cfg(prob_compensation="positive"))  # fmt: skip
