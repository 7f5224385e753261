"""policy_loss / LossConfig / presets against an independent float64 loop implementation; zero-gradient guarantees."""

from __future__ import annotations

import dataclasses
import math
import zlib

import numpy as np
import pytest
import torch
from conftest import assert_refused

from sgrpo_kernels import rl


def ref_coverage(rewards, g, vocab):
    """Per-completion coverage thresholds from scalar loops in float64: n_eff = (sum |r - mean|)^2 / sum (r - mean)^2
    over the group's finite rewards (0 without spread), H = min(ln max(n_eff, 1), ln |V|)."""
    out = []
    for start in range(0, len(rewards), g):
        vals = [float(r) for r in rewards[start : start + g] if math.isfinite(float(r))]
        mean = sum(vals) / len(vals) if vals else 0.0
        sq = sum((v - mean) ** 2 for v in vals)
        n_eff = sum(abs(v - mean) for v in vals) ** 2 / sq if sq > 0 else 0.0
        out += [min(math.log(max(n_eff, 1.0)), math.log(vocab))] * g
    return out


def ref_loss(
    logp,
    adv,
    mask,
    cfg: rl.LossConfig,
    entropy=None,
    old=None,
    ref=None,
    tw=None,
    counts=None,
    rewards=None,
    g=None,
    vocab=None,
):
    """Scalar loops over completions and tokens in float64 (autograd through scalar ops)."""
    b, t = logp.shape
    m = [[float(mask[i, k]) for k in range(t)] for i in range(b)]
    valid = [[m[i][k] != 0 for k in range(t)] for i in range(b)]
    n = [sum(m[i]) for i in range(b)]
    hv = entropy.detach() if entropy is not None else None
    a = [float(adv[i]) for i in range(b)]
    hbar = (
        [sum(m[i][k] * float(hv[i, k]) for k in range(t) if valid[i][k]) / n[i] if n[i] > 0 else 0.0 for i in range(b)]
        if hv is not None
        else None
    )
    keep = [True] * b
    if cfg.entropy_filter is not None:
        f = cfg.entropy_filter
        if f == "ln2":
            thr = math.log(2)
        elif f == "adaptive":
            rr = rewards.reshape(-1, g).double()
            gv = [float(((row - row.mean()) ** 2).mean()) for row in rr]
            rng = float(rewards.max() - rewards.min())
            vbar = (sum(gv) / len(gv)) / rng**2 if rng > 0 else 0.0
            thr = min(math.log(1 + (1 + 4 * vbar) * (1 + math.log(g) / math.log(vocab))), math.log(vocab))
        elif f == "coverage":
            thr = None
            thr_i = [ref_coverage(rewards.tolist(), g, vocab)[i] for i in range(b)]
        elif isinstance(f, str):
            q = float(f.split(":")[1])
            thr = float(np.quantile([hbar[i] for i in range(b) if n[i] > 0], q))
        else:
            thr = f
        keep = [hbar[i] <= (thr if thr is not None else thr_i[i]) for i in range(b)]
    if cfg.entropy_advantage_shift is not None:
        a = [a[i] - cfg.entropy_advantage_shift * hbar[i] for i in range(b)]
    if cfg.positive_only:
        a = [max(x, 0.0) for x in a]
    w = [
        [
            m[i][k] * (float(tw[i, k]) if tw is not None else 1.0) * (1.0 if keep[i] else 0.0) if valid[i][k] else 0.0
            for k in range(t)
        ]
        for i in range(b)
    ]
    if cfg.top_entropy_quantile is not None:
        act = sorted((float(hv[i, k]) for i in range(b) for k in range(t) if w[i][k] != 0), reverse=True)
        if act:
            cut = act[math.ceil(cfg.top_entropy_quantile * len(act)) - 1]
            w = [[w[i][k] if float(hv[i, k]) >= cut else 0.0 for k in range(t)] for i in range(b)]
    c = cfg.log_ratio_clip

    def clampf(x, lo, hi):
        return torch.clamp(x, lo, hi)

    per = [[None] * t for _ in range(b)]
    for i in range(b):
        if cfg.importance_level == "sequence" and n[i] > 0:
            s_lr = (
                sum(
                    m[i][k] * (float(logp[i, k]) - (float(old[i, k]) if old is not None else float(logp[i, k])))
                    for k in range(t)
                    if valid[i][k]
                )
                / n[i]
            )
            s_i = math.exp(max(-c, min(c, s_lr)))
        for k in range(t):
            if w[i][k] == 0:
                continue
            lp = logp[i, k]
            if cfg.importance_level == "token":
                o = old[i, k] if old is not None else lp.detach()
                r = torch.exp(clampf(lp - o, -c, c))
            else:
                r = s_i * torch.exp(lp - lp.detach())
            pg = torch.maximum(-a[i] * r, -a[i] * torch.clamp(r, 1 - cfg.epsilon_low, 1 + cfg.epsilon_high))
            if cfg.dual_clip is not None and a[i] < 0:
                pg = torch.minimum(pg, torch.tensor(-a[i] * cfg.dual_clip, dtype=torch.float64))
            if ref is not None and cfg.beta > 0:
                d = clampf(ref[i, k] - lp, -c, c)
                pg = pg + cfg.beta * (torch.exp(d) - d - 1)
            val = w[i][k] * pg
            if cfg.conflict_count_norm:
                cnt = (
                    float(counts[i])
                    if counts is not None
                    else sum(1 for kk in range(t) if valid[i][kk] and float(tw[i, kk]) != 1)
                )
                val = val / max(1.0, cnt)
            per[i][k] = val

    def agg(vals):
        def tot(i):
            return sum((v for v in vals[i] if v is not None), torch.tensor(0.0, dtype=torch.float64))

        nonempty = [i for i in range(b) if n[i] > 0]
        if cfg.loss_agg == "token-mean":
            return sum(tot(i) for i in range(b)) / (sum(n) if sum(n) > 0 else 1)
        if cfg.loss_agg == "seq-mean-token-sum-norm":
            return sum(tot(i) for i in range(b)) / (b * (cfg.max_completion_length or t))
        if cfg.loss_agg == "seq-mean-token-sum":
            return sum(tot(i) for i in nonempty) / max(1, len(nonempty))
        if cfg.loss_agg == "seq-sum-token-mean":
            return sum(tot(i) / n[i] for i in nonempty)
        return sum(tot(i) / n[i] for i in nonempty) / max(1, len(nonempty))

    loss = agg(per)
    if entropy is not None and cfg.entropy_coef != 0:
        hv_ = [[m[i][k] * entropy[i, k] if w[i][k] != 0 else None for k in range(t)] for i in range(b)]
        loss = loss - cfg.entropy_coef * agg(hv_)
    if (
        entropy is not None
        and cfg.entropy_penalty_coef != 0
        and (cfg.entropy_floor is not None or cfg.entropy_ceiling is not None)
    ):
        act = [(i, k) for i in range(b) for k in range(t) if w[i][k] != 0]
        if act:
            hb = sum(m[i][k] * entropy[i, k] for i, k in act) / sum(m[i][k] for i, k in act)
            pen = torch.tensor(0.0, dtype=torch.float64)
            if cfg.entropy_floor is not None:
                pen = pen + torch.relu(cfg.entropy_floor - hb)
            if cfg.entropy_ceiling is not None:
                pen = pen + torch.relu(hb - cfg.entropy_ceiling)
            loss = loss + cfg.entropy_penalty_coef * pen
    return loss


