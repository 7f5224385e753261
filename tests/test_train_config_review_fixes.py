"""Config-file defects a review of the trainer's user surfaces found (2026-11-30), each a test that failed before its
fix: numbers YAML and JSON read as numbers refused by a text or boolean field with a message listing them as
accepted, and an unknown `loss.FIELD` key of a file reported as a flag the user never typed."""

from __future__ import annotations

import pytest

pytest.importorskip("yaml")

from train.config.cli import parse_args  # noqa: E402


@pytest.mark.parametrize(
    ("text", "field", "want"),
    [
        ("difficulty: 3\n", "difficulty", "3"),
        ('{"difficulty": 3}', "difficulty", "3"),
        ("progress: 1\n", "progress", True),
        ("step_guard: 0\n", "step_guard", False),
        ('{"save_model": 0}', "save_model", False),
    ],
)
def test_a_number_the_flag_accepts_as_text_is_accepted_from_a_file(tmp_path, text, field, want):
    """'difficulty: 3' was refused with "expected levels 1..8: '3', ..."; 'progress: 1' with "expected true/false,
    1/0, ..." (YAML and JSON read the written 3 and 1 as numbers, which only text was parsed from)."""
    f = tmp_path / ("c.json" if text.startswith("{") else "c.yaml")
    f.write_text(text)
    cfg, _ = parse_args(["--config", str(f)])
    assert getattr(cfg, field) == want and type(getattr(cfg, field)) is type(want)


@pytest.mark.parametrize("text", ["progress: 2\n", "difficulty: 9\n", "step_guard: 0.5\n"])
def test_other_numbers_are_still_refused_naming_the_file_and_key(tmp_path, capsys, text):
    f = tmp_path / "c.yaml"
    f.write_text(text)
    with pytest.raises(SystemExit):
        parse_args(["--config", str(f)])
    err = capsys.readouterr().err
    assert f"--config {f}: key {text.split(':')[0]!r}" in err and "refused" in err


def test_an_unknown_loss_key_of_a_file_is_named_as_the_files_key(tmp_path, capsys):
    """It was reported as 'argument --loss.bogus: ...', a flag the user never typed."""
    f = tmp_path / "c.yaml"
    f.write_text("loss.bogus: 1\n")
    with pytest.raises(SystemExit):
        parse_args(["--config", str(f)])
    err = capsys.readouterr().err
    assert f"--config {f}: key(s) loss.bogus" in err and "--loss.bogus" not in err
    with pytest.raises(SystemExit):
        parse_args(["--config", str(f), "--loss.epsilon-low", "0.1"])  # a typed flag is still named as the flag
    assert "--loss.bogus" not in capsys.readouterr().err


def test_a_data_path_under_the_home_folder_is_expanded(tmp_path, monkeypatch, capsys):
    """'data_path: ~/d.jsonl' was refused as 'no such file' while the file existed (`model` expands ~)."""
    monkeypatch.setenv("HOME", str(tmp_path))
    rows = '{"question": "1 + 1 =", "answer": "2"}\n{"question": "2 + 2 =", "answer": "4"}\n'
    (tmp_path / "d.jsonl").write_text(rows)
    f = tmp_path / "c.yaml"
    f.write_text("task: jsonl\ndata_path: ~/d.jsonl\n")
    cfg, _ = parse_args(["--config", str(f)])
    assert cfg.data_path == str(tmp_path / "d.jsonl")
    cfg, _ = parse_args(["--task", "jsonl", "--data", "~/d.jsonl"])
    assert cfg.data_path == str(tmp_path / "d.jsonl")


def test_resume_finds_the_runs_config_under_a_tilde_output_dir(tmp_path, monkeypatch):
    """--output-dir=~/run --resume (a spelling the shell does not expand) looked for ./~/run/config.json, read the
    defaults instead of the run's configuration, and the resume was refused for differences."""
    import json

    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.json").write_text(json.dumps({"train": {"max_steps": 7, "model": "tiny"}}))
    cfg, _ = parse_args(["--output-dir=~/run", "--resume", "true"])
    assert cfg.max_steps == 7 and cfg.model == "tiny"
