"""Every boundary check of the package, in one place: the ops, the RL layer and the trainer raise the same errors, and
each names the argument, the value (or shape, dtype, device) seen and what was expected. Also the one strict parser of
boolean flags (environment variables and command-line text).

This module imports nothing from sgrpo_kernels: it is the bottom layer (docs/design.md).
"""

from __future__ import annotations

import math
import numbers
import os

import torch
import torch.autograd.forward_ad as fwad
from torch import Tensor

FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
_INT64 = (-(2**63), 2**63 - 1)
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


# ------------------------------------------------------------------------------------------------ flags and numbers


def parse_flag(text: str, what: str) -> bool:
    """A boolean written as text: 1/0, true/false, yes/no, on/off (any case). Anything else raises ValueError naming
    `what` (e.g. "env SGRPO_CHECK_TARGETS" or "--lora") and the value: junk never reads as on."""
    value = text.strip().lower()
    if value not in _TRUE + _FALSE:
        raise ValueError(f"{what}={text!r}: expected one of 1/0, true/false, yes/no, on/off")
    return value in _TRUE


def env_flag(name: str, default: bool) -> bool:
    """A boolean environment variable (see :func:`parse_flag`); unset or empty = `default`."""
    text = os.environ.get(name, "")
    return parse_flag(text, f"env {name}") if text.strip() else default


def check_flag(name: str, value: object) -> bool:
    """A boolean keyword: a str such as "False" would otherwise count as True."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__} {value!r}")
    return value


def check_number(
    name: str,
    x: object,
    *,
    low: float | None = None,
    low_open: bool = False,
    high: float | None = None,
    high_open: bool = False,
) -> float:
    """A finite Python number (not a bool, not a tensor) within the given bounds."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise TypeError(f"{name} must be a Python number, got {type(x).__name__} {x!r}")
    try:
        v = float(x)
    except OverflowError:  # an int beyond a double's range
        raise ValueError(f"{name} must be finite, got an integer of {len(str(abs(x)))} digits") from None
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


# float32's smallest normal number: the kernels compute z = logits / temperature in float32 (triton: logits times
# 1 / temperature as a float32 scalar), where a smaller temperature is itself rounded (1e-45 is stored as 1.4e-45)
# and 1 / temperature overflows to inf (NaN for every row). Such a temperature is greedy decoding for any sampler.
MIN_TEMPERATURE = 2.0**-126
F32_MAX, F32_TINY = torch.finfo(torch.float32).max, torch.finfo(torch.float32).tiny  # (LossConfig's too)


def check_temperature(temperature: object) -> float:
    if not _real(temperature):
        raise TypeError(f"temperature must be a real number (Python or numpy), got {type(temperature).__name__}")
    t = float(temperature)
    if not math.isfinite(t) or t <= 0.0:
        raise ValueError(f"temperature must be a finite number > 0, got {temperature!r}")
    if t < MIN_TEMPERATURE:
        raise ValueError(f"temperature must be >= {MIN_TEMPERATURE:.8g} (float32's smallest normal number: the ops "
                         f"compute logits / temperature in float32), got {temperature!r}")
    return t


def check_ignore_index(ignore_index: object) -> int:
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, numbers.Integral):
        raise TypeError(f"ignore_index must be a Python int, got {type(ignore_index).__name__}")
    ignore_index = int(ignore_index)  # (a numpy int64 from a tokenizer's config is an int here)
    if not _INT64[0] <= ignore_index <= _INT64[1]:
        raise ValueError(f"ignore_index must fit in int64 (targets are int64), got {ignore_index}")
    return ignore_index


def check_memory_budget(memory_budget: object) -> int:
    """Bytes: a non-negative int below 2**63 (0 = the backend's default)."""
    if isinstance(memory_budget, bool) or not isinstance(memory_budget, numbers.Integral):
        raise TypeError(f"memory_budget must be an int number of bytes or None, got {type(memory_budget).__name__} "
                        f"{memory_budget!r}")
    value = int(memory_budget)
    if not 0 <= value <= _INT64[1]:
        raise ValueError(f"memory_budget must be in [0, 2**63) bytes (0 = the backend's default), got {value}")
    return value