def make_inputs(seed, b=6, t=5, g=3):
    gen = torch.Generator().manual_seed(seed)
    logp = -torch.rand(b, t, generator=gen, dtype=torch.float64) * 3
    old = logp + 0.3 * torch.randn(b, t, generator=gen, dtype=torch.float64)
    ref = logp + 0.2 * torch.randn(b, t, generator=gen, dtype=torch.float64)
    ent = torch.rand(b, t, generator=gen, dtype=torch.float64) * 1.4
    lengths = torch.randint(0, t + 1, (b,), generator=gen)
    lengths[0] = t
    mask = torch.arange(t).unsqueeze(0) < lengths.unsqueeze(1)
    rewards = torch.randint(0, 2, (b,), generator=gen).double()
    adv = rl.group_advantages(rewards, g)
    ids = torch.randint(1, 3, (b, t), generator=gen)
    tw, counts = rl.conflict_weights(ids, mask, adv, g)
    return logp, old, ref, ent, mask, rewards, adv, tw, counts


def cfg_cases():
    base = rl.LossConfig()
    cases = [(name, rl.preset(name)) for name in rl.PRESETS]
    cases += [
        ("dual_clip", dataclasses.replace(base, dual_clip=1.5, epsilon_low=0.05, epsilon_high=0.05)),
        ("positive_only", dataclasses.replace(base, positive_only=True)),
        ("positive_only_after_shift", dataclasses.replace(base, positive_only=True, entropy_advantage_shift=0.5)),
        ("top_entropy", dataclasses.replace(base, top_entropy_quantile=0.3)),
        ("quantile_filter", dataclasses.replace(base, entropy_filter="quantile:0.5")),
        ("adaptive_filter", dataclasses.replace(base, entropy_filter="adaptive")),
        ("coverage_filter", dataclasses.replace(base, entropy_filter="coverage")),
        ("coverage_s_grpo_afn", dataclasses.replace(rl.preset("s_grpo_afn"), entropy_filter="coverage")),
        ("ceiling", dataclasses.replace(base, entropy_floor=0.1, entropy_ceiling=0.5, entropy_penalty_coef=0.7)),
        ("bonus_token_mean", dataclasses.replace(base, entropy_coef=0.01, loss_agg="token-mean")),
        ("seq_token_sum", dataclasses.replace(base, loss_agg="seq-mean-token-sum", beta=0.1)),
        ("norm_len", dataclasses.replace(base, loss_agg="seq-mean-token-sum-norm", max_completion_length=9)),
        ("gspo_kl_dual", dataclasses.replace(rl.preset("gspo"), beta=0.05, dual_clip=2.0)),
        ("count_norm_derived", dataclasses.replace(rl.preset("gtpo_official"), loss_agg="token-mean")),
    ]
    return cases


