"""sgrpo_sandbox refuses what it cannot run, up front and by name (an adversarial review's findings): a str where a
list of programs belongs, limits that the OS calls would fail on, a memory limit too small for the interpreter,
arguments of the wrong type, text that cannot be encoded; and its protocol names the call and the reason when an
answer is too long. The programs here are trivial, with small limits."""

from __future__ import annotations

import re

import pytest

from sgrpo_sandbox import FunctionCheck, Limits, run_many, run_python

FAST = Limits(timeout_s=3.0, cpu_s=2, memory_mb=256, processes=8)


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
