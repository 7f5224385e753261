"""Issue 39, the output folder: the trainer owns only what its manifest says (foreign files are refused, never
destroyed), never writes or reads through a planted symbolic link, keeps every valid record of a garbled
metrics.jsonl, names trackio runs so that two folders called `seed0` stay two runs, and says what a stopped or failed
model export left. Black-box through `python -m train`'s `main` on the tiny model."""

from __future__ import annotations

import errno
import json
import os
import sys
import types
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from conftest import tiny_argv  # noqa: E402

import train.export as export_module  # noqa: E402
from train.__main__ import main  # noqa: E402
from train.run.signals import Terminated  # noqa: E402

FAST = ("--eval-k", "0", "--kl-every", "0", "--max-steps", "1")


def run(out, *extra) -> int:
    return main(tiny_argv(str(out), *FAST, *extra))


def snapshot(folder: Path) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def manifest(out: Path) -> dict:
    return json.loads((out / "run-manifest.json").read_text())


# ------------------------------------------------------------------------------------------- 1: foreign files


@pytest.mark.parametrize("overwrite", [False, True])
def test_foreign_files_in_the_output_folder_are_refused_not_destroyed(tmp_path, capsys, overwrite):
    out = tmp_path / "mine"
    (out / "model").mkdir(parents=True)
    (out / "model" / "weights.bin").write_bytes(b"my own model")
    (out / "config.json").write_text('{"mine": true}')
    (out / "heldout.jsonl").write_text("my data\n")
    before = snapshot(out)
    code = run(out, *(["--overwrite"] if overwrite else []))
    assert code == 2
    err = capsys.readouterr().err
    assert "config.json" in err and "model/" in err and "no run of this trainer wrote" in err, err
    assert snapshot(out) == before  # nothing touched, nothing added


@pytest.mark.parametrize("theirs", ["metrics.jsonl", "summary.json"])
def test_another_tools_metrics_do_not_make_a_folder_a_run_to_overwrite(tmp_path, capsys, theirs):
    # a folder without a manifest but with a non-empty metrics.jsonl (or a summary.json) counted as a run written
    # before manifests, and --overwrite deleted every name the trainer writes: the user's model/ and config.json too
    out = tmp_path / "theirs"
    (out / "model").mkdir(parents=True)
    (out / "model" / "pytorch_model.bin").write_bytes(b"their model")
    (out / "config.json").write_text('{"theirs": true}')
    (out / theirs).write_text('{"loss": 1.0}\n')
    before = snapshot(out)
    assert run(out, "--overwrite") == 2
    err = capsys.readouterr().err
    assert "no run of this trainer wrote" in err and "model/" in err and theirs in err, err
    assert snapshot(out) == before


