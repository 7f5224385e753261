"""Verifiable rewards: pull the final answer out of a completion and compare it with the ground truth.

`extract_answer` is deliberately forgiving about *format* ("17", "The answer is 17.", "= 17", "17.0", "\\boxed{17}",
"1,234") and strict about *value*: the reward is 1 only when the extracted number equals the answer.

Code problems (HumanEval) carry a `CodeTests` as their answer: its reward checks the completion's function against the
problem's tests in the sandbox (`sgrpo_sandbox.run_check`: the tests run in a process of their own, the completion's
code in another, only data passes between them) instead of comparing numbers. `correctness_rewards` scores a
batch, the code in parallel.
"""

from __future__ import annotations

import copy
import functools
import importlib
import inspect
import json
import math
import numbers
import os
import re
import sys
from fractions import Fraction
from typing import TYPE_CHECKING

from .errors import TrainError

if TYPE_CHECKING:  # the sandbox loads when a code problem is made or graded: --help and the other tasks skip it
    from sgrpo_sandbox import FunctionCheck, Limits

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


class RowAnswer(str):
    """The ground truth of a `--task jsonl` problem: the row's answer text ("" when the row has none), with the whole
    row (`fields`, what reward functions receive) and the prompt. A row without an answer is graded by the reward
    functions (`grader`): correct when their weighted sum is > 0."""

    def __new__(cls, answer: str, fields: dict, prompt: str, grader=None):
        self = super().__new__(cls, answer)
        self.fields, self.prompt, self.grader = fields, prompt, grader
        return self


class MathAnswer(str):
    """The ground truth of a `--task math` problem: graded with math-verify (symbolic equality: 1/2 = 0.5 = \\frac12,
    sets, intervals, ...) when it is installed, and by `answers_match` (numbers, else strings) either way: a completion
    is correct when either says so."""


@functools.cache
def _math_verify():
    try:
        import math_verify
    except ImportError:
        return None
    return math_verify


def math_verified(completion: str, truth: str) -> bool | None:
    """math-verify's verdict (the gold answer is read as \\boxed{truth}), or None when it is not installed."""
    mv = _math_verify()
    if mv is None:
        return None
    try:
        gold, pred = mv.parse(f"\\boxed{{{truth}}}"), mv.parse(completion)
        return bool(gold and pred and mv.verify(gold, pred))
    except Exception:  # noqa: BLE001 -- a parse or comparison it cannot do: not verified
        return False


def correctness_reward(completion: str, truth: str | int | float) -> float:
    """1.0 when the extracted answer equals `truth` (for a `CodeTests` truth: when the completion's function passes
    its tests in the sandbox; for an answer-less `RowAnswer`: when its reward functions sum to > 0), else 0.0."""
    if isinstance(truth, RowAnswer) and truth.grader is not None:
        return float(truth.grader([completion], [truth.prompt], [truth.fields])[0] > 0)
    if isinstance(truth, CodeTests):
        from sgrpo_sandbox import run_check

        return float(run_check(truth.function_check(completion), truth.limits).passed)
    if isinstance(truth, MathAnswer) and math_verified(completion, truth):
        return 1.0
    return float(answers_match(extract_answer(completion), truth))


def correctness_rewards(
    completions: list[str], truths: list[str | int | float], max_workers: int | None = None
) -> list[float]:
    """`correctness_reward` of each (completion, truth) pair; the code ones run in parallel, at most `max_workers` at
    a time (default: min(8, CPU count))."""
    if len(completions) != len(truths):
        raise ValueError(f"completions and truths: {len(completions)} vs {len(truths)} items; expected as many")
    graded = [i for i, t in enumerate(truths) if isinstance(t, RowAnswer) and t.grader is not None]
    skip = {*graded, *(i for i, t in enumerate(truths) if isinstance(t, CodeTests))}
    out = [0.0 if i in skip else correctness_reward(c, t) for i, (c, t) in enumerate(zip(completions, truths))]
    by_grader: dict[int, list[int]] = {}
    for i in graded:
        by_grader.setdefault(id(truths[i].grader), []).append(i)
    for idx in by_grader.values():  # one call per batch of each grader
        grader = truths[idx[0]].grader
        totals = grader([completions[i] for i in idx], [truths[i].prompt for i in idx], [truths[i].fields for i in idx])
        for i, total in zip(idx, totals):
            out[i] = float(total > 0)
    code = [i for i, t in enumerate(truths) if isinstance(t, CodeTests)]
    by_limits: dict[Limits, list[int]] = {}
    for i in code:
        by_limits.setdefault(truths[i].limits, []).append(i)
    from sgrpo_sandbox import run_many

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
        from sgrpo_sandbox import Limits

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
        from sgrpo_sandbox import FunctionCheck

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


# ------------------------------------------------------------------------------------------- the user's rewards
# `--reward module:function[=weight],...`: reward functions called as TRL calls its `reward_funcs`:
# `function(completions=[...], prompts=[...], **fields) -> list[float]`, one float per completion, where each of the
# problem's fields (a JSONL row's keys; a built-in task's question and answer) is a list with the completions' values.


