"""The repository's layout as promises: what each package may load (checked in a fresh interpreter, by the modules
it leaves in sys.modules), so that a light entry point stays light and no package reaches into one above it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def loaded_after(code: str) -> set[str]:
    """The top-level and train.* module names in sys.modules after `code` runs in a fresh interpreter."""
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, check=True)
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def test_sandbox_is_standard_library_only():
    mods = loaded_after("import sgrpo_sandbox")
    assert not {m for m in mods if m.split(".")[0] in ("torch", "numpy", "train", "sgrpo_kernels", "study")}


def test_sandbox_bootstrap_loads_its_siblings_by_path():
    """The jailed interpreter gets the bootstrap's helpers under private names; no generic `jail` or `protocol`
    module is importable by the program, and nothing of the package directory is left on sys.path."""
    from sgrpo_sandbox import Limits, run_python

    program = (
        "import sys\n"
        "names = [m for m in ('jail', 'protocol', 'boot', '_sgrpo_sandbox_jail', '_sgrpo_sandbox_protocol') "
        "if m in sys.modules]\n"
        "print(names, any('sgrpo_sandbox' in p for p in sys.path))\n"
    )
    result = run_python(program, Limits(timeout_s=30))
    assert result.status == "passed", result
    assert "['_sgrpo_sandbox_jail', '_sgrpo_sandbox_protocol'] False" in result.output, result.output


@pytest.mark.parametrize("name", ["train.sandbox"])
def test_reexport_keeps_the_public_names(name):
    import importlib

    import sgrpo_sandbox

    module = importlib.import_module(name)
    for attr in sgrpo_sandbox.__all__:
        assert getattr(module, attr) is getattr(sgrpo_sandbox, attr)


@pytest.mark.parametrize(
    "code",
    [
        "import runpy, sys\nsys.argv = ['train', '--help']\ntry:\n    runpy.run_module('train', run_name='__main__')\n"
        "except SystemExit:\n    pass",
        "import train.features.base",
        "import train.config",
    ],
    ids=["train --help", "features.base", "config"],
)
def test_trainer_entry_points_load_neither_sandbox_nor_study(code):
    mods = loaded_after(code)
    assert not {m for m in mods if m.split(".")[0] in ("sgrpo_sandbox", "study")}, sorted(mods)
    assert "train.sandbox" not in mods


def import_graph(top: str) -> dict[str, set[str]]:
    """Every module of package `top` -> the modules of `top` it imports, at any depth of its code (a function-level
    import counts: it closes a loop as surely when it runs)."""
    import ast

    graph: dict[str, set[str]] = {}
    for path in (REPO / top).rglob("*.py"):
        parts = path.relative_to(REPO).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        package = name if parts[-1] == "__init__" else name.rpartition(".")[0]
        out = graph.setdefault(name, set())
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(
                        package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                    )
                targets = [f"{base}.{a.name}" for a in node.names] + [base]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            for t in targets:  # importing a.b.c runs the __init__ of a and a.b first
                parts_t = t.split(".")
                out.update(".".join(parts_t[:i]) for i in range(1, len(parts_t) + 1) if parts_t[0] == top)
    # a module's own enclosing packages are already being imported when it runs: not an edge of a loop
    return {m: {t for t in deps if t in graph and t != m and not m.startswith(t + ".")} for m, deps in graph.items()}


@pytest.mark.parametrize("top", ["train", "study", "sgrpo_sandbox"])
def test_no_import_cycle(top):
    graph = import_graph(top)
    state: dict[str, int] = {}

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for d in sorted(graph[m]):
            if state.get(d) == 1:
                raise AssertionError(" -> ".join(path[path.index(d) :] + [d]))
            elif d not in state:
                visit(d, path + [d])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])


def test_trainer_public_face_is_lazy():
    """`import train` loads nothing heavy; its five names are the trainer's own objects."""
    mods = loaded_after("import train")
    assert not {m for m in mods if m.split(".")[0] in ("torch", "sgrpo_sandbox", "study")}
    assert {m for m in mods if m.startswith("train.")} == set()

    import train
    from train.config import TrainConfig
    from train.features import Feature, register_feature
    from train.loop import train as run_training
    from train.tasks import register_task

    assert train.TrainConfig is TrainConfig and train.train is run_training and train.Feature is Feature
    assert train.register_feature is register_feature and train.register_task is register_task
    assert set(train.__all__) == {"TrainConfig", "train", "Feature", "register_feature", "register_task"}
    with pytest.raises(AttributeError):
        train.no_such_name  # noqa: B018
