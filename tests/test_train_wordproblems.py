"""Trainer tasks beyond arithmetic, offline: procedural word problems (`--task wordproblems`) and the committed GSM8K /
MATH sample files read through `--task gsm8k` / `--task math` with `--data-path`."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest

from train.rewards import correctness_reward
from train.tasks import WORD_PROBLEMS, JsonlTask, WordProblemTask, _is_heldout, make_task

DATA = Path(__file__).resolve().parents[1] / "train" / "data"


def _numbers(question: str) -> list[int]:
    return [int(x) for x in re.findall(r"\d+", question)]


def _boxes(n: list[int], q: str) -> int:
    return n[0] * n[1] // n[2] if "completely" in q else n[0] * n[1] % n[2]


# Each template's answer recomputed from the numbers in its question, in the order they appear (independent of the
# generator's own arithmetic).
RECOMPUTE = {
    "shopping_change": lambda n, q: n[4] - n[0] * n[1] - n[2] * n[3],
    "two_speeds": lambda n, q: n[0] * n[1] + n[2] * n[3],
    "rate_time": lambda n, q: n[0] * (60 * n[1] + n[2]),
    "ratio": lambda n, q: n[2] // n[0] * (n[0] + n[1]),
    "discount": lambda n, q: n[0] * (100 - n[1]) // 100 - n[2],
    "give_and_buy": lambda n, q: n[0] - n[1] + n[2] * n[3],
    "ages": lambda n, q: (n[2] - n[0] - 2 * n[1]) // 2,
    "boxes": _boxes,
    "savings": lambda n, q: (n[2] - n[0]) // n[1],
    "growth": lambda n, q: n[0] * (100 + n[1]) // 100 - n[2],
    "average": lambda n, q: n[-1] * n[-2] - sum(n[:-3]),
    "pages": lambda n, q: n[4] - n[0] * n[1] - n[2] * n[3],
}


def test_templates():
    assert len(WORD_PROBLEMS) >= 8 and set(RECOMPUTE) == set(WORD_PROBLEMS)


@pytest.mark.parametrize("name", sorted(WORD_PROBLEMS))
def test_word_problem_answers_are_right(name):
    rng = random.Random(name)
    questions = set()
    for _ in range(200):
        question, answer = WORD_PROBLEMS[name](rng)
        assert isinstance(answer, int) and answer >= 0, (question, answer)
        assert answer == RECOMPUTE[name](_numbers(question), question), question
        assert question.rstrip().endswith("?")
        questions.add(question)
    assert len(questions) > 100  # the slots vary


def test_word_problems_rewarded_by_correctness_reward():
    for p in WordProblemTask().sample(50, random.Random(0)):
        assert p.question in p.prompt and "The answer is" in p.prompt
        assert correctness_reward(f"Step by step... The answer is {p.answer}.", p.answer) == 1.0
        assert correctness_reward(f"The answer is {int(p.answer) + 1}.", p.answer) == 0.0


def test_word_problems_seeded_mixed_and_split():
    task = WordProblemTask(heldout_frac=0.2)
    a, b = task.sample(40, random.Random(3)), task.sample(40, random.Random(3))
    assert a == b and a != task.sample(40, random.Random(4))
    train = task.sample(3000, random.Random(1))
    held = task.heldout(200, seed=0)
    assert held == task.heldout(200, seed=0) and len({p.question for p in held}) == 200
    assert all(_is_heldout(p.question, 0.2) for p in held)
    assert not {p.question for p in train} & {p.question for p in held}
    # every template shows up in a training draw (a phrase unique to each)
    phrases = ["change", "train travels", "machine fills", "ratio", "% off", "stickers", "sum of their ages"]
    phrases += ["bakery", "saves", "population", "average", "pages"]
    assert all(any(ph in p.question for p in train) for ph in phrases)


def test_make_task_wordproblems():
    task = make_task("wordproblems", prompt_template="Q: {question} A:", heldout_frac=0.3)
    assert isinstance(task, WordProblemTask) and task.heldout_frac == 0.3
    p = task.sample(1, random.Random(0))[0]
    assert p.prompt == f"Q: {p.question} A:"


# ----------------------------------------------------------------------------------------------------- JSONL samples

GSM8K_ANSWERS = ["131", "165", "69", "5", "62", "75", "12", "90"]  # train/data/gsm8k_sample.jsonl, in file order
MATH_ANSWERS = ["49", "9", "3/4", "9", "23", "2", "50", "1/5"]  # train/data/math_sample.jsonl


@pytest.mark.parametrize(
    "task, file, answers",
    [("gsm8k", "gsm8k_sample.jsonl", GSM8K_ANSWERS), ("math", "math_sample.jsonl", MATH_ANSWERS)],
)
def test_sample_files_through_the_cli(task, file, answers):
    pytest.importorskip("transformers")  # train.config's checks import the RL layer (torch)
    from train.config.cli import parse_args

    cfg, _ = parse_args(["--task", task, "--data-path", str(DATA / file)])
    loaded = make_task(cfg.task, data_path=cfg.data_path, heldout_frac=cfg.heldout_frac, seed=cfg.seed)
    assert isinstance(loaded, JsonlTask) and len(loaded.train) == 7 and len(loaded.test) == 1  # int(8 * 0.2) held out
    rows = [json.loads(line) for line in (DATA / file).read_text().splitlines() if line.strip()]
    by_question = {p.question: p for p in loaded.train + loaded.test}
    for row, answer in zip(rows, answers, strict=True):
        p = by_question[row.get("question") or row.get("problem")]
        assert p.answer == answer
        assert p.prompt.endswith("Put the final answer after 'The answer is'.")
        assert correctness_reward(f"Working... The answer is {answer}.", p.answer) == 1.0
        assert correctness_reward(f"So the result is \\boxed{{{answer}}}.", p.answer) == 1.0
        assert correctness_reward("The answer is 1000.", p.answer) == 0.0


def test_math_sample_fractions():
    task = make_task("math", data_path=str(DATA / "math_sample.jsonl"))
    three_quarters = next(p for p in task.train + task.test if "2}{3} + " in p.question)
    assert three_quarters.answer == "3/4"
    assert correctness_reward("The answer is 0.75.", three_quarters.answer) == 1.0
    assert correctness_reward("$\\boxed{\\frac{3}{4}}$", three_quarters.answer) == 1.0
    assert correctness_reward("The answer is 4/3.", three_quarters.answer) == 0.0
