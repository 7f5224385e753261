"""--log-mechanism (train/features/mechanism.py): the likelihood displacement against a float64 hand computation, the
shared-token sets against a brute-force scan, the update norm against the weights themselves (and the trust region's
own norm), the step's old log-probs against a forward before the update (1 and 2 PPO epochs), and the records: the
fields with the flag, none without, the same training either way."""

from __future__ import annotations

import json
import math

import pytest
import torch

pytest.importorskip("transformers")

from conftest import NanGrad, tiny_cfg  # noqa: E402

import train.loss as update_module  # noqa: E402
import train.rollout as rollout_module  # noqa: E402
from sgrpo_kernels.rl import metrics_to_floats, prepare_groups  # noqa: E402
from train import loop  # noqa: E402
from train.batch import Update  # noqa: E402
from train.config.cli import parse_args  # noqa: E402
from train.features.mechanism import (  # noqa: E402
    FIELDS,
    SUMS,
    displacement_fields,
    displacement_sums,
    likelihood_displacement,
    shared_with_wrong,
)
from train.model import tiny_model_and_tokenizer  # noqa: E402
from train.policy import token_logprobs  # noqa: E402
from train.rollout import Batch, rollout  # noqa: E402
from train.run.metrics import dumps  # noqa: E402
from train.setup import setup  # noqa: E402
from train.step import policy_update  # noqa: E402

LOSS = {"entropy_filter": None, "entropy_coef": 0.01}  # a gradient on the random model (test_train_loop's)
MECH = ("update_norm", *FIELDS, "ld_n_correct_shared", "ld_n_correct", "ld_n_wrong")


def moved(model, before: dict) -> float:
    """||theta - before|| over every parameter (the frozen ones add 0), in float64."""
    return math.sqrt(sum(float(((p.detach() - before[n]).double() ** 2).sum()) for n, p in model.named_parameters()))


def steps(out) -> list[dict]:
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in lines if r.get("event") != "eval"]


# ------------------------------------------------------------------------------------------- the functions


def _by_hand(old, new, mask, correct, shared) -> dict:
    """The displacement fields with Python floats (float64), one completion at a time."""
    sets = {"cs": [], "c": [], "w": []}
    for i in range(old.shape[0]):
        toks = [t for t in range(old.shape[1]) if mask[i, t]]
        if not toks:
            continue
        d = sum(float(new[i, t]) - float(old[i, t]) for t in toks) / len(toks)
        if correct[i]:
            sets["c"].append(d)
            if shared[i]:
                sets["cs"].append(d)
        else:
            sets["w"].append(d)

    def mean(v):
        return sum(v) / len(v) if v else math.nan

    down = sum(d < 0 for d in sets["cs"]) / len(sets["cs"]) if sets["cs"] else math.nan
    return {"ld_correct_shared": mean(sets["cs"]), "ld_correct": mean(sets["c"]), "ld_wrong": mean(sets["w"]),
            "ld_displaced_frac": down}  # fmt: skip


def test_displacement_matches_a_float64_hand_computation():
    g = torch.Generator().manual_seed(0)
    old = torch.randn(6, 5, generator=g) - 3.0
    new = old + 0.1 * torch.randn(6, 5, generator=g)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [0, 0, 0, 0, 0],
                         [1, 1, 1, 1, 0]], dtype=torch.bool)  # fmt: skip
    old[~mask], new[~mask] = float("nan"), 5.0  # padding never counts
    correct = torch.tensor([True, True, True, False, True, False])
    shared = torch.tensor([True, False, True, False, True, False])  # row 4 is empty: in no set
    got = likelihood_displacement(old, new, mask, correct, shared)
    want = _by_hand(old, new, mask, correct, shared)
    for k in FIELDS:
        assert got[k] == pytest.approx(want[k], rel=1e-12, abs=1e-15), k
    assert (got["ld_n_correct_shared"], got["ld_n_correct"], got["ld_n_wrong"]) == (2, 3, 2)
    # a row that went down on a shared correct completion counts in the displaced fraction
    new2 = old.clone()
    new2[0] -= 1.0
    new2[2] += 1.0
    assert likelihood_displacement(old, new2, mask, correct, shared)["ld_displaced_frac"] == 0.5


