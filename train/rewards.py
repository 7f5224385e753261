"""Verifiable rewards: pull the final answer out of a completion and compare it with the ground truth.

`extract_answer` is deliberately forgiving about *format* ("17", "The answer is 17.", "= 17", "17.0", "\\boxed{17}",
"1,234") and strict about *value*: the reward is 1 only when the extracted number equals the answer.

Code problems (HumanEval) carry a `CodeTests` as their answer: its reward checks the completion's function against the
problem's tests in the sandbox (`train.sandbox.run_check`: the tests run in a process of their own, the completion's
code in another, only data passes between them) instead of comparing numbers. `correctness_rewards` scores a
batch, the code in parallel.
"""

from __future__ import annotations

import functools
import re
from fractions import Fraction

from .sandbox import FunctionCheck, Limits, run_check, run_many

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
    """1.0 when the extracted answer equals `truth` (for a `CodeTests` truth: when the completion's function passes
    its tests in the sandbox), else 0.0."""
    if isinstance(truth, CodeTests):
        return float(run_check(truth.function_check(completion), truth.limits).passed)
    return float(answers_match(extract_answer(completion), truth))


def correctness_rewards(
    completions: list[str], truths: list[str | int | float], max_workers: int | None = None
) -> list[float]:
    """`correctness_reward` of each (completion, truth) pair; the code ones run in parallel, at most `max_workers` at
    a time (default: min(8, CPU count))."""
    if len(completions) != len(truths):
        raise ValueError(f"completions and truths: {len(completions)} vs {len(truths)} items; expected as many")
    out = [0.0 if isinstance(t, CodeTests) else correctness_reward(c, t) for c, t in zip(completions, truths)]
    code = [i for i, t in enumerate(truths) if isinstance(t, CodeTests)]
    by_limits: dict[Limits, list[int]] = {}
    for i in code:
        by_limits.setdefault(truths[i].limits, []).append(i)
    for limits, idx in by_limits.items():
        results = run_many([truths[i].function_check(completions[i]) for i in idx], limits, max_workers)
        for i, r in zip(idx, results):
            out[i] = float(r.passed)
    return out


_FENCE = re.compile(r"```[^\n`]*\n(.*?)(?:```|\Z)", re.DOTALL)


def code_of(completion: str) -> str:
    """The code in a completion: the first Markdown code block (```python ... ```; an unclosed one runs to the end),
    else the completion as it is (a plain continuation of the prompt)."""
    block = _FENCE.search(completion)
    return block.group(1) if block else completion


@functools.lru_cache(maxsize=4096)
def _as_module(prompt: str) -> str:
    """The prompt as the checker runs it: a HumanEval prompt is a complete module already (its last function's body
    is the docstring); one that stops after a `def` line gets a `pass` body (the stand-in replaces that function)."""
    for source in (prompt, prompt.rstrip() + "\n    pass\n"):
        try:
            compile(source, "<prompt>", "exec")
            return source
        except (SyntaxError, ValueError):
            continue
    return prompt  # the checker reports that it cannot load it: status "error"


class CodeTests(str):
    """The ground truth of a code problem: HumanEval's `prompt`, `test` (which defines `check(candidate)`) and
    `entry_point`, and the sandbox limits to run them with. It is a str -- the problem's name, what logs and
    metrics show -- so that everything that carries answers passes it on unchanged."""

    def __new__(cls, name: str, prompt: str, test: str, entry_point: str, limits: Limits | None = None):
        self = super().__new__(cls, name)
        self.prompt, self.test, self.entry_point = prompt, test, entry_point
        self.limits = limits or Limits()
        return self

    def __reduce__(self):
        return (CodeTests, (str(self), self.prompt, self.test, self.entry_point, self.limits))

    def function_check(self, completion: str) -> FunctionCheck:
        """What the reward runs: the candidate's program is the prompt + the completion's code (`code_of`: a fenced
        block when there is one; a reply that restates the whole function works too: its `def` replaces the
        prompt's); the trusted checker runs the prompt (its helper functions, which some tests call, are the
        data set's, whatever the completion redefines) and the test, and calls `check` with a stand-in for
        `entry_point`."""
        program = self.prompt + code_of(completion)
        return FunctionCheck(program, self.test, self.entry_point, setup=_as_module(self.prompt))

    def program(self, completion: str) -> str:
        """HumanEval's whole program: prompt + completion + "\n" + test + "\n" + f"check({entry_point})", with the
        completion's code as in `function_check`. For reading and debugging only: run as one program, the
        completion could forge its verdict (its exit status); the reward uses `function_check`."""
        return self.prompt + code_of(completion) + "\n" + self.test + "\n" + f"check({self.entry_point})"


def format_reward(completion: str) -> float:
    """1.0 when the completion is just the answer, optionally as 'The answer is X.' or with '= X' (a short, clean
    reply), else 0.0. Used only when `format_reward_weight > 0`."""
    text = completion.strip()
    return float(bool(re.fullmatch(r"(?:.{0,40}(?:=|is|:)\s*)?-?[\d,]*\.?\d+\.?", text, flags=re.DOTALL)))
