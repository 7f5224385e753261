"""--dynamic-sampling (DAPO's dynamic sampling; grpo-stability-experiments.md 3.1): the constant-group rule and the
resampling loop against hand-worked draws, then on the tiny model with a reward that makes some groups constant: the
trained batch has no constant group, the cap is honored and said in the record, the counts add up, the resample
stream is checkpointed and an interrupted run (also inside a resampling rollout) resumes exactly."""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

import conftest  # noqa: E402

import train.loop as loop  # noqa: E402
import train.step as step_module  # noqa: E402
from train.config import ConfigError, TrainConfig  # noqa: E402
from train.features import dynamic_sampling  # noqa: E402
from train.features.dynamic_sampling import constant_groups, resample  # noqa: E402
from train.rollout import Batch  # noqa: E402

LOSS = {"entropy_filter": None, "entropy_coef": 0.01}  # a gradient on every step of a random model
G = 4

# conftest's tiny run (groups of G), with dynamic sampling, without periodic checkpoints
tiny_cfg = functools.partial(conftest.tiny_cfg, group_size=G, save_every=0, dynamic_sampling=True)


def records(out) -> list[dict]:
    return [json.loads(x) for x in (Path(out) / "metrics.jsonl").read_text().splitlines()]


def steps_of(out) -> list[dict]:
    return [r for r in records(out) if "event" not in r]


# ----------------------------------------------------------------------------------------------------- the rule


def test_constant_groups():
    rewards = torch.tensor([1, 0, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1, 0.5, 0.5, 0.5, 0.5000001], dtype=torch.float64)
    assert constant_groups(rewards, 4) == [False, True, True, False]
    assert constant_groups(torch.tensor([0.2, 0.2]), 2) == [True]


def _fake_batch(problems: list[int]) -> Batch:
    """G rows per problem p: rewards all 0 when p % 3 == 0 (constant), else 1, 0, 1, 0; the texts name the row."""
    rows = [(p, j) for p in problems for j in range(G)]
    rewards = torch.tensor([0.0 if p % 3 == 0 else float(j % 2 == 0) for p, j in rows])
    width = 1 + max(problems) % 3  # completion widths differ from rollout to rollout (concat pads them)
    ids = torch.tensor([[p] * width for p, _ in rows])
    return Batch(ids[:, :1], torch.ones(len(rows), 1, dtype=torch.long), ids, torch.ones_like(ids, dtype=torch.bool),
                 [f"{p}.{j}" for p, j in rows], rewards, rewards > 0)  # fmt: skip


class _Task:
    """Draws the next problems of a fixed list, whatever the stream (the list stands for the resample stream)."""

    def __init__(self, stream: list[int]):
        self.stream = list(stream)

    def sample(self, n: int, rng) -> list[int]:
        out, self.stream = self.stream[:n], self.stream[n:]
        return out


@pytest.mark.parametrize(
    "first, stream, tries, kept, counts",
    [
        # 3 prompts, 1 constant (3): one resample draws 1 problem (4, informative)
        ([3, 1, 2], [4, 5], 4, [1, 2, 4], dict(tries=2, resampled=1, constant=1, filled=0, capped=False, rollouts=16)),
        # all informative: no resampling, the batch is returned as it was
        ([1, 2, 4], [5], 4, [1, 2, 4], dict(tries=1, resampled=0, constant=0, filled=0, capped=False, rollouts=12)),
        # 2 constant (3, 6); the resamples draw 2 (9 constant, 1), then 1 (7)
        ([3, 1, 6], [9, 1, 7], 4, [1, 1, 7], dict(tries=3, resampled=3, constant=3, filled=0, capped=False,
                                                  rollouts=24)),
        # the cap: 2 tries find 1 informative group (1); filled with the first constant groups drawn (3, 6)
        ([3, 6, 9], [12, 15, 1], 2, [3, 6, 1], dict(tries=2, resampled=3, constant=5, filled=2, capped=True,
                                                    rollouts=24)),
        # a cap of 1 try: no resampling, the constant group filled in
        ([3, 1, 2], [4], 1, [3, 1, 2], dict(tries=1, resampled=0, constant=1, filled=1, capped=True, rollouts=12)),
    ],
)  # fmt: skip
def test_dynamic_sampling_by_hand(first, stream, tries, kept, counts):
    task = _Task(stream)
    batch = _fake_batch(first)
    got, c = resample(batch, _fake_batch, lambda n: task.sample(n, None), G, tries, pad_id=0)
    assert (got is batch) == (counts["tries"] == 1)
    assert [int(t.split(".")[0]) for t in got.texts[::G]] == kept  # the kept groups, in the order drawn
    assert got.texts == _fake_batch(kept).texts and got.rewards.tolist() == _fake_batch(kept).rewards.tolist()
    assert got.completion_ids.shape[0] == len(first) * G and got.completion_mask.shape == got.completion_ids.shape
    drawn = first + stream[: counts["resampled"]]
    assert c == {**counts, "reward_sum": float(_fake_batch(drawn).rewards.sum())}


