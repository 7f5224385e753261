"""Everything before the first step: `setup` builds the `Run` (policy, optimizer and schedule, rollout engine, task and
held-out set, KL-from-init probe); the policy's forward-only helpers that the probe and the training step share."""

from __future__ import annotations

import dataclasses
import math
import random
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from sgrpo_kernels import linear_logprobs
from sgrpo_kernels.integrations.hf import lm_head
from sgrpo_kernels.rl import LossConfig
from sgrpo_kernels.validation import check_target_values
from train.checkpoint import load_probe, save_probe
from train.config import TrainConfig
from train.distributed import ALONE, Dist
from train.errors import Refused
from train.guard import StepGuard
from train.metrics import write_json
from train.model import (
    add_lora,
    head_weight,
    load_model_and_tokenizer,
    param_bytes,
    policy_hidden_grouped,
    resolve_device,
    resolve_dtype,
    set_trainable,
)
from train.rollout import Batch, VLLMEngine, rollout
from train.tasks import make_task

# ----------------------------------------------------------------------------------------------------- the policy


def completion_targets(batch: Batch) -> Tensor:
    """[N, T] completion tokens, -100 (ignore_index) after each completion's end."""
    return torch.where(batch.completion_mask, batch.completion_ids, -100)


def completion_hidden(model, batch: Batch, group_size: int) -> torch.Tensor:
    """Hidden states [N, T, D] at the positions that predict each completion token; each group's shared prompt is
    run once (rows g*G .. g*G+G-1 have the same prompt)."""
    return policy_hidden_grouped(
        model,
        batch.prompt_ids[::group_size],
        batch.prompt_mask[::group_size],
        batch.completion_ids,
        batch.completion_mask,
        group_size,
    )


class PolicyHidden(torch.nn.Module):
    """The policy's forward as a module, (prompt ids/mask, completion ids/mask) -> hidden states [N, T, D]
    (`completion_hidden`). Under torchrun it is wrapped in DistributedDataParallel, so the gradients of the weights
    it holds, the LM head's included (used by `sgrpo_loss` on these hidden states), are averaged across ranks in the
    backward."""

    def __init__(self, model, group_size: int):
        super().__init__()
        self.model, self.group_size = model, group_size

    def forward(self, prompt_ids, prompt_mask, completion_ids, completion_mask) -> Tensor:
        g = self.group_size
        return policy_hidden_grouped(self.model, prompt_ids[::g], prompt_mask[::g], completion_ids, completion_mask, g)


def data_parallel(model, group_size: int, ctx: Dist) -> torch.nn.Module:
    """`PolicyHidden` of `model`; DDP-wrapped in a job of several processes (it checks that every rank holds the same
    weights, and averages the gradients)."""
    module = PolicyHidden(model, group_size)
    if not ctx.enabled:
        return module
    from torch.nn.parallel import DistributedDataParallel

    device = next(model.parameters()).device
    return DistributedDataParallel(module, device_ids=[device.index] if device.type == "cuda" else None)


@torch.no_grad()
def token_logprobs(
    model, batch: Batch, temperature: float, backend: str | None, group_size: int, check_targets: bool | None = None
) -> torch.Tensor:
    """Forward-only log-probs [N, T] of the completion tokens (no autograd state, no logits). `check_targets`: as in
    `linear_logprobs` (None = env SGRPO_CHECK_TARGETS, default on; one host sync)."""
    hidden = completion_hidden(model, batch, group_size)
    head = lm_head(model)
    logp, _ = linear_logprobs(
        hidden,
        head.weight,
        completion_targets(batch),
        temperature=temperature,
        return_entropy=False,
        backend=backend,
        check_targets=check_targets,
        **head.options(),  # bias, logit scale, softcap of this model's head
    )
    return logp


def reference_logprobs(run: Run, batch: Batch, check_targets: bool | None = None) -> Tensor | None:
    """The reference policy's completion log-probs for the KL presets (None for the others): the frozen reference
    model, or, with LoRA, the policy itself with its adapters disabled (the base model: no second copy resident)."""
    if not run.loss_cfg.needs_ref:
        return None
    cfg = run.cfg
    if run.ref_model is not None:
        return token_logprobs(run.ref_model, batch, cfg.temperature, cfg.backend, cfg.group_size, check_targets)
    with run.model.disable_adapter():
        return token_logprobs(run.model, batch, cfg.temperature, cfg.backend, cfg.group_size, check_targets)


def lr_lambda(cfg: TrainConfig):
    def f(step: int) -> float:
        if step < cfg.warmup_steps:
            return (step + 1) / (cfg.warmup_steps + 1)
        progress = (step - cfg.warmup_steps) / max(1, cfg.max_steps - cfg.warmup_steps)
        return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    return f


