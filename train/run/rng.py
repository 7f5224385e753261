"""The random streams of a run: snapshots for checkpoints, restoring them, and forking them for work (evaluation, the
KL probe) that must not move the training stream."""

from __future__ import annotations

import random

import torch


def random_state(rng: random.Random) -> list:
    """A `random.Random` state as plain values: [version, [625 ints], gauss_next]."""
    version, internal, gauss = rng.getstate()
    return [version, list(internal), gauss]


def set_random_state(rng: random.Random, state: list) -> None:
    version, internal, gauss = state
    rng.setstate((version, tuple(internal), gauss))


def is_random_state(state) -> bool:
    """A `random.Random` state as `random_state` stores it."""
    return (
        isinstance(state, list | tuple)
        and len(state) == 3
        and isinstance(state[0], int)
        and isinstance(state[1], list | tuple)
        and all(isinstance(x, int) for x in state[1])
        and (state[2] is None or isinstance(state[2], float))
    )


def rng_snapshot(task_rng: random.Random) -> dict:
    """The generators of a training step that belong to the loop: torch (sampling), the task's problem sampler and
    CUDA's. A feature's own generator is part of its `state_dict`."""
    return {
        "torch": torch.get_rng_state(),
        "task": random_state(task_rng),
        "cuda": list(torch.cuda.get_rng_state_all()) if torch.cuda.is_available() else None,
    }


def restore_rng(rngs: dict, task_rng: random.Random) -> None:
    """The inverse of `rng_snapshot`."""
    torch.set_rng_state(rngs["torch"])
    if rngs["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rngs["cuda"])
    set_random_state(task_rng, rngs["task"])


def fork_rng(device: torch.device):
    """torch.random.fork_rng over the CPU generator and, on CUDA, the device's: what the forked code draws never
    reaches the training stream."""
    return torch.random.fork_rng(devices=[device] if device.type == "cuda" else [])
