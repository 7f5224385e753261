"""What `python -m study` and `--report` accept as input: the run folders a report counts (seedK folders whose
config.json is that seed's run of that arm), finished runs found in --out without a manifest entry, broken or
wrong-shaped run and manifest files (one line naming the file), the --config file's values, and --name / --threads /
--work. Every run folder here is a small fake one; no trainer is started (the runner's _start is made to fail)."""

from __future__ import annotations

import csv
import dataclasses
import json
import os
from pathlib import Path

import pytest

import study.__main__ as study_main
import study.runner as runner
from study.grid import ARMS, REGIMES, RunSpec
from study.trainer import dumps


@pytest.fixture(autouse=True)
def _no_trainer(monkeypatch, tmp_path):
    """No trainer starts, and a call that fell through to the default folders (relative ones) writes under tmp_path."""

    def refuse(*args, **kwargs):
        raise AssertionError("a test of the study's inputs started a trainer")

    monkeypatch.setattr(runner, "_start", refuse)
    monkeypatch.chdir(tmp_path)


def spec_train(arm: str, seed: int, overrides: dict | None = None) -> dict:
    """The "train" section of the config.json that arm `arm`'s run of `seed` writes under `overrides`."""
    spec = RunSpec(ARMS[arm], seed, dict(REGIMES["default"] if overrides is None else overrides), Path("w"), Path("r"))
    return json.loads(dumps(dataclasses.asdict(spec.config())))


def fake_run(study: Path, arm: str, seed: int, train: dict | None = None, folder: str | None = None) -> Path:
    """A finished run's files (6 steps) in study/runs/ARM/FOLDER (seedK); `train`: its config.json's "train" section
    (default: the four keys the report reads, seed `seed`)."""
    d = study / "runs" / arm / (folder or f"seed{seed}")
    d.mkdir(parents=True)
    if train is None:
        train = {"seed": seed, "collapse_window": 3, "collapse_entropy": 0.05, "max_grad_norm": 1.0}
    (d / "config.json").write_text(json.dumps({"train": train, "loss": {}, "world_size": 1}))
    after = 0.25 + 0.25 * (seed % 3)
    recs = [{"step": 0, "event": "eval", "eval_acc": 0.25}]
    recs += [{"step": s, "entropy_mean": 1.0 - 0.1 * s, "accuracy": 0.3, "zero_var_frac": 0.5, "format_frac": 0.8,
              "grad_norm": 0.5 + 0.1 * seed, "step_s": 1.0, "tokens_per_s": 10.0, "peak_mem_mb": 100.0}
             for s in range(1, 7)]  # fmt: skip
    recs.append({"step": 6, "event": "eval", "eval_acc": after})
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    summary = {"before": {"eval_acc": 0.25, "eval_n": 4}, "after": {"eval_acc": after, "eval_n": 4}, "steps": 6}
    (d / "summary.json").write_text(json.dumps(summary))
    return d


def two_arms(study: Path) -> Path:
    for arm in ("grpo", "s_grpo"):
        for seed in (0, 1):
            fake_run(study, arm, seed)
    return study


def report(study: Path, capsys) -> tuple[int, str]:
    code = study_main.main(["--report", str(study), "--no-figure"])
    return code, capsys.readouterr().err


def csv_rows(study: Path) -> list[tuple[str, str]]:
    with open(study / "study.csv", newline="") as fh:
        return [(r["arm"], r["seed"]) for r in csv.DictReader(fh)]


# ------------------------------------------------------------------------------------------- which folders are runs


def test_report_counts_only_seed_folders_and_names_the_others(tmp_path, capsys):
    """A copy runs/grpo/seed0.bak is no seed: grpo keeps 2 seeds, study.csv lists grpo,0 once, and a warning names
    the copy. Before: grpo had 3 seeds and study.csv listed grpo,0 twice."""
    import shutil

    study = two_arms(tmp_path / "study")
    shutil.copytree(study / "runs" / "grpo" / "seed0", study / "runs" / "grpo" / "seed0.bak")
    code, err = report(study, capsys)
    assert code == 0, err
    assert csv_rows(study) == [("grpo", "0"), ("grpo", "1"), ("s_grpo", "0"), ("s_grpo", "1")]
    assert f"{study / 'runs' / 'grpo' / 'seed0.bak'}: not a run folder" in err
    assert json.loads((study / "study.json").read_text())["arms"]["grpo"]["seeds"] == [0, 1]


