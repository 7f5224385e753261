"""sgrpo_sandbox refuses what it cannot run, up front and by name (an adversarial review's findings): a str where a
list of programs belongs, limits that the OS calls would fail on, a memory limit too small for the interpreter,
arguments of the wrong type, text that cannot be encoded; and its protocol names the call and the reason when an
answer is too long. The programs here are trivial, with small limits."""

from __future__ import annotations

import re

import pytest

from sgrpo_sandbox import FunctionCheck, Limits, run_check, run_many, run_python

FAST = Limits(timeout_s=20.0, cpu_s=2, memory_mb=256, processes=8)


def test_run_many_refuses_a_str_for_the_list():
    """A str is iterable: it ran one program per character."""
    for sources in ("print(1)", b"print(1)", None, {"print(1)"}):
        with pytest.raises(TypeError, match=r"^sources: expected a list of source strings"):
            run_many(sources, FAST)


def test_run_many_names_the_index_of_a_bad_item():
    with pytest.raises(TypeError, match=r"^sources\[1\]: expected a source str or a FunctionCheck, got int"):
        run_many(["print(1)", 5], FAST)
    check = FunctionCheck("def f():\n    return 1\n", "def check(c):\n    assert c() == 1\n", "f")
    assert [r.status for r in run_many(("pass", check), FAST)] == ["passed", "passed"]  # a tuple, both kinds


BEYOND = {  # each was accepted, then failed every run (OverflowError) or, for timeout_s, raised from poll()
    "timeout_s": (2.2e6, 2_000_000.0),
    "cpu_s": (10**30, 2**31 - 1),
    "memory_mb": (10**15, 2**40),
    "file_mb": (10**13, 2**40),
    "tmp_mb": (2**41, 2**40),
    "processes": (2**31, 2**31 - 1),
    "open_files": (2**20 + 1, 2**20),
    "output_bytes": (2**41, 2**40),
}


@pytest.mark.parametrize("name", sorted(BEYOND))
def test_limits_beyond_their_maximum_are_refused(name):
    value, most = BEYOND[name]
    with pytest.raises(ValueError, match=rf"^Limits\.{name}={re.escape(repr(value))}: at most {re.escape(repr(most))}"):
        Limits(**{name: value})


def test_limits_at_their_maximum_run():
    """Every maximum at once is a limit the OS takes: a trivial program passes under it."""
    limits = Limits(**{name: most for name, (_, most) in BEYOND.items()})
    r = run_python("print('hi')", limits)
    assert (r.status, r.output) == ("passed", "hi\n"), r


ONE = FunctionCheck("def f():\n    return 1\n", "def check(c):\n    assert c() == 1\n", "f")


def test_memory_below_the_minimum_is_refused():
    """memory_mb=8 ran as `failed`, exit 1, no output, no detail (run_check: an error blaming the test)."""
    with pytest.raises(ValueError, match=r"^Limits\.memory_mb=8: at least 32 \(MIN_MEMORY_MB\)"):
        Limits(memory_mb=8)
    assert Limits(memory_mb=32).memory_mb == 32


def test_an_interpreter_that_cannot_start_under_its_limit_is_an_error():
    """What an interpreter larger than MIN_MEMORY_MB would meet: the result says why, and blames neither the program
    nor the test. (The limit is set past Limits' own check.)"""
    limits = Limits(timeout_s=20.0, cpu_s=2, memory_mb=256)
    object.__setattr__(limits, "memory_mb", 8)
    for r in (run_python("print('hi')", limits), run_check(ONE, limits)):
        assert (r.status, r.exit_code) == ("error", None), r
        assert r.detail.startswith("the interpreter could not start under memory_mb=8: it needs about "), r.detail
    assert run_python("print('hi')", Limits(timeout_s=20.0, cpu_s=2, memory_mb=32)).output == "hi\n"


def test_limits_of_the_wrong_type_are_refused_by_name():
    """A dict for `limits` failed with AttributeError ('dict' object has no attribute 'timeout_s')."""
    calls = (
        lambda: run_python("pass", {"timeout_s": 1}),
        lambda: run_check(ONE, {"timeout_s": 1}),
        lambda: run_many(["pass"], {"timeout_s": 1}),
    )
    for call in calls:
        with pytest.raises(TypeError, match=r"^limits: expected a Limits .*got dict"):
            call()


def test_a_lone_surrogate_is_refused_by_name():
    """It cannot be written to the program file (UTF-8): a bare UnicodeEncodeError named neither argument."""
    with pytest.raises(ValueError, match=r"^source: character 7 is '\\ud800', a lone surrogate"):
        run_python("print('\ud800')", FAST)
    with pytest.raises(ValueError, match=r"^sources\[1\]: character 1 is '\\udc00', a lone surrogate"):
        run_many(["pass", "'\udc00'"], FAST)
    with pytest.raises(ValueError, match=r"^FunctionCheck\.program: character 5 is '\\ud800'"):
        FunctionCheck("x = '\ud800'", ONE.test, "f")
    assert run_python("print('\u00e9\U0001f600')", FAST).output == "\u00e9\U0001f600\n"  # any other text runs


def _check(program: str, test: str) -> str:
    r = run_check(FunctionCheck(program, test, "f"), Limits(timeout_s=30.0, cpu_s=10, memory_mb=512))
    assert r.status == "failed", r
    return r.detail


# A 5 MiB reply was "call 1: no well-formed answer (ProtocolError: the other side closed the channel)": the first call
# is call 0, and the limit was the reason. Oversized arguments name their call the same way.
@pytest.mark.parametrize(
    ("program", "test", "head", "tail"),
    [
        ("def f():\n    return 'x' * (5 << 20)\n", "def check(c):\n    c()\n",
         "call 0: its value cannot be sent: the reply of ", " bytes exceeds the limit of 4194304 bytes (MAX_MESSAGE)"),
        ("def f(x):\n    return x\n", "def check(c):\n    c(1)\n    c('x' * (5 << 20))\n",
         "call 1: the test's arguments cannot be sent (the call of ",
         " bytes exceeds the limit of 4194304 bytes (MAX_MESSAGE))"),
    ],
    ids=["reply", "arguments"],
)
def test_a_value_over_the_message_limit_names_its_call_and_the_limit(program, test, head, tail):
    detail = _check(program, test)
    assert detail.startswith(head), detail
    assert detail.endswith(tail), detail


def test_an_oversized_line_from_the_candidate_names_the_limit():
    program = "def f():\n    import os\n    os.write(4, b'1' * (5 << 20))\n"
    detail = _check(program, "def check(c):\n    c()\n")
    assert detail == (
        "call 0: no well-formed answer (ProtocolError: a message longer than the limit of 4194304 bytes (MAX_MESSAGE))"
    )


def test_failed_calls_are_numbered_from_zero():
    program = "def f(x):\n    if x:\n        import os\n        os._exit(0)\n    return x\n"
    detail = _check(program, "def check(c):\n    assert c(0) == 0\n    c(1)\n")
    assert detail == "call 1: no well-formed answer (ProtocolError: the other side closed the channel)"