def env_mebibytes(name: str) -> int | None:
    """A size in MiB from the environment, as bytes; None when unset or empty."""
    text = os.environ.get(name, "").strip()
    if not text:
        return None
    try:
        mib = float(text)
    except ValueError:
        mib = math.nan
    if not math.isfinite(mib) or mib < 0 or mib * 2**20 >= 2**63:
        raise ValueError(f"env {name}={text!r}: expected a finite number of MiB >= 0 (0 = the backend's default)")
    return int(mib * 2**20)


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


# ------------------------------------------------------------------------------------------------------- tensors


def shape_str(t: Tensor) -> str:
    return str(tuple(t.shape))


def check_tensor(name: str, x: object) -> Tensor:
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    return x


def check_float_tensor(name: str, x: object, shape: tuple[int, ...] | None = None, what: str = "") -> Tensor:
    """A float32 / bfloat16 / float16 / float64 tensor, of `shape` when given (`what` explains where it comes from)."""
    x = check_tensor(name, x)
    if x.dtype not in FLOAT_DTYPES:
        raise TypeError(
            f"{name} must be a floating tensor (float32, bfloat16, float16 or float64), got dtype {x.dtype}"
        )
    if shape is not None and tuple(x.shape) != tuple(shape):
        raise ValueError(f"{name} has shape {shape_str(x)}, expected {tuple(shape)}{what}")
    return x


def check_int_tensor(name: str, x: object) -> Tensor:
    """An integer tensor (int64, int32, ...): not bool, not floating, not complex."""
    x = check_tensor(name, x)
    if x.dtype == torch.bool or x.is_floating_point() or x.is_complex():
        raise TypeError(f"{name} must be an integer tensor (e.g. int64 or int32), got dtype {x.dtype}")
    return x


def check_mask(name: str, x: object, shape: tuple[int, ...], what: str = "") -> Tensor:
    """A mask is bool (True = valid), integer 0/1 (e.g. TRL's int64 `completion_mask`; returned as bool), or floating
    (non-zero = valid, value = a finite weight >= 0). Integer and floating masks have their values checked (one
    device-to-host sync; a bool mask costs nothing)."""
    x = check_tensor(name, x)
    if x.dtype != torch.bool and not x.is_floating_point() and x.is_complex():
        raise TypeError(f"{name} must be a bool, integer 0/1 or floating tensor, got dtype {x.dtype}")
    if tuple(x.shape) != tuple(shape):
        raise ValueError(f"{name} has shape {shape_str(x)}, expected {tuple(shape)}{what}")
    if x.dtype != torch.bool and not x.is_floating_point():  # integer: 0/1 only
        bad = (x != 0) & (x != 1)
        if x.numel() > 0 and bool(bad.any()):
            raise ValueError(f"{name} is an integer mask, so it must hold 0 and 1 only; found {int(bad.sum())} other "
                             f"value(s), e.g. {x[bad][:3].tolist()} (pass a float mask for token weights)")
        return x != 0
    if x.is_floating_point() and x.numel() > 0:
        bad = ~torch.isfinite(x) | (x < 0)
        if bool(bad.any()):
            raise ValueError(f"{name} must hold finite weights >= 0 (0 = masked); found {int(bad.sum())} negative or "
                             f"non-finite value(s), e.g. {x[bad][:3].tolist()}")
    return x


def check_rank(name: str, x: Tensor, ndim: int, layout: str) -> None:
    if x.dim() != ndim:
        raise ValueError(f"{name} must be {ndim}-D {layout}, got shape {shape_str(x)}")


def check_same_device(name: str, x: Tensor, ref: Tensor, ref_name: str) -> None:
    if x.device != ref.device:
        raise ValueError(f"{name} is on {x.device}, expected {ref.device} (the device of {ref_name})")


