"""Checkpoints: OUTPUT_DIR/checkpoint/state.pt (trained weights, optimizer, scheduler, RNG states, step, history) and
the RNG snapshot it stores, so that --resume replays the next step exactly."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import torch


def rng_snapshot(task_rng: random.Random) -> dict:
    """Every generator a training step draws from: torch (sampling), the task's problem sampler, CUDA."""
    return {
        "torch_rng": torch.get_rng_state(),
        "task_rng": task_rng.getstate(),
        "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
    }


def save_checkpoint(path: Path, model, optimizer, scheduler, step: int, rngs: dict, history, cfg):
    """`rngs` is the RNG state at the *start* of step `step + 1` (a Ctrl-C mid-step has already advanced the live
    generators), so --resume replays that step exactly."""
    path.mkdir(parents=True, exist_ok=True)
    trainable = {n: p.detach().cpu() for n, p in model.named_parameters() if p.requires_grad}
    state = {
        "step": step,
        "trainable": trainable,  # full weights of trained layers, or the LoRA adapter; frozen ones are the base model
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        **rngs,
        "history": history,
        "config": dataclasses.asdict(cfg),
    }
    tmp = path / "state.pt.tmp"
    torch.save(state, tmp)
    tmp.replace(path / "state.pt")  # atomic: a Ctrl-C during the save never leaves a torn checkpoint


def load_checkpoint(path: Path, model, optimizer, scheduler, task_rng: random.Random):
    """Restore what `save_checkpoint` wrote (weights, optimizer, scheduler, RNG states); returns (step, history)."""
    state = torch.load(path / "state.pt", weights_only=False)
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, value in state["trainable"].items():
            params[name].copy_(value)
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    torch.set_rng_state(state["torch_rng"])
    if state["cuda_rng"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda_rng"])
    task_rng.setstate(state["task_rng"])
    return state["step"], state["history"]
