"""Tasks with verifiable answers: procedural arithmetic (default), GSM8K and MATH from local JSONL files.

A task yields `Problem(prompt, answer)`. `prompt` is the user message (the chat template is applied by the trainer);
`answer` is the ground-truth string that `rewards.correctness_reward` compares against.

Arithmetic is seeded and split by a hash of the question: a question whose hash falls in the held-out bucket is never
drawn for training, so held-out accuracy measures generalization to unseen problems, not memorization.
"""

from __future__ import annotations

import hashlib
import json
import random
import string
from dataclasses import dataclass
from pathlib import Path

from train.rewards import extract_answer


@dataclass(frozen=True)
class Problem:
    prompt: str
    answer: str
    question: str = ""  # the bare question (for logs)


# level -> (description, generator). Generators take a random.Random and return (question, answer).
def _add(lo_a: int, hi_a: int, lo_b: int, hi_b: int):
    def gen(rng: random.Random) -> tuple[str, int]:
        a, b = rng.randint(lo_a, hi_a), rng.randint(lo_b, hi_b)
        return f"{a} + {b}", a + b

    return gen


def _sub(rng: random.Random) -> tuple[str, int]:
    a, b = rng.randint(10, 99), rng.randint(10, 99)
    return f"{a} - {b}", a - b


def _mul(lo_a: int, hi_a: int, lo_b: int, hi_b: int):
    def gen(rng: random.Random) -> tuple[str, int]:
        a, b = rng.randint(lo_a, hi_a), rng.randint(lo_b, hi_b)
        return f"{a} * {b}", a * b

    return gen


LEVELS = {
    1: ("1-digit addition", _add(0, 9, 0, 9)),
    2: ("2-digit + 1-digit addition", _add(10, 99, 0, 9)),
    3: ("2-digit addition", _add(10, 99, 10, 99)),
    4: ("2-digit subtraction", _sub),
    5: ("1-digit multiplication", _mul(2, 9, 2, 9)),
    6: ("2-digit x 1-digit multiplication", _mul(10, 99, 2, 9)),
    7: ("3-digit addition", _add(100, 999, 100, 999)),
    8: ("2-digit x 2-digit multiplication", _mul(10, 99, 10, 99)),
}


def parse_levels(spec: str | int) -> list[int]:
    """'3' -> [3]; '1-3' -> [1, 2, 3]; '1,5' -> [1, 5]. Anything else raises ValueError naming the spec."""
    expected = f"expected levels in {min(LEVELS)}..{max(LEVELS)} like '3', '1-3' or '1,5'"
    levels: list[int] = []
    try:
        for part in str(spec).split(","):
            part = part.strip()
            if "-" in part:
                lo, hi = part.split("-")
                if int(lo) > int(hi):
                    raise ValueError
                levels.extend(range(int(lo), int(hi) + 1))
            elif part:
                levels.append(int(part))
    except ValueError:
        raise ValueError(f"difficulty={spec!r}: {expected}") from None
    bad = [lv for lv in levels if lv not in LEVELS]
    if not levels or bad:
        raise ValueError(f"difficulty={spec!r}: {expected}")
    return levels


TEMPLATE_FIELDS = ("question",)  # the fields a prompt template may use


def check_template(template: str) -> str:
    """A prompt template: `str.format` text with `{question}` (at least once) and no other field."""
    try:
        names = [name for _, name, _, _ in string.Formatter().parse(template) if name is not None]
    except ValueError as exc:  # unbalanced braces
        raise ValueError(f"prompt_template={template!r}: {exc} (write a literal brace as {{{{ or }}}})") from None
    unknown = sorted({n for n in names if n not in TEMPLATE_FIELDS})
    if unknown:
        raise ValueError(
            f"prompt_template={template!r}: unknown field(s) {', '.join('{' + n + '}' for n in unknown)}; "
            "the only field is {question}"
        )
    if "question" not in names:
        raise ValueError(f"prompt_template={template!r}: has no {{question}} field (every prompt would be the same)")
    return template


def _is_heldout(question: str, heldout_frac: float) -> bool:
    h = int.from_bytes(hashlib.sha256(question.encode()).digest()[:8], "little")
    return (h % 10_000) < heldout_frac * 10_000


class ArithmeticTask:
    """Procedural arithmetic. `difficulty` selects levels (see LEVELS); each problem draws a level uniformly."""

    system_prompt = "Reply with the number only."  # short answers fit a short generation budget

    def __init__(self, difficulty: str | int = "1-3", prompt_template: str = "{question} =", heldout_frac: float = 0.2):
        self.levels = parse_levels(difficulty)
        self.template = check_template(prompt_template)
        self.heldout_frac = heldout_frac

    def _draw(self, rng: random.Random, heldout: bool) -> Problem:
        for _ in range(10_000):
            question, answer = LEVELS[rng.choice(self.levels)][1](rng)
            if _is_heldout(question, self.heldout_frac) == heldout:
                return Problem(self.template.format(question=question), str(answer), question)
        raise RuntimeError("could not draw a problem from the requested split; change heldout_frac")

    def sample(self, n: int, rng: random.Random) -> list[Problem]:
        """n training problems (never from the held-out split)."""
        return [self._draw(rng, heldout=False) for _ in range(n)]

    def heldout(self, n: int, seed: int) -> list[Problem]:
        """A fixed held-out set: the same n problems for a given seed, disjoint from every training draw."""
        rng = random.Random(f"heldout-{seed}")
        seen: dict[str, Problem] = {}
        for _ in range(50 * n):  # distinct problems (small levels run out: then the larger ones fill the set)
            p = self._draw(rng, heldout=True)
            seen.setdefault(p.question, p)
            if len(seen) == n:
                break
        return list(seen.values())


