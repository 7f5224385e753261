"""A deterministic reward for benchmarks/fingerprint.py: the tiny random-weight model never answers right, so the
task's own reward is 0 everywhere and no group has a relative advantage; this one varies with the text, so that every
fingerprint run actually takes optimizer steps."""

from __future__ import annotations


def char_reward(completions, **_fields) -> list[float]:
    """Fraction of a completion's characters that are digits or spaces (in [0, 1])."""
    return [sum(ch.isdigit() or ch == " " for ch in c) / max(len(c), 1) for c in completions]
