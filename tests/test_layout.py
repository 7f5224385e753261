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


def module_imports(top: str) -> dict[str, set[str]]:
    """Every module of package `top` -> every module it imports (relative imports resolved, with the packages above
    each: importing a.b.c runs the __init__ of a and a.b first), at any depth of its code (a function-level import
    counts: it closes a loop as surely when it runs)."""
    import ast

    out: dict[str, set[str]] = {}
    for path in (REPO / top).rglob("*.py"):
        parts = path.relative_to(REPO).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        package = name if parts[-1] == "__init__" else name.rpartition(".")[0]
        names = out.setdefault(name, set())
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
            for t in targets:
                parts_t = t.split(".")
                names.update(".".join(parts_t[:i]) for i in range(1, len(parts_t) + 1))
    return out


def import_graph(top: str) -> dict[str, set[str]]:
    """Every module of package `top` -> the modules of `top` it imports (`module_imports`)."""
    graph = module_imports(top)
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


def trainer_rows() -> list[set[str]]:
    """The trainer's layers as docs/design.md draws them, top down: each row's modules and packages (`loop`,
    `features`, ...), read from the code block after "The trainer's layers"."""
    import re

    text = (REPO / "docs" / "design.md").read_text()
    block = text.split("The trainer's layers, top down", 1)[1].split("```", 2)[1]
    rows = []
    for line in block.splitlines():
        names = re.match(r"((?:[\w]+(?:\.py|/)\s+)+)", line)
        if names:
            rows.append({n.removesuffix(".py").removesuffix("/") for n in names.group(1).split()})
    return rows


BESIDE_THE_LAYERS = {"sandbox", "study", "plot"}  # re-export shims of the packages that left (docs/design.md)


def test_the_trainer_imports_only_from_its_row_or_below():
    """docs/design.md's trainer layers hold: no module imports one of a higher row, at any depth of its code (two
    function-level imports went up: config/file.py -> run.metrics, export.py -> run.signals), and every module is in
    a row."""
    rows = trainer_rows()
    assert len(rows) >= 8, rows
    rank = {name: i for i, row in enumerate(rows) for name in row}
    component = lambda module: module.split(".")[1]  # noqa: E731 -- train.config.file -> config
    wrong = []
    for module, deps in import_graph("train").items():
        if module == "train" or component(module) in BESIDE_THE_LAYERS:
            continue
        if component(module) not in rank:
            wrong.append(f"{module}: in no row of docs/design.md's trainer layers")
            continue
        for dep in sorted(deps):
            if dep == "train" or component(dep) == component(module):
                continue
            if rank.get(component(dep), -1) < rank[component(module)]:
                wrong.append(f"{module} imports {dep}, a higher row (or beside the layers)")
    assert not wrong, "\n".join(wrong)


def test_the_packages_layer_rules():
    """docs/design.md's rules for sgrpo_kernels, on the import graph (function-level imports included): the ops side
    never imports the RL layer or the integrations; a backend imports only the contract and its own modules (the
    registry picks them); validation and support import nothing of the package; train/ never reaches into the
    backends."""
    graph, pkg = import_graph("sgrpo_kernels"), "sgrpo_kernels"
    ops_side = tuple(f"{pkg}.{m}" for m in ("ops", "custom_ops", "vocab_parallel", "truncation", "support",
                                             "validation", "backends"))  # fmt: skip
    wrong = []
    for m, deps in graph.items():
        if m.startswith(ops_side):
            wrong += [f"{m} imports {d}" for d in deps if d.startswith((f"{pkg}.rl", f"{pkg}.integrations"))]
        if m.startswith(f"{pkg}.backends.") and m.split(".")[2] not in ("registry", "contract"):
            own, allowed = f"{pkg}.backends.{m.split('.')[2]}", (pkg, f"{pkg}.backends", f"{pkg}.backends.contract")
            wrong += [f"{m} imports {d}" for d in deps if d not in allowed and d != own and not d.startswith(own + ".")]
    for m in (f"{pkg}.validation", f"{pkg}.support"):
        wrong += [f"{m} imports {d}" for d in graph[m] if d != pkg]
    for m, names in module_imports("train").items():
        wrong += [f"{m} imports {n}" for n in sorted(names) if n.startswith(f"{pkg}.backends")]
    assert not wrong, "\n".join(wrong)