def test_a_folder_with_other_files_is_used_and_they_are_kept(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    assert run(out) == 0
    first = manifest(out)
    assert first["owner"] and "model" in first["files"] and "notes.txt" not in first["files"]
    assert run(out, "--overwrite") == 0  # --overwrite deletes the run, not the folder's other files
    assert (out / "notes.txt").read_text() == "keep me"
    assert manifest(out)["run_id"] != first["run_id"]  # a new run


# ------------------------------------------------------------------------------------------- 3: symbolic links


@pytest.mark.parametrize(
    "name", ["train.lock", "config.json.tmp", "metrics.jsonl.tmp", "summary.json.tmp", "heldout.jsonl.tmp",
             "checkpoint/state.pt.tmp", "config.json"]
)  # fmt: skip
def test_planted_links_are_never_written_through(tmp_path, capsys, name):
    out, victim = tmp_path / "run", tmp_path / "victim.txt"
    victim.write_text("precious")
    (out / "checkpoint").mkdir(parents=True)
    (out / name).symlink_to(victim)
    assert run(out) == 2
    assert victim.read_text() == "precious"
    assert "symbolic link" in capsys.readouterr().err


def test_planted_model_tmp_link_is_never_written_through(tmp_path, capsys):
    out, victim = tmp_path / "run", tmp_path / "victim"
    victim.mkdir()
    out.mkdir()
    (out / "model.tmp").symlink_to(victim, target_is_directory=True)
    assert run(out) == 2
    assert list(victim.iterdir()) == []
    assert "model.tmp is a symbolic link" in capsys.readouterr().err


def test_writes_replace_a_link_planted_during_the_run_without_following_it(tmp_path):
    """The layer under the up-front check: a temporary name or the file itself turned into a link while the run goes
    on is replaced (the link removed), its target untouched."""
    from train.run.metrics import write_json

    out, victim = tmp_path / "run", tmp_path / "victim.txt"
    out.mkdir()
    victim.write_text("precious")
    (out / "summary.json.tmp").symlink_to(victim)
    (out / "summary.json").symlink_to(victim)
    write_json(out / "summary.json", {"steps": 1})
    assert victim.read_text() == "precious"
    assert not (out / "summary.json").is_symlink() and json.loads((out / "summary.json").read_text()) == {"steps": 1}
    assert not os.path.lexists(out / "summary.json.tmp")


def test_export_never_follows_a_model_tmp_link(tmp_path):
    import torch

    from train.model import tiny_model_and_tokenizer

    out, victim = tmp_path / "run", tmp_path / "victim"
    victim.mkdir()
    out.mkdir()
    (out / "model.tmp").symlink_to(victim, target_is_directory=True)
    model, tok = tiny_model_and_tokenizer()
    folder = export_module.export_model(model, tok, out)
    assert list(victim.iterdir()) == [] and folder == out / "model" and (folder / "model.safetensors").is_file()
    assert torch.is_tensor(next(iter(model.state_dict().values())))


# ------------------------------------------------------------------------------------------- garbled metrics


def test_a_garbled_metrics_line_loses_only_itself_on_resume(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(tiny_argv(str(out), "--eval-k", "0", "--kl-every", "0", "--max-steps", "3")) == 0
    lines = (out / "metrics.jsonl").read_text().splitlines()
    assert len(lines) >= 4
    lines[1] = "{garbled"
    (out / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    assert main(tiny_argv(str(out), "--eval-k", "0", "--kl-every", "0", "--max-steps", "3", "--resume")) == 0
    kept = (out / "metrics.jsonl").read_text().splitlines()
    assert kept == lines[:1] + lines[2:]  # every valid record is still there
    assert "line 2 is not a JSON record" in capsys.readouterr().out


# ------------------------------------------------------------------------------------------- 5: trackio names


@pytest.fixture
def fake_trackio(monkeypatch):
    """A stand-in trackio module (the package is an optional extra) that records the calls."""
    import importlib.machinery

    calls = []
    fake = types.ModuleType("trackio")
    fake.__spec__ = importlib.machinery.ModuleSpec("trackio", None)  # (the CLI checks that the package is there)
    fake.init = lambda **kw: calls.append(("init", kw))
    fake.log = lambda metrics, step=None: calls.append(("log", metrics, step))
    fake.finish = lambda: calls.append(("finish",))
    monkeypatch.setitem(sys.modules, "trackio", fake)
    return calls


def test_trackio_runs_in_folders_with_the_same_name_stay_apart(tmp_path, fake_trackio):
    a, b = tmp_path / "arm_a" / "seed0", tmp_path / "arm_b" / "seed0"
    assert run(a, "--report-to", "trackio") == 0
    assert run(b, "--report-to", "trackio") == 0
    assert run(a, "--report-to", "trackio", "--resume", "--max-steps", "2") == 0
    assert run(a, "--report-to", "trackio", "--overwrite") == 0
    names = [c[1]["name"] for c in fake_trackio if c[0] == "init"]
    assert all(n.startswith("seed0-") for n in names)
    assert names[0] != names[1]  # two folders called seed0: two runs
    assert names[2] == names[0]  # a resume continues its own run
    assert names[3] not in names[:3]  # --overwrite starts a new one


def test_a_failing_dashboard_loses_no_record(tmp_path, fake_trackio, capsys):
    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    sys.modules["trackio"].log = full
    out = tmp_path / "run"
    assert run(out, "--report-to", "trackio") == 0
    recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert any(r.get("step") == 1 and "loss" in r for r in recs)
    assert "the dashboard is off from here" in capsys.readouterr().out


def test_a_failed_metrics_write_leaves_no_torn_record(tmp_path):
    from train.run.metrics import MetricsLog

    path = tmp_path / "metrics.jsonl"
    with MetricsLog(path) as log:
        log.write({"step": 1, "loss": 0.5})
        real = log._file

        class HalfThenFull:  # the disk fills in the middle of the next record
            def __init__(self):
                self.fileno = real.fileno

            def write(self, data):
                real.write(data[:7])
                raise OSError(errno.ENOSPC, "No space left on device")

            def close(self):
                real.close()

        log._file = HalfThenFull()
        with pytest.raises(OSError):
            log.write({"step": 2, "loss": 0.25})
    assert path.read_text() == '{"step": 1, "loss": 0.5}\n'


# ------------------------------------------------------------------------------------------- the model export


def test_sigterm_during_the_export_says_the_run_is_saved(tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"

    def stopped(*a, **k):
        raise Terminated("SIGTERM")

    monkeypatch.setattr(export_module, "write_hf_folder", stopped)
    assert run(out) == 143
    captured = capsys.readouterr()
    assert "nothing was saved" not in captured.err + captured.out
    assert "finished and checkpointed" in captured.out
    assert not (out / "model").exists() and not (out / "model.tmp").exists()
    summary = json.loads((out / "summary.json").read_text())
    assert "after" in summary and summary["signal"] == "SIGTERM"
    monkeypatch.undo()
    assert run(out, "--resume") == 0  # nothing to train: the model is written
    assert (out / "model" / "model.safetensors").is_file()


def test_a_full_disk_during_the_export_keeps_the_previous_model_and_the_records(tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    assert run(out) == 0
    before = snapshot(out / "model")
    real = export_module.write_hf_folder

    def full(model, tok, folder):
        real(model, tok, folder)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(export_module, "write_hf_folder", full)
    assert run(out, "--resume", "--max-steps", "2") == 1
    err = capsys.readouterr().err
    assert "No space left on device" in err and "checkpointed" in err and "Traceback" not in err
    assert snapshot(out / "model") == before and not (out / "model.tmp").exists()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 2 and "after" in summary


# ------------------------------------------------------------------------------------------- summary.json


def test_a_full_disk_at_the_summary_says_what_is_saved(tmp_path, monkeypatch, capsys):
    """A full disk while summary.json is written: exit 1 with a message (no traceback) that says the run is
    checkpointed and how to get the summary; the previous summary.json is kept whole."""
    import train.loop as loop_module

    out = tmp_path / "run"
    assert run(out) == 0
    before = (out / "summary.json").read_bytes()
    real = loop_module.write_json

    def full(path, obj, **kw):
        if Path(path).name == "summary.json":
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(path, obj, **kw)

    monkeypatch.setattr(loop_module, "write_json", full)
    assert run(out, "--resume", "--max-steps", "2") == 1
    err = capsys.readouterr().err
    assert "summary.json" in err and "No space left on device" in err and "--resume" in err, err
    assert "Traceback" not in err
    assert (out / "summary.json").read_bytes() == before and not (out / "summary.json.tmp").exists()
    monkeypatch.undo()
    assert run(out, "--resume", "--max-steps", "2") == 0  # nothing left to train: the summary is written
    assert json.loads((out / "summary.json").read_text())["steps"] == 2


@pytest.mark.parametrize("where", ["a_file", "a_file/sub"])
def test_an_output_dir_that_cannot_be_a_folder_is_refused_naming_it(tmp_path, capsys, where):
    # was a FileExistsError / NotADirectoryError traceback (exit 1) from the lock's mkdir
    (tmp_path / "a_file").write_text("not a folder")
    assert run(tmp_path / where) == 2
    err = capsys.readouterr().err
    assert f"--output-dir {tmp_path / where}" in err and "Traceback" not in err, err
    assert ("is a file, not a folder" if where == "a_file" else "cannot be made") in err, err
    assert (tmp_path / "a_file").read_text() == "not a folder"
