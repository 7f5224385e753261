"""Trainer CLI and config: every value is checked against the range declared beside its field (at parse time, naming
the flag; and when a TrainConfig is built in code); `--help` shows one spelling per flag with its default, accepted
values and description, and imports neither torch nor transformers."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from train.config import (
    BACKENDS,
    DTYPES,
    FIELD_PRESET_NAMES,
    PRESET_NAMES,
    RUN_PRESETS,
    ConfigError,
    Range,
    TrainConfig,
    field_docs,
)
from train.config.cli import loss_fields, parse_args
from train.config.fields import field_specs

ROOT = Path(__file__).resolve().parent.parent


def refused(argv: list[str], capsys) -> str:
    """parse_args must exit with argparse's status 2; returns its error message."""
    with pytest.raises(SystemExit) as exc:
        parse_args(argv)
    assert exc.value.code == 2
    return capsys.readouterr().err


# Values that inverted or poisoned training (gradient ascent, NaN weights), ran silently with a meaningless setting, or
# died deep inside a library. Each is refused at parse time with the flag, the value and the accepted range.
BAD_VALUES = [
    ("--max-grad-norm", "-1", "> 0"),
    ("--max-grad-norm", "nan", "> 0"),
    ("--max-grad-norm", "0", "> 0"),
    ("--lr", "inf", "0 < x <= 1"),
    ("--lr", "-0.00001", "0 < x <= 1"),
    ("--min-lr-ratio", "nan", "0 <= x <= 1"),
    ("--min-lr-ratio", "2", "0 <= x <= 1"),
    ("--max-steps", "-1", ">= 0"),
    ("--ppo-epochs", "0", ">= 1"),
    ("--time-budget-s", "-1", ">= 0"),
    ("--time-budget-s", "inf", ">= 0"),
    ("--top-p", "0", "0 < x <= 1"),
    ("--top-p", "1.5", "0 < x <= 1"),
    ("--temperature", "0", ">= 0.01"),
    ("--temperature", "1e-300", ">= 0.01"),  # was a RuntimeError in sampling (1e-300 is 0 in float32)
    ("--temperature", "0.005", ">= 0.01"),  # vLLM samples at 0.01: the loss would score another distribution
    ("--collapse-window", "0", ">= 1"),
    ("--collapse-entropy", "-0.1", ">= 0"),
    ("--format-reward-weight", "nan", ">= 0"),
    ("--weight-decay", "-1", ">= 0"),
    ("--heldout-frac", "1", "0 < x < 1"),
    ("--use-vllm", "junk", "auto, on, off"),
    ("--group-size", "0", ">= 2"),
    ("--group-size", "1", ">= 2"),
    ("--prompts-per-step", "0", ">= 1"),
    ("--max-new-tokens", "0", ">= 1"),
    ("--probe-size", "0", ">= 1"),
    ("--eval-problems", "0", ">= 1"),
    ("--eval-k-problems", "0", ">= 1"),
    ("--eval-k", "-1", ">= 0"),
    ("--eval-batch-size", "0", ">= 1"),
    ("--kl-every", "-1", ">= 0"),
    ("--save-every", "-5", ">= 0"),
    ("--train-layers", "-2", ">= -1"),
    ("--lora-r", "0", ">= 1"),
    ("--seed", "-1", "0 <= x"),
    ("--threads", "-1", ">= 0"),
    ("--warmup-steps", "-1", ">= 0"),
    ("--dtype", "junk", "float32"),
    ("--device", "gpu", "cuda"),
    ("--backend", "cuda", "torch, triton, npu"),
    ("--preset", "nope", "s_grpo"),
    ("--task", "nope", "arithmetic"),
    ("--difficulty", "abc", "levels in 1..8"),
    ("--difficulty", "9", "levels in 1..8"),
    ("--prompt-template", "{q} =", "unknown field"),
    ("--prompt-template", "{question} {answer}", "unknown field"),
    ("--prompt-template", "no field", "no {question}"),
    ("--max-steps", "3.5", "integer"),
    ("--lora", "maybe", "on/off"),
    ("--output-dir", "", "non-empty"),
]


@pytest.mark.parametrize("flag, value, accepted", BAD_VALUES, ids=[f"{f}={v}" for f, v, _ in BAD_VALUES])
def test_bad_value_refused_at_parse_time(flag, value, accepted, capsys):
    err = refused([flag, value], capsys)
    assert f"argument {flag}: {value!r} refused" in err, err
    assert accepted in err, err


