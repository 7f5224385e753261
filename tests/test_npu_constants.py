"""The AscendC kernels' interface constants are defined once per language: csrc/ascend/sgrpo_tiling.h for C++ (kernels,
launchers, binding, emulator) and sgrpo_kernels/backends/npu_backend.py for Python (the backend, the emulation driver
csrc/emu/sgrpo_emu.py, the tests). The header is not installed with the package, so Python cannot read it at import;
instead these tests parse it as text (no compiler needed) and check that the Python copy equals it, so the two cannot
drift apart.
"""

from __future__ import annotations

import ast
import operator
import re
from pathlib import Path

import pytest
import torch
from emu_loader import emu_module

from sgrpo_kernels.backends import npu_backend as npu

HEADER = Path(__file__).resolve().parents[1] / "csrc" / "ascend" / "sgrpo_tiling.h"
_CONST = re.compile(r"^\s*constexpr\s+u?int(?:8|16|32|64)_t\s+(k\w+)\s*=\s*([^;]+);")
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.LShift: operator.lshift,
        ast.BitOr: operator.or_}

# npu_backend name -> sgrpo_tiling.h name
FLAGS = {
    "HAS_PREV": "kHasPrev", "WRITE_STATE": "kWriteState", "FINALIZE": "kFinalize", "WRITE_ENTROPY": "kWriteEntropy",
    "WRITE_STATS": "kWriteStats", "HAS_GRAD_ENTROPY": "kHasGradEntropy",
}
MIRRORED = {**FLAGS, "STATE_FLOATS": "kStateFloats", "UB_BYTES": "kUbBytes", "MAX_TILE": "kMaxTile"}
DTYPE_NAMES = {torch.float32: "kFloat32", torch.float16: "kFloat16", torch.bfloat16: "kBFloat16"}


def _value(expr: str) -> int:
    """A constant's initializer, e.g. `192u * 1024u`: integer literals joined by + - * << |."""
    tree = ast.parse(re.sub(r"\b(\d+)[uUlL]+\b", r"\1", expr.strip()), mode="eval").body

    def ev(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        raise ValueError(f"{HEADER.name}: {expr!r} is not a plain integer expression")

    return ev(tree)


def _header() -> tuple[dict[str, int], dict[str, list[str]]]:
    """(every `constexpr intN_t kName = ...;` of the header by name, the names in each `// Flags of ...` /
    `// dtype codes ...` block, a block ending at the first line that is not a constant)."""
    consts: dict[str, int] = {}
    blocks: dict[str, list[str]] = {}
    block = None
    for line in HEADER.read_text().splitlines():
        m = _CONST.match(line)
        if m:
            consts[m.group(1)] = _value(m.group(2))
            if block is not None:
                blocks[block].append(m.group(1))
            continue
        block = None
        if line.startswith(("// Flags of", "// dtype codes")):
            block = line
            blocks[block] = []
    return consts, blocks


@pytest.mark.parametrize("py_name, c_name", sorted(MIRRORED.items()))
def test_python_constant_equals_the_header(py_name, c_name):
    assert getattr(npu, py_name) == _header()[0][c_name], f"npu_backend.{py_name} != sgrpo_tiling.h {c_name}"


def test_dtype_codes_equal_the_header():
    consts = _header()[0]
    assert npu.DTYPE_CODE == {dt: consts[name] for dt, name in DTYPE_NAMES.items()}


def test_every_flag_and_dtype_code_of_the_header_has_its_python_copy():
    """A flag or dtype code added to the header must be added to npu_backend (and to the tables above)."""
    blocks = _header()[1]
    assert len(blocks) == 3, f"expected the header's two `// Flags of` blocks and its `// dtype codes` block: {blocks}"
    listed = {name for names in blocks.values() for name in names}
    known = set(FLAGS.values()) | set(DTYPE_NAMES.values())
    assert listed == known, f"header only: {sorted(listed - known)}; Python only: {sorted(known - listed)}"


def test_the_emulation_driver_has_no_copy_of_its_own():
    emu = emu_module()
    assert emu.DTYPE_CODE is npu.DTYPE_CODE and emu.UB_BYTES is npu.UB_BYTES
