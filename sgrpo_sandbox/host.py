"""The trainer's side of the sandbox's process plumbing (train/sandbox.py): reading a bounded amount of output,
waiting for the bootstrap without reaping it, the backstop kills, deleting the working directory.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time

from .jail import poll_exit


def read_output(proc: subprocess.Popen, cap: int, deadline: float) -> tuple[bytes, bool]:
    """Read stdout + stderr until EOF (every process holding the pipe is gone), `cap` bytes, or the deadline; then
    close the pipe. -> (bytes read, whether more was written than `cap`)."""
    fd = proc.stdout.fileno()
    os.set_blocking(fd, False)
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
    chunks, total, truncated = [], 0, False
    try:
        while (left := deadline - time.monotonic()) > 0:
            if not poller.poll(min(left, 3600.0) * 1000):  # poll takes a C int of milliseconds
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


def wait_unreaped(pid: int, deadline: float) -> bool:
    """Wait (without reaping: the pid and its process group id stay reserved) until `pid` exits or the deadline."""

    def exited() -> bool | None:
        return True if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None else None

    return poll_exit(pid, deadline, exited, 0.01) is not None


def kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def kill_uid(uid: int) -> None:
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


def read_status(fd: int, limit_s: float = 1.0, cap: int = 1 << 16) -> str:
    """The supervisor's status line: read until its newline, EOF (every writer gone), `cap` bytes or `limit_s`."""
    data, deadline = b"", time.monotonic() + limit_s
    while b"\n" not in data and len(data) < cap and (left := deadline - time.monotonic()) > 0:
        if not select.select([fd], [], [], left)[0]:
            break
        chunk = os.read(fd, cap)
        if not chunk:
            break
        data += chunk
    return data.decode(errors="replace")


def rmtree(path: str) -> None:
    """Delete the working directory, whatever the program left there; never raises (what cannot be removed stays, said
    on stderr). Iterative and by directory descriptor: shutil.rmtree recursed once per level (a RecursionError into
    the trainer at ~1,000 nested folders) and a deep path outgrows PATH_MAX; a folder the program took its own
    permissions from (chmod 000) is given them back first; a link is removed, never followed."""
    try:
        _remove_tree(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        print(f"warning: the sandbox could not remove {path} ({exc})", file=sys.stderr)


_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _remove_tree(path: str) -> None:
    os.chmod(path, 0o700)
    fd = os.open(path, _DIR)
    try:
        pending, names = [_scan(fd)], []  # per level: its folders still to remove; the name of each level below
        while True:
            if pending[-1]:
                name = pending[-1].pop()
                os.chmod(name, 0o700, dir_fd=fd)  # (a folder, not a link: _scan saw it so)
                child = os.open(name, _DIR, dir_fd=fd)
                os.close(fd)
                fd = child
                names.append(name)
                pending.append(_scan(fd))
                continue
            pending.pop()
            if not names:
                break
            parent = os.open("..", _DIR, dir_fd=fd)
            os.close(fd)
            fd = parent
            os.rmdir(names.pop(), dir_fd=fd)
    finally:
        os.close(fd)
    os.rmdir(path)


def _scan(fd: int) -> list[str]:
    """Unlinks every entry of the folder `fd` but its folders (files and links alike); returns their names."""
    folders = []
    with os.scandir(fd) as entries:
        for e in entries:
            if e.is_dir(follow_symlinks=False):
                folders.append(e.name)
            else:
                os.unlink(e.name, dir_fd=fd)
    return folders
