"""OUTPUT_DIR/metrics.jsonl, one JSON record a line (a step's metrics, or an `"event": "eval"` record): `MetricsLog`
owns the file for the length of a run. Every file the trainer writes is strict JSON: a non-finite number is `null`."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path


def json_safe(obj):
    """`obj` with every non-finite float (NaN, +-inf) replaced by None, recursively: what strict JSON can hold."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [json_safe(v) for v in obj]
    return obj


def dumps(obj, **kwargs) -> str:
    """json.dumps that never writes a bare NaN / Infinity (they become null)."""
    return json.dumps(json_safe(obj), allow_nan=False, **kwargs)


def write_json(path: Path, obj, **kwargs) -> None:
    """Strict JSON to `path`, atomically (a temporary file renamed over it)."""
    tmp = Path(path).with_name(Path(path).name + ".tmp")
    tmp.write_text(dumps(obj, **kwargs) + "\n")
    os.replace(tmp, path)


class MetricsLog:
    """Use as ``with MetricsLog(path, keep_lines) as log: log.write(record)``.

    A fresh run (`keep_lines` None) starts the file empty; a resumed run keeps the first `keep_lines` records (what
    its checkpoint had written) and drops the rest, which the resumed run writes again. A torn last line (a write cut
    short by a crash) is dropped with a warning. Every record is flushed as soon as it is written, so the file is
    readable (and plottable) while the run goes on; `lines` counts the records in the file.
    """

    def __init__(self, path: Path, keep_lines: int | None = None, report_to: str = "none", config: dict | None = None):
        self.path = Path(path)
        self.keep_lines = keep_lines
        self.lines = 0
        self._file = None
        self.report_to, self.config = report_to, config  # --report-to: each record also goes to that dashboard
        self.dashboard = None

    def __enter__(self) -> MetricsLog:
        kept: list[str] = []
        if self.keep_lines is not None and self.path.exists():
            for i, line in enumerate(self.path.read_text().splitlines()[: self.keep_lines]):
                try:
                    json.loads(line)
                except json.JSONDecodeError:
                    print(f"warning: {self.path} line {i + 1} is torn (a write cut short); it and the rest are dropped")
                    break
                kept.append(line)
        if self.keep_lines is not None and len(kept) < self.keep_lines:
            print(f"warning: {self.path} holds {len(kept)} of the checkpoint's {self.keep_lines} records")
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text("".join(ln + "\n" for ln in kept))
        os.replace(tmp, self.path)
        self.lines = len(kept)
        self._file = self.path.open("a")
        if self.report_to != "none":
            from ..run.dashboards import Dashboard

            purge = None
            if self.keep_lines is not None:  # a resume: TensorBoard drops what was logged after the kept records
                purge = max((json.loads(ln).get("step", 0) for ln in kept), default=-1) + 1
            self.dashboard = Dashboard(self.report_to, self.path.parent, self.config, purge_step=purge)
        return self

    def write(self, record: dict) -> None:
        if self._file is None:
            raise RuntimeError("MetricsLog.write outside its `with` block")
        self._file.write(dumps(record) + "\n")
        self._file.flush()
        self.lines += 1
        if self.dashboard is not None:
            self.dashboard.log(record)

    def __exit__(self, *exc) -> None:
        self._file.close()
        self._file = None
        if self.dashboard is not None:
            self.dashboard.close()
            self.dashboard = None


class NullLog:
    """The metrics log of a torchrun rank other than 0: counts the records (the checkpoint's bookkeeping stays the
    same on every rank) and writes nothing (rank 0 writes the one metrics.jsonl)."""

    def __init__(self, keep_lines: int | None = None):
        self.lines = keep_lines or 0

    def __enter__(self) -> NullLog:
        return self

    def write(self, record: dict) -> None:
        self.lines += 1

    def __exit__(self, *exc) -> None:
        pass
