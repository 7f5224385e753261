"""`--task gsm8k` and `--task math`: problems from a local JSON Lines file (`--data-path`), or, without one, from the
Hugging Face dataset when the `datasets` library has it cached. The two tasks differ only in which dataset that is."""

from __future__ import annotations

import dataclasses
import json
import math
import random
from pathlib import Path

from ..errors import Refused
from ..rewards import (
    MathAnswer,
    RewardFunctions,
    RowAnswer,
    _to_number,
    answers_match,
    correctness_reward,
    extract_answer,
)
from ..tasks.base import ANSWER_IS_TEMPLATE, Problem, check_template
from ..tasks.jsonl_file import JSONL_EXPECTED, read_jsonl
from ..tasks.registry import register_task

QUESTION_KEYS = ("question", "problem", "prompt")  # the problem text: one of these a row (_question)
ANSWER_KEYS = ("answer", "solution")  # the ground truth: GSM8K "... #### 42", MATH "... \\boxed{42}", or a bare value


class DataRefused(Refused, ValueError):
    """The data file cannot be used: the message names the file, the line and what is accepted (`python -m train`
    prints it and exits 2, no traceback)."""


def _question(row: dict, where: str):
    """The row's problem text: the first of QUESTION_KEYS present (None when none is). Refused: a list or a mapping
    there (it would be trained on as its Python repr), blank text, and more than one prompt field with different
    text (one would be trained on, the other hidden from the model and the reward functions)."""
    present = [k for k in QUESTION_KEYS if row.get(k) not in (None, "")]
    key = present[0] if present else None
    value = None if key is None else row[key]
    if any(type(row[k]) is not type(value) or row[k] != value for k in present[1:]):
        raise ValueError(
            f"{where}: more than one prompt field ({', '.join(present)}) with different text; the trainer would use "
            f"{key!r} and hide the other{'s' * (len(present) > 2)}: keep one of them and remove the rest from the row"
        )
    if isinstance(value, bool) or not isinstance(value, str | int | float | None):
        raise ValueError(f"{where}: the prompt field {key!r} is a {type(value).__name__}; expected text")
    if isinstance(value, float) and not math.isfinite(value):  # JSON's NaN / Infinity: trained on as "nan"
        raise ValueError(f"{where}: the prompt field {key!r} is {value!r}; expected text")
    if isinstance(value, str) and not value.strip():
        raise ValueError(f"{where}: the prompt field {key!r} is blank ({value!r}); expected the problem's text")
    return value


def _answer(row: dict, where: str, graded_as: type | None = str) -> str | None:
    """The row's final answer: from the first of ANSWER_KEYS present ("... #### 42" and "... \\boxed{42}" read to
    "42", a bare value stripped); None when none is. Refused: a list, an object, a boolean or a non-finite number
    there (it would be its Python repr, "['5']" or "nan", which no completion matches), and no final answer in it.
    `graded_as` (str, or MathAnswer for --task math): the built-in correctness grades the row, so an answer it can
    never grade correct is refused too (`_check_gradable`); None: the user's --reward grades it, unchecked."""
    key = next((k for k in ANSWER_KEYS if row.get(k) not in (None, "")), None)
    if key is None:
        return None
    raw = row[key]
    nonfinite = isinstance(raw, float) and not math.isfinite(raw)  # JSON's NaN, Infinity (Python's json reads them)
    if isinstance(raw, bool) or not isinstance(raw, str | int | float) or nonfinite:
        what = {bool: "a boolean", list: "a list", dict: "an object"}.get(type(raw), f"{raw} (not a finite number)")
        raise ValueError(
            f"{where}: the answer field {key!r} is {what}; expected text or a finite number (a bare value, GSM8K's "
            "'... #### 42' or MATH's '... \\boxed{42}')"
        )
    text = str(raw)
    answer = extract_answer(text) if ("####" in text or "\\boxed" in text) else text.strip()
    if not answer:
        raise ValueError(
            f"{where}: no final answer in {text[:80]!r}; expected a bare value, GSM8K's '#### 42' or MATH's "
            "\\boxed{42}"
        )
    if graded_as is not None:
        _check_gradable(text, answer, graded_as, f"{where}: the answer field {key!r}")
    return answer


