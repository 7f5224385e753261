"""Running untrusted Python (model-written code) safely: one process per program, resource limits, a wall-clock
deadline, no network, no secrets, no writes to the host, nothing left running afterwards.

`run_python(source, limits)` -> `SandboxResult`; `run_many(sources, limits, max_workers)` runs several in a bounded
thread pool (each thread waits on its own subprocess). `isolation()` says what this machine allows.

How a program runs
------------------
The trainer writes the program into a fresh temporary directory (deleted afterwards) and starts the bootstrap
`train/_sandbox_boot.py` as `python -I -S -B` (isolated mode, no site-packages), with an empty environment, stdin
/dev/null, stdout and stderr into one pipe, in a new session (its own process group), without `preexec_fn` (unsafe in
a threaded parent). The bootstrap, a fresh single-threaded interpreter still running as the trainer's user:

1. dies with the trainer (PR_SET_PDEATHSIG) and becomes a child subreaper: every orphaned descendant of the program,
   even one that left the process group with setsid(), is re-parented to it;
2. unshares the network namespace (CLONE_NEWNET: a loopback interface that is down, no route anywhere) and the mount
   namespace (CLONE_NEWNS), in which it remounts every mount read-only and mounts a private tmpfs of `tmp_mb` MiB on
   /tmp holding the working directory (the host's /tmp, /dev/shm, /var/tmp become unreachable or read-only). Where
   the OS refuses (not root, no CAP_SYS_ADMIN) it goes on without, and the result says so;
3. forks the program: core dumps off; limits on CPU time, address space, file size, processes and open files; when
   the trainer runs as root, setgroups([]), setgid and setuid to a uid/gid of its own, UID_BASE + the bootstrap's pid
   (2,000,000,000 + pid: owned by no account, and unique among running sandboxes, so sandboxes cannot signal each
   other and RLIMIT_NPROC counts one program's processes only); cwd, HOME and TMPDIR the working directory; the
   program then runs in that (already started) interpreter as `__main__`;
4. waits until the deadline, then SIGKILLs the program and every remaining descendant (processes of the sandbox uid
   with kill(-1) from that uid, and its own children, repeatedly, until none is left and all are reaped), and writes
   the verdict to a private pipe that the program does not hold (it cannot forge it).

The trainer reads at most `output_bytes` of output (then closes the pipe: a program that writes more gets EPIPE; a
program printing gigabytes fills neither memory nor disk), waits for the bootstrap with a backstop deadline
(`timeout_s + GRACE_S`; past it, SIGKILL to the bootstrap's process group and to every process of the sandbox uid),
SIGKILLs whatever is left in the process group, and deletes the temporary directory.

What it guarantees (as root with namespaces, as on the machine this was developed on) and what it does not
---------------------------------------------------------------------------------------------------------------
- Network: none, when CLONE_NEWNET is permitted (`network_isolated`). Where it is not (an unprivileged user; some
  container runtimes), the program has the trainer's network access: the result and `isolation()` say so.
- Signals: the trainer is never in the program's session or process group, so killpg from the program does not reach
  it. A process of the same uid could still signal the trainer if it knew its pid; with the uid drop (root only) the
  program has a uid of its own and every kill() at the trainer, the bootstrap or another sandbox fails with EPERM.
  Without the uid drop, a program could kill the trainer with os.kill(trainer_pid, SIGKILL).
- RLIMIT_NPROC counts the processes (and threads) of a real uid, and is not enforced for root (CAP_SYS_ADMIN /
  CAP_SYS_RESOURCE). With the uid drop it bounds exactly one program's processes (a fork bomb stops at `processes`).
  Without it, the limit is set to the uid's current count + `processes`: shared with everything else of that user
  (the trainer's threads, other sandboxes) and ignored when that user is root -- a fork bomb is then bounded by the
  deadline and the subreaper's cleanup only.
- Files: with the mount namespace, nothing outside the private /tmp can be written (read-only mounts, whatever the
  permissions), and /tmp is at most `tmp_mb` MiB of memory, freed when the program ends. Without it, the uid drop
  leaves the program the world-writable directories (/tmp, /var/tmp, /dev/shm) besides its own; without either, it
  can write wherever the trainer can. Files readable by everyone stay readable (there is no chroot).
- Secrets: the program's environment is empty except HOME and TMPDIR; with the uid drop it cannot read
  /proc/<trainer>/environ either (without it, it can).
- Memory: RLIMIT_AS per process (`memory_mb`), so at most `processes * memory_mb` for one program; not a cgroup.
- The process tree: every descendant is killed and reaped when the program ends or at the deadline. If the trainer
  itself is SIGKILLed, the bootstrap and the program die with it (PR_SET_PDEATHSIG); their own children may then
  linger until the backstop of a later sandbox with the same uid, or forever.
- Not a security boundary against a determined attacker: one kernel, the trainer's Python and files readable; use a
  VM or gVisor for that. It is meant to keep buggy or reward-hacking model code from harming a training run.
"""