@pytest.mark.parametrize(("name", "cfg"), cfg_cases(), ids=[c[0] for c in cfg_cases()])
@pytest.mark.parametrize("with_old", [False, True])
def test_matches_float64_reference(name, cfg, with_old):
    logp, old, ref, ent, mask, rewards, adv, tw, counts = make_inputs(zlib.crc32(name.encode()) % 1000)
    use_counts = counts if name != "count_norm_derived" else None
    kw = {
        "old_logp": old if with_old else None,
        "ref_logp": ref,
        "token_weights": tw,
        "conflict_counts": use_counts,
        "rewards": rewards,
        "group_size": 3,
        "vocab_size": 50,
    }
    lp1 = logp.clone().requires_grad_(True)
    h1 = ent.clone().requires_grad_(True)
    loss, metrics = rl.policy_loss(lp1, adv, mask, cfg, entropy=h1, **kw)
    lp2 = logp.clone().requires_grad_(True)
    h2 = ent.clone().requires_grad_(True)
    want = ref_loss(lp2, adv, mask, cfg, h2, kw["old_logp"], ref, tw, use_counts, rewards, 3, 50)
    torch.testing.assert_close(loss, want.reshape(()), rtol=1e-10, atol=1e-12)
    g1 = torch.autograd.grad(loss, (lp1, h1), allow_unused=True)
    g2 = torch.autograd.grad(want, (lp2, h2), allow_unused=True) if want.requires_grad else (None, None)
    for a_, b_ in zip(g1, g2):
        a_ = torch.zeros_like(logp) if a_ is None else a_
        b_ = torch.zeros_like(logp) if b_ is None else b_
        torch.testing.assert_close(a_, b_, rtol=1e-10, atol=1e-12)
    assert metrics["loss"] == pytest.approx(float(loss))
    assert set(metrics) >= {
        "clip_frac_low",
        "clip_frac_high",
        "ratio_mean",
        "ratio_min",
        "ratio_max",
        "entropy_mean",
        "kl",
        "zero_weight_frac",
        "filtered_frac",
        "adv_mean",
        "adv_std",
    }
    # 0-d tensors (no host sync inside the loss); metrics_to_floats converts them in one copy
    assert all(isinstance(v, torch.Tensor) and v.dim() == 0 for v in metrics.values())
    floats = rl.metrics_to_floats(metrics)
    assert list(floats) == list(metrics) and all(isinstance(v, float) for v in floats.values())
    assert floats["loss"] == pytest.approx(float(loss))


