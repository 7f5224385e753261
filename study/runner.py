"""Runs a study's grid: one trainer process per run, `workers` at a time with the CPU threads split between them;
a finished run is skipped, an interrupted one resumes from its checkpoint; each finished run's files are copied into
the results tree and recorded in the manifest (git sha, versions, machine, wall time)."""

from __future__ import annotations

import ctypes
import json
import os
import platform
import signal
import stat
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from .adopt import differences
from .grid import RunSpec
from .results import copy_run_files, is_finished, load_run, read_manifest, read_summary, write_manifest
from .trainer import cpu_info


def environment() -> dict:
    """What produced a run: git commit (and whether the tree had uncommitted changes), versions, machine."""
    import torch  # only a study that trains needs them: --help and --report start without them
    import transformers

    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], capture_output=True, text=True, check=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return ""

    return {
        "git_sha": git("rev-parse", "HEAD"),
        "git_dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "machine": {**cpu_info(), "cores": os.cpu_count(), "system": platform.platform()},
    }


class Manifest:
    """The study's manifest.json in the results directory: the regime (name and trainer overrides), the arms, and
    one entry per finished run. A results directory holds one regime: different overrides are refused."""

    def __init__(self, results: Path, regime: str, overrides: dict[str, str], arms: dict):
        self.results = results
        self.data = {"regime": regime, "overrides": overrides, "arms": arms, "runs": {}}
        old = read_manifest(results)
        if old is not None:
            if old.get("overrides") != overrides:
                raise ValueError(
                    f"{results} holds the study of regime {old.get('regime')!r} with overrides {old.get('overrides')}; "
                    f"this call's are {overrides}. Use another --out (or the same --regime / --set)."
                )
            for name, arm in arms.items():
                if name in old.get("arms", {}) and old["arms"][name] != arm:
                    raise ValueError(f"{results}: arm {name!r} was {old['arms'][name]}, now {arm}; use another --out")
            self.data["runs"] = old.get("runs", {})
            self.data["arms"] = {**old.get("arms", {}), **arms}

    def record(self, key: str, entry: dict) -> None:
        """Adds one run's entry to the manifest as it is on disk now (a study.adopt meanwhile keeps its runs)."""
        on_disk = read_manifest(self.results) or {}
        self.data["runs"] = {**on_disk.get("runs", {}), **self.data["runs"], key: entry}
        self.save()

    def save(self) -> None:
        write_manifest(self.results, self.data)


@dataclass
class Active:
    spec: RunSpec
    proc: subprocess.Popen
    log: Path
    started: float
    resumed: bool


def publish(spec: RunSpec) -> dict:
    """Copies the run's files into its result directory (heldout.jsonl when the run wrote one; summary.json last: its
    presence marks the run finished)."""
    copy_run_files(spec.work_dir, spec.result_dir)
    return read_summary(spec.result_dir)


def _tail(path: Path, n: int = 15) -> str:
    try:
        lines = path.read_text(errors="replace").replace("\r", "\n").splitlines()
    except OSError:
        return ""
    return "\n".join("    " + line for line in lines[-n:])


def _minutes(seconds: float) -> str:
    return f"{int(seconds // 60)}m {int(seconds % 60):02d}s"


def run_grid(
    specs: list[RunSpec], manifest: Manifest, workers: int, threads: int, progress: bool = True, out=sys.stdout
) -> tuple[int, list[str]]:
    """Runs every unfinished spec; returns (runs finished by this call, keys of runs that failed). First the finished
    runs the manifest does not record are checked (check_unrecorded: a ValueError, before anything is written), then the
    manifest is saved. A KeyboardInterrupt or SIGTERM stops the running trainers with SIGTERM (each checkpoints, so the
    next call resumes them) and propagates as KeyboardInterrupt."""
    check_unrecorded(specs, manifest)
    check_work_checkpoints(specs)
    lock = StudyLock(manifest.results)  # released when this call ends, however it ends
    on_disk = read_manifest(manifest.results) or {}  # (a study that ended since this one read it)
    manifest.data["runs"] = {**on_disk.get("runs", {}), **manifest.data["runs"]}
    try:
        return _run_locked(specs, manifest, workers, threads, progress, out)
    finally:
        lock.release()


