"""The sandbox's bootstrap, run by `sgrpo_sandbox.run` (read the package docstring) as `python -S -s -B -c LAUNCH PATH
CONFIG`: loaded by its file path PATH, boot.pyc in the private directory where the host keeps this module and its two
helpers compiled once, or (where that cannot be) this file; then `main(CONFIG)`.

A fresh single-threaded interpreter, in its own session, with an almost empty environment (PYTHONHASHSEED=0, for the
same str hashes every time, and PYTHONSAFEPATH=1). Three generations of processes:

- this one, the outer: dies with the trainer (PR_SET_PDEATHSIG), takes new network, IPC, mount and PID namespaces
  (each where the OS allows: as root), bounds SysV IPC in its namespace, and forks
- the supervisor: PID 1 of the new PID namespace, dying with the outer (PR_SET_PDEATHSIG; when it dies, the kernel
  kills every process of the namespace, whatever uid they took); it builds the private file system
  (jail.py), forks the children below, enforces the deadline, kills and reaps everything, and writes the
  status line on the private status pipe (the children do not hold it);
- the children: for `run_python`, the program; for `run_check`, the candidate (the untrusted program, then
  `protocol.serve`) and the checker (the trusted test, `protocol.run_checker`), each with resource
  limits and, as root, a uid of its own: UID_BASE + the outer's pid for the program or candidate, and that +
  CHECKER_UID_OFFSET for the checker.

CONFIG: JSON {"program": path, "check": path or null (JSON {"setup", "test", "entry_point"}), "entry_point": str or
null, "status_fd": int, "limits": {timeout_s, cpu_s, memory_mb, file_mb, tmp_mb, processes, open_files}, "hide":
[paths]}. Status line: JSON {"status": passed / failed / timeout / error, "exit_code": int or null, "network",
"filesystem", "ipc", "contained": bool, "uid": int or null, "detail": str of at most DETAIL_MAX characters}.
Standard library only, and only the cheap modules: it starts once per program.

The test is never in the memory of a process the candidate is forked from (a fork copies all of it, freed memory
included, where the candidate could read it: its frames, gc, /proc/self/mem): the outer opens the check file and
deletes it without reading it, the supervisor only passes the open file on, and the checker, forked after the
candidate, is the first to read it. The candidate closes that file before its program runs (`jail.confine`).
"""

import _frozen_importlib
import _frozen_importlib_external
import os
import select
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))


def _sibling(name: str):
    """The module `name` beside this file (name.pyc in the private directory, or name.py in the package), loaded by its
    file path under a private name: nothing goes on sys.path (where a generic name could shadow the standard library)
    and the program sees no module named `jail` or `protocol`. The cheap loader: importlib.util costs ~14 ms."""
    path = os.path.join(_HERE, name + (".pyc" if __file__.endswith(".pyc") else ".py"))
    spec = _frozen_importlib_external.spec_from_file_location("_sgrpo_sandbox_" + name, path)
    module = _frozen_importlib.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


sos = _sibling("jail")
harness = _sibling("protocol")
sys.path[:] = [p for p in sys.path if p != ""]

UID_BASE = 2_000_000_000  # the program's uid/gid: UID_BASE + the outer's pid (owned by no account)
CHECKER_UID_OFFSET = 1 << 22  # the checker's: beyond any pid (PID_MAX_LIMIT), so no sandbox's uids collide
WORKDIR = "/tmp/sandbox"  # inside the private /tmp
START_MB = 1  # beyond the address space at the fork: what compiling and starting a small program takes
CANDIDATE_NAME = "candidate"  # a check's program is not __main__: its `if __name__ == "__main__"` block does not run
# characters of the status line's detail (cut beyond): at most 12 bytes each in its JSON (an astral character is two
# \uXXXX escapes), so the line stays under PIPE_BUF (4096 bytes) and its write to the status pipe never blocks
DETAIL_MAX = 300


def _execute(source: str, filename: str, namespace: dict) -> None:
    """Run `source` in `namespace`: the program (in its confined child) or the dataset's test (in the checker)."""
    exec(compile(source, filename, "exec"), namespace)


def _run_program(path: str, source: str, limits: dict, uid, workdir: str) -> None:
    """The forked program of `run_python`: confined, then run in this interpreter (a second interpreter start would
    double the cost per program) as __main__. Never returns."""
    _exit = os._exit  # bound before the program runs: it shares this interpreter's `os` and may replace os._exit
    sos.confine(limits, uid, [], workdir, path)
    code = 1
    try:  # the forked child never returns into main(): whatever happens ends in os._exit
        try:
            _execute(source, path, {"__name__": "__main__", "__file__": path, "__builtins__": __builtins__})
            code = 0
        except SystemExit as exc:
            code = _exit_status(exc.code)
        except BaseException:
            _uncaught()
        code = _finalize(code)
        harness.flush_streams()
    finally:
        _exit(code)