def test_known_answer_on_policy_grpo():
    # ratio = 1, no KL: loss = -mean_i A_i over non-empty completions; dloss/dlogp_it = -A_i / (n_i * n_seq)
    logp = torch.zeros(2, 3, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[True, True, False], [True, True, True]])
    adv = torch.tensor([1.0, -2.0], dtype=torch.float64)
    loss, m = rl.policy_loss(logp, adv, mask, dataclasses.replace(rl.preset("grpo"), beta=0.0))
    assert float(loss) == pytest.approx(0.5)
    loss.backward()
    want = torch.tensor([[-1 / 4, -1 / 4, 0.0], [2 / 6, 2 / 6, 2 / 6]], dtype=torch.float64)
    torch.testing.assert_close(logp.grad, want)
    assert m["ratio_mean"] == 1.0 and m["clip_frac_low"] == 0.0 and math.isnan(m["entropy_mean"])


def test_clip_and_metrics_known_answer():
    logp = torch.log(torch.tensor([[1.5, 0.5]], dtype=torch.float64)).requires_grad_(True)
    old = torch.zeros(1, 2, dtype=torch.float64)
    cfg = rl.LossConfig(epsilon_low=0.2, epsilon_high=0.28, loss_agg="token-mean")
    loss, m = rl.policy_loss(
        logp, torch.tensor([1.0], dtype=torch.float64), torch.ones(1, 2, dtype=torch.bool), cfg, old_logp=old
    )
    # token 0: ratio 1.5 clipped at 1.28 (A > 0); token 1: ratio 0.5 not clipped for A > 0
    assert float(loss) == pytest.approx(-(1.28 + 0.5) / 2)
    assert m["clip_frac_high"] == 0.5 and m["clip_frac_low"] == 0.0
    assert m["ratio_min"] == pytest.approx(0.5) and m["ratio_max"] == pytest.approx(1.5)
    loss.backward()
    assert logp.grad[0, 0] == 0.0  # clipped token: no gradient
    # dual clip caps the loss of a negative advantage at c * |A|
    cfg = rl.LossConfig(dual_clip=3.0)
    lp = torch.tensor([[math.log(10.0)]], dtype=torch.float64)
    loss, m = rl.policy_loss(
        lp,
        torch.tensor([-1.0], dtype=torch.float64),
        torch.ones(1, 1, dtype=torch.bool),
        cfg,
        old_logp=torch.zeros(1, 1, dtype=torch.float64),
    )
    assert float(loss) == pytest.approx(3.0) and m["dual_clip_frac"] == 1.0


def test_zero_upstream_gradient_for_inactive_tokens():
    logp, old, ref, ent, mask, _, adv, tw, _ = make_inputs(7, b=8, t=6, g=4)
    # poison padding with NaN / inf: must not leak into the loss or the gradient
    logp = torch.where(mask, logp, torch.tensor(float("nan"), dtype=torch.float64))
    ent = torch.where(mask, ent, torch.tensor(float("inf"), dtype=torch.float64))
    old = torch.where(mask, old, torch.tensor(float("nan"), dtype=torch.float64))
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5, 1.0, -1.0, 2.0, -2.0], dtype=torch.float64)
    tw = tw.clone()
    tw[0, 0] = 0.0
    tw[1, :2] = 0.0
    ent = ent.clone()
    ent[2] = torch.where(mask[2], torch.tensor(5.0, dtype=torch.float64), ent[2])  # filtered completion
    mask[2, :3] = True
    for cfg in (
        rl.preset("s_grpo"),
        dataclasses.replace(rl.preset("gtpo"), beta=0.1, entropy_penalty_coef=1.0, entropy_floor=2.0),
        rl.preset("gspo"),
    ):
        lp = logp.clone().requires_grad_(True)
        h = ent.clone().requires_grad_(True)
        loss, metrics = rl.policy_loss(lp, adv, mask, cfg, entropy=h, old_logp=old, ref_logp=ref, token_weights=tw)
        assert torch.isfinite(loss)
        gl, gh = torch.autograd.grad(loss, (lp, h), allow_unused=True)
        gh = torch.zeros_like(ent) if gh is None else gh
        inactive = ~mask | (tw == 0)
        if cfg.entropy_filter is not None:
            inactive = inactive.clone()
            inactive[2] = True
            assert metrics["filtered_frac"] > 0
        assert (gl[inactive] == 0).all() and (gh[inactive] == 0).all(), cfg.name
        assert torch.isfinite(gl).all() and torch.isfinite(gh).all()
        assert (gl[~inactive] != 0).any()


