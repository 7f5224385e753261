"""The training loop. Read `train()` at the bottom first.

A run is a sequence of phases. Step k is `train_step` (rollout -> advantages and conflict weights -> sgrpo_loss on
hidden states -> optimizer step), which ends by *committing* the step: from then on the state says "k steps done",
with the RNG states after step k and the step's phases still to run, in this order, each when due: "kl" (the
KL-from-init probe), "log" (the step's metrics record), "eval" (periodic held-out eval), "save" (checkpoint). Before
step 1 runs "before" (held-out eval); after the last step "save", "after" (held-out eval), "save".

A checkpoint holds that state as one consistent tuple (step, RNG, weights, optimizer, pending phases, records
written). Each phase does its work first (interruptible: it stays pending) and then, with signals held
(train/signals.py), its bookkeeping; an optimizer step holds signals until its commit. So a Ctrl-C or SIGTERM anywhere
saves a state that `--resume` continues exactly as the uninterrupted run would have gone on.

The state and its checkpoint: train/state.py; setup: train/setup.py; evaluation: train/evaluate.py; files:
train/checkpoint.py, train/metrics.py, train/rundir.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import math
import os
import time
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor

from sgrpo_kernels import sgrpo_loss
from sgrpo_kernels.integrations.hf import lm_head
from sgrpo_kernels.rl import GroupSignals, metrics_to_floats, prepare_groups
from train.checkpoint import STATE_FILE, read_checkpoint, rng_snapshot
from train.config import TrainConfig
from train.distributed import Dist, from_env, shutdown
from train.errors import Refused, TrainError
from train.evaluate import compare_heldout, heldout_eval
from train.gt_likelihood import gt_likelihood
from train.lock import RunLock
from train.metrics import MetricsLog, NullLog, write_json
from train.rewards import format_reward
from train.rollout import Batch, chat_prompts, rollout
from train.rundir import open_output_dir
from train.setup import (
    Run,
    completion_targets,
    concat_batches,
    kl_from_init,
    progress_bar,
    reference_logprobs,
    setup,
    token_logprobs,
)
from train.signals import STOP, signal_name
from train.stability import CollapseRules, low_entropy_collapse
from train.state import LoopState, emergency_save, fresh_state, resume, save

# ----------------------------------------------------------------------------------------------------- helpers


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


_STATUS = Path("/proc/self/status")


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


def collapse_rules(cfg: TrainConfig) -> CollapseRules:
    return CollapseRules(window=cfg.collapse_window, low_entropy=cfg.collapse_entropy)


def is_collapsed(history: list[dict], cfg: TrainConfig) -> bool:
    """The live collapse flag of a step record: the low-entropy rule of train/stability.py with the run's
    `collapse_window` and `collapse_entropy` (the study also checks the entropy blow-up rule, from the records)."""
    return low_entropy_collapse(history, collapse_rules(cfg))


# ----------------------------------------------------------------------------------------------------- rollouts


def roll(run: Run, problems: list) -> Batch:
    """`group_size` sampled completions of each problem, scored (HF generate, or the vLLM engine); with
    --dense-reward gt_likelihood the wrong completions' rewards are then made dense (`gt_likelihood_rewards`)."""
    cfg = run.cfg
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
    if cfg.dense_reward == "gt_likelihood":
        batch = gt_likelihood_rewards(run, problems, batch)
    return batch


