"""group_advantages against an independent float64 loop implementation, over hypothesis-drawn group structures."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from conftest import assert_refused
from hypothesis import given, settings
from hypothesis import strategies as st

from sgrpo_kernels import rl

NAN = float("nan")


def _std(xs: list[float], unbiased: bool = True) -> float:
    n = len(xs)
    d = n - 1 if unbiased else n
    if d <= 0:
        return 0.0
    mu = math.fsum(xs) / n
    return math.sqrt(sum((x - mu) ** 2 for x in xs) / d)


def ref_advantages(rewards: list[float], g: int, method: str, **o) -> list[float]:
    """Loop float64 reference: one group at a time, NaN rewards left out and given 0 (fsum: exact means, so a
    constant group's advantages are exactly 0 here too)."""
    eps = o.get("eps")
    r_min, r_max = o.get("r_min", 0.0), o.get("r_max", 1.0)
    all_valid = [x for x in rewards if not math.isnan(x)]
    out: list[float] = []
    for start in range(0, len(rewards), g):
        grp = rewards[start : start + g]
        vals = [x for x in grp if not math.isnan(x)]
        n = len(vals)
        mu = math.fsum(vals) / n if n else 0.0
        base = o.get("base", "grpo") if method == "all_fail_negative" else method
        for x in grp:
            if math.isnan(x):
                out.append(0.0)
                continue
            if base == "grpo":
                a = (x - mu) / (_std(vals) + (1e-4 if eps is None else eps))
            elif base == "dr_grpo":
                a = x - mu
            elif base == "rloo":
                a = x - (math.fsum(vals) - x) / (n - 1) if n > 1 else 0.0
            elif base == "lite_ppo":
                a = (x - mu) / (_std(all_valid) + (1e-4 if eps is None else eps))
            elif base == "ngrpo":
                k = o.get("k", 1)
                aug = vals + [r_max] * k
                mu2 = math.fsum(aug) / len(aug)
                a = (x - mu2) / (_std(aug) + (1e-6 if eps is None else eps))
            else:
                raise AssertionError(base)
            if method == "all_fail_negative" and n > 0 and all(v <= r_min for v in vals):
                a = -o.get("c", 1.0)
            if o.get("positive_only", False):
                a = max(a, 0.0)
            out.append(a)
    return out


KINDS = ("random", "binary", "all_equal", "one_success", "all_fail", "all_pass", "nan_mix", "all_nan")


@st.composite
def group_batches(draw):
    g = draw(st.sampled_from([1, 2, 3, 5, 8, 64]))
    n_groups = draw(st.integers(1, 3))
    rewards: list[float] = []
    for _ in range(n_groups):
        kind = draw(st.sampled_from(KINDS))
        if kind == "random":
            grp = draw(st.lists(st.floats(-3, 3, allow_nan=False), min_size=g, max_size=g))
        elif kind == "binary":
            grp = [float(v) for v in draw(st.lists(st.integers(0, 1), min_size=g, max_size=g))]
        elif kind == "all_equal":
            grp = [draw(st.floats(-2, 2, allow_nan=False))] * g
        elif kind == "one_success":
            i = draw(st.integers(0, g - 1))
            grp = [1.0 if j == i else 0.0 for j in range(g)]
        elif kind == "all_fail":
            grp = [0.0] * g
        elif kind == "all_pass":
            grp = [1.0] * g
        elif kind == "nan_mix":
            grp = [NAN if draw(st.booleans()) else float(draw(st.integers(0, 1))) for _ in range(g)]
        else:
            grp = [NAN] * g
        rewards += grp
    return g, rewards


METHOD_CASES = [
    ("grpo", {}),
    ("grpo", {"eps": 1e-6}),
    ("dr_grpo", {}),
    ("rloo", {}),
    ("lite_ppo", {}),
    ("ngrpo", {}),
    ("ngrpo", {"k": 2, "r_max": 2.0}),
    ("all_fail_negative", {}),
    ("all_fail_negative", {"c": 0.5, "base": "dr_grpo"}),
    ("grpo", {"positive_only": True}),
    ("rloo", {"positive_only": True}),
]


@settings(max_examples=40, deadline=None)
@given(group_batches())
def test_methods_match_float64_reference(batch):
    g, rewards = batch
    r = torch.tensor(rewards, dtype=torch.float64)
    for method, opts in METHOD_CASES:
        got = rl.group_advantages(r, g, method, **opts)
        want = torch.tensor(ref_advantages(rewards, g, method, **opts), dtype=torch.float64)
        assert got.dtype == torch.float64
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9, msg=f"{method} {opts}")
        assert torch.isfinite(got).all()