from __future__ import annotations

import functools
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

BOOT = Path(__file__).with_name("_sandbox_boot.py")
UID_BASE = 2_000_000_000  # as in _sandbox_boot.py: the program runs as UID_BASE + the bootstrap's pid
GRACE_S = 10.0  # the bootstrap's own start and cleanup, beyond the program's deadline
OUTPUT_TAIL = 2000  # characters of output kept in a result
STATUSES = ("passed", "failed", "timeout", "error")


@dataclass(frozen=True)
class Limits:
    """Per-program limits. Every field is a positive number; ValueError names a field that is not."""

    timeout_s: float = 5.0  # wall clock from the program's start; then it and its descendants are killed
    cpu_s: int = 5  # RLIMIT_CPU per process (SIGXCPU, SIGKILL a second later)
    memory_mb: int = 1024  # RLIMIT_AS per process (address space: a MemoryError beyond)
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


@dataclass(frozen=True)
class SandboxResult:
    status: str  # passed (exit 0) / failed (other exit or killed by a limit) / timeout / error (did not run)
    wall_s: float  # the whole run, bootstrap included
    exit_code: int | None  # the program's exit status, -N when killed by signal N; None: timeout or error
    output: str  # the last OUTPUT_TAIL characters of what was read of stdout + stderr
    truncated: bool  # the program wrote more than Limits.output_bytes (the rest was refused)
    network_isolated: bool  # in a network namespace of its own (no interfaces up)
    filesystem_isolated: bool  # every mount read-only, a private tmpfs on /tmp
    uid: int | None  # the uid it ran as when dropped from root; None: the trainer's own uid
    detail: str = ""  # what went wrong, for status error (and descendants that could not be killed)

    @property
    def passed(self) -> bool:
        return self.status == "passed"


