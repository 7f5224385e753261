"""The host side of the sandbox: `run_python`, `run_check`, `run_many`, `isolation` (the package docstring says what
runs where and what it guarantees)."""

from __future__ import annotations

import atexit
import functools
import json
import keyword
import os
import py_compile
import shutil
import site
import subprocess
import sys
import sysconfig
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from . import host

BOOT = Path(__file__).with_name("boot.py")
UID_BASE = 2_000_000_000  # as in boot.py: the program runs as UID_BASE + the bootstrap's pid
CHECKER_UID_OFFSET = 1 << 22  # as in boot.py: the checker runs as the program's uid + this
GRACE_S = 10.0  # the bootstrap's own start and cleanup, beyond the program's deadline
OUTPUT_TAIL = 2000  # characters of output kept in a result
STATUSES = ("passed", "failed", "timeout", "error")
# the largest value of each Limits field: the OS calls take no more (poll's int milliseconds, setrlimit's C long,
# RLIMIT_CPU converted to nanoseconds, RLIMIT_NOFILE at most fs.nr_open, by default 2**20), with margin
LIMITS_MAX = {
    "timeout_s": 2_000_000.0,  # about 23 days
    "cpu_s": 2**31 - 1,
    "memory_mb": 2**40,  # MiB: 1 EiB
    "file_mb": 2**40,
    "tmp_mb": 2**40,
    "processes": 2**31 - 1,
    "open_files": 2**20,
    "output_bytes": 2**40,
}
# the smallest memory_mb: the sandbox's interpreter takes about 13 MiB of address space before the program's first
# line (CPython 3.11, x86-64; it fails below that); the rest is room for the program. A larger interpreter that does
# not fit its limit is reported as an error (boot.py)
MIN_MEMORY_MB = 32
_ENV = {"PYTHONHASHSEED": "0", "PYTHONSAFEPATH": "1"}
_MODULES = ("boot", "jail", "protocol")  # what the bootstrap runs, all in this directory
# the bootstrap loaded by its file path (boot.pyc in the private directory, or boot.py here) under a private module
# name, as it loads its two siblings: nothing goes on sys.path, no generic name such as `jail` into sys.modules
_LAUNCH = (
    "import sys, _frozen_importlib as b, _frozen_importlib_external as e; "
    "s = e.spec_from_file_location('_sgrpo_sandbox_boot', sys.argv[1]); m = b.module_from_spec(s); "
    "sys.modules[s.name] = m; s.loader.exec_module(m); m.main(sys.argv[2])"
)


@dataclass(frozen=True)
class Limits:
    """Per-program limits. Every field is a positive number at most LIMITS_MAX[field], and memory_mb at least
    MIN_MEMORY_MB; ValueError names a field that is not, its value and the bound."""

    timeout_s: float = 5.0  # wall clock from the program's start; then it and its descendants are killed
    cpu_s: int = 5  # RLIMIT_CPU per process (SIGXCPU, SIGKILL a second later)
    memory_mb: int = 1024  # RLIMIT_AS per process (address space: a MemoryError beyond); SysV shm in all
    file_mb: int = 16  # RLIMIT_FSIZE: the largest file a process may write
    tmp_mb: int = 64  # size of the private /tmp holding the working directory (with the mount namespace)
    processes: int = 16  # RLIMIT_NPROC: processes + threads of the sandbox uid (see the module docstring)
    open_files: int = 64  # RLIMIT_NOFILE
    output_bytes: int = 64 * 1024  # stdout + stderr read at most; the pipe is closed after that

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            kind = float if name == "timeout_s" else int
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < float("inf"):
                raise ValueError(f"Limits.{name}={value!r}: expected a positive finite {kind.__name__}")
            if kind is int and not isinstance(value, int):
                raise ValueError(f"Limits.{name}={value!r}: expected a positive integer")
            if value > LIMITS_MAX[name]:
                raise ValueError(f"Limits.{name}={value!r}: at most {LIMITS_MAX[name]!r} (LIMITS_MAX)")
        if self.memory_mb < MIN_MEMORY_MB:
            raise ValueError(
                f"Limits.memory_mb={self.memory_mb!r}: at least {MIN_MEMORY_MB} (MIN_MEMORY_MB): the interpreter alone "
                "takes about 13 MiB of address space"
            )


