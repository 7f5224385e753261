"""One run at a time per output directory: `RunLock` holds OUTPUT_DIR/train.lock (pid, host, start time) for the
length of a run.

The lock is an advisory `flock` on the file: the kernel drops it when its process dies, however it dies, so a lock
file left behind by a killed run never blocks the next one. Where `flock` is unavailable, the file itself is the lock
(created exclusively) and a file whose pid is no longer alive on this host is stale and taken over.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import stat
import time
from pathlib import Path

from ..errors import Refused
from ..run.files import NOFOLLOW, output_path, read_text

try:
    import fcntl
except ImportError:  # pragma: no cover -- Windows
    fcntl = None

LOCK_FILE = "train.lock"


class RunLocked(Refused):
    pass


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


class RunLock:
    def __init__(self, directory: str | Path):
        self.path = output_path(str(directory)) / LOCK_FILE  # (a leading ~ expanded)
        self._fd: int | None = None
        self._made: list[Path] = []

    def _holder(self) -> str:
        try:
            info = json.loads(read_text(self.path))
            return f"pid {info['pid']} on {info['host']}, since {info['started']}"
        except (OSError, ValueError, KeyError, TypeError):
            return "another process"

    def _refuse(self) -> RunLocked:
        return RunLocked(
            f"{self.path.parent} is in use by another run ({self._holder()}; lock file {self.path}). Wait for it to "
            "finish, stop it, or use another --output-dir."
        )

    def _write_info(self, fd: int) -> None:
        info = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%d %H:%M:%S")}
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps(info).encode())

    def _open(self, flags: int) -> int:
        """The lock file, never through a symbolic link planted in its place (refused), only a regular file."""
        try:
            fd = os.open(self.path, flags | NOFOLLOW, 0o644)
        except OSError as exc:
            if exc.errno == errno.ELOOP or os.path.islink(self.path):
                raise Refused(f"{self.path} is a symbolic link: the trainer never writes through a link in its "
                              "output folder; remove it, or use another --output-dir") from None  # fmt: skip
            if isinstance(exc, FileExistsError):  # O_EXCL: the pid-file lock is held (the caller's to judge)
                raise
            raise Refused(f"--output-dir {self.path.parent}: cannot open the run's lock file {self.path.name} there "
                          f"({exc.strerror or exc}); use a folder this user can write") from None  # fmt: skip
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise Refused(f"{self.path} is not a regular file; remove it, or use another --output-dir")
        return fd

    def __enter__(self) -> RunLock:
        folder = self.path.parent  # the folders made here, deepest first: removed at the exit while empty
        self._made = [p for p in (folder, *folder.parents) if not p.exists() and not p.is_symlink()]
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:  # a file in its place or on its path, no permission, a read-only filesystem
            why = exc.strerror or exc
            what = "is a file, not a folder" if self.path.parent.is_file() else f"cannot be made ({why})"
            raise Refused(f"--output-dir {self.path.parent} {what}; use another --output-dir") from None
        if fcntl is not None:
            try:
                return self._acquire_flock()
            except OSError as exc:  # a filesystem without flock (ENOLCK, EOPNOTSUPP): the pid file alone
                if exc.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                    raise
        return self._acquire_pidfile()

    def _acquire_flock(self) -> RunLock:
        for _ in range(10):
            fd = self._open(os.O_RDWR | os.O_CREAT)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise self._refuse() from None
            except BaseException:
                os.close(fd)
                raise
            try:  # the holder may have released and removed the file between our open and flock: lock the new one
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                self._write_info(fd)
                self._fd = fd
                return self
            os.close(fd)
        raise self._refuse()

    def _acquire_pidfile(self) -> RunLock:
        for _ in range(10):
            try:
                fd = self._open(os.O_RDWR | os.O_CREAT | os.O_EXCL)
            except FileExistsError:
                try:
                    info = json.loads(read_text(self.path))
                    stale = info["host"] == socket.gethostname() and not _pid_alive(int(info["pid"]))
                except (OSError, ValueError, KeyError, TypeError):
                    stale = False  # being written, or unreadable: not ours to remove
                if not stale:
                    raise self._refuse() from None
                print(f"removing a stale lock {self.path} (pid {info['pid']} is not running)")
                self.path.unlink(missing_ok=True)
                continue
            self._write_info(fd)
            self._fd = fd
            return self
        raise self._refuse()

    def __exit__(self, *exc) -> None:
        if self._fd is None:
            return
        try:
            self.path.unlink(missing_ok=True)  # while still holding it: nobody can lock the old file after this
        finally:
            os.close(self._fd)  # releases the flock
            self._fd = None
        for folder in self._made:  # a run refused before it wrote anything leaves no folder behind
            try:
                folder.rmdir()  # (only an empty one)
            except OSError:
                break
