"""Backend registry: which backends exist, which can run here, and which one serves a device.

Each backend is imported lazily by a loader below (a plain import statement: importing triton or torch_npu costs
seconds, or fails where they are not installed). An ImportError becomes :class:`BackendUnavailableError` with the
reason, and a module that does not satisfy :class:`~sgrpo_kernels.backends.contract.Backend` is refused.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from types import ModuleType

import torch

from sgrpo_kernels.backends.contract import Backend, BackendUnavailableError

__all__ = ["BackendUnavailableError", "available_backends", "backend_names", "get", "resolve"]

ENV_BACKEND = "SGRPO_BACKEND"


def _load_triton() -> ModuleType:
    from sgrpo_kernels.backends import triton_backend

    return triton_backend


def _load_npu() -> ModuleType:
    from sgrpo_kernels.backends import npu_backend

    return npu_backend


def _load_torch() -> ModuleType:
    from sgrpo_kernels.backends import torch_chunked

    return torch_chunked


_LOADERS: dict[str, Callable[[], ModuleType]] = {"triton": _load_triton, "npu": _load_npu, "torch": _load_torch}

# Auto-selection: per device type, the first available backend of this list wins; "torch" is the universal fallback.
# (Triton also runs CPU tensors under TRITON_INTERPRET=1, but only when asked for by name.)
_AUTO: dict[str, tuple[str, ...]] = {"cuda": ("triton", "torch"), "npu": ("npu", "torch")}


def backend_names() -> tuple[str, ...]:
    return tuple(_LOADERS)


def get(name: str) -> Backend:
    """The backend module `name`; BackendUnavailableError when it cannot be imported."""
    try:
        mod = _LOADERS[name]()
    except ImportError as exc:  # the module itself or one of its dependencies is missing
        raise BackendUnavailableError(f"backend {name!r} could not be imported: {exc}") from exc
    if not isinstance(mod, Backend):
        missing = [m for m in ("DEVICE_TYPES", "is_available", "linear_logprobs_fwd", "linear_logprobs_bwd",
                               "logprobs_from_logits_fwd", "logprobs_from_logits_bwd") if not hasattr(mod, m)]
        raise BackendUnavailableError(f"backend {name!r} does not implement the backend contract: missing {missing}")
    return mod


def _status(name: str) -> tuple[bool, str]:
    try:
        mod = get(name)
    except BackendUnavailableError as exc:
        return False, str(exc)
    return mod.is_available()


def available_backends() -> dict[str, str]:
    """Map each known backend to "available" or the reason it is not."""
    return {name: ("available" if ok else why) for name in _LOADERS for ok, why in [_status(name)]}


def _serves(mod: Backend, device_type: str) -> bool:
    return "*" in mod.DEVICE_TYPES or device_type in mod.DEVICE_TYPES


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
        if requested not in _LOADERS:
            raise ValueError(f"{source}{requested!r}: unknown backend; expected one of {sorted(_LOADERS)} or 'auto'")
        ok, why = _status(requested)
        if not ok:
            raise BackendUnavailableError(f"backend {requested!r} ({source}{requested!r}) is unavailable: {why}")
        mod = get(requested)
        if not _serves(mod, device.type):
            raise BackendUnavailableError(
                f"backend {requested!r} ({source}{requested!r}) does not run on {device.type} tensors; "
                f"it serves {list(mod.DEVICE_TYPES)}"
            )
        return requested
    for name in _AUTO.get(device.type, ("torch",)):
        ok, _ = _status(name)
        if ok and _serves(get(name), device.type):
            return name
    raise BackendUnavailableError(f"no backend serves {device.type} tensors: {available_backends()}")
