"""What every task shares: `Problem`, the prompt-template check and the hash split of the procedural tasks.

A task yields `Problem(prompt, answer)`. `prompt` is the user message (the chat template is applied by the trainer);
`answer` is the ground-truth string that `rewards.correctness_reward` compares against (for HumanEval a
`rewards.CodeTests`, whose reward runs the tests).

The procedural tasks are seeded and split by a hash of the question (`_is_heldout`; HumanEval splits by a hash of its
task id): a problem whose hash falls in the held-out bucket is never drawn for training, so held-out accuracy measures
generalization to unseen problems, not memorization.
"""

from __future__ import annotations

import hashlib
import random
import string
from collections.abc import Iterable
from dataclasses import dataclass

from ..errors import Refused


@dataclass(frozen=True)
class Problem:
    prompt: str
    answer: str
    question: str = ""  # the bare question (for logs)


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
    try:  # a format spec or conversion the question's text refuses ({question:d})
        template.format(question="What is 2 + 3?")
    except (ValueError, TypeError) as exc:
        raise ValueError(f"prompt_template={template!r}: {exc} (the question is text: write {{question}})") from None
    return template


class TaskRefused(Refused, ValueError):
    """The task cannot be built with these settings (a split that leaves one side empty): the message names the flags
    (`python -m train` prints it and exits 2, no traceback)."""


HASH_BUCKETS = 10_000  # `_is_heldout` puts a question in one of these; the first heldout_frac of them are held out


def _is_heldout(question: str, heldout_frac: float) -> bool:
    h = int.from_bytes(hashlib.sha256(question.encode()).digest()[:8], "little")
    return (h % HASH_BUCKETS) < heldout_frac * HASH_BUCKETS


def check_split(heldout_frac: float, questions: Iterable[str] | None, flags: str, total: int | None = None) -> None:
    """TaskRefused unless both sides of the hash split of `questions` (every distinct problem of the task; None: too
    many to list, then only `heldout_frac` itself is judged) hold a problem. The listing stops at the first question
    of the second side, so a task whose sides are both there pays for a few hashes. `flags` names the settings in the
    message ("--heldout-frac 0.01 with --difficulty 5"); `total`: the number of problems, when known."""
    if HASH_BUCKETS - 1 < heldout_frac * HASH_BUCKETS:  # every bucket is held out: nothing is left to train on
        held, kept = total, 0
    elif questions is None:
        return
    else:
        held = kept = 0
        for q in questions:
            held, kept = (held + 1, kept) if _is_heldout(q, heldout_frac) else (held, kept + 1)
            if held and kept:
                return
    counted = "all of its" if held is None else f"{held} of its {held + kept}"
    raise TaskRefused(
        f"{flags}: {counted} distinct problems are held out and {kept} left for training (split by a hash of each "
        f"problem); each side needs at least one: use a {'larger' if held == 0 else 'smaller'} --heldout-frac"
    )


DRAW_TRIES = 10_000  # `_draw` gives up after this many problems from the other side
MASS_DRAWS = 10_000  # draws that measure how often the generator lands on each side of the split
MIN_SIDE_MASS = 0.002  # below it DRAW_TRIES can run out mid-run (a side drawn 0.001 of the time: e^-10 a draw)


class ProceduralTask:
    """A task drawn from `_generate(rng) -> (question, answer)`, split into training and held-out problems by a hash
    of the question (`_is_heldout`)."""

    system_prompt: str | None = None
    template: str
    heldout_frac: float

    def _generate(self, rng: random.Random) -> tuple[str, int]:
        raise NotImplementedError

    def check_split(self, questions: Iterable[str] | None, flags: str, total: int | None = None) -> None:
        """`check_split` (each side holds a distinct problem), then TaskRefused unless each side also gets at least
        MIN_SIDE_MASS of the generator's draws (MASS_DRAWS from a seed of its own: no run's draws change): a side of
        a problem or two that the generator seldom draws would make `_draw` give up, at the start or mid-run."""
        check_split(self.heldout_frac, questions, flags, total)
        rng = random.Random("split-mass")
        held = sum(_is_heldout(self._generate(rng)[0], self.heldout_frac) for _ in range(MASS_DRAWS))
        side, low = ("held-out", held) if held <= MASS_DRAWS - held else ("training", MASS_DRAWS - held)
        if low < MIN_SIDE_MASS * MASS_DRAWS:
            raise TaskRefused(
                f"{flags}: only {low} of {MASS_DRAWS:,} problems drawn from the task land on the {side} side "
                f"({low / MASS_DRAWS:.4f}); drawing a side that comes up less than {MIN_SIDE_MASS} of the time can "
                f"stall: use a {'larger' if side == 'held-out' else 'smaller'} --heldout-frac"
            )

    def _draw(self, rng: random.Random, heldout: bool) -> Problem:
        for _ in range(DRAW_TRIES):
            question, answer = self._generate(rng)
            if _is_heldout(question, self.heldout_frac) == heldout:
                return Problem(self.template.format(question=question), str(answer), question)
        side = "held-out" if heldout else "training"
        raise TaskRefused(f"{type(self).__name__}: no {side} problem in {DRAW_TRIES:,} draws: the task has too few "
                          "distinct problems for its hash split, or all land on one side; change --heldout-frac "
                          "(a task's __init__ can refuse this when built: self.check_split(...))")  # fmt: skip

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


def check_problems(task: str, problems: object, call: str = "heldout()", n: int | None = None) -> None:
    """TaskRefused unless `problems` (what a task's `call` gave: its held-out set, drawn before the run folder is
    touched; a draw of `n` training problems) is a non-empty list (of `n`) of `Problem`s with a non-empty text prompt
    and a text answer: a custom task's mistake is refused, not trained on or met as a traceback in a rollout."""
    if not isinstance(problems, list) or not problems:
        raise TaskRefused(f"{task}: {call} returned {problems!r:.80}; expected a non-empty list of "
                          "train.tasks.Problem")  # fmt: skip
    if n is not None and len(problems) != n:  # (the step's batch would silently have other groups than asked)
        raise TaskRefused(f"{task}: {call} returned {len(problems)} problem{'s' * (len(problems) != 1)}; expected {n}")
    for i, p in enumerate(problems):
        ok = isinstance(p, Problem) and isinstance(p.prompt, str) and isinstance(p.answer, str)
        if not (ok and p.prompt.strip()):
            raise TaskRefused(f"{task}: {call}[{i}] is {p!r:.80}; expected a train.tasks.Problem with a "
                              "non-empty str prompt and a str answer")  # fmt: skip


def sample_checked(task, n: int, rng: random.Random) -> list[Problem]:
    """`task.sample(n, rng)`, checked (`check_problems`): every draw of training problems goes through it."""
    problems = task.sample(n, rng)
    check_problems(f"task {type(task).__name__}", problems, f"sample({n}, rng)", n)
    return problems
