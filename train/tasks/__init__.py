"""Tasks with verifiable answers, one module per task, registered by name (`registry.py`): procedural arithmetic (the
default) and word problems, GSM8K and MATH from local JSONL files, HumanEval (Python functions, run against their
tests in the sandbox).

`make_task(name, ...)` builds a registered task; `task_names()`, `data_tasks()` and `task_specs()` say what is
registered (the CLI's `--task` choices and help come from them). Adding a task is one module that registers a factory
with `@register_task(name, help=...)`, plus its name in `TASK_MODULES` below. Every module here is torch-free and
cheap to import: the CLI's `--help` imports this package.
"""

from __future__ import annotations

import importlib

from ..tasks.base import ANSWER_IS_TEMPLATE, TEMPLATE_FIELDS, Problem, ProceduralTask, _is_heldout, check_template
from ..tasks.registry import (
    TASK_OPTIONS,
    Task,
    TaskSpec,
    data_tasks,
    get_task_spec,
    make_task,
    register_task,
    task_names,
    task_specs,
    unregister_task,
)

# The modules that register the built-in tasks, imported in this order: the order `task_names()` (and so `--task`)
# lists the tasks in. A module may register more than one name (jsonl: gsm8k, then math).
TASK_MODULES = ("arithmetic", "wordproblems", "jsonl", "humaneval")
for _module in TASK_MODULES:
    importlib.import_module(f"{__name__}.{_module}")
del _module

# Names code and tests import from `train.tasks` (imported after the loop above, which has already loaded them).
from ..tasks.arithmetic import LEVELS, ArithmeticTask, parse_levels  # noqa: E402
from ..tasks.humaneval import HUMANEVAL_TEMPLATE, HumanEvalTask, humaneval_path  # noqa: E402
from ..tasks.jsonl import ANSWER_KEYS, JSONL_EXPECTED, QUESTION_KEYS, JsonlTask, read_jsonl  # noqa: E402
from ..tasks.wordproblems import GOODS, NAMES, WORD_PROBLEMS, WordProblemTask  # noqa: E402

__all__ = [
    "ANSWER_IS_TEMPLATE",
    "ANSWER_KEYS",
    "GOODS",
    "HUMANEVAL_TEMPLATE",
    "JSONL_EXPECTED",
    "LEVELS",
    "NAMES",
    "QUESTION_KEYS",
    "TASK_MODULES",
    "TASK_OPTIONS",
    "TEMPLATE_FIELDS",
    "WORD_PROBLEMS",
    "ArithmeticTask",
    "HumanEvalTask",
    "JsonlTask",
    "Problem",
    "ProceduralTask",
    "Task",
    "TaskSpec",
    "WordProblemTask",
    "_is_heldout",
    "check_template",
    "data_tasks",
    "get_task_spec",
    "humaneval_path",
    "make_task",
    "parse_levels",
    "read_jsonl",
    "register_task",
    "task_names",
    "task_specs",
    "unregister_task",
]
