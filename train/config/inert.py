"""Settings that do nothing in the combination given: `--probe-size 64` with `--kl-every 0` is accepted (a script that
passes it keeps running) but measures nothing, so `python -m train` says so, one line a field on stderr at start:

    warning: --probe-size 64 does nothing with --kl-every 0 (the KL probe is off)

`INERT` is the one table of such combinations. A field warns only when the user gave it (typed it, or wrote it in a
hand-written --config file) with a value other than the one the run would have without it (the dataclass default
under the run preset); the cli decides what was given (`cli.parse_args`). Nothing is refused and no value changes.
Torch-free: `--help` stays fast."""

from __future__ import annotations

import dataclasses
import inspect
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from ..tasks import get_task_spec


def task_reads(task: str, option: str) -> bool:
    """Whether task `task` reads the task option `option` (`difficulty`, ...): its factory names it. `make_task`
    passes a factory every option, and one that needs only some takes the others as `**_` (train/tasks/registry.py);
    a factory with `**kwargs` under another name may read any, so it counts as reading it."""
    try:
        params = inspect.signature(get_task_spec(task).factory).parameters.values()
    except (ValueError, TypeError):  # an unknown task is refused elsewhere; a factory without a signature: say nothing
        return True
    return any(p.name == option or (p.kind is p.VAR_KEYWORD and p.name != "_") for p in params)


@dataclass(frozen=True)
class Inert:
    """`fields` do nothing while `inert(value of controller)` holds (and `also(config)`); `why` says what is off, for
    the warning."""

    fields: tuple[str, ...]
    controller: str
    inert: Callable[[object], bool]
    why: str
    also: Callable[[object], bool] = lambda cfg: True


def _vllm_off(use_vllm: str) -> bool:
    return use_vllm == "off"  # (auto may fall back to HF generate too, known when the run starts: fallback_warnings)


# The combinations, declared once. (Others are refused outright by TrainConfig, as they were before this table:
# dynamic_sampling_max_tries without dynamic_sampling, grad_penalty_gamma / _radius without grad_penalty, tis_mode /
# tis_min with tis_cap 0, data_path with a task that reads none.)
INERT: tuple[Inert, ...] = (
    Inert(("probe_size",), "kl_every", lambda v: v == 0, "the KL probe is off"),
    Inert(("eval_k_problems",), "eval_k", lambda v: v == 0, "pass@k / maj@k are off"),
    Inert(("lora_r", "lora_alpha"), "lora", lambda v: not v, "full fine-tuning: no LoRA adapters"),
    Inert(
        ("train_layers", "train_lm_head"),
        "lora",
        bool,
        "the LoRA adapters are what is trained; the base model stays frozen",
    ),
    Inert(
        ("vllm_dtype", "vllm_kv_cache_gb", "vllm_max_model_len"),
        "use_vllm",
        _vllm_off,
        "rollouts come from HF generate: no vLLM engine",
    ),
    Inert(
        ("tis_cap", "tis_mode", "tis_min"),
        "use_vllm",
        _vllm_off,
        "HF generate samples from the trainer's own forward: no sampler/trainer mismatch to correct",
        also=lambda cfg: cfg.mixed_precision == "off",  # (bf16 autocast: generate's decode differs from the loss's)
    ),
    Inert(("mixed_precision",), "dtype", lambda d: d in ("bfloat16", "bf16"), "the weights compute in bf16 already"),
    Inert(("difficulty",), "task", lambda t: not task_reads(t, "difficulty"), "this task has no difficulty levels"),
)


# a field's own "off" value: setting it so where the field does nothing anyway says nothing
OFF_VALUES: dict[str, object] = {"tis_cap": 0, "vllm_max_model_len": 0, "mixed_precision": "off"}


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _show(value) -> str:
    """A value as the flag takes it: true/false, none, a number, or shell-quoted text."""
    if isinstance(value, bool):
        return str(value).lower()
    if value is None:
        return "none"
    if isinstance(value, float):
        return f"{value:g}"  # 0, not 0.0: as typed
    return shlex.quote(value) if isinstance(value, str) else str(value)


def _condition(name: str, value) -> str:
    if isinstance(value, bool):
        return f"{'with' if value else 'without'} {_flag(name)}"
    return f"with {_flag(name)} {_show(value)}"


def _set_to_act(name: str, value, base: Mapping[str, object]) -> bool:
    """Whether `value` of field `name` asks for something: not the value the run has without it, nor the field's own
    "off" value."""
    return value != base.get(name) and not (name in OFF_VALUES and value == OFF_VALUES[name])


def inert_warnings(cfg, given: Mapping[str, str], base: Mapping[str, object]) -> list[str]:
    """One warning line for each field in `given` (field -> where it was given: "" for a typed flag, else e.g.
    "--config run.yaml") whose value in `cfg` differs from `base[field]` (the value without the user's setting) and
    which a row of INERT makes do nothing; at most one line a field (the first row that holds)."""
    out, warned = [], set()
    for row in INERT:
        control = getattr(cfg, row.controller)
        if not (row.inert(control) and row.also(cfg)):
            continue
        for name in row.fields:
            value = getattr(cfg, name)
            if name in warned or name not in given or not _set_to_act(name, value, base):
                continue
            warned.add(name)
            where = f" ({given[name]})" if given[name] else ""
            out.append(f"warning: {_flag(name)} {_show(value)}{where} does nothing "
                       f"{_condition(row.controller, control)} ({row.why})")  # fmt: skip
    return out


def fallback_warnings(cfg) -> list[str]:
    """The warnings of the rows that `--use-vllm off` makes inert, for a run whose `--use-vllm auto` fell back to HF
    generate, which is known only when the engine starts (it prints why). The cli's record of what was typed does not
    reach the engine: a field warns when it differs from its dataclass default (no run preset sets one)."""
    defaults = {f.name: f.default for f in dataclasses.fields(cfg)}
    out = []
    for row in INERT:
        if row.controller != "use_vllm" or not row.also(cfg):
            continue
        for name in row.fields:
            value = getattr(cfg, name)
            if _set_to_act(name, value, defaults):
                out.append(f"warning: {_flag(name)} {_show(value)} does nothing with --use-vllm auto here: it fell "
                           f"back to HF generate ({row.why})")  # fmt: skip
    return out