class RewardError(TrainError, ValueError):
    """A reward reference that cannot be used, or a reward function that failed (raised, exited, returned a wrong or
    non-finite value): the message names it and says why. `python -m train` prints it without a traceback (exit 2
    before training: a refusal; exit 1 during it, the run checkpointed)."""


def _builtin_correctness(completions: list[str], answer: list, **_) -> list[float]:
    return correctness_rewards(completions, answer)


def _task_correctness(completions: list[str], truths: list) -> list[float]:
    """The built-in `correctness` against each problem's ground truth as its task grades it (a JSONL row's answer as
    extracted from "... #### 42" or a MATH solution, not the row's raw text)."""
    if any(isinstance(t, RowAnswer) and t.grader is not None for t in truths):
        raise RewardError("reward 'correctness': a row has no answer (answer/solution) to grade against; give every "
                          "row one, or leave correctness out of --reward")  # fmt: skip
    return correctness_rewards(completions, truths)


def _builtin_format(completions: list[str], **_) -> list[float]:
    return [format_reward(c) for c in completions]


BUILTIN_REWARDS = {"correctness": _builtin_correctness, "format": _builtin_format}
_REF = re.compile(r"^(?:(?P<module>[A-Za-z_][\w.]*):(?P<function>[A-Za-z_]\w*)|(?P<builtin>[a-z_]+))(?:=(?P<w>.+))?$")


def parse_reward_spec(text: str) -> list[tuple[str, float]]:
    """'mod:fn=0.5,correctness' -> [('mod:fn', 0.5), ('correctness', 1.0)]; syntax only (nothing is imported). A
    malformed item raises RewardError naming it."""
    out = []
    for item in (x.strip() for x in text.split(",")):
        m = _REF.match(item)
        if not m or (m["builtin"] and m["builtin"] not in BUILTIN_REWARDS):
            raise RewardError(
                f"reward {item!r}: expected module:function[=weight] (a function in an importable module) or one of "
                f"the built-in {', '.join(BUILTIN_REWARDS)}"
            )
        weight = 1.0
        if m["w"] is not None:
            try:
                weight = float(m["w"])
            except ValueError:
                weight = math.nan
            if not math.isfinite(weight):
                raise RewardError(f"reward {item!r}: weight {m['w']!r}: expected a finite number")
            if weight == 0:  # 0 (or -0): the function would count for nothing, silently
                raise RewardError(f"reward {item!r}: weight {m['w']!r}: expected a finite, nonzero number (a weight "
                                  "of 0 adds nothing to the reward: leave the function out instead)")  # fmt: skip
        out.append((item.split("=")[0], weight))
    names = [n for n, _ in out]
    if len(set(names)) < len(names):
        raise RewardError(f"reward {text!r}: a function named twice; give it once with its weight")
    return out


def check_reward_spec(text: str) -> None:
    parse_reward_spec(text)


