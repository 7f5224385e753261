"""benchmarks.profile_gpu: the aggregation (with fake CUDA profiler events) and a CPU smoke run of the script."""

from __future__ import annotations

import shlex
from types import SimpleNamespace

import pytest

from benchmarks import profile_gpu


def _ev(key, device_type, t_us, count=1, self_cpu=0.0):
    return SimpleNamespace(key=key, device_type=device_type, device_time_total=t_us, count=count,
                           self_cpu_time_total=self_cpu)


def test_kernel_table_counts_device_kernels_only_and_computes_tflops():
    M, D, V, reps = 8192, 4096, 131072, 2
    events = [
        # a CPU op whose device time is the sum of its kernels: must not be counted twice
        _ev("sgrpo::linear_logprobs_fwd", "DeviceType.CPU", 40_000.0, count=2),
        _ev("_linear_logprobs_fwd_kernel", "DeviceType.CUDA", 30_000.0, count=2),     # 15 ms per call
        _ev("_linear_logprobs_bwd_dw_kernel", "DeviceType.CUDA", 10_000.0, count=32),  # 5 ms per call
        _ev("_compact_rows_kernel", "DeviceType.CUDA", 0.0, count=2),                  # no time: dropped
    ]
    rows = profile_gpu.kernel_table(events, True, M, M // 2, D, V, reps)
    assert [r["kernel"] for r in rows] == ["_linear_logprobs_fwd_kernel", "_linear_logprobs_bwd_dw_kernel"]
    fwd, dw = rows
    assert fwd["ms_per_call"] == 15.0 and fwd["calls"] == 1.0 and fwd["share"] == "75.0%"
    assert fwd["tflops"] == round(2 * M * D * V / 15e-3 / 1e12, 1)
    assert dw["calls"] == 16.0 and dw["tflops"] == round(2 * (M // 2) * D * V / 5e-3 / 1e12, 1)  # active rows only


def test_cpu_smoke_run_writes_the_table(tmp_path):
    out = tmp_path / "p.md"
    rc = profile_gpu.main(["--device", "cpu", "--backend", "torch", "--shape", "24x16x100", "--dtype", "float32",
                           "--repeats", "1", "--warmup", "0", "--zero-frac", "0.5", "--out", str(out)])
    assert rc == 0
    text = out.read_text()
    assert "M=24 D=16 V=100" in text and "(12 active rows)" in text
    assert "sgrpo::linear_logprobs_bwd" in text


@pytest.mark.parametrize("args, needle", [
    (["--shape", "8x8"], "--shape: '8x8' is not MxDxV"),
    (["--zero-frac", "1.0"], "--zero-frac: 1.0 is not in [0, 1)"),
    (["--mode", "fwd", "--zero-frac", "0.5"], "--zero-frac only applies"),
    (["--repeats", "0"], "argument --repeats: '0': expected an integer >= 1"),
    (["--warmup", "-1"], "argument --warmup: '-1': expected an integer >= 0"),
])
def test_bad_arguments_name_the_flag(args, needle, capsys):
    with pytest.raises(SystemExit) as exc:
        profile_gpu.main(args)
    assert exc.value.code == 2
    assert needle in capsys.readouterr().err


# ------------------------------------------------------------------------------- user input, checked before any work

TINY = ["--device", "cpu", "--backend", "torch", "--shape", "4x8x16", "--dtype", "float32", "--mode", "fwd",
        "--repeats", "1", "--warmup", "0"]  # fmt: skip


@pytest.mark.parametrize("where, words", [
    ("adir", "is a folder; expected a file"),
    ("afile/p.md", "afile is a file, not a folder"),
    ("/proc/nope.md", "/proc is not a writable folder"),
    ("", "--out: an empty path; expected a file to write"),
])  # fmt: skip
def test_an_unwritable_out_is_refused_before_profiling(where, words, tmp_path, monkeypatch, capsys):
    """Before: the profile ran to the end, then IsADirectoryError / FileNotFoundError lost it."""
    (tmp_path / "adir").mkdir()
    (tmp_path / "afile").write_text("x")

    def refuse(*args, **kwargs):
        pytest.fail("profile_gpu profiled before refusing its --out")

    monkeypatch.setattr(profile_gpu, "lm_head_inputs", refuse)
    out = where if where.startswith("/") or not where else str(tmp_path / where)
    with pytest.raises(SystemExit) as exc:
        profile_gpu.main([*TINY, "--out", out])
    assert exc.value.code == 2
    assert words in (err := capsys.readouterr().err) and f"--out {out}".strip() in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adir", "afile"] and (tmp_path / "afile").read_text() == "x"


def test_the_recorded_command_reruns_the_same_profile(tmp_path):
    """The table's command line parses back to the run's own arguments, --warmup and --device included."""
    out = tmp_path / "p.md"
    assert profile_gpu.main([*TINY, "--out", str(out)]) == 0
    line = next(x for x in out.read_text().splitlines() if x.startswith("`python -m benchmarks.profile_gpu "))
    argv = shlex.split(line.strip("`"))[3:]
    assert argv == ["--shape", "4x8x16", "--dtype", "float32", "--backend", "torch", "--mode", "fwd",
                    "--zero-frac", "0.0", "--repeats", "1", "--warmup", "0", "--device", "cpu"]  # fmt: skip
