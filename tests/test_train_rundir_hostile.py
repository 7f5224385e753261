"""The run folder when it is not what the trainer left: a blank line in metrics.jsonl, a file replaced by a folder (or
a folder by a file), a truncated checkpoint, a hand-edited config.json. Each is a refusal naming the path (exit 2)
or a warning that loses no valid record; `--overwrite` never deletes part of a run and then stops. Black-box through
`python -m train`'s `main` on the tiny model, and the run/ modules directly."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from train.errors import Refused
from train.run.checkpoint import CheckpointError, read_checkpoint
from train.run.files import LinkRefused
from train.run.metrics import MetricsLog

FAST = ("--eval-k", "0", "--kl-every", "0", "--max-steps", "2", "--save-model", "false")


def snapshot(folder: Path) -> dict:
    """Every path under `folder` (a folder as None, a file as its bytes)."""
    return {str(p.relative_to(folder)): (p.read_bytes() if p.is_file() else None) for p in sorted(folder.rglob("*"))}


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A finished 2-step tiny run: metrics.jsonl holds 4 records (eval at 0, steps 1 and 2, eval at 2)."""
    pytest.importorskip("transformers")
    from conftest import tiny_argv

    from train.__main__ import main

    out = tmp_path_factory.mktemp("hostile") / "run1"
    assert main(tiny_argv(str(out), *FAST)) == 0
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 4
    return out


@pytest.fixture
def run(finished, tmp_path):
    """-> (a copy of the finished run, `go(*flags)` running the trainer on it: its exit status)."""
    from conftest import tiny_argv

    from train.__main__ import main

    out = tmp_path / "run"
    shutil.copytree(finished, out)
    return out, lambda *flags: main(tiny_argv(str(out), *FAST, *flags))


# ------------------------------------------------------------------------------------------- 1: blank lines


def test_a_blank_line_is_not_counted_as_a_record(tmp_path, capsys):
    records = [json.dumps({"step": i}) for i in range(4)]
    path = tmp_path / "metrics.jsonl"
    path.write_text("\n" + "\n".join(records[:2]) + "\n  \n" + "\n".join(records[2:]) + "\n" + json.dumps({"x": 9}))
    with MetricsLog(path, keep_lines=4) as log:
        assert log.lines == 4
    assert path.read_text().splitlines() == records  # the 4 records, the one past the checkpoint's dropped
    assert "warning" not in capsys.readouterr().out


def test_resume_with_a_blank_first_line_keeps_every_record(run, capsys):
    out, go = run
    lines = (out / "metrics.jsonl").read_text().splitlines()
    (out / "metrics.jsonl").write_text("\n" + "\n".join(lines) + "\n")
    assert go("--resume") == 0
    assert (out / "metrics.jsonl").read_text().splitlines() == lines
    assert "warning" not in capsys.readouterr().out


# ------------------------------------------------------------------------------------------- 2, 3: wrong types


def _replace(out: Path, name: str, by: str) -> None:
    target = out / name
    if target.is_dir():
        shutil.rmtree(target)
    else:
        target.unlink(missing_ok=True)
    if by == "folder":
        target.mkdir()
        (target / "inside").write_text("x")
    else:
        target.write_text("a file")


WRONG = [
    ("summary.json", "folder"),
    ("metrics.jsonl", "folder"),
    ("config.json", "folder"),
    ("heldout.jsonl", "folder"),
    ("run-manifest.json", "folder"),
    ("checkpoint/state.pt", "folder"),
    ("checkpoint", "file"),
]