@settings(max_examples=30, deadline=None)
@given(group_batches())
def test_stats_and_invariants(batch):
    g, rewards = batch
    r = torch.tensor(rewards, dtype=torch.float64)
    adv, stats = rl.group_advantages(r, g, "grpo", return_stats=True)
    groups = [rewards[i : i + g] for i in range(0, len(rewards), g)]
    valid = [[x for x in grp if not math.isnan(x)] for grp in groups]
    zero_var = sum(1 for v in valid if len(v) < 2 or max(v) == min(v)) / len(groups)
    all_pass = sum(1 for v in valid if v and all(x >= 1.0 for x in v)) / len(groups)
    all_fail = sum(1 for v in valid if v and all(x <= 0.0 for x in v)) / len(groups)
    assert stats["zero_variance_frac"] == pytest.approx(zero_var)
    assert stats["all_pass_frac"] == pytest.approx(all_pass)
    assert stats["all_fail_frac"] == pytest.approx(all_fail)
    assert stats["nan_frac"] == pytest.approx(sum(math.isnan(x) for x in rewards) / len(rewards))
    assert stats["num_groups"] == len(groups)
    # NaN rewards get exactly 0; zero-variance groups get exactly 0 (grpo, dr_grpo, rloo)
    nan_pos = torch.isnan(r)
    assert (adv[nan_pos] == 0).all()
    for method in ("grpo", "dr_grpo", "rloo"):
        a = rl.group_advantages(r, g, method).reshape(-1, g)
        for gi, v in enumerate(valid):
            if len(v) < 2 or max(v) == min(v):
                assert (a[gi] == 0).all(), (method, groups[gi])
    # Dr. GRPO advantages sum to zero within each group
    a = rl.group_advantages(r, g, "dr_grpo").reshape(-1, g)
    assert torch.allclose(a.sum(dim=1), torch.zeros(a.shape[0], dtype=torch.float64), atol=1e-9)


def test_known_values():
    r = torch.tensor([1.0, 0.0, 0.0, 0.0])
    a = rl.group_advantages(r, 4, "grpo", eps=0.0)
    std = math.sqrt(((0.75**2) + 3 * 0.25**2) / 3)
    torch.testing.assert_close(a, torch.tensor([0.75, -0.25, -0.25, -0.25]) / std)
    torch.testing.assert_close(rl.group_advantages(r, 4, "rloo"), torch.tensor([1.0, -1 / 3, -1 / 3, -1 / 3]))
    # rloo = dr_grpo * G / (G - 1)
    torch.testing.assert_close(rl.group_advantages(r, 4, "rloo"), rl.group_advantages(r, 4, "dr_grpo") * 4 / 3)
    fail = torch.zeros(4)
    torch.testing.assert_close(rl.group_advantages(fail, 4, "all_fail_negative", c=0.3), torch.full((4,), -0.3))
    ng = rl.group_advantages(fail, 4, "ngrpo", eps=0.0)  # virtual success: mean 0.2, std sqrt(0.2)
    torch.testing.assert_close(ng, torch.full((4,), -0.2 / math.sqrt(0.2)))
    assert (rl.group_advantages(torch.tensor([1.0, 0.0]), 2, "grpo", positive_only=True) >= 0).all()
    # integer and bool rewards are accepted
    torch.testing.assert_close(rl.group_advantages(torch.tensor([1, 0]), 2, "dr_grpo"), torch.tensor([0.5, -0.5]))
    torch.testing.assert_close(
        rl.group_advantages(torch.tensor([True, False]), 2, "dr_grpo"), torch.tensor([0.5, -0.5])
    )


def test_lite_ppo_uses_batch_std():
    r = torch.tensor([1.0, 0.0, 5.0, 3.0], dtype=torch.float64)
    a = rl.group_advantages(r, 2, "lite_ppo", eps=0.0)
    bstd = r.std()
    torch.testing.assert_close(a, torch.tensor([0.5, -0.5, 1.0, -1.0], dtype=torch.float64) / bstd)


@pytest.mark.parametrize(
    ("call", "exc", "words"),
    [
        (lambda: rl.group_advantages(torch.zeros(6), 4), ValueError, ["rewards", "6", "group_size = 4"]),
        (lambda: rl.group_advantages(torch.zeros(2, 2), 2), ValueError, ["rewards", "(2, 2)"]),
        (lambda: rl.group_advantages([0.0, 1.0], 2), TypeError, ["rewards"]),
        (lambda: rl.group_advantages(torch.zeros(4), 2, "ppo"), ValueError, ["method", "ppo"]),
        (lambda: rl.group_advantages(torch.zeros(4), 2, 3), TypeError, ["method"]),
        (lambda: rl.group_advantages(torch.zeros(4), 0), ValueError, ["group_size"]),
        (lambda: rl.group_advantages(torch.zeros(4), 2.0), TypeError, ["group_size"]),
        (lambda: rl.group_advantages(torch.zeros(4), 2, "dr_grpo", eps=1e-4), TypeError, ["eps", "dr_grpo"]),
        (lambda: rl.group_advantages(torch.zeros(4), 2, "grpo", eps=-1.0), ValueError, ["eps"]),
        (lambda: rl.group_advantages(torch.zeros(4), 2, "all_fail_negative", base="x"), ValueError, ["base"]),
        (lambda: rl.group_advantages(torch.zeros(4), 2, positive_only=1), TypeError, ["positive_only"]),
    ],
)
def test_bad_inputs(call, exc, words):
    assert_refused(call, exc, words)