def test_empty_sets_are_nan_and_null_in_json():
    old = torch.zeros(2, 3)
    mask = torch.ones(2, 3, dtype=torch.bool)
    got = likelihood_displacement(old, old + 0.5, mask, torch.tensor([False, False]), torch.tensor([False, False]))
    assert math.isnan(got["ld_correct"]) and math.isnan(got["ld_correct_shared"])
    assert math.isnan(got["ld_displaced_frac"]) and got["ld_wrong"] == pytest.approx(0.5)
    assert json.loads(dumps(got))["ld_correct"] is None
    # the ranks' means of the sums give the same ratios as the global sums (torchrun)
    a = displacement_sums(old, old + 0.5, mask, torch.tensor([True, False]), torch.tensor([True, False]))
    b = displacement_sums(old, old - 0.25, mask, torch.tensor([True, True]), torch.tensor([False, True]))
    fields = displacement_fields(dict(zip(SUMS, ((a + b) / 2).tolist())), world=2)
    assert fields["ld_correct"] == pytest.approx((0.5 - 0.25 - 0.25) / 3)
    assert fields["ld_correct_shared"] == pytest.approx((0.5 - 0.25) / 2) and fields["ld_displaced_frac"] == 0.5
    assert (fields["ld_n_correct"], fields["ld_n_wrong"], fields["ld_n_correct_shared"]) == (3, 1, 2)


