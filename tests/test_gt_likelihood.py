"""The GT-likelihood dense reward (train/gt_likelihood.py): the reasoning cut, the likelihood against full-logit scoring
of the same sequences on the tiny model, the dense reward, and bad inputs."""

from __future__ import annotations

import math

import pytest
import torch

from train.gt_likelihood import dense_rewards, gt_likelihood, reasoning_of
from train.model import tiny_model_and_tokenizer


@pytest.mark.parametrize(
    ("completion", "want"),
    [
        ("12 + 5 = 17", "12 + 5"),
        ("First 3 * 4 is 12, so the answer is 15.", "First 3 * 4 is 12, so"),
        ("I think 7", "I think"),
        ("no idea", "no idea"),
        ("42", ""),
        ("the answer is 20", ""),
    ],
)
def test_reasoning_is_the_completion_before_its_answer(completion, want):
    assert reasoning_of(completion) == want


def _full_logit_likelihood(model, tok, context: str, answer: str) -> float:
    """The same probability the naive way: the model's logits on context + answer, log_softmax, the answer tokens."""
    ctx = tok([context])["input_ids"][0].tolist()
    full = tok([context + answer])["input_ids"][0].tolist()
    assert full[: len(ctx)] == ctx
    ids = torch.tensor([full])
    logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits.double()
    lp = torch.log_softmax(logits[0, :-1], -1)
    return math.exp(sum(lp[t - 1, full[t]].item() for t in range(len(ctx), len(full))))


def test_likelihood_matches_full_logit_scoring():
    model, tok = tiny_model_and_tokenizer(seed=3)
    model.eval()
    prompts = ["3 + 4 = ", "12 * 2 = ", "9 - 5 = "]
    completions = ["3 + 4 = 8", "the answer is 20", "nothing"]
    answers = ["7", "24", "4"]
    got = gt_likelihood(model, tok, prompts, completions, answers, batch_size=2)  # two batches, padded rows
    contexts = ["3 + 4 = 3 + 4 The answer is ", "12 * 2 = The answer is ", "9 - 5 = nothing The answer is "]
    want = [_full_logit_likelihood(model, tok, c, a) for c, a in zip(contexts, answers)]
    torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64), rtol=1e-5, atol=0)
    assert bool(((got > 0) & (got < 1)).all())


def test_dense_rewards_keep_the_correct_ones_at_one():
    r = dense_rewards(torch.tensor([True, False, False]), torch.tensor([0.2, 0.3, 0.0], dtype=torch.float64))
    assert r.tolist() == [1.0, 0.3, 0.0]
    with pytest.raises(ValueError, match="expected one shape"):
        dense_rewards(torch.tensor([True]), torch.tensor([0.1, 0.2]))


def test_bad_inputs_are_refused():
    model, tok = tiny_model_and_tokenizer()
    with pytest.raises(ValueError, match="expected as many"):
        gt_likelihood(model, tok, ["a"], ["b", "c"], ["1"])
    with pytest.raises(ValueError, match="batch_size=0"):
        gt_likelihood(model, tok, ["a"], ["b"], ["1"], batch_size=0)
