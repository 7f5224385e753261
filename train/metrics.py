"""OUTPUT_DIR/metrics.jsonl, one JSON record a line (a step's metrics, or an `"event": "eval"` record): `MetricsLog`
owns the file for the length of a run."""

from __future__ import annotations

import json
from pathlib import Path


class MetricsLog:
    """Use as ``with MetricsLog(path, resume_step) as log: log.write(record)``.

    A fresh run (`resume_step` None) starts the file empty; a resumed run keeps the records up to and including
    `resume_step` (the checkpoint's step) and drops the ones after it, which the resumed run writes again. Every
    record is flushed as soon as it is written, so the file is readable (and plottable) while the run goes on.
    """

    def __init__(self, path: Path, resume_step: int | None = None):
        self.path = Path(path)
        self.resume_step = resume_step
        self._file = None

    def __enter__(self) -> MetricsLog:
        if self.resume_step is None:
            self.path.write_text("")
        else:
            lines = self.path.read_text().splitlines() if self.path.exists() else []
            keep = [ln for ln in lines if json.loads(ln)["step"] <= self.resume_step]
            self.path.write_text("".join(ln + "\n" for ln in keep))
        self._file = self.path.open("a")
        return self

    def write(self, record: dict) -> None:
        if self._file is None:
            raise RuntimeError("MetricsLog.write outside its `with` block")
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()

    def __exit__(self, *exc) -> None:
        self._file.close()
        self._file = None