def gt_likelihood_rewards(run: Run, problems: list, batch: Batch) -> Batch:
    """The batch with each wrong completion's correctness reward 0 replaced by P(GT answer | prompt, its reasoning)
    (train/gt_likelihood.py: the forward-only op on the policy's hidden states, no logits, no gradient); a correct
    completion keeps 1, a format reward is still added, `correct` is unchanged (accuracy stays accuracy)."""
    g = run.cfg.group_size
    wrong = (~batch.correct).nonzero().flatten().tolist()
    likelihood = torch.zeros(len(batch.texts), dtype=torch.float64)
    if wrong:
        prompts = chat_prompts(run.tok, problems, run.system_prompt)
        likelihood[wrong] = gt_likelihood(
            run.model,
            run.tok,
            [prompts[i // g] for i in wrong],
            [batch.texts[i] for i in wrong],
            [str(problems[i // g].answer) for i in wrong],
            backend=run.cfg.backend,
        )
    # the dense reward (gt_likelihood.dense_rewards) replaces the correctness term, which is 0 on exactly these rows
    return dataclasses.replace(batch, rewards=batch.rewards + likelihood.to(batch.rewards.dtype))


def constant_groups(rewards: Tensor, group_size: int) -> list[bool]:
    """Per group of `group_size` consecutive rewards: are they all equal (solved, all-fail, or any other tie)? Such a
    group carries no relative signal: its group-relative advantages are all 0."""
    r = rewards.reshape(-1, group_size)
    return (r.max(dim=1).values == r.min(dim=1).values).tolist()


def select_groups(batch: Batch, groups: list[int], group_size: int) -> Batch:
    """The rows of `groups` (group indices, in the order given) of a batch."""
    rows = [g * group_size + j for g in groups for j in range(group_size)]

    def take(t: Tensor) -> Tensor:
        return t[torch.tensor(rows, device=t.device)]

    return Batch(
        take(batch.prompt_ids),
        take(batch.prompt_mask),
        take(batch.completion_ids),
        take(batch.completion_mask),
        [batch.texts[i] for i in rows],
        take(batch.rewards),
        take(batch.correct),
    )


def dynamic_sampling(run: Run, batch: Batch) -> tuple[Batch, dict]:
    """DAPO's dynamic sampling (Yu et al. 2025, arXiv 2503.14476, section 3.2; the seed's "Dynamic Resource
    Re-allocation", grpo-stability-experiments.md 3.1: cull the solved prompts and spend their sampling budget on
    others). A group whose rewards are all equal (`constant_groups`: solved or all-fail) is dropped, and the missing
    number of problems is drawn from `run.resample_rng` and rolled out, until the batch holds as many informative
    groups as it had groups (prompts_per_step, or this rank's share of them) or `dynamic_sampling_max_tries`
    rollouts (the first included) were made. Then, if it is short, it trains on what there is: the informative groups
    filled up with the first constant groups drawn, so the batch keeps its size (under torchrun every rank keeps
    equal numbers of completions, which the loss's rank decomposition needs; a constant group adds no policy gradient
    under the group-relative advantages, only to the denominators, as it did without dynamic sampling).

    The kept groups stay in the order drawn. -> (the batch to train on, this rank's counts: "tries" (rollouts),
    "resampled" (groups drawn after the first rollout: as many as the constant groups dropped), "constant" (constant
    groups among all drawn: dropped or filled in), "filled" (constant groups trained because the cap was hit),
    "capped" (fewer informative groups than needed), "rollouts" (completions generated), "reward_sum" (over every
    completion generated)). With one rollout (no constant group, or a cap of 1) the batch is returned as it was."""
    cfg, g = run.cfg, run.cfg.group_size
    need = len(batch.texts) // g
    drawn, const = [batch], constant_groups(batch.rewards, g)
    while const.count(False) < need and len(drawn) < cfg.dynamic_sampling_max_tries:
        more = roll(run, run.task.sample(need - const.count(False), run.resample_rng))
        drawn.append(more)
        const += constant_groups(more.rewards, g)
    informative = [i for i, c in enumerate(const) if not c]
    filled = [i for i, c in enumerate(const) if c][: need - len(informative)]
    keep = sorted(informative + filled)
    counts = {
        "tries": len(drawn),
        "resampled": len(const) - need,
        "constant": const.count(True),
        "filled": len(filled),
        "capped": len(informative) < need,
        "rollouts": len(const) * g,
        "reward_sum": float(sum(b.rewards.sum() for b in drawn)),
    }
    if len(drawn) == 1:  # one rollout: every group is kept (informative, or filled in)
        return batch, counts
    return select_groups(concat_batches(drawn, run.tok.pad_token_id), keep, g), counts


def resampling_record(run: Run, counts: dict) -> dict:
    """The record's dynamic-sampling fields, over every rank of a torchrun job (one gather of plain numbers)."""
    parts = run.dist.objects(counts)
    total = sum(p["rollouts"] for p in parts)
    return {
        "ds_tries": max(p["tries"] for p in parts),
        "ds_resampled": sum(p["resampled"] for p in parts),
        "ds_constant": sum(p["constant"] for p in parts),
        "ds_filled": sum(p["filled"] for p in parts),
        "ds_capped": any(p["capped"] for p in parts),
        "ds_rollouts": total,
        "ds_reward_mean_drawn": sum(p["reward_sum"] for p in parts) / total,
    }


# ----------------------------------------------------------------------------------------------------- the update


def _norm(tensors) -> float:
    """The L2 norm of tensors taken together as one vector, accumulated in float64."""
    norms = [torch.linalg.vector_norm(t.detach(), dtype=torch.float64) for t in tensors]
    return float(torch.linalg.vector_norm(torch.stack(norms))) if norms else 0.0


@torch.no_grad()
def project_step(params: list[Tensor], old: list[Tensor], delta: float) -> tuple[float, float]:
    """The trust region on parameters (s-grpo-reference-free.md, Research Directions 3, "Alternative
    Regularization": ||theta - theta_old|| <= delta). The step d = theta - theta_old of all `params` taken together
    as one vector (`old`: their values before the optimizer step) is projected onto the Euclidean ball of radius
    delta:

        theta <- theta_old + d * min(1, delta / ||d||_2)

    the closest point of the ball (computed in the weights' dtype: the result is inside the ball up to their rounding,
    half an ulp per weight). A step inside it is left untouched; so is a non-finite one (the step guard deals with
    it). -> (||d|| before, ||d|| after), accumulated in float64."""
    before = _norm(p - o for p, o in zip(params, old))
    if not math.isfinite(before) or before <= delta:
        return before, before
    f = delta / before
    for p, o in zip(params, old):
        p.copy_(o.lerp(p, f))  # o + f * (p - o)
    return before, _norm(p - o for p, o in zip(params, old))


def penalize_gradient(
    params: list[torch.nn.Parameter], backward_at: Callable[[], None], lam: float, gamma: float, radius: float
) -> dict[str, float]:
    """The gradient penalty (s-grpo-reference-free.md, Research Directions 3: "||grad|| <= gamma", as a penalty
    rather than only the clipping). With g = grad L in the `.grad` of `params` (the whole batch's gradient, after
    DDP's average), it is replaced by the gradient of

        L + lam/2 * max(0, ||g|| - gamma)^2,   that is   g + lam * max(0, ||g|| - gamma) * H u,   u = g / ||g||,

    H the Hessian of L. The op has no double backward (torch.autograd.grad(create_graph=True) through
    `linear_logprobs` fails: its backward op has no autograd formula), so H u is a finite difference of gradients,
    H u ~ (grad L(theta + r u) - g) / r: exact for a quadratic L, O(r) off otherwise (the approximation of Zhao, Zhang
    and Hu 2022, "Penalizing Gradient Norm for Efficiently Improving Generalization in Deep Learning").
    `backward_at()` runs the loss's forward and backward at the current weights; it is called once, at theta + r u,
    only when ||g|| > gamma (the weights are then put back exactly). Gradient clipping still applies afterwards.
    -> {"grad_norm": ||g||, "penalty": the penalty's value, "hvp_norm": ||H u|| (nan when inactive), "active": 0/1}."""
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    norm = _norm(grads)
    excess = max(0.0, norm - gamma)
    out = {"grad_norm": norm, "penalty": 0.5 * lam * excess**2, "hvp_norm": math.nan, "active": 0}
    if not math.isfinite(norm) or excess == 0.0:
        return out
    with torch.no_grad():
        g0 = [g.detach().clone() for g in grads]
        theta = [p.detach().clone() for p in params]
        for p, g in zip(params, g0):
            p.add_(g, alpha=radius / norm)
            p.grad = None
    backward_at()
    with torch.no_grad():
        for p, t in zip(params, theta):
            p.copy_(t)
        diff = [(p.grad if p.grad is not None else torch.zeros_like(p)) - g for p, g in zip(params, g0)]
        for p, g, d in zip(params, g0, diff):
            p.grad = g.add_(d, alpha=lam * excess / radius)
    out.update(hvp_norm=_norm(diff) / radius, active=1)
    return out


@dataclass
class Update:
    """What the `ppo_epochs` optimizer steps of one batch left."""

    metrics: dict[str, Tensor] | None  # sgrpo_loss metrics of the last epoch (also a skipped one); None: no epoch ran
    grad_norm: float  # pre-clip norm of the last epoch that got a gradient; nan when none did
    skipped: int  # epochs whose update was dropped (non-finite loss, gradient, or weights after the step)
    notes: list[str]  # what was skipped and why, for the log
    # the record fields of --trust-region (tr_*) and --grad-penalty (gp_*), only when they are on
    extra: dict[str, float] = field(default_factory=dict)


def rank_loss_scale(run: Run, batch: Batch) -> float | None:
    """The factor that turns this rank's loss into its share of the loss of the global batch (every rank's groups),
    given that DDP averages the ranks' gradients; None when the loss needs none (one process, or a mean over
    completions: the ranks hold equal numbers of completions, so the average of their means is the global mean).

    - `token-mean` (dapo, lite_ppo): the global loss is sum_r S_r / N with S_r the rank's token sum and N the global
      token count, and the rank computes S_r / n_r; so the factor is n_r * world / N. One all-reduce of the token count
      per step (shared by its `ppo_epochs`), the only collective this adds.
    - `seq-sum-token-mean` (gtpo_official): the global loss is the sum of the ranks' sums, which the average divides
      by world; so the factor is world (no collective).

    The entropy terms are scaled with the rest: the bonus aggregates like the policy term (exact); the entropy band
    penalty is a function of the rank's mean entropy, not a sum over tokens, and stays a rank-level approximation (as
    it is for every aggregation under DDP). The TRL integration's `_window_scale` is the same correction (b56fefa)."""
    if not run.dist.enabled:
        return None
    agg, world = run.loss_cfg.loss_agg, run.dist.world
    if agg == "token-mean":
        local = batch.completion_mask.sum().to(run.dist.device, torch.float64)
        total = run.dist.sum(local)
        return float(local * world / total.clamp(min=1))
    if agg == "seq-sum-token-mean":
        return float(world)
    return None


def policy_update(run: Run, state: LoopState, batch: Batch, groups: GroupSignals) -> Update:
    """`ppo_epochs` optimizer steps on one rollout batch, then the schedule's step. A non-finite loss or gradient
    skips that epoch's update (weights and Adam state untouched); so does an optimizer step that leaves a weight
    non-finite (undone by `run.guard`; with --step-guard false the run stops instead). Signals are held from the
    first optimizer step on (`train_step` releases them after its commit). The targets' range is checked by the first
    op call only: one host sync per step."""
    cfg, model, G = run.cfg, run.model, run.cfg.group_size
    targets = completion_targets(batch)
    check = itertools.chain([None], itertools.repeat(False))  # None: env SGRPO_CHECK_TARGETS (default on)
    old_logp = ref_logp = None
    if cfg.ppo_epochs > 1:  # the behaviour policy's log-probs, for the ratio of the later epochs
        old_logp = token_logprobs(model, batch, cfg.temperature, cfg.backend, G, next(check))
    if run.loss_cfg.needs_ref:  # the frozen reference, or with LoRA the policy with its adapters disabled
        ref_logp = reference_logprobs(run, batch, next(check))

    scale = rank_loss_scale(run, batch)  # None: one process, or an aggregation DDP's average already gets right

    def forward_loss(check_targets: bool | None) -> tuple[Tensor, dict[str, Tensor]]:
        # [N, T, D]: the policy forward never makes logits (run.policy: DDP-wrapped under torchrun)
        hidden = run.policy(batch.prompt_ids, batch.prompt_mask, batch.completion_ids, batch.completion_mask)
        head = lm_head(model)
        loss, metrics = sgrpo_loss(
            hidden,
            head.weight,
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
            check_targets=check_targets,
            **head.options(),  # bias, logit scale, softcap of this model's head
        )
        if scale is not None:  # this rank's share of the global batch's loss (the record logs the global loss)
            loss = loss * scale
            metrics = {**metrics, "loss": metrics["loss"] * scale}
        return loss, metrics

    model.train()
    skipped, grad_norm, metrics, notes = 0, float("nan"), None, []
    extra: dict[str, float] = {}
    if cfg.trust_region:
        extra |= {"tr_step_norm": math.nan, "tr_step_norm_after": math.nan, "tr_projected": 0}
    if cfg.grad_penalty:
        extra |= {"gp_grad_norm": math.nan, "gp_penalty": math.nan, "gp_hvp_norm": math.nan, "gp_active": 0}
    applied = False  # an optimizer step of this batch may have changed the weights
    try:
        for epoch in range(cfg.ppo_epochs):
            which = f"epoch {epoch + 1}/{cfg.ppo_epochs}"
            run.optimizer.zero_grad(set_to_none=True)
            loss, metrics = forward_loss(next(check))
            if run.dist.any(not bool(torch.isfinite(loss))):  # on any rank: every rank skips (they stay in step)
                skipped += 1  # non-finite loss: no backward, no step; the weights are untouched
                notes.append(f"{which}: loss {float(loss.detach())}: no backward, no optimizer step")
                continue
            loss.backward()
            if cfg.grad_penalty:  # g -> the gradient of L + lam/2 max(0, |g| - gamma)^2 (a second backward if active)
                gp = penalize_gradient(
                    run.params,
                    lambda: forward_loss(False)[0].backward(),
                    cfg.grad_penalty,
                    cfg.grad_penalty_gamma,
                    cfg.grad_penalty_radius,
                )
                extra |= {"gp_grad_norm": gp["grad_norm"], "gp_penalty": gp["penalty"], "gp_hvp_norm": gp["hvp_norm"]}
                extra["gp_active"] += gp["active"]
            grad_norm = float(torch.nn.utils.clip_grad_norm_(run.params, cfg.max_grad_norm))
            if not math.isfinite(grad_norm):
                skipped += 1  # non-finite gradient: drop it (Adam state and weights untouched)
                notes.append(f"{which}: gradient norm {grad_norm}: no optimizer step")
                run.optimizer.zero_grad(set_to_none=True)
                continue
            STOP.hold()  # from the first optimizer step to the step's commit, a Ctrl-C / SIGTERM waits
            if cfg.step_guard:
                run.guard.take()
            before, applied = applied, True
            old = [p.detach().clone() for p in run.params] if cfg.trust_region else None  # theta_old
            try:
                run.optimizer.step()
                if old is not None:  # the step projected onto ||theta - theta_old|| <= trust_region
                    norm, norm_after = project_step(run.params, old, cfg.trust_region)
                    extra |= {"tr_step_norm": norm, "tr_step_norm_after": norm_after}
                    extra["tr_projected"] += int(norm > cfg.trust_region)
                    del old
            except BaseException:
                if cfg.step_guard and not before:  # cut short inside the batch's first step: undo it entirely
                    run.guard.restore()
                    applied = False
                raise
            bad = run.guard.non_finite()
            if bad:
                names = ", ".join(bad[:3]) + (", ..." if len(bad) > 3 else "")
                if not cfg.step_guard:
                    raise TrainError(
                        f"the optimizer step of step {state.step + 1} ({which}) made {len(bad)} weight tensor(s) "
                        f"non-finite ({names}); stopping (--step-guard false). Nothing non-finite is saved: the "
                        f"last checkpoint (step {state.saved_step}) stays."
                    )
                run.guard.restore()
                applied = before
                skipped += 1
                notes.append(
                    f"{which}: the optimizer step made {len(bad)} weight tensor(s) non-finite ({names}): undone "
                    "(weights and optimizer state restored)"
                )
        run.optimizer.zero_grad(set_to_none=True)
        with warnings.catch_warnings():  # a skipped (non-finite) update still advances the schedule
            warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step\\(\\)` before")
            run.scheduler.step()
    except BaseException:
        state.torn = applied  # weights moved by a step that will never be committed: no checkpoint of this state
        raise
    return Update(metrics, grad_norm, skipped, notes, extra)


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
    run: Run,
    step: int,
    batch: Batch,
    groups: GroupSignals,
    update: Update,
    t0: float,
    t_gen: float,
    resampled: dict | None = None,
) -> dict:
    """The metrics.jsonl record of a step (its "kl" phase fills in `kl_from_init`, null on steps without a probe;
    its "log" phase adds `collapse`). The device-side numbers (advantage stats, the last epoch's loss metrics, the
    token count) reach the host in one copy; a metric the RL layer stops reporting is a KeyError here. The fields of
    the options that are off by default (ds_*, tr_*, gp_*) are there only when their option is on."""
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
    formatted = torch.tensor(sum(format_reward(t) for t in batch.texts) / len(batch.texts), dtype=torch.float64)
    rewards, correct = batch.rewards, batch.correct.float()
    if run.dist.enabled:  # the global batch's numbers: rank means of equal-sized shares, the rewards gathered
        keys = list(on_device)
        means = run.dist.mean(torch.stack([on_device[k].float() for k in keys] + [formatted.to(run.device)]))
        on_device = {k: means[i] for i, k in enumerate(keys)}
        on_device["n_tok"] = on_device["n_tok"] * run.dist.world
        formatted = means[-1]
        rewards = run.dist.cat(rewards.to(run.dist.device)).cpu()
        correct = run.dist.cat(correct.to(run.dist.device)).cpu()
    v = metrics_to_floats(on_device)
    lv = v if m is not None else NO_LOSS
    n_tok = int(round(v["n_tok"]))
    n_seq = len(rewards)
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
        "peak_mem_mb": peak_mem_mb(run.device),
        "train_peak_mem_mb": train_peak_mem_mb(run.device),
        "sample": batch.texts[0],
    }
    if resampled is not None:
        record |= resampling_record(run, resampled)
    return record | update.extra


def post_step_phases(cfg: TrainConfig, step: int) -> list[str]:
    """The phases due after step `step`'s optimizer step, in order."""
    phases = ["kl"] if cfg.kl_every and (step % cfg.kl_every == 0 or step == cfg.max_steps) else []
    phases.append("log")
    if cfg.eval_every and step % cfg.eval_every == 0 and step < cfg.max_steps:  # the last step has the final eval
        phases.append("eval")
    if cfg.save_every and step % cfg.save_every == 0:
        phases.append("save")
    return phases


def train_step(run: Run, state: LoopState) -> None:
    """Step `state.step + 1` up to its commit: rollout -> advantages and conflict weights (`prepare_groups`) ->
    `policy_update`; then, with signals held, the step counts: step, RNG states after it, its record, its phases."""
    cfg = run.cfg
    t0 = time.time()
    problems = run.task.sample(cfg.prompts_per_step, run.task_rng)  # the same on every rank of a torchrun job
    if run.dist.enabled:  # this rank's whole groups
        share = cfg.prompts_per_step // run.dist.world
        problems = problems[run.dist.rank * share : (run.dist.rank + 1) * share]
    batch = roll(run, problems)
    resampled = None
    if cfg.dynamic_sampling:  # constant groups dropped, replaced by new problems of this rank's own stream
        batch, resampled = dynamic_sampling(run, batch)
    t_gen = time.time() - t0
    rewards = batch.rewards.to(run.device)
    groups = prepare_groups(run.loss_cfg, rewards, batch.completion_ids, batch.completion_mask, cfg.group_size)
    update = None
    try:
        update = policy_update(run, state, batch, groups)  # holds signals from its first optimizer step on
        STOP.hold()
        record = step_record(run, state.step + 1, batch, groups, update, t0, t_gen, resampled)
    except BaseException:
        STOP.release(raise_pending=False)
        if update is not None and update.skipped < cfg.ppo_epochs:
            state.torn = True  # an optimizer step was applied but cannot be counted
        raise
    state.step += 1  # the commit
    state.rngs = rng_snapshot(run.task_rng, run.resample_rng)
    state.record = record
    state.pending = post_step_phases(cfg, state.step)
    state.finished = state.stopped_by_time_budget = False
    try:
        for note in update.notes:
            print(f"step {state.step}: update skipped, {note}")
        if run.engine is not None:  # after the commit: a failure here leaves a state that can be checkpointed
            run.engine.sync(run.model)
    except BaseException:
        STOP.release(raise_pending=False)
        raise
    STOP.release()  # a Ctrl-C / SIGTERM that came during the update stops the run now, with the step counted


HISTORY_KEYS = ("entropy_mean", "zero_var_frac", "accuracy")  # per step, kept in the checkpoint


def run_phase(run: Run, state: LoopState, log: MetricsLog, bar: TrainBar) -> None:
    """Runs the first pending phase: its work (interruptible: the phase stays pending, a resume runs it again), then,
    with signals held, its bookkeeping (so a checkpoint sees the phase either done or not done)."""
    phase = state.pending[0]
    if phase == "save":
        state.pending.pop(0)  # the checkpoint it writes has it done (a failed save is reported, the old one stays)
        save(run, state, log)
        return
    t = time.time()
    result = None
    if phase == "kl" and run.probe is not None:  # (no probe: --kl-every 0 on a resume; nothing to measure)
        result = kl_from_init(run)
    elif phase in ("before", "eval", "after"):
        result = heldout_eval(run, state.step, phase if phase != "eval" else None)
    with STOP.held():
        rec = state.record
        if phase == "kl":
            rec["kl_from_init"] = result
            dt = time.time() - t  # the probe's time is part of the step's
            rec["tokens_per_s"] *= rec["step_s"] / (rec["step_s"] + dt)
            rec["step_s"] += dt
        elif phase == "log":
            state.history.append({k: rec[k] for k in HISTORY_KEYS})
            rec["collapse"] = is_collapsed(state.history, run.cfg)
            log.write(rec)
            state.record = None
            bar.step(rec)
        else:
            log.write(result)
            ev = {k: v for k, v in result.items() if k not in ("step", "event")}
            if phase == "before":
                state.before = ev
            elif phase == "after":
                state.after, state.finished = ev, True
        state.pending.pop(0)


def over_budget(cfg: TrainConfig, state: LoopState, t_train: float) -> bool:
    if not cfg.time_budget_s or time.time() - t_train <= cfg.time_budget_s:
        return False
    if not state.stopped_by_time_budget:
        print(f"\ntime budget of {cfg.time_budget_s:.0f}s reached after {state.step} steps")
        state.stopped_by_time_budget = True
    return True


def run_to_end(run: Run, state: LoopState, log: MetricsLog, bar: TrainBar) -> None:
    """Pending phases first, then steps until `max_steps` or the time budget, then the final phases."""
    t_train = time.time()
    while True:
        STOP.stop_together(run.dist.any)  # torchrun job: a signal on any rank stops every rank here, together
        if state.pending:
            run_phase(run, state, log, bar)
        elif state.step < run.cfg.max_steps and not run.dist.any(over_budget(run.cfg, state, t_train)):
            train_step(run, state)
        elif not state.finished:  # training is over: checkpoint it (unless just done), the final eval, checkpoint
            state.pending = (["save"] if state.saved_step != state.step else []) + ["after", "save"]
        else:
            return


# ----------------------------------------------------------------------------------------------------- reporting


def bar_total(cfg: TrainConfig, start: int, step: int, elapsed: float) -> int:
    """The training bar's total: `max_steps`; with a time budget, the step at which the budget stops training at the
    pace so far when that comes first (a step starts while the budget is not spent), so the bar's ETA is the run's."""
    if not cfg.time_budget_s or step <= start:
        return cfg.max_steps
    left = cfg.time_budget_s - elapsed
    more = math.floor(left / (elapsed / (step - start))) + 1 if left >= 0 else 0
    return max(step, min(cfg.max_steps, step + more))


class TrainBar:
    """The training progress bar (tqdm, when `cfg.progress`): reward, entropy, grad norm; ETA within the budget."""

    def __init__(self, cfg: TrainConfig, start: int, name: str):
        self.cfg, self.start, self.t0 = cfg, start, time.time()
        self.bar = progress_bar(cfg, cfg.max_steps, name, initial=start, leave=True)

    def step(self, record: dict) -> None:
        if self.bar is None:
            return
        self.bar.set_postfix(
            reward=f"{record['reward_mean']:.2f}",
            H=f"{record['entropy_mean']:.2f}",
            gn=f"{record['grad_norm']:.2f}",
            refresh=False,
        )
        self.bar.total = bar_total(self.cfg, self.start, record["step"], time.time() - self.t0)
        self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def write_summary(run: Run, state: LoopState, stopped_by: str | None, t_start: float) -> dict:
    summary: dict = {"output_dir": str(run.out_dir), "preset": run.loss_cfg.name, "model": run.cfg.model}
    if state.before is not None:
        summary["before"] = state.before
    summary["steps"] = state.step
    if state.finished:
        summary["after"] = state.after
        if state.before is not None:
            compare_heldout(summary)
    if state.stopped_by_time_budget:
        summary["stopped_by_time_budget"] = True
    summary["wall_s"] = time.time() - t_start
    summary["interrupted"] = stopped_by is not None
    summary["signal"] = stopped_by
    summary["world_size"] = run.dist.world
    if run.dist.is_main:
        write_json(run.out_dir / "summary.json", summary, indent=2)
    return summary


# ----------------------------------------------------------------------------------------------------- the loop


def train(cfg: TrainConfig, loss_overrides: dict | None = None, model_and_tokenizer=None) -> dict:
    """Run RL training; returns a summary dict (also written to OUTPUT_DIR/summary.json). A Ctrl-C or SIGTERM
    checkpoints the run and returns (summary["interrupted"], summary["signal"]); any other exception checkpoints it
    (when the state is consistent) and propagates. The output directory is locked for the length of the call.

    Under torchrun (WORLD_SIZE > 1) every rank runs this: data-parallel over whole groups, rank 0 writes the files,
    the other ranks print nothing (README, "More than one device")."""
    t_start = time.time()
    ctx = from_env(cfg.device)
    try:
        if ctx.enabled:
            check_world(cfg, ctx)
        quiet = open(os.devnull, "w") if not ctx.is_main else None
        with contextlib.redirect_stdout(quiet) if quiet else contextlib.nullcontext():
            try:
                return _train(cfg, loss_overrides, model_and_tokenizer, ctx, t_start)
            finally:
                if quiet:
                    quiet.close()
    except BaseException as exc:
        # the traceback's frames hold the run and its DDP-wrapped model: free them before the group is destroyed
        # (distributed.shutdown says why); the traceback keeps every file and line, only the locals go (a job of one
        # keeps them, for a post-mortem debugger)
        if ctx.enabled:
            traceback.clear_frames(exc.__traceback__)
        raise
    finally:
        shutdown(ctx)


def check_world(cfg: TrainConfig, ctx: Dist) -> None:
    if cfg.prompts_per_step % ctx.world:
        raise Refused(
            f"--prompts-per-step {cfg.prompts_per_step} cannot be split into whole groups over {ctx.world} processes: "
            f"use a multiple of {ctx.world} (each rank rolls out prompts_per_step / {ctx.world} prompts)"
        )


def _train(cfg: TrainConfig, loss_overrides: dict | None, model_and_tokenizer, ctx: Dist, t_start: float) -> dict:
    if not ctx.is_main:
        cfg = dataclasses.replace(cfg, progress=False)
    loss_cfg = cfg.loss_config(loss_overrides)
    with RunLock(cfg.output_dir) if ctx.is_main else contextlib.nullcontext(), STOP:
        STOP.collective = ctx.enabled
        ckpt = open_output_dir(cfg, loss_cfg) if ctx.is_main else None  # refuses a mix of runs; --resume: checked
        ctx.barrier()  # (rank 0 may have deleted an old run: --overwrite)
        if cfg.resume and not ctx.is_main:
            ckpt = read_checkpoint(Path(cfg.output_dir) / "checkpoint" / STATE_FILE)
        if ckpt is not None and ckpt["world_size"] != ctx.world:
            raise Refused(
                f"--resume: {cfg.output_dir} was trained by {ckpt['world_size']} process(es), this job has "
                f"{ctx.world}: resume with the same number (torchrun --nproc_per_node {ckpt['world_size']})"
            )
        run = setup(cfg, loss_overrides, model_and_tokenizer, ctx)
        state, keep = resume(run, ckpt) if ckpt is not None else (fresh_state(run), None)
        reset_train_peak(run.device)  # train_peak_mem_mb: from here on (the models are resident, loading is over)
        if state.finished and state.step >= cfg.max_steps and not state.pending:
            print(f"nothing to do: the run finished at step {state.step} (raise --max-steps to train further)")
        stopped_by = None
        log_file = MetricsLog(run.out_dir / "metrics.jsonl", keep) if ctx.is_main else NullLog(keep)
        with log_file as log:
            bar = TrainBar(cfg, state.step, run.loss_cfg.name)
            try:
                run_to_end(run, state, log, bar)
            except BaseException as exc:
                bar.close()
                emergency_save(run, state, log, exc)
                if not isinstance(exc, KeyboardInterrupt):
                    raise
                stopped_by = signal_name(exc)
            finally:
                bar.close()
        summary = write_summary(run, state, stopped_by, t_start)
    print(f"done in {summary['wall_s']:.0f}s; metrics in {run.out_dir / 'metrics.jsonl'}")
    return summary
