"""The training loop: per step `train_step` (rollout -> advantages and conflict weights -> sgrpo_loss on hidden states
-> optimizer step -> one metrics record), collapse detection, periodic held-out evaluation and checkpoints, around
`setup` (train/setup.py), `evaluate` (train/evaluate.py), checkpoints (train/checkpoint.py) and metrics.jsonl
(train/metrics.py). Read `train()` at the bottom first."""

from __future__ import annotations

import itertools
import json
import math
import time
import warnings
from dataclasses import dataclass, field

import torch
from torch import Tensor

from sgrpo_kernels import sgrpo_loss
from sgrpo_kernels.rl import GroupSignals, metrics_to_floats, prepare_groups
from train.checkpoint import load_checkpoint, rng_snapshot, save_checkpoint
from train.config import TrainConfig
from train.evaluate import compare_heldout, heldout_eval
from train.metrics import MetricsLog
from train.model import head_weight
from train.rollout import Batch, rollout
from train.setup import Run, completion_hidden, completion_targets, kl_from_init, setup, token_logprobs

# ----------------------------------------------------------------------------------------------------- helpers


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


# ----------------------------------------------------------------------------------------------------- state


@dataclass
class LoopState:
    """What the loop carries from step to step (and a checkpoint saves): steps done, the per-step history of the
    collapse rule, the last KL-from-init measured."""

    step: int = 0
    history: list[dict] = field(default_factory=list)
    kl_from_init: float = 0.0


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