def check_targets(targets: object, lead: torch.Size, lead_name: str, device: torch.device) -> Tensor:
    targets = check_int_tensor("targets", targets)
    if targets.shape != lead:
        raise ValueError(
            f"targets has shape {shape_str(targets)}, expected the leading shape of {lead_name}, {tuple(lead)}"
        )
    if targets.device != device:
        raise ValueError(f"targets is on {targets.device}, expected {device} (the device of {lead_name})")
    return targets


def check_target_values(targets: Tensor, vocab: int, ignore_index: int) -> None:
    """Value check: every target is in [0, V) or equals ignore_index. Costs one device-to-host sync (`bool(...)`)."""
    if targets.numel() == 0:
        return
    bad = ((targets < 0) | (targets >= vocab)) & (targets != ignore_index)
    if bool(bad.any()):
        first = targets[bad][:5].tolist()
        raise ValueError(
            f"targets must lie in [0, {vocab}) = [0, V) or equal ignore_index={ignore_index}; "
            f"found {int(bad.sum())} out-of-range value(s), e.g. {first}"
        )


# torch's private functorch helpers (torch 2.x); without them only forward-mode AD duals are recognized
_FUNCTORCH = getattr(torch._C, "_functorch", None)
if not all(hasattr(_FUNCTORCH, f) for f in ("is_gradtrackingtensor", "is_functorch_wrapped_tensor", "get_unwrapped")):
    _FUNCTORCH = None


def check_no_transform(name: str, x: Tensor | None) -> None:
    """Refuse a forward-mode AD dual tensor and a tensor under torch.func's grad / vjp / jacrev / jacfwd / hessian /
    jvp: the ops define a reverse-mode backward only (a jvp came out as zeros). vmap's batched tensors and
    functionalize's are looked through. Eager only: torch.compile traces the op's inputs itself."""
    if x is None or torch.compiler.is_compiling():
        return
    functorch = _FUNCTORCH
    while True:
        if fwad.unpack_dual(x).tangent is not None or (functorch is not None and functorch.is_gradtrackingtensor(x)):
            raise TypeError(
                f"{name} carries a forward-mode AD tangent or a torch.func gradient transform (grad, vjp, jacrev, "
                "jacfwd, hessian, jvp): the ops define a reverse-mode backward only, so torch.func transforms other "
                "than vmap of the forward, and torch.autograd.forward_ad, are unsupported; use loss.backward() or "
                "torch.autograd.grad"
            )
        if functorch is None or not functorch.is_functorch_wrapped_tensor(x):
            return
        x = functorch.get_unwrapped(x)


# ----------------------------------------------------------------------------------------------- the two ops' inputs


def check_linear_inputs(
    hidden: object,
    weight: object,
    targets: object,
    bias: object,
    shard: bool = False,
) -> None:
    """Every tensor argument of `linear_logprobs` except the value range of targets (the head options are checked
    field by field, `HeadOptions.from_kwargs`). `shard`: `weight` is one rank's vocabulary shard, which may be empty
    (V = 0 rows)."""
    hidden = check_float_tensor("hidden", hidden)
    weight = check_float_tensor("weight", weight)
    if hidden.dim() < 1:
        raise ValueError("hidden must have shape (..., D), got a 0-d tensor")
    if weight.dim() != 2:
        raise ValueError(f"weight must be 2-D with shape (V, D), got shape {shape_str(weight)}")
    V, D = weight.shape
    if V == 0 and not shard:
        raise ValueError("weight has V = 0 rows: the vocabulary must not be empty")
    if D == 0:
        raise ValueError(f"weight has shape {shape_str(weight)}: the hidden size D must not be 0")
    if hidden.shape[-1] != D:
        raise ValueError(
            f"hidden has last dim {hidden.shape[-1]} (shape {shape_str(hidden)}), "
            f"expected D = {D} from weight {shape_str(weight)}"
        )
    if hidden.dtype != weight.dtype:
        raise TypeError(f"hidden has dtype {hidden.dtype} but weight has dtype {weight.dtype}; they must match")
    if hidden.device != weight.device:
        raise ValueError(f"hidden is on {hidden.device} but weight is on {weight.device}; they must match")
    if bias is not None:
        bias = check_float_tensor("bias", bias)
        if bias.shape != (V,):
            raise ValueError(f"bias must have shape ({V},) = (V,), got {shape_str(bias)}")
        if bias.dtype != weight.dtype:
            raise TypeError(f"bias has dtype {bias.dtype} but weight has dtype {weight.dtype}; they must match")
        if bias.device != weight.device:
            raise ValueError(f"bias is on {bias.device} but weight is on {weight.device}; they must match")
    check_targets(targets, hidden.shape[:-1], "hidden", hidden.device)
    for name, x in (("hidden", hidden), ("weight", weight), ("bias", bias), ("targets", targets)):
        check_no_transform(name, x)


