"""Shared fixtures: the op suite runs once per backend that can serve the test device.

- `torch` always (CPU).
- `triton` on CPU tensors only under TRITON_INTERPRET=1 (the interpreter), and on CUDA when a GPU is present.
- GPU-only parametrizations are skipped cleanly on machines without CUDA.

And `tiny_cfg`, the trainer tests' configuration of a tiny run (`from conftest import tiny_cfg`: pytest puts tests/
on sys.path, as for `from procs import spawn`).
"""

from __future__ import annotations

import os

import pytest
import torch

from sgrpo_kernels import backends

# A run of the tiny random-weight Llama (train.model.tiny_model_and_tokenizer: no download) that takes seconds: 3 steps
# of 2 prompts x 4 completions of at most 6 tokens, a small held-out set and KL probe, no progress bars. Each test file
# states its own changes to it where it calls `tiny_cfg`.
TINY_RUN = {"model": "tiny", "max_steps": 3, "prompts_per_step": 2, "group_size": 4, "max_new_tokens": 6}
TINY_RUN |= {"eval_problems": 6, "eval_k": 2, "eval_k_problems": 3, "probe_size": 3, "kl_every": 1, "progress": False}
TINY_RUN |= {"warmup_steps": 1, "lr": 1e-3}
# a step record's timing fields: they differ between identical runs, so record comparisons leave them out
TIMING = ("tokens_per_s", "gen_s", "step_s", "sync_s", "peak_mem_mb", "train_peak_mem_mb")


def assert_refused(call, exc: type[BaseException], words) -> None:
    """`call()` raises `exc` whose message names every one of `words` (a string or a list of them)."""
    with pytest.raises(exc) as info:
        call()
    for w in [words] if isinstance(words, str) else words:
        assert w in str(info.value), (w, str(info.value))


class NanGrad(torch.autograd.Function):
    """Identity forward, NaN gradient backward: a loss whose backward poisons every gradient (the trainer's
    non-finite-gradient paths)."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        return g * float("nan")


def tiny_argv(output_dir, *extra: str) -> list[str]:
    """The command line of a smaller tiny run (2 x 2 completions of at most 4 tokens), then `extra` flags."""
    sizes = {"prompts-per-step": 2, "group-size": 2, "max-new-tokens": 4, "eval-problems": 4, "eval-k": 2}
    flags = [a for k, v in {**sizes, "probe-size": 2, "output-dir": output_dir, "progress": "false"}.items()
             for a in (f"--{k}", str(v))]  # fmt: skip
    return ["--model", "tiny", *flags, *extra]


def tiny_cfg(output_dir, **overrides):
    """The TrainConfig of `TINY_RUN` writing to `output_dir`, with `overrides` (any TrainConfig field)."""
    from train.config import TrainConfig  # (imported when used: the op tests do not need the trainer)

    return TrainConfig(**{**TINY_RUN, "output_dir": str(output_dir), **overrides})


def _cpu_backends() -> list[str]:
    names = ["torch"]
    if os.environ.get("TRITON_INTERPRET") == "1" and backends.available_backends().get("triton") == "available":
        names.append("triton")
    return names


def _cases() -> list:
    cases = [pytest.param(("cpu", name), id=f"cpu-{name}") for name in _cpu_backends()]
    for name in ("torch", "triton"):
        cases.append(
            pytest.param(
                ("cuda", name),
                id=f"cuda-{name}",
                marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
            )
        )
    return cases


@pytest.fixture(params=_cases())
def dev_backend(request) -> tuple[str, str]:
    device, name = request.param
    if device == "cuda":
        status = backends.available_backends().get(name)
        if status != "available":
            pytest.skip(f"backend {name} unavailable: {status}")
    return device, name
