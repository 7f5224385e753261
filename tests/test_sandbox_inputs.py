"""sgrpo_sandbox refuses what it cannot run, up front and by name (an adversarial review's findings): a str where a
list of programs belongs, limits that the OS calls would fail on, a memory limit too small for the interpreter,
arguments of the wrong type, text that cannot be encoded; and its protocol names the call and the reason when an
answer is too long. The programs here are trivial, with small limits."""

from __future__ import annotations

import pytest

from sgrpo_sandbox import FunctionCheck, Limits, run_many

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