def check_logits_inputs(logits: object, targets: object, shard: bool = False) -> None:
    """Every tensor argument of `logprobs_from_logits` except the value range of targets (`shard`: the last dim is one
    rank's vocabulary shard, which may be empty)."""
    logits = check_float_tensor("logits", logits)
    if logits.dim() < 1:
        raise ValueError("logits must have shape (..., V), got a 0-d tensor")
    if logits.shape[-1] == 0 and not shard:
        raise ValueError(f"logits has shape {shape_str(logits)}: the vocabulary (last dim) must not be empty")
    check_targets(targets, logits.shape[:-1], "logits", logits.device)
    check_no_transform("logits", logits)
    check_no_transform("targets", targets)


def check_process_group(group: object, op: str):
    """`process_group` of a vocab-parallel call: torch.distributed initialized and a ProcessGroup (or the default
    group's `torch.distributed.group.WORLD`)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(
            f"{op}: process_group was given but torch.distributed is not initialized; call "
            "torch.distributed.init_process_group first (or pass process_group=None for a single-process call)"
        )
    if not isinstance(group, dist.ProcessGroup):
        raise TypeError(f"{op}: process_group must be a torch.distributed ProcessGroup, got {type(group).__name__}")
    return group


def check_global_vocab(size: int, op: str) -> None:
    if size == 0:
        raise ValueError(f"{op}: every rank's vocabulary shard is empty (global V = 0)")


def check_logit_scale(logit_scale: object) -> float:
    """linear_logprobs' `logit_scale`: a finite number > 0."""
    return _check_positive("logit_scale", logit_scale, "a finite number > 0")


def check_softcap(softcap: object) -> float:
    """linear_logprobs' `softcap`: None (no cap, returned as 0.0) or a finite number > 0."""
    if softcap is None:
        return 0.0
    cap = _check_positive("softcap", softcap, "a finite number > 0 or None")
    if cap > F32_MAX:  # the kernels multiply by it in float32: inf, and NaN logits
        raise ValueError(f"softcap must be <= {F32_MAX:.8g} (float32's largest number), got {softcap!r}")
    return cap


def _check_positive(name: str, value: object, expected: str) -> float:
    if not _real(value) or not math.isfinite(value) or value <= 0:  # (numpy float32 2.0 was "must be > 0")
        raise ValueError(f"{name} must be {expected}, got {value!r}")
    return float(value)


def _real(x: object) -> bool:
    """A real number the ops take as a Python float: int, float or a numpy scalar of either (numbers.Real), not a
    bool (nor numpy's, which numbers.Real does not include)."""
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


# ------------------------------------------------------------------------------ the sampler's top_k, top_p, min_p


def _sampler_tensor(name: str, value: Tensor, lead: torch.Size, device: torch.device, integer: bool) -> Tensor:
    if integer:
        check_int_tensor(name, value)
    elif not value.is_floating_point():
        raise TypeError(f"{name} must be a Python number or a floating tensor of per-row values, got dtype "
                        f"{value.dtype}")
    if value.shape != lead:
        raise ValueError(f"{name} has shape {shape_str(value)}, expected a Python number or one value per row: the "
                         f"leading shape of the input, {tuple(lead)}")
    if value.device != device:
        raise ValueError(f"{name} is on {value.device}, expected {device} (the device of the input)")
    return value.reshape(-1)


