"""The operating-system side of the sandbox's bootstrap (boot.py): namespaces, the private file system,
the IPC bounds, confining a child, and killing what is left. Standard library only, cheap to import; loaded by the
bootstrap by its file path under a private name (boot.py `_sibling`), and by host.py as part of the package.
"""

import ctypes
import fcntl
import os
import resource
import select
import sys
import time

CLONE_NEWNS, CLONE_NEWIPC, CLONE_NEWPID, CLONE_NEWNET = 0x00020000, 0x08000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MS_NOATIME, MS_NODIRATIME, MS_RELATIME = 1024, 2048, 1 << 21
MNT_DETACH = 2
# statvfs f_flag bit -> mount flag: a bind remount must keep the flags a mount is locked with (else EPERM)
KEEP_FLAGS = {2: MS_NOSUID, 4: MS_NODEV, 8: MS_NOEXEC, 1024: MS_NOATIME, 2048: MS_NODIRATIME, 4096: MS_RELATIME}
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 1, 4, 36, 38
MB = 1024 * 1024
SIGKILL = 9  # not signal.SIGKILL: that module imports enum, a few ms more at every program start

libc = ctypes.CDLL(None, use_errno=True)


def unshare(flag: int) -> bool:
    return libc.unshare(flag) == 0


def die_with_parent(alive_fd: int | None) -> None:
    """SIGKILL when the parent dies; exit now if it already has (for a PID namespace's init, whose getppid() is 0:
    `alive_fd` reads EOF once the parent is gone)."""
    parent = os.getppid()
    libc.prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0)
    if alive_fd is None:
        if os.getppid() != parent:
            os._exit(1)
        return
    if select.select([alive_fd], [], [], 0)[0]:
        os._exit(1)
    os.close(alive_fd)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)  # without a PID namespace: orphans come back here, not to init


def not_dumpable() -> None:
    libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)


def bound_ipc(memory_mb: int) -> bool:
    """In a new IPC namespace (whose limits these files are): SysV shared memory at most `memory_mb` MiB in all, at
    most 16 message queues of 64 KiB, and few semaphores. True when every limit was set."""
    page = os.sysconf("SC_PAGE_SIZE")
    limits = {
        "shmmax": memory_mb * MB,
        "shmall": memory_mb * MB // page,
        "shmmni": 16,
        "msgmni": 16,
        "msgmnb": 65536,
        "msgmax": 8192,
        "sem": "32 512 32 16",
    }
    try:
        for name, value in limits.items():
            with open(f"/proc/sys/kernel/{name}", "w") as f:
                f.write(str(value))
    except OSError:
        return False
    return True


# ----------------------------------------------------------------------------------------------------- file system


def _mount(source, target: str, fstype, flags: int, data) -> bool:
    enc = lambda s: None if s is None else s.encode()  # noqa: E731
    return libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)) == 0


def _mount_points() -> list[str]:
    points = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            point = line.split()[4]
            for esc, ch in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
                point = point.replace(esc, ch)
            points.append(point)
    return points


def private_filesystem(tmp_mb: int, hide: list[str]) -> bool:
    """In the new mount namespace: a fresh tmpfs of `tmp_mb` MiB on /tmp, the standard library reachable by any uid
    (`_expose`), every other mount read-only (only in this namespace), and the directories `hide` (site-packages:
    installed data sets, HumanEval's among them) replaced by empty read-only ones. True when all of it worked; False
    when the OS refuses (then nothing that matters changed: a failed namespace is as if none was asked for)."""
    if not _mount(None, "/", None, MS_REC | MS_PRIVATE, None):  # nothing done here propagates to the host
        return False
    if not _mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, f"size={tmp_mb}m,nr_inodes=4096,mode=1777"):
        return False
    if not _expose(os.path.dirname(os.__file__)):
        return False
    root_ro = False
    for point in _mount_points():
        if point == "/tmp":
            continue
        try:
            vfs = os.statvfs(point)
        except OSError:  # over-mounted or gone
            continue
        flags = MS_BIND | MS_REMOUNT | MS_RDONLY
        flags |= sum(ms for st, ms in KEEP_FLAGS.items() if vfs.f_flag & st)
        ok = _mount(None, point, None, flags, None)
        root_ro = root_ro or (point == "/" and ok)
    flags = MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC
    hidden = all(_mount("tmpfs", d, "tmpfs", flags, "size=4k,nr_inodes=4,mode=755") for d in hide if os.path.isdir(d))
    return root_ro and hidden