def _check_gradable(text: str, answer: str, graded_as: type, where: str) -> None:
    """Refuse an answer that no completion can match: not a number (any number is matched by a completion that
    states it), and the field's own text ("... #### 42", "\\boxed{Paris}", "42"), read as a completion, is not graded
    correct against it ("Paris", "$5", "5 apples", "5%", a MATH solution without \\boxed{}): training on such a row
    would see reward 0 whatever the model says."""
    if _to_number(answer) is not None or correctness_reward(text, graded_as(answer)) == 1:
        return
    found = extract_answer(text)
    hint = f" (if the answer is {found}, write {found!r} or '... #### {found}')" if found and found != answer else ""
    raise ValueError(
        f"{where}: {text[:80]!r} can never be graded correct: the built-in correctness reward reads a completion's "
        f"final number (or its \\boxed{{}} value), and even this text as a completion scores 0 against it{hint}; "
        "expected a bare number ('42'), GSM8K's '... #### 42' or MATH's '... \\boxed{42}' (a text answer as "
        "'\\boxed{Paris}'; with --task jsonl, rows your own --reward grades need no answer the built-in can read)"
    )


def unique_rows(rows: list[tuple[int, dict]], path) -> list[tuple[int, dict]]:
    """`rows` without the exact repeats of an earlier row (each dropped one named in a warning): a repeated row would
    only weigh its problem twice in training."""
    seen: dict[str, int] = {}
    out, dropped = [], []
    for n, row in rows:
        key = json.dumps(row, sort_keys=True)
        if key in seen:
            dropped.append(f"line {n} repeats line {seen[key]}")
            continue
        seen[key] = n
        out.append((n, row))
    if dropped:
        more = f" and {len(dropped) - 5} more" if len(dropped) > 5 else ""
        print(f"warning: {path}: {len(dropped)} duplicate row(s) dropped ({', '.join(dropped[:5])}{more})")
    return out


def warn_conflicts(lines: list[int], problems: list[Problem], path) -> None:
    """Warn (naming both lines) of each row whose prompt is an earlier row's with a different answer: a completion
    can be right for only one of them, so training pulls the model both ways."""
    first: dict[str, tuple[int, str]] = {}
    clashes = []
    for n, p in zip(lines, problems):
        answer = str(p.answer)
        if not answer:  # a row graded by the reward functions alone
            continue
        m, earlier = first.setdefault(p.prompt, (n, answer))
        if not answers_match(answer, earlier):
            clashes.append(f"line {n} ({answer[:40]!r}) vs line {m} ({earlier[:40]!r})")
    if clashes:
        more = f" and {len(clashes) - 5} more" if len(clashes) > 5 else ""
        print(f"warning: {path}: {len(clashes)} row(s) repeat an earlier row's prompt with a different answer "
              f"({', '.join(clashes[:5])}{more}): a completion can be right for only one of them")  # fmt: skip


def split_by_content(problems: list[Problem], heldout_frac: float, seed: int) -> tuple[list, list]:
    """(training, held-out): the problems shuffled with `seed`, the last `heldout_frac` of them held out, where
    problems with the same prompt count as one and go to the same side (a prompt is never both trained on and held
    out). Without a repeated prompt this is exactly the positional split of one shuffled list (as before issue 39)."""
    groups: dict[str, list[Problem]] = {}
    for p in problems:
        groups.setdefault(p.prompt, []).append(p)
    units = list(groups.values())
    random.Random(seed).shuffle(units)
    n_held = max(1, int(len(units) * heldout_frac))
    return [p for u in units[:-n_held] for p in u], [p for u in units[-n_held:] for p in u]


def check_prompts_fit(task, tok, model, max_new_tokens: int, render, engine_context: int | None = None) -> None:
    """DataRefused naming the file and line of a prompt of a JSONL task whose chat-formatted tokens and
    `max_new_tokens` exceed the model's context (`max_position_embeddings`), or the rollout engine's when it is
    smaller (`engine_context`, --vllm-max-model-len): it would stall or fail the run. Cheap: only prompts whose UTF-8
    length could exceed it are tokenized (no tokenizer makes more tokens than bytes, beyond the template's own).
    `render(problem)`: the text the rollout feeds the model (the chat template applied)."""
    config = getattr(model, "config", None)
    context, whose = getattr(config, "max_position_embeddings", None), "the model's context"
    by_engine = bool(engine_context) and not (isinstance(context, int) and 0 < context <= engine_context)
    if by_engine:
        context, whose = engine_context, "the vLLM engine's context (--vllm-max-model-len)"
    if not isinstance(task, JsonlTask) or not isinstance(context, int) or context <= 0:
        return

    def tokens(problem) -> int:
        text = render(problem)
        return int(tok([text], return_tensors="pt", padding=True, add_special_tokens=False)["input_ids"].shape[1])

    room = context - max_new_tokens
    more = ", or raise --vllm-max-model-len" if by_engine else ""
    overhead = tokens(Problem("", ""))
    if room <= overhead:  # no prompt could fit: the flag is at fault, not the data
        raise Refused(
            f"--max-new-tokens {max_new_tokens}: {whose} is {context} tokens and the chat template alone "
            f"takes {overhead}, so no prompt of {task.path} would fit; use --max-new-tokens < {context - overhead}"
        )
    for p in task.train + task.test:
        if len(p.prompt.encode()) + overhead <= room:
            continue
        n = tokens(p)
        if n > room:
            raise DataRefused(
                f"{task.path}: line {task.lines.get(p.prompt, '?')}: the prompt is {n} tokens; {whose} is {context} "
                f"tokens and --max-new-tokens {max_new_tokens}, so a prompt may have at most {room} tokens. "
                f"Shorten or remove it (or lower --max-new-tokens{more})"
            )


