"""--config FILE (train/config/file.py): YAML values under flags, a run's own config.json as input (re-running a run is
one command, its --loss.FIELD overrides included), refusals that name the file, the key, the value and what is
accepted; --resume reads OUTPUT_DIR/config.json; the study's --config."""

from __future__ import annotations

import dataclasses
import json

import pytest

pytest.importorskip("transformers")

from conftest import tiny_argv  # noqa: E402

from study.__main__ import config_argv  # noqa: E402
from study.__main__ import main as study_main  # noqa: E402
from train.__main__ import main  # noqa: E402
from train.config import TrainConfig  # noqa: E402
from train.config.cli import parse_args  # noqa: E402


def refused(argv, capsys) -> str:
    with pytest.raises(SystemExit) as exc:
        parse_args(argv)
    assert exc.value.code == 2
    return capsys.readouterr().err


def test_yaml_values_under_flags_over_the_run_preset(tmp_path):
    f = tmp_path / "run.yaml"
    f.write_text("run_preset: smoke\nmax-steps: 7\nlr: 1e-4\npreset: gtpo\nloss.epsilon_high: 0.3\nlora: yes\n")
    cfg, over = parse_args(["--config", str(f), "--max-steps", "9"])
    assert cfg.max_steps == 9  # the flag beats the file
    assert cfg.lr == 1e-4 and cfg.preset == "gtpo" and cfg.lora is True  # YAML's "1e-4" text: read as the flag
    assert cfg.group_size == 4  # the file's run preset (smoke), under the file's values
    assert over == {"epsilon_high": 0.3}
    assert parse_args(["--config", str(f), "--loss.epsilon_high", "0.25"])[1] == {"epsilon_high": 0.25}
    assert parse_args(["--config", str(f), "--run-preset", "default"])[0].group_size == 8


