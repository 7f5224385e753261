"""Mechanism metrics of a step (`--log-mechanism`): how far the step's update moved the weights, and what it did to
the likelihood of the step's own completions.

- `update_norm`: ||theta_after - theta_before||, the L2 norm of the change of all trained parameters taken together
  over the whole step (every PPO epoch; an update the step guard undid changes nothing: 0), accumulated in float64.
- likelihood displacement: for each completion i of the step, the mean over its completion tokens of
  log pi_new(y_t) - log pi_old(y_t), pi_old the weights the loss of the first pass saw (the rollout's policy as the
  trainer computes it) and pi_new the weights after the step, both at the trainer's temperature, with the op the loss
  uses. Its means over the correct completions (`batch.correct`), the wrong ones, and the correct ones that share a
  token with a wrong completion of their group: the RL layer's own conflict detection, `conflict_weights(...,
  detect="anywhere")` (a token id that occurs anywhere in a wrong completion of the group), and of those the fraction
  whose mean log-prob went down (`ld_displaced_frac`: likelihood displacement of correct answers).

The displacement is reduced as sums and counts (`displacement_sums`), so that the ranks of a torchrun job add up to
the global batch's means exactly (`displacement_fields`); an empty set gives NaN (null in metrics.jsonl).

A feature (`MechanismLog`), first in the record: it snapshots the weights before the update, asks the step to keep
the policy's log-probs before it (`wants_old_logp`: the first pass's own, from its hidden states, or the PPO epochs'
old log-probs), measures after the update (`after_update`) and adds its fields to the record.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from sgrpo_kernels.rl import conflict_weights, metrics_to_floats

from ..features.base import Feature, snapshot, step_norm
from ..policy import token_logprobs

# displacement_sums' entries, in order: (sum of the per-completion mean displacements, count) of the correct
# completions that share a token with a wrong one, of all correct ones, of the wrong ones; and how many of the first
# set went down
SUMS = ("ld_sum_cs", "ld_n_cs", "ld_sum_c", "ld_n_c", "ld_sum_w", "ld_n_w", "ld_n_down")
FIELDS = ("ld_correct_shared", "ld_correct", "ld_wrong", "ld_displaced_frac")


def shared_with_wrong(completion_ids: Tensor, completion_mask: Tensor, correct: Tensor, group_size: int) -> Tensor:
    """[N] bool: correct completions that hold a token id which some wrong completion of their group holds anywhere
    (the conflicts of `conflict_weights(detect="anywhere")` with advantage +1 for a correct, -1 for a wrong one)."""
    correct = correct.to(device=completion_ids.device, dtype=torch.bool)
    sign = torch.where(correct, 1.0, -1.0).to(torch.float32)
    _, counts = conflict_weights(completion_ids, completion_mask, sign, group_size, strategy="skip", detect="anywhere")
    return correct & (counts > 0)


@torch.no_grad()
def displacement_sums(old_logp: Tensor, new_logp: Tensor, mask: Tensor, correct: Tensor, shared: Tensor) -> Tensor:
    """float64 [7], the entries of `SUMS`. Per completion d_i = mean over its valid tokens (mask [N, T]) of
    new_logp - old_logp (both [N, T]); completions without a valid token belong to no set. `correct`, `shared`: [N]
    bool (`shared`: correct completions that share a token with a wrong one)."""
    valid = mask.to(torch.bool)
    diff = torch.where(valid, new_logp.to(torch.float64) - old_logp.to(torch.float64), 0.0)
    n_tok = valid.sum(dim=1)
    d = diff.sum(dim=1) / n_tok.clamp(min=1)
    has = n_tok > 0
    correct, shared = correct.to(d.device, torch.bool) & has, shared.to(d.device, torch.bool) & has
    cs, wrong = correct & shared, ~correct & has

    def total(sel: Tensor) -> Tensor:
        return torch.where(sel, d, 0.0).sum()

    count = [sel.sum().to(torch.float64) for sel in (cs, correct, wrong, cs & (d < 0))]
    return torch.stack([total(cs), count[0], total(correct), count[1], total(wrong), count[2], count[3]])


def displacement_fields(sums: dict[str, float], world: int = 1) -> dict:
    """The record's fields from the `SUMS` values (or from their means over `world` ranks: the ratios are the same):
    `ld_correct_shared`, `ld_correct`, `ld_wrong`, `ld_displaced_frac` (NaN for an empty set) and the global counts
    `ld_n_correct_shared`, `ld_n_correct`, `ld_n_wrong`."""

    def ratio(num: str, den: str) -> float:
        return sums[num] / sums[den] if sums[den] > 0 else math.nan

    return {
        "ld_correct_shared": ratio("ld_sum_cs", "ld_n_cs"),
        "ld_correct": ratio("ld_sum_c", "ld_n_c"),
        "ld_wrong": ratio("ld_sum_w", "ld_n_w"),
        "ld_displaced_frac": ratio("ld_n_down", "ld_n_cs"),
        "ld_n_correct_shared": int(round(sums["ld_n_cs"] * world)),
        "ld_n_correct": int(round(sums["ld_n_c"] * world)),
        "ld_n_wrong": int(round(sums["ld_n_w"] * world)),
    }


def likelihood_displacement(old_logp: Tensor, new_logp: Tensor, mask: Tensor, correct: Tensor, shared: Tensor) -> dict:
    """`displacement_fields` of one batch (a single process)."""
    values = displacement_sums(old_logp, new_logp, mask, correct, shared).tolist()
    return displacement_fields(dict(zip(SUMS, values)))


@torch.no_grad()
def measure(run, batch, old_logp: Tensor | None, before: list[Tensor]) -> tuple[float, dict[str, Tensor]]:
    """After the step's optimizer passes: (`update_norm`, the displacement's `SUMS` as on-device 0-d tensors). One
    more forward of the step's completions under the new weights (forward only, no logits), on this rank's batch."""
    norm = step_norm(run.params, before)
    g = run.sampling.group_size
    if old_logp is None:  # no loss was computed this step: nothing to compare with
        return norm, {k: torch.zeros((), dtype=torch.float64, device=run.device) for k in SUMS}
    new = token_logprobs(run.model, batch, run.sampling.temperature, run.backend, g, False, run.sampling.support())
    shared = shared_with_wrong(batch.completion_ids, batch.completion_mask, batch.correct, g)
    sums = displacement_sums(old_logp, new, batch.completion_mask.to(new.device), batch.correct, shared)
    return norm, dict(zip(SUMS, sums.unbind()))


class MechanismLog(Feature):
    name = "mechanism"
    wants_old_logp = True

    def __init__(self, run):
        self.run = run  # its params, model, sampling and process group, read at each step
        self.before: list[Tensor] | None = None
        self.norm, self.sums = math.nan, None

    def before_update(self) -> None:
        self.before = snapshot(self.run.params)  # theta_old

    def after_update(self, batch, update) -> None:
        self.norm, self.sums = measure(self.run, batch, update.old_logp, self.before)
        self.before = None

    def record(self, record: dict) -> dict:
        """`update_norm` and the displacement's fields; under torchrun the sums are the ranks' means (as float32, as
        the record's other on-device numbers), whose ratios are the global batch's."""
        sums, dist = self.sums, self.run.dist
        if dist.enabled:
            means = dist.mean(torch.stack([sums[k].float() for k in SUMS]))
            sums = {k: means[i] for i, k in enumerate(SUMS)}
        fields = displacement_fields(metrics_to_floats(sums), dist.world if dist.enabled else 1)
        return {"update_norm": self.norm, **fields}


def from_run(cfg, run) -> MechanismLog | None:
    return MechanismLog(run) if cfg.log_mechanism else None
