"""Shared fixtures: the op suite runs once per backend that can serve the test device.

- `torch` always (CPU).
- `triton` on CPU tensors only under TRITON_INTERPRET=1 (the interpreter), and on CUDA when a GPU is present.
- GPU-only parametrizations are skipped cleanly on machines without CUDA.
"""

from __future__ import annotations

import os

import pytest
import torch

from sgrpo_kernels import backends


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
