"""Sampler-mismatch importance weights (token / sequence / geometric-mean level, truncated or masked) and the
off-policy sequence mask, against float64 formulas written here; TRL's names and defaults; today's token TIS kept bit
for bit as token_truncate; bad values refused naming the argument."""

from __future__ import annotations

import dataclasses
import inspect
import math

import pytest
import torch
from conftest import assert_refused

from sgrpo_kernels import rl

B, T = 5, 6


def inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    lp = -torch.rand(B, T, generator=g, dtype=torch.float64) * 2
    mu = lp + 0.5 * torch.randn(B, T, generator=g, dtype=torch.float64)
    mask = torch.arange(T).unsqueeze(0) < torch.tensor([6, 2, 0, 4, 5]).unsqueeze(1)
    return lp, mu, mask


def ref_weights(lp, mu, mask, mode, cmax, cmin):
    out = torch.ones(B, T, dtype=torch.float64)
    level, kind = mode.split("_")
    for i in range(B):
        d = [float(lp[i, t] - mu[i, t]) if mask[i, t] and not math.isnan(float(mu[i, t])) else 0.0 for t in range(T)]
        n = max(1, int(mask[i].sum()))
        for t in range(T):
            x = {"token": d[t], "sequence": sum(d), "geometric": sum(d) / n}[level]
            w = math.exp(x)
            lo = cmin if cmin is not None else -math.inf
            hi = cmax if cmax is not None else math.inf
            out[i, t] = min(max(w, lo), hi) if kind == "truncate" else (w if lo <= w <= hi else 0.0)
    return out


@pytest.mark.parametrize("mode", rl.SAMPLER_IS_MODES)
@pytest.mark.parametrize("bounds", [(3.0, None), (1.5, 0.5), (None, 0.8), (2.0, 0.0)])
def test_weights_match_the_float64_formula(mode, bounds):
    lp, mu, mask = inputs(1)
    mu[0, 3] = float("nan")  # the sampler could not score this token: no correction for it
    cmax, cmin = bounds
    w = rl.sampler_importance_weights(lp, mu, mask, mode, clip_max=cmax, clip_min=cmin)
    torch.testing.assert_close(w, ref_weights(lp, mu, mask, mode, cmax, cmin), rtol=1e-14, atol=0)
    assert not w.requires_grad and w.dtype == torch.float64


def test_the_modes_differ_on_these_inputs():
    lp, mu, mask = inputs(2)
    mu = lp + (mu - lp) * 0.4  # a mismatch where every level's weights stay partly inside [0.8, 1.2]
    seen = {m: rl.sampler_importance_weights(lp, mu, mask, m, clip_max=1.2, clip_min=0.8) for m in rl.SAMPLER_IS_MODES}
    vals = list(seen.values())
    assert all(not torch.equal(a, b) for i, a in enumerate(vals) for b in vals[i + 1 :])
    assert (seen["token_mask"][mask] == 0).any() and (seen["sequence_mask"][mask] == 0).any()


def test_token_truncate_is_todays_tis_bit_for_bit():
    lp, mu, mask = inputs(3)
    for cap in (1.0, 2.0, 3.0):
        a = rl.sampler_importance_weights(lp.float(), mu.float(), mask, "token_truncate", clip_max=cap)
        b = rl.truncated_importance_weights(lp.float(), mu.float(), mask, cap)
        assert torch.equal(a, b)
    mu = mu.clone()
    mu[0, 0], mu[1, 1] = float("nan"), float("nan")  # tokens the sampler did not score: weight 1 (TIS gave NaN)
    a = rl.sampler_importance_weights(lp, mu, mask, "token_truncate", clip_max=3.0)
    b = rl.truncated_importance_weights(lp, mu, mask, 3.0)
    assert torch.equal(a, b) and torch.isfinite(b).all() and b[0, 0] == 1 and b[1, 1] == 1


def test_trl_names_and_defaults():
    trl = pytest.importorskip("trl")
    sig = inspect.signature(rl.sampler_importance_weights).parameters
    fields = {f.name: f.default for f in dataclasses.fields(trl.GRPOConfig)}
    assert sig["mode"].default == fields["vllm_importance_sampling_mode"] == "sequence_mask"
    assert sig["clip_max"].default == fields["vllm_importance_sampling_clip_max"] == 3.0
    assert sig["clip_min"].default is fields["vllm_importance_sampling_clip_min"] is None
    assert {"token_truncate", "token_mask", "sequence_truncate", "sequence_mask"} <= set(rl.SAMPLER_IS_MODES)


