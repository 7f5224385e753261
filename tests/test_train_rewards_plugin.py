"""--reward module:function[=weight] and --task jsonl --data FILE (train/rewards.py, train/features/user_reward.py,
train/tasks/jsonl.py): a user's reward function trains the tiny model on a user's JSONL, with TRL's calling
convention and the weighted sum as the training reward; bad references are refused before training, naming the
function and the reason; --task math grades with math-verify when installed."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from conftest import tiny_argv, tiny_cfg  # noqa: E402

import train.loop as loop  # noqa: E402
import train.rewards as rewards  # noqa: E402
from train.__main__ import main  # noqa: E402
from train.config.cli import parse_args  # noqa: E402
from train.errors import Refused  # noqa: E402
from train.rewards import MathAnswer, RewardError, RewardFunctions, correctness_reward, parse_reward_spec  # noqa: E402
from train.tasks import make_task  # noqa: E402

LOSS = {"entropy_filter": None, "entropy_coef": 0.01}

MODULE = '''
CALLS = []

def target_hit(completions, prompts, target, **kwargs):
    """TRL's convention: completions, prompts and every field of the row as lists."""
    out = [1.0 if t in c else 0.0 for c, t in zip(completions, target)]
    CALLS.append({"completions": list(completions), "prompts": list(prompts), "target": list(target),
                  "kwargs": sorted(kwargs), "out": out})
    return out

def brevity(completions, **kwargs):
    return [-0.1 * len(c) for c in completions]

def nan_reward(completions, **kwargs):
    return [float("nan")] * len(completions)

def too_few(completions, **kwargs):
    return [0.0]

def two_d(completions, **kwargs):
    import torch
    return torch.zeros(len(completions), 1)

def needs_missing_field(completions, label, **kwargs):
    return [0.0] * len(completions)

def no_completions(x):
    return [0.0]

NOT_A_FUNCTION = 3

def numpy_values(completions, **kwargs):
    import numpy as np
    return [np.float32(0.5 * len(c)) for c in completions]

def numpy_array(completions, **kwargs):
    import numpy as np
    return np.array([float(len(c)) for c in completions], dtype=np.float64)

def torch_tensor(completions, **kwargs):
    import torch
    return torch.tensor([float(len(c)) for c in completions])

def numpy_nan(completions, **kwargs):
    import numpy as np
    return [np.float32("nan")] * len(completions)
