"""The RL layer under hostile values (issue 11, item 3): NaN / inf where no gradient may flow, non-finite and huge
rewards, NaN entropies under the quantile filter, bad masks and options refused early, empty batches."""

from __future__ import annotations

import math

import pytest
import torch

from sgrpo_kernels import rl, sgrpo_loss

PRESETS = list(rl.PRESETS)


def _loss_inputs(b=4, t=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(b, t, generator=g, dtype=torch.float64) * 2
    ent = torch.rand(b, t, generator=g, dtype=torch.float64) * 0.5  # below ln 2: no completion filtered
    ref = logp + 0.1 * torch.randn(b, t, generator=g, dtype=torch.float64)
    return logp, ent, ref


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("name", PRESETS)
def test_non_finite_advantage_on_a_zero_weight_completion_gives_zero_gradient(name, bad):
    # before: a finite loss and NaN gradients in row 0 (0 * NaN through the clipped surrogate's backward)
    logp, ent, ref = _loss_inputs()
    adv = torch.tensor([bad, 1.0, -1.0, 0.5], dtype=torch.float64)
    weights = torch.ones(4, 3, dtype=torch.float64)
    weights[0] = 0.0
    lp, h = logp.clone().requires_grad_(True), ent.clone().requires_grad_(True)
    loss, _ = rl.policy_loss(lp, adv, torch.ones(4, 3, dtype=torch.bool), rl.preset(name), entropy=h, ref_logp=ref,
                             token_weights=weights)
    loss.backward()
    assert torch.isfinite(loss)
    assert torch.equal(lp.grad[0], torch.zeros(3, dtype=torch.float64))
    if h.grad is not None:  # presets without entropy terms leave the entropy out of the graph
        assert torch.equal(h.grad[0], torch.zeros(3, dtype=torch.float64)) and torch.isfinite(h.grad).all()
    assert torch.isfinite(lp.grad).all() and lp.grad[1:].abs().sum() > 0


@pytest.mark.parametrize("name", ["gtpo", "s_grpo", "gtpo_official"])
def test_nan_advantage_on_an_entropy_filtered_completion_gives_zero_gradient(name):
    logp, ent, ref = _loss_inputs()
    ent[0] = 5.0  # completion 0 is above every preset's threshold: filtered
    adv = torch.tensor([math.nan, 1.0, -1.0, 0.5], dtype=torch.float64)
    lp = logp.clone().requires_grad_(True)
    loss, m = rl.policy_loss(lp, adv, torch.ones(4, 3, dtype=torch.bool), rl.preset(name), entropy=ent)
    loss.backward()
    assert float(m["filtered_frac"]) == 0.25
    assert torch.isfinite(loss) and torch.equal(lp.grad[0], torch.zeros(3, dtype=torch.float64))
    assert torch.isfinite(lp.grad).all()


def test_nan_old_and_ref_logp_under_zero_weight_give_zero_gradient():
    logp, ent, ref = _loss_inputs()
    old = logp.detach() + 0.05
    old[0, 1], ref[0, 1] = math.nan, math.inf
    weights = torch.ones(4, 3, dtype=torch.float64)
    weights[0, 1] = 0.0
    lp = logp.clone().requires_grad_(True)
    cfg = rl.preset("grpo")  # k3 to the reference and a token ratio against old_logp
    loss, _ = rl.policy_loss(lp, torch.tensor([1.0, -1.0, 0.5, -0.5], dtype=torch.float64),
                             torch.ones(4, 3, dtype=torch.bool), cfg, old_logp=old, ref_logp=ref, token_weights=weights)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(lp.grad).all() and lp.grad[0, 1] == 0


@pytest.mark.parametrize("method", ["grpo", "dr_grpo", "rloo", "lite_ppo", "ngrpo"])
@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan])
def test_non_finite_reward_is_left_out(method, bad):
    # before: dr_grpo / rloo gave [-inf, nan] and lite_ppo zeroed the whole batch
    r = torch.tensor([bad, 1.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.0])
    adv, stats = rl.group_advantages(r, 4, method, return_stats=True)
    assert torch.isfinite(adv).all() and adv[0] == 0
    if method != "lite_ppo":  # (lite_ppo divides by the batch std, which spans both groups)
        want = rl.group_advantages(r[1:4], 3, method)  # the group without the unscorable reward
        torch.testing.assert_close(adv[1:4], want)
    assert adv[4:].abs().sum() > 0  # the other group still learns
    assert float(stats["nan_frac"]) == 1 / 8 and math.isfinite(float(stats["reward_std"]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("method", ["grpo", "lite_ppo", "ngrpo", "rloo", "dr_grpo"])
def test_huge_rewards_do_not_overflow(method, dtype):
    r = torch.tensor([1.0, 0.0, 0.25, 1.0, -1.0, 0.5, 0.5, 0.0], dtype=dtype)
    scale = 2.0**100  # 1.3e30: its square overflows float32
    opts = {"eps": 0.0} if method in ("grpo", "lite_ppo", "ngrpo") else {}
    if method == "ngrpo":
        opts["r_max"] = scale  # the virtual sample scales with the rewards
    big, stats = rl.group_advantages(r * scale, 4, method, return_stats=True, **opts)
    if method == "ngrpo":
        opts["r_max"] = 1.0
    small = rl.group_advantages(r, 4, method, **opts)
    assert torch.isfinite(big).all() and math.isfinite(float(stats["reward_std"]))
    if method in ("rloo", "dr_grpo"):  # advantages in reward units
        torch.testing.assert_close(big, small * scale)
    else:  # scale-free
        torch.testing.assert_close(big, small)


def test_huge_rewards_1e30():
    r = torch.tensor([1e30, -1e30, 5e29, 0.0])
    adv = rl.group_advantages(r, 4, "grpo")
    want = rl.group_advantages(r.double() / 1e30, 4, "grpo", eps=0.0).float()
    torch.testing.assert_close(adv, want)


@pytest.mark.parametrize("dtype, top", [(torch.float32, 1.8e38), (torch.float32, 3.4e38), (torch.float64, 1e308)])
@pytest.mark.parametrize("method", ["grpo", "lite_ppo", "rloo", "dr_grpo"])
def test_rewards_near_the_dtypes_max_do_not_overflow(method, dtype, top):
    # at or past 2^127 (float32) the scale itself was inf: grpo gave all-zero advantages, dr_grpo all NaN
    r = torch.tensor([1.0, 0.5, 0.0, 0.25], dtype=torch.float64) * top  # (r - mean itself stays finite)
    opts = {} if method in ("rloo", "dr_grpo") else {"eps": 0.0}
    adv = rl.group_advantages(r.to(dtype), 4, method, **opts)
    want = rl.group_advantages(r / top, 4, method, **opts).to(dtype)  # scale-free methods; in reward units below
    if method in ("rloo", "dr_grpo"):
        want = (rl.group_advantages(r / top, 4, method) * top).to(dtype)
    assert torch.isfinite(adv).all()
    torch.testing.assert_close(adv, want, rtol=1e-6, atol=0)


def test_nan_entropy_under_the_quantile_filter_filters_only_that_completion():
    # before: the quantile was NaN, so every completion was filtered and the loss was silently 0
    logp, ent, _ = _loss_inputs(b=8)
    ent[2] = math.nan
    cfg = rl.LossConfig(entropy_filter="quantile:0.75")
    lp = logp.clone().requires_grad_(True)
    loss, m = rl.policy_loss(lp, torch.linspace(-1, 1, 8, dtype=torch.float64), torch.ones(8, 3, dtype=torch.bool),
                             cfg, entropy=ent)
    loss.backward()
    assert math.isfinite(float(m["entropy_threshold"]))
    assert 0 < float(m["filtered_frac"]) < 1 and torch.equal(lp.grad[2], torch.zeros(3, dtype=torch.float64))
    assert torch.isfinite(lp.grad).all() and lp.grad.abs().sum() > 0


@pytest.mark.parametrize("value", [-1.0, math.nan, math.inf])
def test_bad_float_mask_values_are_refused(value):
    logp, ent, _ = _loss_inputs()
    mask = torch.ones(4, 3, dtype=torch.float64)
    mask[1, 2] = value
    with pytest.raises(ValueError, match="mask must hold finite weights >= 0"):
        rl.policy_loss(logp, torch.ones(4, dtype=torch.float64), mask, rl.preset("dapo"))
    h, w = torch.randn(4, 3, 8), torch.randn(11, 8)
    with pytest.raises(ValueError, match="mask must hold finite weights >= 0"):
        sgrpo_loss(h, w, torch.zeros(4, 3, dtype=torch.long), torch.ones(4), mask.float(), rl.preset("dapo"))


@pytest.mark.parametrize("options, exc, match", [
    ({"r_min": 1.0, "r_max": 0.0}, ValueError, r"r_min \(1.0\) must be <= r_max \(0.0\)"),
    ({"bogus": 1}, TypeError, "unknown option"),
    ({"eps": -1.0}, ValueError, "eps must be >= 0"),
    ({"eps": math.nan}, ValueError, "eps must be finite"),
])
def test_bad_advantage_options_are_refused_when_the_config_is_built(options, exc, match):
    # before: LossConfig accepted them and the first training step raised
    with pytest.raises(exc, match=f"LossConfig.advantage_options: .*{match}"):
        rl.LossConfig(advantage_options=options)


@pytest.mark.parametrize("b, t", [(0, 3), (2, 0), (0, 0)])
@pytest.mark.parametrize("name", PRESETS)
def test_empty_batch_gives_a_zero_loss(name, b, t):
    # before: min() of an empty tensor raised in the metrics
    cfg = rl.preset(name)
    lp = torch.zeros(b, t, requires_grad=True)
    loss, m = rl.policy_loss(lp, torch.zeros(b), torch.ones(b, t, dtype=torch.bool), cfg, entropy=torch.zeros(b, t),
                             ref_logp=torch.zeros(b, t))
    loss.backward()
    assert float(loss) == 0.0 and lp.grad.shape == (b, t)
    hidden = torch.zeros(b, t, 4, requires_grad=True)
    weight = torch.randn(5, 4, requires_grad=True)
    loss, _ = sgrpo_loss(hidden, weight, torch.zeros(b, t, dtype=torch.long), torch.zeros(b),
                         torch.ones(b, t, dtype=torch.bool), cfg, ref_logp=torch.zeros(b, t), compute_entropy=True)
    loss.backward()
    assert float(loss) == 0.0 and torch.equal(weight.grad, torch.zeros(5, 4))


@pytest.mark.parametrize("text", ["nan", "NaN", "inf", "-inf", "Infinity"])
def test_override_text_of_a_non_finite_number_is_refused_as_a_number(text):
    """`--loss beta=nan` (and TRL's sgrpo_loss) used to be refused as "got str": the text is now read as the number it
    spells, so the field's own finiteness check names the value."""
    with pytest.raises(ValueError, match=r"LossConfig\.beta must be finite"):
        rl.preset_with("s_grpo", f"beta={text}")


def test_override_text_giving_a_field_twice_is_refused():
    """`--loss beta=0,beta=0.1` (and TRL's sgrpo_loss) used to keep the last value silently."""
    with pytest.raises(ValueError, match=r"'beta' is given twice in 'beta=0, beta =0.1': give each field once"):
        rl.parse_overrides("beta=0, beta =0.1")
    assert rl.parse_overrides("beta=0,clip_eps=0.1") == {"beta": 0, "clip_eps": 0.1}


# ------------------------------------------------------------- found by an adversarial review (each failed before)


def test_negative_conflict_weights_are_refused():
    """A negative factor flips the update's direction (a good completion pushed down); rl.md: never negative. (The
    loss's own token_weights are not checked: it makes no host sync, test_rl_loss.py.)"""
    with pytest.raises(ValueError, match=r"LossConfig.conflict_w_pos must be >= 0.0, got -1.0"):
        rl.LossConfig(conflict_strategy="gtpo", conflict_w_pos=-1.0)
    with pytest.raises(ValueError, match=r"w_neg must be >= 0.0"):
        rl.conflict_weights(torch.zeros(2, 3, dtype=torch.long), torch.ones(2, 3, dtype=torch.bool),
                            torch.tensor([1.0, -1.0]), 2, w_neg=-0.5)  # fmt: skip


@pytest.mark.parametrize("value", ["False", 0])
def test_compute_entropy_must_be_a_bool(value):
    """compute_entropy="False" computed the entropy (a non-empty string is true)."""
    with pytest.raises(TypeError, match=r"compute_entropy must be a bool"):
        sgrpo_loss(torch.zeros(2, 2, 4), torch.randn(5, 4), torch.zeros(2, 2, dtype=torch.long), torch.zeros(2),
                   torch.ones(2, 2, dtype=torch.bool), rl.preset("dapo"), compute_entropy=value)  # fmt: skip


@pytest.mark.parametrize("options, match", [({"unbiased": "no"}, "unbiased must be a bool, got str 'no'"),
                                            ({"unbiased": 0}, "unbiased must be a bool"),
                                            ({"c": 0.0}, "c must be > 0.0")])  # fmt: skip
def test_advantage_options_of_the_wrong_kind_are_refused(options, match):
    method = "all_fail_negative" if "c" in options else "grpo"
    with pytest.raises((TypeError, ValueError), match=match):
        rl.group_advantages(torch.tensor([1.0, 0.0, 1.0, 1.0]), 4, method, **options)


def test_an_empty_batch_has_statistics_and_groups():
    """B = 0 raised IndexError (amax of an empty dim) with return_stats and in prepare_groups."""
    adv, stats = rl.group_advantages(torch.zeros(0), 4, return_stats=True)
    assert adv.shape == (0,) and float(stats["num_groups"]) == 0.0 and math.isnan(float(stats["reward_mean"]))
    groups = rl.prepare_groups(rl.preset("gtpo"), torch.zeros(0), torch.zeros(0, 3, dtype=torch.long),
                               torch.zeros(0, 3, dtype=torch.bool), 4)  # fmt: skip
    assert groups.advantages.shape == (0,) and groups.token_weights.shape == (0, 3)


@pytest.mark.parametrize("rewards", [torch.tensor([1, 0, 1, 1]), torch.tensor([True, False, True, True])])
def test_integer_rewards_reach_the_losss_filters_as_floats(rewards):
    """prepare_groups accepts int / bool rewards; the coverage filter then refused them ("a floating tensor")."""
    cfg = rl.preset_with("s_grpo", "entropy_filter=quantile:0.75")
    ids, mask = torch.randint(0, 5, (4, 3), generator=torch.Generator().manual_seed(0)), torch.ones(4, 3, dtype=bool)
    groups = rl.prepare_groups(rl.preset_with("s_grpo", "entropy_filter=coverage"), rewards, ids, mask, 4)
    want = rl.prepare_groups(cfg, rewards.double(), ids, mask, 4)
    assert groups.rewards.is_floating_point() and torch.equal(groups.rewards.double(), want.rewards)
    hidden = torch.randn(4, 3, 4, dtype=torch.float64)
    sgrpo_loss(hidden, torch.randn(5, 4, dtype=torch.float64), ids, groups.advantages.double(), mask,
               rl.preset_with("s_grpo", "entropy_filter=coverage"), **groups.loss_kwargs())  # fmt: skip


def test_override_text_holds_json_values_with_commas_and_python_spellings():
    """advantage_options={...} was split at its inner comma; True / 'ln2' were refused; None gave a TypeError from
    inside ('NoneType' object is not iterable)."""
    got = rl.parse_overrides('advantage_options={"eps": 1e-6, "unbiased": false}, beta=0.1, positive_only=True, '
                             "entropy_filter='ln2', name=\"a,b\"")  # fmt: skip
    assert got == {"advantage_options": {"eps": 1e-6, "unbiased": False}, "beta": 0.1, "positive_only": True,
                   "entropy_filter": "ln2", "name": "a,b"}  # fmt: skip
    assert rl.preset_with("grpo", 'advantage_options={"eps":1e-6,"unbiased":false}').advantage_options == {
        "eps": 1e-6, "unbiased": False}  # fmt: skip
    for bad in (None, 3, ["beta=0"]):
        with pytest.raises(TypeError, match=r"overrides must be a 'field=value,...' string"):
            rl.preset_with("grpo", bad)


@pytest.mark.parametrize("call, err, match", [
    (lambda h, a: rl.top_entropy_mask(h, a, 2.0), ValueError, r"rho must be <= 1.0, got 2.0"),  # k out of range
    (lambda h, a: rl.top_entropy_mask(h, a, math.nan), ValueError, r"rho must be finite"),  # cannot convert NaN
    (lambda h, a: rl.top_entropy_mask(h, a, 0.0), ValueError, r"rho must be > 0.0"),  # silently kept one token
    (lambda h, a: rl.top_entropy_mask(h, a.float(), 0.5), TypeError, r"active must be a bool tensor"),  # IndexError
    (lambda h, a: rl.completion_entropy(h, a[:, :2]), ValueError, r"completion_entropy: mask must be a tensor of "
                                                                     r"entropy's shape \(2, 3\), got \(2, 2\)"),
    (lambda h, a: rl.entropy_threshold("quantile:0.5", h[:, 0], a[:, 0].float()), TypeError,
     r"seq_valid must be a bool tensor"),  # NotImplementedError: "bitwise_and_cpu" not implemented for 'Float'
])  # fmt: skip
def test_entropy_helpers_refuse_bad_inputs_naming_them(call, err, match):
    with pytest.raises(err, match=match):
        call(torch.rand(2, 3), torch.ones(2, 3, dtype=torch.bool))
