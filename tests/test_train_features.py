"""The feature interface (train/features/): a feature is one file and one registration. The toy of docs/design.md
("Adding a feature") registered here runs its hooks in a real tiny run, writes its record field, and its state is
saved and restored by the checkpoint with nothing in the checkpoint code knowing it."""

from __future__ import annotations

import json
import random

import pytest
import torch
from conftest import tiny_cfg

torch.set_num_threads(2)

from train import loop  # noqa: E402
from train.features import FACTORIES, Feature, Features, build_features, register_feature, unregister_feature  # noqa: E402

LOSS = {"entropy_filter": None}


class RolloutCounter(Feature):
    """The toy of docs/design.md: counts the completions the run has generated, logs the count every step."""

    name = "rollout_counter"

    def __init__(self):
        self.seen = 0

    def rescore(self, batch, problems):
        self.seen += len(batch.texts)
        return batch

    def record(self, record):
        return {"completions_seen": self.seen}

    def state_dict(self):
        return {"seen": self.seen}

    def load_state_dict(self, state):
        self.seen = state["seen"]


def counter_from_run(cfg, run):
    return RolloutCounter()


@pytest.fixture
def counter():
    register_feature(counter_from_run)
    try:
        yield counter_from_run
    finally:
        unregister_feature(counter_from_run)


def steps(out) -> list[dict]:
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if '"event"' not in x]


def test_a_registered_feature_runs_records_and_resumes(tmp_path, counter):
    cfg = dict(prompts_per_step=2, group_size=4, kl_every=0, eval_k=0)
    loop.train(tiny_cfg(tmp_path / "a", max_steps=3, **cfg), LOSS)
    assert [r["completions_seen"] for r in steps(tmp_path / "a")] == [8, 16, 24]
    assert list(steps(tmp_path / "a")[0])[-1] == "completions_seen"  # registered last: its fields come last

    loop.train(tiny_cfg(tmp_path / "b", max_steps=2, **cfg), LOSS)
    saved = torch.load(tmp_path / "b" / "checkpoint" / "state.pt", weights_only=True)
    assert saved["features"][0]["rollout_counter"] == {"seen": 16}  # saved generically, per rank
    loop.train(tiny_cfg(tmp_path / "b", max_steps=3, resume=True, **cfg), LOSS)
    assert [r["completions_seen"] for r in steps(tmp_path / "b")] == [8, 16, 24]  # restored: counts on from 16


def test_unregistered_feature_leaves_no_trace(tmp_path):
    assert counter_from_run not in FACTORIES
    loop.train(tiny_cfg(tmp_path / "run", max_steps=1, kl_every=0, eval_k=0), LOSS)
    assert "completions_seen" not in steps(tmp_path / "run")[0]


def test_registration_is_checked(counter):
    with pytest.raises(ValueError, match="already registered"):
        register_feature(counter_from_run)
    with pytest.raises(ValueError, match="unique"):
        Features([RolloutCounter(), RolloutCounter()])


def test_a_checkpoint_state_for_a_missing_feature_is_refused():
    from train.errors import Refused  # exit 2, a resume whose configuration differs (it was exit 1)

    with pytest.raises(Refused, match=r"holds the state of feature\(s\) \['rollout_counter'\]"):
        Features([]).load_state_dict({"rollout_counter": {"seen": 3}})


def test_a_feature_added_on_resume_is_refused(tmp_path):
    """It was accepted and started from scratch mid-run: completions_seen 32 at step 3 where 96 were seen."""
    from train.errors import Refused

    cfg = dict(prompts_per_step=2, group_size=4, kl_every=0, eval_k=0)
    loop.train(tiny_cfg(tmp_path / "b", max_steps=2, **cfg), LOSS)
    register_feature(counter_from_run)
    try:
        with pytest.raises(Refused, match=r"this run has feature\(s\) \['rollout_counter'\], which the resumed run"):
            loop.train(tiny_cfg(tmp_path / "b", max_steps=3, resume=True, **cfg), LOSS)
    finally:
        unregister_feature(counter_from_run)
    assert len(steps(tmp_path / "b")) == 2  # nothing run, nothing written


