"""Settings that do nothing in the combination given (train/config/inert.py): `python -m train` accepts them (scripts
keep running) and prints one warning line per such field on stderr, naming the flag, its value and the flag that makes
it inert. Only fields the user gave (typed, or in a hand-written --config file) with a value other than the run's
default warn; a run's own config.json (--resume, or --config of it) is a record, not what the user typed."""

from __future__ import annotations

import dataclasses
import json
import sys
import types

import pytest

from train.config import TrainConfig
from train.config.cli import parse_args
from train.config.inert import INERT, task_reads
from train.tasks import register_task, task_names, unregister_task

HF = "rollouts come from HF generate: no vLLM engine"
TIS = "HF generate samples from the trainer's own forward: no sampler/trainer mismatch to correct"
LORA_OFF = "full fine-tuning: no LoRA adapters"
LORA_ON = "the LoRA adapters are what is trained; the base model stays frozen"


def warnings(argv, capsys, warn: bool = True) -> list[str]:
    capsys.readouterr()
    parse_args(argv, warn=warn)
    captured = capsys.readouterr()
    assert captured.out == ""
    return captured.err.splitlines()


INERT_CASES = [
    (["--probe-size", "64", "--kl-every", "0"],
     "warning: --probe-size 64 does nothing with --kl-every 0 (the KL probe is off)"),
    (["--eval-k", "0", "--eval-k-problems", "10"],
     "warning: --eval-k-problems 10 does nothing with --eval-k 0 (pass@k / maj@k are off)"),
    (["--lora-r", "8"], f"warning: --lora-r 8 does nothing without --lora ({LORA_OFF})"),
    (["--lora-alpha", "64", "--lora", "false"], f"warning: --lora-alpha 64 does nothing without --lora ({LORA_OFF})"),
    (["--lora", "--train-layers", "4"], f"warning: --train-layers 4 does nothing with --lora ({LORA_ON})"),
    (["--lora", "true", "--train-lm-head"], f"warning: --train-lm-head true does nothing with --lora ({LORA_ON})"),
    (["--use-vllm", "off", "--vllm-dtype", "bfloat16"],
     f"warning: --vllm-dtype bfloat16 does nothing with --use-vllm off ({HF})"),
    (["--vllm-kv-cache-gb", "2", "--use-vllm", "off"],
     f"warning: --vllm-kv-cache-gb 2 does nothing with --use-vllm off ({HF})"),
    (["--vllm-max-model-len", "256", "--use-vllm", "off"],
     f"warning: --vllm-max-model-len 256 does nothing with --use-vllm off ({HF})"),
    (["--use-vllm", "off", "--tis-cap", "5"], f"warning: --tis-cap 5 does nothing with --use-vllm off ({TIS})"),
    (["--use-vllm", "off", "--tis-cap", "2.5"], f"warning: --tis-cap 2.5 does nothing with --use-vllm off ({TIS})"),
    (["--use-vllm", "off", "--tis-mode", "sequence_mask"],
     f"warning: --tis-mode sequence_mask does nothing with --use-vllm off ({TIS})"),
    (["--use-vllm", "off", "--tis-min", "0.5"], f"warning: --tis-min 0.5 does nothing with --use-vllm off ({TIS})"),
    (["--dtype", "bf16", "--mixed-precision", "bf16"],
     "warning: --mixed-precision bf16 does nothing with --dtype bf16 (the weights compute in bf16 already)"),
    (["--task", "wordproblems", "--difficulty", "3-6"],
     "warning: --difficulty 3-6 does nothing with --task wordproblems (this task has no difficulty levels)"),
    (["--difficulty", "4", "--task", "gsm8k"],
     "warning: --difficulty 4 does nothing with --task gsm8k (this task has no difficulty levels)"),
    # the other spelling of a flag, and a value typed as the dataclass default but not the run preset's (smoke: 4)
    (["--probe_size", "7", "--kl_every", "0"],
     "warning: --probe-size 7 does nothing with --kl-every 0 (the KL probe is off)"),
    (["--run-preset", "smoke", "--probe-size", "16", "--kl-every", "0"],
     "warning: --probe-size 16 does nothing with --kl-every 0 (the KL probe is off)"),
]  # fmt: skip


@pytest.mark.parametrize("argv, line", INERT_CASES, ids=[" ".join(a) for a, _ in INERT_CASES])
def test_each_inert_combination_warns_once(argv, line, capsys):
    assert warnings(argv, capsys) == [line]