def _exit_status(value) -> int:
    """The exit status `python program.py` gives for `sys.exit(value)`: None 0, an int its low byte (one beyond a C
    long 255, as CPython's -1), anything else printed to stderr and 1."""
    if value is None:
        return 0
    if isinstance(value, int):
        return value & 0xFF if -(2**63) <= value < 2**63 else 255
    print(value, file=sys.stderr)
    return 1


def _finalize(code: int) -> int:
    """What the interpreter does before it exits, as `python program.py` does it: waits for the threads that are not
    daemons (one of them may still exit the process, or raise SystemExit: that is the status then), then runs the
    atexit handlers. Under the limits: a thread that never ends is a timeout, as it would be outside."""
    import atexit
    import threading

    for step in (getattr(threading, "_shutdown", None), getattr(atexit, "_run_exitfuncs", None)):
        if step is None:
            continue
        try:
            step()
        except SystemExit as exc:
            code = _exit_status(exc.code)
        except BaseException:
            _uncaught()
            code = code or 1
    return code


def _uncaught() -> None:
    """An uncaught exception, reported as the interpreter would: the program's own sys.excepthook if it set one, else
    the traceback from the program's first frame."""
    hook = sys.excepthook
    if hook is sys.__excepthook__:
        return _traceback()
    try:
        hook(*sys.exc_info())
    except BaseException:  # (CPython then prints both; the program's traceback is enough here)
        _traceback()


def _traceback() -> None:
    import traceback

    exc_type, exc, tb = sys.exc_info()
    while tb is not None and tb.tb_frame.f_code.co_filename == _traceback.__code__.co_filename:
        tb = tb.tb_next  # from the program's first frame (not the bootstrap's)
    traceback.print_exception(exc_type, exc, tb)


def _run_candidate(path: str, source: str, entry_point: str, limits: dict, uid, workdir: str, fds: list) -> None:
    """The candidate of `run_check` (untrusted): its program, then it answers the checker's calls. Never returns."""
    _exit = os._exit
    sos.confine(limits, uid, fds, workdir, path)
    try:
        channel = harness.Channel(3, 4)
        namespace = {"__name__": CANDIDATE_NAME, "__file__": path, "__builtins__": __builtins__}
        try:
            _execute(source, path, namespace)
        except BaseException as exc:  # noqa: B036 -- SystemExit included: a program that exits is not ready
            _traceback()
            channel.send({"ready": False, "error": f"the program raised {type(exc).__name__}"})
        else:
            harness.serve(namespace, entry_point, channel)
        harness.flush_streams()
    finally:
        _exit(0)  # its exit status means nothing: only the checker's verdict does


def _run_checker(limits: dict, uid, fds: list) -> None:
    """The checker of `run_check` (trusted code, untrusted data): reads the check from its fd 6 (the first process
    to read it), runs the test against the candidate; the verdict on its fd 5. Never returns."""
    _exit = os._exit
    sos.confine(limits, uid, fds, "/", None)  # no working directory: the candidate's is its own
    sos.not_dumpable()  # not ptrace-able nor readable through /proc, even by a process of its own uid
    try:
        try:
            check = harness.loads(_read_all(6).decode("utf-8"))
        except Exception as exc:  # noqa: BLE001 -- the sandbox's own file: not the candidate's fault
            verdict = {"verdict": "error", "detail": f"the check could not be read: {exc!r}"[:DETAIL_MAX], "calls": 0}
        else:
            channel = harness.Channel(3, 4)
            verdict = harness.run_checker(check["setup"], check["test"], check["entry_point"], _execute, channel)
        os.write(5, (harness.dumps(verdict) + "\n").encode())
    finally:
        _exit(0)


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 1 << 16):
        chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks)


def _read_verdict(fd: int, deadline: float) -> dict | None:
    """The checker's verdict line, or None when it ended without one or the deadline passed first."""
    data = b""
    while b"\n" not in data and (left := deadline - time.monotonic()) > 0:
        if not select.select([fd], [], [], left)[0]:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        data += chunk
    if b"\n" not in data:
        return None
    return harness.loads(data.split(b"\n", 1)[0].decode("ascii"))


def _check(program_path: str, program: str, entry: str, check_fd: int, limits: dict, uids: list, workdir: str) -> tuple:
    """Run the candidate and then the checker, which reads the check from `check_fd`; -> (status, detail) from the
    checker's verdict."""
    calls_r, calls_w = os.pipe()
    results_r, results_w = os.pipe()
    deadline = time.monotonic() + limits["timeout_s"]
    if os.fork() == 0:
        _run_candidate(program_path, program, entry, limits, uids[0], workdir, [calls_r, results_w])
    verdict_r, verdict_w = os.pipe()
    checker = os.fork()
    if checker == 0:
        _run_checker(limits, uids[1], [results_r, calls_w, verdict_w, check_fd])
    for fd in (calls_r, calls_w, results_r, results_w, verdict_w, check_fd):
        os.close(fd)
    verdict = _read_verdict(verdict_r, deadline)
    os.close(verdict_r)
    if verdict is not None:
        return verdict["verdict"], verdict["detail"]
    if time.monotonic() >= deadline:
        return "timeout", "no verdict before the deadline"
    status = sos.wait(checker, 1.0)
    code = None if status is None else os.waitstatus_to_exitcode(status)
    if code == 126:
        return "error", "the checker could not be started (the output says why)"
    return "failed", f"the checker ended without a verdict (exit status {code})"


