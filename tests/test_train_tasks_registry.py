"""The task registry (train/tasks/registry.py): the built-in tasks in their CLI order, registering a task from outside
the package, and the errors for a duplicate name, an unknown name and a malformed registration."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import pytest

from train import tasks
from train.rewards import correctness_reward

ROOT = Path(__file__).resolve().parents[1]
BUILTIN = ("arithmetic", "wordproblems", "gsm8k", "math", "jsonl", "humaneval")
UNKNOWN = "task='nope': expected 'arithmetic', 'wordproblems', 'gsm8k', 'math', 'jsonl' or 'humaneval'"


class DigitSumTask(tasks.ProceduralTask):
    """A toy procedural task: the sum of a number's digits. Hash-split like the built-in procedural tasks."""

    def __init__(self, prompt_template: str = "The sum of the digits of {question} is", heldout_frac: float = 0.2):
        self.template = tasks.check_template(prompt_template)
        self.heldout_frac = heldout_frac

    def _generate(self, rng: random.Random) -> tuple[str, int]:
        n = rng.randint(100, 999)
        return str(n), sum(map(int, str(n)))


@pytest.fixture
def digitsum():
    """Registers the toy task as 'digitsum' for one test and always unregisters it, so no other test sees it."""
    calls: list[dict] = []

    @tasks.register_task("digitsum", help="toy: the sum of the digits of a 3-digit number")
    def make_digitsum(**options) -> DigitSumTask:
        calls.append(options)
        return DigitSumTask(
            options["prompt_template"] or "The sum of the digits of {question} is", options["heldout_frac"]
        )

    try:
        yield calls
    finally:
        if "digitsum" in tasks.task_names():
            tasks.unregister_task("digitsum")


def test_builtin_tasks_in_cli_order():
    assert tasks.task_names() == BUILTIN
    assert tasks.data_tasks() == ("gsm8k", "math", "jsonl")
    specs = tasks.task_specs()
    assert [s.name for s in specs] == list(BUILTIN) and all(isinstance(s, tasks.TaskSpec) for s in specs)
    assert all(s.help.strip() and "\n" not in s.help for s in specs)  # one line each, for the --task help
    assert tasks.get_task_spec("gsm8k").reads_data_path and not tasks.get_task_spec("arithmetic").reads_data_path


def test_registry_agrees_with_the_cli_config():
    config = pytest.importorskip("train.config")
    assert tuple(config.TASKS) == tasks.task_names()
    assert tuple(config.DATA_TASKS) == tasks.data_tasks()


def test_registered_task_is_built_and_listed(digitsum):
    assert tasks.task_names() == (*BUILTIN, "digitsum")  # appended after the built-in tasks
    assert tasks.get_task_spec("digitsum").help == "toy: the sum of the digits of a 3-digit number"
    assert "digitsum" not in tasks.data_tasks()
    task = tasks.make_task("digitsum", heldout_frac=0.3, seed=7)
    assert isinstance(task, DigitSumTask)
    assert digitsum == [  # the factory gets every option, the defaults included
        {"difficulty": "1-3", "data_path": None, "prompt_template": None, "heldout_frac": 0.3, "seed": 7,
         "reward": None}  # fmt: skip
    ]
    drawn = task.sample(20, random.Random(0))
    assert all(p.prompt == f"The sum of the digits of {p.question} is" for p in drawn)
    assert all(p.answer == str(sum(map(int, p.question))) for p in drawn)
    assert correctness_reward(f"The answer is {drawn[0].answer}", drawn[0].answer) == 1.0
    held = {p.question for p in task.heldout(20, seed=0)}
    assert held and not held & {p.question for p in task.sample(500, random.Random(1))}
    assert (
        tasks.make_task("digitsum", prompt_template="{question}?").sample(1, random.Random(0))[0].prompt.endswith("?")
    )


def test_unregistered_task_is_gone(digitsum):
    spec = tasks.unregister_task("digitsum")
    assert spec.name == "digitsum" and tasks.task_names() == BUILTIN
    with pytest.raises(ValueError) as err:
        tasks.make_task("digitsum")
    assert str(err.value) == UNKNOWN.replace("'nope'", "'digitsum'", 1)
    with pytest.raises(ValueError, match="task='digitsum': expected"):
        tasks.unregister_task("digitsum")


