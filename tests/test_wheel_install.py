"""The installable trainer (pyproject.toml): the wheel's package list names every package of the repository under its
installed name (sgrpo_train = train/, sgrpo_bench = benchmarks/; no generic top-level name), its package data and
console scripts point at what exists. The wheel itself is built, installed into a fresh venv and run from outside the
checkout by the CI stage .ci/stage_wheel.sh (minutes: not part of this file)."""

from __future__ import annotations

import importlib
import os
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11 (the CI's)

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
SETUPTOOLS = PYPROJECT["tool"]["setuptools"]
INSTALLED_AS = SETUPTOOLS["package-dir"]  # installed name -> repository folder
REPO_NAME = {folder: name for name, folder in INSTALLED_AS.items()}


def repository_packages() -> set[str]:
    """Every folder with an __init__.py under the installed trees, by the name it is installed under."""
    out = set()
    for top in ("sgrpo_kernels", "sgrpo_sandbox", *INSTALLED_AS.values()):
        for init in (ROOT / top).rglob("__init__.py"):
            parts = init.parent.relative_to(ROOT).parts
            if "__pycache__" in parts or "results" in parts:
                continue
            out.add(".".join((REPO_NAME.get(parts[0], parts[0]), *parts[1:])))
    return out


def test_package_list_names_every_package():
    listed = set(SETUPTOOLS["packages"])
    missing, stale = repository_packages() - listed, listed - repository_packages()
    assert not missing, f"add these to [tool.setuptools] packages in pyproject.toml: {sorted(missing)}"
    assert not stale, f"listed in pyproject.toml but not a package here: {sorted(stale)}"


def test_no_generic_top_level_name():
    tops = {p.split(".")[0] for p in SETUPTOOLS["packages"]}
    assert tops == {"sgrpo_kernels", "sgrpo_sandbox", "sgrpo_train", "sgrpo_study", "sgrpo_bench"}, tops
    assert INSTALLED_AS == {"sgrpo_train": "train", "sgrpo_study": "study", "sgrpo_bench": "benchmarks"}


def test_package_data_exists():
    for package, patterns in SETUPTOOLS["package-data"].items():
        folder = ROOT / INSTALLED_AS.get(package, package.replace(".", "/"))
        for pattern in patterns:
            assert list(folder.glob(pattern)), (package, pattern)
    # the sandbox copies its stand-alone bootstrap modules from its own folder: they must be in the package
    for name in ("boot.py", "jail.py", "protocol.py"):
        assert (ROOT / "sgrpo_sandbox" / name).is_file()


@pytest.mark.parametrize("script", ["sgrpo-train", "sgrpo-study", "sgrpo-bench"])
def test_console_scripts_resolve(script):
    target = PYPROJECT["project"]["scripts"][script]
    module, _, function = target.partition(":")
    top, _, rest = module.partition(".")
    repo_module = ".".join(filter(None, (INSTALLED_AS.get(top, top), rest)))  # the same file, by its checkout name
    assert callable(getattr(importlib.import_module(repo_module), function))


def test_sgrpo_bench_dispatcher(capsys):
    from benchmarks.cli import SCRIPTS, main

    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(f"  {name} " in out for name in SCRIPTS)
    assert main(["nope"]) == 2
    assert "unknown script 'nope'" in capsys.readouterr().err
    for module, _ in SCRIPTS.values():
        assert (ROOT / "benchmarks" / f"{module}.py").is_file()


def test_every_sgrpo_bench_script_starts_from_the_installed_layout(tmp_path):
    """The wheel's names (sgrpo_bench, sgrpo_train, sgrpo_study: symlinks to the repository's folders) on a path of
    their own, run from another folder: each script's --help starts. `sgrpo-bench task --help` failed with
    ModuleNotFoundError: No module named 'study' (the dispatcher aliased benchmarks and train, not study)."""
    import subprocess
    import sys

    from benchmarks.cli import SCRIPTS

    site = tmp_path / "site"
    site.mkdir()
    for installed_name, repo_name in (*INSTALLED_AS.items(), ("sgrpo_kernels", "sgrpo_kernels"),
                                      ("sgrpo_sandbox", "sgrpo_sandbox")):  # fmt: skip
        (site / installed_name).symlink_to(ROOT / repo_name, target_is_directory=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site), "PYTHONDONTWRITEBYTECODE": "1"}
    # one process for all of them (each script's --help exits 0 through SystemExit), to import torch once
    code = (
        "import sys\nfrom sgrpo_bench.cli import main\nfor s in sys.argv[1:]:\n    try:\n"
        "        main([s, '--help'])\n    except SystemExit as e:\n        assert e.code in (0, None), (s, e.code)\n"
        "    print('started', s)"
    )
    res = subprocess.run([sys.executable, "-c", code, *SCRIPTS], cwd=elsewhere, env=env, capture_output=True,
                         text=True, timeout=300)  # fmt: skip
    assert res.returncode == 0, res.stderr[-1500:]
    started = [line for line in res.stdout.splitlines() if line.startswith("started ")]
    assert started == [f"started {s}" for s in SCRIPTS]
    assert list(elsewhere.iterdir()) == []  # --help writes nothing
    # each usage line names the command that ran it (it named `python -m benchmarks.X`, which the wheel has not)
    usage = [line.split()[1:3] for line in res.stdout.splitlines() if line.startswith("usage: ")]
    assert usage == [["sgrpo-bench", s] for s in SCRIPTS], usage
