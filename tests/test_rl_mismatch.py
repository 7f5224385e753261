"""Sampler/trainer mismatch (sgrpo_kernels.rl.mismatch): the truncated importance weights and the mean log-prob gap
against hand-computed float64 values, the weights' effect on policy_loss's gradient, bad inputs refused by name."""

from __future__ import annotations

import math

import pytest
import torch

from sgrpo_kernels import rl

D = torch.float64


def _batch():
    # row 0: trainer 0.5 / sampler 0.25 (ratio 2), trainer 0.1 / sampler 0.2 (ratio 0.5); row 1: 0.3 / 0.05 (ratio 6),
    # and a masked position whose values must not count
    lp = torch.tensor([[math.log(0.5), math.log(0.1)], [math.log(0.3), math.log(0.9)]], dtype=D)
    mu = torch.tensor([[math.log(0.25), math.log(0.2)], [math.log(0.05), math.log(1e-9)]], dtype=D)
    mask = torch.tensor([[True, True], [True, False]])
    return lp, mu, mask


def test_truncated_weights_by_hand():
    lp, mu, mask = _batch()
    w = rl.truncated_importance_weights(lp, mu, mask, cap=3.0)
    torch.testing.assert_close(w, torch.tensor([[2.0, 0.5], [3.0, 1.0]], dtype=D), rtol=0, atol=1e-14)
    w = rl.truncated_importance_weights(lp, mu, mask, cap=10.0)
    torch.testing.assert_close(w, torch.tensor([[2.0, 0.5], [6.0, 1.0]], dtype=D), rtol=0, atol=1e-13)
    assert w.dtype == D and not w.requires_grad


def test_logp_mismatch_by_hand():
    lp, mu, mask = _batch()
    want = (math.log(2.0) + math.log(2.0) + math.log(6.0)) / 3
    assert rl.logp_mismatch(lp, mu, mask).item() == pytest.approx(want, abs=1e-14)
    assert math.isnan(rl.logp_mismatch(lp, mu, torch.zeros_like(mask)).item())


def test_weights_scale_the_policy_gradient():
    """seq-mean-token-mean, on-policy ratio 1, no clip active: L = -(1/B) sum_i (1/T_i) sum_t A_i w_it rho_it, so
    dL/dlogp_it = -A_i w_it / (B T_i): the TIS weights multiply each token's gradient and nothing else."""
    lp, mu, mask = _batch()
    logp = lp.clone().requires_grad_(True)
    adv = torch.tensor([1.0, -1.0], dtype=D)
    cfg = rl.LossConfig(name="tis")
    w = rl.truncated_importance_weights(lp, mu, mask, cap=3.0)
    loss, _ = rl.policy_loss(logp, adv, mask, cfg, token_weights=w)
    (g,) = torch.autograd.grad(loss, [logp])
    want = torch.tensor([[-2.0 / 4, -0.5 / 4], [3.0 / 2, 0.0]], dtype=D)
    torch.testing.assert_close(g, want, rtol=0, atol=1e-14)
    assert loss.item() == pytest.approx(-(2.0 + 0.5) / 4 + 3.0 / 2, abs=1e-14)


@pytest.mark.parametrize(
    ("kwargs", "err", "match"),
    [
        ({"cap": 0.5}, ValueError, "cap must be >= 1"),
        ({"cap": float("inf")}, ValueError, "cap must be finite"),
        ({"sampler_logp": torch.zeros(2, 3, dtype=D)}, ValueError, r"sampler_logp has shape \(2, 3\)"),
        ({"trainer_logp": torch.zeros(2, 2, dtype=torch.long)}, TypeError, "trainer_logp must be a floating"),
        ({"mask": torch.ones(3, 2, dtype=torch.bool)}, ValueError, r"mask has shape \(3, 2\)"),
    ],
)
def test_bad_inputs_named(kwargs, err, match):
    lp, mu, mask = _batch()
    args = {"trainer_logp": lp, "sampler_logp": mu, "mask": mask, "cap": 2.0} | kwargs
    with pytest.raises(err, match=match):
        rl.truncated_importance_weights(**args)
