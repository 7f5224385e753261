"""The trainer's user-fed surfaces (train/rewards.py, train/tasks/jsonl.py, train/config/file.py): a user's reward is
called once per scored batch and never hands one batch's rewards to another; a ground-truth answer the built-in
correctness reward can never grade correct, a lone surrogate in the data and a reward weight of 0 are refused before
training, naming what and where; a YAML syntax error names its line and the problem; `--config=~/x.yaml` is expanded;
rows that give one prompt two answers are named in a warning."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest

pytest.importorskip("transformers")

from conftest import tiny_cfg  # noqa: E402

import train.loop as loop  # noqa: E402
from train.batch import Batch  # noqa: E402
from train.config.cli import parse_args  # noqa: E402
from train.features.user_reward import UserReward  # noqa: E402
from train.rewards import RewardError, RewardFunctions, correctness_rewards, parse_reward_spec  # noqa: E402
from train.tasks import make_task  # noqa: E402
from train.tasks.base import Problem  # noqa: E402
from train.tasks.jsonl import DataRefused  # noqa: E402

COUNTING = """
CALLS = []

def exact(completions, prompts, target=None, answer=None, **kwargs):
    CALLS.append(len(completions))
    truth = target if target is not None else answer
    return [1.0 if c.strip() == str(t) else 0.0 for c, t in zip(completions, truth)]