def test_entropy_filter_uses_detached_entropy_and_shift():
    logp = torch.zeros(2, 2, dtype=torch.float64, requires_grad=True)
    ent = torch.tensor([[0.1, 0.3], [1.0, 2.0]], dtype=torch.float64, requires_grad=True)
    cfg = rl.preset("gtpo_official")
    loss, m = rl.policy_loss(
        logp, torch.tensor([1.0, 1.0], dtype=torch.float64), torch.ones(2, 2, dtype=torch.bool), cfg, entropy=ent
    )
    # completion 0 kept (<H> = 0.2 <= 0.7), A~ = 1 - 0.1 * 0.2; completion 1 filtered; seq-sum-token-mean; no conflicts
    assert float(loss) == pytest.approx(-(1 - 0.02))
    assert m["filtered_frac"] == 0.5 and m["entropy_threshold"] == pytest.approx(0.7)
    (g,) = torch.autograd.grad(loss, (ent,), allow_unused=True)
    assert g is None or (g == 0).all()  # filter and shift carry no entropy gradient


def test_adaptive_threshold_values():
    r = torch.tensor([0.0, 0.0, 0.0, 0.0])
    assert rl.adaptive_entropy_threshold(r, 1, 1000) == pytest.approx(math.log(2))
    r = torch.tensor([1.0, 0.0, 1.0, 0.0])
    thr = rl.adaptive_entropy_threshold(r, 2, 1000)
    assert thr == pytest.approx(math.log(1 + 2 * (1 + math.log(2) / math.log(1000))))
    assert rl.adaptive_entropy_threshold(torch.tensor([1.0, 0.0]), 2, 2) <= math.log(2) + 1e-12


def test_coverage_threshold_hand_computed():
    """H_thr = min(ln max(n_eff, 1), ln |V|), n_eff = (sum |r - mean|)^2 / sum (r - mean)^2 (binary: 4 G Var[r])."""
    v = 1000

    def thr(rewards, g, vocab=v):
        out = rl.coverage_entropy_threshold(torch.tensor(rewards, dtype=torch.float64), g, vocab)
        assert out.shape == (len(rewards),) and out.dtype == torch.float64
        return out.tolist()

    # G = 2, one success: n_eff = 1 / 0.5 = 2 -> ln 2 (GTPO's threshold); equal rewards: Var = 0 -> 0
    assert thr([1.0, 0.0, 1.0, 1.0], 2) == pytest.approx([math.log(2)] * 2 + [0.0] * 2, abs=1e-15)
    # G = 4, one success: deviations 0.75, -0.25 x 3 -> (1.5)^2 / 0.75 = 3 = 4 * 4 * (3/16) -> ln 3
    assert thr([0.0, 1.0, 0.0, 0.0], 4) == pytest.approx([math.log(3)] * 4)
    # G = 8, half: n_eff = 8 -> ln 8; a tiny vocabulary caps it at ln |V| (then nothing is filtered)
    half = [1.0, 0.0] * 4
    assert thr(half, 8) == pytest.approx([math.log(8)] * 8)
    assert thr(half, 8, 5) == pytest.approx([math.log(5)] * 8)
    assert thr(half, 8, 2) == pytest.approx([math.log(2)] * 8)
    # G = 1: no spread -> 0; continuous rewards [0, 1, 3]: mean 4/3, |d| = 4/3, 1/3, 5/3 -> (10/3)^2 / (42/9) = 100/42
    assert thr([0.7, 0.2], 1) == [0.0, 0.0]
    assert thr([0.0, 1.0, 3.0], 3) == pytest.approx([math.log(100 / 42)] * 3)
    # scale-free and shift-free (GRPO normalizes by the std), huge rewards do not overflow; NaN / inf rewards left out
    assert thr([1e300, -1e300, 5e299], 3) == pytest.approx(thr([1.0, -1.0, 0.5], 3))
    assert thr([1.0, float("nan"), 0.0, float("inf")], 4) == pytest.approx([math.log(2)] * 4)
    # float32 in, float32 out; the same numbers
    out32 = rl.coverage_entropy_threshold(torch.tensor([0.0, 1.0, 0.0, 0.0]), 4, v)
    assert out32.dtype == torch.float32 and out32.tolist() == pytest.approx([math.log(3)] * 4, rel=1e-6)


