"""sgrpo_sandbox: run untrusted Python (model-written code) safely, and check a model-written function against
trusted tests with a verdict it cannot forge: one sandbox per program, resource limits, a wall-clock deadline, no
network, no secrets, no writes to the host, nothing left running afterwards -- not even when the trainer is SIGKILLed.

`run_check(FunctionCheck(program, test, entry_point, setup), limits)` -> `SandboxResult`: what a reward uses.
`run_python(source, limits)` -> `SandboxResult`: runs a program; its status is the program's exit status, which the
program controls (sys.exit(0), os._exit(0), ...): fine for running code, never a verdict on it. `run_many(jobs,
limits, max_workers)` runs several of either in a bounded thread pool; `isolation()` says what this machine allows.
Arguments are checked before anything runs, and refused by name: a `limits` that is not a `Limits`, a `sources` that
is not a list, an item of it by index, a program with a lone surrogate (the program file is UTF-8), a limit beyond
`LIMITS_MAX` or a `memory_mb` below `MIN_MEMORY_MB` (the interpreter alone takes about 13 MiB of address space).

What is trusted
---------------
Trusted: the trainer, the sandbox's own code, and the data set: a check's `test` (HumanEval's `check(candidate)`)
and `setup` (HumanEval's prompt, whose helper functions some tests call: the data set's, whatever the completion
redefines). Untrusted: the `program` (the prompt plus the model's completion) and everything it does. The two never
share a process: the test runs in a checker process of its own and calls a stand-in for the function; each call
goes to the candidate's process as data (JSON), the candidate calls its function on fresh copies of the arguments,
and only data comes back -- the value, and the new contents of arguments the call changed in place, which the
checker puts into the test's own objects (as in-process; no HumanEval test relies on it) -- decoded into plain
Python objects (protocol.py; nothing from the sandbox is ever unmarshalled into code or objects of
its classes). The verdict is the checker's: passed only when `check` returned and every call got a well-formed
value. Exit statuses, printed text, patched builtins, edited frames or code objects, objects with a forged __eq__,
exec of another program, a fork whose parent exits 0: none of them reaches the checker. A call that raises, a value
that cannot be encoded, garbage on the channel, a crash or the deadline fail the check. The checker gets
`random.seed(0)` and every interpreter PYTHONHASHSEED=0: the same completion, the same reward.

How a program runs
------------------
The trainer writes the program (and a check's test, whose file the bootstrap opens and deletes unread) into a fresh
temporary directory (deleted afterwards) and starts the bootstrap `boot.py` (loaded by file path from a private
directory where the host compiled it and its helpers once) in `python -S -s -B` (no site-packages) with only
PYTHONHASHSEED and PYTHONSAFEPATH in its environment, stdin /dev/null, stdout and stderr into one pipe, in a new
session, without `preexec_fn` (unsafe in a threaded parent). That process (the outer):

1. dies with the trainer (PR_SET_PDEATHSIG) and unshares the network namespace (a loopback interface that is down,
   no route anywhere), the IPC namespace (SysV shared memory at most `memory_mb` MiB in all, few message queues and
   semaphores, all gone with the sandbox), the mount namespace and the PID namespace; where the OS refuses (not
   root, no CAP_SYS_ADMIN) it goes on without, and the result says so;
2. forks the supervisor, PID 1 of the new PID namespace, which dies with the outer (PR_SET_PDEATHSIG): when it dies,
   the kernel SIGKILLs every process of the namespace, whatever uid it took, setsid() or not. SIGKILL of the trainer
   therefore ends the whole sandbox. The supervisor remounts every mount read-only, mounts a private tmpfs of
   `tmp_mb` MiB on /tmp holding the working directory, empty read-only directories over site-packages (installed
   data sets, HumanEval's among them, cannot be read for answers) and a /proc of the namespace that shows each
   process only those of its own uid;
3. forks the children, with core dumps off; limits on CPU time, address space, file size, processes and open files;
   only their own pipes open; no new privileges (PR_SET_NO_NEW_PRIVS: a setuid program gains nothing); when the
   trainer runs as root, setgroups([]), setgid and setuid to a uid/gid of its own (owned by no account, unique among
   running sandboxes): UID_BASE + the outer's pid for the program or candidate, that + CHECKER_UID_OFFSET for the
   checker (which is also non-dumpable), so the candidate can neither signal, trace nor read the checker; cwd, HOME
   and TMPDIR the working directory. For `run_python` the program runs as
   `__main__`; for `run_check` the candidate's program runs as a module named "candidate" (its `if __name__ ==
   "__main__"` block does not run, as in HumanEval's harness) and then answers calls;
4. waits for the exit status (`run_python`) or the checker's verdict (`run_check`) until the deadline, SIGKILLs
   every other process of the namespace, reaps them, and writes the status to a private pipe that no child holds
   (its `detail` cut to 300 characters, boot.DETAIL_MAX: the line fits in any pipe, whatever the candidate sent).

The trainer reads at most `output_bytes` of output (then closes the pipe: a program that writes more gets EPIPE),
waits for the outer with a backstop deadline (`timeout_s + GRACE_S`; past it, SIGKILL to the outer's process group
and to every process of the sandbox uids), and deletes the temporary directory.

What it guarantees (as root with namespaces, as on the machine this was developed on) and what it does not
---------------------------------------------------------------------------------------------------------------
- The verdict of `run_check`: only values the function returns can change it (above). Where the uid drop is not
  possible (not root), the candidate runs as the trainer's uid: the checker is still non-dumpable (not ptrace-able,
  its /proc files not readable) and killing it fails the check, but without the mount namespace either the program
  can write whatever the trainer can -- the sandbox's own code and its compiled copy included -- and so forge the
  verdicts of later runs: score untrusted code as root (or in a VM) where it matters.
- The test: no process the candidate is forked from ever reads it (a fork copies the parent's memory, freed memory
  included, where the candidate could find it: its frames, gc, /proc/self/mem). The outer opens its file and deletes
  it unread, the supervisor only passes the open file on, and the checker, forked after the candidate, reads it; the
  candidate closes that file before its program runs. The outer, the supervisor and the checker are non-dumpable
  (their memory and open files cannot be read through /proc by an unprivileged uid).
- Network: none, when CLONE_NEWNET is permitted (`network_isolated`). Where it is not (an unprivileged user; some
  container runtimes), the program has the trainer's network access: the result and `isolation()` say so.
- Signals: the trainer is outside the sandbox's PID namespace (no pid of it is visible) and never in its session;
  with the uid drop every kill() at the trainer, the supervisor, the checker or another sandbox fails as well.
  Without either, a program could kill the trainer with os.kill(trainer_pid, SIGKILL).
- RLIMIT_NPROC counts the processes (and threads) of a real uid, and is not enforced for root. With the uid drop it
  bounds exactly one program's processes (a fork bomb stops at `processes`). Without it, the limit is the uid's
  current count + `processes`: shared with everything else of that user and ignored for root -- a fork bomb is then
  bounded by the deadline and the cleanup only.
- Files: with the mount namespace, nothing outside the private /tmp can be written, and /tmp is at most `tmp_mb` MiB
  of memory, freed when the sandbox ends. Without it, the uid drop leaves the program the world-writable directories
  (/tmp, /var/tmp, /dev/shm) besides its own; without either, it can write wherever the trainer can. Files readable
  by everyone stay readable apart from site-packages (there is no chroot): keep other copies of a data set's tests
  out of world-readable places.
- Secrets: the program's environment is empty except HOME and TMPDIR; it cannot read the trainer's /proc entries.
- Memory: RLIMIT_AS per process (`memory_mb`), so at most `processes * memory_mb` for one program, plus SysV shared
  memory bounded by `memory_mb` (with the IPC namespace; without it, shared memory escapes the limit and outlives
  the program). Not a cgroup: a user namespace of the program's own (where the kernel lets unprivileged users create
  them) can mount a tmpfs that the limits do not count, until the sandbox ends.
- The process tree: with the PID namespace (`contained`), nothing of the sandbox outlives it or the trainer. Without
  it, the supervisor is a child subreaper that kills and reaps every descendant at the end; if the trainer is
  SIGKILLed, the outer, the supervisor and its direct children die with it (PR_SET_PDEATHSIG, set after the uid
  change) but the program's own children may linger until the cleanup of a later sandbox with the same uid.
- Why not bubblewrap (`bwrap --unshare-all --die-with-parent`): it would do steps 1-2 as well, but it is a Debian
  package that CI (PyPI only) does not have, it bounds no SysV IPC, and the uid drop, the checker and the deadline
  would still be this code's; without it the fallback would be this code anyway. The namespaces here are a few
  syscalls (ctypes), and every one that the OS refuses is reported (`isolation()`), never silently skipped.
- Not a security boundary against a determined attacker: one kernel, the trainer's Python and files readable; use a
  VM or gVisor for that. It is meant to keep buggy or reward-hacking model code from harming a training run or
  scoring itself.

Layout: run.py (the host's API above), host.py (the host's process handling), boot.py (the bootstrap, in the jailed
interpreter), jail.py (its operating-system side), protocol.py (the checker <-> candidate channel). Standard library
only: importing it loads no torch and nothing of the trainer.
"""

from .run import (
    CHECKER_UID_OFFSET,
    GRACE_S,
    LIMITS_MAX,
    MIN_MEMORY_MB,
    OUTPUT_TAIL,
    STATUSES,
    UID_BASE,
    FunctionCheck,
    Limits,
    SandboxResult,
    describe_isolation,
    isolation,
    run_check,
    run_many,
    run_python,
)

__all__ = [
    "CHECKER_UID_OFFSET",
    "GRACE_S",
    "LIMITS_MAX",
    "MIN_MEMORY_MB",
    "OUTPUT_TAIL",
    "STATUSES",
    "UID_BASE",
    "FunctionCheck",
    "Limits",
    "SandboxResult",
    "describe_isolation",
    "isolation",
    "run_check",
    "run_many",
    "run_python",
]
