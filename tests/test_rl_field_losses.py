"""The field's policy terms (LossConfig.policy_term: dppo_tv, dppo_kl, cispo, sapo, gmpo, clip_cov, kl_cov) and their
presets, against float64 formulas written here token by token (loss and the gradient w.r.t. the log-probs), for every
loss aggregation, with masks, an empty completion and off-policy old log-probs; Clip-Cov's seeded draw by its
distribution; the off-policy sequence mask; bad values refused naming the field."""

from __future__ import annotations

import dataclasses
import math
import zlib

import pytest
import torch
from conftest import assert_refused

from sgrpo_kernels import rl

B, T = 6, 7


def inputs(seed: int):
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3 - 0.05
    old = (logp + 0.4 * torch.randn(B, T, generator=g, dtype=torch.float64)).clamp(max=-1e-3)
    lengths = torch.tensor([7, 3, 0, 5, 1, 6])
    mask = torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)
    mask[5, 2] = False  # a hole
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    adv[3] = 0.0
    return logp, old, mask, adv


def agg(v, mask, how):
    """Aggregate scalar per-token losses v[i][t] (autograd scalars) with mask-based denominators."""
    n = [int(mask[i].sum()) for i in range(B)]
    rows = [sum(v[i][t] for t in range(T) if mask[i, t]) for i in range(B)]
    seqs = [i for i in range(B) if n[i] > 0]
    if how == "token-mean":
        return sum(rows) / sum(n)
    if how == "token-sum":
        return sum(rows)
    if how == "seq-mean-token-sum":
        return sum(rows[i] for i in seqs) / len(seqs)
    if how == "seq-mean-token-sum-norm":
        return sum(rows) / (B * T)
    if how == "seq-sum-token-mean":
        return sum(rows[i] / n[i] for i in seqs)
    return sum(rows[i] / n[i] for i in seqs) / len(seqs)


def sig(x):
    return 1.0 / (1.0 + torch.exp(-x))


def ref_terms(cfg, logp, old, mask, adv, chosen=None):
    """The per-token loss of each term, element by element, in float64 (`logp` a leaf with grad)."""
    el, eh, c = cfg.epsilon_low, cfg.epsilon_high, cfg.log_ratio_clip
    v = [[None] * T for _ in range(B)]
    for i in range(B):
        a = float(adv[i])
        n = int(mask[i].sum())
        if cfg.policy_term == "gmpo" and n > 0:
            s = 0.0
            for t in range(T):
                if mask[i, t]:
                    lr = (logp[i, t] - old[i, t]).clamp(-c, c)
                    lrc = lr.clamp(-el, eh)
                    sg = math.copysign(1.0, a) if a != 0 else 0.0
                    s = s + sg * torch.minimum(sg * lr, sg * lrc)
            seq = -a * torch.exp(s / n)
        for t in range(T):
            if not mask[i, t]:
                continue
            lp, o = logp[i, t], float(old[i, t])
            lr = (lp - o).clamp(-c, c)
            r = torch.exp(lr)
            term = cfg.policy_term
            if term in ("dppo_tv", "dppo_kl"):
                q, p = math.exp(float(lp.detach())), math.exp(o)
                if term == "dppo_tv":
                    inside = q - p <= eh if a > 0 else q - p >= -el
                else:
                    d = p * (o - float(lp.detach())) + (1 - p) * math.log((1 - p + 1e-8) / (1 - q + 1e-8))
                    inside = (d <= eh or q <= p) if a > 0 else (d <= el or q >= p)
                w = min(float(r), cfg.dppo_ratio_cap)
                v[i][t] = -a * w * lp if inside else 0.0 * lp
            elif term == "cispo":
                w = min(max(float(r), 1 - el), 1 + eh)
                v[i][t] = -w * a * lp
            elif term == "sapo":
                tau = cfg.sapo_tau_pos if a > 0 else cfg.sapo_tau_neg
                v[i][t] = -(4.0 / tau) * sig(tau * (r - 1.0)) * a
            elif term == "gmpo":
                v[i][t] = seq
            elif term == "clip_cov":
                ppo = torch.maximum(-a * r, -a * r.clamp(1 - el, 1 + eh))
                v[i][t] = 0.0 * lp if chosen[i][t] else ppo
            elif term == "kl_cov":
                v[i][t] = -a * r + (cfg.kl_cov_coef * lr.abs() if chosen[i][t] else 0.0)
    return v


