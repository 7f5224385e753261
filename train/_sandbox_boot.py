"""The sandbox's bootstrap, run as `python -I -S -B _sandbox_boot.py ARGS` by `train.sandbox` (read its docstring).

A fresh single-threaded interpreter, in its own session, with an empty environment: it isolates what the OS lets it
(network and mount namespaces, read-only mounts, a private /tmp), forks the program with resource limits and (as
root) an unprivileged uid of its own, enforces the wall-clock deadline, kills and reaps every descendant, and reports
one line on the private status pipe. Standard library only, and only the cheap modules: it starts once per program.

ARGS: program_path status_fd timeout_s cpu_s memory_mb file_mb tmp_mb processes open_files
Status line: "<status> <exit_code or -> <net 0/1> <fs 0/1> <uid or -> <detail>", status one of passed / failed /
timeout / error (the program could not be started: its exit status 126); exit_code -N means killed by signal N.
"""

import ctypes
import os
import resource
import select
import signal
import sys
import time

CLONE_NEWNS, CLONE_NEWNET = 0x00020000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MS_NOATIME, MS_NODIRATIME, MS_RELATIME = 1024, 2048, 1 << 21
MNT_DETACH = 2
# statvfs f_flag bit -> mount flag: a bind remount must keep the flags a mount is locked with (else EPERM)
KEEP_FLAGS = {2: MS_NOSUID, 4: MS_NODEV, 8: MS_NOEXEC, 1024: MS_NOATIME, 2048: MS_NODIRATIME, 4096: MS_RELATIME}
PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER = 1, 36
UID_BASE = 2_000_000_000  # the program's uid/gid: UID_BASE + this bootstrap's pid (owned by no account)
WORKDIR = "/tmp/sandbox"  # inside the private /tmp

libc = ctypes.CDLL(None, use_errno=True)


def _unshare(flag: int) -> bool:
    return libc.unshare(flag) == 0


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


def _private_filesystem(tmp_mb: int) -> bool:
    """In a new mount namespace: a fresh tmpfs of `tmp_mb` MiB on /tmp, the standard library reachable by any uid
    (`_expose`), every other mount read-only (only in this namespace). True when all of it worked; False when the OS
    refuses (then nothing that matters changed: a failed namespace is as if none was asked for)."""
    if not _unshare(CLONE_NEWNS):
        return False
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
    return root_ro


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


def _uid_mapped(uid: int) -> bool:
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


def _kill_uid(uid: int) -> None:
    """SIGKILL every process of `uid` at once: a helper that becomes `uid` and calls kill(-1) until none is left."""
    pid = os.fork()
    if pid == 0:
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            # a few rounds, not "until none": killed processes stay signalable zombies until they are reaped
            for _ in range(20):
                os.kill(-1, signal.SIGKILL)  # every process this uid may signal: its own (never itself)
        except ProcessLookupError:
            os._exit(0)
        except BaseException:
            os._exit(1)
        os._exit(1)
    os.waitpid(pid, 0)


def _kill_descendants(uid: int | None, limit_s: float = 10.0) -> bool:
    """Kill and reap the program and everything it started. As a child subreaper this process inherits every orphaned
    descendant (setsid() does not escape that), so 'kill my children, reap, repeat' ends with none left. True when
    none is left."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if uid is not None:
            _kill_uid(uid)
        for pid in _children():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            while os.waitpid(-1, os.WNOHANG)[0] != 0:
                pass
        except ChildProcessError:
            return True
        time.sleep(0.002)
    return False


def _wait(pid: int, timeout_s: float) -> int | None:
    """The program's wait status, or None when it is still running after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        fd = None
    try:
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return status
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            if fd is not None:
                select.select([fd], [], [], left)
            else:
                time.sleep(min(left, 0.005))
    finally:
        if fd is not None:
            os.close(fd)


