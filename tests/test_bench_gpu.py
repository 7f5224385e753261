"""The CUDA benchmark script (benchmarks.bench_gpu), run end to end on CPU at a tiny shape (`--device cpu`).

No timing is checked here (speed is the benchmark's business, not a unit test's). What is checked: the script runs
every provider that can run here, including the peers' adapters when Liger-Kernel / cut-cross-entropy are installed
(the `bench` extra) and TRL's fused head when `trl` is (its torch tiles here; its Triton kernels run on CUDA only),
each provider passes the script's own float64 correctness gate in all three modes, the CSV has exactly the issue's
columns, and a provider that is wrong is left out of the table instead of being reported.
"""

from __future__ import annotations

import csv
import importlib.util
import os
from pathlib import Path

import pytest
import torch

from benchmarks import bench_gpu, common

ISSUE_COLUMNS = ("device,provider,mode,M,D,V,dtype,zero_grad_frac,ms_median,ms_p20,ms_p80,tflops,peak_mem_gb,"
                 "versions,git_sha").split(",")
SHAPE = "40x24x150"  # V not a multiple of any block size; M small enough for the Triton interpreter
MODES = [("fwd", "0.0"), ("fwd+bwd", "0.0"), ("fwd+bwd", "0.5")]


def _providers() -> list[str]:
    """Everything that can run on CPU here. Liger's fused linear CE is Triton-only: it needs a working interpreter."""
    from sgrpo_kernels import backends

    interp = os.environ.get("TRITON_INTERPRET") == "1" and backends.available_backends().get("triton") == "available"
    out = ["reference", "torch"] + (["triton"] if interp else [])
    if importlib.util.find_spec("liger_kernel") is not None:
        out += (["liger_flce"] if interp else []) + ["liger_scaled_ce"]
    if importlib.util.find_spec("cut_cross_entropy") is not None:
        out.append("cce")
    if importlib.util.find_spec("trl") is not None:
        out.append("trl")
    return out


def _run(tmp_path: Path, providers: list[str], *extra: str) -> tuple[int, list[dict], str]:
    prefix = tmp_path / "gpu"
    rc = bench_gpu.main(["--device", "cpu", "--shapes", SHAPE, "--dtype", "float32", "--repeats", "1",
                         "--warmup", "0", "--providers", ",".join(providers), "--out", str(prefix), *extra])
    rows = []
    if prefix.with_suffix(".csv").exists():
        with open(prefix.with_suffix(".csv"), newline="") as f:
            reader = csv.DictReader(f)
            assert reader.fieldnames == ISSUE_COLUMNS
            rows = list(reader)
    md = prefix.with_suffix(".md").read_text() if prefix.with_suffix(".md").exists() else ""
    return rc, rows, md


def test_every_provider_runs_and_passes_the_gate(tmp_path):
    providers = _providers()
    rc, rows, md = _run(tmp_path, providers)
    assert rc == 0
    got = {(r["provider"], r["mode"], r["zero_grad_frac"]) for r in rows}
    missing = [(p, m, z) for p in providers for m, z in MODES if (p, m, z) not in got]
    assert not missing, f"rows missing: {missing}\n{md}"
    assert "NOT REPORTED" not in md and "failed" not in md, md
    for r in rows:
        assert (int(r["M"]), int(r["D"]), int(r["V"])) == (40, 24, 150)
        assert r["dtype"] == "float32"
        med, p20, p80 = float(r["ms_median"]), float(r["ms_p20"]), float(r["ms_p80"])
        assert 0 < p20 <= med <= p80
        assert r["git_sha"] and r["versions"].startswith("torch")