def ref_kl_cov_choice(cfg, logp, mask, adv):
    cells = [(i, t) for i in range(B) for t in range(T) if mask[i, t]]
    a = [float(adv[i]) for i, _ in cells]
    lp = [float(logp[i, t]) for i, t in cells]
    ma, ml = sum(a) / len(a), sum(lp) / len(lp)
    cov = [(x - ma) * (y - ml) for x, y in zip(a, lp)]
    k = max(1, int(len(cells) * cfg.cov_ratio))
    top = sorted(range(len(cells)), key=lambda j: -cov[j])[:k]
    chosen = [[False] * T for _ in range(B)]
    for j in top:
        chosen[cells[j][0]][cells[j][1]] = True
    return chosen


def ref_clip_cov_choice(cfg, logp, old, mask, adv, seed):
    """Eligible: valid, not clipped by PPO, covariance strictly inside (lb, ub); the draw: randperm of the eligible
    tokens in row-major order with a generator seeded `seed` (the documented draw)."""
    cells = [(i, t) for i in range(B) for t in range(T) if mask[i, t]]
    ma = sum(float(adv[i]) for i, _ in cells) / len(cells)
    ml = sum(float(logp[i, t]) for i, t in cells) / len(cells)
    eligible = []
    for i, t in cells:
        a, r = float(adv[i]), math.exp(max(-20.0, min(20.0, float(logp[i, t]) - float(old[i, t]))))
        clipped = -a * min(max(r, 1 - cfg.epsilon_low), 1 + cfg.epsilon_high) > -a * r
        cov = (a - ma) * (float(logp[i, t]) - ml)
        if not clipped and cfg.clip_cov_lb < cov < cfg.clip_cov_ub:
            eligible.append((i, t))
    k = max(int(cfg.cov_ratio * len(cells)), 1)
    perm = torch.randperm(len(eligible), generator=torch.Generator().manual_seed(seed)).tolist()
    chosen = [[False] * T for _ in range(B)]
    for j in perm[:k]:
        chosen[eligible[j][0]][eligible[j][1]] = True
    return chosen, eligible


AGGS = list(rl.LOSS_AGGS)
CASES = {
    "dppo_tv": {},
    "dppo_kl": {"epsilon_low": 0.05, "epsilon_high": 0.02},
    "dppo_tv_tight": {"epsilon_low": 0.01, "epsilon_high": 0.03, "dppo_ratio_cap": 1.5},
    "cispo": {},
    "cispo_trl": {"epsilon_low": 1.0, "epsilon_high": 1.5},
    "sapo": {"sapo_tau_pos": 2.0, "sapo_tau_neg": 3.5},
    "gmpo": {"epsilon_low": 0.1, "epsilon_high": 0.3},
    "clip_cov": {"cov_ratio": 0.1, "clip_cov_lb": -0.5, "clip_cov_ub": 0.5},
    "kl_cov": {"cov_ratio": 0.15, "kl_cov_coef": 0.7},
}