NOT_INERT = [
    ["--probe-size", "64", "--kl-every", "5"],  # the probe runs
    ["--probe-size", "64"],
    ["--eval-k-problems", "10", "--eval-k", "2"],
    ["--lora", "--lora-r", "8", "--lora-alpha", "8"],
    ["--train-layers", "4", "--train-lm-head"],  # full fine-tuning reads them
    ["--use-vllm", "on", "--vllm-dtype", "bfloat16", "--tis-cap", "5", "--tis-mode", "token_mask"],
    ["--vllm-dtype", "float32", "--vllm-kv-cache-gb", "2", "--tis-min", "0.5"],  # auto: vLLM when it starts
    ["--difficulty", "3-6"],  # arithmetic reads it
]
AT_DEFAULT = [
    ["--kl-every", "0"],  # the controller alone
    ["--eval-k", "0"],
    ["--use-vllm", "off"],
    ["--task", "wordproblems"],
    ["--lora"],
    ["--probe-size", "16", "--kl-every", "0"],  # typed, but the default value: nothing was changed
    ["--use-vllm", "off", "--tis-cap", "3", "--vllm-dtype", "auto"],
    ["--use-vllm", "off", "--vllm-max-model-len", "0"],  # its off value
    ["--dtype", "bfloat16", "--mixed-precision", "off"],
    ["--use-vllm", "off", "--tis-cap", "5", "--mixed-precision", "bf16"],  # HF generate's log-probs come back
    ["--mixed-precision", "bf16"],  # fp32 weights (auto on CPU): it acts
    ["--run-preset", "smoke", "--kl-every", "0"],  # smoke's probe_size 4: the run preset's, not the user's
    ["--run-preset", "gpu", "--task", "wordproblems"],  # gpu's difficulty 3-6, likewise
    ["--run-preset", "smoke", "--probe-size", "4", "--kl-every", "0"],
]


@pytest.mark.parametrize("argv", NOT_INERT + AT_DEFAULT, ids=lambda a: " ".join(a))
def test_no_warning_when_the_field_acts_or_is_at_its_default(argv, capsys):
    assert warnings(argv, capsys) == []


def test_several_fields_one_line_each_and_only_when_asked(capsys):
    argv = ["--kl-every", "0", "--probe-size", "8", "--eval-k", "0", "--eval-k-problems", "5", "--lora-r", "4",
            "--lora-alpha", "4", "--use-vllm", "off", "--vllm-dtype", "float32", "--tis-cap", "2", "--task",
            "wordproblems", "--difficulty", "2"]  # fmt: skip
    lines = warnings(argv, capsys)
    flags = ["--probe-size", "--eval-k-problems", "--lora-r", "--lora-alpha", "--vllm-dtype", "--tis-cap",
             "--difficulty"]  # fmt: skip
    assert [line.split()[1] for line in lines] == flags
    assert all(line.startswith("warning: ") and " does nothing with" in line for line in lines)  # (with/without)
    assert warnings(argv, capsys, warn=False) == []  # the study's checking parse: its runs' logs say it once
    off = argv[: argv.index("--tis-cap")] + ["--tis-cap", "0"] + argv[argv.index("--tis-cap") + 2 :]
    assert [line.split()[1] for line in warnings(off, capsys)] == [f for f in flags if f != "--tis-cap"]  # off: silent
    cfg, _ = parse_args(argv)
    assert cfg.probe_size == 8 and cfg.lora_r == 4 and cfg.difficulty == "2"  # nothing refused, nothing changed


def test_config_file_values_warn_naming_the_file(tmp_path, capsys):
    f = tmp_path / "run.yaml"
    f.write_text("probe_size: 64\nkl_every: 0\nuse_vllm: 'off'\nvllm-dtype: float32\neval_k_problems: 25\n")
    assert warnings(["--config", str(f)], capsys) == [
        f"warning: --probe-size 64 (--config {f}) does nothing with --kl-every 0 (the KL probe is off)",
        f"warning: --vllm-dtype float32 (--config {f}) does nothing with --use-vllm off ({HF})",
    ]  # eval_k_problems: the default; eval_k 4 anyway
    # a flag typed over the file's value is named as typed; a flag can also make the file's value inert
    assert warnings(["--config", str(f), "--probe-size", "32", "--use-vllm", "auto"], capsys) == [
        "warning: --probe-size 32 does nothing with --kl-every 0 (the KL probe is off)"
    ]
    f.write_text("run_preset: smoke\nlora_r: 8\n")
    assert warnings(["--config", str(f), "--lora"], capsys) == []
    assert warnings(["--config", str(f)], capsys) == [
        f"warning: --lora-r 8 (--config {f}) does nothing without --lora ({LORA_OFF})"
    ]