def _run_locked(specs: list[RunSpec], manifest: Manifest, workers: int, threads: int, progress: bool, out
                ) -> tuple[int, list[str]]:  # fmt: skip
    manifest.save()
    todo = [s for s in specs if not is_finished(s.result_dir)]
    done = len(specs) - len(todo)
    print(
        f"{len(specs)} runs, {done} already finished, {len(todo)} to run: "
        f"{workers} at a time, {threads} thread(s) each",
        file=out,
    )
    if not todo:
        return 0, []
    env = environment()
    if env["git_dirty"]:
        print("note: the git tree has uncommitted changes (recorded in the manifest)", file=out)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(specs), initial=done, desc="study", unit="run", dynamic_ncols=True)

    def say(line: str) -> None:
        (bar.write if bar is not None else lambda s: print(s, file=out, flush=True))(line)

    active: list[Active] = []
    failed: list[str] = []
    finished = 0
    queue = list(todo)
    handled = (signal.SIGTERM, signal.SIGHUP)  # (a closed terminal, a dropped ssh session: the trainers checkpoint)
    previous = {sig: signal.signal(sig, _raise_interrupt) for sig in handled} if _main_thread() else {}
    try:
        while queue or active:
            while queue and len(active) < workers:
                active.append(_start(queue.pop(0), threads))
            time.sleep(0.5)
            for a in [a for a in active if a.proc.poll() is not None]:
                active.remove(a)
                ok, line = _conclude(a, manifest, env, threads, workers)
                say(line)
                if not ok:
                    failed.append(a.spec.key)
                    continue
                finished += 1
                if bar is not None:
                    bar.update(1)
    except BaseException:
        _stop(active)
        raise
    finally:
        if bar is not None:
            bar.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return finished, failed


def check_unrecorded(specs: list[RunSpec], manifest: Manifest) -> None:
    """A finished run in the results folder that the manifest does not record (copied there, or left by a study whose
    manifest.json is gone) would be skipped and reported as this study's: its config.json must be what its spec runs,
    field by field as study.adopt compares (compare_config); else a ValueError naming it and its differences."""
    for spec in specs:
        if spec.key in manifest.data["runs"] or not is_finished(spec.result_dir):
            continue
        if diff := differences(spec.result_dir, spec):
            raise ValueError(
                f"{spec.result_dir}: a finished run that {manifest.results / 'manifest.json'} does not record, and not "
                f"what {spec.key} runs in this study: {diff}; move it away, or use another --out"
            )


def _conclude(a: Active, manifest: Manifest, env: dict, threads: int, workers: int) -> tuple[bool, str]:
    """A trainer that exited: publishes its files and records it in the manifest with what produced it. Returns whether
    it finished, and its progress line (a failure's carries the tail of its log)."""
    wall = time.time() - a.started
    rc = a.proc.returncode
    if rc != 0 or not is_finished(a.spec.work_dir):
        _add_attempt(a, wall, threads)  # its time counts when a later call finishes the run
        if rc == 0 and (budget := _budget_stop(a.spec.work_dir)):
            return False, f"NOT FINISHED {a.spec.key}: {budget}; not published, the same command continues it"
        return False, f"FAILED {a.spec.key} (exit status {rc}, {_minutes(wall)}); log {a.log}:\n{_tail(a.log)}"
    try:
        summary = publish(a.spec)
    except OSError as exc:  # a full disk: this run is reported, the others go on (the next call publishes it)
        return False, f"FAILED {a.spec.key}: finished, but its files could not be published ({exc.strerror or exc})"
    earlier = _attempts(a.spec) if a.resumed else []  # the attempts it resumed from (failed, or interrupted)
    manifest.record(
        a.spec.key,
        {
            **env,
            "arm": a.spec.arm.name,
            "seed": a.spec.seed,
            "threads": threads,
            "workers": workers,
            # a resumed run's wall time adds to that of its earlier attempts: the manifest holds the run's whole cost
            "wall_s": wall + sum(e["wall_s"] for e in earlier),
            "resumed": a.resumed,
            **({"earlier_attempts": earlier} if earlier else {}),  # (each one's wall time and threads)
            "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "command": " ".join(a.spec.argv(threads, a.resumed)[1:]),
        },
    )
    collapse = load_run(a.spec.result_dir)["collapse"]  # every collapse rule, on the published records
    return True, (
        f"{a.spec.arm.name:<11} seed {a.spec.seed}: held-out "
        f"{summary['before']['eval_acc']:.3f} -> {summary['after']['eval_acc']:.3f} "
        f"(gain {summary.get('delta'):+.3f}), collapse {'YES' if collapse else 'no'}, {_minutes(wall)}"
    )


def _budget_stop(work_dir: Path) -> str | None:
    """Why the trainer stopped the run before its last step (its time budget), from its summary; else None."""
    try:
        summary = read_summary(work_dir)
    except (OSError, ValueError):
        return None
    if isinstance(summary, dict) and summary.get("stopped_by_time_budget"):
        return f"stopped by its time budget (time_budget_s) after step {summary.get('steps')}"
    return None