def _sampler_bad(name: str, values: Tensor, bad: Tensor, accepted: str) -> None:
    if values.numel() and bool(bad.any()):
        rows = torch.nonzero(bad.reshape(-1)).squeeze(1)[:3].tolist()  # (the leading shape's rows, flattened)
        raise ValueError(f"{name} must be {accepted}; found {int(bad.sum())} value(s) outside, e.g. "
                         f"{values.reshape(-1)[rows].tolist()} at row(s) {rows}")


def check_top_k(top_k: object, lead: torch.Size, device: torch.device) -> Tensor | int | None:
    """vLLM's top_k: None (off), a Python int >= 1, or an integer tensor of the input's leading shape (flattened; its
    values are checked by :func:`check_sampler_values` where the search runs, outside torch.compile's graph). k >= V
    keeps every token."""
    if top_k is None:
        return None
    if isinstance(top_k, Tensor):
        return _sampler_tensor("top_k", top_k, lead, device, integer=True)
    if isinstance(top_k, bool) or not isinstance(top_k, numbers.Integral):
        raise TypeError(f"top_k must be None, a Python int >= 1 or an integer tensor, got {type(top_k).__name__} "
                        f"{top_k!r}")
    if int(top_k) < 1:
        raise ValueError(f"top_k must be >= 1 (None turns it off; k >= V keeps every token), got {top_k}")
    return int(top_k)


def _interval(low_open: bool, high_open: bool) -> str:
    return f"in {'(' if low_open else '['}0, 1{')' if high_open else ']'}"


def _bad_probability(x: Tensor, low_open: bool, high_open: bool) -> Tensor:
    low = (x <= 0) if low_open else (x < 0)
    return ~torch.isfinite(x) | low | ((x >= 1) if high_open else (x > 1))


def check_sampler_values(top_k: Tensor, top_p: Tensor, min_p: Tensor) -> None:
    """The values of per-row settings (one host sync): top_k >= 1, top_p in (0, 1], min_p in [0, 1)."""
    _sampler_bad("top_k", top_k, top_k < 1, "an integer >= 1 (k >= V keeps every token)")
    _sampler_bad("top_p", top_p, _bad_probability(top_p, True, False), _interval(True, False))
    _sampler_bad("min_p", min_p, _bad_probability(min_p, False, True), _interval(False, True))


def _check_probability(name: str, value: object, lead: torch.Size, device: torch.device, low_open: bool,
                       high_open: bool) -> Tensor | float | None:
    accepted = _interval(low_open, high_open)
    if value is None:
        return None
    if isinstance(value, Tensor):
        return _sampler_tensor(name, value, lead, device, integer=False)
    if not _real(value):
        raise TypeError(f"{name} must be None, a Python float {accepted} or a floating tensor, got "
                        f"{type(value).__name__} {value!r}")
    v = float(value)
    if not (math.isfinite(v) and (v > 0 if low_open else v >= 0) and (v < 1 if high_open else v <= 1)):
        raise ValueError(f"{name} must be {accepted}, got {value!r}")
    return v


def check_top_p(top_p: object, lead: torch.Size, device: torch.device) -> Tensor | float | None:
    """vLLM's top_p: None (off), a float in (0, 1] (1 keeps every token) or a floating tensor of per-row values."""
    return _check_probability("top_p", top_p, lead, device, low_open=True, high_open=False)


def check_min_p(min_p: object, lead: torch.Size, device: torch.device) -> Tensor | float | None:
    """vLLM's min_p: None (off), a float in [0, 1) (0 keeps every token) or a floating tensor of per-row values."""
    return _check_probability("min_p", min_p, lead, device, low_open=False, high_open=True)