class JsonlTask:
    """GSM8K / MATH style problems from a local JSONL file.

    Accepted fields: question/problem/prompt for the text (one of them a row, not blank); answer (GSM8K "... #### 42"
    or a bare value) or solution (MATH, the last \\boxed{...}) for the ground truth, text or a finite number. Every
    row must have both (a row without them is an error naming its line, not skipped). Checked before the split: an
    exact repeat of a row is dropped (with a warning); rows with the same prompt stay on one side of the split
    (`split_by_content`): the last `heldout_frac` of the shuffled distinct prompts is held out. A prompt too long for
    the model's context is refused (`check_prompts_fit`).
    """

    system_prompt: str | None = None  # the chat template's default

    def __init__(
        self,
        path: str,
        prompt_template: str = "{question}",
        heldout_frac: float = 0.2,
        seed: int = 0,
        graded_as: type = str,
    ):
        check_template(prompt_template)
        self.graded_as = graded_as  # the answers' type as the task grades them: MathAnswer for --task math
        rows = unique_rows(read_jsonl(path), path)
        problems = [self._parse(row, prompt_template, f"{path}: line {n}") for n, row in rows]
        self.path, self.lines = str(path), {}  # the line of each prompt (its first), for the messages about it
        for (n, _), p in zip(rows, problems):
            self.lines.setdefault(p.prompt, n)
        if len(self.lines) < 2:
            raise ValueError(f"{path}: {len(self.lines)} distinct problem(s); need at least 2 (training and held-out)")
        warn_conflicts([n for n, _ in rows], problems, path)
        self.train, self.test = split_by_content(problems, heldout_frac, seed)

    def _parse(self, row: dict, template: str, where: str) -> Problem:
        question = _question(row, where)
        answer = _answer(row, where, self.graded_as)
        if question is None or answer is None:
            missing = " and ".join(
                what
                for what, value in (
                    ("a question (question/problem/prompt)", question),
                    ("an answer (answer/solution)", answer),
                )
                if value is None
            )
            raise ValueError(f"{where}: missing {missing}; the row has keys {sorted(row)}; {JSONL_EXPECTED}")
        return Problem(template.format(question=question), answer, str(question))

    def sample(self, n: int, rng: random.Random) -> list[Problem]:
        return [rng.choice(self.train) for _ in range(n)]

    def heldout(self, n: int, seed: int) -> list[Problem]:
        return self.test[:n]


def _datasets_to_jsonl(name: str) -> str:
    """Materialize a Hugging Face dataset (when `datasets` is installed and the data is cached) as a temp JSONL."""
    import tempfile

    from datasets import load_dataset  # optional dependency

    ds = (
        load_dataset("openai/gsm8k", "main", split="train")
        if name == "gsm8k"
        else load_dataset("hendrycks/competition_math", split="train")
    )
    path = Path(tempfile.mkdtemp()) / f"{name}.jsonl"
    path.write_text("\n".join(json.dumps(dict(row)) for row in ds))
    return str(path)


def _make_jsonl_task(name: str, data_path: str | None, prompt_template: str | None, heldout_frac: float, seed: int):
    if data_path is None:
        try:
            data_path = _datasets_to_jsonl(name)
        except Exception as exc:  # noqa: BLE001 -- any failure means "no local copy": a refusal, not a traceback
            first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
            raise DataRefused(
                f"task={name!r} needs --data-path FILE.jsonl (question/answer or problem/solution per line); "
                f"loading it with the datasets library failed: {first}"
            ) from None
    try:
        graded_as = MathAnswer if name == "math" else str
        task = JsonlTask(data_path, prompt_template or ANSWER_IS_TEMPLATE, heldout_frac, seed, graded_as)
    except ValueError as exc:  # the data's faults, named by file and line: a refusal, not a crash
        raise exc if isinstance(exc, Refused) else DataRefused(str(exc)) from None
    if name == "math":  # graded with math-verify when it is installed (rewards.MathAnswer)
        task.train, task.test = ([dataclasses.replace(p, answer=MathAnswer(p.answer)) for p in ps]
                                 for ps in (task.train, task.test))  # fmt: skip
    return task