def _stop(active: list[Active]) -> None:
    """SIGTERM to every running trainer, which checkpoints and exits 143 (the next call resumes it); one that has not
    exited after 2 minutes is killed."""
    for a in active:
        if a.proc.poll() is None:
            a.proc.send_signal(signal.SIGTERM)
    for a in active:
        try:
            a.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            a.proc.kill()
        _add_attempt(a, time.time() - a.started, None)


def _attempts_file(spec: RunSpec) -> Path:
    return spec.work_dir.parent / f"{spec.work_dir.name}.attempts.json"


def _attempts(spec: RunSpec) -> list[dict]:
    """The run's earlier attempts that did not finish it ({"wall_s", "threads"} each), from its work folder."""
    try:
        data = json.loads(_attempts_file(spec).read_text())
    except (OSError, ValueError):
        return []
    return [e for e in data if isinstance(e, dict) and isinstance(e.get("wall_s"), int | float)] if isinstance(
        data, list) else []  # fmt: skip


def _add_attempt(a: Active, wall: float, threads: int | None) -> None:
    """Notes an attempt that ended without finishing its run (a failure, an interrupted study), beside its log."""
    try:
        _attempts_file(a.spec).write_text(json.dumps([*_attempts(a.spec), {"wall_s": wall, "threads": threads}]))
    except OSError:  # (a full disk: the wall time of that attempt is not counted)
        pass


def _start(spec: RunSpec, threads: int) -> Active:
    resume = (spec.work_dir / "checkpoint").is_dir()
    spec.work_dir.parent.mkdir(parents=True, exist_ok=True)
    if not resume:  # a fresh start: no earlier attempt of its counts
        _attempts_file(spec).unlink(missing_ok=True)
    log = spec.work_dir.parent / f"{spec.work_dir.name}.log"
    with open(log, "a") as fh:
        fh.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} {'resume' if resume else 'start'}\n")
        fh.flush()
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1"}
        proc = subprocess.Popen(
            spec.argv(threads, resume),
            stdout=fh,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # a Ctrl-C reaches the study, which stops the trainers with SIGTERM
            preexec_fn=_term_with_parent,  # and a study killed outright (SIGKILL) leaves none running unsupervised
        )
    return Active(spec, proc, log, time.time(), resume)


def _term_with_parent() -> None:
    """In the trainer's process before it starts: SIGTERM (checkpoint, exit) when the study's process dies."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG (Linux)
    except (OSError, AttributeError):  # elsewhere: as before
        pass


def check_work_checkpoints(specs: list[RunSpec]) -> None:
    """A run not finished in the results folder whose work folder holds a checkpoint is resumed from it: that
    checkpoint must be this run's, field by field as study.adopt compares (compare_config); else a ValueError naming
    it and its differences (the trainer allows some fields to change on --resume, so it would continue a run of
    another configuration, and the study publish it as this one)."""
    for spec in specs:
        if is_finished(spec.result_dir) or not (spec.work_dir / "checkpoint").is_dir():
            continue
        if not (spec.work_dir / "config.json").is_file():
            continue  # (the trainer refuses that resume itself, naming it)
        if diff := differences(spec.work_dir, spec):
            raise ValueError(
                f"{spec.work_dir}: a checkpoint that {spec.key} would resume, of another configuration: {diff}; move "
                "that folder away (the run then starts afresh), or use another --work"
            )


class StudyLock:
    """An exclusive lock on a results folder (OUT/.study.lock, flock) for the length of a study's run: a second study
    into the same folder is refused, not left to overwrite the manifest entries of the first."""

    def __init__(self, results: Path):
        import fcntl

        results.mkdir(parents=True, exist_ok=True)
        self.path = results / ".study.lock"
        try:  # never through a link planted in its place (the lock is truncated and written)
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
        except OSError as exc:
            raise ValueError(
                f"{self.path}: cannot open the study's lock file ({exc.strerror or exc}; a link or another kind of "
                "file in its place?); remove it, or use another --out"
            ) from None
        if not stat.S_ISREG(os.fstat(self._fd).st_mode):
            os.close(self._fd)
            raise ValueError(f"{self.path} is not a regular file; remove it, or use another --out")
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(self._fd, 200).decode(errors="replace").strip() or "another process"
            os.close(self._fd)
            raise ValueError(
                f"{results} is in use by another study ({holder}); wait for it, or use another --out"
            ) from None
        os.ftruncate(self._fd, 0)
        os.write(self._fd, f"pid {os.getpid()}".encode())

    def release(self) -> None:
        try:
            self.path.unlink(missing_ok=True)  # while holding it
        finally:
            os.close(self._fd)


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()