# ----------------------------------------------------------------------------------------------------- the trainer


def _answer_parity_rollout(real):
    """The real rollout with its rewards replaced: a problem with an even answer gets a constant group (all 0), an
    odd one rewards 1, 0, 1, 0 (informative)."""

    def fake(*args, **kwargs):
        batch = real(*args, **kwargs)
        if kwargs.get("greedy") or kwargs.get("group_size") != G:
            return batch
        problems = args[2]
        r = torch.tensor([float(int(p.answer) % 2 == 1 and j % 2 == 0) for p in problems for j in range(G)])
        return dataclasses.replace(batch, rewards=r, correct=r > 0)

    return fake


def _constant_rollout(real):
    def fake(*args, **kwargs):
        batch = real(*args, **kwargs)
        if kwargs.get("greedy") or kwargs.get("group_size") != G:
            return batch
        return dataclasses.replace(
            batch, rewards=torch.zeros(len(batch.texts)), correct=torch.zeros(len(batch.texts)) > 0
        )

    return fake


def _trained_batches(monkeypatch) -> list[Batch]:
    seen, real = [], step_module.policy_update

    def spy(run, batch, groups, update, step):
        seen.append(batch)
        return real(run, batch, groups, update, step)

    monkeypatch.setattr(step_module, "policy_update", spy)
    return seen


def test_trained_batches_have_no_constant_group(tmp_path, monkeypatch):
    monkeypatch.setattr(step_module, "rollout", _answer_parity_rollout(step_module.rollout))
    seen = _trained_batches(monkeypatch)
    summary = loop.train(tiny_cfg(tmp_path / "run", prompts_per_step=4, dynamic_sampling_max_tries=8), LOSS)
    assert summary["steps"] == 3 and len(seen) == 3
    recs = steps_of(tmp_path / "run")
    assert sum(r["ds_resampled"] for r in recs) > 0  # some groups were constant and got replaced
    for batch, r in zip(seen, recs):
        assert not r["ds_capped"] and r["ds_filled"] == 0
        assert len(batch.texts) == 4 * G and not any(constant_groups(batch.rewards, G))
        assert r["zero_var_frac"] == 0.0 and r["completions"] == 4 * G
        assert r["ds_constant"] == r["ds_resampled"]  # every constant group drawn was dropped and replaced
        assert r["ds_rollouts"] == (4 + r["ds_resampled"]) * G and 1 <= r["ds_tries"] <= 8
        assert 0 <= r["ds_reward_mean_drawn"] < r["reward_mean"]  # the constant groups drawn were all 0
    config = json.loads((tmp_path / "run" / "config.json").read_text())["train"]
    assert config["dynamic_sampling"] is True and config["dynamic_sampling_max_tries"] == 8


def test_cap_is_honored_and_logged(tmp_path, monkeypatch):
    calls = {"n": 0}
    real = _constant_rollout(step_module.rollout)

    def counting(*args, **kwargs):
        if not kwargs.get("greedy") and kwargs.get("group_size") == G:
            calls["n"] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(step_module, "rollout", counting)
    seen = _trained_batches(monkeypatch)
    loop.train(tiny_cfg(tmp_path / "run", max_steps=2, dynamic_sampling_max_tries=3), LOSS)
    assert calls["n"] == 2 * 3  # 3 rollouts per step, no more
    for batch, r in zip(seen, steps_of(tmp_path / "run")):
        assert r["ds_capped"] is True and r["ds_tries"] == 3
        assert (r["ds_resampled"], r["ds_constant"], r["ds_filled"], r["ds_rollouts"]) == (4, 6, 2, 6 * G)
        assert len(batch.texts) == 2 * G  # trained on what there was: the first 2 constant groups
        assert r["zero_var_frac"] == 1.0


def test_off_by_default_and_its_fields_only_when_on(tmp_path):
    loop.train(tiny_cfg(tmp_path / "off", max_steps=1, dynamic_sampling=False), LOSS)
    assert not any(k.startswith("ds_") for k in steps_of(tmp_path / "off")[0])
    state = torch.load(tmp_path / "off" / "checkpoint" / "state.pt", weights_only=True)
    assert "dynamic_sampling" not in state["features"][0]
    with pytest.raises(ConfigError, match="dynamic_sampling_max_tries=2 has no effect without dynamic_sampling"):
        TrainConfig(dynamic_sampling_max_tries=2)
    with pytest.raises(ConfigError, match="dynamic_sampling_max_tries"):
        TrainConfig(dynamic_sampling=True, dynamic_sampling_max_tries=0)