def test_report_refuses_a_run_counted_twice_naming_both_folders(tmp_path, capsys):
    """Two folders whose config.json both say seed 0: refused naming both. Before: '2 seeds' for grpo in the tables
    while the paired tables kept one of them."""
    study = two_arms(tmp_path / "study")
    (study / "runs" / "grpo" / "seed1" / "config.json").write_text((study / "runs/grpo/seed0/config.json").read_text())
    code, err = report(study, capsys)
    assert code == 2, err
    assert f"{study / 'runs/grpo/seed0'} and {study / 'runs/grpo/seed1'}" in err and "seed 0" in err, err
    assert not (study / "study.csv").exists()


def test_report_refuses_a_config_seed_other_than_the_folders(tmp_path, capsys):
    study = two_arms(tmp_path / "study")
    cfg = study / "runs" / "s_grpo" / "seed1" / "config.json"
    cfg.write_text(cfg.read_text().replace('"seed": 1', '"seed": 7'))
    code, err = report(study, capsys)
    assert code == 2 and f"{cfg.parent}: its config.json says seed 7, its folder seed1" in err, err


def test_report_refuses_a_run_of_another_arm_in_an_arms_folder(tmp_path, capsys):
    """An s_grpo run in runs/grpo/: refused naming the run and the setting. Before: reported as grpo. A run whose
    config.json lacks the arm's fields (an older trainer's) is not compared; one that has them must match."""
    study = two_arms(tmp_path / "study")
    fake_run(study, "grpo_nokl", 0, {**spec_train("grpo_nokl", 0), "collapse_window": 3})
    assert report(study, capsys)[0] == 0  # the arm's own preset and loss: accepted
    cfg = study / "runs" / "grpo" / "seed1" / "config.json"
    cfg.write_text(json.dumps({"train": {**spec_train("s_grpo", 1)}}))
    code, err = report(study, capsys)
    assert code == 2 and f"{cfg.parent}: not a run of arm 'grpo'" in err and "preset: 's_grpo' != 'grpo'" in err, err


# --------------------------------------------------------------------------------- broken run and manifest files


def _break(study: Path, name: str, how) -> Path:
    """Replaces runs/grpo/seed1/NAME (or the study's NAME for manifest.json) by `how`: text, or "folder"."""
    path = study / name if name == "manifest.json" else study / "runs" / "grpo" / "seed1" / name
    if path.exists():
        path.unlink()
    if how == "folder":
        path.mkdir()
    else:
        path.write_text(how)
    return path


BROKEN = [
    ("config.json", '{"train": {"seed": 1,\n', "not valid JSON"),
    ("config.json", "[1, 2]", "a list, not a JSON object"),
    ("config.json", '{"x": 1}', 'no "train" object'),
    ("config.json", '{"train": {"seed": "1"}}', "seed, max_grad_norm, collapse_window, collapse_entropy missing"),
    ("config.json", "folder", "cannot read it"),
    ("metrics.jsonl", '{"step": 1}\n{"step": 2,\n', "line 2: not valid JSON"),
    ("metrics.jsonl", "[1]\n", "line 1: a list, not a JSON object"),
    ("metrics.jsonl", '{"step": 1}\n', "a step record lacks 'grad_norm'"),
    ("summary.json", '{"before": {"eval_acc": 0.25}, "after": null}', '"after" is null'),
    ("summary.json", '{"before": {"eval_acc": 0.25}, "after": {"eval_acc": "0.5"}}', '"after"."eval_acc" is a string'),
    ("heldout.jsonl", '{"id": 0, "q": "1 + 1", "before": false, "after": true}\n{"id": 1,\n', "line 2: not valid JSON"),
    ("heldout.jsonl", "[0]\n", "line 1: a list, not a JSON object"),
    ("manifest.json", '{"regime": "x",', "not valid JSON"),
    ("manifest.json", "[1, 2]", "a list, not a JSON object"),
    ("manifest.json", '{"runs": {"grpo/seed0": {"wall_s": "1 min"}}}', '"wall_s" is a string'),
    ("manifest.json", "folder", "cannot read it"),
]


