"""Backend registry.

A backend is a module that implements the four entry points below on 2-D/1-D tensors (the public ops flatten leading
dims before calling them and validate every input first, so backends may assume well-formed arguments):

```
linear_logprobs_fwd(hidden (N, D), weight (V, D), targets (N,) int64, bias (V,) | None, opts: Options)
    -> (logp (N,) fp32, entropy (N,) fp32 or empty (0,) when not opts.return_entropy, lse (N,) fp32 or empty (0,)
        when not opts.need_lse)
linear_logprobs_bwd(grad_logp (N,) fp32, grad_entropy (N,) fp32 | None, hidden, weight, targets, bias,
                    lse (N,) fp32, entropy (N,) fp32 | None, opts: Options)
    -> (grad_hidden (N, D) hidden.dtype, grad_weight (V, D) weight.dtype, grad_bias (V,) bias.dtype | None)
       (grad_hidden may be None when not opts.need_grad_hidden; grad_weight and grad_bias when not
       opts.need_grad_weight)
logprobs_from_logits_fwd(logits (N, V), targets (N,), opts) -> (logp, entropy | empty, lse | empty)
logprobs_from_logits_bwd(grad_logp, grad_entropy | None, logits, targets, lse, entropy | None, opts)
    -> grad_logits (N, V) logits.dtype; when opts.inplace_backward, the gradient is written into `logits` itself and
       `logits` is returned.
```

Rows whose target equals `opts.ignore_index` produce logp = 0, entropy = 0 and no gradient. `grad_entropy is None`
means the entropy output received no gradient (or was not requested).

Each backend module also defines `is_available() -> tuple[bool, str]` (the reason when False) and
`DEVICE_TYPES: tuple[str, ...]` (device types it serves; "*" = any).
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from types import ModuleType

import torch

# name -> module path.
_BACKENDS: dict[str, str] = {
    "triton": "sgrpo_kernels.backends.triton_backend",
    "npu": "sgrpo_kernels.backends.npu_backend",
    "torch": "sgrpo_kernels.backends.torch_chunked",
}

# Auto-selection: per device type, the first available backend of this list wins; "torch" is the universal fallback.
# (Triton also runs CPU tensors under TRITON_INTERPRET=1, but only when asked for by name.)
_AUTO: dict[str, tuple[str, ...]] = {"cuda": ("triton", "torch"), "npu": ("npu", "torch")}

ENV_BACKEND = "SGRPO_BACKEND"


def stats_dtype(input_dtype: torch.dtype) -> torch.dtype:
    """dtype of logp / entropy / lse (and of the torch backend's accumulation): fp32, or fp64 for fp64 inputs."""
    return torch.float64 if input_dtype == torch.float64 else torch.float32


_ENV_TRUE, _ENV_FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def env_flag(name: str, default: bool) -> bool:
    """A boolean environment variable: 1/0, true/false, yes/no, on/off (any case); unset or empty = `default`."""
    value = os.environ.get(name, "").strip().lower()
    if not value:
        return default
    if value not in _ENV_TRUE + _ENV_FALSE:
        raise ValueError(f"env {name}={value!r}: expected one of 1/0, true/false, yes/no, on/off")
    return value in _ENV_TRUE


@dataclass(frozen=True)
class Options:
    """Per-call options shared by every backend."""

    temperature: float = 1.0
    ignore_index: int = -100
    return_entropy: bool = True
    need_lse: bool = True  # False for no-grad calls: nothing is kept for backward
    memory_budget: int = 0  # bytes for temporaries; 0 = backend default
    deterministic: bool = False  # bitwise reproducible gradients (fast backends may be slower)
    inplace_backward: bool = False  # logprobs_from_logits: write grad_logits into the logits buffer
    need_grad_hidden: bool = True  # linear_logprobs_bwd may return None for a gradient that is not needed
    need_grad_weight: bool = True  # (grad_weight and grad_bias); e.g. a frozen LM head under LoRA


class BackendUnavailableError(RuntimeError):
    """Raised when a requested backend cannot run here (not installed, wrong device, ...)."""


def backend_names() -> tuple[str, ...]:
    return tuple(_BACKENDS)


def _load(name: str) -> ModuleType:
    try:
        return importlib.import_module(_BACKENDS[name])
    except ImportError as exc:  # the module itself or one of its dependencies is missing
        raise BackendUnavailableError(f"backend {name!r} could not be imported: {exc}") from exc


def _status(name: str) -> tuple[bool, str]:
    try:
        mod = _load(name)
    except BackendUnavailableError as exc:
        return False, str(exc)
    return mod.is_available()


def available_backends() -> dict[str, str]:
    """Map each known backend to "available" or the reason it is not."""
    out = {}
    for name in _BACKENDS:
        ok, why = _status(name)
        out[name] = "available" if ok else why
    return out


def _serves(mod: ModuleType, device_type: str) -> bool:
    types = mod.DEVICE_TYPES
    return "*" in types or device_type in types


@torch.compiler.assume_constant_result
def resolve(requested: str | None, device: torch.device) -> str:
    """Pick the backend for tensors on `device`.

    `requested` (the keyword) wins over env SGRPO_BACKEND, which wins over auto-selection by device type.
    A requested backend that cannot run raises BackendUnavailableError naming the backend and why.
    """
    source = "keyword backend="
    if requested is None or requested == "auto":
        requested = os.environ.get(ENV_BACKEND) or None
        source = f"env {ENV_BACKEND}="
    if requested is not None and requested != "auto":
        if requested == "reference":
            raise BackendUnavailableError(
                "backend 'reference' is the test/benchmark specification, not a backend: "
                "use sgrpo_kernels.reference directly"
            )
        if requested not in _BACKENDS:
            raise ValueError(f"{source}{requested!r}: unknown backend; expected one of {sorted(_BACKENDS)} or 'auto'")
        ok, why = _status(requested)
        if not ok:
            raise BackendUnavailableError(f"backend {requested!r} ({source}{requested!r}) is unavailable: {why}")
        mod = _load(requested)
        if not _serves(mod, device.type):
            raise BackendUnavailableError(
                f"backend {requested!r} ({source}{requested!r}) does not run on {device.type} tensors; "
                f"it serves {list(mod.DEVICE_TYPES)}"
            )
        return requested
    for name in _AUTO.get(device.type, ("torch",)):
        ok, _ = _status(name)
        if ok and _serves(_load(name), device.type):
            return name
    raise BackendUnavailableError(f"no backend serves {device.type} tensors: {available_backends()}")


def get(name: str) -> ModuleType:
    return _load(name)
