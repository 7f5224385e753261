"""`--task wordproblems`: GSM8K-style problems of 2-4 steps, from templates with numeric slots; every answer is a
non-negative integer computed from the slots. Each generator takes a random.Random and returns (question, answer)."""

from __future__ import annotations

import math
import random

from ..tasks.base import ANSWER_IS_TEMPLATE, ProceduralTask, check_template
from ..tasks.registry import register_task

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
        self.check_split(None, f"--heldout-frac {heldout_frac}")  # too many problems to list: the fraction

    def _generate(self, rng: random.Random) -> tuple[str, int]:
        return rng.choice(self.generators)(rng)


@register_task("wordproblems", help="procedural multi-step word problems (12 GSM8K-style templates, integer answers)")
def make_wordproblems(*, prompt_template: str | None, heldout_frac: float, **_) -> WordProblemTask:
    return WordProblemTask(prompt_template or ANSWER_IS_TEMPLATE, heldout_frac)