# ----------------------------------------------------------------------------------------------------- setup


@dataclass
class Run:
    """What `setup` builds and the steps use: fixed for the run (the model's weights and the optimizer's state move,
    the objects do not)."""

    cfg: TrainConfig
    loss_cfg: LossConfig
    out_dir: Path
    device: torch.device
    model: torch.nn.Module
    tok: object
    ref_model: torch.nn.Module | None  # the frozen reference of the KL presets (grpo) without LoRA; None otherwise
    params: list[torch.nn.Parameter]  # the trained ones
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    engine: VLLMEngine | None
    task: object
    task_rng: random.Random  # draws each step's problems; saved in checkpoints
    heldout: list
    system_prompt: str | None
    probe: dict | None  # the KL-from-init probe ({"batch", "logp0"}); None when kl_every is 0
    guard: StepGuard  # undo of an optimizer step (non-finite weights after it, or an exception inside it)
    policy: torch.nn.Module  # PolicyHidden of `model`: the training forward (DDP-wrapped under torchrun)
    dist: Dist = ALONE  # this process's place in a torchrun job
    # --dynamic-sampling: draws the problems that replace dropped groups (this rank's own stream, saved in checkpoints;
    # `task_rng` stays the shared draw of every step's first prompts); None otherwise
    resample_rng: random.Random | None = None

    @property
    def ckpt_dir(self) -> Path:
        return self.out_dir / "checkpoint"