def _expose(stdlib: str) -> bool:
    """Make `stdlib` readable by an unprivileged uid when an ancestor is not (a pyenv Python under /root, mode 0700):
    a tmpfs over that ancestor (which also hides the rest of it, e.g. root's home) with `stdlib` bind-mounted back at
    its own path. True when `stdlib` is reachable (or already was)."""
    parts = stdlib.strip("/").split("/")
    ancestors = ["/" + "/".join(parts[:i]) for i in range(1, len(parts))]
    blocked = next((a for a in ancestors if not os.stat(a).st_mode & 0o001), None)  # no search permission for others
    if blocked is None:
        return True
    stage = "/tmp/.stdlib"
    os.mkdir(stage)
    if not _mount(stdlib, stage, None, MS_BIND | MS_REC, None):
        return False
    if not _mount("tmpfs", blocked, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,nr_inodes=1024,mode=755"):
        return False
    os.makedirs(stdlib, mode=0o755)
    ok = _mount(stage, stdlib, None, MS_BIND | MS_REC, None)
    libc.umount2(stage.encode(), MNT_DETACH)
    os.rmdir(stage)
    return ok


def fresh_proc() -> bool:
    """A /proc of this PID namespace (by PID 1 of it), read-only, each process seeing only those of its own uid."""
    return _mount("proc", "/proc", "proc", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "hidepid=2")


# ----------------------------------------------------------------------------------------------------- processes


def uid_mapped(uid: int) -> bool:
    """Whether `uid` exists in this user namespace (a container may map only a few uids)."""
    try:
        with open("/proc/self/uid_map") as f:
            rows = [[int(x) for x in line.split()] for line in f if line.strip()]
    except OSError:
        return False
    return any(inside <= uid < inside + count for inside, _, count in rows)


def _tasks_of_uid(uid: int) -> int:
    """Processes + threads of the real uid `uid` (what RLIMIT_NPROC counts)."""
    n = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
            if int(fields["Uid"].split()[0]) == uid:
                n += int(fields["Threads"])
        except (OSError, KeyError, ValueError):
            continue
    return n


def address_space_mb() -> float:
    """This process's address space in MiB (what RLIMIT_AS bounds; a child forked now starts with as much); 0 when
    /proc cannot say."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE") / MB
    except (OSError, ValueError, IndexError):
        return 0.0


def confine(limits: dict, uid: int | None, fds: list[int], workdir: str, path: str | None) -> None:
    """In a freshly forked child: stdin, stdout, stderr and `fds` (renumbered 3, 4, ...) the only open files; core
    dumps off and the resource limits; as root, setgroups([]), setgid and setuid to `uid`; SIGKILL when the
    supervisor dies (set after the uid change, which clears it); no new privileges (a setuid program runs without
    them); cwd, HOME and TMPDIR `workdir`. On failure: a message on stderr and exit status 126."""
    _exit = os._exit
    try:
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 3 + len(fds)) for fd in fds]
        for i, fd in enumerate(high):
            os.dup2(fd, 3 + i)
        top = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        os.closerange(3 + len(fds), top if 0 < top < 1 << 20 else 1 << 20)
        nproc = limits["processes"] + (0 if uid is not None else _tasks_of_uid(os.getuid()))
        for res, value, hard in (
            (resource.RLIMIT_CORE, 0, 0),
            (resource.RLIMIT_CPU, limits["cpu_s"], limits["cpu_s"] + 1),  # SIGXCPU, then SIGKILL a second later
            (resource.RLIMIT_AS, limits["memory_mb"] * MB, None),
            (resource.RLIMIT_FSIZE, limits["file_mb"] * MB, None),
            (resource.RLIMIT_NOFILE, limits["open_files"], None),
            (resource.RLIMIT_NPROC, nproc, None),
        ):
            cur_hard = resource.getrlimit(res)[1]
            hard = value if hard is None else hard
            if cur_hard != resource.RLIM_INFINITY:
                value, hard = min(value, cur_hard), min(hard, cur_hard)
            resource.setrlimit(res, (value, hard))
        if uid is not None:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
        libc.prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0)
        if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:  # exec of a setuid program gains nothing
            raise OSError(ctypes.get_errno(), "PR_SET_NO_NEW_PRIVS")
        os.chdir(workdir)
        os.environ.clear()
        os.environ.update(HOME=workdir, TMPDIR=workdir)
        sys.argv = [path or "check"]
    except BaseException as exc:
        os.write(2, f"sandbox: could not start the program: {exc!r}\n".encode())
        _exit(126)


def poll_exit(pid: int, deadline: float, exited, tick: float):
    """`exited()` (a result, or None while `pid` runs) once `pid` exits, or None at the deadline (monotonic clock).
    Sleeps on the process's pidfd where there is one, else polls every `tick` seconds. Shared with the trainer's
    side (host.py)."""
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        fd = None
    try:
        while True:
            result = exited()
            if result is not None:
                return result
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            if fd is not None:
                select.select([fd], [], [], left)
            else:
                time.sleep(min(left, tick))
    finally:
        if fd is not None:
            os.close(fd)


def wait(pid: int, timeout_s: float) -> int | None:
    """The child's wait status, or None when it is still running after `timeout_s`."""

    def reaped() -> int | None:
        done, status = os.waitpid(pid, os.WNOHANG)
        return status if done else None

    return poll_exit(pid, time.monotonic() + timeout_s, reaped, 0.005)


def _children() -> list[int]:
    me, out = os.getpid(), []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        if int(stat[stat.rindex(")") + 2 :].split()[1]) == me:  # ppid: the 2nd field after "(comm)"
            out.append(int(pid))
    return out


def kill_uid(uid: int) -> None:
    """SIGKILL every process of `uid` at once: a helper that becomes `uid` and calls kill(-1) until none is left."""
    pid = os.fork()
    if pid == 0:
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            # a few rounds, not "until none": killed processes stay signalable zombies until they are reaped
            for _ in range(20):
                os.kill(-1, SIGKILL)  # every process this uid may signal: its own (never itself)
        except ProcessLookupError:
            os._exit(0)
        except BaseException:
            os._exit(1)
        os._exit(1)
    os.waitpid(pid, 0)


def kill_all(uids: list[int], contained: bool, limit_s: float = 10.0) -> bool:
    """Kill and reap everything the children started. As PID 1 of the namespace (`contained`), kill(-1) reaches
    every process in it and every orphan comes back here; without one, a child subreaper kills the sandbox uids'
    processes and its own children, reaps, and repeats (setsid() does not escape a subreaper). True when none is
    left."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if contained:
            try:
                os.kill(-1, SIGKILL)  # from PID 1 of a namespace: every other process of it
            except ProcessLookupError:
                pass
        else:
            for uid in uids:
                kill_uid(uid)
            for pid in _children():
                try:
                    os.kill(pid, SIGKILL)
                except ProcessLookupError:
                    pass
        try:
            while os.waitpid(-1, os.WNOHANG)[0] != 0:
                pass
        except ChildProcessError:
            return True
        time.sleep(0.002)
    return False