def test_off_policy_sequence_mask_formula():
    lp, mu, mask = inputs(4)
    adv = torch.tensor([-1.0, 0.5, -0.2, -0.3, 0.0], dtype=torch.float64)
    for thr in (0.0, 0.1, 0.4, 10.0):
        keep = rl.off_policy_sequence_mask(adv, lp, mu, mask, thr)
        for i in range(B):
            n = int(mask[i].sum())
            kl = sum(float(mu[i, t] - lp[i, t]) for t in range(T) if mask[i, t]) / max(1, n)
            assert bool(keep[i]) == (float(adv[i]) >= 0 or kl <= thr)
    assert not rl.off_policy_sequence_mask(adv, lp, lp + 1.0, mask, 0.5)[0]


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"mode": "token"}, ["mode", "'token'", "token_truncate"]),
        ({"clip_max": 1.0, "clip_min": 1.0}, ["clip_min", "clip_max", "1.0"]),
        ({"clip_max": -2.0}, ["clip_max", "> 0.0", "-2.0"]),
        ({"clip_max": float("nan")}, ["clip_max", "nan"]),
        ({"clip_min": -0.1}, ["clip_min", ">= 0.0"]),
        ({"mode": "sequence_truncate", "clip_max": None}, ["sequence_truncate", "clip_max"]),
    ],
)
def test_bad_values_are_refused(kwargs, words):
    lp, mu, mask = inputs()
    assert_refused(lambda: rl.sampler_importance_weights(lp, mu, mask, **kwargs), (TypeError, ValueError), words)


def test_bad_shapes_and_thresholds_are_refused():
    lp, mu, mask = inputs()
    assert_refused(lambda: rl.sampler_importance_weights(lp, mu[:, :3], mask), ValueError, "sampler_logp")
    assert_refused(lambda: rl.sampler_importance_weights(lp[0], mu[0], mask[0]), ValueError, "trainer_logp")
    adv = torch.zeros(B, dtype=torch.float64)
    assert_refused(lambda: rl.off_policy_sequence_mask(adv, lp, mu, mask, -1.0), ValueError, ["threshold", ">= 0"])
    assert_refused(lambda: rl.off_policy_sequence_mask(adv[:2], lp, mu, mask, 1.0), ValueError, "advantages")


@pytest.mark.parametrize("agg", rl.LOSS_AGGS)
@pytest.mark.parametrize("how", ["policy_weights", "off_policy_mask", "top_entropy"])
def test_trls_masks_and_sampler_weights_leave_the_kl_term_unweighted(how, agg):
    """TRL multiplies the policy term by its off-policy mask, its top-entropy mask and the vLLM importance weights,
    then adds beta * k3 over every completion token (verl weighs only the policy term by rollout_is_weights too); the
    loss had them weigh the KL term as well. GRPO on-policy: ell = -A_i (ratio 1); loss and gradient
    against the float64 formula, in every aggregation."""
    lp, mu, mask = inputs(3)
    g = torch.Generator().manual_seed(4)
    ref = lp + 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64)
    adv = torch.tensor([-1.0, 0.5, 0.3, -0.7, 1.2], dtype=torch.float64)
    ent = torch.rand(B, T, generator=g, dtype=torch.float64)
    cfg, kw = dataclasses.replace(rl.preset("grpo"), loss_agg=agg), {}
    if how == "policy_weights":
        kw["policy_weights"] = pw = torch.rand(B, T, generator=g, dtype=torch.float64) * 2
        pw[0, 1] = 0.0
    elif how == "off_policy_mask":
        cfg = dataclasses.replace(cfg, off_policy_mask_threshold=0.05)
        kw["sampler_logp"] = mu
        pw = rl.off_policy_sequence_mask(adv, lp, mu, mask, 0.05).unsqueeze(1).to(torch.float64).expand(B, T)
        assert (pw[mask.any(1)] == 0).any()  # a completion dropped
    else:
        cfg = dataclasses.replace(cfg, top_entropy_quantile=0.5)
        kw["entropy"] = ent
        pw = rl.top_entropy_mask(ent, mask, 0.5).to(torch.float64)
    x = lp.clone().requires_grad_()
    loss, _ = rl.policy_loss(x, adv, mask, cfg, ref_logp=ref, **kw)
    (grad,) = torch.autograd.grad(loss, x)
    d = ref - lp
    per_tok = pw * -adv.unsqueeze(1) + cfg.beta * (d.exp() - d - 1)
    d_per_tok = cfg.beta * (1 - d.exp())  # d/d logp of beta * k3; the policy term's is pw * -A (ratio's slope 1)
    d_per_tok = d_per_tok + pw * -adv.unsqueeze(1)
    lengths = mask.sum(1).clamp(min=1).to(torch.float64).unsqueeze(1)
    n_seq, n_tok = int(mask.any(1).sum()), int(mask.sum())
    per_token = {"seq-mean-token-mean": 1.0 / (lengths * n_seq), "token-mean": torch.full_like(lengths, 1.0 / n_tok),
                 "seq-mean-token-sum": torch.full_like(lengths, 1.0 / n_seq), "token-sum": torch.ones_like(lengths),
                 "seq-sum-token-mean": 1.0 / lengths,
                 "seq-mean-token-sum-norm": torch.full_like(lengths, 1.0 / (B * T))}  # fmt: skip
    tok_w = torch.where(mask, per_token[agg].expand(B, T), 0.0)  # each aggregation's weight of a token
    assert float(loss.detach()) == pytest.approx(float((per_tok * tok_w).sum()), rel=1e-12, abs=1e-14)
    torch.testing.assert_close(grad, torch.where(mask, d_per_tok * tok_w, 0.0), rtol=1e-12, atol=1e-14)