def setup(cfg: TrainConfig, loss_overrides: dict | None = None, model_and_tokenizer=None, ctx: Dist = ALONE) -> Run:
    """Everything before the first step, in the order that fixes the random stream: the run directory and its
    config.json, the policy (and the reference model of the KL presets), optimizer and schedule, the rollout engine,
    the task and its held-out set, the KL-from-init probe. In a torchrun job (`ctx`) every rank builds the same
    model and probe; rank 0 writes the files; each rank then gets its own sampling seed."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    loss_cfg = cfg.loss_config(loss_overrides)  # preset + cfg.loss + --loss.FIELD
    out_dir = Path(cfg.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if ctx.is_main:
        config = {"train": dataclasses.asdict(cfg), "loss": dataclasses.asdict(loss_cfg), "world_size": ctx.world}
        write_json(out_dir / "config.json", config, indent=2)

    device = resolve_device(cfg.device)
    if ctx.enabled and device.type == "cuda":
        device = torch.device("cuda", ctx.local_rank)
    dtype = resolve_dtype(cfg.dtype, device)
    torch.manual_seed(cfg.seed)
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
    params = set_trainable(model, cfg.train_layers, cfg.train_lm_head)
    if cfg.grad_penalty and any(p.dtype not in (torch.float32, torch.float64) for p in params):
        raise Refused(
            f"--grad-penalty needs float32 weights (these are {params[0].dtype}): its finite-difference step of "
            f"{cfg.grad_penalty_radius} spread over the weights is below bfloat16's resolution; use --dtype float32"
        )
    print(
        f"policy: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M params, "
        f"{sum(p.numel() for p in params) / 1e6:.1f}M trained, {dtype}, {device}; loss preset {loss_cfg.name}"
    )
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.99))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(cfg))
    engine = rollout_engine(cfg, model, device)

    task = make_task(
        cfg.task,
        difficulty=cfg.difficulty,
        data_path=cfg.data_path,
        prompt_template=cfg.prompt_template,
        heldout_frac=cfg.heldout_frac,
        seed=cfg.seed,
    )
    task_rng = random.Random(cfg.seed)
    resample_rng = random.Random(f"resample-{cfg.seed}-{ctx.rank}") if cfg.dynamic_sampling else None
    heldout = task.heldout(cfg.eval_problems, cfg.seed)
    system_prompt = cfg.system_prompt if cfg.system_prompt is not None else task.system_prompt
    probe = kl_probe(cfg, model, tok, task, system_prompt, out_dir / "probe.pt", device, ctx.is_main)
    if ctx.enabled:  # rollouts differ across ranks (a run of one process keeps the stream it always had)
        torch.manual_seed(cfg.seed + 1_000_003 * ctx.rank)
    return Run(
        cfg=cfg,
        loss_cfg=loss_cfg,
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
        task_rng=task_rng,
        heldout=heldout,
        system_prompt=system_prompt,
        probe=probe,
        guard=StepGuard([(n, p) for n, p in model.named_parameters() if p.requires_grad], optimizer),
        policy=data_parallel(model, cfg.group_size, ctx),
        dist=ctx,
        resample_rng=resample_rng,
    )


def rollout_engine(cfg: TrainConfig, model, device: torch.device) -> VLLMEngine | None:
    """vLLM for the rollouts when asked (`on`), or by default on CUDA without LoRA; None = HF generate."""
    if cfg.use_vllm == "on" or (cfg.use_vllm == "auto" and device.type == "cuda" and not cfg.lora):
        try:
            return VLLMEngine(model, cfg.model)
        except Exception as exc:  # noqa: BLE001 -- vllm missing or unable to start: fall back to HF generate
            if cfg.use_vllm == "on":
                raise
            print(f"vLLM unavailable ({type(exc).__name__}); using HF generate")
    return None


def progress_bar(cfg: TrainConfig, total: int, desc: str, initial: int = 0, leave: bool = False):
    """A named tqdm bar when `cfg.progress`; None otherwise (every caller accepts None)."""
    if not cfg.progress:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, desc=desc, dynamic_ncols=True, leave=leave)


def fork_rng(device: torch.device):
    """torch.random.fork_rng over the CPU generator and, on CUDA, the device's: what the forked code draws never
    reaches the training stream."""
    return torch.random.fork_rng(devices=[device] if device.type == "cuda" else [])


PROBE_CHUNK = 4  # probe prompts per rollout call (the bar's unit)


def kl_probe(
    cfg: TrainConfig, model, tok, task, system_prompt: str | None, path: Path, device, write: bool = True
) -> dict | None:
    """KL-from-init probes: completions sampled once from the initial policy; their initial log-probs are cached, so
    no reference model stays resident. Stored in the run directory (plain tensors and texts) so a resumed run uses
    the same probes. The probe's targets are range-checked here, once: the per-step KL (`kl_from_init`) skips that
    check."""
    if not cfg.kl_every:
        return None
    if cfg.resume and path.exists():
        saved = load_probe(path)
        batch = Batch(
            *(saved[k].to(device) for k in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask")),
            texts=saved["texts"],
            rewards=saved["rewards"],
            correct=saved["correct"],
        )
        check_target_values(completion_targets(batch), head_weight(model).shape[0], -100)
        return {"batch": batch, "logp0": saved["logp0"].to(device)}
    problems = task.sample(cfg.probe_size, random.Random(f"probe-{cfg.seed}"))
    bar = progress_bar(cfg, len(problems), "KL probe (sampling from the initial policy)")
    chunks = []
    with fork_rng(device):
        torch.manual_seed(cfg.seed + 777)
        for i in range(0, len(problems), PROBE_CHUNK):
            chunk = problems[i : i + PROBE_CHUNK]
            chunks.append(
                rollout(
                    model,
                    tok,
                    chunk,
                    group_size=1,
                    max_new_tokens=cfg.max_new_tokens,
                    temperature=cfg.temperature,
                    top_p=cfg.top_p,
                    system_prompt=system_prompt,
                )
            )
            if bar is not None:
                bar.update(len(chunk))
    if bar is not None:
        bar.close()
    probe_batch = concat_batches(chunks, tok.pad_token_id)
    probe = {"batch": probe_batch, "logp0": token_logprobs(model, probe_batch, cfg.temperature, cfg.backend, 1)}
    if write:  # (every rank of a torchrun job computes the same probe; rank 0 writes it)
        save_probe(path, probe_batch, probe["logp0"])
    return probe


def concat_batches(batches: list[Batch], pad_id: int) -> Batch:
    """One Batch from several rollouts: prompts left-padded, completions right-padded to the widest."""
    if len(batches) == 1:
        return batches[0]
    p_width = max(b.prompt_ids.shape[1] for b in batches)
    c_width = max(b.completion_ids.shape[1] for b in batches)

    def pad(x: Tensor, width: int, value, left: bool) -> Tensor:
        extra = width - x.shape[1]
        return torch.nn.functional.pad(x, (extra, 0) if left else (0, extra), value=value)

    return Batch(
        prompt_ids=torch.cat([pad(b.prompt_ids, p_width, pad_id, True) for b in batches]),
        prompt_mask=torch.cat([pad(b.prompt_mask, p_width, 0, True) for b in batches]),
        completion_ids=torch.cat([pad(b.completion_ids, c_width, pad_id, False) for b in batches]),
        completion_mask=torch.cat([pad(b.completion_mask, c_width, False, False) for b in batches]),
        texts=[t for b in batches for t in b.texts],
        rewards=torch.cat([b.rewards for b in batches]),
        correct=torch.cat([b.correct for b in batches]),
    )


def kl_from_init(run: Run) -> float:
    """k3 estimate of KL(pi_init || pi) on the probe completions (sampled from the initial policy), >= 0."""
    batch = run.probe["batch"]
    logp = token_logprobs(run.model, batch, run.cfg.temperature, run.cfg.backend, 1, check_targets=False)
    d = (logp - run.probe["logp0"])[batch.completion_mask]  # log(pi / pi_init) on init samples
    return float((d.exp() - 1 - d).mean())
