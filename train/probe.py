"""The KL-from-init probe: completions sampled once from the initial policy, with their initial log-probs cached in
the run directory (so no reference model stays resident and a resumed run uses the same probe), and the k3 estimate
of KL(pi_init || pi) on them."""

from __future__ import annotations

import random
from pathlib import Path

import torch

from sgrpo_kernels.validation import check_target_values

from .model import head_weight
from .policy import completion_targets, token_logprobs
from .rollout import Batch, Sampling, concat_batches, rollout
from .run.checkpoint import load_probe, save_probe
from .run.progress import progress_bar
from .run.rng import fork_rng
from .tasks.base import sample_checked

PROBE_CHUNK = 4  # probe prompts per rollout call (the bar's unit)


def kl_probe(cfg, model, tok, task, system_prompt: str | None, path: Path, device, write: bool = True) -> dict | None:
    """The probe ({"batch", "logp0"}), or None when `cfg.kl_every` is 0. A resumed run reads it back from `path`;
    its targets are range-checked here, once: the per-step KL (`kl_from_init`) skips that check."""
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
    problems = sample_checked(task, cfg.probe_size, random.Random(f"probe-{cfg.seed}"))
    bar = progress_bar(cfg.progress, len(problems), "KL probe (sampling from the initial policy)")
    chunks = []
    with fork_rng(device):
        torch.manual_seed(cfg.seed + 777)
        for i in range(0, len(problems), PROBE_CHUNK):
            chunk = problems[i : i + PROBE_CHUNK]
            chunks.append(rollout(model, tok, chunk, **Sampling.of(cfg, system_prompt, group_size=1).kwargs()))
            if bar is not None:
                bar.update(len(chunk))
    if bar is not None:
        bar.close()
    probe_batch = concat_batches(chunks, tok.pad_token_id)
    probe = {"batch": probe_batch, "logp0": token_logprobs(model, probe_batch, cfg.temperature, cfg.backend, 1)}
    if write:  # (every rank of a torchrun job computes the same probe; rank 0 writes it)
        save_probe(path, probe_batch, probe["logp0"])
    return probe


def kl_from_init(model, probe: dict, temperature: float, backend: str | None) -> float:
    """k3 estimate of KL(pi_init || pi) on the probe completions (sampled from the initial policy), >= 0."""
    batch = probe["batch"]
    logp = token_logprobs(model, batch, temperature, backend, 1, check_targets=False)
    d = (logp - probe["logp0"])[batch.completion_mask]  # log(pi / pi_init) on init samples
    return float((d.exp() - 1 - d).mean())
