"""Dynamic sampling (`--dynamic-sampling`; DAPO, Yu et al. 2025, arXiv 2503.14476, section 3.2): a group whose
rewards are all equal (solved or all-fail) carries no group-relative signal, so it is dropped and new problems are
rolled out in its place, until the batch holds as many informative groups as it had groups or
`--dynamic-sampling-max-tries` rollouts were made. The extra problems come from a stream of this rank's own (saved
in checkpoints); each step's first problems are drawn as without it."""

from __future__ import annotations

import random
from collections.abc import Callable

import torch
from torch import Tensor

from ..distributed import Dist
from ..features.base import Feature
from ..rollout import Batch, concat_batches
from ..run.rng import is_random_state, random_state, set_random_state
from ..tasks.base import sample_checked


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
        None if batch.sampler_logp is None else take(batch.sampler_logp),
    )


def resample(
    batch: Batch, roll: Callable[[list], Batch], draw: Callable[[int], list], group_size: int, max_tries: int, pad_id
) -> tuple[Batch, dict]:
    """Drop the constant groups of `batch` and roll out `draw(n)` new problems until the batch holds as many
    informative groups as it had groups, or `max_tries` rollouts (the first included) were made. Then, if it is
    short, it trains on what there is: the informative groups filled up with the first constant groups drawn, so the
    batch keeps its size (under torchrun every rank keeps equal numbers of completions, which the loss's rank
    decomposition needs; a constant group adds no policy gradient under group-relative advantages, only to the
    denominators, as it did without dynamic sampling).

    The kept groups stay in the order drawn. -> (the batch to train on, this rank's counts: "tries" (rollouts),
    "resampled" (groups drawn after the first rollout), "constant" (constant groups among all drawn), "filled"
    (constant groups trained because the cap was hit), "capped" (fewer informative groups than needed), "rollouts"
    (completions generated), "reward_sum" (over every completion generated)). With one rollout the batch is returned
    as it was."""
    g = group_size
    need = len(batch.texts) // g
    drawn, const = [batch], constant_groups(batch.rewards, g)
    while const.count(False) < need and len(drawn) < max_tries:
        more = roll(draw(need - const.count(False)))
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
    return select_groups(concat_batches(drawn, pad_id), keep, g), counts


def resampling_record(dist: Dist, counts: dict) -> dict:
    """The record's dynamic-sampling fields, over every rank of a torchrun job (one gather of plain numbers)."""
    parts = dist.objects(counts)
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


class DynamicSampling(Feature):
    name = "dynamic_sampling"

    def __init__(self, task, rng: random.Random, group_size: int, max_tries: int, pad_id, dist: Dist):
        self.task, self.rng, self.pad_id, self.dist = task, rng, pad_id, dist
        self.group_size, self.max_tries = group_size, max_tries
        self.counts: dict | None = None

    def after_rollout(self, batch: Batch, roll: Callable[[list], Batch]) -> Batch:
        def draw(n: int) -> list:
            return sample_checked(self.task, n, self.rng)

        batch, self.counts = resample(batch, roll, draw, self.group_size, self.max_tries, self.pad_id)
        return batch

    def record(self, record: dict) -> dict:
        return resampling_record(self.dist, self.counts)

    def state_dict(self) -> dict:
        return {"rng": random_state(self.rng)}

    def load_state_dict(self, state: dict) -> None:
        if not is_random_state(state.get("rng")):
            raise ValueError("bad resample RNG state")
        set_random_state(self.rng, state["rng"])


def from_run(cfg, run) -> DynamicSampling | None:
    if not cfg.dynamic_sampling:
        return None
    rng = random.Random(f"resample-{cfg.seed}-{run.dist.rank}")
    return DynamicSampling(
        run.task, rng, cfg.group_size, cfg.dynamic_sampling_max_tries, run.tok.pad_token_id, run.dist
    )
