"""Trainer: answer extraction, rewards and task generation (no model needed)."""

from __future__ import annotations

import json
import random
import re

import pytest

pytest.importorskip("transformers")

from train.rewards import answers_match, correctness_reward, extract_answer, format_reward  # noqa: E402
from train.tasks import LEVELS, ArithmeticTask, JsonlTask, check_template, make_task, parse_levels  # noqa: E402


@pytest.mark.parametrize(
    "text, expected",
    [
        ("17", "17"),
        ("The answer is 17.", "17"),
        ("= 17", "17"),
        ("17.0", "17.0"),
        ("12 + 5 = 17", "17"),
        ("The answer is: 17", "17"),
        ("so \\boxed{17} is it", "17"),
        ("work... #### 1,234", "1234"),
        ("It is -3.", "-3"),
        ("no number here", None),
        ("The answer is 17. Check: 17 - 5 = 12", "17"),
        # \boxed with nested braces: the whole content, not the last number inside it (was "2", "000", "2")
        ("so \\boxed{\\frac{1}{2}}", "1/2"),
        ("\\boxed{1{,}000}", "1000"),
        ("first \\boxed{3}, finally \\boxed{\\dfrac{-3}{4}}", "-3/4"),
        ("\\boxed{\\sqrt{2}}", "\\sqrt{2}"),
    ],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


@pytest.mark.parametrize(
    "text, truth, reward",
    [
        ("17", 17, 1.0),
        ("The answer is 17.", "17", 1.0),
        ("= 17", 17, 1.0),
        ("17.0", 17, 1.0),
        ("17.5", 17, 0.0),
        ("18", 17, 0.0),
        ("", 17, 0.0),
        ("1,234", 1234, 1.0),
        ("0.5", "1/2", 1.0),
        ("The answer is 7 * 6 = 42", 42, 1.0),
        ("The answer is 42. 7 * 6 = 42", 42, 1.0),
        ("$\\boxed{\\frac{1}{2}}$", "0.5", 1.0),
        ("$\\boxed{\\frac{1}{2}}$", "2", 0.0),
    ],
)
def test_correctness_reward(text, truth, reward):
    assert correctness_reward(text, truth) == reward


def test_answers_match_edge_cases():
    assert not answers_match(None, 3)
    assert answers_match("abc", "abc")
    assert format_reward("42") == 1.0 and format_reward("The answer is 42.") == 1.0
    assert format_reward("Let me think step by step about this problem and many other things 42") == 0.0


def test_parse_levels():
    assert parse_levels("3") == [3]
    assert parse_levels("1-3") == [1, 2, 3]
    assert parse_levels("1,2,5") == [1, 2, 5]
    for bad in ("0", "9", "", "2-12", "abc", "1-2-3", "3-1", "1,x"):
        with pytest.raises(ValueError, match="difficulty"):
            parse_levels(bad)


@pytest.mark.parametrize("level", sorted(LEVELS))
def test_arithmetic_answers_are_right(level):
    task = ArithmeticTask(str(level))
    for p in task.sample(50, random.Random(level)):
        assert int(p.answer) == eval(p.question)  # noqa: S307 -- our own generated "a op b"
        assert p.question in p.prompt


def test_arithmetic_seeded_and_split():
    task = ArithmeticTask("2-3", heldout_frac=0.2)
    a = task.sample(30, random.Random(0))
    b = task.sample(30, random.Random(0))
    assert a == b
    held = task.heldout(100, seed=0)
    assert held == task.heldout(100, seed=0)
    assert len({p.question for p in held}) == len(held) == 100
    train_q = {p.question for p in task.sample(3000, random.Random(1))}
    assert not train_q & {p.question for p in held}


def test_difficulty_levels_grow():
    def digits(level):
        return sum(len(p.answer.lstrip("-")) for p in ArithmeticTask(str(level)).sample(200, random.Random(0))) / 200

    assert digits(1) < digits(3) < digits(8)


def test_jsonl_task(tmp_path):
    rows = [{"question": f"What is {i} plus {i}?", "answer": f"{i} + {i} = {2 * i}\n#### {2 * i}"} for i in range(10)]
    rows += [{"problem": "1/2 + 1/2?", "solution": "It is $\\boxed{1}$."}]
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    task = make_task("gsm8k", data_path=str(path), heldout_frac=0.25)
    assert isinstance(task, JsonlTask)
    assert len(task.train) + len(task.test) == 11
    every = {p.question: p.answer for p in task.train + task.test}
    assert every["What is 3 plus 3?"] == "6" and every["1/2 + 1/2?"] == "1"
    assert task.heldout(100, 0) == task.test
    with pytest.raises(ValueError, match="task"):
        make_task("nope")


@pytest.mark.parametrize(
    "content, line, expected",
    [
        (b'{"question": "1+1", "answer": "2"}\n{"question": "2+2", "answer": 4\n', 2, "not valid JSON"),
        (b'{"question": "1+1", "answer": "2"}\n\n[1, 2]\n', 3, "a JSON list, not an object"),
        (b'{"question": "1+1", "answer": "2"}\n"text"\n', 2, "a JSON str, not an object"),
        (b'{"question": "1+1", "answer": "2"}\n{"question": "2+2"}\n', 2, "missing an answer"),
        (b'{"q": "1+1", "a": "2"}\n', 1, r"missing a question .* and an answer .*keys \['a', 'q'\]"),
        (
            b'{"question": "1+1", "answer": "2"}\n{"question": "x", "solution": "no box \\\\boxed{}"}\n',
            2,
            "no final answer",
        ),
        (b'{"question": "1+1", "answer": "2"}\n\x89PNG\x00\x00', 2, "binary file"),
        (b'{"question": "1+1", "answer": "2"}\n{"question": "\xff\xfe"}\n', 2, "not UTF-8"),
    ],
)
def test_malformed_data_file_names_file_line_and_expectation(tmp_path, content, line, expected):
    """A data file that is not JSON Lines of question/answer objects is refused with the file, the line and what was
    expected (it was a bare json/KeyError traceback, or the row was silently skipped)."""
    path = tmp_path / "bad.jsonl"
    path.write_bytes(content)
    with pytest.raises(ValueError) as exc:
        make_task("gsm8k", data_path=str(path))
    msg = str(exc.value)
    assert f"{path}: line {line}: " in msg
    assert re.search(expected, msg), msg
    assert "expected" in msg


def test_data_file_with_too_few_problems(tmp_path):
    path = tmp_path / "one.jsonl"
    path.write_text('{"question": "1+1", "answer": "2"}\n')
    with pytest.raises(ValueError, match="1 distinct problem.*at least 2"):
        make_task("math", data_path=str(path))


@pytest.mark.parametrize("template", ["{q} =", "{question} {answer}", "{}", "{question", "no field at all"])
def test_prompt_template_fields_are_checked(template):
    with pytest.raises(ValueError, match="prompt_template"):
        check_template(template)
    with pytest.raises(ValueError, match="prompt_template"):
        ArithmeticTask("1", prompt_template=template)
    assert check_template("Q: {question} = ?") == "Q: {question} = ?"


def test_a_bad_reward_from_python_is_refused_before_the_model_loads(tmp_path):
    """`--reward nomod:fn` is refused when the flag is parsed; `train(TrainConfig(reward="nomod:fn"))` loaded the
    model first and left an empty output folder behind."""
    from conftest import tiny_cfg

    from train import loop
    from train.errors import Refused

    out = tmp_path / "run"
    with pytest.raises(Refused, match="--reward: .*nomod"):
        loop.train(tiny_cfg(out, reward="nomod:fn"))
    assert not out.exists()  # (it was made, empty, by the setup that loaded the model)
