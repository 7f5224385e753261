"""Strict JSON, as every file the trainer writes holds it: a non-finite number is `null`, a tuple a list. Below the
rest of the trainer (the config reads a run's config.json back through it; run/ writes with it)."""

from __future__ import annotations

import json
import math


def json_safe(obj):
    """`obj` with every non-finite float (NaN, +-inf) replaced by None, recursively: what strict JSON can hold."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [json_safe(v) for v in obj]
    return obj


def dumps(obj, **kwargs) -> str:
    """json.dumps that never writes a bare NaN / Infinity (they become null)."""
    return json.dumps(json_safe(obj), allow_nan=False, **kwargs)