@pytest.mark.parametrize("mode", ["--overwrite", "--resume", None])
@pytest.mark.parametrize(("name", "by"), WRONG)
def test_a_name_of_the_wrong_type_is_refused_before_anything_is_touched(run, capsys, name, by, mode):
    out, go = run
    _replace(out, name, by)
    before = snapshot(out)
    assert go(*([mode] if mode else [])) == 2
    err = capsys.readouterr().err
    # the refusal is one line (after the warning that FAST's --kl-every 0 leaves tiny_argv's --probe-size inert)
    refusal = [line for line in err.strip().splitlines() if not line.startswith("warning: ")]
    assert "Traceback" not in err and len(refusal) == 1, err
    what = "a folder, where the trainer keeps a file" if by == "folder" else "not a folder, where the trainer keeps one"
    assert f"{out / name} is {what}" in err, err
    assert snapshot(out) == before  # nothing deleted, nothing written


def test_a_folder_in_place_of_the_checkpoint_is_a_checkpoint_error(tmp_path):
    (tmp_path / "state.pt").mkdir()
    with pytest.raises(CheckpointError, match="not a regular file \\(a folder\\)"):
        read_checkpoint(tmp_path / "state.pt")


def test_a_metrics_file_turned_into_a_folder_late_is_a_refusal(tmp_path):
    (tmp_path / "metrics.jsonl").mkdir()
    with pytest.raises(Refused, match="metrics.jsonl is not a regular file") as info:
        MetricsLog(tmp_path / "metrics.jsonl", keep_lines=2).__enter__()
    assert not isinstance(info.value, LinkRefused)


# ------------------------------------------------------------------------------------------- 4, 5: contents


@pytest.mark.parametrize("keep", [0, 2, 10000, 0.5, -1])
def test_a_truncated_checkpoint_is_called_torn(finished, tmp_path, keep):
    data = (finished / "checkpoint" / "state.pt").read_bytes()
    file = tmp_path / "state.pt"
    file.write_bytes(data[: int(len(data) * keep) if isinstance(keep, float) else keep if keep >= 0 else -1])
    with pytest.raises(CheckpointError, match="torn or incomplete") as info:
        read_checkpoint(file)
    assert "Invalid argument" not in str(info.value) and str(file) in str(info.value)


def test_a_truncated_checkpoint_on_resume_says_torn(run, capsys):
    out, go = run
    ckpt = out / "checkpoint" / "state.pt"
    ckpt.write_bytes(ckpt.read_bytes()[:10000])
    assert go("--resume") == 1
    err = capsys.readouterr().err
    assert "torn or incomplete" in err and str(ckpt) in err and "Traceback" not in err, err


def test_an_edited_config_json_is_named_on_resume(run, capsys):
    out, go = run
    data = json.loads((out / "config.json").read_text())
    before = data["train"]["lr"]
    data["train"]["lr"] = 1e-3
    (out / "config.json").write_text(json.dumps(data))
    assert go("--resume") == 2
    err = capsys.readouterr().err
    assert f"{out / 'config.json'} disagrees with the checkpoint" in err and "edited" in err, err
    assert f"--lr: checkpoint {before!r}, config.json 0.001" in err, err
    assert "put the checkpoint's values above back" in err and "--config" in err, err
    assert "all of them are in" not in err, err


def test_a_flag_typed_against_the_checkpoint_keeps_its_message(run, capsys):
    out, go = run
    assert go("--resume", "--lr", "0.001") == 2
    err = capsys.readouterr().err
    assert "the configuration differs from the one" in err and "--lr: checkpoint" in err, err
    assert "disagrees" not in err, err


def test_an_edited_preset_and_a_typed_flag_are_told_apart(run, capsys):
    out, go = run
    data = json.loads((out / "config.json").read_text())
    data["train"]["preset"] = "grpo" if data["train"]["preset"] != "grpo" else "s_grpo"
    (out / "config.json").write_text(json.dumps(data))
    assert go("--resume", "--seed", "3") == 2
    err = capsys.readouterr().err
    edited, typed = err.split("and the configuration given also differs from the checkpoint:")
    assert "--preset: checkpoint" in edited and "config.json" in edited, err
    assert "--seed: checkpoint 0, now 3" in typed and "loss." not in typed, err