@pytest.mark.parametrize("name,how,needle", BROKEN)
def test_report_names_a_broken_file_in_one_line(tmp_path, capsys, name, how, needle):
    """Each broken or wrong-shaped file: exit 2, one line naming the file and what was wrong / expected. Before: a
    decoder message that named no file ("Expecting value: line 2 column 1"), a traceback (a list or {"x": 1} as
    config.json, "after": null), or a folder config.json reported as "cannot write the report there"."""
    study = two_arms(tmp_path / "study")
    path = _break(study, name, how)
    code, err = report(study, capsys)
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and f"{path}" in err and needle in err and "expected" in err, err
    assert "cannot write the report" not in err


@pytest.mark.parametrize("how", ['{"regime": "x",', "[1, 2]", "folder"])
def test_a_study_names_its_broken_manifest(tmp_path, capsys, how):
    """A study (not --report) over a folder whose manifest.json is garbled, a list or a folder: refused naming it.
    Before: a decoder message alone, or a traceback."""
    study = tmp_path / "study"
    study.mkdir()
    path = _break(study, "manifest.json", how)
    argv = ["--arms", "grpo", "--seeds", "0", "--out", str(study), "--work", str(tmp_path / "w"), "--no-figure"]
    assert study_main.main(argv) == 2
    err = capsys.readouterr().err
    assert f"{path}:" in err and "expected a study's manifest" in err, err


# ------------------------------------------------------------------------ finished runs the manifest does not record


def _study_argv(out: Path, work: Path, *extra: str) -> list[str]:
    return ["--arms", "grpo", "--seeds", "0,1", "--out", str(out), "--work", str(work), "--no-figure",
            "--progress", "false", *extra]  # fmt: skip


def test_a_study_refuses_finished_runs_it_would_not_have_made(tmp_path, capsys):
    """--out holds finished runs and no manifest.json: each is compared with what the study would run; one made with
    another preset (or another setting) is refused naming the run and the first difference, and no manifest is
    written. Before: adopted as finished and reported as grpo."""
    out, work = tmp_path / "out", tmp_path / "work"
    fake_run(out, "grpo", 0, {**spec_train("grpo", 0), "collapse_window": 3})
    other = fake_run(out, "grpo", 1, spec_train("s_grpo", 1))
    assert study_main.main(_study_argv(out, work)) == 2
    err = capsys.readouterr().err
    assert f"{other}: a finished run that" in err and "preset: 's_grpo' != 'grpo'" in err, err
    assert not (out / "manifest.json").exists() and not (out / "study.csv").exists()

    (other / "config.json").write_text(json.dumps({"train": spec_train("grpo", 1, {"eval_problems": "50"})}))
    assert study_main.main(_study_argv(out, work)) == 2  # the regime's eval_problems=100, the run's 50
    assert "eval_problems: 50 != 100" in capsys.readouterr().err


def test_a_study_adopts_finished_runs_that_are_what_it_would_run(tmp_path, capsys):
    out, work = tmp_path / "out", tmp_path / "work"
    for seed in (0, 1):
        fake_run(out, "grpo", seed, {**spec_train("grpo", seed), "output_dir": f"elsewhere/{seed}", "threads": 7})
    assert study_main.main(_study_argv(out, work)) == 0, capsys.readouterr().err
    assert csv_rows(out) == [("grpo", "0"), ("grpo", "1")]
    assert json.loads((out / "manifest.json").read_text())["overrides"] == REGIMES["default"]


# ------------------------------------------------------------------------------------------------ the --config file


def _config(tmp_path: Path, text: str) -> str:
    path = tmp_path / "study.yaml"
    path.write_text(text)
    return str(path)


def test_config_null_is_the_default_and_switches_are_read_as_words(tmp_path):
    """`out: null` / `report: null` leave the option at its default (before: --out None, a folder named None);
    `no_figure: "false"` / "no" leave the flag off (before: on); a word that is not a boolean is refused."""
    argv = study_main.config_argv
    assert argv(_config(tmp_path, "out: null\nreport: null\nname: null\nset: null\n")) == []
    for word, on in (('"false"', False), ('"no"', False), ("off", False), ('"yes"', True), ("true", True)):
        assert argv(_config(tmp_path, f"no_figure: {word}\n")) == (["--no-figure"] if on else []), word
    with pytest.raises(ValueError, match="key 'no_figure': 'maybe' refused: expected true or false"):
        argv(_config(tmp_path, "no_figure: maybe\n"))


