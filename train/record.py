"""The metrics.jsonl record of a training step, and the memory figures in it."""

from __future__ import annotations

import math
import time
from pathlib import Path

import torch

from sgrpo_kernels.rl import GroupSignals, metrics_to_floats

from .batch import Batch, Update
from .rewards import format_reward

_STATUS = Path("/proc/self/status")

# The loss values of a record when no loss was computed: what such a record has always said.
NO_LOSS = {
    "entropy_mean": math.nan,
    "clip_frac": 0.0,
    "masked_frac": math.nan,
    "filtered_frac": math.nan,
    "loss": math.nan,
    "kl_ref": 0.0,
}


def peak_mem_mb(device: torch.device) -> float:
    """The process's peak memory so far: CUDA, the device's peak allocation; elsewhere the peak resident set size
    (which includes model loading)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    try:
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
    except ImportError:  # pragma: no cover
        return float("nan")


def reset_train_peak(device: torch.device) -> None:
    """Starts the window of `train_peak_mem_mb`: CUDA, resets the peak allocation statistic; on Linux, the peak
    resident set size (VmHWM, through /proc/self/clear_refs). Elsewhere a no-op (the figure is then nan)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def train_peak_mem_mb(device: torch.device) -> float:
    """Peak memory since `reset_train_peak` (training, without the model-loading transient): CUDA, peak allocation;
    Linux, peak RSS (VmHWM); elsewhere nan. Everything resident at the reset (both models of a KL preset) counts."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def global_numbers(run, on_device: dict, batch: Batch) -> tuple[dict, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The numbers of the global batch: one process, its own; under torchrun the rank means of equal-sized shares
    and every rank's rewards. -> (on-device numbers, format rate, rewards, correct)."""
    formatted = torch.tensor(sum(format_reward(t) for t in batch.texts) / len(batch.texts), dtype=torch.float64)
    rewards, correct = batch.rewards, batch.correct.float()
    if run.dist.enabled:
        keys = list(on_device)
        means = run.dist.mean(torch.stack([on_device[k].float() for k in keys] + [formatted.to(run.device)]))
        on_device = {k: means[i] for i, k in enumerate(keys)}
        on_device["n_tok"] = on_device["n_tok"] * run.dist.world
        formatted = means[-1]
        rewards = run.dist.cat(rewards.to(run.dist.device)).cpu()
        correct = run.dist.cat(correct.to(run.dist.device)).cpu()
    return on_device, formatted, rewards, correct


def step_record(run, step: int, batch: Batch, groups: GroupSignals, update: Update, t0: float, t_gen: float) -> dict:
    """The record of a step (the loop's "kl" phase fills in `kl_from_init`, null on steps without a probe), then the
    features' fields (`Feature.record`). The device-side numbers (advantage stats, the last pass's loss metrics, the
    token count) reach the host in one copy; a metric the RL layer stops reporting is a KeyError here."""
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
        if "policy_term_frac" in m:  # a policy term other than PPO's clip (DPPO, CISPO, Clip-Cov, KL-Cov)
            on_device["policy_term_frac"] = m["policy_term_frac"]
    on_device, formatted, rewards, correct = global_numbers(run, on_device, batch)
    v = metrics_to_floats(on_device)
    lv = v if m is not None else NO_LOSS
    n_tok, n_seq = int(round(v["n_tok"])), len(rewards)
    step_s = time.time() - t0
    record = {
        "step": step,
        "reward_mean": float(rewards.mean()),
        "reward_std": float(rewards.std()) if n_seq > 1 else 0.0,
        "accuracy": float(correct.mean()),
        "format_frac": float(formatted),
        "completions": n_seq,
        "zero_var_frac": v["zero_var_frac"],
        "entropy_mean": lv["entropy_mean"],
        "grad_norm": update.grad_norm,
        "clip_frac": lv["clip_frac"],
        "masked_frac": lv["masked_frac"],
        "filtered_frac": lv["filtered_frac"],
        "completion_len": n_tok / n_seq,
        "kl_from_init": None,  # measured by the "kl" phase on the steps it is due
        "loss": lv["loss"],
        "kl_ref": lv["kl_ref"],
        "lr": run.scheduler.get_last_lr()[0],
        "skipped": update.skipped,
        "tokens_per_s": n_tok / step_s,
        "gen_s": t_gen,
        "step_s": step_s,
        "sync_s": 0.0,  # the engine's weight sync after the step; the loop adds it (and it joins step_s)
        "peak_mem_mb": peak_mem_mb(run.device),
        "train_peak_mem_mb": train_peak_mem_mb(run.device),
        "sample": batch.texts[0],
        "rollout_engine": run.engine.name,  # "hf" or "vllm"
        "rollout_logp_diff": update.rollout_logp_diff,  # mean |sampler - trainer| logp; null without sampler logps
        "rollout_ratio_mean": update.rollout_ratio_mean,  # mean pi_trainer / pi_sampler; null as above
        "rollout_ratio_outside": update.rollout_ratio_outside,  # its fraction outside [0.9, 1.1]; null as above
    }
    if run.loss_cfg.policy_term != "ppo":  # the active tokens its term masked, clipped or penalized (last pass)
        record["policy_term_frac"] = lv.get("policy_term_frac", 0.0)
    return run.features.record(record)
