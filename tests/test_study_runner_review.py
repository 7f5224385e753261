"""The study's runner (study/runner.py, adopt.py, __main__.py) against what a review of 2026-11-30 found: a stale
checkpoint of another configuration in the work folder was resumed and published as this run; two studies into one
results folder lost each other's manifest entries; a study killed outright (or its terminal closed) left its trainers
running; a full disk while publishing was a traceback that dropped a finished sibling; the report after a call with
fewer --arms than the manifest's did not match its own Regenerate line; study.adopt replaced a finished run
silently."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_train_study_stats import write_run

from study import runner
from study.grid import ARMS, REGIMES, RunSpec, grid
from study.results import copy_run_files
from study.trainer import dumps

OVERRIDES = {**REGIMES["default"], "model": "tiny", "max_steps": "2"}


def _write_config(folder: Path, spec: RunSpec, **changed) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    config = json.loads(dumps(dataclasses.asdict(spec.config()))) | changed
    (folder / "config.json").write_text(json.dumps({"train": config}))


def test_a_checkpoint_of_another_configuration_in_the_work_folder_is_refused(tmp_path):
    """It was resumed (the trainer lets max_steps change on --resume) and published with the new config.json: its
    learning rates were the old schedule's."""
    (spec,) = grid(["grpo"], [0], OVERRIDES, tmp_path / "work", tmp_path / "out")
    (spec.work_dir / "checkpoint").mkdir(parents=True)
    _write_config(spec.work_dir, spec)
    runner.check_work_checkpoints([spec])  # its own: resumed as before
    _write_config(spec.work_dir, spec, max_steps=3)
    with pytest.raises(ValueError, match=r"work/grpo/seed0: a checkpoint that grpo/seed0 would resume, of another "
                                         r"configuration: max_steps: 3 != 2; move that folder away"):  # fmt: skip
        runner.check_work_checkpoints([spec])


def test_a_second_study_into_the_same_results_folder_is_refused(tmp_path):
    first = runner.StudyLock(tmp_path / "out")
    with pytest.raises(ValueError, match=rf"out is in use by another study \(pid {os.getpid()}\)"):
        runner.StudyLock(tmp_path / "out")
    first.release()
    assert not (tmp_path / "out" / ".study.lock").exists()
    runner.StudyLock(tmp_path / "out").release()  # free again


def test_recording_a_run_keeps_the_entries_written_meanwhile(tmp_path):
    manifest = runner.Manifest(tmp_path, "t", {"max_steps": "2"}, {})
    manifest.save()
    other = json.loads((tmp_path / "manifest.json").read_text())
    other["runs"]["grpo_nokl/seed0"] = {"wall_s": 1.0}  # (adopted, or written by another process since)
    (tmp_path / "manifest.json").write_text(json.dumps(other))
    manifest.record("grpo/seed0", {"wall_s": 2.0})
    assert set(json.loads((tmp_path / "manifest.json").read_text())["runs"]) == {"grpo/seed0", "grpo_nokl/seed0"}


def test_a_trainer_outlives_no_study_killed_outright(tmp_path):
    """The trainers are started in a session of their own (a Ctrl-C reaches the study only), so a SIGKILL of the
    study left them training, unsupervised; now the kernel sends them SIGTERM (they checkpoint and exit)."""
    ready, flag = tmp_path / "ready", tmp_path / "terminated"
    child = ("import signal, sys, time, pathlib\n"
             f"signal.signal(signal.SIGTERM, lambda *a: (pathlib.Path({str(flag)!r}).write_text('yes'), sys.exit(0)))\n"
             f"pathlib.Path({str(ready)!r}).write_text('')\ntime.sleep(60)\n")  # fmt: skip
    parent = ("import subprocess, sys, time\nfrom study.runner import _term_with_parent\n"
              f"subprocess.Popen([sys.executable, '-c', {child!r}], start_new_session=True, "
              "preexec_fn=_term_with_parent)\ntime.sleep(60)\n")  # fmt: skip
    proc = subprocess.Popen([sys.executable, "-c", parent], cwd=Path(__file__).resolve().parents[1])
    deadline = time.time() + 60
    while not ready.exists() and time.time() < deadline:
        time.sleep(0.1)
    assert ready.exists()
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    deadline = time.time() + 10
    while not flag.exists() and time.time() < deadline:
        time.sleep(0.1)
    assert flag.exists() and flag.read_text() == "yes"