def test_old_spelling_is_refused_too(capsys):
    err = refused(["--max_grad_norm", "-1"], capsys)  # the underscore spelling works, and is checked the same
    assert "argument --max-grad-norm: '-1' refused: expected number > 0" in err


@pytest.mark.parametrize(
    "argv, flag, message",
    [
        (["--data-path", "{data}"], "--data-path", "task='arithmetic' would ignore it"),
        (["--task", "gsm8k", "--data-path", "/no/such/file.jsonl"], "--data-path", "no such file"),
        (["--train-layers", "0"], "--train-layers", "nothing would be trained"),
        (["--loss", "nope=1"], "--loss", "unknown LossConfig field(s) ['nope']"),
        (["--loss", "junk"], "--loss", "'junk' is not field=value"),
        # each kept the last value silently
        (["--loss", "beta=0,beta=0.1"], "--loss", "'beta' is given twice in 'beta=0,beta=0.1'"),
        (["--loss", "beta=0", "--loss=clip_eps=0.1"], "--loss", "given more than once; give one, its fields"),
        (["--loss", "epsilon_low=2"], "--loss", "LossConfig.epsilon_low"),
        (["--loss.epsilon_low", "2.0"], "--loss.epsilon_low", "LossConfig.epsilon_low must be < 1.0"),
        (["--loss.beta", "0.1", "--loss.dual_clip", "0.5"], "--loss.dual_clip", "LossConfig.dual_clip must be > 1"),
    ],
)
def test_cross_field_and_loss_errors_name_the_flag(tmp_path, capsys, argv, flag, message):
    data = tmp_path / "d.jsonl"
    data.write_text('{"question": "1+1", "answer": "2"}\n{"question": "2+2", "answer": "4"}\n')
    err = refused([a.replace("{data}", str(data)) for a in argv], capsys)
    assert f"argument {flag}: " in err and message in err, err


@pytest.mark.parametrize(
    "changes",
    [
        {"max_grad_norm": -1.0},
        {"max_grad_norm": float("nan")},
        {"lr": float("inf")},
        {"min_lr_ratio": float("nan")},
        {"max_steps": -1},
        {"ppo_epochs": 0},
        {"group_size": 0},
        {"use_vllm": "junk"},
        {"dtype": "junk"},
        {"difficulty": "abc"},
        {"prompt_template": "{x}"},
        {"data_path": "x.jsonl"},
        {"max_steps": 3.0},  # not an int
        {"max_steps": True},  # a bool is not an int
        {"lora": "yes"},  # not a bool
        {"loss": "nope=1"},
        {"preset": "nope"},
    ],
)
def test_config_built_in_code_is_checked(changes):
    name = next(iter(changes))
    with pytest.raises(ConfigError) as exc:
        TrainConfig(**changes)
    assert exc.value.field == name and f"{name}=" in str(exc.value)
    with pytest.raises(ConfigError):
        dataclasses.replace(TrainConfig(), **changes)


def test_every_numeric_field_declares_its_range():
    """A new numeric field must say what it accepts (a field without a declaration is still checked by type)."""
    for name, spec in field_specs(TrainConfig).items():
        if spec.kind in (int, float):
            assert any(isinstance(c, Range) for c in spec.checks), f"{name}: declare Annotated[..., Range(...)]"


def test_field_without_declaration_is_checked_by_type():
    @dataclass
    class Extended(TrainConfig):
        knob: int = 3  # a field added without a declared range
        ratio: float = 0.5  # another

    assert Extended(knob=-7, ratio=-2.0).knob == -7  # accepted as typed
    for bad in ({"knob": "x"}, {"knob": 1.5}, {"ratio": float("nan")}, {"ratio": "0.5"}):
        with pytest.raises(ConfigError, match=next(iter(bad))):
            Extended(**bad)
    with pytest.raises(ConfigError, match="max_grad_norm"):  # the declared checks still apply
        Extended(max_grad_norm=-1.0)


def test_good_values_parse():
    cfg, over = parse_args(
        [
            "--max-steps=0",
            "--max_grad_norm", "0.5",
            "--top-p", "1",
            "--lr", "1e-3",
            "--group-size", "2",
            "--backend", "torch",
            "--device", "cuda:1",
            "--prompt-template", "Q: {question} {{literal}}",
            "--loss.epsilon-low", "0.3",  # the other spelling of a loss flag
        ]
    )  # fmt: skip
    assert (cfg.max_steps, cfg.max_grad_norm, cfg.top_p, cfg.lr, cfg.group_size) == (0, 0.5, 1.0, 1e-3, 2)
    assert cfg.backend == "torch" and cfg.device == "cuda:1" and over == {"epsilon_low": 0.3}