@dataclass(frozen=True)
class FunctionCheck:
    """A function to check (`run_check`): `program` (untrusted) defines `entry_point`; `test` (trusted) defines
    `check(candidate)`; `setup` (trusted) runs before `test` in the checker (HumanEval's prompt: its helpers)."""

    program: str
    test: str
    entry_point: str
    setup: str = ""

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            _text(value, f"FunctionCheck.{name}", "str")
        if not self.entry_point.isidentifier() or keyword.iskeyword(self.entry_point):
            raise ValueError(f"FunctionCheck.entry_point={self.entry_point!r}: expected a Python identifier (a "
                             "function's name, not a keyword)")  # fmt: skip


@dataclass(frozen=True)
class SandboxResult:
    status: str  # passed / failed / timeout / error (did not run); run_python: passed = exit 0; run_check: the verdict
    wall_s: float  # the whole run, bootstrap included
    exit_code: int | None  # run_python: the exit status, -N when killed by signal N; None: timeout, error, run_check
    output: str  # the last OUTPUT_TAIL characters of what was read of stdout + stderr
    truncated: bool  # the program wrote more than Limits.output_bytes (the rest was refused)
    network_isolated: bool  # in a network namespace of its own (no interfaces up)
    filesystem_isolated: bool  # every mount read-only, a private tmpfs on /tmp, site-packages hidden
    uid: int | None  # the uid the program (candidate) ran as when dropped from root; None: the trainer's own uid
    detail: str = ""  # what went wrong (a check: which call or test line failed); descendants that survived; at most
    # 300 characters (boot.DETAIL_MAX), lone surrogates written as \udXXX
    ipc_isolated: bool = False  # in an IPC namespace of its own, with SysV IPC bounded
    contained: bool = False  # in a PID namespace of its own: nothing of it outlives the sandbox or the trainer

    @property
    def passed(self) -> bool:
        return self.status == "passed"


def run_python(source: str, limits: Limits | None = None) -> SandboxResult:
    """Run the Python program `source` in the sandbox (module docstring) and wait for it: at most
    `limits.timeout_s + GRACE_S` seconds. Its status is its exit status: not a verdict (use `run_check`)."""
    _text(source, "source", "the program as str")
    return _run(source, None, _limits(limits))


def run_check(check: FunctionCheck, limits: Limits | None = None) -> SandboxResult:
    """Check the function `check.entry_point` of `check.program` against `check.test` in the sandbox, the test in a
    process the program cannot reach (module docstring): passed only when the test passed. At most
    `limits.timeout_s + GRACE_S` seconds."""
    if not isinstance(check, FunctionCheck):
        raise TypeError(f"check: expected a FunctionCheck, got {type(check).__name__}")
    return _run(check.program, check, _limits(limits))


def run_many(
    sources: list[str | FunctionCheck], limits: Limits | None = None, max_workers: int | None = None
) -> list[SandboxResult]:
    """`run_python` of each str, `run_check` of each FunctionCheck, at most `max_workers` at a time (default: min(8,
    CPU count)); results in order. `sources` is a list (or tuple) of them, each checked before any runs: TypeError
    naming the first bad item's index."""
    if isinstance(sources, str | bytes) or not isinstance(sources, list | tuple):
        raise TypeError(f"sources: expected a list of source strings (or FunctionChecks), got {type(sources).__name__}")
    for i, job in enumerate(sources):
        if not isinstance(job, FunctionCheck):
            _text(job, f"sources[{i}]", "a source str or a FunctionCheck")
    limits = _limits(limits)
    if max_workers is None:
        max_workers = min(8, os.cpu_count() or 1)
    if isinstance(max_workers, bool) or not isinstance(max_workers, int):  # a TypeError, as the other type checks
        raise TypeError(f"max_workers={max_workers!r}: expected an integer >= 1, not a {type(max_workers).__name__}")
    if max_workers < 1:
        raise ValueError(f"max_workers={max_workers!r}: expected an integer >= 1")
    if not sources:
        return []
    one = lambda job: run_check(job, limits) if isinstance(job, FunctionCheck) else run_python(job, limits)  # noqa: E731
    with ThreadPoolExecutor(max_workers=min(max_workers, len(sources)), thread_name_prefix="sandbox") as pool:
        return list(pool.map(one, sources))


