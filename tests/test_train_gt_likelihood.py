"""The GT-likelihood dense reward (train/gt_likelihood.py): the reasoning cut, the likelihood against full-logit scoring
of the same sequences on the tiny model, the dense reward, and bad inputs."""

from __future__ import annotations

import functools
import math

import pytest
import torch
from conftest import tiny_cfg

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


# ------------------------------------------------------------------------ the trainer's --dense-reward gt_likelihood

# conftest's tiny run with the dense reward: 2 steps at lr 1e-2 from the first (no warm-up), no KL probe, no periodic
# checkpoints
_tiny_cfg = functools.partial(tiny_cfg, max_steps=2, kl_every=0, warmup_steps=0, lr=1e-2, save_every=0,
                              dense_reward="gt_likelihood")  # fmt: skip


def test_trainer_rewards_by_hand(tmp_path):
    """The dense reward (train/features/dense_reward.py) on a hand-made batch: correct rows keep their reward
    (1 + format), a wrong row's 0 becomes the likelihood of its own (prompt, text, answer), the format reward stays
    added, `correct` is unchanged."""
    import dataclasses

    from train.features import dense_reward
    from train.rollout import Batch, chat_prompts
    from train.setup import setup

    cfg = _tiny_cfg(tmp_path / "run", format_reward_weight=0.5)
    run = setup(cfg, cfg.loss_config())
    problems = run.task.sample(2, run.task_rng)
    texts = [str(problems[0].answer), "5 + 2 = 9", "no idea", str(problems[0].answer),
             "12", str(problems[1].answer), "the answer is 3", "1 2 3"]  # fmt: skip
    correct = torch.tensor([t == str(problems[i // 4].answer) for i, t in enumerate(texts)])
    fmt = torch.tensor([0.0, 1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 0.0])
    empty = torch.zeros(8, 1, dtype=torch.long)
    batch = Batch(empty, empty, empty, empty.bool(), texts, correct.float() + 0.5 * fmt, correct)
    got = dense_reward.from_run(cfg, run).rescore(batch, problems)
    prompts = chat_prompts(run.tok, problems, run.system_prompt)
    for i in range(8):
        if correct[i]:
            assert got.rewards[i].item() == batch.rewards[i].item()
        else:
            want = gt_likelihood(run.model, run.tok, [prompts[i // 4]], [texts[i]], [str(problems[i // 4].answer)])
            assert 0 < want.item() < 1
            assert got.rewards[i].item() == pytest.approx(0.5 * fmt[i].item() + want.item(), rel=1e-6, abs=1e-12)
    assert torch.equal(got.correct, correct) and got.rewards.dtype == batch.rewards.dtype
    assert dataclasses.replace(got, rewards=batch.rewards) == batch  # nothing else changed


def test_trainer_trains_on_the_dense_rewards(tmp_path, monkeypatch):
    """2 tiny-model steps with --dense-reward gt_likelihood: the rewards the advantages are computed from are the dense
    ones (the random model answers nothing right: every reward is a likelihood in (0, 1), so no group is constant), and
    the record's reward_mean is their mean while its accuracy stays 0."""
    import json

    import train.loop as loop
    import train.step as step_module

    seen = []
    prepare = step_module.prepare_groups

    def spy(cfg, rewards, *args, **kwargs):
        seen.append(rewards.detach().cpu().clone())
        return prepare(cfg, rewards, *args, **kwargs)

    monkeypatch.setattr(step_module, "prepare_groups", spy)
    summary = loop.train(_tiny_cfg(tmp_path / "run"), {"entropy_filter": None})
    assert summary["steps"] == 2 and len(seen) == 2
    recs = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in recs if "event" not in r]
    for rewards, rec in zip(seen, steps):
        assert bool(((rewards > 0) & (rewards < 1)).all())
        assert bool((rewards.reshape(-1, 4).std(dim=1) > 0).all())
        assert rec["accuracy"] == 0.0 and rec["reward_mean"] == pytest.approx(rewards.mean().item(), rel=1e-6)
        assert rec["zero_var_frac"] == 0.0
