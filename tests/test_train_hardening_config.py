"""Issue 39, config files (`python -m train --config`, the study's `--config`): parsed within limits (size, nesting,
aliases, numbers, duplicate keys), every refusal one line naming the file, the key or line and what is accepted,
never the expanded value; `loss.FIELD` text read as the flag reads it; `loss.name` refused; one --config only; the
study refuses max_steps=0 before its grid starts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from study.__main__ import main as study_main  # noqa: E402
from train.config.cli import parse_args  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
BOMB = "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"{n}: &{n} [{', '.join([f'*{p}'] * 9)}]\n" for p, n in zip("abcdefgh", "bcdefghi")
)


def refused(argv, capsys) -> str:
    with pytest.raises(SystemExit) as exc:
        parse_args(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err.strip().splitlines()[-1]  # the refusal: one line


@pytest.mark.parametrize("command", ["train", "study", "train.study"])
def test_yaml_alias_bomb_is_refused_at_once(tmp_path, command):
    """A 300-byte billion-laughs file: refused without expanding it (before: gigabytes, over a minute, and the
    expansion printed). In a subprocess, so that a regression times out instead of taking the test session down."""
    f = tmp_path / "bomb.yaml"
    f.write_text(BOMB + "lr: *i\n")
    assert len(f.read_bytes()) < 500
    out = subprocess.run([sys.executable, "-m", command, "--config", str(f)], cwd=REPO, capture_output=True,
                         text=True, timeout=60)  # fmt: skip
    assert out.returncode == 2
    assert "alias *a stands for a list" in out.stderr and str(f) in out.stderr
    assert len(out.stderr) < 2000 and "lol" not in out.stderr


@pytest.mark.parametrize(
    "name, text, words",
    [
        ("big.yaml", "max_steps: " + "9" * 5000 + "\n", ["line 1", "a number of 5000 characters", "at most 64"]),
        ("big.json", '{"max_steps": ' + "9" * 5000 + "}", ["a number of 5000 characters", "at most 64"]),
        ("dup.yaml", "lr: 0.1\nmax_steps: 3\nlr: 0.2\n", ["line 3", "key 'lr' given twice"]),
        ("dup.json", '{"lr": 0.1, "lr": 0.2}', ["key 'lr' given twice"]),
        ("preset.yaml", "run_preset: [smoke]\n", ["key 'run_preset'", "a list of 1 item(s) refused", "smoke"]),
        ("preset2.yaml", "run_preset: {a: 1}\n", ["key 'run_preset'", "a mapping of 1 item(s) refused"]),
        ("deep.yaml", "lr: " + "[" * 50 + "]" * 50 + "\n", ["nested deeper than 4 levels"]),
        ("deep.json", '{"lr": ' + "[" * 5000 + "]" * 5000 + "}", ["nested deeper than 4 levels"]),
        ("list.yaml", "lr: [0.1, 0.2]\n", ["key 'lr'", "a list of 2 item(s) refused", "number with 0 < x <= 1"]),
        ("long.yaml", "lr: " + "x" * 10000 + "\n", ["key 'lr'", "(10002 characters) refused"]),
        ("name.yaml", "loss.name: s_grpo_v2\n", ["key 'loss.name' refused", "preset"]),
        ("nan.json", '{"lr": NaN}', ["NaN refused", "finite"]),
    ],
    ids=lambda v: v if isinstance(v, str) and v.endswith((".yaml", ".json")) else "",
)
def test_bad_config_files_are_refused_in_one_line(tmp_path, capsys, name, text, words):
    f = tmp_path / name
    f.write_text(text)
    line = refused(["--config", str(f)], capsys)
    assert str(f) in line
    for w in words:
        assert w in line, (w, line)
    assert len(line) < 400  # never the value written out


def test_non_utf8_config_is_refused_naming_the_line(tmp_path, capsys):
    f = tmp_path / "latin1.yaml"
    f.write_bytes(b"max_steps: 3\nsystem_prompt: caf\xe9\n")
    line = refused(["--config", str(f)], capsys)
    assert str(f) in line and "line 2: not UTF-8 text" in line


def test_a_config_file_larger_than_the_limit_is_refused(tmp_path, capsys):
    f = tmp_path / "huge.yaml"
    f.write_text("# " + "x" * (2 << 20) + "\nlr: 0.1\n")
    assert "larger than 1048576 bytes" in refused(["--config", str(f)], capsys)


def test_aliases_of_single_values_still_work(tmp_path):
    f = tmp_path / "ok.yaml"
    f.write_text("max_steps: &n 5\nwarmup_steps: *n\n")
    cfg, _ = parse_args(["--config", str(f)])
    assert cfg.max_steps == 5 and cfg.warmup_steps == 5


def test_loss_fields_from_yaml_are_read_as_the_flag_reads_them(tmp_path):
    """YAML 1.1 reads `1e-3` as text: the flag reads it as a number, so the file does too."""
    f = tmp_path / "loss.yaml"
    f.write_text("loss.epsilon_high: 1e-3\nloss.entropy_coef: 0.01\n")
    _, over = parse_args(["--config", str(f)])
    assert over == {"epsilon_high": 1e-3, "entropy_coef": 0.01}
    assert parse_args(["--loss.epsilon_high", "1e-3"])[1] == {"epsilon_high": 1e-3}


def test_a_second_config_is_refused_not_dropped(tmp_path, capsys):
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text("max_steps: 3\n")
    b.write_text("lr: 0.1\n")
    assert "--config: given more than once" in refused(["--config", str(a), "--config", str(b)], capsys)
    assert "--config: given more than once" in refused(["--config", str(a), f"--config={b}"], capsys)


def test_study_config_bomb_and_second_config(tmp_path, capsys):
    f = tmp_path / "study.yaml"
    f.write_text(BOMB + "seeds: *i\n")
    assert study_main(["--config", str(f), "--out", str(tmp_path / "o"), "--work", str(tmp_path / "w")]) == 2
    err = capsys.readouterr().err
    assert "alias *a stands for a list" in err and "lol" not in err
    g = tmp_path / "g.json"
    g.write_text(json.dumps({"seeds": [0]}))
    assert study_main(["--config", str(g), "--config", str(g)]) == 2
    assert "--config given more than once" in capsys.readouterr().err


def test_study_refuses_max_steps_zero_before_the_grid(tmp_path, capsys):
    out, work = tmp_path / "out", tmp_path / "work"
    argv = ["--regime", "default", "--arms", "grpo", "--seeds", "0", "--set", "max_steps=0", "--out", str(out),
            "--work", str(work), "--progress", "false"]  # fmt: skip
    assert study_main(argv) == 2
    assert "max_steps=0 trains nothing" in capsys.readouterr().err
    assert not work.exists() or not any(work.rglob("*.log"))  # no run started
