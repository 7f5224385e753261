"""Defects an adversarial review of the RL layer's public API found (2026-11-30), each a test that failed before its
fix: inputs that were accepted and gave a wrong result silently, or failed deep inside torch naming nothing."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import assert_refused

from sgrpo_kernels import rl

ONE_GRAD = dict(advantages=torch.tensor([1.0, -1.0, 1.0, -1.0]), mask=torch.ones(4, 3, dtype=torch.bool))


def test_the_adaptive_filter_refuses_rewards_of_another_batch():
    """Rewards (2,) or (10,) for a batch of 4 set the threshold from other completions; coverage refused them."""
    cfg = rl.preset_with("dapo", "entropy_filter=adaptive")
    for rewards in (torch.tensor([1.0, 0.0]), torch.ones(10)):
        assert_refused(lambda r=rewards: rl.policy_loss(torch.zeros(4, 3), ONE_GRAD["advantages"], ONE_GRAD["mask"],
                                                        cfg, entropy=torch.full((4, 3), 0.3), rewards=r, group_size=2,
                                                        vocab_size=50),
                       ValueError, [f"rewards has shape {tuple(rewards.shape)}", "expected (4,)"])  # fmt: skip


@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan])
def test_an_unscorable_reward_does_not_set_the_adaptive_threshold(bad):
    """A +-inf reward made the threshold NaN: every completion filtered, no gradient (NaN was already left out)."""
    r = torch.tensor([1.0, 0.0, bad, 1.0])
    thr = rl.adaptive_entropy_threshold(r, 2, 50)
    assert math.isfinite(thr)
    assert thr == rl.adaptive_entropy_threshold(torch.tensor([1.0, 0.0, math.nan, 1.0]), 2, 50)


def test_a_nan_entropy_is_dropped_by_the_top_entropy_mask_not_every_token():
    """One NaN entropy made the cut NaN: every token dropped, a loss of exactly 0 and no gradient, no warning."""
    ent = torch.tensor([[0.1, 0.9, 0.3, 0.8], [0.2, 0.7, 0.4, math.nan]])
    active = torch.ones(2, 4, dtype=torch.bool)
    keep = rl.top_entropy_mask(ent, active, 0.5)
    assert keep.tolist() == [[False, True, False, True], [False, True, True, False]]  # the top 4 of 7 finite
    cfg = rl.preset_with("dapo", "top_entropy_quantile=0.5")
    logp = torch.full((2, 4), -1.0, requires_grad=True)
    loss, _ = rl.policy_loss(logp, torch.tensor([1.0, -1.0]), active, cfg, entropy=ent)
    loss.backward()
    assert (logp.grad != 0).sum() == 4 and torch.isfinite(logp.grad).all()


@pytest.mark.parametrize(("override", "words"), [
    ("log_ratio_clip=100", ["log_ratio_clip must be <= 88.72", "got 100"]),  # exp(94) = inf: NaN gradients
    ("epsilon_high=1e300", ["epsilon_high=1e+300 does not fit float32"]),  # was a RuntimeError at the first loss
    ("beta=1e39", ["beta=1e+39 does not fit float32"]),
    ("beta=1" + "0" * 400, ["LossConfig.beta must be finite", "401 digits"]),  # was an unnamed OverflowError
    ("beta=0.1 epsilon_low=0.2", ["LossConfig.beta must be a Python number", "'0.1 epsilon_low=0.2'"]),
], ids=["log_ratio_clip", "epsilon_high", "beta_1e39", "beta_401_digits", "space_not_comma"])  # fmt: skip
def test_loss_config_refuses_numbers_the_float32_loss_cannot_hold(override, words):
    assert_refused(lambda: rl.preset_with("dapo", override), (TypeError, ValueError), words)


def test_a_sapo_temperature_below_float32s_smallest_normal_is_refused():
    """1e-300 is 0 in float32: the loss was -inf with NaN gradients."""
    assert_refused(lambda: rl.preset_with("sapo", "sapo_tau_pos=1e-300"), ValueError,
                   ["sapo_tau_pos=1e-300 does not fit float32"])  # fmt: skip
    rl.preset_with("sapo", "sapo_tau_pos=1e-3")  # an ordinary small value stays accepted


def test_the_quantile_threshold_takes_low_precision_entropies():
    """bf16 / fp16 entropies crashed inside torch.quantile (float32 / float64 only)."""
    for dt in (torch.bfloat16, torch.float16):
        thr = rl.entropy_threshold("quantile:0.5", torch.tensor([0.1, 0.2, 0.3], dtype=dt), torch.ones(3, dtype=bool))
        assert thr.dtype == dt and abs(float(thr) - 0.2) < 1e-2


@pytest.mark.parametrize(("value", "words"), [(1e-4, ["metrics['lr'] is a float 0.0001", "0-d tensor"]),
                                              (torch.ones(3), ["metrics['lr'] is a shape (3,)"])])  # fmt: skip
def test_metrics_to_floats_names_a_value_it_cannot_convert(value, words):
    assert_refused(lambda: rl.metrics_to_floats({"loss": torch.tensor(1.0), "lr": value}), TypeError, words)


def test_step_norm_refuses_an_old_value_of_another_shape():
    """A broadcastable old (shape (1,)) gave a wrong norm and projected the weights toward it, silently."""
    p = torch.nn.Parameter(torch.tensor([1.0, 2.0, 3.0]))
    for old in (torch.zeros(1), torch.zeros(4)):
        assert_refused(lambda o=old: rl.step_norm([p], [o]), ValueError,
                       [f"old[0] has shape {tuple(old.shape)}", "expected (3,)"])  # fmt: skip
        assert_refused(lambda o=old: rl.project_step([p], [o], 0.1), ValueError, ["old[0] has shape"])
    assert p.tolist() == [1.0, 2.0, 3.0]
    assert abs(rl.step_norm([p], [torch.zeros(3)]) - math.sqrt(14)) < 1e-12


def test_prepare_groups_names_rewards_that_do_not_match_the_completions():
    """The error named `advantages`, which the caller never passed; without a conflict strategy 8 rewards for 4
    completions were accepted."""
    ids, mask = torch.randint(0, 5, (4, 3)), torch.ones(4, 3, dtype=torch.bool)
    for name in ("s_grpo", "grpo"):
        assert_refused(lambda n=name: rl.prepare_groups(rl.preset(n), torch.ones(8), ids, mask, 2), ValueError,
                       ["prepare_groups: rewards has shape (8,), expected (4,)"])  # fmt: skip
    assert_refused(lambda: rl.prepare_groups(rl.preset("grpo"), torch.ones(4), "ids", mask, 2), TypeError,
                   ["completion_ids must be a [B, T] tensor"])  # fmt: skip


def _fused_inputs():
    h, w = torch.randn(2, 3, 4, requires_grad=True), torch.randn(8, 4, requires_grad=True)
    return h, w, torch.randint(0, 8, (2, 3))


@pytest.mark.parametrize(
    ("config", "extra", "words"),
    [
        ("dapo", dict(advantages=torch.ones(1)), ["advantages has shape (1,)", "B from hidden"]),
        ("dapo", dict(old_logp=torch.zeros(2, 4)), ["old_logp has shape (2, 4)", "[B, T] of hidden"]),
        ("dapo", dict(token_weights=torch.ones(2, 3, dtype=torch.long)), ["token_weights must be a floating"]),
        ("grpo", dict(), ["ref_logp [B, T] is required"]),  # grpo's beta > 0
    ],
)
def test_sgrpo_loss_refuses_bad_loss_inputs_before_its_lm_head_forward(config, extra, words, monkeypatch):
    """They were refused by policy_loss, after the LM head's forward had run (a whole [N, V] pass for nothing), and
    named logp, which the caller of sgrpo_loss never passed."""
    import sgrpo_kernels.rl.fused as fused

    calls = []
    monkeypatch.setattr(fused, "linear_logprobs", lambda *a, **k: calls.append(1))
    h, w, y = _fused_inputs()
    kw = dict(advantages=torch.tensor([1.0, -1.0])) | extra
    assert_refused(lambda: fused.sgrpo_loss(h, w, y, mask=torch.ones(2, 3), config=rl.preset(config), **kw),
                   (ValueError, TypeError), words)  # fmt: skip
    assert calls == []


def test_sgrpo_loss_checks_a_float_mask_once(monkeypatch):
    """docs/rl.md: a float mask's check costs one host sync; sgrpo_loss checked it, then policy_loss checked the masked
    copy again (two syncs)."""
    import sgrpo_kernels.rl.fused as fused
    import sgrpo_kernels.rl.loss as loss

    checked = []
    for module in (fused, loss):
        real = module.check_mask

        def counted(name, x, *a, _real=real, **k):
            checked.append(name)
            return _real(name, x, *a, **k)

        monkeypatch.setattr(module, "check_mask", counted)
    h, w, y = _fused_inputs()
    got, _ = fused.sgrpo_loss(h, w, y, torch.tensor([1.0, -1.0]), torch.full((2, 3), 0.5), rl.preset("dapo"))
    got.backward()
    assert checked == ["mask"]
    ref, _ = rl.policy_loss(*_logp_of(h, w, y), torch.tensor([1.0, -1.0]), torch.full((2, 3), 0.5), rl.preset("dapo"))
    torch.testing.assert_close(got, ref)


def _logp_of(h, w, y):
    return (torch.log_softmax(h.detach() @ w.detach().T, dim=-1).gather(-1, y.unsqueeze(-1)).squeeze(-1),)


def test_sgrpo_loss_checks_what_on_logp_returns():
    """on_logp's inputs are checked against hidden after the forward, the given ones kept (ref_logp not returned)."""
    h, w, y = _fused_inputs()
    cfg = rl.preset("grpo")
    kw = dict(advantages=torch.tensor([1.0, -1.0]), mask=torch.ones(2, 3), config=cfg, ref_logp=torch.zeros(2, 3))
    loss, _ = rl.sgrpo_loss(h, w, y, **kw, on_logp=lambda lp: {"old_logp": lp})
    assert torch.isfinite(loss)
    assert_refused(lambda: rl.sgrpo_loss(h, w, y, **kw, on_logp=lambda lp: {"old_logp": lp[:, :2]}),
                   ValueError, ["old_logp has shape (2, 2)", "[B, T] of hidden"])  # fmt: skip


@pytest.mark.parametrize(("dtype", "ignore_index"), [(torch.uint8, -100), (torch.uint16, -100), (torch.int16, -40000)])
def test_sgrpo_loss_takes_unsigned_and_narrow_integer_targets(dtype, ignore_index):
    """The ignored positions were filled with ignore_index in the targets' own dtype: -100 wrapped to 156 (uint8, which
    also took a real target 156 for ignored) or 65436 (uint16: refused, 'e.g. [65436]'), and -40000 overflowed int16."""
    from sgrpo_kernels import sgrpo_loss

    torch.manual_seed(0)
    h, w = torch.randn(2, 4, 8, requires_grad=True), torch.randn(200, 8, requires_grad=True)
    targets = torch.randint(0, 200, (2, 4))
    targets[0, 1] = 156
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]], dtype=torch.bool)
    cfg = rl.preset_with("grpo", "beta=0.0")

    def run(y):
        loss, _ = sgrpo_loss(h, w, y, torch.tensor([1.0, -1.0]), mask, cfg, ignore_index=ignore_index)
        return (loss, *torch.autograd.grad(loss, [h, w]))

    for got, want in zip(run(targets.to(dtype)), run(targets)):
        assert torch.equal(got, want)