def test_progress_is_true_or_false(tmp_path, capsys):
    """--progress flase (typed) and `progress: "nope"` (in the file) are refused; before: both meant on."""
    parser = study_main.build_parser()
    for argv in (["--progress", "flase"], study_main.config_argv(_config(tmp_path, 'progress: "nope"\n'))):
        with pytest.raises(SystemExit) as exc:
            parser.parse_args(argv)
        assert exc.value.code == 2 and "expected true or false" in capsys.readouterr().err
    assert parser.parse_args(["--progress", "Off"]).progress is False and parser.parse_args([]).progress is True
    assert "progress bar" in parser.format_help()


def test_config_file_missing_or_a_folder_is_named(tmp_path, capsys):
    """Before: both said "expected a mapping of options"."""
    for path, needle in ((tmp_path / "nope.yaml", "cannot read it (No such file"), (tmp_path, "a folder")):
        assert study_main.main(["--config", str(path), "--report", str(tmp_path / "none")]) == 2  # --report: no run
        err = capsys.readouterr().err
        assert f"--config {path}: {needle}" in err and "mapping" not in err, err


def test_typed_set_wins_over_the_files(tmp_path, monkeypatch, capsys):
    """`set: [lr=1e-4, max_steps=3]` in the file and a typed `--set lr=2e-4`: the typed one wins, the file's other
    fields stay. Before: refused as "given twice". Two of the file's own are refused naming the file."""
    seen = {}

    def run_grid(specs, *args, **kwargs):
        seen.update(specs[0].overrides)
        return 0, []

    monkeypatch.setattr(study_main, "run_grid", run_grid)
    cfg = _config(tmp_path, "set: [lr=1e-4, max_steps=3]\n")
    dirs = ["--out", str(tmp_path / "out"), "--work", str(tmp_path / "work")]
    assert study_main.main(["--config", cfg, "--arms", "grpo", "--seeds", "0", "--set", "lr=2e-4", *dirs]) == 0
    assert seen["lr"] == "2e-4" and seen["max_steps"] == "3", seen
    cfg = _config(tmp_path, "set: [lr=1e-4, lr=3e-4]\n")
    assert study_main.main(["--config", cfg, "--arms", "grpo", "--seeds", "0", *dirs]) == 2
    err = capsys.readouterr().err
    assert f"--config {cfg}: --set 'lr=1e-4' and --set 'lr=3e-4': lr given twice" in err, err


# ------------------------------------------------------------------------------------- --name, --threads, --work


@pytest.mark.parametrize("name", ["../x", "a/b", ".", "..", "/abs"])
def test_name_is_one_plain_folder_name(capsys, name):
    """Before: accepted, and the results landed outside benchmarks/results/study (../x, /abs) or in it (.)."""
    with pytest.raises(SystemExit):
        study_main.build_parser().parse_args(["--name", name])
    assert "expected a single plain folder name" in capsys.readouterr().err
    assert study_main.build_parser().parse_args(["--name", "stress-lr5e-4"]).name == "stress-lr5e-4"


def test_threads_at_most_the_machines_cores(capsys):
    """Before: any count, and a huge one made every trainer abort in libgomp after the study had started."""
    cores = os.cpu_count() or 1
    with pytest.raises(SystemExit):
        study_main.build_parser().parse_args(["--threads", str(cores + 1)])
    assert f"this machine has {cores} CPU(s); expected at most {cores}" in capsys.readouterr().err
    assert study_main.build_parser().parse_args(["--threads", str(cores)]).threads == cores


@pytest.mark.parametrize("inside", ["runs", "runs/grpo", "", "scratch"])
def test_work_inside_out_is_refused(tmp_path, monkeypatch, capsys, inside):
    """--work OUT/runs (or OUT itself, or under it): unfinished runs' checkpoints would land in the results. Before:
    accepted."""
    monkeypatch.setattr(study_main, "run_grid", lambda *a, **k: (0, []))
    out = tmp_path / "out"
    work = out / inside if inside else out
    assert study_main.main(["--arms", "grpo", "--seeds", "0", "--out", str(out), "--work", str(work)]) == 2
    assert f"--work {work} is --out {out} or inside it" in capsys.readouterr().err