@functools.cache
def isolation() -> dict:
    """What the sandbox gets on this machine: {"network", "filesystem", "uid_drop", "ipc", "contained"}, each a bool
    (runs one trivial program; cached)."""
    r = run_python("pass")
    if r.status != "passed":
        raise RuntimeError(f"the sandbox cannot run a trivial program here: {r.status}: {r.detail or r.output}")
    return {
        "network": r.network_isolated,
        "filesystem": r.filesystem_isolated,
        "uid_drop": r.uid is not None,
        "ipc": r.ipc_isolated,
        "contained": r.contained,
    }


def describe_isolation() -> str:
    """One line for logs: what is isolated here and what is not."""
    iso = isolation()
    yes = lambda flag: "yes" if flag else "NO"  # noqa: E731
    return (
        f"sandbox: network isolated {yes(iso['network'])}, host filesystem read-only {yes(iso['filesystem'])}, "
        f"own uid {yes(iso['uid_drop'])}, IPC isolated {yes(iso['ipc'])}, dies with the trainer "
        f"{yes(iso['contained'])} (the sgrpo_sandbox docstring says what each means)"
    )


# ----------------------------------------------------------------------------------------------------- helpers


def _limits(limits) -> Limits:
    if limits is None:
        return Limits()
    if not isinstance(limits, Limits):
        raise TypeError(f"limits: expected a Limits (sgrpo_sandbox.Limits) or None, got {type(limits).__name__}")
    return limits


def _text(value, name: str, expected: str) -> None:
    """TypeError unless `value` is a str; ValueError naming `name` and the position when it cannot be written as
    UTF-8 (a lone surrogate such as '\\ud800': the program file is UTF-8)."""
    if not isinstance(value, str):
        raise TypeError(f"{name}: expected {expected}, got {type(value).__name__}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(
            f"{name}: character {exc.start} is {value[exc.start]!r}, a lone surrogate, which UTF-8 cannot encode"
        ) from None


@functools.cache
def _hidden() -> list[str]:
    """The site-packages directories, hidden from the program (installed data sets: HumanEval's tests)."""
    paths = {*site.getsitepackages(), site.getusersitepackages()}
    paths |= {sysconfig.get_paths()[k] for k in ("purelib", "platlib")}
    return sorted(p for p in paths if os.path.isdir(p))


def _compiled() -> str | None:
    """A private directory (removed at exit) holding the bootstrap's modules compiled once per trainer process, or
    again when something deleted them (a /tmp cleaner): every program start would compile them otherwise (it runs
    with -B, and bytecode may not be cached at all, e.g. PYTHONDONTWRITEBYTECODE). None where they cannot be
    written: the bootstrap then runs from source."""
    path = _compile_bootstrap()
    if path is not None and not all(os.path.isfile(os.path.join(path, name + ".pyc")) for name in _MODULES):
        _compile_bootstrap.cache_clear()
        path = _compile_bootstrap()
    return path


@functools.cache
def _compile_bootstrap() -> str | None:
    try:
        path = tempfile.mkdtemp(prefix="sgrpo-bytecode-")
    except OSError:
        return None
    atexit.register(shutil.rmtree, path, True)
    try:
        for name in _MODULES:
            source = str(BOOT.with_name(name + ".py"))
            cfile = os.path.join(path, name + ".pyc")  # beside, not in __pycache__: imported without its source
            py_compile.compile(source, cfile, dfile=source, doraise=True)
    except (OSError, py_compile.PyCompileError):
        return None
    return path