def test_builtin_features_are_built_only_when_on(tmp_path):
    from types import SimpleNamespace

    from train.config import TrainConfig

    model = torch.nn.Linear(2, 2)
    run = SimpleNamespace(
        model=model, params=list(model.parameters()), optimizer=torch.optim.SGD(model.parameters(), lr=0.1)
    )
    names = [f.name for f in build_features(TrainConfig(), run)]
    assert names == ["step_guard", "collapse"]  # the default job: the two that always run
    on = TrainConfig(trust_region=0.1, grad_penalty=0.1, ppo_epochs=2)
    sampling = SimpleNamespace(support=dict)  # the sampler's support: none
    names = [f.name for f in build_features(on, SimpleNamespace(**vars(run), tok=None, task=None, sampling=sampling))]
    assert names == ["ppo_epochs", "trust_region", "grad_penalty", "step_guard", "collapse"]


class _Bad(RolloutCounter):
    name = "bad"
    fields: dict = {}
    state: dict = {}

    def record(self, record):
        return self.fields

    def state_dict(self):
        return self.state


@pytest.mark.parametrize(
    ("fields", "state", "words"),
    [
        # these replaced the trainer's numbers in metrics.jsonl without a word (step 999 at every step)
        ({"step": 999, "loss": 0.0}, {}, ["feature 'bad'", "record() returned ['loss', 'step']", "'bad_loss'"]),
        ({"reward_mean": 5.0}, {}, ["['reward_mean']", "already has"]),
        (None, {}, ["feature 'bad'", "record() returned NoneType", "expected a dict"]),
        # these wrote a checkpoint that --resume then refused, with torch's text cut short and no feature named
        ({}, {"rng": random.Random(0)}, ["feature 'bad'", "state_dict()", "random.Random", "rng.getstate()"]),
        ({}, {"obj": _Bad()}, ["feature 'bad'", "state_dict()", "_Bad"]),
    ],
)
def test_a_features_bad_record_or_state_is_refused_naming_it(tmp_path, fields, state, words):
    from train.errors import TrainError

    def factory(cfg, run):
        bad = _Bad()
        bad.fields, bad.state = fields, state
        return bad

    register_feature(factory)
    try:
        with pytest.raises(TrainError) as caught:
            loop.train(tiny_cfg(tmp_path / "run", max_steps=2, kl_every=0, eval_k=0), LOSS)
    finally:
        unregister_feature(factory)
    for w in words:
        assert w in str(caught.value), (w, str(caught.value))


def test_register_feature_refuses_a_class_or_a_name():
    """Both were accepted and failed in the run's setup, after the model load."""
    for bad, words in ((RolloutCounter, "the class RolloutCounter"), ("counter", "'counter'")):
        with pytest.raises(TypeError, match=f"register_feature takes a factory.*{words}"):
            register_feature(bad)
    assert RolloutCounter not in FACTORIES


def test_a_duplicate_feature_name_names_the_classes():
    class Other(Feature):
        pass

    class Another(Feature):
        pass

    with pytest.raises(ValueError, match=r"\['feature'\] named by \['.*Other', '.*Another'\]"):
        Features([Other(), RolloutCounter(), Another()])


def test_an_exception_in_a_features_hook_names_the_feature(tmp_path):
    """It was a bare traceback from inside the step, naming no feature."""

    class Raising(RolloutCounter):
        name = "raising"

        def rescore(self, batch, problems):
            raise RuntimeError("boom")

    def factory(cfg, run):
        return Raising()

    register_feature(factory)
    try:
        with pytest.raises(RuntimeError, match="boom") as caught:
            loop.train(tiny_cfg(tmp_path / "run", max_steps=1, kl_every=0, eval_k=0), LOSS)
    finally:
        unregister_feature(factory)
    assert any("the feature 'raising'" in n and "Raising.rescore" in n for n in caught.value.__notes__)


def test_a_feature_state_that_turns_unloadable_mid_run_is_refused_at_the_save(tmp_path):
    """The check runs at the run's start and at each save (not every step): a state that is fine at the start and
    holds an object later is refused when a checkpoint would be written, naming the feature."""
    from train.run.checkpoint import CheckpointError

    class Later(RolloutCounter):
        name = "later"

        def state_dict(self):
            return {"seen": self.seen} if self.seen == 0 else {"rng": random.Random(self.seen)}

    def factory(cfg, run):
        return Later()

    register_feature(factory)
    try:
        with pytest.raises(CheckpointError, match=r"feature 'later': state_dict\(\).*random\.Random"):
            loop.train(tiny_cfg(tmp_path / "run", max_steps=2, kl_every=0, eval_k=0, save_every=1), LOSS)
    finally:
        unregister_feature(factory)
