"""The stability study: the two collapse rules on synthetic trajectories, the per-run metrics and the aggregation
against hand-computed values, the LoRA-disabled reference against a separately loaded base model, and the harness end
to end on the tiny model (two arms x two seeds x two steps), interrupted and resumed."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from study.stability import (
    CollapseRules,
    entropy_blowup,
    first_event,
    low_entropy_collapse,
    run_metrics,
    signal_death,
)

RULES = CollapseRules(window=3, low_entropy=0.05, rise_factor=2.0, rise_min=0.5, drop=0.1)


def traj(entropy, accuracy, fmt=None, zero_var=None):
    n = len(entropy)
    fmt = fmt or [0.8] * n
    zero_var = zero_var or [0.5] * n
    return [
        {"step": i + 1, "entropy_mean": h, "accuracy": a, "format_frac": f, "zero_var_frac": z}
        for i, (h, a, f, z) in enumerate(zip(entropy, accuracy, fmt, zero_var))
    ]


# ----------------------------------------------------------------------------------------------------- collapse rules


def test_low_entropy_collapse_needs_the_whole_window():
    steps = traj([1.0, 0.5, 0.01, 0.02, 0.01], [0.5, 0.5, 0.2, 0.2, 0.2], zero_var=[0.5, 0.5, 1.0, 1.0, 1.0])
    assert first_event(steps, low_entropy_collapse, RULES) == 5
    assert not low_entropy_collapse(steps[:4], RULES)  # only 2 qualifying steps
    # a solved batch (accuracy 1) is not a collapse, nor is a low entropy that still has a learning signal
    solved = traj([0.01] * 4, [1.0] * 4, zero_var=[1.0] * 4)
    assert first_event(solved, low_entropy_collapse, RULES) is None
    signal_left = traj([0.01] * 4, [0.3] * 4, zero_var=[0.75] * 4)
    assert first_event(signal_left, low_entropy_collapse, RULES) is None


def test_entropy_blowup_rule():
    # entropy from 1.0 to 2.6 (> 2x and > +0.5) while accuracy and format fall by more than 0.1: collapse at step 6
    ent = [1.0, 1.0, 1.0, 2.5, 2.6, 2.7]
    acc = [0.5, 0.5, 0.5, 0.3, 0.2, 0.1]
    fmt = [0.9, 0.9, 0.9, 0.5, 0.4, 0.3]
    assert first_event(traj(ent, acc, fmt), entropy_blowup, RULES) == 6
    # the same entropy rise while accuracy holds (exploration that still pays) is not a collapse
    assert first_event(traj(ent, [0.5] * 6, fmt), entropy_blowup, RULES) is None
    # nor while the format holds
    assert first_event(traj(ent, acc, [0.9] * 6), entropy_blowup, RULES) is None
    # a rise of 2x that is under rise_min nats (0.1 -> 0.25) is not a blow-up
    small = [0.1, 0.1, 0.1, 0.25, 0.25, 0.25]
    assert first_event(traj(small, acc, fmt), entropy_blowup, RULES) is None
    # one step below the threshold inside the window breaks it
    assert not entropy_blowup(traj([1.0, 1.0, 1.0, 2.5, 1.5, 2.7], acc, fmt), RULES)
    # records without format_frac (older runs) never trip it
    old = [{k: v for k, v in r.items() if k != "format_frac"} for r in traj(ent, acc, fmt)]
    assert not entropy_blowup(old, RULES)


def test_signal_death_rule():
    # the stress search's grpo_nokl: the batch goes all-wrong with no learning signal at moderate entropy
    acc = [0.1, 0.3, 0.2, 0.0, 0.0, 0.05, 0.0, 0.0, 0.0]
    zv = [0.75, 0.5, 0.5, 1.0, 1.0, 0.75, 1.0, 1.0, 1.0]
    steps = traj([1.3, 1.0, 0.6, 0.4, 0.35, 0.35, 0.35, 0.35, 0.35], acc, zero_var=zv)
    assert first_event(steps, signal_death, RULES) == 9  # steps 7, 8, 9; steps 4-5 are only 2 in a row
    assert first_event(steps, low_entropy_collapse, RULES) is None  # entropy 0.35 > 0.05
    assert first_event(steps, entropy_blowup, RULES) is None  # entropy fell
    # a run that never had a correct completion (e.g. a random model) is not a collapse of this kind
    never = traj([1.0] * 6, [0.0] * 6, zero_var=[1.0] * 6)
    assert first_event(never, signal_death, RULES) is None
    # all wrong but with signal left (groups differ in reward, e.g. a format reward) is not dead
    assert first_event(traj([1.0] * 9, acc, zero_var=[0.9] * 9), signal_death, RULES) is None


# ----------------------------------------------------------------------------------------------------- metrics


def test_run_metrics_hand_computed():
    steps = []
    grads = [0.5, 2.0, None, 4.0]  # None: a step whose gradient was non-finite (strict JSON null)
    for i, g in enumerate(grads):
        steps.append(
            {
                "step": i + 1,
                "entropy_mean": [1.0, 0.8, 0.6, 0.9][i],
                "accuracy": [0.25, 0.5, 0.75, 0.25][i],
                "zero_var_frac": 0.5,
                "format_frac": 0.5,
                "grad_norm": g,
                "kl_from_init": [None, 0.1, None, 0.3][i],
                "step_s": 2.0 + i,
                "tokens_per_s": 10.0 * (i + 1),
                "peak_mem_mb": 100.0 + i,
                "train_peak_mem_mb": 50.0 + i,
            }
        )
    evals = [{"step": 0, "event": "eval", "eval_acc": 0.2}, {"step": 4, "event": "eval", "eval_acc": 0.5}]
    summary = {"before": {"eval_acc": 0.2}, "after": {"eval_acc": 0.5, "eval_pass@4": 0.6, "eval_maj@4": 0.4}}
    rules = CollapseRules(window=2)
    m = run_metrics(evals + steps, summary, max_grad_norm=1.0, rules=rules)
    assert m["steps"] == 4
    assert m["grad_norm_mean"] == pytest.approx((0.5 + 2.0 + 4.0) / 3)
    assert m["grad_norm_max"] == 4.0
    assert m["clipped_frac"] == pytest.approx(2 / 3)
    assert m["entropy_start"] == pytest.approx(0.9)  # mean of the first 2 (the window)
    assert m["entropy_end"] == pytest.approx(0.75)
    assert m["entropy_min"] == 0.6
    assert m["success_std_2nd_half"] == pytest.approx(0.25)  # pstdev(0.75, 0.25)
    assert m["kl_from_init_end"] == 0.3
    assert m["heldout_gain"] == pytest.approx(0.3)
    assert m["pass@4_after"] == 0.6 and m["maj@4_after"] == 0.4
    assert m["step_s_mean"] == pytest.approx(3.5)
    assert m["peak_mem_mb"] == 103.0 and m["train_peak_mem_mb"] == 53.0
    assert m["collapse"] is False


def test_aggregate_and_paired_hand_computed():
    from study.report import aggregate, paired

    def run(arm, seed, after, collapse=False):
        return {"arm": arm, "seed": seed, "heldout_after": after, "heldout_gain": after - 0.2, "collapse": collapse,
                "collapse_low_entropy": collapse, "collapse_blowup": False, "collapse_signal_death": False}  # fmt: skip

    runs = [run("grpo", 0, 0.40), run("grpo", 1, 0.50), run("grpo", 2, 0.60)]
    runs += [run("s_grpo", 0, 0.50), run("s_grpo", 1, 0.70), run("s_grpo", 2, 0.60, collapse=True)]
    agg = aggregate(runs, ["grpo", "s_grpo"])
    assert list(agg) == ["grpo", "s_grpo"]
    assert agg["grpo"]["heldout_after"]["mean"] == pytest.approx(0.5)
    assert agg["grpo"]["heldout_after"]["se"] == pytest.approx(0.1 / math.sqrt(3))  # sd 0.1
    assert agg["s_grpo"]["collapse"]["mean"] == pytest.approx(1 / 3)
    assert agg["s_grpo"]["collapse_runs"] == {"low_entropy": 1, "blowup": 0, "signal_death": 0, "runs": 3}
    assert agg["s_grpo"]["heldout_after_std_across_seeds"] == pytest.approx(0.1)
    d = paired(runs)["s_grpo"]["heldout_after"]
    # differences 0.1, 0.2, 0.0: mean 0.1, sd 0.1, se 0.0577 -> 0.1 < 2 SE: not significant
    assert d["diff"] == pytest.approx(0.1) and d["se"] == pytest.approx(0.1 / math.sqrt(3))
    assert d["n"] == 3 and d["significant"] is False
    runs[4]["heldout_after"], runs[5]["heldout_after"] = 0.6, 0.7  # differences 0.1, 0.1, 0.1 ... plus noise
    runs[3]["heldout_after"] = 0.52  # 0.12, 0.10, 0.10: mean 0.107, se 0.0067 -> significant
    assert paired(runs)["s_grpo"]["heldout_after"]["significant"] is True


def test_research_arms_are_also_paired_against_s_grpo():
    """A study with research arms (variants of S-GRPO) gets a second paired table, against s_grpo; the main study's
    report (no research arm) keeps the one against grpo."""
    from study.report import aggregate, baselines, markdown, paired

    def run(arm, seed, after):
        return {"arm": arm, "seed": seed, "heldout_after": after, "heldout_gain": after - 0.2, "collapse": False,
                "collapse_low_entropy": False, "collapse_blowup": False, "collapse_signal_death": False}  # fmt: skip

    runs = [run("grpo", s, a) for s, a in enumerate([0.40, 0.50, 0.60])]
    runs += [run("s_grpo", s, a) for s, a in enumerate([0.50, 0.70, 0.60])]
    assert baselines(runs) == ["grpo"]
    runs += [run("s_grpo_tr", s, a) for s, a in enumerate([0.56, 0.74, 0.65])]
    assert baselines(runs) == ["grpo", "s_grpo"]
    diffs = {b: paired(runs, b, ["grpo", "s_grpo", "s_grpo_tr"]) for b in baselines(runs)}
    d = diffs["s_grpo"]["s_grpo_tr"]["heldout_after"]  # differences 0.06, 0.04, 0.05: mean 0.05, sd 0.01
    assert d["diff"] == pytest.approx(0.05) and d["se"] == pytest.approx(0.01 / math.sqrt(3)) and d["significant"]
    assert list(diffs["s_grpo"]) == ["grpo", "s_grpo_tr"] and "s_grpo" not in diffs["s_grpo"]
    text = markdown("t", {}, aggregate(runs, ["grpo", "s_grpo", "s_grpo_tr"]), diffs, runs)
    assert text.count("## Paired difference against") == 2
    below = text.split("## Paired difference against `s_grpo`")[1]
    assert "| s_grpo_tr | +0.050 +- 0.006 |" in below and "| grpo | -0.100 +- 0.058 n.s. |" in below


# ----------------------------------------------------------------------------------------------------- grid and CLI


def test_set_checks_fields_and_values_before_running(capsys):
    from study.grid import parse_sets

    assert parse_sets(["lr=5e-4", "max-steps=60"]) == {"lr": "5e-4", "max_steps": "60"}
    with pytest.raises(ValueError, match="'lrate' is not a trainer field"):
        parse_sets(["lrate=1"])
    with pytest.raises(ValueError, match="the study sets seed itself"):
        parse_sets(["seed=3"])
    with pytest.raises(ValueError, match="expected field=value"):
        parse_sets(["lr"])
    with pytest.raises(ValueError, match="refused"):
        parse_sets(["lr=2"])  # lr <= 1
    assert "--lr" in capsys.readouterr().err


def test_study_cli_refuses_bad_arms_and_seeds(capsys):
    from study.__main__ import main

    for argv, needle in ((["--arms", "grpo,nope"], "expected arms from"), (["--seeds", "0,x"], "comma-separated")):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2
        assert needle in capsys.readouterr().err


def test_study_cli_refuses_a_duplicated_set(tmp_path, capsys):
    """`--set lr=1e-4 --set lr=2e-4` (or the same field spelt with - and _): refused, both values named, before any
    file is written (the last one silently won)."""
    from study.__main__ import main

    for sets in (["lr=1e-4", "lr=2e-4"], ["max-steps=2", "max_steps=3"]):
        argv = ["--arms", "s_grpo", "--seeds", "0", *(a for s in sets for a in ("--set", s))]
        assert main([*argv, "--out", str(tmp_path / "out"), "--work", str(tmp_path / "work")]) == 2
        err = capsys.readouterr().err
        assert "given twice" in err and all(repr(s) in err for s in sets), err
        assert not (tmp_path / "out").exists()


def _unwritable(tmp_path: Path, how: str) -> Path:
    if how == "under_a_file":
        (tmp_path / "file").write_text("")
        return tmp_path / "file" / "study"
    if os.geteuid() != 0:
        ro = tmp_path / "read_only"
        ro.mkdir()
        ro.chmod(0o500)
        return ro / "study"
    return Path("/sys/sgrpo-kernels-study-test")  # root writes through permissions; sysfs refuses it


@pytest.mark.parametrize("flag", ["--out", "--work"])
@pytest.mark.parametrize("how", ["under_a_file", "read_only"])
def test_study_cli_refuses_an_unwritable_folder(tmp_path, capsys, flag, how):
    """--out / --work where nothing can be written: a one-line refusal naming the flag and the path (exit 2), no
    traceback, no run started."""
    from study.__main__ import main

    bad = _unwritable(tmp_path, how)
    dirs = {"--out": str(tmp_path / "out"), "--work": str(tmp_path / "work"), flag: str(bad)}
    argv = ["--arms", "s_grpo", "--seeds", "0", "--set", "max-steps=1", *(a for kv in dirs.items() for a in kv)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"{flag} {bad}: cannot write there" in err and "Traceback" not in err, err
    assert not (tmp_path / "work").exists() or flag == "--out"


def test_a_results_folder_holds_one_regime(tmp_path):
    from study.runner import Manifest

    Manifest(tmp_path, "a", {"lr": "1e-4"}, {}).save()
    with pytest.raises(ValueError, match="holds the study of regime 'a'"):
        Manifest(tmp_path, "a", {"lr": "2e-4"}, {})


# ----------------------------------------------------------------------------------------------------- LoRA reference


def test_lora_reference_is_the_base_model(tmp_path):
    pytest.importorskip("peft")
    import torch
    from conftest import tiny_cfg

    from train.model import load_model_and_tokenizer
    from train.policy import reference_logprobs, token_logprobs
    from train.rollout import rollout
    from train.setup import setup

    cfg = tiny_cfg(tmp_path / "run", preset="grpo", lora=True, lora_r=4, kl_every=0)
    run = setup(cfg, cfg.loss_config())
    assert run.ref_model is None  # no second model resident
    with torch.no_grad():  # move the adapters away from their identity init, so the test can tell them apart
        for name, p in run.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    problems = run.task.sample(2, run.task_rng)
    batch = rollout(run.model, run.tok, problems, group_size=cfg.group_size, max_new_tokens=cfg.max_new_tokens,
                    temperature=cfg.temperature, top_p=1.0)  # fmt: skip
    ref = reference_logprobs(run.model, run.ref_model, batch, cfg.temperature, run.backend, cfg.group_size)
    base, _ = load_model_and_tokenizer("tiny", torch.device("cpu"), torch.float32, cfg.seed)
    expected = token_logprobs(base, batch, cfg.temperature, None, cfg.group_size)
    policy = token_logprobs(run.model, batch, cfg.temperature, None, cfg.group_size)
    mask = batch.completion_mask
    torch.testing.assert_close(ref[mask], expected[mask], rtol=1e-5, atol=1e-5)
    assert (policy[mask] - expected[mask]).abs().max() > 1e-3  # the adapters do change the policy
    # and the context restored them: the policy's log-probs after equal those before
    torch.testing.assert_close(token_logprobs(run.model, batch, cfg.temperature, None, cfg.group_size), policy)


# ----------------------------------------------------------------------------------------------------- end to end


TINY = ["--set", "model=tiny", "--set", "max_steps=2", "--set", "prompts_per_step=2", "--set", "group_size=4",
        "--set", "max_new_tokens=6", "--set", "eval_problems=6", "--set", "eval_k=2", "--set", "eval_k_problems=3",
        "--set", "probe_size=3", "--set", "kl_every=1"]  # fmt: skip


def _study(tmp_path, *extra):
    root = Path(__file__).resolve().parents[1]
    dirs = ["--out", str(tmp_path / "out"), "--work", str(tmp_path / "work")]
    argv = [sys.executable, "-m", "train.study", "--arms", "s_grpo,grpo_nokl", "--seeds", "0,1", "--name", "t",
            *dirs, "--progress", "false", *TINY, *extra]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(root) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return argv, env, root


@pytest.mark.slow
def test_study_end_to_end_interrupted_and_resumed(tmp_path):
    pytest.importorskip("transformers")
    argv, env, root = _study(tmp_path, "--workers", "1", "--threads", "1")
    # Ctrl-C as a terminal sends it: with SIGINT at its default in the child even when this suite was started in the
    # background (`cmd &` leaves SIGINT ignored in what it starts, and Python then never raises KeyboardInterrupt)
    proc = subprocess.Popen(argv, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # fmt: skip
    first = tmp_path / "out" / "runs" / "s_grpo" / "seed0" / "summary.json"
    deadline = time.time() + 240
    while not first.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    assert first.exists(), proc.communicate()[0] if proc.poll() is not None else "no run finished in time"
    time.sleep(1.0)  # the second run (grpo_nokl seed 0) is under way: interrupt the study
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=180)
    assert proc.returncode == 130, out
    assert "study interrupted" in out
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    done_before = set(manifest["runs"])
    assert "s_grpo/seed0" in done_before and len(done_before) < 4

    res = subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"4 runs, {len(done_before)} already finished, {4 - len(done_before)} to run" in res.stdout
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert set(manifest["runs"]) == {"s_grpo/seed0", "s_grpo/seed1", "grpo_nokl/seed0", "grpo_nokl/seed1"}
    entry = manifest["runs"]["s_grpo/seed1"]
    assert entry["git_sha"] is not None and entry["torch"] and entry["wall_s"] > 0 and entry["threads"] == 1
    assert manifest["overrides"]["max_steps"] == "2"
    out_dir = tmp_path / "out"
    for name in ("study.csv", "study.json", "study.md", "study.png"):
        assert (out_dir / name).is_file(), name
    assert not any(p.name == "checkpoint" for p in out_dir.rglob("*"))  # checkpoints stay in the work folder
    rows = (out_dir / "study.csv").read_text().splitlines()
    assert len(rows) == 5
    study = json.loads((out_dir / "study.json").read_text())
    assert study["arms"]["s_grpo"]["seeds"] == [0, 1] and study["arms"]["grpo_nokl"]["seeds"] == [0, 1]
    # every step record of a published run has the new fields the stability metrics read
    recs = [json.loads(x) for x in (out_dir / "runs/s_grpo/seed1/metrics.jsonl").read_text().splitlines()]
    assert all("format_frac" in r and "train_peak_mem_mb" in r for r in recs if "event" not in r)
    # --report recomputes the same tables from the files alone
    md = (out_dir / "study.md").read_text()
    (out_dir / "study.md").unlink()
    rep = subprocess.run([sys.executable, "-m", "study", "--report", str(out_dir), "--no-figure"], cwd=root,
                         env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert rep.returncode == 0, rep.stderr
    assert (out_dir / "study.md").read_text() == md
    # a third call has nothing to do
    again = subprocess.run(argv + ["--no-figure"], cwd=root, env=env, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and "4 runs, 4 already finished, 0 to run" in again.stdout


# ----------------------------------------------------------------------------------------------- committed results


REPO = Path(__file__).resolve().parents[1]
STUDY_RESULTS = REPO / "benchmarks" / "results" / "study"


def _git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True)


def test_a_study_run_files_are_not_git_ignored():
    """The run files are what `--report` recomputes every published figure from: they must be committable. (`runs/` in
    .gitignore once matched OUT/runs/ too, so no run file of a published study ever reached the repository.)"""
    if _git("rev-parse", "--is-inside-work-tree").stdout.strip() != "true":
        pytest.skip("not a git checkout")
    for name in ("default", "stress", "memory-full", "search/lr2e-3"):
        for leaf in ("config.json", "metrics.jsonl", "summary.json"):
            path = STUDY_RESULTS / name / "runs" / "grpo" / "seed0" / leaf
            probe = _git("check-ignore", "-v", str(path.relative_to(REPO)))
            assert probe.returncode == 1, f"{path.relative_to(REPO)} is git-ignored: {probe.stdout.strip()}"
    # the scratch trees at the repository's root stay ignored
    assert _git("check-ignore", "runs/study/default/grpo/seed0/summary.json").returncode == 0


# ----------------------------------------------------------------------------------------------- research arms


def test_research_arms_run_as_the_trainer_would_and_stay_out_of_the_default(tmp_path):
    """Every RESEARCH_ARMS arm's --preset / --loss is accepted by the trainer (RunSpec.config) and gives the intended
    LossConfig; --arms takes names from both dicts; the default (no --arms) stays the main comparison."""
    import dataclasses

    from sgrpo_kernels import rl
    from study.__main__ import build_parser
    from study.grid import ARMS, RESEARCH_ARMS, grid

    assert not set(ARMS) & set(RESEARCH_ARMS)
    assert build_parser().parse_args([]).arms == list(ARMS)
    assert build_parser().parse_args(["--arms", "s_grpo,s_grpo_afn"]).arms == ["s_grpo", "s_grpo_afn"]
    specs = grid(list(RESEARCH_ARMS), [0], {}, tmp_path / "work", tmp_path / "out")
    got = {spec.arm.name: spec.config().loss_config() for spec in specs}
    q75 = "quantile:0.75"  # the s_grpo arm's filter (PRESET_LOSS_DEFAULTS)
    want = {
        "grpo_tc_causal": dataclasses.replace(rl.preset("grpo_tc"), conflict_strategy="causal"),
        "grpo_tc_anywhere": dataclasses.replace(rl.preset("grpo_tc"), conflict_detect="anywhere"),
        "s_grpo_anywhere": dataclasses.replace(rl.preset("s_grpo"), entropy_filter=q75, conflict_detect="anywhere"),
        "s_grpo_afn": dataclasses.replace(rl.preset("s_grpo_afn"), name="s_grpo", entropy_filter=q75),
        "s_grpo_coverage": dataclasses.replace(rl.preset("s_grpo"), entropy_filter="coverage"),
        "s_grpo_pc": dataclasses.replace(rl.preset("s_grpo"), entropy_filter=q75, prob_compensation="positive"),
        "s_grpo_ds": dataclasses.replace(rl.preset("s_grpo"), entropy_filter=q75),  # (trainer flags: Arm.train)
        "s_grpo_tr": dataclasses.replace(rl.preset("s_grpo"), entropy_filter=q75),
        "s_grpo_gp": dataclasses.replace(rl.preset("s_grpo"), entropy_filter=q75),
        "s_grpo_gtl": dataclasses.replace(rl.preset("s_grpo"), entropy_filter=q75),
        "grpo_nokl_tr": dataclasses.replace(rl.preset("grpo"), beta=0.0),  # (trainer flags: Arm.train)
    }
    # the v2 study's arms: grpo or grpo without the reference, their lr (and cap, warm-up, epochs) as trainer flags
    want |= {a: rl.preset("grpo") for a in ("grpo_lr1e-4", "grpo_lr1.5e-4")}
    want |= {a: dataclasses.replace(rl.preset("grpo"), beta=0.0) for a in RESEARCH_ARMS if a.startswith("grpo_nokl_")}
    # phase 2's stabilizers: the field's presets as the RL layer defines them (pre-registration section 9.1)
    want |= {f"{m}_lr2.5e-4": rl.preset(m) for m in ("dppo_tv", "cispo", "clip_cov", "kl_cov")}
    want |= {f"{m}_ppo2_lr2.5e-4": rl.preset(m) for m in ("dppo_tv", "cispo", "clip_cov", "kl_cov")}  # phase 2b
    want |= {m: rl.preset(m) for m in ("dppo_tv", "dppo_kl", "cispo", "sapo", "gmpo", "clip_cov", "kl_cov")}
    assert got == want


def _study_folders() -> list[Path]:
    return sorted(p.parent for p in STUDY_RESULTS.rglob("study.json"))


def test_every_published_study_recomputes_from_its_run_files(tmp_path):
    """Each committed results folder holds the run files its tables came from, and `--report` on a copy of them gives
    the committed study.csv, study.json, study.md and study_heldout.csv again (the figures are left out: pictures of
    the same numbers). A folder whose run files are missing fails here rather than publishing numbers nobody can
    recompute."""
    import shutil

    from study.report import write_report

    folders = _study_folders()
    if not folders:
        pytest.skip("no published study in this checkout")
    for folder in folders:
        name = folder.relative_to(STUDY_RESULTS)
        runs = sorted(folder.glob("runs/*/seed*/summary.json"))
        assert runs, f"{name}: study.json without its run files (runs/ARM/seedK/summary.json)"
        copy = tmp_path / str(name).replace("/", "_")
        reports = ("study.csv", "study.json", "study.md", "study_heldout.csv")
        shutil.copytree(folder, copy, ignore=shutil.ignore_patterns(*reports, "*.png"))
        order = list(json.loads((folder / "study.json").read_text())["arms"])
        write_report(copy, order=order, figure=False)
        assert (copy / reports[-1]).exists() == (folder / reports[-1]).exists(), f"{name}/{reports[-1]}"
        for leaf in (r for r in reports if (folder / r).exists()):
            assert (copy / leaf).read_text() == (folder / leaf).read_text(), f"{name}/{leaf} does not recompute"


def test_the_manifest_names_the_cpus_vector_isa():
    """Two machines both called "AMD EPYC", with and without AVX-512 / bf16 instructions, run different kernels (other
    floats, other timings): a run's manifest entry and the benchmarks name the family, model and ISA. Before: the name
    alone."""
    from study.runner import environment
    from train.run.machine import cpu_info, cpu_label

    text = "processor\t: 0\ncpu family\t: 25\nmodel\t\t: 17\nmodel name\t: AMD EPYC\n"
    text += "flags\t\t: fpu avx2 avx512f avx512_bf16\n"
    text += "processor\t: 1\nmodel name\t: other\nflags\t\t: amx_bf16\n"  # the first processor's entry is the one
    want = {"cpu": "AMD EPYC", "family": "25", "model": "17", "isa": ["avx2", "avx512f", "avx512_bf16"]}
    assert cpu_info(text) == want
    assert cpu_info("")["isa"] == [] and cpu_info("")["family"] is None
    machine = environment()["machine"]
    assert {"cpu", "cores", "family", "model", "isa"} <= set(machine) and machine["isa"] == cpu_info()["isa"]
    assert cpu_label().startswith(cpu_info()["cpu"])