def test_json_config_and_data_alias(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text('{"question": "1+1", "answer": "2"}\n{"question": "2+2", "answer": "4"}\n')
    f = tmp_path / "run.json"
    f.write_text(json.dumps({"task": "gsm8k", "data": str(data), "seed": 3}))
    cfg, _ = parse_args(["--config", str(f)])
    assert cfg.task == "gsm8k" and cfg.data_path == str(data) and cfg.seed == 3
    assert parse_args(["--task", "gsm8k", "--data", str(data)])[0].data_path == str(data)


@pytest.mark.parametrize(
    "text, words",
    [
        ("max_stepz: 3\n", ["unknown key 'max_stepz'", "did you mean 'max_steps'"]),
        ("lr: fast\n", ["key 'lr'", "'fast' refused", "number with 0 < x <= 1"]),
        ("group_size: 1\n", ["key 'group_size'", "1 refused", "integer >= 2"]),
        ("lora: maybe\n", ["key 'lora'", "'maybe' refused"]),
        ("steps: [1, 2]\n", ["unknown key 'steps'"]),
        ("- 1\n- 2\n", ["expected a mapping"]),
        ("max_steps: [\n", ["not valid YAML"]),
        ("run_preset: huge\n", ["key 'run_preset'", "'huge' refused", "smoke"]),
        # one setting under two spellings: the last one won, silently (docs/trainer.md: duplicate keys are refused)
        ("max-steps: 3\nmax_steps: 9\n", ["keys 'max-steps' and 'max_steps' both set max_steps"]),
        ("group_size: 4\ngroup-size: 8\n", ["keys 'group_size' and 'group-size' both set group_size"]),
        # YAML 1.1 numbers read silently as another value: 010 was 8, 1:30 was 90, -007 -7
        ("max_steps: 010\n", ["line 1: 010 is read as an octal number (YAML 1.1: 010 is 8)", "leading zeros"]),
        ("loss.beta: -007\n", ["line 1: -007 is read as an octal number"]),
        ("time_budget_s: 1:30\n", ["line 1: 1:30 is read as a base-60 number", "write it in decimal"]),
        ("use_vllm: off\n", ["key 'use_vllm': False refused", "quote the text (use_vllm: 'off')"]),  # was unexplained
        ("train: [1]\n", ["key 'train': a list of 1 item(s) refused: a run's config.json holds \"train\": a mapping"]),
    ],
)
def test_bad_files_are_refused_naming_the_key(tmp_path, capsys, text, words):
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    err = refused(["--config", str(f)], capsys)
    assert str(f) in err
    for w in words:
        assert w in err, (w, err)


def test_yaml_numbers_that_read_the_same_everywhere_still_pass_and_a_json_bom_is_read_past(tmp_path):
    f = tmp_path / "ok.yaml"
    f.write_text("max_steps: 0\nlr: 0.5\nwarmup_steps: 1_0\ntime_budget_s: 00.5\nsave_every: '010'\n")
    cfg, _ = parse_args(["--config", str(f)])
    assert (cfg.max_steps, cfg.lr, cfg.warmup_steps, cfg.time_budget_s, cfg.save_every) == (0, 0.5, 10, 0.5, 10)
    j = tmp_path / "bom.json"  # as Notepad writes UTF-8; was refused as not valid JSON (YAML read past it)
    j.write_bytes(b"\xef\xbb\xbf" + json.dumps({"max_steps": 5}).encode())
    assert parse_args(["--config", str(j)])[0].max_steps == 5


def test_missing_file_refused(tmp_path, capsys):
    assert "no such file" in refused(["--config", str(tmp_path / "nope.yaml")], capsys)
    assert "is a folder, not a file" in refused(["--config", str(tmp_path)], capsys)  # was "no such file"


def test_a_runs_config_json_round_trips(tmp_path):
    out = tmp_path / "run"
    argv = tiny_argv(out, "--max-steps", "1", "--eval-k", "0", "--kl-every", "0", "--preset", "gtpo",
                     "--loss.epsilon_high", "0.3", "--lr", "0.002", "--save-model", "false")  # fmt: skip
    cfg, over = parse_args(argv)
    assert main(argv) == 0
    again, again_over = parse_args(["--config", str(out / "config.json")])
    assert again == cfg and again_over == over  # every field, and the --loss.FIELD override
    assert again.loss_config(again_over) == cfg.loss_config(over)
    # re-running it is one command (elsewhere: the file names the old output directory)
    assert main(["--config", str(out / "config.json"), "--output-dir", str(tmp_path / "again")]) == 0
    first = json.loads((out / "config.json").read_text())
    second = json.loads((tmp_path / "again" / "config.json").read_text())
    assert first["loss"] == second["loss"]
    assert {k: v for k, v in first["train"].items() if k != "output_dir"} == {
        k: v for k, v in second["train"].items() if k != "output_dir"
    }


def test_config_json_of_a_resumed_run_starts_a_new_run(tmp_path):
    """resume/overwrite in a run's config.json are what that invocation did, not configuration."""
    f = tmp_path / "config.json"
    train = dataclasses.asdict(TrainConfig(resume=True, overwrite=False))
    f.write_text(json.dumps({"train": train, "loss": {}, "world_size": 1}))
    assert parse_args(["--config", str(f)])[0].resume is False


def test_resume_reads_the_runs_own_config(tmp_path, capsys):
    out = tmp_path / "run"
    argv = tiny_argv(out, "--max-steps", "1", "--eval-k", "0", "--kl-every", "0", "--preset", "gtpo",
                     "--loss.epsilon_high", "0.3", "--seed", "5")  # fmt: skip
    assert main(argv) == 0
    # before: every flag typed again; now --output-dir and --resume (and what may change) are enough
    assert main(["--output-dir", str(out), "--resume", "--max-steps", "2"]) == 0
    assert json.loads((out / "summary.json").read_text())["steps"] == 2
    # a flag typed again must still match the checkpoint
    assert main(["--output-dir", str(out), "--resume", "--max-steps", "3", "--seed", "6"]) == 2
    assert "--seed: checkpoint 5, now 6" in capsys.readouterr().err


def test_study_config_file(tmp_path, capsys):
    f = tmp_path / "study.yaml"
    f.write_text("regime: default\nseeds: [0, 2]\nset: [max_steps=3]\narms: [grpo, gtpo]\nno_figure: true\n")
    assert config_argv(str(f)) == ["--regime", "default", "--seeds", "0,2", "--set", "max_steps=3", "--arms",
                                   "grpo,gtpo", "--no-figure"]  # fmt: skip
    f.write_text("seedz: [0]\n")
    assert study_main(["--config", str(f)]) == 2
    err = capsys.readouterr().err
    assert "unknown key 'seedz'" in err and str(f) in err