def test_a_wrong_provider_is_not_reported(tmp_path, monkeypatch):
    """The correctness gate can fail: a provider whose log-probs are off by 0.05 gets no row, only a note."""
    from sgrpo_kernels import reference as ref

    real = bench_gpu._provider_fn

    def provider_fn(name):
        if name == "torch":
            def off(h, w, t):
                logp, ent = ref.linear_logprobs(h, w, t, ignore_index=bench_gpu.IGNORE)
                return logp + 0.05, ent
            return off
        return real(name)

    monkeypatch.setattr(bench_gpu, "_provider_fn", provider_fn)
    rc, rows, md = _run(tmp_path, ["reference", "torch"], "--modes", "fwd")
    assert rc == 0
    assert [r["provider"] for r in rows] == ["reference"]
    assert "torch 40x24x150 fwd zero=0.0: NOT REPORTED, failed the check" in md


def test_a_wrong_gradient_is_not_reported(tmp_path, monkeypatch):
    """Right log-probs, wrong grad_hidden (entropy gradient dropped): caught in fwd+bwd, fine in fwd."""
    from sgrpo_kernels import reference as ref

    real = bench_gpu._provider_fn

    class _NoEntropyGrad(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, g):
            return torch.zeros_like(g)

    def provider_fn(name):
        if name == "torch":
            def off(h, w, t):
                logp, ent = ref.linear_logprobs(h, w, t, ignore_index=bench_gpu.IGNORE)
                return logp, _NoEntropyGrad.apply(ent)
            return off
        return real(name)

    monkeypatch.setattr(bench_gpu, "_provider_fn", provider_fn)
    rc, rows, md = _run(tmp_path, ["torch"], "--modes", "fwd,fwd+bwd")
    assert rc == 0
    assert [(r["provider"], r["mode"]) for r in rows] == [("torch", "fwd")]
    assert "torch 40x24x150 fwd+bwd zero=0.0: NOT REPORTED" in md


def test_no_cuda_means_a_clear_exit(capsys):
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    assert bench_gpu.main(["--providers", "reference"]) == 2
    assert "no CUDA device" in capsys.readouterr().err


@pytest.mark.parametrize("args, needle", [
    (["--providers", "reference,liger"], "--providers: unknown liger"),
    (["--shapes", "8192x4096"], "--shapes: '8192x4096' is not MxDxV"),
    (["--shapes", "8x0x16"], "--shapes: '8x0x16' is not MxDxV"),
    (["--modes", "fwd+bwd@1.5"], "--modes: 'fwd+bwd@1.5'"),
    (["--modes", "fwd@0.5"], "--modes: 'fwd@0.5'"),
    (["--modes", "bwd"], "--modes: 'bwd'"),
])
def test_bad_arguments_name_the_flag(args, needle, capsys):
    with pytest.raises(SystemExit) as exc:
        bench_gpu.main(args)  # no --device: the arguments are checked before CUDA is looked for
    assert exc.value.code == 2
    assert needle in capsys.readouterr().err


def _row(provider, mode, zero, ms, tflops, peak, shape=(8192, 4096, 131072)):
    m, d, v = shape
    return dict(provider=provider, mode=mode, zero_grad_frac=zero, ms_median=ms, tflops=tflops, peak_mem_gb=peak,
                M=m, D=d, V=v, dtype="bfloat16")


def test_targets_report_checks_the_issue_bars():
    grads = (8192 * 4096 + 131072 * 4096) * 2 / 2**30  # 1.0625 GB of bf16 gradients
    rows = [
        _row("reference", "fwd+bwd", 0.0, 120.0, 290.0, grads + 30.0),
        _row("triton", "fwd", 0.0, 13.0, 676.6, 0.1),
        _row("triton", "fwd+bwd", 0.0, 60.0, 586.4, grads + 0.5),   # 0.5 / 30 = 1.67% of the reference
        _row("triton", "fwd+bwd", 0.5, 40.0, 879.6, grads + 0.5),   # 0.667x: misses 0.65x
    ]
    text = "\n".join(bench_gpu.targets_report(rows))
    assert "| forward-only TFLOP/s (2MDV/t) | 676.6 | >= 650 | yes |" in text
    assert "| fwd+bwd TFLOP/s (8MDV/t) | 586.4 | >= 600 | NO |" in text
    assert "0.500 / 30.000 GB = 1.67% | <= 2% | yes |" in text
    assert "| fwd+bwd time, 50% zero-gradient rows vs dense | 0.667x | <= 0.65x | NO |" in text