def _run(source: str, check: FunctionCheck | None, limits: Limits) -> SandboxResult:
    start = time.monotonic()
    deadline = start + limits.timeout_s + GRACE_S
    workdir = tempfile.mkdtemp(prefix="sgrpo-sandbox-")
    proc, status_r = None, None
    try:
        program = os.path.join(workdir, "program.py")
        with open(program, "w", encoding="utf-8") as f:
            f.write(source)
        check_path = None
        if check is not None:
            check_path = os.path.join(workdir, "check.json")
            with open(check_path, "w", encoding="utf-8") as f:
                json.dump({"setup": check.setup, "test": check.test, "entry_point": check.entry_point}, f)
        status_r, status_w = os.pipe()
        limit_args = {k: v for k, v in vars(limits).items() if k != "output_bytes"}
        cfg = {"program": program, "check": check_path, "status_fd": status_w, "limits": limit_args}
        cfg["entry_point"] = None if check is None else check.entry_point
        cfg["hide"] = _hidden()
        compiled = _compiled()
        boot = os.path.join(compiled, "boot.pyc") if compiled else str(BOOT)
        try:
            proc = subprocess.Popen(
                [sys.executable, "-S", "-s", "-B", "-c", _LAUNCH, boot, json.dumps(cfg)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env=_ENV,
                cwd=workdir,
                start_new_session=True,
                pass_fds=(status_w,),
            )
        finally:
            os.close(status_w)
        output, truncated = host.read_output(proc, limits.output_bytes, deadline)
        in_time = host.wait_unreaped(proc.pid, deadline)
        host.kill_group(proc.pid)  # the outer is not reaped yet: its process group id cannot have been reused
        if not in_time and os.geteuid() == 0:
            for uid in (UID_BASE + proc.pid, UID_BASE + CHECKER_UID_OFFSET + proc.pid):
                host.kill_uid(uid)
        proc.wait()
        line = host.read_status(status_r) if in_time else ""
        tail = output[-4 * OUTPUT_TAIL :].decode("utf-8", errors="replace")[-OUTPUT_TAIL:]
        return _result(line, in_time, time.monotonic() - start, tail, truncated)
    finally:
        if proc is not None and proc.returncode is None:  # an exception on the way: never leave it running
            host.kill_group(proc.pid)
            proc.kill()
            proc.wait()
        if status_r is not None:
            os.close(status_r)
        host.rmtree(workdir)


def _result(line: str, in_time: bool, wall: float, output: str, truncated: bool) -> SandboxResult:
    try:
        status = json.loads(line)  # written by the supervisor, on a pipe no sandboxed process holds
        if status["status"] not in STATUSES:
            raise ValueError(status["status"])
    except (ValueError, KeyError, TypeError):
        detail = (
            "the sandbox did not finish within timeout_s + GRACE_S (killed)"
            if not in_time
            else "the sandbox's bootstrap failed (its output is in `output`)"
        )
        return SandboxResult(
            "timeout" if not in_time else "error", wall, None, output, truncated, False, False, None, detail
        )
    # a lone surrogate (say, in the text of a candidate's exception) as text (\udXXX): the detail can be printed
    detail = status["detail"].encode("utf-8", "backslashreplace").decode("utf-8")
    if status["status"] == "error":
        detail = detail or "the program could not be started (its output says why)"
    return SandboxResult(
        status=status["status"],
        wall_s=wall,
        exit_code=None if status["status"] == "error" else status["exit_code"],
        output=output,
        truncated=truncated,
        network_isolated=status["network"],
        filesystem_isolated=status["filesystem"],
        uid=status["uid"],
        detail=detail,
        ipc_isolated=status["ipc"],
        contained=status["contained"],
    )
