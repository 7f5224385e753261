"""A batch whose every completion the entropy filter removes has a zero loss and no policy gradient: the RL layer
says so (a UserWarning) instead of returning loss 0 and filtered_frac 1.0 without a word (issue 23, item 5). The
README's snippet with the default s_grpo (ln 2 filter, random hidden states: entropy ~ ln V) is that case."""

from __future__ import annotations

import warnings

import pytest
import torch

from sgrpo_kernels import rl, sgrpo_loss

V, D = 1000, 64


def batch():
    torch.manual_seed(0)
    hidden = torch.randn(8, 16, D, requires_grad=True)  # random: every completion's entropy is near ln V
    weight = (torch.randn(V, D) * 0.05).requires_grad_(True)
    ids = torch.randint(0, V, (8, 16))
    mask = torch.ones(8, 16, dtype=torch.bool)
    advantages = torch.tensor([1.0, -1.0] * 4)
    return hidden, weight, ids, advantages, mask


def test_loss_warns_when_the_filter_removes_every_completion():
    hidden, weight, ids, adv, mask = batch()
    with pytest.warns(UserWarning, match="removed every completion of the batch") as record:
        loss, metrics = sgrpo_loss(hidden, weight, ids, adv, mask, rl.preset("s_grpo"))
    assert float(metrics["filtered_frac"]) == 1.0 and float(loss) == 0.0
    text = str(record[0].message)
    assert "ln2" in text and "quantile:0.75" in text, text  # the filter in use and what to do about it


def test_no_warning_when_completions_are_kept():
    hidden, weight, ids, adv, mask = batch()
    cfg = rl.preset_with("s_grpo", "entropy_filter=quantile:0.75")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loss, metrics = sgrpo_loss(hidden, weight, ids, adv, mask, cfg)
    loss.backward()
    assert 0 < float(metrics["filtered_frac"]) < 1 and hidden.grad.abs().max() > 0


def test_no_warning_for_an_empty_batch_or_without_a_filter():
    hidden, weight, ids, adv, mask = batch()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sgrpo_loss(hidden, weight, ids, adv, torch.zeros_like(mask), rl.preset("s_grpo"))  # nothing to filter
        sgrpo_loss(hidden, weight, ids, adv, mask, rl.preset("grpo"), ref_logp=torch.zeros(8, 16))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (on the CPU the loss itself warns)")
def test_metrics_to_floats_warns_for_a_device_batch():
    """On an accelerator the loss does not look at the metrics (no host sync); their one copy to the host does."""
    metrics = {"filtered_frac": torch.ones((), device="cuda"), "loss": torch.zeros((), device="cuda")}
    with pytest.warns(UserWarning, match="removed every completion of the batch"):
        rl.metrics_to_floats(metrics)
