"""Input checks at the public boundary: errors a user can act on, raised before any backend runs."""

from __future__ import annotations

import math
import numbers

import torch

_FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


def _shape(t: torch.Tensor) -> str:
    return str(tuple(t.shape))


def _check_tensor(name: str, x: object) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    return x


def _check_float(name: str, x: torch.Tensor) -> None:
    if x.dtype not in _FLOAT_DTYPES:
        raise TypeError(
            f"{name} must be a floating tensor (float32, bfloat16, float16 or float64), got dtype {x.dtype}"
        )


def check_temperature(temperature: object) -> float:
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
        raise TypeError(f"temperature must be a Python float, got {type(temperature).__name__}")
    t = float(temperature)
    if not math.isfinite(t) or t <= 0.0:
        raise ValueError(f"temperature must be a finite number > 0, got {temperature!r}")
    return t


_INT64 = (-(2**63), 2**63 - 1)


def check_ignore_index(ignore_index: object) -> int:
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, int):
        raise TypeError(f"ignore_index must be a Python int, got {type(ignore_index).__name__}")
    if not _INT64[0] <= ignore_index <= _INT64[1]:
        raise ValueError(f"ignore_index must fit in int64 (targets are int64), got {ignore_index}")
    return ignore_index


def check_flag(name: str, value: object) -> bool:
    """A boolean keyword: a str such as "False" would otherwise count as True."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__} {value!r}")
    return value


def check_memory_budget(memory_budget: object) -> int:
    """Bytes: a non-negative int below 2**63 (0 = the backend's default)."""
    if isinstance(memory_budget, bool) or not isinstance(memory_budget, numbers.Integral):
        raise TypeError(f"memory_budget must be an int number of bytes or None, got {type(memory_budget).__name__} "
                        f"{memory_budget!r}")
    value = int(memory_budget)
    if not 0 <= value <= _INT64[1]:
        raise ValueError(f"memory_budget must be in [0, 2**63) bytes (0 = the backend's default), got {value}")
    return value


def check_targets(targets: object, lead: torch.Size, lead_name: str, device: torch.device) -> torch.Tensor:
    targets = _check_tensor("targets", targets)
    if targets.dtype == torch.bool or targets.is_floating_point() or targets.is_complex():
        raise TypeError(f"targets must be an integer tensor (e.g. int64 or int32), got dtype {targets.dtype}")
    if targets.shape != lead:
        raise ValueError(
            f"targets has shape {_shape(targets)}, expected the leading shape of {lead_name}, {tuple(lead)}"
        )
    if targets.device != device:
        raise ValueError(f"targets is on {targets.device}, expected {device} (the device of {lead_name})")
    return targets


def check_linear_inputs(
    hidden: object, weight: object, targets: object, bias: object, temperature: object, ignore_index: object
) -> tuple[float, int]:
    hidden = _check_tensor("hidden", hidden)
    weight = _check_tensor("weight", weight)
    _check_float("hidden", hidden)
    _check_float("weight", weight)
    if hidden.dim() < 1:
        raise ValueError("hidden must have shape (..., D), got a 0-d tensor")
    if weight.dim() != 2:
        raise ValueError(f"weight must be 2-D with shape (V, D), got shape {_shape(weight)}")
    V, D = weight.shape
    if V == 0:
        raise ValueError("weight has V = 0 rows: the vocabulary must not be empty")
    if D == 0:
        raise ValueError(f"weight has shape {_shape(weight)}: the hidden size D must not be 0")
    if hidden.shape[-1] != D:
        raise ValueError(
            f"hidden has last dim {hidden.shape[-1]} (shape {_shape(hidden)}), "
            f"expected D = {D} from weight {_shape(weight)}"
        )
    if hidden.dtype != weight.dtype:
        raise TypeError(f"hidden has dtype {hidden.dtype} but weight has dtype {weight.dtype}; they must match")
    if hidden.device != weight.device:
        raise ValueError(f"hidden is on {hidden.device} but weight is on {weight.device}; they must match")
    if bias is not None:
        bias = _check_tensor("bias", bias)
        _check_float("bias", bias)
        if bias.shape != (V,):
            raise ValueError(f"bias must have shape ({V},) = (V,), got {_shape(bias)}")
        if bias.dtype != weight.dtype:
            raise TypeError(f"bias has dtype {bias.dtype} but weight has dtype {weight.dtype}; they must match")
        if bias.device != weight.device:
            raise ValueError(f"bias is on {bias.device} but weight is on {weight.device}; they must match")
    check_targets(targets, hidden.shape[:-1], "hidden", hidden.device)
    return check_temperature(temperature), check_ignore_index(ignore_index)


def check_logits_inputs(
    logits: object, targets: object, temperature: object, ignore_index: object
) -> tuple[float, int]:
    logits = _check_tensor("logits", logits)
    _check_float("logits", logits)
    if logits.dim() < 1:
        raise ValueError("logits must have shape (..., V), got a 0-d tensor")
    if logits.shape[-1] == 0:
        raise ValueError(f"logits has shape {_shape(logits)}: the vocabulary (last dim) must not be empty")
    check_targets(targets, logits.shape[:-1], "logits", logits.device)
    return check_temperature(temperature), check_ignore_index(ignore_index)


def check_target_values(targets: torch.Tensor, vocab: int, ignore_index: int) -> None:
    """Value check (needs a host sync): every target is in [0, V) or equals ignore_index."""
    if targets.numel() == 0:
        return
    bad = ((targets < 0) | (targets >= vocab)) & (targets != ignore_index)
    if bool(bad.any()):
        first = targets[bad][:5].tolist()
        raise ValueError(
            f"targets must lie in [0, {vocab}) = [0, V) or equal ignore_index={ignore_index}; "
            f"found {int(bad.sum())} out-of-range value(s), e.g. {first}"
        )