"""


@pytest.fixture
def counting(tmp_path, monkeypatch):
    """A reward module that counts its calls (importable as `counting_rewards`)."""
    (tmp_path / "counting_rewards.py").write_text(textwrap.dedent(COUNTING))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "counting_rewards", raising=False)
    import counting_rewards

    return counting_rewards


def _batch(texts: list[str]) -> Batch:
    import torch

    n = len(texts)
    z = torch.zeros(n, 1)
    return Batch(z, z, z, z.bool(), texts, torch.zeros(n), torch.zeros(n, dtype=torch.bool))


def test_a_user_reward_is_called_once_per_scored_batch(tmp_path, counting):
    # was 2 calls a batch: the rollout's `correct` (rows without an answer are graded by the reward functions) and
    # the training reward each called the functions; the cache meant to share them never matched (its key was
    # overwritten by a loop variable of the same name)
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"say {i}", "target": str(i)}) + "\n" for i in range(10)))
    task = make_task("jsonl", data_path=str(data), heldout_frac=0.2, reward="counting_rewards:exact")
    scorer = UserReward(task.grader, group_size=2, format_weight=0.0)
    for step, problems in enumerate((task.train[:2], task.train[2:4], task.train[:2])):
        texts = [problems[0].answer.fields["target"], "x", "y", problems[1].answer.fields["target"]]
        truths = [problems[i // 2].answer for i in range(4)]
        correct = correctness_rewards(texts, truths)  # what the rollout asks first
        rewards = scorer.rescore(_batch(texts), problems).rewards.tolist()  # then the training reward
        assert correct == rewards == [1.0, 0.0, 0.0, 1.0]
        assert counting.CALLS == [4] * (step + 1)


def test_consecutive_batches_never_get_each_others_rewards(counting):
    # the rows of a built-in task's problems are dicts made anew per call, whose ids repeat from one call to the
    # next: a cache keyed on them would hand batch A's rewards to batch B
    scorer = UserReward(RewardFunctions("counting_rewards:exact,correctness"), group_size=2, format_weight=0.0)
    batch_a = [Problem("5 + 7 =", "12", "5 + 7"), Problem("6 + 6 =", "12", "6 + 6")]
    batch_b = [Problem("2 + 3 =", "5", "2 + 3"), Problem("1 + 1 =", "2", "1 + 1")]
    texts = ["12"] * 4  # a collapsed policy: the same reply to every prompt
    for _ in range(3):
        assert scorer.rescore(_batch(texts), batch_a).rewards.tolist() == [2.0] * 4
        assert scorer.rescore(_batch(texts), batch_b).rewards.tolist() == [0.0] * 4
    assert counting.CALLS == [4] * 6
    scorer.functions(texts, [p.prompt for p in batch_a for _ in "ab"], [{"question": "q", "answer": "12"}] * 4)
    scorer.functions(texts, [p.prompt for p in batch_a for _ in "ab"], [{"question": "q", "answer": "12"}] * 4)
    assert counting.CALLS == [4] * 7  # asked twice for the same batch (by content): scored once


def test_training_calls_a_user_reward_once_per_step(tmp_path, counting):
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"say {i}", "target": str(i)}) + "\n" for i in range(20)))
    cfg = tiny_cfg(tmp_path / "run", task="jsonl", data_path=str(data), reward="counting_rewards:exact",
                   max_steps=3, eval_k=0, kl_every=0)  # fmt: skip
    loop.train(cfg, {"entropy_filter": None})
    per_batch = cfg.prompts_per_step * cfg.group_size
    assert counting.CALLS.count(per_batch) == 3  # was 6


UNMATCHABLE = [
    {"prompt": "Capital of France?", "answer": "Paris"},
    {"prompt": "Price?", "answer": "$5"},
    {"prompt": "Apples?", "answer": "5 apples"},
    {"prompt": "Rate?", "answer": "5%"},
    {"prompt": "1 + 2?", "answer": "The answer is 3"},
    {"problem": "What is 2+2?", "solution": "2+2=4, so the answer is 4."},
]
FILLER = [{"question": f"{i} + 1 =", "answer": str(i + 1)} for i in range(4)]


def _write(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.mark.parametrize("task", ["jsonl", "gsm8k", "math"])
@pytest.mark.parametrize("row", UNMATCHABLE, ids=lambda r: str(r.get("answer", r.get("solution")))[:12])
def test_an_answer_no_completion_can_match_is_refused(tmp_path, task, row):
    # was accepted: correctness_reward(answer, answer) == 0, so every completion scored 0 and nothing was learned
    data = _write(tmp_path / "d.jsonl", [*FILLER, row])
    with pytest.raises(DataRefused, match=r"d.jsonl: line 5: the answer field '(answer|solution)': .* can never be "
                                          r"graded correct.*expected a bare number"):  # fmt: skip
        make_task(task, data_path=data, heldout_frac=0.2, prompt_template=None, seed=0)


def test_a_refused_answer_suggests_the_number_it_holds(tmp_path):
    data = _write(tmp_path / "d.jsonl", [*FILLER, UNMATCHABLE[-1]])
    with pytest.raises(DataRefused, match=r"if the answer is 4, write '4' or '... #### 4'"):
        make_task("gsm8k", data_path=data, heldout_frac=0.2, prompt_template=None, seed=0)


@pytest.mark.parametrize("answer", ["42", "#### 42", "... #### 1,234", "\\boxed{Paris}", "\\boxed{\\frac{1}{2}}",
                                    "17.0", "-3", "1/2", 7, 2.5, 1e20])  # fmt: skip
def test_gradable_answers_are_accepted(tmp_path, answer):
    data = _write(tmp_path / "d.jsonl", [*FILLER, {"question": "q", "answer": answer}])
    for task in ("jsonl", "gsm8k", "math"):
        t = make_task(task, data_path=data, heldout_frac=0.2, prompt_template=None, seed=0)
        assert len(t.train) + len(t.test) == 5


def test_answers_a_user_reward_grades_are_not_refused(tmp_path, counting):
    data = _write(tmp_path / "d.jsonl", [*FILLER, {"prompt": "Capital of France?", "answer": "Paris"}])
    task = make_task("jsonl", data_path=data, heldout_frac=0.2, reward="counting_rewards:exact")  # the user's grader
    assert "Paris" in [str(p.answer) for p in task.train + task.test]
    with pytest.raises(DataRefused, match="line 5: the answer field 'answer': 'Paris' can never be graded correct"):
        make_task("jsonl", data_path=data, heldout_frac=0.2, reward="counting_rewards:exact,correctness")


@pytest.mark.parametrize("line", ['{"question": "a\\ud800 b", "answer": "2"}', '{"question": "z", "answer": "\\udc00"}',
                                  '{"question": "z", "answer": "2", "meta": {"k\\ud83d": [1]}}'])  # fmt: skip
def test_a_lone_surrogate_is_refused_naming_its_line(tmp_path, line):
    # was a UnicodeEncodeError traceback after the model load (the prompt-length check encodes every prompt)
    data = tmp_path / "s.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in FILLER[:2]) + line + "\n" + json.dumps(FILLER[3]) + "\n")
    for task in ("jsonl", "gsm8k"):
        with pytest.raises(DataRefused, match=r"s.jsonl: line 3: the text .* holds a lone surrogate"):
            make_task(task, data_path=str(data), heldout_frac=0.2, prompt_template=None, seed=0)


@pytest.mark.parametrize("weight", ["0", "-0", "0.0", "0e5", "-0.000"])
def test_a_reward_weight_of_zero_is_refused(weight):
    with pytest.raises(RewardError, match=rf"weight '{weight}': expected a finite, nonzero number"):
        parse_reward_spec(f"correctness,format={weight}")


def test_nonzero_weights_are_kept():
    assert parse_reward_spec("correctness=-0.5,format=1e-300") == [("correctness", -0.5), ("format", 1e-300)]


def test_a_yaml_syntax_error_names_its_line_and_the_problem(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text("preset: gtpo\nmax_steps: 60\n\tlr: 1e-4\n")
    with pytest.raises(SystemExit) as exc:
        parse_args(["--config", str(path)])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert (
        f"--config {path}: line 3, column 1: not valid YAML (found character '\\t' that cannot start any token" in err
    )


def test_config_after_an_equals_sign_expands_the_home_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "x.yaml").write_text("max_steps: 3\n")
    cfg, _ = parse_args(["--config=~/x.yaml"])
    assert cfg.max_steps == 3


def test_one_prompt_with_two_answers_is_named_in_a_warning(tmp_path, capsys):
    rows = [{"question": "q1", "answer": "3"}, {"question": "q2", "answer": "5"}, {"question": "q1", "answer": "99"},
            {"question": "q2", "answer": "5.0"}, {"question": "q3", "answer": "1"}]  # fmt: skip
    make_task("gsm8k", data_path=_write(tmp_path / "d.jsonl", rows), heldout_frac=0.2, prompt_template=None, seed=0)
    out = capsys.readouterr().out
    assert (
        "d.jsonl: 1 row(s) repeat an earlier row's prompt with a different answer (line 3 ('99') vs line 1 ('3'))"
        in out
    )


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-32-le", "utf-32-be"])
def test_a_wide_text_file_is_named_as_such(tmp_path, encoding):
    """It was refused as "line 1: a NUL byte: a binary file", which does not tell a user what to do."""
    path = tmp_path / "d.jsonl"
    path.write_text('{"question": "2 + 3", "answer": "5"}\n', encoding=encoding)
    bits = encoding.split("-")[1]
    with pytest.raises(ValueError, match=f"d.jsonl: UTF-{bits} text \\(from its first bytes\\); save it as UTF-8"):
        make_task("gsm8k", data_path=str(path))


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity"])
def test_a_non_finite_prompt_is_refused(tmp_path, value):
    """JSON's NaN as the question was trained on as the prompt "nan"."""
    path = tmp_path / "d.jsonl"
    path.write_text(f'{{"question": {value}, "answer": "5"}}\n{{"question": "2 + 3", "answer": "5"}}\n')
    with pytest.raises(ValueError, match="line 1: the prompt field 'question' is -?(nan|inf); expected text"):
        make_task("gsm8k", data_path=str(path))
