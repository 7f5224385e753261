"""Helpers shared by the benchmark scripts: environment record, timing statistics, table writing."""

from __future__ import annotations

import csv
import platform
import statistics
import subprocess
from pathlib import Path

import torch

RESULTS = Path(__file__).resolve().parent / "results"


def git_sha() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             cwd=Path(__file__).resolve().parent, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True,
                               cwd=Path(__file__).resolve().parent).stdout.strip()
        return out.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"


def versions() -> str:
    parts = [f"torch {torch.__version__}", f"python {platform.python_version()}"]
    try:
        import triton

        parts.append(f"triton {triton.__version__}")
    except ImportError:
        pass
    return "; ".join(parts)


def quantiles(times_ms: list[float]) -> tuple[float, float, float]:
    """(median, p20, p80) of a list of timings."""
    if len(times_ms) == 1:
        return times_ms[0], times_ms[0], times_ms[0]
    q = statistics.quantiles(times_ms, n=10, method="inclusive")
    return statistics.median(times_ms), q[1], q[7]


def write_csv(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def markdown_table(rows: list[dict], columns: list[str]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for r in rows:
        lines.append("| " + " | ".join(str(r[c]) for c in columns) + " |")
    return "\n".join(lines)