def test_coverage_filter_in_the_loss_per_group():
    # two groups of G = 2: group 0 mixed (threshold ln 2), group 1 all fail (threshold 0)
    logp = torch.zeros(4, 2, dtype=torch.float64, requires_grad=True)
    ent = torch.tensor([[0.5, 0.5], [1.0, 1.0], [0.0, 0.0], [0.2, 0.2]], dtype=torch.float64)
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=torch.float64)
    cfg = rl.LossConfig(entropy_filter="coverage")
    adv = rl.group_advantages(rewards, 2)
    loss, m = rl.policy_loss(logp, adv, torch.ones(4, 2, dtype=torch.bool), cfg, entropy=ent, rewards=rewards,
                             group_size=2, vocab_size=100)  # fmt: skip
    # kept: row 0 (0.5 <= ln 2) and row 2 (0 <= 0); filtered: row 1 (1.0 > ln 2) and row 3 (0.2 > 0)
    assert m["filtered_frac"] == 0.5
    assert float(m["entropy_threshold"]) == pytest.approx(math.log(2) / 2)  # mean of ln 2, ln 2, 0, 0
    assert float(loss) == pytest.approx(-float(adv[0]) / 4)  # seq-mean-token-mean over 4 non-empty completions
    (g,) = torch.autograd.grad(loss, logp)
    assert (g[1] == 0).all() and (g[3] == 0).all() and (g[0] != 0).all()


@pytest.mark.parametrize(
    ("call", "exc", "words"),
    [
        (lambda: rl.coverage_entropy_threshold(torch.zeros(4), 3, 10), ValueError, ["rewards", "group_size = 3"]),
        (lambda: rl.coverage_entropy_threshold(torch.zeros(4), 0, 10), ValueError, ["group_size", "0"]),
        (lambda: rl.coverage_entropy_threshold(torch.zeros(4), 2.0, 10), TypeError, ["group_size"]),
        (lambda: rl.coverage_entropy_threshold(torch.zeros(4), 2, 1), ValueError, ["vocab_size", ">= 2", "1"]),
        (lambda: rl.coverage_entropy_threshold(torch.zeros(4), 2, True), TypeError, ["vocab_size", "bool"]),
        (lambda: rl.coverage_entropy_threshold(torch.zeros(4), 2, 10.0), TypeError, ["vocab_size", "float"]),
        (lambda: rl.coverage_entropy_threshold(torch.zeros(2, 2), 2, 10), ValueError, ["rewards", "1-D", "(2, 2)"]),
        (lambda: rl.coverage_entropy_threshold(torch.zeros(4, dtype=torch.int64), 2, 10), TypeError, ["rewards"]),
        (lambda: rl.coverage_entropy_threshold([0.0, 1.0], 2, 10), TypeError, ["rewards", "list"]),
        (
            lambda: rl.policy_loss(torch.zeros(4, 2), torch.zeros(4), torch.ones(4, 2), rl.LossConfig(
                entropy_filter="coverage"), entropy=torch.zeros(4, 2), rewards=torch.zeros(2), group_size=2,
                vocab_size=10),
            ValueError,
            ["rewards has shape (2,)", "(4,)"],
        ),
        (
            lambda: rl.policy_loss(torch.zeros(4, 2), torch.zeros(4), torch.ones(4, 2), rl.LossConfig(
                entropy_filter="coverage"), entropy=torch.zeros(4, 2), rewards=torch.zeros(4), group_size=2),
            ValueError,
            ["coverage", "vocab_size"],
        ),
    ],
)
def test_coverage_bad_inputs(call, exc, words):
    assert_refused(call, exc, words)


