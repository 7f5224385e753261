"""Loads csrc/emu/sgrpo_emu.py (the AscendC CPU-emulation driver, not part of the package) once per session."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def emu_module() -> ModuleType:
    if "sgrpo_emu" not in sys.modules:
        spec = importlib.util.spec_from_file_location("sgrpo_emu", ROOT / "csrc" / "emu" / "sgrpo_emu.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules["sgrpo_emu"] = mod
        spec.loader.exec_module(mod)
    return sys.modules["sgrpo_emu"]