@pytest.mark.parametrize("agg_mode", AGGS)
@pytest.mark.parametrize("case", list(CASES))
def test_matches_the_float64_formula(case, agg_mode):
    name = case.split("_tight")[0].split("_trl")[0]
    cfg = dataclasses.replace(rl.preset(name), **CASES[case], loss_agg=agg_mode, max_completion_length=T)
    logp, old, mask, adv = inputs(zlib.crc32(case.encode()) % 1000)
    chosen = None
    if name == "kl_cov":
        chosen = ref_kl_cov_choice(cfg, logp, mask, adv)
    if name == "clip_cov":
        chosen, eligible = ref_clip_cov_choice(cfg, logp, old, mask, adv, seed=7)
        assert len(eligible) > max(int(cfg.cov_ratio * int(mask.sum())), 1)  # a real draw
    x = logp.clone().requires_grad_()
    gen = torch.Generator().manual_seed(7)
    loss, metrics = rl.policy_loss(x, adv, mask, cfg, old_logp=old, generator=gen)
    (gx,) = torch.autograd.grad(loss, x)
    y = logp.clone().requires_grad_()
    want = agg(ref_terms(cfg, y, old, mask, adv, chosen), mask, agg_mode)
    (gy,) = torch.autograd.grad(want, y)
    torch.testing.assert_close(loss, want.to(loss.dtype), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(gx, gy, rtol=1e-12, atol=1e-12)
    assert (gx[~mask] == 0).all()
    assert 0.0 <= float(metrics["policy_term_frac"]) <= 1.0
    if name in ("dppo_tv", "dppo_kl"):
        assert float(metrics["policy_term_frac"]) > 0  # the region bites on these inputs


def test_hand_derived_gradients():
    """d/dlogp of the simplest terms, written out (token-sum: no denominator): CISPO -sg(w) A, DPPO -A sg(min(r, C))
    inside the region, SAPO -A 4 sigma'(tau (r - 1)) r."""
    logp, old, mask, adv = inputs(3)
    a = adv.unsqueeze(1).expand(B, T)
    r = torch.exp(logp - old)
    for name, want in (
        ("cispo", -r.clamp(0.8, 1.2) * a),
        ("sapo", -a * 4 * sig(torch.where(a > 0, 1.0, 1.05) * (r - 1)) * (1 - sig(torch.where(a > 0, 1.0, 1.05) *
                                                                                   (r - 1))) * r),  # fmt: skip
    ):
        x = logp.clone().requires_grad_()
        loss, _ = rl.policy_loss(x, adv, mask, dataclasses.replace(rl.preset(name), loss_agg="token-sum"),
                                 old_logp=old)  # fmt: skip
        (g,) = torch.autograd.grad(loss, x)
        torch.testing.assert_close(g, torch.where(mask, want, 0.0), rtol=1e-12, atol=1e-12)
    x = logp.clone().requires_grad_()
    cfg = dataclasses.replace(rl.preset("dppo_tv"), loss_agg="token-sum", epsilon_low=0.02, epsilon_high=0.02)
    loss, _ = rl.policy_loss(x, adv, mask, cfg, old_logp=old)
    (g,) = torch.autograd.grad(loss, x)
    dp = torch.exp(logp) - torch.exp(old)
    inside = torch.where(a > 0, dp <= 0.02, dp >= -0.02)
    torch.testing.assert_close(g, torch.where(mask & inside, -a * r.clamp(max=3.0), 0.0), rtol=1e-12, atol=1e-12)
    assert (mask & ~inside).any() and (mask & inside).any()


def test_clip_cov_draw_is_seeded_and_uniform_over_the_eligible_tokens():
    """Over many seeds, every eligible token is chosen with frequency k / n_eligible (binomial bounds), exactly k are
    chosen each time, nothing else ever; the same seed gives the same draw."""
    logp, old, mask, adv = inputs(11)
    adv[3] = 0.3  # no zero advantage: an unchosen eligible token then has a gradient
    cfg = dataclasses.replace(rl.preset("clip_cov"), cov_ratio=0.1, clip_cov_lb=-0.5, clip_cov_ub=0.5,
                              loss_agg="token-sum")  # fmt: skip
    _, eligible = ref_clip_cov_choice(cfg, logp, old, mask, adv, seed=0)
    k = max(int(0.1 * int(mask.sum())), 1)
    n_el = len(eligible)
    assert 2 <= k < n_el
    counts = torch.zeros(B, T)
    draws = 1500

    def chosen(seed):
        x = logp.clone().requires_grad_()
        loss, m = rl.policy_loss(x, adv, mask, cfg, old_logp=old, generator=torch.Generator().manual_seed(seed))
        (g,) = torch.autograd.grad(loss, x)
        return (g == 0) & mask, m  # a chosen token has no gradient; a kept, unclipped one has (A != 0 there)

    el = torch.zeros(B, T, dtype=torch.bool)
    for i, t in eligible:
        el[i, t] = True
    assert (adv.unsqueeze(1).expand(B, T)[el] != 0).all()
    for seed in range(draws):
        c, m = chosen(seed)
        c = c & el
        assert int(c.sum()) == k and float(m["policy_term_frac"]) == pytest.approx(k / int(mask.sum()))
        counts += c
    p = k / n_el
    sd = math.sqrt(draws * p * (1 - p))
    assert (counts[~el] == 0).all()
    assert ((counts[el] - draws * p).abs() < 4.5 * sd).all(), (counts[el], draws * p)
    assert torch.equal(chosen(5)[0], chosen(5)[0])


def test_presets_carry_verl_defaults():
    for name in ("dppo_tv", "dppo_kl", "cispo", "sapo", "gmpo", "clip_cov", "kl_cov"):
        cfg = rl.preset(name)
        assert cfg.name == name and cfg.beta == 0 and (cfg.epsilon_low, cfg.epsilon_high) == (0.2, 0.2)
        assert name in rl.FIELD_PRESETS and name not in rl.PRESETS
    assert rl.preset("dppo_tv").dppo_ratio_cap == 3.0 and rl.preset("dppo_kl").loss_agg == "token-mean"
    assert (rl.preset("sapo").sapo_tau_pos, rl.preset("sapo").sapo_tau_neg) == (1.0, 1.05)
    assert rl.preset("sapo").loss_agg == "seq-mean-token-mean" and rl.preset("gmpo").policy_term == "gmpo"
    cc, kc = rl.preset("clip_cov"), rl.preset("kl_cov")
    assert (cc.cov_ratio, cc.clip_cov_lb, cc.clip_cov_ub) == (2e-4, 1.0, 5.0)
    assert (kc.cov_ratio, kc.kl_cov_coef) == (2e-4, 0.1)
    assert rl.preset_with("s_grpo", "policy_term=cispo").policy_term == "cispo"  # composes with the stabilizers


def test_existing_presets_are_unchanged_by_the_new_fields():
    """policy_term defaults to ppo; the GRPO-family presets give bit-identical losses and gradients with the new
    fields spelled out at their defaults."""
    logp, old, mask, adv = inputs(5)
    for name in rl.PRESETS:
        cfg = rl.preset(name)
        if cfg.needs_entropy or cfg.needs_ref or cfg.needs_max_logprob:
            continue
        spelled = dataclasses.replace(cfg, policy_term="ppo", off_policy_mask_threshold=None, cov_ratio=2e-4)
        out = []
        for c in (cfg, spelled):
            x = logp.clone().requires_grad_()
            loss, m = rl.policy_loss(x, adv, mask, c, old_logp=old)
            out.append((loss, torch.autograd.grad(loss, x)[0], sorted(m)))
        assert torch.equal(out[0][0], out[1][0]) and torch.equal(out[0][1], out[1][1]) and out[0][2] == out[1][2]
        assert "policy_term_frac" not in out[0][2]


def test_off_policy_sequence_mask_in_the_loss():
    logp, old, mask, adv = inputs(8)
    sampler = logp + torch.where(torch.arange(B).unsqueeze(1) % 2 == 0, 0.9, 0.01)  # even rows drifted
    cfg = dataclasses.replace(rl.preset("dapo"), off_policy_mask_threshold=0.5)
    x = logp.clone().requires_grad_()
    loss, m = rl.policy_loss(x, adv, mask, cfg, old_logp=old, sampler_logp=sampler)
    (g,) = torch.autograd.grad(loss, x)
    keep = rl.off_policy_sequence_mask(adv, logp, sampler, mask, 0.5)
    want_keep = (adv >= 0) | (torch.arange(B) % 2 == 1) | ~mask.any(dim=1)  # an empty row has no drift
    assert torch.equal(keep, want_keep)
    dropped = ~keep & mask.any(dim=1)
    assert dropped.any() and (g[~keep] == 0).all() and (g[keep.unsqueeze(1) & mask] != 0).any()
    assert float(m["off_policy_masked_frac"]) == pytest.approx(float(dropped.sum()) / int(mask.any(dim=1).sum()))
    # the same as zero token weights on the dropped rows
    y = logp.clone().requires_grad_()
    loss2, _ = rl.policy_loss(y, adv, mask, rl.preset("dapo"), old_logp=old,
                              token_weights=keep.unsqueeze(1).expand(B, T).to(torch.float64))  # fmt: skip
    torch.testing.assert_close(loss, loss2, rtol=0, atol=0)


@pytest.mark.parametrize(
    "changes, words",
    [
        ({"policy_term": "dppo"}, ["LossConfig.policy_term", "'dppo'", "dppo_tv"]),
        ({"policy_term": "sapo", "sapo_tau_neg": -1.0}, ["LossConfig.sapo_tau_neg", "> 0.0", "-1.0"]),
        ({"policy_term": "sapo", "sapo_tau_pos": float("nan")}, ["LossConfig.sapo_tau_pos", "nan"]),
        ({"policy_term": "dppo_tv", "dppo_ratio_cap": 0.5}, ["LossConfig.dppo_ratio_cap", ">= 1.0", "0.5"]),
        ({"policy_term": "clip_cov", "cov_ratio": 0.0}, ["LossConfig.cov_ratio", "> 0.0"]),
        ({"policy_term": "clip_cov", "cov_ratio": 2.0}, ["LossConfig.cov_ratio", "<= 1.0"]),
        ({"policy_term": "clip_cov", "clip_cov_lb": 5.0}, ["LossConfig.clip_cov_lb", "LossConfig.clip_cov_ub"]),
        ({"policy_term": "kl_cov", "kl_cov_coef": -0.1}, ["LossConfig.kl_cov_coef", ">= 0.0"]),
        ({"sapo_tau_pos": 2.0}, ["LossConfig.sapo_tau_pos", "policy_term", "'ppo'"]),
        ({"policy_term": "cispo", "importance_level": "sequence"}, ["LossConfig.importance_level", "'ppo'"]),
        ({"policy_term": "dppo_kl", "dual_clip": 3.0}, ["LossConfig.dual_clip", "'ppo'"]),
        ({"epsilon_low": 1.0}, ["LossConfig.epsilon_low", "< 1.0"]),
        ({"off_policy_mask_threshold": -0.5}, ["LossConfig.off_policy_mask_threshold", ">= 0.0", "-0.5"]),
        ({"off_policy_mask_threshold": float("inf")}, ["LossConfig.off_policy_mask_threshold", "finite"]),
        ({"loss_agg": "token-max"}, ["LossConfig.loss_agg", "token-sum"]),
    ],
)
def test_bad_values_are_refused_naming_the_field(changes, words):
    assert_refused(lambda: rl.LossConfig(**changes), (TypeError, ValueError), words)


def test_unknown_preset_lists_the_field_presets():
    assert_refused(lambda: rl.preset("cispo2"), ValueError, ["'cispo2'", "cispo", "kl_cov", "s_grpo"])


@pytest.mark.parametrize("name", ["dppo_tv", "cispo", "kl_cov"])
def test_on_policy_the_term_is_the_plain_policy_gradient(name):
    """At one update per rollout batch the policy that computes the loss is the one that sampled (ratio 1): DPPO-TV's
    mask keeps every token, CISPO's clipped weight is 1 and KL-Cov's penalty has no gradient there, so each gives
    exactly the gradient of the same config with PPO's term (bit for bit: multiplying by an exact 1.0). Off the
    policy (a second epoch) they differ. The study's phase 2 ran these presets at one epoch (docs/study.md)."""
    cfg = rl.preset(name)
    plain = dataclasses.replace(cfg, policy_term="ppo")
    g = torch.Generator().manual_seed(3)
    old = -torch.rand(6, 9, generator=g, dtype=torch.float64) * 3
    mask = torch.rand(6, 9, generator=g) > 0.2
    adv = torch.randn(6, generator=g, dtype=torch.float64)

    def grad(config, logp):
        lp = logp.clone().requires_grad_()
        loss, metrics = rl.policy_loss(lp, adv, mask, config, old_logp=old)
        loss.backward()
        return lp.grad, metrics

    on, m = grad(cfg, old)
    assert torch.equal(on, grad(plain, old)[0])
    if name != "kl_cov":  # (KL-Cov flags its top-covariance tokens on every pass; their penalty's gradient is 0 here)
        assert float(m["policy_term_frac"]) == 0.0
    moved = old + 0.3 * torch.randn(6, 9, generator=g, dtype=torch.float64)
    assert not torch.allclose(grad(cfg, moved)[0], grad(plain, moved)[0])