def load_reward_function(name: str):
    """The function of 'module:function' (imported), or a built-in's; RewardError naming it and the reason."""
    if name in BUILTIN_REWARDS:
        return BUILTIN_REWARDS[name]
    module_name, _, function = name.partition(":")
    if os.getcwd() not in sys.path and "" not in sys.path:  # as `python -m` has it, also for the console scripts
        sys.path.append(os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        hint = f" (a module name, not a file: {module_name.removesuffix('.py')}:{function})" if module_name.endswith(
            ".py") else ""  # fmt: skip
        raise RewardError(f"reward {name!r}: cannot import module {module_name!r} ({exc}); it must be importable "
                          f"from the current directory or the Python path{hint}") from None  # fmt: skip
    except (Exception, SystemExit) as exc:  # noqa: BLE001 -- the user's module failed (or exited) while importing
        raise RewardError(f"reward {name!r}: importing {module_name!r} failed: {type(exc).__name__}: {exc}") from None
    fn = getattr(module, function, None)
    if fn is None:
        raise RewardError(f"reward {name!r}: module {module_name!r} has no attribute {function!r}")
    if not callable(fn):
        raise RewardError(f"reward {name!r}: {function!r} is a {type(fn).__name__}, not a function")
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return fn
    names = {p.name for p in params}
    if "completions" not in names and not any(p.kind is p.VAR_KEYWORD for p in params):
        raise RewardError(
            f"reward {name!r}: signature {function}{inspect.signature(fn)} takes no `completions`; expected "
            "def f(completions, **kwargs) -> list[float] (TRL's reward_funcs signature)"
        )
    return fn


def _short(v) -> str:
    text = repr(v)
    return text if len(text) <= 80 else f"{text[:60]}... ({len(text)} characters)"


def _call_user(name: str, fn, completions: list[str], columns: dict):
    """`fn(completions=..., **columns)` behind a boundary: a user's function gets its own copy of every input (what it
    mutates reaches neither the next function nor the next step), and anything it raises -- SystemExit included --
    becomes a RewardError naming it (a Ctrl-C still stops the run)."""
    if name not in BUILTIN_REWARDS:
        completions, columns = list(completions), copy.deepcopy(columns)
    try:
        return fn(completions=list(completions), **columns)
    except TypeError as exc:
        raise RewardError(
            f"reward {name!r}: calling it with completions= and the problem's fields ({', '.join(columns)}) failed: "
            f"{str(exc)[:300]}"
        ) from None
    except (Exception, SystemExit) as exc:  # noqa: BLE001 -- the user's code: any failure is named, not a crash
        raise RewardError(f"reward {name!r} raised {type(exc).__name__}: {str(exc)[:300]}") from None


class RewardFunctions:
    """The weighted sum of reward functions (`--reward`), called once per batch. `check` calls each on one completion
    of a real problem before training, so that a wrong signature or return value is refused then."""

    def __init__(self, spec: str):
        self.refs = parse_reward_spec(spec)
        self.functions = [(name, load_reward_function(name), w) for name, w in self.refs]
        self._last: tuple | None = None  # (key, result): the training step scores a batch once, whoever asks

    def __call__(self, completions: list[str], prompts: list[str], rows: list[dict], truths: list | None = None
                 ) -> list[float]:  # fmt: skip
        """The weighted sum per completion (rows[i]: completion i's problem fields; truths[i], when given: its
        problem's ground truth, which the built-in `correctness` grades against; else the rows' `answer`)."""
        key = self._cache_key(completions, prompts, rows, truths)
        if key is not None and self._last is not None and self._last[0] == key:
            result, self._last = self._last[1], None  # used once: the next batch is scored afresh
            return result
        columns = {k: [r.get(k) for r in rows] for k in dict.fromkeys(k for r in rows for k in r)}
        for field in ("prompt", "completion", "completions"):  # as TRL: the prompt is `prompts`, not a field
            columns.pop(field, None)
        columns["prompts"] = list(prompts)
        total = [0.0] * len(completions)
        for name, fn, w in self.functions:
            if name == "correctness" and truths is not None:
                values = _task_correctness(completions, truths)
            else:
                values = _call_user(name, fn, completions, columns)
            if hasattr(values, "tolist") and getattr(values, "ndim", None) == 1:  # a NumPy array, a torch tensor
                values = values.tolist()
            if not isinstance(values, (list, tuple)) or len(values) != len(completions):
                if isinstance(values, (list, tuple)):
                    got = f"{len(values)} value{'s' * (len(values) != 1)}"
                elif hasattr(values, "ndim"):  # an array or tensor of another shape
                    got = f"a {type(values).__name__} of shape {tuple(getattr(values, 'shape', ()))}"
                else:
                    got = f"a {type(values).__name__}"
                raise RewardError(f"reward {name!r}: returned {got}; expected a list (or a 1-D array or tensor) of "
                                  f"{len(completions)} floats")  # fmt: skip
            for i, v in enumerate(values):
                if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v):  # NumPy's too
                    raise RewardError(
                        f"reward {name!r}: completion {i}: {_short(v)}; expected a finite float (completion "
                        f"{completions[i][:60]!r})"
                    )
                total[i] += w * float(v)
        bad = next((i for i, t in enumerate(total) if not math.isfinite(t)), None)
        if bad is not None:  # each value finite, their weighted sum not: a weight times a value overflowed
            terms = ", ".join(f"{name}={w:g}" for name, _, w in self.functions)
            raise RewardError(f"rewards {terms}: the weighted sum for completion {bad} is {total[bad]}; expected a "
                              "finite sum (use smaller weights or values)")  # fmt: skip
        self._last = None if key is None else (key, total)
        return total

    def _cache_key(self, completions, prompts, rows, truths) -> tuple | None:
        """What the weighted sum depends on, by content (the rows' fields as JSON, the ground truths when the
        built-in `correctness` grades them): never the rows' ids, which repeat across calls for the dicts a built-in
        task's problem makes anew each time. None (no caching) when the rows are not JSON data."""
        graded = truths is not None and any(name == "correctness" for name, _, _ in self.functions)
        try:
            fields = json.dumps(rows, sort_keys=True, ensure_ascii=False)
        except (TypeError, ValueError, RecursionError):
            return None
        answers = tuple((type(t).__name__, str(t), getattr(t, "test", None)) for t in truths) if graded else None
        return tuple(completions), tuple(prompts), fields, answers

    def required_fields(self) -> list[tuple[str, str]]:
        """(function, field) for each argument a user function requires beyond `completions` and `prompts` (no
        default, not **kwargs): every problem's row must have that field, or the call fails mid-run."""
        out = []
        for name, fn, _ in self.functions:
            try:
                params = [] if name in BUILTIN_REWARDS else inspect.signature(fn).parameters.values()
            except (TypeError, ValueError):
                continue
            out += [(name, p.name) for p in params if p.default is p.empty and p.name not in ("completions", "prompts")
                    and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]  # fmt: skip
        return out

    def check(self, prompt: str, row: dict, truth=None) -> None:
        """Call every function on two completions of a real problem (the empty one and "0"), so that a wrong signature,
        return type or length, or a non-finite value is refused before training; RewardError if any fails."""
        self._last = None
        self(["", "0"], [prompt] * 2, [row] * 2, None if truth is None else [truth] * 2)
        self._last = None
