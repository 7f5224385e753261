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
