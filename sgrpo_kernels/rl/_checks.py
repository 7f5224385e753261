"""Boundary checks shared by the RL layer: errors name the argument, the shape seen and the shape expected."""

from __future__ import annotations

import math

import torch
from torch import Tensor


def shape_str(t: Tensor) -> str:
    return str(tuple(t.shape))


def check_tensor(name: str, x: object) -> Tensor:
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    return x


def check_float_tensor(name: str, x: object, shape: tuple[int, ...] | None = None, what: str = "") -> Tensor:
    x = check_tensor(name, x)
    if not x.is_floating_point():
        raise TypeError(f"{name} must be a floating tensor, got dtype {x.dtype}")
    if shape is not None and tuple(x.shape) != tuple(shape):
        raise ValueError(f"{name} has shape {shape_str(x)}, expected {tuple(shape)}{what}")
    return x


def check_mask(name: str, x: object, shape: tuple[int, ...], what: str = "") -> Tensor:
    """A mask is bool (True = valid) or floating (non-zero = valid, value = weight); integer masks are refused."""
    x = check_tensor(name, x)
    if x.dtype != torch.bool and not x.is_floating_point():
        raise TypeError(f"{name} must be a bool or floating tensor, got dtype {x.dtype}")
    if tuple(x.shape) != tuple(shape):
        raise ValueError(f"{name} has shape {shape_str(x)}, expected {tuple(shape)}{what}")
    return x


def check_rank(name: str, x: Tensor, ndim: int, layout: str) -> None:
    if x.dim() != ndim:
        raise ValueError(f"{name} must be {ndim}-D {layout}, got shape {shape_str(x)}")


def check_same_device(name: str, x: Tensor, ref: Tensor, ref_name: str) -> None:
    if x.device != ref.device:
        raise ValueError(f"{name} is on {x.device}, expected {ref.device} (the device of {ref_name})")


def check_group_size(group_size: object, batch: int, batch_name: str) -> int:
    if isinstance(group_size, bool) or not isinstance(group_size, int):
        raise TypeError(f"group_size must be a Python int, got {type(group_size).__name__}")
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    if batch % group_size != 0:
        raise ValueError(
            f"the batch size B = {batch} of {batch_name} is not a multiple of group_size = {group_size} "
            "(groups are contiguous: completions g*G .. g*G+G-1 belong to prompt g)"
        )
    return group_size


def check_number(
    name: str,
    x: object,
    *,
    low: float | None = None,
    low_open: bool = False,
    high: float | None = None,
    high_open: bool = False,
) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise TypeError(f"{name} must be a Python number, got {type(x).__name__}")
    v = float(x)
    if not math.isfinite(v):
        raise ValueError(f"{name} must be finite, got {x!r}")
    if low is not None and (v <= low if low_open else v < low):
        raise ValueError(f"{name} must be {'>' if low_open else '>='} {low}, got {x!r}")
    if high is not None and (v >= high if high_open else v > high):
        raise ValueError(f"{name} must be {'<' if high_open else '<='} {high}, got {x!r}")
    return v


def check_choice(name: str, x: object, choices: tuple[str, ...]) -> str:
    if not isinstance(x, str):
        raise TypeError(f"{name} must be a string, one of {choices}, got {type(x).__name__}")
    if x not in choices:
        raise ValueError(f"unknown {name} {x!r}; expected one of {choices}")
    return x


def compute_dtype(x: Tensor) -> torch.dtype:
    """fp32 at least (fp64 stays fp64); integer/bool inputs compute in fp32."""
    if x.is_floating_point():
        return torch.promote_types(x.dtype, torch.float32)
    return torch.float32