def test_duplicate_registration_is_refused(digitsum):
    with pytest.raises(ValueError) as err:

        @tasks.register_task("digitsum", help="another digitsum")
        def make_other(**_):
            raise AssertionError("never registered, never called")

    message = str(err.value)
    assert "task 'digitsum' is already registered" in message and "make_digitsum" in message
    assert "unregister_task('digitsum')" in message
    assert isinstance(tasks.make_task("digitsum"), DigitSumTask)  # the first registration stands
    with pytest.raises(ValueError, match="task 'arithmetic' is already registered"):
        tasks.register_task("arithmetic", help="a second arithmetic")(lambda **_: None)
    assert tasks.task_names() == (*BUILTIN, "digitsum")


def test_unknown_task_names_the_registered_ones(digitsum):
    with pytest.raises(ValueError) as err:
        tasks.make_task("nope")
    assert str(err.value) == UNKNOWN.replace(" or 'humaneval'", ", 'humaneval' or 'digitsum'")


def test_unknown_task_message_is_unchanged():
    for name in ("nope", "Arithmetic", ""):
        with pytest.raises(ValueError) as err:
            tasks.make_task(name)
        assert str(err.value) == UNKNOWN.replace("'nope'", repr(name), 1)


@pytest.mark.parametrize(
    "name, help, match",
    [
        ("", "h", "non-empty name without spaces"),
        ("two words", "h", "non-empty name without spaces"),
        (" digitsum", "h", "non-empty name without spaces"),
        ("digitsum", "", "one non-empty line"),
        ("digitsum", "two\nlines", "one non-empty line"),
    ],
)
def test_malformed_registration_is_refused(name, help, match):
    with pytest.raises(ValueError, match=match):
        tasks.register_task(name, help=help)
    assert tasks.task_names() == BUILTIN


def test_the_package_is_torch_free():
    """The CLI's --help reads the task names and help from this package: importing it must not import torch."""
    code = "import sys, train.tasks; assert 'torch' not in sys.modules; print(train.tasks.task_names())"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(BUILTIN)


@pytest.mark.parametrize("held", [[("2+2", "4")], [], [tasks.Problem("  ", "4")], [tasks.Problem("q", None)]])
def test_a_malformed_custom_task_is_refused_before_overwrite_deletes_a_run(tmp_path, held):
    """A custom task whose held-out set is not a list of Problems (tuples, nothing, a blank prompt, no text answer):
    it was a traceback in the first rollout or evaluation, after --overwrite had deleted the previous run."""
    from conftest import tiny_cfg

    from train import loop
    from train.errors import Refused

    out = tmp_path / "run"
    loop.train(tiny_cfg(out, max_steps=1, kl_every=0))
    before = sorted(p.name for p in out.iterdir())
    assert "metrics.jsonl" in before

    class Broken(DigitSumTask):
        def heldout(self, n, seed):
            return held

    tasks.register_task("broken", help="a task with a malformed held-out set")(lambda **_: Broken())
    try:
        with pytest.raises(Refused, match=r"--task broken: heldout\(\)"):
            loop.train(tiny_cfg(out, max_steps=1, kl_every=0, task="broken", overwrite=True))
    finally:
        tasks.unregister_task("broken")
    assert sorted(p.name for p in out.iterdir()) == before  # the previous run is untouched