def test_targets_report_absolute_bars_only_at_the_issue_shape():
    shape = (8192, 2304, 256000)
    rows = [_row("triton", "fwd", 0.0, 10.0, 100.0, 0.1, shape),
            _row("triton", "fwd+bwd", 0.0, 50.0, 100.0, 9.0, shape),
            _row("triton", "fwd+bwd", 0.5, 25.0, 200.0, 9.0, shape)]
    text = "\n".join(bench_gpu.targets_report(rows))
    assert "TFLOP/s" not in text and "0.500x | <= 0.65x | yes" in text
    assert bench_gpu.targets_report([_row("reference", "fwd", 0.0, 1.0, 1.0, 1.0)]) == []


# ------------------------------------------------------------------------------- user input, checked before any work

TINY = ["--device", "cpu", "--shapes", "4x8x16", "--dtype", "float32", "--providers", "reference", "--modes", "fwd",
        "--repeats", "1", "--warmup", "0"]  # fmt: skip


def _no_measuring(monkeypatch):
    """Fail the test if the script gets as far as building inputs (it must refuse first)."""

    def refuse(*args, **kwargs):
        pytest.fail("bench_gpu measured before refusing its arguments")

    monkeypatch.setattr(bench_gpu, "lm_head_inputs", refuse)


def test_the_cuda_default_out_is_still_the_results_folder(tmp_path, monkeypatch, capsys):
    """gpu_session.sh passes --out; a plain CUDA run still writes benchmarks/results/gpu.*, checked up front."""
    monkeypatch.setattr(common, "RESULTS", tmp_path)
    (tmp_path / "gpu.md").mkdir()
    _no_measuring(monkeypatch)
    with pytest.raises(SystemExit) as exc:
        bench_gpu.main(["--providers", "reference"])
    assert exc.value.code == 2
    assert f"--out {tmp_path / 'gpu.md'}: is a folder; expected a file" in capsys.readouterr().err


@pytest.mark.parametrize("where, words", [
    ("adir", "is a folder; expected a file name (suffixes are added)"),
    ("clash", "clash.csv: is a folder; expected a file"),  # the prefix is free, one of its files is not
    ("/proc/nope", "/proc is not a writable folder"),
])  # fmt: skip
def test_an_unwritable_out_is_refused_before_measuring(where, words, tmp_path, monkeypatch, capsys):
    """Before: the measuring ran to the end, then IsADirectoryError / FileNotFoundError lost it."""
    (tmp_path / "adir").mkdir()
    (tmp_path / "clash.csv").mkdir()
    _no_measuring(monkeypatch)
    out = where if where.startswith("/") else str(tmp_path / where)
    with pytest.raises(SystemExit) as exc:
        bench_gpu.main([*TINY, "--out", out])
    assert exc.value.code == 2
    assert f"--out {out}" in (err := capsys.readouterr().err) and words in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adir", "clash.csv"]


@pytest.mark.parametrize("flag, value, words", [
    ("--repeats", "0", "argument --repeats: '0': expected an integer >= 1"),
    ("--repeats", "-3", "argument --repeats: '-3': expected an integer >= 1"),
    ("--warmup", "-1", "argument --warmup: '-1': expected an integer >= 0"),
])  # fmt: skip
def test_repeats_and_warmup_are_refused_at_parse_time(flag, value, words, tmp_path, monkeypatch, capsys):
    """Before: --repeats 0 ran every provider, then statistics.StatisticsError; --warmup -1 was taken as 0."""
    monkeypatch.setattr(common, "RESULTS", tmp_path / "results")
    _no_measuring(monkeypatch)
    with pytest.raises(SystemExit) as exc:
        bench_gpu.main([*TINY, flag, value, "--out", str(tmp_path / "gpu")])
    assert exc.value.code == 2
    assert words in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
