"""The review of the trainer's user-fed surfaces, the output folder and --resume (findings 2, 3, 9, 10, 13, 14a):

- 2: a refused --overwrite (the reward pre-flight, the data, --min-p with --top-p) leaves the previous run as it was;
- 3: --resume refuses a data file (or held-out set) that changed since the checkpoint, naming it;
- 9: a leading ~ in --output-dir (a flag or a config file) is the home folder, not ./~;
- 10: `train(cfg)` re-checks a TrainConfig changed after construction, as the constructor does, writing nothing;
- 13: a resume that trains on removes the model/ of an earlier finish (an interrupted run has none);
- 14a: --resume after config.json was deleted says that it is missing.

Black-box through `python -m train`'s `main` (and `train()`) on the tiny model."""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from conftest import tiny_argv, tiny_cfg  # noqa: E402
from test_train_hardening_outdir import FAST, manifest, run, snapshot  # noqa: E402  (the output-folder tests' kit)

import train.loop as loop  # noqa: E402
from train.__main__ import main  # noqa: E402
from train.config import ConfigError, TrainConfig  # noqa: E402
from train.run.signals import Terminated  # noqa: E402

GSM8K = Path(__file__).resolve().parents[1] / "train" / "data" / "gsm8k_sample.jsonl"


# ------------------------------------------------------------------------- 2: a refused --overwrite deletes nothing


def refusing_flags(kind: str, tmp_path: Path, monkeypatch) -> tuple[str, ...]:
    """Flags that setup refuses (exit 2) after the output folder was checked, and the refusal's words."""
    if kind == "reward":
        mods = tmp_path / "mods"
        mods.mkdir()
        (mods / "review_bad_reward.py").write_text("def boom(completions, **kw):\n    raise ValueError('typo')\n")
        monkeypatch.syspath_prepend(str(mods))
        return ("--reward", "review_bad_reward:boom")
    if kind == "data":
        one = tmp_path / "one.jsonl"
        one.write_text('{"question": "2+3", "answer": "5"}\n')
        return ("--task", "gsm8k", "--data", str(one))
    return ("--min-p", "0.1", "--top-p", "0.9")  # under HF generate


@pytest.mark.parametrize("kind", ["reward", "data", "min_p"])
def test_a_refused_overwrite_keeps_the_previous_run(tmp_path, monkeypatch, capsys, kind):
    out = tmp_path / "run"
    assert run(out) == 0
    assert (out / "model").is_dir() and (out / "checkpoint" / "state.pt").is_file()
    before = snapshot(out)
    flags = refusing_flags(kind, tmp_path, monkeypatch)
    assert run(out, "--overwrite", *flags) == 2
    assert snapshot(out) == before  # metrics, summary, checkpoint, model/ and the manifest as they were
    assert "deleting" not in capsys.readouterr().out
    assert run(out, "--resume") == 0  # still the run it was


def test_a_refused_fresh_run_writes_nothing(tmp_path, monkeypatch):
    out = tmp_path / "run"
    assert run(out, *refusing_flags("reward", tmp_path, monkeypatch)) == 2
    assert not out.exists()  # no manifest, no config.json, no lock: not even the folder it made


def test_overwrite_still_replaces_the_run(tmp_path, capsys):
    out = tmp_path / "run"
    assert run(out) == 0
    first = manifest(out)["run_id"]
    assert run(out, "--overwrite", "--seed", "1") == 0
    assert "--overwrite: deleting a finished run (1 steps)" in capsys.readouterr().out
    assert manifest(out)["run_id"] != first
    assert json.loads((out / "config.json").read_text())["train"]["seed"] == 1


# ------------------------------------------------------------------------- 3: --resume with data that changed


def gsm8k_run(tmp_path) -> tuple[Path, Path]:
    data, out = tmp_path / "g.jsonl", tmp_path / "run"
    shutil.copy(GSM8K, data)
    assert run(out, "--task", "gsm8k", "--data", str(data)) == 0
    return data, out


def resume_gsm8k(out: Path, data: Path, *extra) -> int:
    return run(out, "--task", "gsm8k", "--data", str(data), "--resume", "--max-steps", "2", *extra)


@pytest.mark.parametrize("rows", [1, 4])  # 4: the held-out set grows (was an IndexError traceback)
def test_resume_refuses_a_changed_data_file(tmp_path, capsys, rows):
    data, out = gsm8k_run(tmp_path)
    original = data.read_text()
    new = "".join(json.dumps({"question": f"A jar holds {120 + i} candies. How many?", "answer": f"{120 + i}"}) + "\n"
                  for i in range(rows))  # fmt: skip
    data.write_text(new + original)
    before = snapshot(out)
    capsys.readouterr()
    assert resume_gsm8k(out, data) == 2
    err = capsys.readouterr().err
    assert str(data) in err and "changed since the checkpoint" in err, err
    assert snapshot(out) == before
    data.write_text(original)
    assert resume_gsm8k(out, data) == 0  # the data as it was: the run goes on
    assert json.loads((out / "summary.json").read_text())["steps"] == 2
    record = manifest(out)["data"]  # where the identity is kept
    assert record["data_path"] == str(data) and len(record["data_sha256"]) == 64 and len(record["heldout_sha256"]) == 64


def test_resume_refuses_held_out_problems_that_changed(tmp_path, capsys):
    data, out = gsm8k_run(tmp_path)
    m = manifest(out)
    m["data"]["heldout_sha256"] = "0" * 64  # as if the task's data or code had changed under an unchanged file
    (out / "run-manifest.json").write_text(json.dumps(m))
    before = snapshot(out)
    assert resume_gsm8k(out, data) == 2
    assert "held-out problems differ" in capsys.readouterr().err
    assert snapshot(out) == before