def test_shared_tokens_are_those_of_a_wrong_completion_of_the_group():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 9, (12, 5), generator=g)
    mask = torch.rand(12, 5, generator=g) > 0.3
    correct = torch.rand(12, generator=g) > 0.5
    got = shared_with_wrong(ids, mask, correct, group_size=4)
    for i in range(12):
        group = range(i // 4 * 4, i // 4 * 4 + 4)
        wrong = {int(ids[j, t]) for j in group if not correct[j] for t in range(5) if mask[j, t]}
        mine = {int(ids[i, t]) for t in range(5) if mask[i, t]}
        assert bool(got[i]) == bool(correct[i] and mine & wrong), i
    assert got.any() and (correct & ~got).any()  # the case has both kinds


# ------------------------------------------------------------------------------------------- one update


@pytest.mark.parametrize("epochs", [1, 2])
def test_update_measures_against_a_forward_before_and_after(tmp_path, epochs):
    """policy_update with the flag on a fixed batch: the norm is the weights' own change, and the displacement is the
    one computed from forwards run here before and after the update (so the old log-probs the step used are the
    policy's before its first epoch)."""
    cfg = tiny_cfg(tmp_path / "run", log_mechanism=True, ppo_epochs=epochs, lr=1e-2, warmup_steps=0, kl_every=0,
                   loss="entropy_filter=null,entropy_coef=0.01")  # fmt: skip
    run = setup(cfg, cfg.loss_config())
    problems = run.task.sample(cfg.prompts_per_step, run.task_rng)
    torch.manual_seed(3)
    full = rollout(run.model, run.tok, problems, **run.sampling.kwargs())
    correct = torch.tensor([True, False, True, False, False, True, True, False])
    batch = Batch(full.prompt_ids, full.prompt_mask, full.completion_ids, full.completion_mask, full.texts,
                  correct.float(), correct)  # fmt: skip
    g = cfg.group_size
    old = token_logprobs(run.model, batch, cfg.temperature, None, g)
    before = {n: p.detach().clone() for n, p in run.model.named_parameters()}
    groups = prepare_groups(run.loss_cfg, batch.rewards, batch.completion_ids, batch.completion_mask, g)
    update = policy_update(run, batch, groups, Update(), step=1)
    assert update.skipped == 0
    new = token_logprobs(run.model, batch, cfg.temperature, None, g)
    by_hand = moved(run.model, before)
    mechanism = next(f for f in run.features if f.name == "mechanism")  # the --log-mechanism feature
    assert by_hand > 0 and mechanism.norm == pytest.approx(by_hand, rel=1e-6)
    shared = shared_with_wrong(batch.completion_ids, batch.completion_mask, correct, g)
    want = _by_hand(old.double(), new.double(), batch.completion_mask, correct, shared)
    got = displacement_fields(metrics_to_floats(mechanism.sums))
    for k in FIELDS:
        if math.isnan(want[k]):
            assert math.isnan(got[k]), k
        else:
            assert got[k] == pytest.approx(want[k], rel=1e-4, abs=1e-6), k
    assert not math.isnan(got["ld_correct"]) and not math.isnan(got["ld_wrong"]) and got["ld_wrong"] != 0


# ------------------------------------------------------------------------------------------- runs


def test_flag_parses_and_defaults_off():
    assert parse_args([])[0].log_mechanism is False
    assert parse_args(["--log-mechanism"])[0].log_mechanism is True


def test_records_have_the_fields_only_with_the_flag_and_training_is_the_same(tmp_path, monkeypatch):
    # pretend the completions whose text has an even length are right, so both sets are populated
    real = rollout_module.correctness_rewards
    monkeypatch.setattr(rollout_module, "correctness_rewards", lambda texts, _: [float(len(t) % 2 == 0) for t in texts])
    off = loop.train(tiny_cfg(tmp_path / "off", max_steps=2, eval_k=0, kl_every=0, save_model=False), LOSS)
    on = loop.train(tiny_cfg(tmp_path / "on", max_steps=2, eval_k=0, kl_every=0, save_model=False,
                             log_mechanism=True), LOSS)  # fmt: skip
    monkeypatch.setattr(rollout_module, "correctness_rewards", real)
    a, b = steps(tmp_path / "off"), steps(tmp_path / "on")
    assert all(not any(k in r for k in MECH) for r in a)
    for r in b:
        assert all(k in r for k in MECH), set(MECH) - set(r)
        assert r["update_norm"] > 0
        assert r["ld_n_correct"] + r["ld_n_wrong"] == r["completions"]
        assert (r["ld_correct"] is None) == (r["ld_n_correct"] == 0)
        assert (r["ld_correct_shared"] is None) == (r["ld_n_correct_shared"] == 0)
    assert any(r["ld_correct"] is not None for r in b) and all(r["ld_wrong"] is not None for r in b)
    assert [r["loss"] for r in b] == pytest.approx([r["loss"] for r in a], rel=1e-6)  # measuring changes nothing
    assert off["after"]["eval_acc"] == on["after"]["eval_acc"]


def test_update_norm_is_the_trust_regions_step_norm(tmp_path):
    """With a trust region of 1e-3 every step is projected: the step's norm is the radius, as the trust region itself
    measures it (`tr_step_norm_after`); and it is the change of the weights from the start to the end."""
    model, tok = tiny_model_and_tokenizer(0)
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    cfg = tiny_cfg(tmp_path / "run", max_steps=1, eval_k=0, kl_every=0, save_model=False, log_mechanism=True,
                   trust_region=1e-3)  # fmt: skip
    loop.train(cfg, LOSS, model_and_tokenizer=(model, tok))
    (r,) = steps(tmp_path / "run")
    assert r["tr_projected"] == 1 and r["update_norm"] == r["tr_step_norm_after"]
    assert r["update_norm"] == pytest.approx(1e-3, rel=1e-3)
    assert r["update_norm"] == pytest.approx(moved(model, start), rel=1e-6)


def test_a_skipped_update_has_norm_zero_and_no_displacement(tmp_path, monkeypatch):
    real = update_module.sgrpo_loss

    def bad_loss(*args, **kwargs):
        loss, metrics = real(*args, **kwargs)
        return NanGrad.apply(loss), metrics

    monkeypatch.setattr(update_module, "sgrpo_loss", bad_loss)
    loop.train(tiny_cfg(tmp_path / "run", max_steps=1, eval_k=0, kl_every=0, save_model=False, log_mechanism=True),
               LOSS)  # fmt: skip
    (r,) = steps(tmp_path / "run")
    assert r["skipped"] == 1 and r["update_norm"] == 0.0
    assert r["ld_wrong"] == pytest.approx(0.0, abs=1e-6)  # the same weights: the same log-probs


@pytest.mark.parametrize("what", [{"lora": True, "lora_r": 4, "ppo_epochs": 2}, {"train_layers": 1}])
def test_lora_and_partial_training(tmp_path, what):
    """The norm covers the trained parameters only (the LoRA adapters; the top layer): frozen weights never move."""
    model, tok = tiny_model_and_tokenizer(0)
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    cfg = tiny_cfg(tmp_path / "run", max_steps=1, eval_k=0, kl_every=0, save_model=False, log_mechanism=True,
                   lr=1e-2, **what)  # fmt: skip
    loop.train(cfg, LOSS, model_and_tokenizer=(model, tok))
    (r,) = steps(tmp_path / "run")
    assert r["update_norm"] > 0 and r["ld_wrong"] is not None and r["ld_n_wrong"] + r["ld_n_correct"] == 8
    if "train_layers" in what:  # every trained weight existed before: the norm is the model's own change
        assert r["update_norm"] == pytest.approx(moved(model, start), rel=1e-6)
