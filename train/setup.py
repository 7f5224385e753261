"""Everything before the first step: `setup` builds the `Run` (policy, optimizer and schedule, rollout engine, task
and held-out set, features, KL-from-init probe) from the configuration. The step and the features get what they
need from the `Run`; none of them reads the configuration."""

from __future__ import annotations

import dataclasses
import math
import random
from dataclasses import dataclass, field
from pathlib import Path

import torch

from sgrpo_kernels.rl import LossConfig

from .config import TrainConfig
from .distributed import ALONE, Dist
from .engines import RolloutEngine, check_vllm_first, make_engine
from .errors import Refused
from .features import Features, build_features
from .features.user_reward import checked_rewards
from .model import add_lora, load_model_and_tokenizer, param_bytes, resolve_device, resolve_dtype, set_trainable
from .policy import data_parallel
from .probe import kl_probe
from .rollout import Sampling, chat_prompts
from .run.files import output_path
from .run.machine import bf16_support
from .run.metrics import write_json
from .tasks import TASK_OPTIONS, make_task
from .tasks.base import check_problems
from .tasks.jsonl import check_prompts_fit


def lr_lambda(warmup_steps: int, max_steps: int, min_lr_ratio: float):
    """Linear warm-up over `warmup_steps`, then cosine decay to `min_lr_ratio` at `max_steps`."""

    def f(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / (warmup_steps + 1)
        progress = (step - warmup_steps) / max(1, max_steps - warmup_steps)
        return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    return f


@dataclass
class Run:
    """What `setup` builds and the loop, the step and the features use: fixed for the run (the model's weights and
    the optimizer's state move, the objects do not)."""

    loss_cfg: LossConfig
    sampling: Sampling  # the rollouts' sampling (the loss uses its temperature)
    prompts_per_step: int
    max_grad_norm: float
    backend: str | None  # sgrpo_kernels backend; None = auto
    out_dir: Path
    device: torch.device
    model: torch.nn.Module
    tok: object
    ref_model: torch.nn.Module | None  # the frozen reference of the KL presets (grpo) without LoRA; None otherwise
    params: list[torch.nn.Parameter]  # the trained ones
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    engine: RolloutEngine  # HF generate or vLLM (train/engines/); `engine.name` is the records' rollout_engine
    task: object
    task_rng: random.Random  # draws each step's problems; saved in checkpoints
    heldout: list
    policy: torch.nn.Module  # the training forward to hidden states (DDP-wrapped under torchrun)
    dist: Dist = ALONE  # this process's place in a torchrun job
    probe: dict | None = None  # the KL-from-init probe ({"batch", "logp0"}); None when kl_every is 0
    features: Features = field(default_factory=lambda: Features([]))
    tis_cap: float = 0.0  # truncated importance sampling of a vLLM rollout's loss (0 = off; train/loss.py)
    tis_mode: str = "token_truncate"  # its level and kind (sgrpo_kernels.rl.SAMPLER_IS_MODES)
    tis_min: float = 0.0  # its lower bound (0 = none)
    reward_functions: object = None  # --reward's functions, checked on a held-out problem (features/user_reward.py)

    @property
    def system_prompt(self) -> str | None:
        return self.sampling.system_prompt

    @property
    def ckpt_dir(self) -> Path:
        return self.out_dir / "checkpoint"


# the Run fields that are TrainConfig's settings as they are (setup copies them by name)
RUN_SETTINGS = ("prompts_per_step", "max_grad_norm", "backend", "tis_cap", "tis_mode", "tis_min")


def load_policy(cfg: TrainConfig, loss_cfg: LossConfig, device, dtype, model_and_tokenizer):
    """The policy (LoRA-wrapped with --lora) and its tokenizer, and the frozen reference of the KL presets."""
    if model_and_tokenizer is None:
        model, tok = load_model_and_tokenizer(cfg.model, device, dtype, cfg.seed)
    else:
        model, tok = model_and_tokenizer
    ref_model = None
    if loss_cfg.needs_ref and cfg.lora:
        print("reference model: the policy with its LoRA adapters disabled (no second model)")
    elif loss_cfg.needs_ref:  # only the KL presets (grpo) pay for a frozen reference
        ref_model, _ = load_model_and_tokenizer(cfg.model, device, dtype, cfg.seed)
        ref_model.requires_grad_(False).eval()
        print(f"reference model: {param_bytes(ref_model) / 2**20:.1f} MiB of weights")
    if cfg.lora:
        model = add_lora(model, cfg.lora_r, cfg.lora_alpha)
    return model, tok, ref_model


def check_mixed_precision(cfg: TrainConfig, device, dtype) -> None:
    """--mixed-precision bf16: refused where autocast is not built (other than CPU and CUDA); else one line on what it
    does here (nothing, for bf16 weights)."""
    if cfg.mixed_precision == "off":
        return
    if device.type not in ("cpu", "cuda"):
        raise Refused(f"--mixed-precision {cfg.mixed_precision}: built and tested on CPU and CUDA, not {device}")
    if dtype != torch.bfloat16:
        print(f"mixed precision: the decoder's forwards under bf16 autocast ({bf16_support(device)[1]})")
    elif cfg.dtype == "auto":  # (a typed --dtype bf16 was warned about with the other inert settings)
        print(f"warning: --mixed-precision bf16 does nothing with --dtype auto on {device}: the weights are bf16")


def prepare_task(cfg: TrainConfig) -> tuple:
    """(the task, its held-out set, the checked --reward functions or None): everything that reads the user's data,
    task and reward code, checked before the model loads (a bad data file, a custom task's malformed problems, a
    reward that fails its pre-flight are refused in seconds, not after minutes of loading). Tasks draw from their own
    seeded generators, not torch's, so building them first changes no random stream."""
    task = make_task(cfg.task, **{k: getattr(cfg, k) for k in TASK_OPTIONS})
    heldout = task.heldout(cfg.eval_problems, cfg.seed)
    check_problems(f"--task {cfg.task}", heldout)  # a custom task's mistake: refused before claim deletes a run
    return task, heldout, checked_rewards(cfg, task, heldout)


def setup(cfg: TrainConfig, loss_cfg: LossConfig, model_and_tokenizer=None, ctx: Dist = ALONE, claim=None) -> Run:
    """Everything before the first step, in the order that fixes the random stream: the policy (and the reference
    model of the KL presets), optimizer and schedule, the rollout engine, the task and its held-out set, the features;
    then the run's files (config.json) and the KL-from-init probe. In a torchrun job (`ctx`) every rank builds the same
    model and probe; rank 0 writes the files (the others learn whether its claim and config.json could be done:
    `Dist.on_main`); each rank then gets its own sampling seed. `claim(heldout)` (rank 0 of
    `train()`: rundir.OutputDir.claim) runs once every check here that can refuse the run has passed, before the first
    file is written: only then does --overwrite delete the previous run."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    out_dir = output_path(cfg.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)

    task, heldout, rewards = prepare_task(cfg)  # a data file's, a custom task's or a reward's mistake: before the model
    device = resolve_device(cfg.device)
    if ctx.enabled and device.type == "cuda":
        device = torch.device("cuda", ctx.local_rank)
    dtype = resolve_dtype(cfg.dtype, device)
    check_mixed_precision(cfg, device, dtype)
    check_vllm_first(cfg, device, ctx)  # --use-vllm on: a vLLM that cannot run here, refused before the model loads
    torch.manual_seed(cfg.seed)
    model, tok, ref_model = load_policy(cfg, loss_cfg, device, dtype, model_and_tokenizer)
    params = set_trainable(model, cfg.train_layers, cfg.train_lm_head)
    print(
        f"policy: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M params, "
        f"{sum(p.numel() for p in params) / 1e6:.1f}M trained, {dtype}, {device}; loss preset {loss_cfg.name}"
    )
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.99))
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lr_lambda(cfg.warmup_steps, cfg.max_steps, cfg.min_lr_ratio)
    )
    engine = make_engine(cfg, model, tok, device, ctx)
    if engine.name == "hf" and cfg.min_p and cfg.top_p < 1:
        raise Refused(
            f"--min-p {cfg.min_p} with --top-p {cfg.top_p} under HF generate: HF applies min_p after top_p, vLLM "
            "and the loss's log-probs before it, so the two would mean different supports; use one of them, or vLLM"
        )
    system_prompt = cfg.system_prompt if cfg.system_prompt is not None else task.system_prompt
    render = lambda p: chat_prompts(tok, [p], system_prompt)[0]  # noqa: E731 -- the text the rollout feeds the model
    check_prompts_fit(task, tok, model, cfg.max_new_tokens, render, getattr(engine, "context", None))  # a JSONL
    # task's prompts fit the model's context and the engine's
    sampling = Sampling.of(cfg, system_prompt, format_weight=cfg.format_reward_weight)
    run = Run(
        loss_cfg=loss_cfg,
        sampling=sampling,
        out_dir=out_dir,
        device=device,
        model=model,
        tok=tok,
        ref_model=ref_model,
        params=params,
        optimizer=optimizer,
        scheduler=scheduler,
        engine=engine,
        task=task,
        task_rng=random.Random(cfg.seed),
        heldout=heldout,
        policy=data_parallel(model, cfg.group_size, ctx),
        dist=ctx,
        reward_functions=rewards,
        **{k: getattr(cfg, k) for k in RUN_SETTINGS},
    )
    if engine.name == "vllm" and cfg.vllm_max_model_len:  # the held-out prompts fit its context (refused now, not
        engine.check_prompts([render(p) for p in run.heldout], cfg.max_new_tokens)  # at the first evaluation)
    run.features = build_features(cfg, run)  # (the reward pre-flight: the last check that can refuse the run)

    def begin() -> None:  # rank 0: the folder becomes this run's (claim may still refuse a resume), config.json
        if claim is not None:
            claim(run.heldout)
        config = {"train": dataclasses.asdict(cfg), "loss": dataclasses.asdict(loss_cfg), "world_size": ctx.world}
        write_json(out_dir / "config.json", config, indent=2)

    ctx.on_main(begin)  # (every rank learns whether it could: a refusal stops them all)
    run.probe = kl_probe(cfg, model, tok, task, system_prompt, out_dir / "probe.pt", device, ctx.is_main)
    if ctx.enabled:  # rollouts differ across ranks (a run of one process keeps the stream it always had)
        torch.manual_seed(cfg.seed + 1_000_003 * ctx.rank)
    return run
