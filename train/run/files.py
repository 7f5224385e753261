"""Writing and reading files under OUTPUT_DIR without ever following a symbolic link: a link planted there (to
~/.bashrc, to /etc/passwd when the trainer runs as root) is never written through or read through.

Every file is written as `NAME.tmp`, created by us (`O_CREAT | O_EXCL | O_NOFOLLOW`: a link or leftover of that name
is removed first, never opened), written, flushed, then renamed over NAME (`os.replace` replaces a link at NAME
itself, not its target). A write that fails (disk full) removes the temporary file and leaves NAME as it was."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
from pathlib import Path

from ..errors import Refused

NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)  # (Windows has no symbolic links to plant)


class LinkRefused(OSError):
    """A file under OUTPUT_DIR that is a symbolic link (or not a regular file) where the trainer reads or writes."""


def _refuse_link(path: Path) -> LinkRefused:
    return LinkRefused(
        errno.ELOOP,
        f"{path} is a symbolic link: the trainer never reads or writes through a link in its output folder; remove "
        "it (or choose another --output-dir)",
    )


def create_new(path: Path, mode: str = "wb"):
    """`path` created by us, empty, as an open file object: an existing file or link of that name is unlinked first
    (never opened); refuses to follow a link planted in between."""
    path = Path(path)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    for _ in range(3):
        try:  # (through `open`, so that the file object's name is the path)
            return open(path, mode, opener=lambda p, _: os.open(p, flags, 0o644))  # noqa: SIM115 -- the caller's
        except FileExistsError:
            path.unlink(missing_ok=True)  # a leftover temporary file, or a link: removed itself, its target untouched
    raise FileExistsError(errno.EEXIST, f"{path}: recreated by someone else while the trainer wrote it")


@contextlib.contextmanager
def atomic_writer(path: Path, mode: str = "wb", fsync: bool = False):
    """``with atomic_writer(path) as f: f.write(...)``: written to `path`.tmp (ours, `create_new`), renamed over
    `path` when the block completes; on any failure the temporary file is removed and `path` is unchanged."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with create_new(tmp, mode) as f:
            yield f
            f.flush()
            if fsync:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text_atomic(path: Path, text: str) -> None:
    with atomic_writer(path, "w") as f:
        f.write(text)


def open_existing(path: Path, flags: int) -> int:
    """os.open of `path` refusing a symbolic link (LinkRefused) and anything but a regular file; FileNotFoundError
    when it does not exist."""
    try:
        fd = os.open(path, flags | NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno == errno.ELOOP or (exc.errno in (errno.EMLINK, errno.ENOTDIR) and os.path.islink(path)):
            raise _refuse_link(Path(path)) from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise LinkRefused(errno.EINVAL, f"{path} is not a regular file; the trainer reads and writes regular files")
    return fd


def read_text(path: Path) -> str:
    """The UTF-8 text of `path` (undecodable bytes replaced), refusing a symbolic link."""
    with os.fdopen(open_existing(path, os.O_RDONLY), "rb") as f:
        return f.read().decode("utf-8", errors="replace")


def open_append(path: Path):
    """`path` (an existing regular file, not a link) opened for appending bytes, unbuffered (each write reaches the
    file at once)."""
    return os.fdopen(open_existing(path, os.O_WRONLY | os.O_APPEND), "ab", buffering=0)


def check_not_link(path: Path) -> None:
    """LinkRefused when `path` is a symbolic link (a folder the trainer writes into, such as checkpoint/)."""
    if os.path.islink(path):
        raise _refuse_link(Path(path))


def expand_output_dir(text: str) -> str:
    """OUTPUT_DIR as given, with a leading `~` or `~user` expanded as --model's path is (train/model.py); any other
    text unchanged. A `~` that cannot be expanded (no such user, no home folder) is refused: the run would write to a
    folder named `~` under the current one."""
    path = os.path.expanduser(text)
    if path.startswith("~"):
        raise Refused(f"--output-dir {text}: {text.split('/', 1)[0]} cannot be expanded (no such user, or no home "
                      "folder); give the folder's full path")  # fmt: skip
    return path


def output_path(text: str) -> Path:
    """OUTPUT_DIR as a path (`expand_output_dir`): every place where --output-dir becomes a path uses this."""
    return Path(expand_output_dir(text))


MANIFEST = "run-manifest.json"  # what the trainer owns in OUTPUT_DIR, and the run's id (train/run/rundir.py)
OWNER = "sgrpo-kernels python -m train"


def read_manifest(out_dir: Path) -> dict | None:
    """OUTPUT_DIR's manifest ({"owner", "run_id", "files"}), or None where there is none that this trainer wrote."""
    try:
        m = json.loads(read_text(Path(out_dir) / MANIFEST))
    except (OSError, ValueError):
        return None
    ok = isinstance(m, dict) and m.get("owner") == OWNER and isinstance(m.get("run_id"), str)
    return m if ok and isinstance(m.get("files"), list) else None