def _training_rollouts(recs: list[dict]) -> list[tuple[int, bool]]:
    """(step, is a resampling rollout) of every training rollout of a run, from its records' ds_tries."""
    return [(r["step"], t > 0) for r in recs for t in range(r["ds_tries"])]


@pytest.mark.parametrize("where", ["first rollout of a step", "resampling rollout"])
def test_resume_is_exact(tmp_path, monkeypatch, where):
    """Interrupted (Ctrl-C) at a step's first rollout or inside its resampling, then resumed: the same records
    (timing aside), the same final weights, bitwise, as the uninterrupted run; the checkpoint holds the resample
    stream."""
    cfg = dict(max_steps=4, prompts_per_step=4, save_every=1)
    monkeypatch.setattr(step_module, "rollout", _answer_parity_rollout(step_module.rollout))
    loop.train(tiny_cfg(tmp_path / "ref", **cfg), LOSS)
    ref = steps_of(tmp_path / "ref")
    calls = _training_rollouts(ref)
    nth = 1 + next(
        i for i, (step, again) in enumerate(calls) if step >= 2 and again == (where != "first rollout of a step")
    )

    count, real = {"n": 0}, step_module.rollout

    def interrupting(*args, **kwargs):
        if not kwargs.get("greedy") and kwargs.get("group_size") == G:
            count["n"] += 1
            if count["n"] == nth:
                raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(step_module, "rollout", interrupting)
    first = loop.train(tiny_cfg(tmp_path / "b", **cfg), LOSS)
    assert first["interrupted"] and first["steps"] == calls[nth - 1][0] - 1
    state = torch.load(tmp_path / "b" / "checkpoint" / "state.pt", weights_only=True)
    resample_rng = state["features"][0]["dynamic_sampling"]["rng"]
    assert isinstance(resample_rng, list) and len(resample_rng[1]) == 625
    monkeypatch.setattr(step_module, "rollout", real)
    loop.train(tiny_cfg(tmp_path / "b", resume=True, **cfg), LOSS)
    strip = lambda recs: [{k: v for k, v in r.items() if k not in conftest.TIMING} for r in recs]  # noqa: E731
    assert strip(records(tmp_path / "b")) == strip(records(tmp_path / "ref"))
    a = torch.load(tmp_path / "ref" / "checkpoint" / "state.pt", weights_only=True)
    b = torch.load(tmp_path / "b" / "checkpoint" / "state.pt", weights_only=True)
    for name in a["trainable"]:
        assert torch.equal(a["trainable"][name], b["trainable"][name]), name
    assert a["features"][0]["dynamic_sampling"]["rng"] == b["features"][0]["dynamic_sampling"]["rng"]


def test_each_step_starts_from_the_problems_a_run_without_it_draws(tmp_path, monkeypatch):
    """The resamples come from a stream of their own (the dynamic-sampling feature's `rng`, per rank): the shared draw
    of each step's first prompts (`task_rng`, sliced by rank under torchrun) is the one a run without dynamic sampling
    makes."""
    monkeypatch.setattr(step_module, "rollout", _answer_parity_rollout(step_module.rollout))
    real_roll, real_ds = step_module.roll, dynamic_sampling.resample
    inside, firsts = [False], []

    def roll(run, problems):
        if not inside[0]:
            firsts.append([p.question for p in problems])
        return real_roll(run, problems)

    def ds(*args, **kwargs):
        inside[0] = True
        try:
            return real_ds(*args, **kwargs)
        finally:
            inside[0] = False

    monkeypatch.setattr(step_module, "roll", roll)
    monkeypatch.setattr(dynamic_sampling, "resample", ds)
    loop.train(tiny_cfg(tmp_path / "on", prompts_per_step=4), LOSS)
    on, firsts[:] = list(firsts), []
    loop.train(tiny_cfg(tmp_path / "off", prompts_per_step=4, dynamic_sampling=False), LOSS)
    assert len(on) == 3 and on == firsts
    assert sum(r["ds_resampled"] for r in steps_of(tmp_path / "on")) > 0


def test_a_bad_resample_state_is_refused(tmp_path):
    from train.run.checkpoint import CheckpointError, read_checkpoint

    loop.train(tiny_cfg(tmp_path / "run", max_steps=1), LOSS)
    file = tmp_path / "run" / "checkpoint" / "state.pt"
    state = torch.load(file, weights_only=True)
    saved = state["features"][0]["dynamic_sampling"]
    assert read_checkpoint(file)["features"][0]["dynamic_sampling"]["rng"] == saved["rng"]
    saved["rng"] = [3, [1, 2.5], None]
    torch.save(state, file)
    with pytest.raises(CheckpointError, match="bad resample RNG state"):  # (the feature checks its state on resume)
        loop.train(tiny_cfg(tmp_path / "run", max_steps=1, resume=True), LOSS)