def test_run_presets_and_static_lists_match_the_package():
    import sgrpo_kernels
    from sgrpo_kernels.rl import FIELD_PRESETS, PRESETS, LossConfig
    from train.model import resolve_dtype

    assert set(PRESET_NAMES) == set(PRESETS)
    assert set(FIELD_PRESET_NAMES) == set(FIELD_PRESETS)
    assert set(BACKENDS) == set(sgrpo_kernels.available_backends())
    import torch

    for name in DTYPES:
        resolve_dtype(name, torch.device("cpu"))
    for name, values in RUN_PRESETS.items():
        TrainConfig(**values)  # every preset value is in range
        assert parse_args(["--run-preset", name])[0] == TrainConfig(**values)
    assert [n for n, _, _ in loss_fields()] == [f.name for f in dataclasses.fields(LossConfig) if f.name != "name"]


# ----------------------------------------------------------------------------------------------------- --help


@pytest.fixture(scope="module")
def help_text() -> str:
    res = subprocess.run([sys.executable, "-m", "train", "--help"], capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == 0, res.stderr
    return res.stdout


def _squash(text: str) -> str:
    return " ".join(text.split())


def test_help_one_spelling_default_accepted_and_description(help_text):
    flat = _squash(help_text)
    options = help_text.split("\noptions:\n", 1)[1]
    docs = field_docs()
    for f in dataclasses.fields(TrainConfig):
        dashed, under = "--" + f.name.replace("_", "-"), "--" + f.name
        assert options.count(f"  {dashed} ") + options.count(f"  {dashed}\n") == 1, dashed
        if under != dashed:
            assert under not in options, under  # one spelling shown (the other still parses)
        assert docs[f.name], f"{f.name}: no # comment to describe it"
        assert "".join(docs[f.name].split()) in "".join(flat.split()), f.name  # (argparse wraps at hyphens)
    assert "[default: 30 (--run-preset smoke: 2, gpu: 200); accepts integer >= 0]" in flat
    assert "[default: 1.0; accepts number > 0]" in flat  # --max-grad-norm
    assert "accepts one of auto, on, off" in flat
    for name, _, _ in loss_fields():
        assert f"--loss.{name} V" in help_text
    assert "KL coefficient (k3 against ref_logp)" in flat  # --loss.beta, from the LossConfig docstring


def test_help_imports_neither_torch_nor_transformers():
    code = (
        "import runpy, sys\n"
        "sys.argv = ['python -m train', '--help']\n"
        "try:\n    runpy.run_module('train', run_name='__main__', alter_sys=True)\n"
        "except SystemExit as e:\n    assert e.code == 0\n"
        "heavy = sorted(m for m in ('torch', 'transformers', 'sgrpo_kernels') if m in sys.modules)\n"
        "sys.stderr.write('HEAVY=' + ','.join(heavy))\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == 0, res.stderr
    assert "HEAVY=\n" in res.stderr + "\n", res.stderr[-500:]


def test_parse_errors_import_no_model_stack():
    """A refused flag is reported before torch is even imported (fast feedback)."""
    code = (
        "import sys\nfrom train.config.cli import parse_args\n"
        "try:\n    parse_args(['--max-grad-norm', '-1'])\nexcept SystemExit:\n    pass\n"
        "print(json.dumps(['torch' in sys.modules]))\n"
    ).replace("import sys", "import json, sys")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert json.loads(res.stdout.strip().splitlines()[-1]) == [False], res.stderr


# ----------------------------------------------------------------------------------------------------- study.plot


def _write_run(path: Path, n_steps: int, kl_every: int) -> Path:
    path.mkdir(parents=True)
    rows = [{"step": 0, "event": "eval", "eval_acc": 0.2, "eval_acc_se": 0.03}]
    for s in range(1, n_steps + 1):
        due = s % kl_every == 0 or s == n_steps
        rows.append(
            {
                "step": s,
                "reward_mean": s / n_steps,
                "entropy_mean": 1.0 / s,
                "grad_norm": float("nan") if s == 2 else 1.0,  # a skipped update
                "kl_from_init": 0.01 * s if due else None,  # logged only when measured
            }
        )
    rows.append({"step": n_steps, "event": "eval", "eval_acc": 0.5, "eval_acc_se": 0.035})
    (path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    (path / "config.json").write_text(
        json.dumps({"train": {"preset": "s_grpo", "model": "tiny", "task": "arithmetic"}})
    )
    return path


def test_plot_draws_only_measured_points_and_full_windows():
    from study.plot import measured, moving_average

    recs = [{"step": 1, "k": None}, {"step": 2, "k": 1.0}, {"step": 3, "k": float("nan")}, {"step": 4, "k": 3.0}]
    assert measured(recs, "k") == ([2, 4], [1.0, 3.0])
    with pytest.raises(KeyError):
        measured([{"step": 1}], "k")  # a renamed metric fails loudly
    xs, ys = list(range(1, 8)), [float(v) for v in range(1, 8)]
    assert moving_average(xs, ys, 5) == ([5, 6, 7], [3.0, 4.0, 5.0])  # 7 points, window 5: from the 5th point on
    assert moving_average(xs[:4], ys[:4], 5) == ([], [])  # fewer points than the window: no average at all
    assert moving_average(xs, ys, 1) == ([], [])


def test_plot_with_unmeasured_kl(tmp_path):
    """kl_from_init is null on steps without a probe: the plot skips them (it died on float(None))."""
    from study.plot import _title, main

    runs = [_write_run(tmp_path / "a", 7, 5), _write_run(tmp_path / "b", 3, 5)]
    out = tmp_path / "p.png"
    assert main([str(r) for r in runs] + ["-o", str(out), "--labels", "A", "B"]) == 0
    assert out.stat().st_size > 10_000
    assert _title([str(r) for r in runs]) == "s_grpo on tiny, arithmetic"
    with pytest.raises(SystemExit):
        main([str(runs[0]), "--labels", "A", "B"])


# ----------------------------------------------------------------------------------------------------- model loading


def test_model_loading_is_a_named_phase_without_carriage_return_noise(monkeypatch, capsys):
    """The GGUF loader's de-quantization bar (tqdm called directly by transformers, one carriage-return update per
    tensor: ~10 KB in a log) is silenced when stderr is not a terminal; loading prints one line when it starts and
    one with its time when it ends."""
    pytest.importorskip("transformers")
    import importlib

    import torch
    import transformers

    import train.model as model_module

    gguf = importlib.import_module(model_module.GGUF_MODULE)
    real_tqdm = gguf.tqdm

    def fake_model(path, **kwargs):  # what the GGUF loader does: a tqdm loop over the tensors, through its module
        for _ in gguf.tqdm(range(272), desc="Converting and de-quantizing GGUF tensors..."):
            pass
        return model_module.tiny_model_and_tokenizer()[0]

    monkeypatch.setattr(model_module, "smollm2_gguf", lambda: ("/nowhere", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda path, **kw: model_module.CharTokenizer())
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", fake_model)
    capsys.readouterr()
    model_module.load_model_and_tokenizer("smollm2-135m", torch.device("cpu"), torch.float32)
    out, err = capsys.readouterr()
    assert "\r" not in err + out and "de-quantizing" not in err, err[:300]
    assert "model: loading smollm2-135m (SmolLM2-135M-Instruct.Q4_1.gguf, de-quantized to float32) on cpu" in out
    assert "model: smollm2-135m loaded in " in out
    assert gguf.tqdm is real_tqdm  # restored after loading

    model_module.load_model_and_tokenizer("smollm2-135m", torch.device("cpu"), torch.float32, progress=True)
    err = capsys.readouterr().err
    assert "de-quantizing" in err and err.count("100%") <= 1  # one bar (a terminal would see it redraw in place)


def test_model_given_as_a_gguf_file_loads_it_with_gguf_file(monkeypatch, tmp_path, capsys):
    """--model PATH.gguf: the folder and file name go to transformers as (path, gguf_file=...), offline; a path that
    is no file is refused naming it."""
    pytest.importorskip("transformers")
    import torch
    import transformers

    import train.model as model_module

    f = tmp_path / "base-270m.Q4_K_M.gguf"
    f.write_bytes(b"GGUF")
    seen = []

    def fake_model(path, **kwargs):
        seen.append((path, kwargs.get("gguf_file")))
        return model_module.tiny_model_and_tokenizer()[0]

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda path, **kw: model_module.CharTokenizer())
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", fake_model)
    model_module.load_model_and_tokenizer(str(f), torch.device("cpu"), torch.float32)
    assert seen == [(str(tmp_path.resolve()), "base-270m.Q4_K_M.gguf")]
    assert "(base-270m.Q4_K_M.gguf, de-quantized to float32)" in capsys.readouterr().out
    with pytest.raises(FileNotFoundError, match="no-such.gguf.*no such GGUF file"):
        model_module.load_model_and_tokenizer(str(tmp_path / "no-such.gguf"), torch.device("cpu"), torch.float32)


def test_prompts_without_a_chat_template_are_plain_text():
    """A tokenizer with a chat template renders system + user messages through it (unchanged); one without (a base
    model's GGUF) gets PLAIN_PROMPT: system prompt, blank line, 'Question: ...' and 'Answer:'."""
    from train.rollout import PLAIN_PROMPT, chat_prompts
    from train.tasks.base import Problem

    class Templated:
        chat_template = "{{ messages }}"

        def apply_chat_template(self, messages, add_generation_prompt=True, tokenize=False):
            return "|".join(f"{m['role']}:{m['content']}" for m in messages) + "|assistant:"

    class Base:
        chat_template = None

        def apply_chat_template(self, *a, **kw):  # what transformers does without a template
            raise ValueError("Cannot use chat template functions because tokenizer.chat_template is not set")

    probs = [Problem("12 + 5", "17"), Problem("3 * 4", "12")]
    assert chat_prompts(Templated(), probs, "Be brief.") == ["system:Be brief.|user:12 + 5|assistant:",
                                                           "system:Be brief.|user:3 * 4|assistant:"]
    assert chat_prompts(Base(), probs, "Be brief.") == ["Be brief.\n\nQuestion: 12 + 5\nAnswer:",
                                                      "Be brief.\n\nQuestion: 3 * 4\nAnswer:"]
    assert chat_prompts(Base(), probs[:1], None) == ["Question: 12 + 5\nAnswer:"]
    assert PLAIN_PROMPT.format(system="", question="q") == "Question: q\nAnswer:"


# ----------------------------------------------------------------------------------------------------- rollouts


@pytest.mark.parametrize("greedy", [True, False])
def test_shared_prompt_generation_gives_the_same_completions(greedy):
    """hf_generate runs each prompt once and repeats its KV cache for the n completions (half the rollout compute at
    G = 8): the completions equal those of generate on n copies of each prompt (left padding: prompts of different
    lengths), greedy and sampled with the same seed."""
    pytest.importorskip("transformers")
    import torch

    from train.model import tiny_model_and_tokenizer
    from train.rollout import hf_generate

    model, tok = tiny_model_and_tokenizer(seed=3)
    prompts = ["1 + 2 =", "12 * 3 + 45 =", "7 ="]
    outs = []
    for share in (True, False):
        torch.manual_seed(0)
        outs.append(hf_generate(model, tok, prompts, 4, 8, 1.0, 1.0, greedy=greedy, share_prompts=share))
    for shared, plain in zip(*outs):
        assert torch.equal(shared, plain)
    assert outs[0][2].shape[0] == 12


def test_default_job_is_a_fixed_number_of_steps():
    """`python -m train` trains a fixed 30 steps whatever the machine's load: no time budget by default (the default
    run preset stopped training after 480 s, 7 of 30 steps on a loaded 2-core machine)."""
    cfg, _ = parse_args([])
    assert cfg.max_steps == 30 and cfg.time_budget_s == 0.0
    assert cfg == TrainConfig()  # the default job is the dataclass defaults
    assert parse_args(["--time-budget-s", "600"])[0].time_budget_s == 600.0  # a budget only when asked for


def test_explicit_flag_equal_to_the_default_beats_the_run_preset():
    """`--max-steps 30` (the dataclass default) beats the smoke preset's 2: a typed flag counts even when it equals
    the default."""
    default_steps = TrainConfig.__dataclass_fields__["max_steps"].default
    assert parse_args(["--run-preset", "smoke"])[0].max_steps != default_steps
    assert parse_args(["--run-preset", "smoke", "--max-steps", str(default_steps)])[0].max_steps == default_steps
    assert parse_args(["--run-preset", "smoke", "--max_steps", str(default_steps)])[0].max_steps == default_steps


def test_help_and_errors_name_the_command_a_user_types(capsys):
    # the parser moved into train/config/ and named itself after that package: `python -m train.config`, a command
    # that does not exist, in --help's usage line and in every refusal; and its precedence left out --config
    from train.config.cli import build_parser

    parser = build_parser()
    assert parser.prog == "python -m train"
    assert parser.format_usage().startswith("usage: python -m train [--config FILE]")
    assert "a flag you type > --config FILE > --run-preset > the dataclass default" in " ".join(
        parser.format_help().split()
    )
    with pytest.raises(SystemExit):
        parse_args(["--max-steps", "-3"])
    err = capsys.readouterr().err
    assert "python -m train: error: argument --max-steps" in err and "train.config" not in err


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        # each was a traceback after the model had loaded (exit 1), not a refusal when the flags are parsed
        (["--task", "jsonl"], ["--data-path", "task='jsonl'", "--data FILE.jsonl"]),
        (["--prompt-template", "{question:d}"], ["--prompt-template", "Unknown format code 'd'"]),
        (["--model", "nope.gguf"], ["--model", "'nope.gguf' refused: no such file or folder"]),
        (["--model", "./no/such/folder"], ["--model", "no such file or folder"]),
    ],
)
def test_a_task_that_cannot_run_is_refused_when_parsed(capsys, argv, words):
    with pytest.raises(SystemExit) as exc:
        parse_args(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert all(w in err for w in words), err


def test_gsm8k_without_data_or_hub_is_a_refusal_not_a_traceback(monkeypatch):
    from train.errors import Refused
    from train.tasks import jsonl, make_task

    def offline(name):
        raise ConnectionError("Couldn't reach 'openai/gsm8k' on the Hub (LocalEntryNotFoundError)\nand more")

    monkeypatch.setattr(jsonl, "_datasets_to_jsonl", offline)
    with pytest.raises(Refused, match=r"task='gsm8k' needs --data-path FILE.jsonl .* Couldn't reach 'openai/gsm8k'"):
        make_task("gsm8k")


@pytest.mark.parametrize("device", ["cuda", "cuda:7", "xpu", "npu:0"])
def test_a_device_this_machine_lacks_is_refused_before_anything_is_written(tmp_path, device):
    # was an AssertionError traceback ("Torch not compiled with CUDA enabled") after config.json had been written
    import torch

    from train.config import TrainConfig
    from train.errors import Refused
    from train.loop import train

    kind = device.split(":")[0]
    module = getattr(torch, kind, None)
    if module is not None and module.is_available() and module.device_count() > int((device + ":0").split(":")[1]):
        pytest.skip(f"this machine has {device}")
    out = tmp_path / "run"
    with pytest.raises(Refused, match=rf"--device {device}: this machine has .*use --device cpu or auto"):
        train(TrainConfig(model="tiny", device=device, max_steps=1, output_dir=str(out), progress=False))
    assert not out.exists()


@pytest.mark.parametrize("value", ["yes", "true", 1])
def test_a_bool_field_given_text_in_python_says_what_python_takes(value):
    """TrainConfig(lora='yes') was refused with 'expected true/false, 1/0, yes/no or on/off', the very form refused."""
    from train.config import TrainConfig
    from train.config.fields import ConfigError

    with pytest.raises(ConfigError, match=r"lora=.*expected True or False \(a bool; the command line"):
        TrainConfig(model="tiny", lora=value)


def test_config_file_messages_name_the_file_not_a_flag(tmp_path, capsys):
    """A config file's bad reward said 'argument --reward:' (no such flag was typed); an empty file was taken without
    a word; --resume alone reads the run's config.json but its refusals said '--config PATH'."""
    from train.config.cli import parse_args

    bad = tmp_path / "bad.yaml"
    bad.write_text("reward: nomod:fn\n")
    with pytest.raises(SystemExit):
        parse_args(["--model", "tiny", "--config", str(bad)])
    assert f"argument reward (--config {bad}): reward 'nomod:fn'" in capsys.readouterr().err

    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing yet\n")
    parse_args(["--model", "tiny", "--config", str(empty)], warn=True)
    assert f"warning: --config {empty} sets nothing" in capsys.readouterr().err

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text('{"train": {"task": "vowels"}}')
    with pytest.raises(SystemExit):
        parse_args(["--output-dir", str(run), "--resume"])
    err = capsys.readouterr().err
    assert f"--resume: the run's {run / 'config.json'}" in err and "--config" not in err.split("error:", 1)[1]