def test_a_launcher_reaches_a_registered_task_from_the_command_line(tmp_path):
    """`python -m train --task NAME` cannot see a task registered in the user's module (it is refused with the
    built-in names); a launcher that imports the module, then calls `train.main()`, runs it, `--resume` included."""
    plugin = tmp_path / "my_plugins.py"
    plugin.write_text(
        "import random\nfrom train import register_task\nfrom train.tasks import Problem\n\n"
        "class Vowels:\n    system_prompt = None\n"
        "    def sample(self, n, rng):\n        return [Problem(f'Count the vowels of word {rng.randint(0, 99)}', '1')"
        " for _ in range(n)]\n"
        "    def heldout(self, n, seed):\n        return self.sample(n, random.Random(seed))\n\n"
        "register_task('vowels', help='toy: vowels')(lambda **_: Vowels())\n"
    )
    launcher = tmp_path / "my_train.py"
    launcher.write_text("import my_plugins\nimport train\n\nraise SystemExit(train.main())\n")
    from conftest import tiny_argv

    argv = tiny_argv(str(tmp_path / "run"), "--task", "vowels", "--max-steps", "1", "--kl-every", "0")
    env = {**__import__("os").environ, "PYTHONPATH": f"{ROOT}{__import__('os').pathsep}{tmp_path}"}
    plain = subprocess.run([sys.executable, "-m", "train", *argv], capture_output=True, text=True, env=env, cwd=ROOT)
    assert plain.returncode == 2 and "vowels" in plain.stderr
    run = subprocess.run([sys.executable, str(launcher), *argv], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    assert (tmp_path / "run" / "metrics.jsonl").exists()
    more = [a if a != "1" or argv[i - 1] != "--max-steps" else "2" for i, a in enumerate(argv)]
    again = subprocess.run([sys.executable, str(launcher), *more, "--resume"], capture_output=True, text=True,
                           env=env, cwd=tmp_path)  # fmt: skip
    assert again.returncode == 0, again.stderr[-2000:]


def test_a_custom_task_grades_its_own_answers_through_row_answer(tmp_path):
    """design.md's route for answers that are not numbers: a RowAnswer with a grader decides correctness for the
    reward, the step's accuracy and the held-out evaluation (correctness_reward alone gives 'yes' vs 'yes' 0.0)."""
    import json

    from conftest import tiny_cfg

    from train import loop
    from train.rewards import RowAnswer, correctness_reward

    assert correctness_reward("The answer is yes", "yes") == 0.0
    calls = []

    def grader(completions, prompts, fields):
        calls.append(fields[0])
        return [1.0] * len(completions)  # every completion right (the tiny model's text is noise)

    class Yes(DigitSumTask):
        def _draw(self, rng):
            return tasks.Problem(f"Say yes {rng.randint(0, 9)}", RowAnswer("yes", {"id": 7}, "p", grader=grader))

        def sample(self, n, rng):
            return [self._draw(rng) for _ in range(n)]

        def heldout(self, n, seed):
            return self.sample(n, random.Random(seed))

    tasks.register_task("yes", help="toy: answers graded by a function")(lambda **_: Yes())
    try:
        loop.train(tiny_cfg(tmp_path / "run", task="yes", max_steps=1, kl_every=0, eval_k=0))
    finally:
        tasks.unregister_task("yes")
    records = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    step = next(r for r in records if r.get("step") == 1 and "event" not in r)
    evals = [r for r in records if r.get("event") == "eval"]
    assert step["accuracy"] == 1.0 and step["reward_mean"] == 1.0 and evals and all(r["eval_acc"] == 1.0 for r in evals)
    assert calls and all(f == {"id": 7} for f in calls)


@pytest.mark.parametrize(
    ("factory", "words"),
    [
        (lambda prompt_template: DigitSumTask(), ["does not take the task options", "declare **_"]),  # no **_
        (lambda **_: None, ["returned None", "expected a task"]),
    ],
)
def test_a_broken_task_factory_is_refused_naming_the_task(factory, words):
    """A factory without **_ was a raw TypeError ('difficulty'); one returning None failed later, unnamed."""
    from train.errors import Refused

    tasks.register_task("broken", help="a broken factory")(factory)
    try:
        with pytest.raises(Refused) as caught:
            tasks.make_task("broken")
    finally:
        tasks.unregister_task("broken")
    assert "--task broken: its factory" in str(caught.value)
    for w in words:
        assert w in str(caught.value)


def test_a_task_whose_split_cannot_be_drawn_is_refused_not_a_runtime_error():
    """design.md's toy task does not call check_split: one with a single distinct problem raised a bare RuntimeError
    (exit 1) from the draw."""
    from train.tasks.base import TaskRefused

    class One(DigitSumTask):
        def _generate(self, rng):
            return "111", 3

    task = One()
    side = "training" if tasks._is_heldout("111", task.heldout_frac) else "held-out"
    draw = task.sample if side == "training" else (lambda n, rng: task.heldout(n, 0))
    with pytest.raises(TaskRefused, match=f"One: no {side} problem in 10,000 draws.*--heldout-frac"):
        draw(1, random.Random(0))


@pytest.mark.parametrize("extra", [-1, 3])
def test_a_custom_tasks_draw_of_the_wrong_size_is_refused(tmp_path, extra):
    """sample(n) returning n - 1 or n + 3 problems trained with 24 or 56 completions instead of 32, without a word."""
    from conftest import tiny_cfg

    from train import loop
    from train.errors import Refused

    class Off(DigitSumTask):
        def sample(self, n, rng):
            return super().sample(n + extra, rng)

    tasks.register_task("off", help="draws the wrong number of problems")(lambda **_: Off())
    try:
        with pytest.raises(Refused, match=r"task Off: sample\(\d+, rng\) returned \d+ problems?; expected \d+"):
            loop.train(tiny_cfg(tmp_path / "run", task="off", max_steps=1, kl_every=0))
    finally:
        tasks.unregister_task("off")