'''


@pytest.fixture
def user(tmp_path, monkeypatch):
    """A user's reward module (importable as `user_rewards`) and JSONL data (a prompt, a target and a tag per row)."""
    (tmp_path / "user_rewards.py").write_text(textwrap.dedent(MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "user_rewards", raising=False)
    rows = [{"prompt": f"{a}+{b}=", "target": str(a + b), "tag": f"r{a}{b}"} for a in range(6) for b in range(6)]
    data = tmp_path / "data.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return tmp_path, data


def test_user_reward_trains_on_user_jsonl(user):
    tmp_path, data = user
    out = tmp_path / "run"
    cfg = tiny_cfg(out, task="jsonl", data_path=str(data), reward="user_rewards:target_hit,user_rewards:brevity=0.5",
                   max_steps=2, eval_k=0, kl_every=0)  # fmt: skip
    summary = loop.train(cfg, LOSS)
    assert summary["steps"] == 2 and "after" in summary
    import user_rewards

    calls = [c for c in user_rewards.CALLS if len(c["completions"]) == cfg.prompts_per_step * cfg.group_size]
    assert len(calls) >= 2  # once per training batch (and on the held-out rows without an answer: none here have one)
    first = calls[0]
    assert first["kwargs"] == ["tag"]  # the row's other fields reach the function by name
    assert all(str(eval(p.rstrip("="))) == t for p, t in zip(first["prompts"], first["target"]))  # rows aligned
    steps = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if '"event"' not in x]
    expected = [h + 0.5 * (-0.1 * len(c)) for h, c in zip(first["out"], first["completions"])]
    assert steps[0]["reward_mean"] == pytest.approx(sum(expected) / len(expected), rel=1e-5)  # the weighted sum


def test_rows_without_answer_are_graded_by_the_reward(user):
    tmp_path, data = user
    task = make_task("jsonl", data_path=str(data), heldout_frac=0.25, reward="user_rewards:target_hit")
    problem = task.heldout(1, 0)[0]
    target = problem.answer.fields["target"]
    assert correctness_reward(f"it is {target}", problem.answer) == 1.0
    assert correctness_reward("no idea", problem.answer) == 0.0
    with pytest.raises(ValueError, match="no answer .* and no --reward"):
        make_task("jsonl", data_path=str(data))


@pytest.mark.parametrize("field", ["prompts", "completions", "completion"])
def test_a_row_field_named_like_a_reward_argument_is_refused(user, field):
    # was silent: `prompts` replaced by the prompts, `completion(s)` dropped before the reward functions saw them
    tmp_path, _ = user
    data = tmp_path / "named.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{a}+1=", "target": str(a + 1), field: "mine"}) + "\n"
                            for a in range(5)))  # fmt: skip
    with pytest.raises(ValueError, match=rf"named.jsonl: line 1: a field named '{field}': the reward functions get "
                                         r"prompts= and completions= .* rename it"):  # fmt: skip
        make_task("jsonl", data_path=str(data), reward="user_rewards:target_hit")
    rows = [json.dumps({"prompt": f"{a}+1=", "answer": str(a + 1), field: "x"}) for a in range(5)]
    data.write_text("\n".join(rows) + "\n")
    assert len(make_task("jsonl", data_path=str(data)).train) == 4  # without --reward no function would lose it


def test_rows_with_an_answer_keep_it_as_ground_truth(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text('{"question": "2+3=", "answer": "5", "level": 1}\n{"question": "1+1=", "answer": "2"}\n')
    task = make_task("jsonl", data_path=str(data), heldout_frac=0.5)
    p = task.heldout(1, 0)[0]
    assert p.answer in ("5", "2") and "question" in p.answer.fields
    assert correctness_reward(f"= {p.answer}", p.answer) == 1.0
    with pytest.raises(ValueError, match="line 1: no prompt"):
        (tmp_path / "e.jsonl").write_text('{"text": "x"}\n{"prompt": "y", "answer": "1"}\n')
        make_task("jsonl", data_path=str(tmp_path / "e.jsonl"))


@pytest.mark.parametrize(
    "ref, words",
    [
        ("no_such_module_xyz:f", ["'no_such_module_xyz:f'", "cannot import module 'no_such_module_xyz'"]),
        ("user_rewards:missing", ["'user_rewards:missing'", "has no attribute 'missing'"]),
        ("user_rewards:NOT_A_FUNCTION", ["is a int, not a function"]),
        ("user_rewards:no_completions", ["takes no `completions`", "reward_funcs"]),
        ("user_rewards", ["'user_rewards'", "expected module:function[=weight]"]),
        ("user_rewards:brevity=heavy", ["weight 'heavy'", "finite number"]),
        ("user_rewards:brevity,user_rewards:brevity=2", ["named twice"]),
        ("user_rewards.py:brevity", ["a module name, not a file: user_rewards:brevity"]),  # (no hint before)
    ],
)
def test_bad_reference_refused_at_parse_time(user, capsys, ref, words):
    with pytest.raises(SystemExit) as exc:
        parse_args(["--reward", ref])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--reward" in err
    for w in words:
        assert w in err, (w, err)


@pytest.mark.parametrize(
    "ref, words",
    [
        ("user_rewards:nan_reward", ["'user_rewards:nan_reward'", "nan", "expected a finite float"]),
        # "returned 1 values"; a 2-D tensor was "a Tensor; expected a list" although 1-D ones are accepted
        ("user_rewards:too_few", ["'user_rewards:too_few'", "returned 1 value;", "expected a list (or a 1-D array"]),
        ("user_rewards:two_d", ["returned a Tensor of shape (", ", 1)", "or a 1-D array or tensor)"]),
        ("user_rewards:needs_missing_field", ["'user_rewards:needs_missing_field'", "label"]),
    ],
)
def test_bad_values_refused_before_training(user, ref, words):
    tmp_path, data = user
    out = tmp_path / "bad"
    cfg = tiny_cfg(out, task="jsonl", data_path=str(data), reward=ref, max_steps=1, eval_k=0, kl_every=0)
    with pytest.raises(Refused) as info:
        loop.train(cfg, LOSS)
    for w in words:
        assert w in str(info.value), (w, str(info.value))
    assert not (out / "metrics.jsonl").exists() or not (out / "metrics.jsonl").read_text()  # no step trained


def test_numpy_and_torch_rewards_are_accepted_as_trl_accepts_them(user):
    # a NumPy float32 per completion was refused as "not a finite float", an array or tensor as "a ndarray"
    fns = RewardFunctions("user_rewards:numpy_values,user_rewards:numpy_array=2,user_rewards:torch_tensor=0.5")
    assert fns(["ab", "abcd"], ["p", "p"], [{}, {}]) == [1.0 + 4.0 + 1.0, 2.0 + 8.0 + 2.0]
    with pytest.raises(RewardError, match=r"'user_rewards:numpy_nan': completion 0: .*nan.*expected a finite float"):
        RewardFunctions("user_rewards:numpy_nan")(["x"], ["p"], [{}])


def test_cli_reward_given_twice_and_builtins(user):
    tmp_path, data = user
    cfg, _ = parse_args(["--reward", "user_rewards:target_hit", "--reward", "correctness=2", "--reward", "format=0.1"])
    assert cfg.reward == "user_rewards:target_hit,correctness=2,format=0.1"
    assert parse_reward_spec(cfg.reward) == [("user_rewards:target_hit", 1.0), ("correctness", 2.0), ("format", 0.1)]
    fns = RewardFunctions("correctness=2,format=0.5")
    assert fns(["The answer is 5.", "six"], ["p", "p"], [{"answer": "5"}, {"answer": "5"}]) == [2.5, 0.0]
    out = tmp_path / "cli"
    argv = tiny_argv(out, "--task", "jsonl", "--data", str(data), "--reward", "user_rewards:target_hit",
                     "--max-steps", "1", "--eval-k", "0", "--kl-every", "0")  # fmt: skip
    assert main(argv) == 0


def test_reward_on_a_builtin_task_gets_question_and_answer(user):
    import user_rewards

    fns = RewardFunctions("user_rewards:brevity")
    assert fns(["ab", "abcd"], ["p", "q"], [{"question": "1+1", "answer": "2"}] * 2) == pytest.approx([-0.2, -0.4])
    with pytest.raises(RewardError, match="calling it"):
        RewardFunctions("user_rewards:target_hit")(["x"], ["p"], [{"question": "1+1", "answer": "2"}])
    assert user_rewards.CALLS == []


def test_math_task_uses_math_verify_when_installed(monkeypatch):
    truth = MathAnswer("1/2")
    monkeypatch.setattr(rewards, "_math_verify", lambda: None)  # not installed: equality of numbers, else strings
    assert correctness_reward("The answer is 0.5", truth) == 1.0
    assert correctness_reward("\\boxed{\\sqrt{1/4}}", truth) == 0.0  # symbolic: not equal as a number or text

    class FakeMathVerify:
        @staticmethod
        def parse(text):
            return [text]

        @staticmethod
        def verify(gold, pred):
            return "sqrt{1/4}" in pred[0]

    monkeypatch.setattr(rewards, "_math_verify", lambda: FakeMathVerify)
    assert correctness_reward("\\boxed{\\sqrt{1/4}}", truth) == 1.0  # math-verify's verdict
    assert correctness_reward("The answer is 0.5", truth) == 1.0  # equality still counts
    assert correctness_reward("\\boxed{\\sqrt{1/4}}", "1/2") == 0.0  # other tasks: never math-verify
    data = make_task("math", data_path=str(Path(rewards.__file__).parent / "data" / "math_sample.jsonl"))
    assert isinstance(data.heldout(1, 0)[0].answer, MathAnswer)


def test_builtin_correctness_grades_a_jsonl_row_as_its_task_does(tmp_path, user):
    # `--reward correctness` on --task jsonl read the row's raw `answer` text ("... #### 7"): every completion scored 0
    # while the task counted it correct; a row with only a MATH `solution` failed ("missing ... 'answer'")
    import torch

    from train.batch import Batch
    from train.features.user_reward import UserReward, problem_fields

    gsm = tmp_path / "gsm.jsonl"
    gsm.write_text("".join(json.dumps({"question": f"What is {a} + 3?", "answer": f"{a} + 3 = {a + 3}. #### {a + 3}"})
                           + "\n" for a in range(4)))  # fmt: skip
    math_rows = tmp_path / "math.jsonl"
    math_rows.write_text("".join(json.dumps({"problem": f"Compute {a} * 2.", "solution": f"So \\boxed{{{2 * a}}}."})
                                 + "\n" for a in range(1, 5)))  # fmt: skip
    for data in (gsm, math_rows):
        problem = make_task("jsonl", data_path=str(data), heldout_frac=0.5).heldout(1, 0)[0]
        right = f"The answer is {problem.answer}."
        assert correctness_reward(right, problem.answer) == 1.0  # the task's own grading
        n = 2
        batch = Batch(torch.zeros(n, 1, dtype=torch.long), torch.ones(n, 1, dtype=torch.bool),
                      torch.zeros(n, 1, dtype=torch.long), torch.ones(n, 1, dtype=torch.bool), [right, "no idea"],
                      torch.zeros(n), torch.zeros(n, dtype=torch.bool))  # fmt: skip
        feature = UserReward(RewardFunctions("correctness=2"), group_size=n, format_weight=0.0)
        assert feature.rescore(batch, [problem]).rewards.tolist() == [2.0, 0.0]
        feature.functions.check(problem.prompt, problem_fields(problem), problem.answer)  # accepted before training
    # a row without an answer has nothing for `correctness` to compare with: refused before training, not a silent 0
    _, data = user
    problem = make_task("jsonl", data_path=str(data), heldout_frac=0.25, reward="correctness,user_rewards:target_hit"
                        ).heldout(1, 0)[0]  # fmt: skip
    with pytest.raises(RewardError, match="no answer .* to grade against"):
        RewardFunctions("correctness,user_rewards:target_hit").check(problem.prompt, problem_fields(problem),
                                                                     problem.answer)  # fmt: skip


def test_a_reward_module_that_exits_on_import_is_refused_naming_it(tmp_path, monkeypatch, capsys):
    # a module that parses its own arguments (or calls sys.exit) at import stopped the trainer with its exit status
    # and no word of why
    (tmp_path / "exits_on_import.py").write_text("import sys\nsys.exit(3)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "exits_on_import", raising=False)
    with pytest.raises(SystemExit) as exc:
        parse_args(["--reward", "exits_on_import:f"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "'exits_on_import:f'" in err and "importing 'exits_on_import' failed: SystemExit: 3" in err, err