def test_a_run_that_cannot_be_published_is_a_failed_line_not_a_traceback(tmp_path, monkeypatch):
    (spec,) = grid(["grpo"], [0], OVERRIDES, tmp_path / "work", tmp_path / "out")
    manifest = runner.Manifest(tmp_path / "out", "t", OVERRIDES, {})

    def full(spec):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(runner, "is_finished", lambda path: True)
    monkeypatch.setattr(runner, "publish", full)
    active = runner.Active(spec, subprocess.Popen([sys.executable, "-c", "pass"]), tmp_path / "log", time.time(), False)
    active.proc.wait()
    ok, line = runner._conclude(active, manifest, {}, 1, 1)
    assert not ok and line == (
        "FAILED grpo/seed0: finished, but its files could not be published (No space left on device)"
    )


def test_a_copy_that_fails_leaves_no_tmp_file(tmp_path, monkeypatch):
    src = write_run(tmp_path / "a", "grpo", 0, [True], [True])
    dst = tmp_path / "b"

    def partial(a, b):
        Path(b).write_text("half")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(shutil, "copyfile", partial)
    with pytest.raises(OSError):
        copy_run_files(src, dst)
    assert list(dst.iterdir()) == []


def test_the_report_after_a_call_with_fewer_arms_regenerates(tmp_path, capsys):
    """A second call that names only some of the manifest's arms wrote its report in its own arm order; `--report`
    (the report's Regenerate line) writes it in the manifest's: the two differed."""
    from study.__main__ import main
    from study.report import write_report

    out, work = tmp_path / "out", tmp_path / "work"
    sets = [x for k, v in OVERRIDES.items() if k not in REGIMES["default"] for x in ("--set", f"{k}={v}")]
    runs = {}
    for arm in ("grpo", "grpo_nokl"):
        write_run(out, arm, 0, [True, False], [True, True])
        runs[f"{arm}/seed0"] = {"wall_s": 1.0}
    arms = {a: ARMS[a].as_dict() for a in ("grpo", "grpo_nokl")}
    (out / "manifest.json").write_text(json.dumps({"regime": "t", "overrides": OVERRIDES, "arms": arms, "runs": runs}))
    assert main(["--arms", "grpo_nokl", "--seeds", "0", "--name", "t", "--out", str(out), "--work", str(work),
                 "--progress", "false", "--no-figure", *sets]) == 0  # fmt: skip
    made = (out / "study.md").read_text()
    write_report(out, figure=False)
    assert (out / "study.md").read_text() == made


def test_adopt_refuses_to_replace_another_finished_run(tmp_path):
    from study.adopt import adopt
    from study.grid import RESEARCH_ARMS

    overrides = REGIMES["decisive"]
    spec = RunSpec(RESEARCH_ARMS["grpo_nokl_tr_lr1.5e-4"], 0, dict(overrides), Path("w"), Path("r"))
    good = json.loads(json.dumps(dataclasses.asdict(spec.config())))
    sources = []
    for name, after in (("a", [True, True]), ("b", [True, False])):
        src = tmp_path / name
        d = write_run(src, "grpo_nokl_tr", 0, [False, False], after)
        (d / "config.json").write_text(json.dumps({"train": good}))
        sources.append(src)
    dst = tmp_path / "dst"
    adopt(sources[0], "grpo_nokl_tr", dst, "grpo_nokl_tr_lr1.5e-4", [0], overrides)
    adopt(sources[0], "grpo_nokl_tr", dst, "grpo_nokl_tr_lr1.5e-4", [0], overrides)  # the same files: fine
    with pytest.raises(ValueError, match="seed0 holds another finished run already"):
        adopt(sources[1], "grpo_nokl_tr", dst, "grpo_nokl_tr_lr1.5e-4", [0], overrides)
    held = json.loads((dst / "runs" / "grpo_nokl_tr_lr1.5e-4" / "seed0" / "summary.json").read_text())
    assert held["after"]["eval_acc"] == 1.0  # still the first one's