def run_python(source: str, limits: Limits | None = None) -> SandboxResult:
    """Run the Python program `source` in the sandbox (module docstring) and wait for it: at most
    `limits.timeout_s + GRACE_S` seconds."""
    limits = limits or Limits()
    if not isinstance(source, str):
        raise TypeError(f"source: expected the program as str, got {type(source).__name__}")
    start = time.monotonic()
    deadline = start + limits.timeout_s + GRACE_S
    workdir = tempfile.mkdtemp(prefix="sgrpo-sandbox-")
    proc, status_r = None, None
    try:
        program = os.path.join(workdir, "program.py")
        with open(program, "w", encoding="utf-8") as f:
            f.write(source)
        status_r, status_w = os.pipe()
        args = [program, status_w, limits.timeout_s, limits.cpu_s, limits.memory_mb, limits.file_mb, limits.tmp_mb]
        args += [limits.processes, limits.open_files]
        try:
            proc = subprocess.Popen(
                [sys.executable, "-I", "-S", "-B", str(BOOT), *map(str, args)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env={},
                cwd=workdir,
                start_new_session=True,
                pass_fds=(status_w,),
            )
        finally:
            os.close(status_w)
        output, truncated = _read_output(proc, limits.output_bytes, deadline)
        in_time = _wait_unreaped(proc.pid, deadline)
        _kill_group(proc.pid)  # the bootstrap is not reaped yet: its process group id cannot have been reused
        if not in_time and os.geteuid() == 0:
            _kill_uid(UID_BASE + proc.pid)
        proc.wait()
        line = _read_status(status_r) if in_time else ""
        tail = output[-4 * OUTPUT_TAIL :].decode("utf-8", errors="replace")[-OUTPUT_TAIL:]
        return _result(line, in_time, time.monotonic() - start, tail, truncated)
    finally:
        if proc is not None and proc.returncode is None:  # an exception on the way: never leave it running
            _kill_group(proc.pid)
            proc.kill()
            proc.wait()
        if status_r is not None:
            os.close(status_r)
        _rmtree(workdir)


def run_many(sources: list[str], limits: Limits | None = None, max_workers: int | None = None) -> list[SandboxResult]:
    """`run_python` of each source, at most `max_workers` at a time (default: min(8, CPU count)); results in order."""
    if max_workers is None:
        max_workers = min(8, os.cpu_count() or 1)
    if isinstance(max_workers, bool) or not isinstance(max_workers, int) or max_workers < 1:
        raise ValueError(f"max_workers={max_workers!r}: expected an integer >= 1")
    if not sources:
        return []
    with ThreadPoolExecutor(max_workers=min(max_workers, len(sources)), thread_name_prefix="sandbox") as pool:
        return list(pool.map(lambda s: run_python(s, limits), sources))


@functools.cache
def isolation() -> dict:
    """What the sandbox gets on this machine: {"network": bool, "filesystem": bool, "uid_drop": bool} (runs one
    trivial program; cached)."""
    r = run_python("pass")
    if r.status != "passed":
        raise RuntimeError(f"the sandbox cannot run a trivial program here: {r.status}: {r.detail or r.output}")
    return {"network": r.network_isolated, "filesystem": r.filesystem_isolated, "uid_drop": r.uid is not None}


def describe_isolation() -> str:
    """One line for logs: what is isolated here and what is not."""
    iso = isolation()
    yes = lambda flag: "yes" if flag else "NO"  # noqa: E731
    return (
        f"sandbox: network isolated {yes(iso['network'])}, host filesystem read-only {yes(iso['filesystem'])}, "
        f"own uid {yes(iso['uid_drop'])} (train/sandbox.py says what each means)"
    )


# ----------------------------------------------------------------------------------------------------- helpers


def _read_output(proc: subprocess.Popen, cap: int, deadline: float) -> tuple[bytes, bool]:
    """Read stdout + stderr until EOF (every process holding the pipe is gone), `cap` bytes, or the deadline; then
    close the pipe. -> (bytes read, whether more was written than `cap`)."""
    fd = proc.stdout.fileno()
    os.set_blocking(fd, False)
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
    chunks, total, truncated = [], 0, False
    try:
        while (left := deadline - time.monotonic()) > 0:
            if not poller.poll(left * 1000):
                continue
            try:
                data = os.read(fd, 65536)
            except BlockingIOError:
                continue
            if not data:
                break
            keep = data[: cap - total]
            chunks.append(keep)
            total += len(keep)
            if len(keep) < len(data):
                truncated = True
                break
    finally:
        proc.stdout.close()
    return b"".join(chunks), truncated


def _wait_unreaped(pid: int, deadline: float) -> bool:
    """Wait (without reaping: the pid and its process group id stay reserved) until `pid` exits or the deadline."""
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        fd = None
    try:
        while True:
            info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            if info is not None:
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            if fd is not None:
                select.select([fd], [], [], left)
            else:
                time.sleep(min(left, 0.01))
    finally:
        if fd is not None:
            os.close(fd)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _kill_uid(uid: int) -> None:
    """SIGKILL every process of `uid` (the backstop, when the bootstrap could not clean up): a helper process that
    runs as `uid` and calls kill(-1)."""
    code = "import os\ntry:\n    [os.kill(-1, 9) for _ in range(20)]\nexcept ProcessLookupError:\n    pass\n"
    try:
        subprocess.run(
            [sys.executable, "-I", "-S", "-c", code],
            user=uid,
            group=uid,
            extra_groups=[],
            env={},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError):
        pass


def _read_status(fd: int) -> str:
    ready, _, _ = select.select([fd], [], [], 1.0)
    return os.read(fd, 4096).decode(errors="replace") if ready else ""


def _result(line: str, in_time: bool, wall: float, output: str, truncated: bool) -> SandboxResult:
    parts = line.split()
    if len(parts) < 6 or parts[0] not in STATUSES:
        detail = (
            "the sandbox did not finish within timeout_s + GRACE_S (killed)"
            if not in_time
            else "the sandbox's bootstrap failed (its output is in `output`)"
        )
        status = "timeout" if not in_time else "error"
        return SandboxResult(status, wall, None, output, truncated, False, False, None, detail)
    verdict, code, net, fs, uid = parts[:5]
    detail = " ".join(parts[6:])
    if verdict == "error":
        detail = detail or "the program could not be started (its output says why)"
    return SandboxResult(
        status=verdict,
        wall_s=wall,
        exit_code=None if code == "-" or verdict == "error" else int(code),
        output=output,
        truncated=truncated,
        network_isolated=net == "1",
        filesystem_isolated=fs == "1",
        uid=None if uid == "-" else int(uid),
        detail=detail,
    )


def _rmtree(path: str) -> None:
    """Delete the working directory, even where the program took its own permissions away (chmod 000)."""
    shutil.rmtree(path, ignore_errors=True)
    if os.path.exists(path):
        for root, dirs, _ in os.walk(path):
            for d in dirs:
                try:
                    os.chmod(os.path.join(root, d), 0o700)
                except OSError:
                    pass
        shutil.rmtree(path, ignore_errors=True)
