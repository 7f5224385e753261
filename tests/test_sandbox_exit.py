"""A program run by `run_python` ends as `python program.py` would (sgrpo_sandbox/boot.py, _run_program): its exit
status, its non-daemon threads waited for, its atexit handlers and sys.excepthook run. Before, the bootstrap called
os._exit right after the program's last line: sys.exit(2**100) and a thread's os._exit(3) were judged passed (exit 0),
a thread's or an atexit handler's output was lost, a custom excepthook was ignored."""

from __future__ import annotations

import subprocess
import sys

import pytest

from sgrpo_sandbox import Limits, run_python

CASES = {
    "exit beyond a C long": "import sys; sys.exit(2**100)",
    "exit 256": "import sys; sys.exit(256)",
    "exit with a text": "import sys; sys.exit('bye')",
    "atexit handler": "import atexit; atexit.register(lambda: print('atexit ran'))",
    "non-daemon thread": "import threading, time\n"
    "threading.Thread(target=lambda: (time.sleep(0.2), print('thread done'))).start()",
    "thread exits 3": "import threading, time, os\n"
    "threading.Thread(target=lambda: (time.sleep(0.2), os._exit(3))).start()",
    "atexit exits 4": "import atexit, sys\natexit.register(lambda: sys.exit(4))",
    "excepthook": "import sys\nsys.excepthook = lambda *a: print('hook')\n1/0",
}


@pytest.mark.parametrize("name", list(CASES))
def test_a_program_ends_as_python_would_end_it(name):
    src = CASES[name]
    real = subprocess.run([sys.executable, "-c", src], capture_output=True, text=True, timeout=30)
    got = run_python(src)
    assert got.exit_code == real.returncode, (got.status, got.output)
    assert got.status == ("passed" if real.returncode == 0 else "failed")
    for text in ("atexit ran", "thread done", "hook", "bye"):
        assert (text in got.output) == (text in real.stdout + real.stderr), (text, got.output)


def test_a_thread_that_never_ends_is_a_timeout():
    forever = "import threading, time\nthreading.Thread(target=lambda: time.sleep(60)).start()"
    got = run_python(forever, Limits(timeout_s=1))
    assert got.status == "timeout"