def _register(name: str, what: str) -> None:
    """gsm8k and math: the same reader, each under its own name."""

    def factory(*, data_path: str | None, prompt_template: str | None, heldout_frac: float, seed: int, **_):
        return _make_jsonl_task(name, data_path, prompt_template, heldout_frac, seed)

    factory.__qualname__ = f"make_{name}"
    help_text = f"{what} from the JSONL file of data_path (or a cached Hugging Face copy)"
    register_task(name, help=help_text, reads_data_path=True)(factory)


_register("gsm8k", "GSM8K grade-school math")
_register("math", "MATH competition problems")


class RowsTask(JsonlTask):
    """`--task jsonl`: your own problems, one JSON object a line: a prompt (question/problem/prompt) and any other
    fields, all of which reach the reward functions (`--reward`). A row's answer/solution, when it has one, is its
    ground truth (accuracy, and the built-in `correctness` reward); a row without one is graded by the reward
    functions (correct when their weighted sum is > 0), so such data needs --reward."""

    def __init__(self, path: str, prompt_template: str, heldout_frac: float, seed: int, grader=None):
        self.grader = grader
        self.unanswered: list[str] = []  # "FILE: line N" of each row without an answer (graded by `grader`)
        super().__init__(path, prompt_template, heldout_frac, seed)
        n, correctness = len(self.train) + len(self.test), "correctness" in dict(getattr(grader, "refs", ()))
        if correctness and 0 < len(self.unanswered) < n:  # (all without one: refused by the reward's check, naming it)
            raise ValueError(
                f"{self.unanswered[0]}: no answer (answer/solution), and --reward includes correctness, which grades "
                f"a row against its answer ({len(self.unanswered)} of the {n} rows have none); give every row an "
                "answer, or leave correctness out of --reward"
            )

    def _parse(self, row: dict, template: str, where: str) -> Problem:
        question = _question(row, where)
        if question is None:
            raise ValueError(
                f"{where}: no prompt (one of question/problem/prompt); the row has keys {sorted(row)}; expected one "
                'JSON object per line with a prompt and any other fields, e.g. {"prompt": "2 + 3 =", "answer": "5"}'
            )
        taken = [k for k in ("prompts", "completion", "completions") if k in row]
        if taken and self.grader is not None:  # the reward functions' own arguments, as TRL's (see RewardFunctions)
            raise ValueError(
                f"{where}: a field named {taken[0]!r}: the reward functions get prompts= and completions= (the prompt "
                "as the model saw it and the model's completions), so this field would be lost; rename it"
            )
        for name, field in self.grader.required_fields() if self.grader is not None else ():
            if field not in row:  # (the call would fail when this row is drawn, mid-run, naming no line)
                raise ValueError(
                    f"{where}: no field {field!r}, which reward {name!r} takes as an argument; the row has "
                    f"{sorted(row)}; give every row that field, or the argument a default"
                )
        builtin = self.grader is None or "correctness" in dict(self.grader.refs)  # else --reward grades it alone
        answer = _answer(row, where, str if builtin else None)
        if answer is None and self.grader is None:
            raise ValueError(
                f"{where}: no answer (answer/solution) and no --reward to grade it; give the rows an answer or name "
                "reward functions with --reward module:function"
            )
        if answer is None:
            self.unanswered.append(where)
        prompt = template.format(question=question)
        grader = self.grader if answer is None else None
        return Problem(prompt, RowAnswer(answer or "", dict(row), prompt, grader), str(question))


@register_task(
    "jsonl", help="your own JSONL (data_path): a prompt field and any others, graded by --reward", reads_data_path=True
)
def make_rows(*, data_path: str | None, prompt_template: str | None, heldout_frac: float, seed: int, reward=None, **_):
    if data_path is None:
        raise ValueError("task='jsonl' needs --data FILE.jsonl (a prompt field and any other fields per line)")
    grader = RewardFunctions(reward) if reward else None
    try:
        return RowsTask(data_path, prompt_template or "{question}", heldout_frac, seed, grader)
    except ValueError as exc:  # the data's faults, named by file and line: a refusal, not a crash
        raise exc if isinstance(exc, Refused) else DataRefused(str(exc)) from None
