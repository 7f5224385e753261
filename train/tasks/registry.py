"""The task registry: name -> `TaskSpec` (one-line help, whether the task reads `--data-path`, a factory).

A task module registers its factory with the `register_task` decorator; `make_task` looks the name up and calls the
factory. This module imports no task module (the package's `__init__` imports them, in the order the CLI lists the
tasks), so a task module can import it without a cycle, and it imports nothing heavy: the CLI's `--help` reads the
names and help texts from it.
"""

from __future__ import annotations

import inspect
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from ..tasks.base import TaskRefused

if TYPE_CHECKING:
    from ..tasks.base import Problem


class Task(Protocol):
    """What the trainer needs of a task: a system prompt (None: the chat template's default), training draws and a
    fixed held-out set of `Problem`s."""

    system_prompt: str | None

    def sample(self, n: int, rng: random.Random) -> list[Problem]: ...

    def heldout(self, n: int, seed: int) -> list[Problem]: ...


@dataclass(frozen=True)
class TaskSpec:
    name: str
    help: str  # one line, shown by `--task` in the CLI's help
    factory: Callable[..., Task]
    reads_data_path: bool = False  # whether `--data-path` means anything to this task


_REGISTRY: dict[str, TaskSpec] = {}  # insertion order is the order the CLI lists the tasks in


def register_task(name: str, *, help: str, reads_data_path: bool = False) -> Callable[[Callable], Callable]:
    """Decorator registering `factory(*, difficulty, data_path, prompt_template, heldout_frac, seed, reward) -> Task`
    under `name`; returns the factory unchanged.

    `make_task` passes the factory every one of those keywords (a factory that needs only some ends with `**_`);
    `prompt_template=None` means the task's own default. A name registered twice raises ValueError (the first factory
    would be silently shadowed otherwise); `unregister_task` frees a name."""
    if not isinstance(name, str) or not name or name != name.strip() or any(c.isspace() for c in name):
        raise ValueError(f"task name {name!r}: expected a non-empty name without spaces, like 'arithmetic'")
    if not isinstance(help, str) or not help.strip() or "\n" in help:
        raise ValueError(f"task {name!r}: help={help!r}: expected one non-empty line (the CLI lists it under --task)")

    def decorator(factory: Callable[..., Task]) -> Callable[..., Task]:
        if name in _REGISTRY:
            first = _REGISTRY[name].factory
            raise ValueError(
                f"task {name!r} is already registered (by {first.__module__}.{first.__qualname__}); "
                f"pick another name, or unregister_task({name!r}) first to replace it"
            )
        _REGISTRY[name] = TaskSpec(name, help, factory, reads_data_path)
        return factory

    return decorator


def unregister_task(name: str) -> TaskSpec:
    """Remove a registered task (tests, or replacing a task); returns its spec. An unknown name raises ValueError."""
    get_task_spec(name)
    return _REGISTRY.pop(name)


def task_names() -> tuple[str, ...]:
    """The registered task names, in the order they were registered (the order the CLI lists them)."""
    return tuple(_REGISTRY)


def data_tasks() -> tuple[str, ...]:
    """The registered tasks that read `--data-path`."""
    return tuple(name for name, spec in _REGISTRY.items() if spec.reads_data_path)


def task_specs() -> tuple[TaskSpec, ...]:
    """Every registered task's spec, in registration order (for help text: `spec.name`, `spec.help`)."""
    return tuple(_REGISTRY.values())


def get_task_spec(name: str) -> TaskSpec:
    """The spec of a registered task; an unknown name raises ValueError listing the registered ones."""
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):  # TypeError: an unhashable name is unknown too
        quoted = [repr(n) for n in _REGISTRY]
        if not quoted:
            raise ValueError(f"task={name!r}: no task is registered") from None
        expected = f"{', '.join(quoted[:-1])} or {quoted[-1]}" if len(quoted) > 1 else quoted[0]
        raise ValueError(f"task={name!r}: expected {expected}") from None


# What every task factory receives (as keywords; the trainer's fields of the same names), with their defaults.
TASK_OPTIONS = {
    "difficulty": "1-3",
    "data_path": None,
    "prompt_template": None,
    "heldout_frac": 0.2,
    "seed": 0,
    "reward": None,  # --reward: the jsonl task grades rows without an answer with it
}


def make_task(name: str, **options) -> Task:
    """Build the task registered as `name` with `options` (any of TASK_OPTIONS; the others keep their defaults). An
    unknown name raises ValueError listing the registered ones; an unknown option, TypeError."""
    unknown = sorted(set(options) - set(TASK_OPTIONS))
    if unknown:
        raise TypeError(f"make_task() got unexpected option(s) {unknown}; expected some of {list(TASK_OPTIONS)}")
    factory, given = get_task_spec(name).factory, {**TASK_OPTIONS, **options}
    where = f"--task {name}: its factory {getattr(factory, '__qualname__', repr(factory))}"
    try:
        inspect.signature(factory).bind(**given)
    except TypeError as exc:  # (a raw TypeError from inside the setup before)
        raise TaskRefused(f"{where} does not take the task options ({', '.join(given)}): {exc}; declare **_ for "
                          "the ones it does not use") from None  # fmt: skip
    except ValueError:  # no signature to read (a builtin): called as it is
        pass
    try:
        task = factory(**given)
    except Exception as exc:
        exc.add_note(f"(raised by {where})")
        raise
    if not (callable(getattr(task, "sample", None)) and callable(getattr(task, "heldout", None))):
        raise TaskRefused(f"{where} returned {task!r:.80}; expected a task (sample(n, rng) and heldout(n, seed))")
    return task
