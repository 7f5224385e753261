"""The benchmark scripts bench_trainers, bench_ddp and bench_truncated refuse bad input on their command line before
anything is measured, spawned or written: exit status 2 (argparse), one line naming the argument, its value and what
was expected. The measuring and spawning functions are replaced here by recorders: nothing runs for real."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys

import pytest

from benchmarks import bench_ddp, bench_trainers, bench_truncated, common


def refused(main, argv, capsys, *words) -> str:
    """`main(argv)` exits 2 with an argparse error naming every one of `words`; -> the message."""
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2, err
    assert "Traceback" not in err
    for w in words:
        assert w in err, (w, err)
    return err


def files(root) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


# ------------------------------------------------------------------------------------------------- bench_trainers


def trainer_row(kind: str) -> dict:
    return dict(trainer=kind, loss_type="x", steps=2, step_s=[1.0, 1.0], tokens=[10.0, 10.0], step_s_mean=1.0,
                tokens_per_s=10.0, tokens_per_step=10.0, train_peak_mem_mb=1.0, peak_mem_mb=2.0, heldout_before=0.1,
                heldout_after=0.2, process_wall_s=1.0)  # fmt: skip


@pytest.fixture
def trainers(tmp_path, monkeypatch):
    """bench_trainers with its trainers recorded, not run; results and scratch under tmp_path (also the cwd)."""
    calls: list[str] = []
    monkeypatch.setattr(bench_trainers, "run_trainer", lambda kind, args, work: calls.append(kind) or trainer_row(kind))
    monkeypatch.setattr(bench_trainers, "RESULTS", tmp_path / "results")
    monkeypatch.setattr(bench_trainers, "SCRATCH", tmp_path / "scratch")
    for name, value in (("cpu_name", "cpu"), ("git_sha", "abc"), ("versions", "v")):
        monkeypatch.setattr(bench_trainers, name, lambda value=value: value)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("x")
    return tmp_path, calls


def fake_import_vllm(monkeypatch, exit_code: int, stderr: str = "") -> list[str]:
    """benchmarks.common.import_vllm answering `exit_code` (and `stderr`) without running anything; -> the interpreters
    it was asked about."""
    asked: list[str] = []

    def probe(python):
        asked.append(python)
        return subprocess.CompletedProcess([python, "-c", "import vllm"], exit_code, "", stderr)

    monkeypatch.setattr(common, "import_vllm", probe)
    return asked


@pytest.mark.parametrize(
    ("trainers_flag", "python", "words"),
    [
        ("bundled-vllm-fp32", "/nonexistent/python", "/nonexistent/python: no such file"),
        ("bundled,bundled-vllm-fp32,trl", "/nonexistent/python", "/nonexistent/python: no such file"),
        ("bundled,bundled-vllm-bf16", "afile", "afile: not executable"),
        ("bundled,bundled-vllm-bf16", ".", ".: a folder"),
    ],
)
def test_trainers_vllm_python_is_checked_before_the_first_trainer(trainers, capsys, trainers_flag, python, words):
    tmp, calls = trainers
    argv = ["--trainers", trainers_flag, "--vllm-python", python, "--out", str(tmp / "out")]
    refused(bench_trainers.main, argv, capsys, f"--vllm-python {words}", "expected a Python with vllm")
    assert calls == [] and not (tmp / "out").exists()


def test_trainers_vllm_python_without_vllm_is_refused_before_the_first_trainer(trainers, monkeypatch, capsys):
    tmp, calls = trainers
    asked = fake_import_vllm(monkeypatch, 1, "Traceback ...\nModuleNotFoundError: No module named 'vllm'\n")
    argv = ["--trainers", "bundled,bundled-vllm-fp32", "--out", str(tmp / "out")]  # the default: this interpreter
    with pytest.raises(SystemExit) as exc:
        bench_trainers.main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and asked == [sys.executable]
    assert f"--vllm-python {sys.executable}: cannot import vllm (ModuleNotFoundError: No module named 'vllm')" in err
    assert calls == [] and not (tmp / "out").exists()


def test_trainers_a_python_that_imports_vllm_is_accepted(trainers, monkeypatch):
    tmp, calls = trainers
    asked = fake_import_vllm(monkeypatch, 0)
    argv = ["--trainers", "bundled,bundled-vllm-fp32", "--vllm-python", sys.executable, "--out", str(tmp / "out")]
    assert bench_trainers.main(argv) == 0
    assert asked == [sys.executable] and calls == ["bundled", "bundled-vllm-fp32"]
    assert bench_trainers.main(["--trainers", "bundled", "--vllm-python", "/nonexistent/python", "--out",
                                str(tmp / "out")]) == 0  # fmt: skip
    assert asked == [sys.executable]  # no vLLM trainer: the interpreter is not asked


def test_trainers_missing_trl_is_refused_before_the_first_trainer(trainers, monkeypatch, capsys):
    import importlib.util

    tmp, calls = trainers
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "trl" else real(name, *a))
    argv = ["--trainers", "bundled,sgrpo", "--out", str(tmp / "out")]
    refused(bench_trainers.main, argv, capsys, "--trainers bundled,sgrpo", "sgrpo need trl", "trl extra")
    assert calls == []
    monkeypatch.setattr(bench_trainers, "run_trainer", lambda kind, *a: calls.append(kind) or trainer_row(kind))
    assert bench_trainers.main(["--trainers", "bundled", "--out", str(tmp / "out")]) == 0  # no TRL trainer: no check
    assert calls == ["bundled"]


@pytest.mark.parametrize(
    ("flag", "value", "words"),
    [
        ("--group-size", "1", "expected integer >= 2"),  # as `python -m train --group-size 1` refuses it
        ("--prompts", "0", "expected integer >= 1"),
        ("--max-new-tokens", "0", "expected integer >= 1"),
        ("--eval-problems", "0", "expected integer >= 1"),
        ("--seed", "-1", "expected integer with 0 <= x"),
        ("--model", "/nonexistent/model.gguf", "no such file or folder"),
        ("--threads", "0", "expected an integer >= 1"),
        ("--threads", "-3", "expected an integer >= 1"),
        ("--steps", "0", "expected an integer >= 1"),  # (refused before too, with other words)
        ("--steps", "x", "expected an integer >= 1"),
    ],
)
def test_trainers_job_flags_are_checked_at_parse_time(trainers, capsys, flag, value, words):
    tmp, calls = trainers
    refused(bench_trainers.main, [flag, value, "--out", str(tmp / "out")], capsys, f"argument {flag}: '{value}'", words)
    assert calls == [] and not (tmp / "out").exists()


@pytest.mark.parametrize(("out", "words"), [("afile", "--out afile: exists and is not a folder"),
                                            ("afile/sub", "afile is a file, not a folder"),
                                            ("", "--out: an empty path; expected a folder")])  # fmt: skip
def test_trainers_out_is_checked_before_the_first_trainer(trainers, capsys, out, words):
    tmp, calls = trainers
    before = files(tmp)
    refused(bench_trainers.main, ["--trainers", "bundled", "--out", out], capsys, words)
    assert calls == [] and files(tmp) == before


def test_trainers_out_and_publish_are_exclusive(trainers, capsys):
    tmp, calls = trainers
    argv = ["--trainers", "bundled", "--out", str(tmp / "out"), "--publish"]
    refused(bench_trainers.main, argv, capsys, "--publish", "not allowed with argument --out")
    assert calls == [] and not (tmp / "out").exists() and not (tmp / "results").exists()


def test_trainers_stray_arguments_are_refused(trainers, capsys):
    tmp, calls = trainers
    refused(bench_trainers.main, ["bundled", "--out", str(tmp / "out")], capsys, "unrecognized arguments: bundled")
    assert calls == []


def test_trainers_command_is_recorded_shell_quoted(trainers):
    tmp, _ = trainers
    argv = ["--trainers", "bundled", "--steps", "2", "--out", str(tmp / "my results")]
    assert bench_trainers.main(argv) == 0
    meta = json.loads((tmp / "my results" / "trainers.json").read_text())
    assert shlex.split(meta["command"]) == ["python", "-m", "benchmarks.bench_trainers", *argv]
    assert f"`{meta['command']}`" in (tmp / "my results" / "trainers.md").read_text()


# ------------------------------------------------------------------------------------------------------ bench_ddp


def ddp_row(nproc: int) -> dict:
    return dict(processes=nproc, threads_each=1, completions_per_step=4, step_s_mean=1.0, step_s_values=[1.0],
                gen_s_mean=0.5, peak_mem_mb_rank0=100.0, train_peak_mem_mb_rank0=50.0, wall_s=3.0)  # fmt: skip


@pytest.fixture
def ddp(tmp_path, monkeypatch):
    """bench_ddp with its jobs recorded, not run; scratch and results under tmp_path."""
    calls: list[int] = []
    monkeypatch.setattr(bench_ddp, "run_job", lambda nproc, args, out: calls.append(nproc) or ddp_row(nproc))
    monkeypatch.setattr(bench_ddp, "scratch_dir", lambda: tmp_path / "scratch")
    monkeypatch.setattr(bench_ddp, "RESULTS", tmp_path / "results")
    for name, value in (("cpu_name", "cpu"), ("git_sha", "abc"), ("versions", "v")):
        monkeypatch.setattr(bench_ddp, name, lambda value=value: value)
    return tmp_path, calls


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--nproc", "0"], ["argument --nproc: '0'", "expected an integer >= 2"]),  # was a ZeroDivisionError
        (["--nproc", "-2"], ["argument --nproc: '-2'", "expected an integer >= 2"]),  # was torchrun with -2
        (["--nproc", "1"], ["argument --nproc: '1'", "expected an integer >= 2"]),  # ran the same 1-process job twice
        (["--nproc", "2", "--cores", "3"], ["--cores 3 does not split evenly over --nproc 2", "1 idle"]),  # was 1+1
        (["--cores", "0"], ["argument --cores: '0'", "expected an integer >= 1"]),  # was 1 thread, "0 cores"
        (["--cores", "-4"], ["argument --cores: '-4'", "expected an integer >= 1"]),
        (["--nproc", "4", "--cores", "2", "--prompts", "4"], ["--nproc 4 exceeds --cores 2", "at least one each"]),
        (["--steps", "0"], ["argument --steps: '0'", "expected an integer >= 1"]),
        (["--prompts", "0"], ["argument --prompts: '0'", "expected integer >= 1"]),
        (["--group-size", "1"], ["argument --group-size: '1'", "expected integer >= 2"]),
        (["--eval-problems", "0"], ["argument --eval-problems: '0'", "expected integer >= 1"]),
    ],
)
def test_ddp_bad_counts_are_refused_before_any_job(ddp, capsys, argv, words):
    tmp, calls = ddp
    refused(bench_ddp.main, ["--cores", "2", *argv], capsys, *words)  # (a later --cores replaces this one)
    assert calls == [] and files(tmp) == []


@pytest.mark.parametrize(("cpus", "nproc", "cores"), [(3, 2, 2), (4, 2, 4), (7, 3, 6), (1, 2, None)])
def test_ddp_default_cores_split_evenly(ddp, monkeypatch, capsys, cpus, nproc, cores):
    """The default --cores (the machine's) is taken down to a multiple of --nproc, so that an odd core count does not
    refuse the default command; fewer cores than processes is still refused."""
    tmp, calls = ddp
    monkeypatch.setattr(bench_ddp.os, "cpu_count", lambda: cpus)
    argv = ["--nproc", str(nproc), "--prompts", str(nproc)]
    if cores is None:
        refused(bench_ddp.main, argv, capsys, f"--nproc {nproc} exceeds --cores {cpus}")
        return
    assert bench_ddp.main(argv) == 0 and calls == [1, nproc]
    assert f"{cores} cores" in (tmp / "scratch" / "ddp" / "ddp.md").read_text()


def test_ddp_unwritable_report_is_refused_before_any_job(ddp, monkeypatch, capsys):
    tmp, calls = ddp
    (tmp / "afile").write_text("x")
    monkeypatch.setattr(bench_ddp, "RESULTS", tmp / "afile")
    refused(bench_ddp.main, ["--cores", "2", "--publish"], capsys, "--publish", "afile is a file, not a folder")
    assert calls == []


def test_ddp_report_records_the_actual_command_where_the_docstring_says(ddp):
    tmp, calls = ddp
    argv = ["--nproc", "2", "--cores", "2", "--prompts", "2", "--group-size", "2", "--eval-problems", "4", "--steps",
            "3", "--model", "tiny"]  # fmt: skip
    assert bench_ddp.main(argv) == 0 and calls == [1, 2]
    written = tmp / "scratch" / "ddp" / "ddp.md"
    assert f"runs/bench/{written.relative_to(tmp / 'scratch')}" in " ".join(bench_ddp.__doc__.split())
    command = written.read_text().split("`")[1]
    assert shlex.split(command) == ["python", "-m", "benchmarks.bench_ddp", *argv]  # --cores, --prompts ... too


# ------------------------------------------------------------------------------------------------ bench_truncated


@pytest.fixture
def truncated(tmp_path, monkeypatch):
    """bench_truncated with its worker recorded, not run (every call 1-2 ms, 1 MB); results under tmp_path."""
    calls: list[tuple] = []

    def spawn(regime, N, names, repeats, warmup):
        calls.append((regime, tuple(names)))
        return {"times": {p: [1.0, 2.0] for p in names}, "mem": {p: 1.0 for p in names}, "threads": 1}

    monkeypatch.setattr(bench_truncated, "_spawn", spawn)
    monkeypatch.setattr(bench_truncated, "RESULTS", tmp_path / "results")
    for name, value in (("cpu_name", "cpu"), ("git_sha", "abc"), ("versions", "v")):
        monkeypatch.setattr(bench_truncated, name, lambda value=value: value)
    monkeypatch.chdir(tmp_path)
    return tmp_path, calls


@pytest.mark.parametrize(
    ("regimes", "provider"),
    [(["flat"], "min_p=0.05"), (["flat"], bench_truncated.NAIVE), (["lm", "flat"], "top_k=50,top_p=0.9")],
)
def test_truncated_refuses_a_provider_the_regime_lacks(truncated, capsys, regimes, provider):
    tmp, calls = truncated
    argv = ["--regimes", *regimes, "--providers", "full", provider, "--out", str(tmp / "out" / "x")]
    refused(bench_truncated.main, argv, capsys, f"--providers {provider}: regime flat has no such provider",
            "full, top_k=50, top_p=0.9", "--regimes lm")  # fmt: skip
    assert calls == [] and not (tmp / "out").exists()


def test_truncated_a_provider_every_regime_has_is_measured_in_each(truncated):
    tmp, calls = truncated
    assert bench_truncated.main(["--providers", "top_p=0.9", "--out", str(tmp / "x")]) == 0
    assert calls == [("lm", ("full", "top_p=0.9")), ("flat", ("full", "top_p=0.9"))]


@pytest.mark.parametrize(("out", "words"), [("afile/x", "--out afile/x: afile is a file, not a folder"),
                                            ("adir", "--out adir: is a folder; expected a file name"),
                                            ("", "--out: an empty path")])  # fmt: skip
def test_truncated_out_is_checked_before_any_measuring(truncated, capsys, out, words):
    tmp, calls = truncated
    (tmp / "afile").write_text("x")
    (tmp / "adir").mkdir()
    refused(bench_truncated.main, ["--regimes", "flat", "--out", out], capsys, words)
    assert calls == [] and files(tmp) == ["adir", "afile"]


def test_truncated_command_is_recorded_shell_quoted(truncated):
    tmp, _ = truncated
    argv = ["--regimes", "lm", "--providers", bench_truncated.NAIVE, "--tokens", "8", "--out", str(tmp / "my x")]
    assert bench_truncated.main(argv) == 0
    line = next(x for x in (tmp / "my x.md").read_text().splitlines() if x.startswith("Command: "))
    assert "'naive(top_k=50,top_p=0.9)'" in line  # unquoted, bash reads the parenthesis as syntax
    assert shlex.split(line.removeprefix("Command: ")) == ["python", "-m", "benchmarks.bench_truncated", *argv]


def test_a_bundled_records_token_count_is_the_integer_it_was():
    """tokens_per_s x step_s came back as 32.00000000000001 (or 31.999999999999996) for 32 tokens, and the end-to-end
    test's bound `<= 2 x 4 x 4` failed on it now and then."""
    from benchmarks.bench_trainers import completion_tokens

    for step_s in (0.48183098461083224, 0.05, 1 / 3):
        assert completion_tokens({"tokens_per_s": 32 / step_s, "step_s": step_s}) == 32