def test_a_run_folder_without_the_data_record_still_resumes(tmp_path, capsys):
    data, out = gsm8k_run(tmp_path)
    m = manifest(out)
    recorded = m.pop("data")
    (out / "run-manifest.json").write_text(json.dumps(m))  # a folder written before the record existed
    assert resume_gsm8k(out, data) == 0
    assert manifest(out)["data"] == recorded and manifest(out)["run_id"] == m["run_id"]  # recorded from now on


# ------------------------------------------------------------------------- 9: ~ in --output-dir


def without_output_dir(argv: list[str]) -> list[str]:
    i = argv.index("--output-dir")
    return argv[:i] + argv[i + 2 :]


def test_a_tilde_output_dir_is_the_home_folder(tmp_path, monkeypatch, capsys):
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    home.mkdir()
    cwd.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(cwd)
    assert main(tiny_argv("~/tr", *FAST)) == 0
    out = capsys.readouterr().out
    assert (home / "tr" / "metrics.jsonl").is_file() and not (cwd / "~").exists()
    assert f"metrics in {home / 'tr' / 'metrics.jsonl'}" in out, out
    assert json.loads((home / "tr" / "summary.json").read_text())["output_dir"] == str(home / "tr")
    assert main(tiny_argv("~/tr", *FAST, "--resume", "--max-steps", "2")) == 0  # the same folder
    assert json.loads((home / "tr" / "summary.json").read_text())["steps"] == 2
    (cwd / "c.yaml").write_text("output_dir: ~/tr2\n")
    assert main([*without_output_dir(tiny_argv("unused", *FAST)), "--config", "c.yaml"]) == 0
    assert (home / "tr2" / "summary.json").is_file() and not (cwd / "~").exists()


def test_a_tilde_that_cannot_be_expanded_is_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(tiny_argv("~no_such_user_zq/run", *FAST)) == 2
    assert "cannot be expanded" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------------- 10: train() re-checks the config


@pytest.mark.parametrize(
    "field, value", [("group_size", 1), ("max_grad_norm", -1.0), ("temperature", math.nan), ("heldout_frac", 1.0)]
)
def test_train_refuses_a_config_changed_after_construction(tmp_path, field, value):
    out = tmp_path / "run"
    cfg = tiny_cfg(out, max_steps=2, eval_k=0, kl_every=0)
    with pytest.raises(ConfigError) as ctor:
        TrainConfig(**(dataclasses.asdict(cfg) | {field: value}))
    setattr(cfg, field, value)
    with pytest.raises(ConfigError) as got:
        loop.train(cfg)
    assert str(got.value) == str(ctor.value)
    assert not out.exists()  # nothing written: no config.json holding the refused value


# ------------------------------------------------------------------------- 13: model/ of an earlier finish


def interrupt_at_step(n: int):
    real, calls = loop.run_step, []

    def step(*args):
        calls.append(1)
        if len(calls) == n:
            raise Terminated("SIGTERM")
        return real(*args)

    return step


def test_a_resumed_then_interrupted_run_has_no_model_folder(tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    assert run(out) == 0
    assert (out / "model" / "model.safetensors").is_file()
    monkeypatch.setattr(loop, "run_step", interrupt_at_step(2))  # step 2 runs, step 3 is interrupted
    assert run(out, "--resume", "--max-steps", "4") == 143
    summary = json.loads((out / "summary.json").read_text())
    assert summary["interrupted"] and summary["steps"] == 2
    assert not (out / "model").exists()  # (was the step-1 policy beside a run at step 2)
    assert f"removed {out / 'model'}" in capsys.readouterr().out
    monkeypatch.undo()
    assert run(out, "--resume", "--max-steps", "4") == 0
    assert (out / "model" / "model.safetensors").is_file()


def test_a_resume_interrupted_before_its_first_step_keeps_the_model(tmp_path, monkeypatch):
    out = tmp_path / "run"
    assert run(out) == 0
    before = snapshot(out / "model")
    monkeypatch.setattr(loop, "run_step", interrupt_at_step(1))  # the state stays the finish that wrote model/
    assert run(out, "--resume", "--max-steps", "4") == 143
    assert snapshot(out / "model") == before


def test_a_resume_that_finishes_without_save_model_keeps_no_stale_model(tmp_path):
    out = tmp_path / "run"
    assert run(out) == 0
    assert run(out, "--resume", "--max-steps", "2", "--save-model", "false") == 0
    assert not (out / "model").exists()


def test_a_resume_with_nothing_to_do_keeps_the_model(tmp_path):
    out = tmp_path / "run"
    assert run(out) == 0
    assert run(out, "--resume", "--save-model", "false") == 0  # finished at step 1: nothing to train
    assert (out / "model" / "model.safetensors").is_file()


# ------------------------------------------------------------------------- 14a: --resume without config.json


def test_resume_without_config_json_says_it_is_missing(tmp_path, capsys):
    out = tmp_path / "run"
    assert run(out) == 0
    (out / "config.json").unlink()
    before = snapshot(out)
    capsys.readouterr()
    assert main(["--output-dir", str(out), "--resume"]) == 2
    err = capsys.readouterr().err
    assert f"{out / 'config.json'} is missing" in err, err
    assert "all of them are in" not in err and "--max-new-tokens: checkpoint 4" in err
    assert snapshot(out) == before
