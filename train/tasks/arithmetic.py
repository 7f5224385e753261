"""`--task arithmetic`: procedural arithmetic in levels 1-8 (`--difficulty`), seeded, hash-split held-out set."""

from __future__ import annotations

import random

from ..tasks.base import ProceduralTask, check_template
from ..tasks.registry import register_task


# level -> (description, generator). Generators take a random.Random and return (question, answer); each lists its
# every question (`gen.questions()`, for the split's check) and says how many there are (`gen.size`).
def _space(gen, op: str, lo_a: int, hi_a: int, lo_b: int, hi_b: int):
    """`gen` with its problem space: the questions f"{a} {op} {b}" for a in lo_a..hi_a, b in lo_b..hi_b."""
    gen.questions = lambda: (f"{a} {op} {b}" for a in range(lo_a, hi_a + 1) for b in range(lo_b, hi_b + 1))
    gen.size = (hi_a - lo_a + 1) * (hi_b - lo_b + 1)
    return gen


def _add(lo_a: int, hi_a: int, lo_b: int, hi_b: int):
    def gen(rng: random.Random) -> tuple[str, int]:
        a, b = rng.randint(lo_a, hi_a), rng.randint(lo_b, hi_b)
        return f"{a} + {b}", a + b

    return _space(gen, "+", lo_a, hi_a, lo_b, hi_b)


def _sub(rng: random.Random) -> tuple[str, int]:
    a, b = rng.randint(10, 99), rng.randint(10, 99)
    return f"{a} - {b}", a - b


_space(_sub, "-", 10, 99, 10, 99)


def _mul(lo_a: int, hi_a: int, lo_b: int, hi_b: int):
    def gen(rng: random.Random) -> tuple[str, int]:
        a, b = rng.randint(lo_a, hi_a), rng.randint(lo_b, hi_b)
        return f"{a} * {b}", a * b

    return _space(gen, "*", lo_a, hi_a, lo_b, hi_b)


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


class ArithmeticTask(ProceduralTask):
    """Procedural arithmetic. `difficulty` selects levels (see LEVELS); each problem draws a level uniformly."""

    system_prompt = "Reply with the number only."  # short answers fit a short generation budget

    def __init__(self, difficulty: str | int = "1-3", prompt_template: str = "{question} =", heldout_frac: float = 0.2):
        self.levels = parse_levels(difficulty)
        self.template = check_template(prompt_template)
        self.heldout_frac = heldout_frac
        gens = [LEVELS[lv][1] for lv in dict.fromkeys(self.levels)]  # the levels' questions never coincide
        questions = (q for gen in gens for q in gen.questions())
        flags = f"--heldout-frac {heldout_frac} with --difficulty {difficulty}"
        self.check_split(questions, flags, total=sum(gen.size for gen in gens))

    def _generate(self, rng: random.Random) -> tuple[str, int]:
        return LEVELS[rng.choice(self.levels)][1](rng)


@register_task("arithmetic", help="procedural arithmetic, levels 1-8 chosen by --difficulty (the default task)")
def make_arithmetic(*, difficulty: str, prompt_template: str | None, heldout_frac: float, **_) -> ArithmeticTask:
    return ArithmeticTask(difficulty, prompt_template or "{question} =", heldout_frac)
