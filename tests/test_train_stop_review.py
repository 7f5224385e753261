"""Signals and resumes at the edges of a run (a review of 2026-11-30): a Ctrl-C while the summary is written, or
between the renames that replace model/, and --threads changed on --resume. Before: no summary.json and "nothing was
saved" printed for a finished, checkpointed run; model/ lost (left as model.tmp-old-*); a silently non-bitwise
resume."""

from __future__ import annotations

import json
import os
import signal

import pytest
import torch

pytest.importorskip("transformers")

from conftest import tiny_cfg  # noqa: E402

import train.export as export  # noqa: E402
import train.loop as loop  # noqa: E402
from train.__main__ import main  # noqa: E402

SMALL = {"max_steps": 1, "eval_k": 0, "kl_every": 0}


def test_a_signal_while_the_summary_is_written_waits_for_it(tmp_path, monkeypatch):
    real = loop.write_summary

    def interrupted(*args):
        os.kill(os.getpid(), signal.SIGINT)  # (a second Ctrl-C, or the first one this late)
        return real(*args)

    monkeypatch.setattr(loop, "write_summary", interrupted)
    out = tmp_path / "run"
    summary = loop.train(tiny_cfg(out, **SMALL))
    assert summary["steps"] == 1 and json.loads((out / "summary.json").read_text())["steps"] == 1


def test_a_signal_outside_a_step_names_the_checkpoint_that_stays(tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    assert main(["--model", "tiny", "--output-dir", str(out), "--max-steps", "1", "--eval-k", "0", "--kl-every", "0",
                 "--progress", "false"]) == 0  # fmt: skip

    def stopped(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(loop, "train", stopped)
    assert main(["--model", "tiny", "--output-dir", str(out), "--resume", "--max-steps", "2"]) == 130
    err = capsys.readouterr().err
    assert "nothing was saved" not in err and f"its last checkpoint stays ({out / 'checkpoint' / 'state.pt'}" in err


def test_a_signal_between_the_renames_puts_model_back(tmp_path, monkeypatch):
    from train.model import tiny_model_and_tokenizer

    out = tmp_path / "run"
    out.mkdir()
    model, tok = tiny_model_and_tokenizer()
    export.export_model(model, tok, out)
    before = (out / "model" / "model.safetensors").read_bytes()
    real, calls = os.rename, []

    def rename(src, dst):
        calls.append((src, dst))
        if len(calls) == 2:  # model/ moved aside, the new one not yet in place
            raise KeyboardInterrupt
        return real(src, dst)

    monkeypatch.setattr(export.os, "rename", rename)
    with torch.no_grad():
        next(model.parameters()).add_(1.0)  # another model: its folder would differ
    with pytest.raises(KeyboardInterrupt):
        export.export_model(model, tok, out)
    monkeypatch.setattr(export.os, "rename", real)
    assert (out / "model" / "model.safetensors").read_bytes() == before
    assert sorted(p.name for p in out.iterdir()) == ["model"]
    (out / "model.tmp-old-0123abcd").mkdir()  # left by a trainer before this fix: removed by the next export
    export.export_model(model, tok, out)
    assert sorted(p.name for p in out.iterdir()) == ["model"]
    assert (out / "model" / "model.safetensors").read_bytes() != before


def test_changing_threads_on_resume_is_warned_about(tmp_path, capsys):
    out = tmp_path / "run"
    loop.train(tiny_cfg(out, threads=1, **SMALL))
    capsys.readouterr()
    loop.train(tiny_cfg(out, resume=True, threads=2, **{**SMALL, "max_steps": 2}))
    assert "warning: --threads 2, the checkpoint's run 1: on a CPU the number of threads" in capsys.readouterr().out


def test_the_metrics_are_on_disk_before_a_checkpoint_counts_them(tmp_path, monkeypatch):
    """The checkpoint (fsynced) records how many metrics.jsonl records it covers; the log was never fsynced, so after
    a power loss the checkpoint could count records that were gone."""
    from train.run import state as state_mod

    order, real_fsync, real_save = [], os.fsync, state_mod.save_checkpoint

    def fsync(fd):
        order.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        return real_fsync(fd)

    def save_checkpoint(*args, **kwargs):
        order.append(("checkpoint", ""))
        return real_save(*args, **kwargs)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(state_mod, "save_checkpoint", save_checkpoint)
    loop.train(tiny_cfg(tmp_path / "run", **SMALL))
    first = order.index(("checkpoint", ""))
    assert any(what == "fsync" and path.endswith("metrics.jsonl") for what, path in order[:first]), order[:first]
