"""Verifiable rewards: pull the final answer out of a completion and compare it with the ground truth.

`extract_answer` is deliberately forgiving about *format* ("17", "The answer is 17.", "= 17", "17.0", "\\boxed{17}",
"1,234") and strict about *value*: the reward is 1 only when the extracted number equals the answer.
"""

from __future__ import annotations

import re
from fractions import Fraction

_FRAC = re.compile(r"\\[dt]?frac\{\s*(-?\d+)\s*\}\{\s*(\d+)\s*\}")  # \frac{1}{2} -> 1/2
# "the answer is 17" -- but not "the answer is 7 * 6 = 42" (an expression, whose result is the last number)
_ANSWER_IS = re.compile(
    r"(?:answer|result)\s*(?:is|:|=)\s*:?\s*\$?\s*(-?[\d,]*\.?\d+(?:/\d+)?)(?![\d,]*\s*[-+*/x×=]\s*\d)", re.IGNORECASE
)
_GSM8K = re.compile(r"####\s*(-?[\d,]*\.?\d+)")
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?|-?\.\d+")


def _to_number(text: str) -> Fraction | None:
    text = text.strip().replace(",", "").rstrip(".")
    if not text:
        return None
    try:
        return Fraction(text)
    except (ValueError, ZeroDivisionError):
        return None


def last_boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}`, braces matched (`\\boxed{\\frac{1}{2}}` -> `\\frac{1}{2}`), with
    `\\frac{a}{b}` of integers as `a/b` and `{,}` as `,`; None without a complete one."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 0, start + len("\\boxed")
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            inner = text[i + 1 : j].replace("{,}", ",")
            return _FRAC.sub(r"\1/\2", inner).strip().strip("$").strip()
    return None


def extract_answer(completion: str) -> str | None:
    """Return the final answer of `completion` as a string, or None when there is none.

    Priority: `\\boxed{...}` (braces matched), then GSM8K's `#### x`, then "the answer is x" / "answer: x", then the
    last number in the text (so "12 + 5 = 17" gives "17"). Thousands separators are dropped.
    """
    boxed = last_boxed(completion)
    if boxed is not None:
        return boxed.replace(",", "")
    for pattern in (_GSM8K, _ANSWER_IS):
        found = pattern.findall(completion)
        if found:
            return found[-1].strip().replace(",", "")
    numbers = _NUMBER.findall(completion)
    return numbers[-1].replace(",", "") if numbers else None


def answers_match(predicted: str | None, truth: str | int | float) -> bool:
    """Numeric equality when both sides parse as numbers ("17.0" == "17", "1/2" == "0.5"), else string equality."""
    if predicted is None:
        return False
    a, b = _to_number(predicted), _to_number(str(truth))
    if a is not None and b is not None:
        return a == b
    return predicted.strip() == str(truth).strip()


def correctness_reward(completion: str, truth: str | int | float) -> float:
    """1.0 when the extracted answer equals `truth`, else 0.0."""
    return float(answers_match(extract_answer(completion), truth))


def format_reward(completion: str) -> float:
    """1.0 when the completion is just the answer, optionally as 'The answer is X.' or with '= X' (a short, clean
    reply), else 0.0. Used only when `format_reward_weight > 0`."""
    text = completion.strip()
    return float(bool(re.fullmatch(r"(?:.{0,40}(?:=|is|:)\s*)?-?[\d,]*\.?\d+\.?", text, flags=re.DOTALL)))