def _run_program(path: str, status_fd: int, limits: dict, uid) -> None:
    """The forked program: limits, the uid drop, then the program itself in this interpreter (a second interpreter
    start would double the cost per program). Never returns."""
    _exit = os._exit  # bound before the program runs: it shares this interpreter's `os` and may replace os._exit
    try:
        os.close(status_fd)  # the program cannot forge the verdict
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # dies with the bootstrap
        mb = 1024 * 1024
        nproc = limits["processes"] + (0 if uid is not None else _tasks_of_uid(os.getuid()))
        for res, value, hard in (
            (resource.RLIMIT_CORE, 0, 0),
            (resource.RLIMIT_CPU, limits["cpu_s"], limits["cpu_s"] + 1),  # SIGXCPU, then SIGKILL a second later
            (resource.RLIMIT_AS, limits["memory_mb"] * mb, None),
            (resource.RLIMIT_FSIZE, limits["file_mb"] * mb, None),
            (resource.RLIMIT_NOFILE, limits["open_files"], None),
            (resource.RLIMIT_NPROC, nproc, None),
        ):
            cur_hard = resource.getrlimit(res)[1]
            hard = value if hard is None else hard
            if cur_hard != resource.RLIM_INFINITY:
                value, hard = min(value, cur_hard), min(hard, cur_hard)
            resource.setrlimit(res, (value, hard))
        with open(path) as f:
            source = f.read()
        workdir = os.path.dirname(path)
        if uid is not None:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
        os.chdir(workdir)
        os.environ.clear()
        os.environ.update(HOME=workdir, TMPDIR=workdir)
        sys.argv = [path]
    except BaseException as exc:
        os.write(2, f"sandbox: could not start the program: {exc!r}\n".encode())
        _exit(126)
    code = 1
    try:  # the forked child never returns into main(): whatever happens ends in os._exit
        try:
            namespace = {"__name__": "__main__", "__file__": path, "__builtins__": __builtins__}
            exec(compile(source, path, "exec"), namespace)
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            if not isinstance(exc.code, int | None):
                print(exc.code, file=sys.stderr)
        except BaseException:
            import traceback

            exc_type, exc, tb = sys.exc_info()
            traceback.print_exception(exc_type, exc, tb.tb_next)  # from the program's first frame (not this exec)
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
    finally:
        _exit(code & 0xFF)


def main(argv: list[str]) -> None:
    path, status_fd = argv[0], int(argv[1])
    timeout_s = float(argv[2])
    names = ("cpu_s", "memory_mb", "file_mb", "tmp_mb", "processes", "open_files")
    limits = dict(zip(names, (int(x) for x in argv[3:])))
    parent = os.getppid()
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # the trainer died: so does the sandbox
    if os.getppid() != parent:
        os._exit(1)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    with open(path) as f:
        source = f.read()
    net = _unshare(CLONE_NEWNET)
    fs = _private_filesystem(limits["tmp_mb"])
    uid = UID_BASE + os.getpid() if os.geteuid() == 0 and _uid_mapped(UID_BASE + os.getpid()) else None
    if fs:  # the host directory is hidden under the private /tmp: the program is copied into it
        os.mkdir(WORKDIR, 0o700)
        path = os.path.join(WORKDIR, os.path.basename(path))
        with open(path, "w") as f:
            f.write(source)
    if uid is not None:
        os.chown(os.path.dirname(path), uid, uid)
        os.chmod(os.path.dirname(path), 0o700)
        _kill_uid(uid)  # a leftover of an earlier sandbox that had this pid (its bootstrap was killed)
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:
        _run_program(path, status_fd, limits, uid)
    status = _wait(pid, timeout_s)
    wall = time.monotonic() - start
    clean = _kill_descendants(uid)
    if status is None:
        verdict, code = "timeout", "-"
    else:
        code = os.waitstatus_to_exitcode(status)
        verdict = "passed" if code == 0 else "error" if code == 126 else "failed"
    detail = f"{wall:.3f}" + ("" if clean else " descendants-left")
    line = f"{verdict} {code} {int(net)} {int(fs)} {uid if uid is not None else '-'} {detail}\n"
    os.write(status_fd, line.encode())
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])