def test_a_resumed_runs_wall_time_sums_its_attempts(tmp_path, monkeypatch):
    """docs/study.md: 'wall time (summed over resumes)'; the manifest held the last attempt's only (an interrupted or
    failed attempt was never written down)."""
    (spec,) = grid(["grpo"], [0], OVERRIDES, tmp_path / "work", tmp_path / "out")
    spec.work_dir.mkdir(parents=True)
    manifest = runner.Manifest(tmp_path / "out", "t", OVERRIDES, {})

    def ended(code: int, seconds: float, resumed: bool) -> runner.Active:
        proc = subprocess.Popen([sys.executable, "-c", f"raise SystemExit({code})"])
        proc.wait()
        return runner.Active(spec, proc, tmp_path / "log", time.time() - seconds, resumed)

    ok, _ = runner._conclude(ended(1, 100.0, False), manifest, {}, 1, 1)  # failed after 100 s (checkpointed)
    assert not ok
    runner._stop([ended(143, 50.0, True)])  # interrupted after 50 s more
    monkeypatch.setattr(runner, "is_finished", lambda path: True)
    monkeypatch.setattr(runner, "publish", lambda spec: {"before": {"eval_acc": 0.1}, "after": {"eval_acc": 0.2},
                                                         "delta": 0.1})  # fmt: skip
    monkeypatch.setattr(runner, "load_run", lambda path: {"collapse": False})
    ok, _ = runner._conclude(ended(0, 10.0, True), manifest, {}, 1, 1)
    entry = json.loads((tmp_path / "out" / "manifest.json").read_text())["runs"]["grpo/seed0"]
    assert ok and entry["wall_s"] == pytest.approx(160.0, abs=2.0) and len(entry["earlier_attempts"]) == 2


def test_a_run_stopped_by_its_time_budget_is_not_published_as_finished(tmp_path):
    """A run stopped by --set time_budget_s after 8 of 50 steps was published as finished (and a rerun never continued
    it)."""
    (spec,) = grid(["grpo"], [0], OVERRIDES, tmp_path / "work", tmp_path / "out")
    d = write_run(tmp_path / "w", "grpo", 0, [True], [True])
    summary = json.loads((d / "summary.json").read_text())
    (d / "summary.json").write_text(json.dumps(summary | {"stopped_by_time_budget": True, "steps": 6}))
    assert not runner.is_finished(d)
    spec = dataclasses.replace(spec, work_dir=d)
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    manifest = runner.Manifest(tmp_path / "out", "t", OVERRIDES, {})
    ok, line = runner._conclude(runner.Active(spec, proc, tmp_path / "log", time.time(), False), manifest, {}, 1, 1)
    assert not ok and line == ("NOT FINISHED grpo/seed0: stopped by its time budget (time_budget_s) after step 6; not "
                               "published, the same command continues it")  # fmt: skip


@pytest.mark.parametrize(
    ("seeds", "words"),
    [("x", "--seeds: 'x' refused: expected comma-separated"), (",", "--seeds: ',' refused: expected one or more")],
)
def test_adopt_refuses_seeds_that_are_not_seeds(tmp_path, capsys, seeds, words):
    """'x' was "invalid literal for int()"; ',' adopted 0 runs and still made the destination and its manifest."""
    from study.adopt import main

    dst = tmp_path / "dst"
    with pytest.raises(SystemExit) as stop:
        main(["--from", str(tmp_path / "src"), "--arm", "grpo", "--to", str(dst), "--as", "grpo", "--seeds", seeds])
    assert stop.value.code == 2 and words in capsys.readouterr().err and not dst.exists()


def test_a_ctrl_c_before_the_runs_is_a_line_not_a_traceback(tmp_path, monkeypatch, capsys):
    import study.__main__ as cli

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "grid", interrupted)  # (the checks of every run's arguments, ~7 s on a cold start)
    assert (
        cli.main(["--arms", "grpo", "--seeds", "0", "--out", str(tmp_path / "o"), "--work", str(tmp_path / "w")]) == 130
    )
    assert "python -m study: interrupted; finished runs stay published" in capsys.readouterr().err


def test_the_study_lock_never_writes_through_a_planted_link(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    out = tmp_path / "out"
    out.mkdir()
    (out / ".study.lock").symlink_to(victim)
    with pytest.raises(ValueError, match=r"\.study\.lock: cannot open the study's lock file"):
        runner.StudyLock(out)
    assert victim.read_text() == "keep me"