QUESTION_KEYS = ("question", "problem", "prompt")  # the problem text: the first of these present in a row
ANSWER_KEYS = ("answer", "solution")  # the ground truth: GSM8K "... #### 42", MATH "... \\boxed{42}", or a bare value
JSONL_EXPECTED = (
    "expected JSON Lines: one JSON object per line with a question (one of question/problem/prompt) and an answer "
    '(answer/solution), e.g. {"question": "What is 2 + 3?", "answer": "5"}'
)


def read_jsonl(path: str | Path) -> list[tuple[int, dict]]:
    """(line number, row) of every non-blank line of a JSON Lines file. A file that is not UTF-8 text, a line that is
    not JSON, or a row that is not an object raises ValueError naming the file, the line and what was expected."""
    data = Path(path).read_bytes()
    if b"\x00" in data:
        line = data[: data.index(b"\x00")].count(b"\n") + 1
        raise ValueError(f"{path}: line {line}: a NUL byte: a binary file, not text; {JSONL_EXPECTED}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise ValueError(f"{path}: line {line}: not UTF-8 text ({exc.reason}); {JSONL_EXPECTED}") from None
    rows = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(
                f"{path}: line {number}: not valid JSON ({exc.msg}, column {exc.colno}); {JSONL_EXPECTED}"
            ) from None
        if not isinstance(row, dict):
            raise ValueError(f"{path}: line {number}: a JSON {type(row).__name__}, not an object; {JSONL_EXPECTED}")
        rows.append((number, row))
    return rows


class JsonlTask:
    """GSM8K / MATH style problems from a local JSONL file.

    Accepted fields: question/problem/prompt for the text; answer (GSM8K "... #### 42" or a bare value) or solution
    (MATH, the last \\boxed{...}) for the ground truth. Every row must have both (a row without them is an error
    naming its line, not skipped). The last `heldout_frac` of the shuffled file is held out.
    """

    system_prompt: str | None = None  # the chat template's default

    def __init__(self, path: str, prompt_template: str = "{question}", heldout_frac: float = 0.2, seed: int = 0):
        check_template(prompt_template)
        problems = [self._parse(row, prompt_template, f"{path}: line {n}") for n, row in read_jsonl(path)]
        if len(problems) < 2:
            raise ValueError(f"{path}: {len(problems)} problem(s); need at least 2 (training and held-out)")
        random.Random(seed).shuffle(problems)
        n_held = max(1, int(len(problems) * heldout_frac))
        self.train, self.test = problems[:-n_held], problems[-n_held:]

    @staticmethod
    def _parse(row: dict, template: str, where: str) -> Problem:
        question = next((row[k] for k in QUESTION_KEYS if row.get(k) not in (None, "")), None)
        raw = next((row[k] for k in ANSWER_KEYS if row.get(k) not in (None, "")), None)
        if question is None or raw is None:
            missing = " and ".join(
                what
                for what, value in (
                    ("a question (question/problem/prompt)", question),
                    ("an answer (answer/solution)", raw),
                )
                if value is None
            )
            raise ValueError(f"{where}: missing {missing}; the row has keys {sorted(row)}; {JSONL_EXPECTED}")
        answer = extract_answer(str(raw)) if ("####" in str(raw) or "\\boxed" in str(raw)) else str(raw).strip()
        if not answer:
            raise ValueError(
                f"{where}: no final answer in {str(raw)[:80]!r}; expected a bare value, GSM8K's '#### 42' or MATH's "
                "\\boxed{42}"
            )
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


def make_task(
    name: str,
    *,
    difficulty: str = "1-3",
    data_path: str | None = None,
    prompt_template: str | None = None,
    heldout_frac: float = 0.2,
    seed: int = 0,
):
    if name == "arithmetic":
        return ArithmeticTask(difficulty, prompt_template or "{question} =", heldout_frac)
    if name in ("gsm8k", "math"):
        if data_path is None:
            try:
                data_path = _datasets_to_jsonl(name)
            except Exception as exc:  # noqa: BLE001 -- any failure means "no local copy"
                raise ValueError(
                    f"task={name!r} needs --data-path FILE.jsonl (question/answer or problem/solution per line); "
                    f"loading it with the datasets library failed: {exc}"
                ) from exc
        default = "{question}\nPut the final answer after 'The answer is'."
        return JsonlTask(data_path, prompt_template or default, heldout_frac, seed)
    raise ValueError(f"task={name!r}: expected 'arithmetic', 'gsm8k' or 'math'")