def test_a_runs_own_config_json_is_a_record_not_typed(tmp_path, capsys):
    """A run's config.json holds every field (its run preset's too): re-running it or resuming it does not repeat
    warnings about values nobody typed this time; a flag typed again warns as any typed flag does."""
    out = tmp_path / "run"
    out.mkdir()
    train = dataclasses.asdict(TrainConfig(probe_size=64, kl_every=0, lora_r=8, output_dir=str(out)))
    (out / "config.json").write_text(json.dumps({"train": train, "world_size": 1}))
    assert warnings(["--config", str(out / "config.json"), "--output-dir", str(tmp_path / "again")], capsys) == []
    assert warnings(["--output-dir", str(out), "--resume"], capsys) == []  # reads OUTPUT_DIR/config.json
    assert parse_args(["--output-dir", str(out), "--resume"])[0].probe_size == 64  # (it was read)
    assert warnings(["--output-dir", str(out), "--resume", "--lora-r", "8"], capsys) == [
        f"warning: --lora-r 8 does nothing without --lora ({LORA_OFF})"
    ]


def test_main_prints_the_warnings_before_training(monkeypatch, capsys):
    """`python -m train`'s entry point parses with warn=True (the training itself stubbed out)."""
    seen = []
    fake = types.ModuleType("train.loop")
    fake.train = lambda cfg, overrides: seen.append(cfg) or {"interrupted": False, "signal": None}
    monkeypatch.setitem(sys.modules, "train.loop", fake)
    from train.__main__ import main

    assert main(["--probe-size", "64", "--kl-every", "0"]) == 0
    assert seen[0].probe_size == 64
    assert capsys.readouterr().err.splitlines() == [
        "warning: --probe-size 64 does nothing with --kl-every 0 (the KL probe is off)"
    ]


def test_the_table_names_real_fields_once():
    names = {f.name for f in dataclasses.fields(TrainConfig)}
    listed = [name for row in INERT for name in row.fields]
    assert set(listed) <= names and len(listed) == len(set(listed))
    assert {row.controller for row in INERT} <= names
    assert not {row.controller for row in INERT} & set(listed)  # a controller is never itself warned about


def test_which_tasks_read_difficulty():
    assert [t for t in task_names() if task_reads(t, "difficulty")] == ["arithmetic"]

    @register_task("inert_test_kwargs", help="reads anything from **options")
    def _any(**options):  # may read options["difficulty"]: never called inert
        raise NotImplementedError

    try:
        assert task_reads("inert_test_kwargs", "difficulty")
    finally:
        unregister_task("inert_test_kwargs")


def test_an_auto_engine_that_falls_back_to_hf_generate_warns_about_the_vllm_settings(capsys):
    """`--use-vllm auto` with `--model tiny` falls back to HF generate when the engine is made (not known when the
    flags are parsed): the vLLM-only settings the user changed do nothing, and say so, one line each; those at their
    defaults or off say nothing, and a bf16-autocast run's TIS acts (HF generate's decode differs from the loss's)."""
    import torch

    from train.distributed import Dist
    from train.engines import make_engine
    from train.model import tiny_model_and_tokenizer

    model, tok = tiny_model_and_tokenizer()
    dist = Dist()  # one process

    def lines(**changes) -> list[str]:
        cfg = TrainConfig(model="tiny", **changes)
        capsys.readouterr()
        assert make_engine(cfg, model, tok, torch.device("cpu"), dist).name == "hf"
        return [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]

    here = "does nothing with --use-vllm auto here: it fell back to HF generate"
    assert lines(vllm_kv_cache_gb=0.5, vllm_dtype="float32", tis_cap=2.0, vllm_max_model_len=0) == [
        f"warning: --vllm-dtype float32 {here} ({HF})",
        f"warning: --vllm-kv-cache-gb 0.5 {here} ({HF})",
        f"warning: --tis-cap 2 {here} ({TIS})",
    ]
    assert lines() == []
    assert lines(tis_cap=0.0) == []  # off: nothing to say
    assert lines(use_vllm="off", vllm_kv_cache_gb=0.5) == []  # off: warned when the flags were parsed
    assert lines(tis_cap=2.0, mixed_precision="bf16") == []