def test_presets_and_config():
    for name in rl.PRESETS:
        cfg = rl.preset(name)
        assert cfg.name == name and isinstance(cfg, rl.LossConfig)
    assert rl.preset("grpo").beta == 0.04 and rl.preset("grpo").needs_ref
    assert rl.preset("dapo").epsilon_high == 0.28 and rl.preset("dapo").loss_agg == "token-mean"
    assert rl.preset("gspo").importance_level == "sequence"
    assert rl.preset("gtpo").conflict_strategy == "gtpo" and rl.preset("gtpo").beta == 0.0
    assert not rl.preset("gtpo").conflict_count_norm and rl.preset("gtpo_official").conflict_count_norm
    s = rl.preset("s_grpo")
    assert s.beta == 0 and s.entropy_filter == "ln2" and s.entropy_floor is not None and s.conflict_strategy
    assert rl.preset("grpo_ef").conflict_strategy is None and rl.preset("grpo_ef").entropy_floor is not None
    assert rl.preset("grpo_tc").conflict_strategy == "gtpo" and rl.preset("grpo_tc").entropy_floor is None
    assert rl.preset("lite_ppo").advantage_method == "lite_ppo"
    cfg = dataclasses.replace(rl.preset("grpo"), beta=0.0)
    assert cfg.beta == 0.0 and rl.preset("grpo").beta == 0.04
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.beta = 1.0  # type: ignore[misc]
    # end to end through the config helpers
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0])
    adv = rl.preset("gtpo").advantages(rewards, 2)
    w, n = rl.preset("gtpo").conflict_weights(
        torch.tensor([[1, 2], [1, 3], [4, 4], [4, 5]]), torch.ones(4, 2, dtype=torch.bool), adv, 2
    )
    assert w[0, 0] == 2.0 and w[0, 1] == 1.0 and w[1, 0] == 0.0 and n.tolist() == [1, 1, 1, 1]
    assert rl.preset("grpo").conflict_weights(torch.ones(2, 2, dtype=torch.long), torch.ones(2, 2), adv[:2], 2) == (
        None,
        None,
    )


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"beta": -1.0}, ["beta"]),
        ({"epsilon_low": 1.0}, ["epsilon_low"]),
        ({"dual_clip": 1.0}, ["dual_clip"]),
        ({"importance_level": "seq"}, ["importance_level", "seq"]),
        ({"loss_agg": "mean"}, ["loss_agg", "mean"]),
        ({"advantage_method": "ppo"}, ["advantage_method", "ppo"]),
        ({"conflict_strategy": "counterfactual"}, ["conflict_strategy", "counterfactual", "causal"]),
        ({"conflict_detect": "middle"}, ["conflict_detect", "middle", "anywhere"]),
        ({"entropy_filter": "function"}, ["entropy_filter", "function", "coverage"]),
        ({"entropy_filter": "ln3"}, ["entropy_filter", "ln3"]),
        ({"entropy_filter": "quantile:2"}, ["entropy_filter", "quantile"]),
        ({"entropy_floor": 1.0, "entropy_ceiling": 0.5}, ["entropy_floor", "entropy_ceiling"]),
        ({"top_entropy_quantile": 0.0}, ["top_entropy_quantile"]),
        ({"max_completion_length": 0}, ["max_completion_length"]),
    ],
)
def test_bad_config(kwargs, words):
    with pytest.raises((ValueError, TypeError)) as info:
        rl.LossConfig(**kwargs)
    for w in words:
        assert w in str(info.value)


def test_bad_preset_and_inputs():
    with pytest.raises(ValueError, match="unknown preset 'ppo'"):
        rl.preset("ppo")
    cfg = rl.LossConfig()
    lp, mk, a = torch.zeros(4, 3), torch.ones(4, 3, dtype=torch.bool), torch.zeros(4)
    cases = [
        (lambda: rl.policy_loss(lp, a, torch.full((4, 3), 3, dtype=torch.int64), cfg), ValueError, "mask"),
        (lambda: rl.policy_loss(lp, a, torch.ones(4, 3, dtype=torch.complex64), cfg), TypeError, "mask"),
        (lambda: rl.policy_loss(lp, a, torch.ones(4, 2, dtype=torch.bool), cfg), ValueError, "mask has shape (4, 2)"),
        (lambda: rl.policy_loss(lp, torch.zeros(3), mk, cfg), ValueError, "advantages has shape (3,)"),
        (lambda: rl.policy_loss(lp[0], a, mk, cfg), ValueError, "logp"),
        (lambda: rl.policy_loss(lp, a, mk, cfg, old_logp=torch.zeros(4, 2)), ValueError, "old_logp"),
        (lambda: rl.policy_loss(lp, a, mk, cfg, token_weights=torch.zeros(3, 3)), ValueError, "token_weights"),
        (lambda: rl.policy_loss(lp, a, mk, rl.preset("grpo")), ValueError, "ref_logp"),
        (lambda: rl.policy_loss(lp, a, mk, rl.preset("s_grpo")), ValueError, "entropy"),
        (lambda: rl.policy_loss(lp, a, mk, {"beta": 0}), TypeError, "config"),
        (
            lambda: rl.policy_loss(
                lp, a, mk, dataclasses.replace(cfg, entropy_filter="adaptive"), entropy=torch.zeros(4, 3)
            ),
            ValueError,
            "group_size",
        ),
    ]
    for call, exc, word in cases:
        assert_refused(call, exc, word)


