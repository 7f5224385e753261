"""Issue 39, user data and reward functions: JSONL validated before the split (repeats dropped, a prompt never both
trained on and held out, prompts checked against the model's context, malformed files refused without a traceback),
the split unchanged for data without repeats; reward functions behind a boundary (an exception, `sys.exit`, a
non-finite weighted sum: a refusal naming the function, before and during training; inputs copied)."""

from __future__ import annotations

import json
import random
import sys
import textwrap

import pytest

pytest.importorskip("transformers")

from conftest import tiny_argv  # noqa: E402

from train.__main__ import main  # noqa: E402
from train.rewards import RewardError, RewardFunctions  # noqa: E402
from train.tasks import make_task  # noqa: E402

FAST = ("--eval-k", "0", "--kl-every", "0", "--max-steps", "1")


def write_rows(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def rows(n: int) -> list[dict]:
    return [{"question": f"{a} + {a} = ?", "answer": str(2 * a)} for a in range(n)]


# ------------------------------------------------------------------------------------------- 4: the split


@pytest.mark.parametrize("task", ["jsonl", "gsm8k", "math"])
def test_repeated_rows_never_land_on_both_sides(tmp_path, capsys, task):
    data = rows(20)
    path = write_rows(tmp_path / "d.jsonl", data + data[:10] + [data[3]] * 5)
    t = make_task(task, data_path=path, heldout_frac=0.25)
    train, held = {p.prompt for p in t.train}, {p.prompt for p in t.test}
    assert not train & held
    assert len(t.train) + len(t.test) == 20  # the repeats dropped
    assert "15 duplicate row(s) dropped (line 21 repeats line 1" in capsys.readouterr().out


def test_rows_sharing_a_prompt_stay_on_one_side(tmp_path):
    data = rows(20) + [{"question": "3 + 3 = ?", "answer": "#### 6"}, {"question": "3 + 3 = ?", "answer": "06"}]
    for seed in range(5):
        t = make_task("jsonl", data_path=write_rows(tmp_path / "d.jsonl", data), heldout_frac=0.25, seed=seed)
        train, held = [p.prompt for p in t.train], [p.prompt for p in t.test]
        assert not set(train) & set(held)
        assert (train + held).count("3 + 3 = ?") == 3


@pytest.mark.parametrize("task", ["jsonl", "gsm8k", "math"])
@pytest.mark.parametrize("n, frac, seed", [(2, 0.2, 0), (37, 0.2, 0), (50, 0.1, 3), (101, 0.5, 7)])
def test_data_without_repeats_splits_as_before(tmp_path, task, n, frac, seed):
    """The split of a file without repeated prompts is the one every earlier run had: the rows shuffled with the seed,
    the last `heldout_frac` of them held out (the positional split, computed here independently)."""
    data = rows(n)
    t = make_task(task, data_path=write_rows(tmp_path / "d.jsonl", data), heldout_frac=frac, seed=seed)
    order = list(range(n))
    random.Random(seed).shuffle(order)
    n_held = max(1, int(n * frac))
    questions = [data[i]["question"] for i in order]
    assert [p.question for p in t.train] == questions[:-n_held]
    assert [p.question for p in t.test] == questions[-n_held:]


# ------------------------------------------------------------------------------------------- malformed data


@pytest.mark.parametrize(
    "text, words",
    [
        ('{"question": "1+1", "answer": "2"}\nnot json\n', ["line 2: not valid JSON"]),
        ('{"question": "1+1", "answer": "2"}\n{"question": "2+2", "answer": ' + "9" * 5000 + "}\n",
         ["line 2: not usable JSON"]),
        ('{"question": "1+1", "answer": "2"}\n' + "[" * 100000 + "]" * 100000 + "\n", ["line 2: not usable JSON"]),
        ('{"question": "1+1", "answer": "2"}\n{"question": "1+1", "answer": "2"}\n', ["1 distinct problem(s)"]),
        ('{"question": "1+1", "answer": "2"}\n[1, 2]\n', ["line 2: a JSON list, not an object"]),
        # a list or mapping as the prompt was trained on as its Python repr ("['9 + 1 =']")
        ('{"question": "1+1", "answer": "2"}\n{"prompt": ["9 + 1 ="], "answer": "10"}\n',
         ["line 2: the prompt field 'prompt' is a list; expected text"]),
    ],
    ids=["not-json", "5000-digits", "deep", "one-distinct", "list", "list-prompt"],
)  # fmt: skip
def test_malformed_jsonl_is_refused_without_a_traceback(tmp_path, capsys, text, words):
    data = tmp_path / "bad.jsonl"
    data.write_text(text)
    assert main(tiny_argv(str(tmp_path / "run"), "--task", "jsonl", "--data", str(data), *FAST)) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and str(data) in err
    for w in words:
        assert w in err, (w, err)


@pytest.mark.parametrize("char", ["\u2028", "\u2029", "\x85"])
def test_raw_line_separators_inside_json_strings_are_read(tmp_path, char):
    # JSON allows these raw inside a string; str.splitlines broke the row there ("line 2: not valid JSON")
    path = tmp_path / "sep.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=False).replace("+", "+" + char) + "\n" for r in rows(6)))
    t = make_task("jsonl", data_path=str(path))
    assert sorted(p.question for p in t.train + t.test) == sorted(r["question"].replace("+", "+" + char)
                                                                   for r in rows(6))  # fmt: skip


def test_a_prompt_longer_than_the_context_is_refused_naming_its_line(tmp_path, capsys):
    data = rows(5) + [{"question": "x" * 100_000, "answer": "1"}] * 1 + rows(8)[5:]
    path = write_rows(tmp_path / "long.jsonl", data)
    assert main(tiny_argv(str(tmp_path / "run"), "--task", "jsonl", "--data", path, *FAST)) == 2
    err = capsys.readouterr().err
    assert "line 6: the prompt is 100002 tokens" in err and "context is 256 tokens" in err and "Traceback" not in err


@pytest.mark.parametrize("new_tokens", ["256", "300"])
def test_max_new_tokens_past_the_context_is_blamed_not_the_data(tmp_path, capsys, new_tokens):
    # was "line 1: the prompt is 9 tokens; ... a prompt may have at most -44 tokens. Shorten or remove it"
    path = write_rows(tmp_path / "d.jsonl", rows(8))
    argv = tiny_argv(str(tmp_path / "run"), "--task", "jsonl", "--data", path, *FAST, "--max-new-tokens", new_tokens)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"--max-new-tokens {new_tokens}: the model's context is 256 tokens and the chat template alone" in err, err
    assert "line 1" not in err and "Traceback" not in err


# ------------------------------------------------------------------------------------------- reward functions

MODULE = """
import sys

SEEN = []

def huge(completions, **kw):
    return [1e308] * len(completions)

def raises(completions, **kw):
    raise ZeroDivisionError("oops")

def exits(completions, **kw):
    sys.exit(0)

def exits_in_training(completions, **kw):
    if len(completions) == 4:  # a training batch (2 prompts x 2), not the pre-flight's 2 completions
        sys.exit(0)
    return [0.0] * len(completions)

def mutates(completions, tags, prompts, **kw):
    SEEN.append((list(completions), [list(t) for t in tags]))
    completions[0] = "changed"
    tags[0].append("injected")
    prompts.clear()
    return [0.0] * len(completions)

def reads(completions, tags, prompts, **kw):
    SEEN.append((list(completions), [list(t) for t in tags], list(prompts)))
    return [0.0] * len(completions)
"""


@pytest.fixture
def user(tmp_path, monkeypatch):
    (tmp_path / "bad_rewards.py").write_text(textwrap.dedent(MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "bad_rewards", raising=False)
    data = write_rows(tmp_path / "d.jsonl", [{"prompt": f"{a}+1=", "answer": str(a + 1), "tags": ["t"]}
                                             for a in range(10)])  # fmt: skip
    return tmp_path, data


@pytest.mark.parametrize(
    "ref, words",
    [
        ("bad_rewards:huge=10", ["bad_rewards:huge=10", "weighted sum", "inf", "finite"]),
        ("bad_rewards:raises", ["'bad_rewards:raises' raised ZeroDivisionError: oops"]),
        ("bad_rewards:exits", ["'bad_rewards:exits' raised SystemExit"]),
    ],
)
def test_a_failing_reward_is_refused_before_training(user, capsys, ref, words):
    tmp_path, data = user
    out = tmp_path / "run"
    code = main(tiny_argv(str(out), "--task", "jsonl", "--data", data, "--reward", ref, *FAST))
    assert code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    for w in words:
        assert w in err, (w, err)
    assert not (out / "metrics.jsonl").exists() or not (out / "metrics.jsonl").read_text()


def test_sys_exit_in_a_reward_during_training_is_named_not_a_clean_exit(user, capsys):
    tmp_path, data = user
    out = tmp_path / "run"
    argv = tiny_argv(str(out), "--task", "jsonl", "--data", data, "--reward", "bad_rewards:exits_in_training", *FAST)
    assert main(argv) == 1  # before: 0, the run unfinished
    err = capsys.readouterr().err
    assert "'bad_rewards:exits_in_training' raised SystemExit" in err and "Traceback" not in err
    assert not (out / "summary.json").exists() or "after" not in json.loads((out / "summary.json").read_text())


def test_reward_functions_get_their_own_copy_of_the_inputs(user):
    import bad_rewards

    fns = RewardFunctions("bad_rewards:mutates,bad_rewards:reads")
    row = {"prompt": "1+1=", "answer": "2", "tags": ["t"]}
    for _ in range(2):  # two steps on the same problem
        fns(["a", "b"], ["1+1=", "1+1="], [row, row])
        fns._last = None
    assert row == {"prompt": "1+1=", "answer": "2", "tags": ["t"]}  # the problem's data is unchanged
    reads = [s for s in bad_rewards.SEEN if len(s) == 3]
    assert reads == [(["a", "b"], [["t"], ["t"]], ["1+1=", "1+1="])] * 2  # what `mutates` did never reached `reads`
    with pytest.raises(RewardError, match="raised ZeroDivisionError"):
        RewardFunctions("bad_rewards:raises")(["a"], ["p"], [row])