def _run(program_path: str, program: str, limits: dict, uid, workdir: str) -> tuple:
    """Run the program of `run_python`; -> (status, exit code or None) from its exit status."""
    pid = os.fork()
    if pid == 0:
        _run_program(program_path, program, limits, uid, workdir)
    status = sos.wait(pid, limits["timeout_s"])
    if status is None:
        return "timeout", None
    code = os.waitstatus_to_exitcode(status)
    return ("passed" if code == 0 else "error" if code == 126 else "failed"), code


def _supervise(cfg: dict, program: str, check_fd, iso: dict, uids: list, alive_fd: int) -> None:
    """PID 1 of the sandbox's PID namespace (or, where there is none, a subreaper): see the module docstring."""
    sos.die_with_parent(alive_fd)
    iso["contained"] = iso["contained"] and os.getpid() == 1
    limits, path = cfg["limits"], cfg["program"]
    fs = iso.pop("mount") and sos.private_filesystem(limits["tmp_mb"], cfg["hide"])
    if fs and iso["contained"]:
        sos.fresh_proc()  # only this namespace's processes, each visible to its own uid only
    if fs:  # the host directory is hidden under the private /tmp: the program is copied into it
        os.mkdir(WORKDIR, 0o700)
        path = os.path.join(WORKDIR, os.path.basename(path))
        with open(path, "w", encoding="utf-8") as f:
            f.write(program)
    workdir = os.path.dirname(path)
    if uids[0] is not None:
        os.chown(workdir, uids[0], uids[0])
        os.chmod(workdir, 0o700)
        if not iso["contained"]:
            for uid in uids:
                sos.kill_uid(uid)  # a leftover of an earlier sandbox that had this pid (its supervisor was killed)
    code, need = None, sos.address_space_mb() + START_MB  # a child forked now has this address space
    if limits["memory_mb"] < need:  # not even the program's first line would run (nor a traceback be printed)
        verdict = "error"
        detail = f"the interpreter could not start under memory_mb={limits['memory_mb']}: it needs about {need:.0f} MiB"
    elif check_fd is None:
        verdict, code = _run(path, program, limits, uids[0], workdir)
        detail = ""
    else:
        verdict, detail = _check(path, program, cfg["entry_point"], check_fd, limits, uids, workdir)
    if not sos.kill_all([u for u in uids if u is not None], iso["contained"]):
        detail = (detail + " (descendants left)").strip()
    status = {"status": verdict, "exit_code": code, "filesystem": fs, "uid": uids[0]}
    if len(detail) > DETAIL_MAX:
        detail = detail[: DETAIL_MAX - 3] + "..."
    status.update(iso, detail=detail)
    os.write(cfg["status_fd"], (harness.dumps(status) + "\n").encode())
    os._exit(0)


def main(config: str) -> None:
    cfg = harness.loads(config)
    sos.die_with_parent(None)  # the trainer died: so does the sandbox
    sos.not_dumpable()
    with open(cfg["program"], encoding="utf-8") as f:
        program = f.read()
    check_fd = None
    if cfg["check"] is not None:  # opened, never read here: only the checker reads it (the module docstring)
        check_fd = os.open(cfg["check"], os.O_RDONLY | os.O_CLOEXEC)
        os.unlink(cfg["check"])  # no file of it for the program to read
    iso = {"network": sos.unshare(sos.CLONE_NEWNET)}
    iso["ipc"] = sos.unshare(sos.CLONE_NEWIPC) and sos.bound_ipc(cfg["limits"]["memory_mb"])
    iso["mount"] = sos.unshare(sos.CLONE_NEWNS)
    iso["contained"] = sos.unshare(sos.CLONE_NEWPID)  # the next fork is PID 1 of a namespace of its own
    base = UID_BASE + os.getpid()
    uids = [base, base + CHECKER_UID_OFFSET]
    if os.geteuid() != 0 or not all(map(sos.uid_mapped, uids)):
        uids = [None, None]
    alive_r, alive_w = os.pipe()  # the supervisor sees it close when this process is gone
    pid = os.fork()
    if pid == 0:
        os.close(alive_w)
        _supervise(cfg, program, check_fd, iso, uids, alive_r)
    os.close(alive_r)
    os.waitpid(pid, 0)
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1])