def test_empty_and_all_masked():
    lp = torch.zeros(2, 3, requires_grad=True)
    loss, m = rl.policy_loss(lp, torch.ones(2), torch.zeros(2, 3, dtype=torch.bool), rl.LossConfig())
    assert float(loss) == 0.0
    loss.backward()
    assert (lp.grad == 0).all()
    assert math.isnan(m["ratio_mean"])


def test_positive_only_holds_after_the_entropy_shift():
    """A = [-1, 0] shifted by -0.5 <H> must still be clamped to 0: no negative advantage, no gradient."""
    logp = torch.zeros(2, 3, dtype=torch.float64, requires_grad=True)
    ent = torch.ones(2, 3, dtype=torch.float64)
    cfg = dataclasses.replace(rl.LossConfig(), positive_only=True, entropy_advantage_shift=0.5)
    loss, _ = rl.policy_loss(logp, torch.tensor([-1.0, 0.0], dtype=torch.float64), torch.ones(2, 3), cfg, entropy=ent)
    (g,) = torch.autograd.grad(loss, logp)
    assert (g == 0).all()


def test_entropy_bonus_denominator_counts_inactive_valid_tokens():
    """The bonus sums H over active tokens but divides like the policy term (valid tokens): 2 active of 4 valid
    tokens with H = 1 give agg = 0.5, and the zero-weight tokens get no entropy gradient."""
    ent = torch.ones(1, 4, requires_grad=True)
    loss, metrics = rl.policy_loss(torch.zeros(1, 4, requires_grad=True), torch.tensor([1.0]),
                                   torch.ones(1, 4, dtype=torch.bool), rl.LossConfig(entropy_coef=1.0),
                                   entropy=ent, token_weights=torch.tensor([[1.0, 1.0, 0.0, 0.0]]))
    assert float(metrics["entropy_loss"]) == pytest.approx(-0.5)
    loss.backward()
    assert ent.grad[0, 2:].eq(0).all() and ent.grad[0, :2].ne(0).all()


@pytest.mark.parametrize("counts, exc, match", [
    ([1.0, 2.0], TypeError, "conflict_counts must be a torch.Tensor, got list"),
    (torch.ones(3), ValueError, r"conflict_counts has shape \(3,\), expected \(2,\)"),
])
def test_conflict_counts_checked(counts, exc, match):
    with pytest.raises(exc, match=match):
        rl.policy_loss(torch.zeros(2, 3), torch.ones(2), torch.ones(2, 3, dtype=torch.bool),
                       rl.LossConfig(conflict_count_norm=True), conflict_counts=counts)


@pytest.mark.parametrize("name", [*rl.PRESETS, "s_grpo+coverage"])
def test_policy_loss_makes_no_host_sync(name):
    # The metrics are 0-d tensors: the loss never waits for the device (the trainer syncs once per step). On the meta
    # device any device-to-host copy (.item(), .tolist(), bool(t)) raises, so the whole loss running there proves it.
    inputs = make_inputs(3)
    logp, old, ref, ent, mask, rewards, adv, tw, counts = (t.to("meta") for t in inputs)
    cfg = rl.preset_with("s_grpo", "entropy_filter=coverage") if name == "s_grpo+coverage" else rl.preset(name)
    loss, metrics = rl.policy_loss(logp.requires_grad_(True), adv, mask, cfg, entropy=ent, old_logp=old, ref_logp=ref,
                                   token_weights=tw, conflict_counts=counts, rewards=rewards, group_size=3,
                                   vocab_size=50)
    assert loss.device.type == "meta" and loss.dim() == 0
    assert all(v.device.type == "meta" and v.dim() == 0 for v in metrics.values())
    loss.backward()
    with pytest.raises((RuntimeError, NotImplementedError)):
        rl.metrics_to_floats(metrics)  # the one copy, left to the caller