def test_eps_zero_gives_zero_not_nan_for_constant_groups():
    r = torch.tensor([1.0, 1.0, 0.0, 1.0], dtype=torch.float64)
    for method in ("grpo", "lite_ppo", "ngrpo"):
        opts = {"eps": 0.0} if method != "ngrpo" else {"eps": 0.0, "k": 0}
        a = rl.group_advantages(r if method != "lite_ppo" else torch.ones(4, dtype=torch.float64), 2, method, **opts)
        assert torch.isfinite(a).all(), (method, a)
    a = rl.group_advantages(r, 2, "grpo", eps=0.0)
    assert a[0] == 0 and a[1] == 0 and a[2] < 0 < a[3]


def test_all_fail_negative_accepts_base_options():
    r = torch.tensor([0.0, 0.0, 0.0, 1.0], dtype=torch.float64)
    a = rl.group_advantages(r, 2, "all_fail_negative", base="ngrpo", k=2, c=0.5)
    assert torch.equal(a[:2], torch.full((2,), -0.5, dtype=torch.float64))
    b = rl.group_advantages(r, 2, "ngrpo", k=2)
    torch.testing.assert_close(a[2:], b[2:])


def test_s_grpo_afn_preset_hand_computed():
    """s_grpo_afn: GRPO advantages, except that a group whose rewards are all <= r_min = 0 gets A = -c (c = 1)."""
    cfg = rl.preset("s_grpo_afn")
    assert (cfg.advantage_method, cfg.all_fail_c, cfg.positive_only, cfg.beta) == ("all_fail_negative", 1.0, False, 0.0)
    # everything else is s_grpo's
    assert dataclasses.replace(cfg, name="s_grpo", advantage_method="grpo", all_fail_c=None) == rl.preset("s_grpo")
    r = torch.tensor([0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 1.0, 1.0], dtype=torch.float64)
    std = math.sqrt((3 * 0.25**2 + 0.75**2) / 3)  # group 2: mean 0.75, Bessel std
    grpo2 = [0.25 / (std + 1e-4), -0.75 / (std + 1e-4), 0.25 / (std + 1e-4), 0.25 / (std + 1e-4)]
    torch.testing.assert_close(cfg.advantages(r, 4), torch.tensor([-1.0] * 4 + grpo2, dtype=torch.float64))
    # c from the LossConfig field, also through the trainer's --loss spelling
    half = rl.preset_with("s_grpo_afn", "all_fail_c=0.25")
    torch.testing.assert_close(half.advantages(r, 4), torch.tensor([-0.25] * 4 + grpo2, dtype=torch.float64))
    # the stats see the all-fail group
    _, stats = cfg.advantages(r, 4, return_stats=True)
    assert float(stats["all_fail_frac"]) == 0.5
    # and prepare_groups passes it on
    ids = torch.arange(16).reshape(8, 2)
    groups = rl.prepare_groups(half, r, ids, torch.ones(8, 2, dtype=torch.bool), 4)
    assert groups.advantages[:4].tolist() == [-0.25] * 4


@pytest.mark.parametrize(
    ("changes", "exc", "words"),
    [
        ({"all_fail_c": -1.0}, ValueError, ["LossConfig.all_fail_c", "> 0", "-1.0"]),
        ({"all_fail_c": 0}, ValueError, ["LossConfig.all_fail_c", "> 0", "got 0"]),
        ({"all_fail_c": math.inf}, ValueError, ["LossConfig.all_fail_c", "finite", "inf"]),
        ({"all_fail_c": math.nan}, ValueError, ["LossConfig.all_fail_c", "nan"]),
        ({"all_fail_c": True}, TypeError, ["LossConfig.all_fail_c", "bool"]),
        ({"all_fail_c": "1"}, TypeError, ["LossConfig.all_fail_c", "str"]),
        ({"advantage_method": "grpo"}, ValueError, ["all_fail_c=1.0", "all_fail_negative", "'grpo'"]),
        ({"advantage_options": {"c": 2.0}}, ValueError, ["all_fail_c=1.0", "advantage_options['c']=2.0"]),
        ({"positive_only": True}, ValueError, ["positive_only", "all_fail_negative", "clamped"]),
        ({"all_fail_c": None, "advantage_options": {"positive_only": True}}, ValueError, ["positive_only"]),
    ],
)
def test_s_grpo_afn_bad_settings_are_refused_by_name(changes, exc, words):
    with pytest.raises(exc) as info:
        dataclasses.replace(rl.preset("s_grpo_afn"), **changes)
    for w in words:
        assert w in str(info.value)
    # without the field, the method's own option still works (one place sets c)
    cfg = dataclasses.replace(rl.preset("s_grpo_afn"), all_fail_c=None, advantage_options={"c": 2.0})
    assert cfg.advantages(torch.zeros(2), 2).tolist() == [-2.0, -2.0]
