"""OUTPUT_DIR/metrics.jsonl, one JSON record a line (a step's metrics, or an `"event": "eval"` record): `MetricsLog`
owns the file for the length of a run. Every file the trainer writes is strict JSON: a non-finite number is `null`."""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..errors import Refused
from ..run.files import LinkRefused, open_append, read_text, write_text_atomic
from ..strict_json import dumps


def write_json(path: Path, obj, **kwargs) -> None:
    """Strict JSON to `path`, atomically (our own temporary file renamed over it; never through a link)."""
    write_text_atomic(path, dumps(obj, **kwargs) + "\n")


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
        self.logged_through: int | None = None  # a resume: the last step the stopped run had written (and logged)

    def _kept(self) -> list[str]:
        """The first `keep_lines` lines of the file (read without following a link), less any that is not a JSON
        record (a torn write, a garbled line): those are dropped one by one, each named, the records around them
        kept. A blank line is no record: it is skipped, and not counted among the `keep_lines`."""
        kept: list[str] = []
        if self.keep_lines is None or not self.path.exists():
            return kept
        lines = [(i, ln) for i, ln in enumerate(read_text(self.path).splitlines()) if ln.strip()]
        self.logged_through = max((_step(ln) for _, ln in lines), default=None)  # what the dashboards already have
        for i, line in lines[: self.keep_lines]:
            try:
                ok = isinstance(json.loads(line), dict)
            except ValueError:
                ok = False
            if not ok:
                print(f"warning: {self.path} line {i + 1} is not a JSON record (torn or garbled); dropped, the "
                      "records around it are kept")  # fmt: skip
                continue
            kept.append(line)
        if len(kept) < self.keep_lines:
            print(f"warning: {self.path} holds {len(kept)} of the checkpoint's {self.keep_lines} records")
        return kept

    def __enter__(self) -> MetricsLog:
        try:
            kept = self._kept()
            write_text_atomic(self.path, "".join(ln + "\n" for ln in kept))
            self.lines = len(kept)
            self._file = open_append(self.path)
        except LinkRefused as exc:  # a link or a folder put there since open_output_dir checked: said, not a traceback
            raise Refused(exc.strerror) from None
        if self.report_to != "none":
            from ..run.dashboards import Dashboard

            purge = None
            if self.keep_lines is not None:  # a resume: TensorBoard drops what was logged after the kept records
                purge = max((json.loads(ln).get("step", 0) for ln in kept), default=-1) + 1
            try:
                self.dashboard = Dashboard(self.report_to, self.path.parent, self.config, purge_step=purge,
                                           logged_through=self.logged_through)  # fmt: skip
            except OSError as exc:  # a full disk, a folder that cannot be written: the run goes on without it
                self._dashboard_failed("could not start", exc)
        return self

    def _dashboard_failed(self, what: str, exc: BaseException) -> None:
        print(f"warning: --report-to {self.report_to}: {what} ({type(exc).__name__}: {exc}); the dashboard is off "
              f"from here, {self.path} keeps every record")  # fmt: skip
        self.dashboard = None

    def write(self, record: dict) -> None:
        """One record, whole or not at all: a write that fails (disk full) is cut back to the previous record and the
        error raised."""
        if self._file is None:
            raise RuntimeError("MetricsLog.write outside its `with` block")
        data, written = (dumps(record) + "\n").encode(), 0
        size = os.fstat(self._file.fileno()).st_size
        try:
            while written < len(data):  # unbuffered: a short write is continued, a failed one raises
                written += self._file.write(data[written:])
        except OSError:
            try:
                os.ftruncate(self._file.fileno(), size)
            except OSError:
                pass
            raise
        self.lines += 1
        if self.dashboard is not None:
            try:
                self.dashboard.log(record)
            except Exception as exc:  # noqa: BLE001 -- the dashboard's own failure never stops the run
                self._dashboard_failed(f"step {record.get('step')} not logged", exc)

    def sync(self) -> None:
        """The records written so far, on disk (fsync): before a checkpoint that counts them is written."""
        if self._file is not None:
            os.fsync(self._file.fileno())

    def __exit__(self, *exc) -> None:
        self._file.close()
        self._file = None
        if self.dashboard is not None:
            dashboard, self.dashboard = self.dashboard, None
            try:
                dashboard.close()
            except Exception as err:  # noqa: BLE001
                self._dashboard_failed("could not close", err)


def _step(line: str) -> int:
    try:
        step = json.loads(line).get("step")
    except (ValueError, AttributeError):
        return -1
    return step if isinstance(step, int) and not isinstance(step, bool) else -1


class NullLog:
    """The metrics log of a torchrun rank other than 0: counts the records (the checkpoint's bookkeeping stays the
    same on every rank) and writes nothing (rank 0 writes the one metrics.jsonl)."""

    def __init__(self, keep_lines: int | None = None):
        self.lines = keep_lines or 0

    def __enter__(self) -> NullLog:
        return self

    def write(self, record: dict) -> None:
        self.lines += 1

    def sync(self) -> None:
        pass

    def __exit__(self, *exc) -> None:
        pass
