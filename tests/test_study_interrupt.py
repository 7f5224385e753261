"""`python -m study` stopped with SIGTERM: it passes the signal on to its running trainers, says how to resume, and the
process itself exits (status 130) instead of lingering. The trainers are stand-ins (a process that waits for SIGTERM and
exits 143, as the trainer does after its checkpoint), so no model is loaded and nothing trains (the driver still imports
the trainer's config, and torch with it, to check each run's arguments)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from procs import wait_for

ROOT = Path(__file__).resolve().parents[1]

DRIVER = r"""
import subprocess, sys, time
from pathlib import Path

import study.runner as runner
from study.__main__ import main

tmp = Path(sys.argv[1])
TRAINER = ("import signal, sys, time, pathlib\n"
           "stop = lambda *a: (pathlib.Path(sys.argv[1]).write_text('stopped'), sys.exit(143))\n"
           "signal.signal(signal.SIGTERM, stop)\n"
           "pathlib.Path(sys.argv[2]).write_text('running')\n"
           "time.sleep(600)\n")

def start(spec, threads):  # a stand-in trainer per run, started the way the runner starts one
    spec.work_dir.mkdir(parents=True, exist_ok=True)
    name = spec.key.replace("/", "_")
    proc = subprocess.Popen([sys.executable, "-c", TRAINER, str(tmp / f"{name}.stopped"), str(tmp / f"{name}.running")],
                            start_new_session=True)
    return runner.Active(spec, proc, tmp / f"{name}.log", time.time(), False)

runner._start = start
runner.environment = lambda: {"git_sha": "", "git_dirty": False}
sys.exit(main(["--regime", "decisive", "--arms", "grpo", "--seeds", "0,1", "--workers", "2", "--progress", "false",
               "--out", str(tmp / "out"), "--work", str(tmp / "work"), "--no-figure"]))
"""


def test_sigterm_stops_the_trainers_and_the_study_exits(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, str(tmp_path)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        running = [tmp_path / f"grpo_seed{s}.running" for s in (0, 1)]
        assert wait_for(lambda: all(p.exists() for p in running), 120), proc.communicate(timeout=60)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)  # a driver that lingers after SIGTERM fails here instead of hanging
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, (proc.returncode, err)
    assert "study interrupted" in err and "the same command resumes" in err, err
    for s in (0, 1):  # every running trainer got the SIGTERM (its handler wrote the file) before the study exited
        assert (tmp_path / f"grpo_seed{s}.stopped").read_text() == "stopped"
