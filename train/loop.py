"""The training loop: `setup` (policy, optimizer, task, KL probe), then per step `train_step` (rollout -> advantages
and conflict weights -> sgrpo_loss on hidden states -> optimizer step -> one metrics record), `evaluate` on held-out
problems, collapse detection; checkpoints (train/checkpoint.py) and metrics.jsonl (train/metrics.py) around it.
Read `train()` at the bottom first."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import random
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor

from sgrpo_kernels import linear_logprobs, sgrpo_loss
from sgrpo_kernels.rl import GroupSignals, LossConfig, metrics_to_floats, prepare_groups
from sgrpo_kernels.validation import check_target_values
from train.checkpoint import load_checkpoint, rng_snapshot, save_checkpoint
from train.config import TrainConfig
from train.metrics import MetricsLog
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
from train.rewards import answers_match
from train.rollout import Batch, VLLMEngine, majority, rollout
from train.tasks import make_task

# load_checkpoint, save_checkpoint and rng_snapshot (train/checkpoint.py) stay importable from here.

# ----------------------------------------------------------------------------------------------------- helpers


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


@torch.no_grad()
def token_logprobs(
    model, batch: Batch, temperature: float, backend: str | None, group_size: int, check_targets: bool | None = None
) -> torch.Tensor:
    """Forward-only log-probs [N, T] of the completion tokens (no autograd state, no logits). `check_targets`: as in
    `linear_logprobs` (None = env SGRPO_CHECK_TARGETS, default on; one host sync)."""
    hidden = completion_hidden(model, batch, group_size)
    logp, _ = linear_logprobs(
        hidden,
        head_weight(model),
        completion_targets(batch),
        temperature=temperature,
        return_entropy=False,
        backend=backend,
        check_targets=check_targets,
    )
    return logp


def lr_lambda(cfg: TrainConfig):
    def f(step: int) -> float:
        if step < cfg.warmup_steps:
            return (step + 1) / (cfg.warmup_steps + 1)
        progress = (step - cfg.warmup_steps) / max(1, cfg.max_steps - cfg.warmup_steps)
        return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    return f


def peak_mem_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    try:
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
    except ImportError:  # pragma: no cover
        return float("nan")


HISTORY_KEYS = ("entropy_mean", "zero_var_frac", "accuracy", "kl_from_init")  # per step, kept in the checkpoint


def is_collapsed(history: list[dict], cfg: TrainConfig) -> bool:
    """Collapse rule: over the last `collapse_window` steps, every step had mean token entropy < `collapse_entropy`
    AND no learning signal (every group's rewards equal, zero_var_frac == 1) AND the batch was not all solved
    (reward_mean < max). A policy that emits one near-deterministic wrong answer per prompt trips it; a policy that
    has solved the task does not."""
    recent = history[-cfg.collapse_window :]
    if len(recent) < cfg.collapse_window:
        return False
    return all(
        h["entropy_mean"] < cfg.collapse_entropy and h["zero_var_frac"] >= 1.0 and h["accuracy"] < 1.0 for h in recent
    )


@torch.no_grad()
def evaluate(model, tok, problems, cfg: TrainConfig, engine=None, system_prompt: str | None = None) -> dict:
    """Held-out greedy accuracy (with its standard error), and pass@k / maj@k from k samples at the train temperature.
    Uses its own RNG (fork_rng), so evaluating never changes the training trajectory."""

    def run(greedy: bool, n: int, probs) -> list[str]:
        texts = []
        for i in range(0, len(probs), max(1, cfg.eval_batch_size // n)):
            chunk = probs[i : i + max(1, cfg.eval_batch_size // n)]
            texts += rollout(
                model,
                tok,
                chunk,
                group_size=n,
                max_new_tokens=cfg.max_new_tokens,
                temperature=cfg.temperature,
                top_p=cfg.top_p,
                system_prompt=system_prompt,
                greedy=greedy,
                engine=engine,
            ).texts
        return texts

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed + 12345)
        greedy = run(True, 1, problems)
        acc = sum(answers_match_text(t, p.answer) for t, p in zip(greedy, problems)) / len(problems)
        out = {
            "eval_acc": acc,
            "eval_acc_se": math.sqrt(acc * (1 - acc) / len(problems)),
            "eval_n": len(problems),
            "eval_samples": [
                {"q": p.question, "answer": p.answer, "greedy": t} for p, t in zip(problems[:5], greedy[:5])
            ],
        }
        k = cfg.eval_k
        if k > 0:
            subset = problems[: cfg.eval_k_problems]
            sampled = run(False, k, subset)
            groups = [sampled[i * k : (i + 1) * k] for i in range(len(subset))]
            out[f"eval_pass@{k}"] = sum(
                any(answers_match_text(t, p.answer) for t in g) for g, p in zip(groups, subset)
            ) / len(subset)
            out[f"eval_maj@{k}"] = sum(answers_match(majority(g), p.answer) for g, p in zip(groups, subset)) / len(
                subset
            )
    return out


def answers_match_text(text: str, answer: str) -> bool:
    from train.rewards import correctness_reward

    return correctness_reward(text, answer) > 0


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
    ref_model: torch.nn.Module | None  # the frozen reference of the KL presets (grpo); None otherwise
    params: list[torch.nn.Parameter]  # the trained ones
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    engine: VLLMEngine | None
    task: object
    task_rng: random.Random  # draws each step's problems; saved in checkpoints
    heldout: list
    system_prompt: str | None
    probe: dict | None  # the KL-from-init probe ({"batch", "logp0"}); None when kl_every is 0

    @property
    def ckpt_dir(self) -> Path:
        return self.out_dir / "checkpoint"


@dataclass
class LoopState:
    """What the loop carries from step to step (and a checkpoint saves): steps done, the per-step history of the
    collapse rule, the last KL-from-init measured."""

    step: int = 0
    history: list[dict] = field(default_factory=list)
    kl_from_init: float = 0.0


def setup(cfg: TrainConfig, loss_overrides: dict | None = None, model_and_tokenizer=None) -> Run:
    """Everything before the first step, in the order that fixes the random stream: the run directory and its
    config.json, the policy (and the reference model of the KL presets), optimizer and schedule, the rollout engine,
    the task and its held-out set, the KL-from-init probe."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    loss_cfg = cfg.loss_config(loss_overrides)  # preset + cfg.loss + --loss.FIELD
    out_dir = Path(cfg.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(
        json.dumps({"train": dataclasses.asdict(cfg), "loss": dataclasses.asdict(loss_cfg)}, indent=2, default=str)
    )

    device = resolve_device(cfg.device)
    dtype = resolve_dtype(cfg.dtype, device)
    torch.manual_seed(cfg.seed)
    if model_and_tokenizer is None:
        model, tok = load_model_and_tokenizer(cfg.model, device, dtype, cfg.seed)
    else:
        model, tok = model_and_tokenizer
    ref_model = None
    if loss_cfg.needs_ref:  # only the KL presets (grpo) pay for a frozen reference
        ref_model, _ = load_model_and_tokenizer(cfg.model, device, dtype, cfg.seed)
        ref_model.requires_grad_(False).eval()
        print(f"reference model: {param_bytes(ref_model) / 2**20:.1f} MiB of weights")
    if cfg.lora:
        model = add_lora(model, cfg.lora_r, cfg.lora_alpha)
    params = set_trainable(model, cfg.train_layers, cfg.train_lm_head)
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
    heldout = task.heldout(cfg.eval_problems, cfg.seed)
    system_prompt = cfg.system_prompt if cfg.system_prompt is not None else task.system_prompt
    probe = kl_probe(cfg, model, tok, task, system_prompt, out_dir / "probe.pt")
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


def kl_probe(cfg: TrainConfig, model, tok, task, system_prompt: str | None, path: Path) -> dict | None:
    """KL-from-init probes: completions sampled once from the initial policy; their initial log-probs are cached, so
    no reference model stays resident. Stored in the run directory so a resumed run uses the same probes. The probe's
    targets are range-checked here, once: the per-step KL (`kl_from_init`) skips that check."""
    if not cfg.kl_every:
        return None
    if cfg.resume and path.exists():
        probe = torch.load(path, weights_only=False)
        check_target_values(completion_targets(probe["batch"]), head_weight(model).shape[0], -100)
        return probe
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed + 777)
        probe_batch = rollout(
            model,
            tok,
            task.sample(cfg.probe_size, random.Random(f"probe-{cfg.seed}")),
            group_size=1,
            max_new_tokens=cfg.max_new_tokens,
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            system_prompt=system_prompt,
        )
    probe = {"batch": probe_batch, "logp0": token_logprobs(model, probe_batch, cfg.temperature, cfg.backend, 1)}
    torch.save(probe, path)
    return probe


def kl_from_init(run: Run) -> float:
    """k3 estimate of KL(pi_init || pi) on the probe completions (sampled from the initial policy), >= 0."""
    batch = run.probe["batch"]
    logp = token_logprobs(run.model, batch, run.cfg.temperature, run.cfg.backend, 1, check_targets=False)
    d = (logp - run.probe["logp0"])[batch.completion_mask]  # log(pi / pi_init) on init samples
    return float((d.exp() - 1 - d).mean())


def resume(run: Run) -> LoopState:
    """--resume: weights, optimizer, scheduler, RNG states, step and history from OUTPUT_DIR/checkpoint."""
    if not (run.ckpt_dir / "state.pt").exists():
        raise FileNotFoundError(f"--resume: no checkpoint at {run.ckpt_dir / 'state.pt'}")
    step, history = load_checkpoint(run.ckpt_dir, run.model, run.optimizer, run.scheduler, run.task_rng)
    print(f"resumed from step {step}")
    return LoopState(step, history, history[-1]["kl_from_init"] if history else 0.0)


def save(run: Run, state: LoopState, rngs: dict) -> None:
    save_checkpoint(run.ckpt_dir, run.model, run.optimizer, run.scheduler, state.step, rngs, state.history, run.cfg)


# ----------------------------------------------------------------------------------------------------- one step


@dataclass
class Update:
    """What the `ppo_epochs` optimizer steps of one batch left."""

    metrics: dict[str, Tensor] | None  # sgrpo_loss metrics of the last epoch (also a skipped one); None: no epoch ran
    grad_norm: float  # pre-clip norm of the last epoch that got a gradient; nan when none did
    skipped: int  # epochs whose non-finite loss or gradient was dropped


def policy_update(run: Run, batch: Batch, groups: GroupSignals) -> Update:
    """`ppo_epochs` optimizer steps on one rollout batch, then the schedule's step. A non-finite loss or gradient
    skips that epoch's update (weights and Adam state untouched). The targets' range is checked by the first op call
    only: one host sync per step."""
    cfg, model, G = run.cfg, run.model, run.cfg.group_size
    targets = completion_targets(batch)
    check = itertools.chain([None], itertools.repeat(False))  # None: env SGRPO_CHECK_TARGETS (default on)
    old_logp = ref_logp = None
    if cfg.ppo_epochs > 1:  # the behaviour policy's log-probs, for the ratio of the later epochs
        old_logp = token_logprobs(model, batch, cfg.temperature, cfg.backend, G, next(check))
    if run.ref_model is not None:
        ref_logp = token_logprobs(run.ref_model, batch, cfg.temperature, cfg.backend, G, next(check))

    model.train()
    skipped, grad_norm, metrics = 0, float("nan"), None
    for _ in range(cfg.ppo_epochs):
        run.optimizer.zero_grad(set_to_none=True)
        hidden = completion_hidden(model, batch, G)  # [N, T, D]: the policy forward never makes logits
        loss, metrics = sgrpo_loss(
            hidden,
            head_weight(model),
            targets,
            groups.advantages,
            batch.completion_mask,
            run.loss_cfg,
            temperature=cfg.temperature,
            old_logp=old_logp,
            ref_logp=ref_logp,
            **groups.loss_kwargs(),  # token_weights, conflict_counts, rewards, group_size
            compute_entropy=True,
            backend=cfg.backend,
            check_targets=next(check),
        )
        if not torch.isfinite(loss):
            skipped += 1  # non-finite loss: no backward, no step; the weights are untouched
            continue
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(run.params, cfg.max_grad_norm)
        grad_norm = float(norm)
        if not math.isfinite(grad_norm):
            skipped += 1  # non-finite gradient: drop it (Adam state and weights untouched)
            run.optimizer.zero_grad(set_to_none=True)
            continue
        run.optimizer.step()
    run.optimizer.zero_grad(set_to_none=True)
    with warnings.catch_warnings():  # a skipped (non-finite) update still advances the schedule
        warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step\\(\\)` before")
        run.scheduler.step()
    return Update(metrics, grad_norm, skipped)


# The loss values of a record when no loss was computed (ppo_epochs = 0): what such a record has always said.
NO_LOSS = {
    "entropy_mean": math.nan,
    "clip_frac": 0.0,
    "masked_frac": math.nan,
    "filtered_frac": math.nan,
    "loss": math.nan,
    "kl_ref": 0.0,
}


def step_record(
    run: Run, state: LoopState, batch: Batch, groups: GroupSignals, update: Update, t0: float, t_gen: float
) -> dict:
    """The metrics.jsonl record of a step. The device-side numbers (advantage stats, the last epoch's loss metrics,
    the token count) reach the host in one copy; a metric the RL layer stops reporting is a KeyError here."""
    on_device = {"zero_var_frac": groups.stats["zero_variance_frac"], "n_tok": batch.completion_mask.sum()}
    m = update.metrics
    if m is not None:
        on_device |= {
            "entropy_mean": m["entropy_mean"],
            "clip_frac": m["clip_frac_low"] + m["clip_frac_high"],
            "masked_frac": m["zero_weight_frac"],
            "filtered_frac": m["filtered_frac"],
            "loss": m["loss"],
            "kl_ref": m["kl"],
        }
    v = metrics_to_floats(on_device)
    lv = v if m is not None else NO_LOSS
    n_tok = int(v["n_tok"])
    step_s = time.time() - t0
    return {
        "step": state.step,
        "reward_mean": float(batch.rewards.mean()),
        "reward_std": float(batch.rewards.std()) if len(batch.rewards) > 1 else 0.0,
        "accuracy": float(batch.correct.float().mean()),
        "zero_var_frac": v["zero_var_frac"],
        "entropy_mean": lv["entropy_mean"],
        "grad_norm": update.grad_norm,
        "clip_frac": lv["clip_frac"],
        "masked_frac": lv["masked_frac"],
        "filtered_frac": lv["filtered_frac"],
        "completion_len": n_tok / len(batch.texts),
        "kl_from_init": state.kl_from_init,
        "loss": lv["loss"],
        "kl_ref": lv["kl_ref"],
        "lr": run.scheduler.get_last_lr()[0],
        "skipped": update.skipped,
        "tokens_per_s": n_tok / step_s,
        "gen_s": t_gen,
        "step_s": step_s,
        "peak_mem_mb": peak_mem_mb(run.device),
        "sample": batch.texts[0],
    }


def train_step(run: Run, state: LoopState) -> dict:
    """One RL step: rollout -> advantages and conflict weights (`prepare_groups`) -> `policy_update` -> the KL probe
    when due -> the step's metrics record (with the collapse flag). `state.step` counts the step as soon as the
    weights have moved, so a Ctrl-C after that checkpoints it."""
    cfg = run.cfg
    t0 = time.time()
    problems = run.task.sample(cfg.prompts_per_step, run.task_rng)
    batch = rollout(
        run.model,
        run.tok,
        problems,
        group_size=cfg.group_size,
        max_new_tokens=cfg.max_new_tokens,
        temperature=cfg.temperature,
        top_p=cfg.top_p,
        system_prompt=run.system_prompt,
        format_weight=cfg.format_reward_weight,
        engine=run.engine,
    )
    t_gen = time.time() - t0
    rewards = batch.rewards.to(run.device)
    groups = prepare_groups(run.loss_cfg, rewards, batch.completion_ids, batch.completion_mask, cfg.group_size)
    update = policy_update(run, batch, groups)
    if run.engine is not None:
        run.engine.sync(run.model)
    state.step += 1

    if cfg.kl_every and (state.step % cfg.kl_every == 0 or state.step == cfg.max_steps):
        state.kl_from_init = kl_from_init(run)
    record = step_record(run, state, batch, groups, update, t0, t_gen)
    state.history.append({k: record[k] for k in HISTORY_KEYS})
    record["collapse"] = is_collapsed(state.history, cfg)
    if update.skipped:
        print(f"step {state.step}: non-finite loss or gradient, {update.skipped} update(s) skipped")
    return record


# ----------------------------------------------------------------------------------------------------- reporting


def heldout_eval(run: Run, log: MetricsLog, step: int, label: str | None = None) -> dict:
    """`evaluate` on the held-out set, logged as an eval event (and printed when `label` is given)."""
    ev = evaluate(run.model, run.tok, run.heldout, run.cfg, run.engine, run.system_prompt)
    log.write({"step": step, "event": "eval", **ev})
    if label is not None:
        print(f"held-out {label + ':':<7} acc {ev['eval_acc']:.3f} +- {ev['eval_acc_se']:.3f} (n={ev['eval_n']})")
    return ev


def compare_heldout(summary: dict) -> None:
    """summary["delta"]: held-out accuracy after - before, also in standard errors of the difference."""
    b, a = summary["before"], summary["after"]
    diff_se = math.sqrt(b["eval_acc_se"] ** 2 + a["eval_acc_se"] ** 2)
    summary["delta"] = a["eval_acc"] - b["eval_acc"]
    summary["delta_in_se"] = summary["delta"] / diff_se if diff_se > 0 else float("nan")
    print(f"held-out change: {summary['delta']:+.3f} ({summary['delta_in_se']:+.1f} standard errors)")


def progress_bar(cfg: TrainConfig, start: int, name: str):
    if not cfg.progress:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=cfg.max_steps, initial=start, desc=f"{name}", dynamic_ncols=True)


def show_progress(bar, record: dict) -> None:
    if bar is not None:
        bar.set_postfix(
            reward=f"{record['reward_mean']:.2f}",
            H=f"{record['entropy_mean']:.2f}",
            gn=f"{record['grad_norm']:.2f}",
            refresh=False,
        )
        bar.update(1)


# ----------------------------------------------------------------------------------------------------- the loop


def train(cfg: TrainConfig, loss_overrides: dict | None = None, model_and_tokenizer=None) -> dict:
    """Run RL training; returns a summary dict (also written to OUTPUT_DIR/summary.json)."""
    t_start = time.time()
    run = setup(cfg, loss_overrides, model_and_tokenizer)
    state = resume(run) if cfg.resume else LoopState()
    summary: dict = {"output_dir": str(run.out_dir), "preset": run.loss_cfg.name, "model": cfg.model}
    with MetricsLog(run.out_dir / "metrics.jsonl", resume_step=state.step if cfg.resume else None) as log:
        if state.step == 0:
            summary["before"] = heldout_eval(run, log, 0, "before")
        elif (run.out_dir / "summary.json").exists():  # a resumed run keeps the first run's "before" (if it had one)
            summary["before"] = json.loads((run.out_dir / "summary.json").read_text()).get("before")
        bar = progress_bar(cfg, state.step, run.loss_cfg.name)
        interrupted, rngs = False, rng_snapshot(run.task_rng)
        try:
            t_train = time.time()
            while state.step < cfg.max_steps:
                if cfg.time_budget_s and time.time() - t_train > cfg.time_budget_s:
                    print(f"\ntime budget of {cfg.time_budget_s:.0f}s reached after {state.step} steps")
                    summary["stopped_by_time_budget"] = True
                    break
                rngs = rng_snapshot(run.task_rng)  # the start of this step: what a Ctrl-C checkpoint resumes from
                record = train_step(run, state)  # batch -> rollout -> advantages -> loss -> optimizer step
                log.write(record)
                show_progress(bar, record)
                if cfg.eval_every and state.step % cfg.eval_every == 0 and state.step < cfg.max_steps:
                    heldout_eval(run, log, state.step)
                if cfg.save_every and state.step % cfg.save_every == 0:
                    save(run, state, rng_snapshot(run.task_rng))
            rngs = rng_snapshot(run.task_rng)
        except KeyboardInterrupt:
            interrupted = True
            print(f"\ninterrupted: saving checkpoint at step {state.step} (continue with --resume)")
        finally:
            if bar is not None:
                bar.close()
        save(run, state, rngs)
        summary["steps"] = state.step
        if not interrupted:
            summary["after"] = heldout_eval(run, log, state.step, "after")
            if summary.get("before"):
                compare_heldout(summary)
    summary["wall_s"] = time.time() - t_start
    summary["interrupted"] = interrupted
    (run.out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    print(f"done in {summary['wall_s']:.0f}s; metrics in {run.out_dir / 'metrics.jsonl'}")
    return summary
