"""Tiling header of the AscendC kernels (csrc/ascend/sgrpo_tiling.h) and the emulator self-test, compiled with g++.

The C++ programs live in csrc/tests/; they are compiled into a per-session temp dir and skipped cleanly without g++.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

CSRC = Path(__file__).resolve().parents[1] / "csrc"
CXX = shutil.which("g++")
pytestmark = pytest.mark.skipif(CXX is None, reason="g++ not found")


def _build_and_run(tmp_path: Path, source: str, *flags: str) -> str:
    exe = tmp_path / Path(source).stem
    cmd = [CXX, "-std=c++17", "-O1", "-Wall", "-Wextra", "-Werror", *flags, str(CSRC / source), "-o", str(exe)]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
    return run.stdout


def test_tiling_header(tmp_path: Path) -> None:
    out = _build_and_run(tmp_path, "tests/test_tiling.cpp", f"-I{CSRC / 'ascend'}")
    assert " 0 failures" in out, out
    checks = int(out.split("tiling: ")[1].split(" checks")[0])
    assert checks > 100_000


def test_emulator_catches_misuse(tmp_path: Path) -> None:
    out = _build_and_run(tmp_path, "tests/test_emu_checks.cpp", "-DSGRPO_EMU", f"-I{CSRC / 'emu'}")
    assert "12 ok, 0 failures" in out, out


def test_tiling_header_is_plain_cpp(tmp_path: Path) -> None:
    """The header compiles alone in C++17 with no AscendC/torch include (host, kernels and tests share it)."""
    src = tmp_path / "only_header.cpp"
    src.write_text(
        '#include "sgrpo_tiling.h"\nint main() { return sgrpo::MakeTiling(4, 100, 2, 2, false).tile == 128 ? 0 : 1; }\n'
    )
    exe = tmp_path / "only_header"
    cmd = [CXX, "-std=c++17", "-Wall", "-Werror", f"-I{CSRC / 'ascend'}", str(src), "-o", str(exe)]
    subprocess.run(cmd, check=True)
    assert subprocess.run([str(exe)]).returncode == 0