def test_trainer_public_face_is_lazy():
    """`import train` loads nothing heavy; its five names are the trainer's own objects."""
    mods = loaded_after("import train")
    assert not {m for m in mods if m.split(".")[0] in ("torch", "sgrpo_sandbox", "study")}
    assert {m for m in mods if m.startswith("train.")} == set()

    import train
    from train.__main__ import main
    from train.config import TrainConfig
    from train.features import Feature, register_feature, unregister_feature
    from train.loop import train as run_training
    from train.tasks import register_task, unregister_task

    assert train.TrainConfig is TrainConfig and train.train is run_training and train.Feature is Feature
    assert train.register_feature is register_feature and train.register_task is register_task
    assert train.unregister_feature is unregister_feature and train.unregister_task is unregister_task
    assert train.main is main
    assert set(train.__all__) == {"TrainConfig", "train", "main", "Feature", "register_feature", "register_task",
                                  "unregister_feature", "unregister_task"}  # fmt: skip
    with pytest.raises(AttributeError):
        train.no_such_name  # noqa: B018


# ------------------------------------------------------------------------------------------- the size rules, and lint
LIBRARIES = ("sgrpo_kernels", "sgrpo_sandbox", "train", "study", "benchmarks")


def long_files(root: Path, tops=LIBRARIES, limit: int = 450) -> list[str]:
    """`path: N lines` for each library file over `limit` lines (CONVENTIONS: one purpose a file, at most 450)."""
    files = sorted(p for top in tops for p in (root / top).rglob("*.py"))
    counts = ((p, len(p.read_text().splitlines())) for p in files)
    return [f"{p.relative_to(root)}: {n} lines" for p, n in counts if n > limit]


def long_functions(root: Path, tops=("train", "study"), limit: int = 80) -> list[str]:
    """`path:line name: N lines` for each function of the trainer or the study app over `limit` lines."""
    import ast

    out = []
    for p in sorted(p for top in tops for p in (root / top).rglob("*.py")):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if (n := node.end_lineno - node.lineno + 1) > limit:
                    out.append(f"{p.relative_to(root)}:{node.lineno} {node.name}: {n} lines")
    return out


def test_no_library_file_over_450_lines_and_no_trainer_function_over_80():
    assert long_files(REPO) == []
    assert long_functions(REPO) == []


def test_the_size_rules_flag_what_breaks_them(tmp_path):
    (tmp_path / "train").mkdir()
    body = "".join(f"    x{i} = {i}\n" for i in range(80))
    (tmp_path / "train" / "big.py").write_text("def f():\n" + body + "\n" * 400)
    assert long_files(tmp_path, tops=("train",)) == ["train/big.py: 481 lines"]
    assert long_functions(tmp_path, tops=("train",)) == ["train/big.py:1 f: 81 lines"]


def test_ruff_finds_nothing():
    """The project's lint rules (pyproject.toml [tool.ruff]) hold over the whole tree; ruff is in the test extra,
    pinned, since another ruff may find other things with the same rule sets (so any other version skips)."""
    import importlib.metadata
    import re

    pytest.importorskip("ruff")
    pin = re.search(r'"ruff==([^"]+)"', (REPO / "pyproject.toml").read_text()).group(1)
    if (have := importlib.metadata.version("ruff")) != pin:
        pytest.skip(f"ruff {have} installed; the test extra pins {pin}")
    bad = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--stdin-filename", "x.py", "-"],
                         input="import os\n", cwd=REPO, capture_output=True, text=True)  # fmt: skip
    assert bad.returncode == 1 and "F401" in bad.stdout  # the check can fail
    res = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "."], cwd=REPO, capture_output=True,
                         text=True)  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
