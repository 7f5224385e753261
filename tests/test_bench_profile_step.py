"""benchmarks/profile_step.py and benchmarks/step_passes.py: every wrap target of the trainer's current layout is
found (a moved function would silently lose its pass), and a tiny-model profile attributes every pass of a step:
the rows add up to the step, every LM-head call has its caller, and a step with a sampler correction runs the LM head
once per optimizer pass (no duplicate)."""

from __future__ import annotations

import json

import pytest
import torch

from benchmarks import profile_step, step_passes


@pytest.fixture
def unwrapped(monkeypatch):
    """The trainer as it was after the test: every wrapper removed (before monkeypatch undoes its own patches)."""
    import train.__main__  # noqa: F401 -- the modules install() wraps, as profile_step imports them

    yield
    step_passes.uninstall()


@pytest.mark.parametrize("phases", [True, False])
def test_install_finds_every_target(unwrapped, phases):
    assert step_passes.install(phases) == []


def test_uninstall_puts_the_functions_back(unwrapped):
    from train import loss, step

    before = (loss.sgrpo_loss, step.optimizer_step, torch.Tensor.backward)
    step_passes.install(False)
    assert loss.sgrpo_loss is not before[0]
    step_passes.uninstall()
    assert (loss.sgrpo_loss, step.optimizer_step, torch.Tensor.backward) == before
    assert step_passes.install(False) == []  # and a second install finds them all again


def sampler_and_rewards(monkeypatch):
    """HF generate returning sampler log-probs (so the step makes a sampler correction, as with vLLM) and rewards
    that vary within each group (so the update moves the weights and the mechanism's forward sees new ones)."""
    from train import rollout
    from train.engines.base import Generated
    from train.engines.hf import HFEngine

    generate = HFEngine.generate

    def with_logprobs(self, *args, **kwargs):
        out = generate(self, *args, **kwargs)
        return Generated(out.completion_ids, torch.full(out.completion_ids.shape, -1.0))

    def alternating(texts, answers, format_weight):
        correct = torch.arange(len(texts)) % 2 == 0
        return correct.float(), correct

    monkeypatch.setattr(HFEngine, "generate", with_logprobs)
    monkeypatch.setattr(rollout, "score", alternating)


def test_tiny_profile_attributes_every_pass(unwrapped, monkeypatch, tmp_path):
    sampler_and_rewards(monkeypatch)
    sets = ["model=tiny", "prompts_per_step=2", "group_size=4", "max_new_tokens=6", "log_mechanism=true",
            "kl_every=1", "probe_size=2", "tis_cap=2", "lr=0.01"]  # fmt: skip
    argv = ["--regime", "default", "--arm", "grpo_nokl_tr", "--steps", "2", "--warmup", "1", "--eval-problems", "2"]
    argv += [x for s in sets for x in ("--set", s)] + ["--out", str(tmp_path / "out")]
    argv += ["--output-dir", str(tmp_path / "run")]
    assert profile_step.main(argv) == 0
    res = json.loads((tmp_path / "out" / "default_grpo_nokl_tr.json").read_text())
    raw = json.loads((tmp_path / "out" / "raw_grpo_nokl_tr.pyjson").read_text())
    assert res["not_wrapped"] == []
    p = res["profile"]
    rows = {r["pass"]: r for r in p["rows"]}

    # the rows add up: a step's calls' self times (none negative) come to the trainer's own step_s of that step
    # (train_step, the engine's sync and the KL probe; the rows add only the commit and a print)
    recs = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines() if x.strip()]
    step_s = {r["step"]: r["step_s"] for r in recs if "step_s" in r and r.get("event") is None}
    for st in p["measured_steps"]:
        calls = raw["calls"][str(st)]
        assert min(c["s"] for c in calls) >= 0
        assert step_s[st] - 0.005 <= sum(c["s"] for c in calls) <= 1.5 * step_s[st] + 0.05
    assert sum(r["s_per_step"] for r in p["rows"]) == pytest.approx(p["step_s"], rel=1e-9)
    assert p["step_s"] == pytest.approx(sum(step_s[st] for st in p["measured_steps"]) / 2, rel=0.5, abs=0.05)

    # every pass has its row
    expected = [
        "rollout: HFEngine.generate", "weight sync: HFEngine.sync", "rollout: rewards", "advantages (prepare_groups)",
        "decoder forward <- loss_function (train/loss.py:forward_loss) (grad)",
        "decoder forward <- measure (train/features/mechanism.py) (no grad)",
        "decoder forward <- kl_from_init (train/probe.py) (no grad)",
        "sampler correction: mismatch, TIS", "sgrpo_loss (policy_loss math)", "LM head backward (linear_logprobs_bwd)",
        "backward (decoder + loss math)", "clip_grad_norm_", "optimizer step (AdamW + features)",
        "trust region: rl.TrustRegion.project (step norm, projection)", "mechanism measure",
        "mechanism: update norm (step_norm)", "step record (train/record.py)", "features: after_update",
        "step guard: copy of the trained weights and Adam state (StepGuard.take)",
        "step guard: non-finite check (StepGuard.non_finite)",
    ]  # fmt: skip
    assert [e for e in expected if e not in rows] == []
    snapshots = [r for r in rows if r.startswith("copy of the trained weights")]
    assert len(snapshots) == 2  # the mechanism's (theta before the step) and the trust region's (before its pass)

    # every LM-head call has its caller; one per optimizer pass in the loss (the sampler correction reads its
    # log-probs), one for the mechanism, one for the probe; none computes what the step already had
    heads = {r: rows[r] for r in rows if r.startswith("LM head linear_logprobs")}
    assert [r for r in heads if "<- ?" in r] == []
    fused = "LM head linear_logprobs <- sgrpo_loss (sgrpo_kernels/rl/fused.py, via train/loss.py:forward_loss)"
    assert heads[fused + " (fwd, grad)"]["calls_per_step"] == 1
    assert heads["LM head linear_logprobs <- measure (train/features/mechanism.py) (fwd)"]["calls_per_step"] == 1
    assert heads["LM head linear_logprobs <- kl_from_init (train/probe.py) (fwd)"]["calls_per_step"] == 1
    assert len(heads) == 3
    assert [r for r, v in heads.items() if v["duplicate_of"]] == []
    assert [r["rollout_logp_diff"] is not None for r in recs if "step_s" in r and r.get("event") is None] == [True] * 3


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--regime", "bogus"], "--regime 'bogus': expected one of"),
        (["--arms", "grpo_nokl,nope"], "--arms: unknown arm 'nope'"),
        (["--steps", "0"], "--steps 0: expected an integer >= 1"),
        (["--warmup", "-1"], "--warmup -1: expected an integer >= 0"),
        (["--threads", "0"], "--threads 0: expected an integer >= 1"),
        (["--out", "AFILE"], "--out AFILE: exists and is not a folder"),
    ],
)
def test_bad_arguments_are_refused_before_any_run(argv, words, tmp_path, monkeypatch, capsys):
    """An unknown regime or arm was a KeyError in the child process, after --out and a temporary run folder were
    made; a file as --out a FileExistsError."""
    import subprocess

    from benchmarks import profile_step

    monkeypatch.chdir(tmp_path)
    (tmp_path / "AFILE").write_text("x")
    monkeypatch.setattr(subprocess, "call", lambda *a, **k: pytest.fail("a profiled run started"))
    with pytest.raises(SystemExit) as exc:
        profile_step.main(argv)
    assert exc.value.code == 2 and words in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["AFILE"]  # nothing made
