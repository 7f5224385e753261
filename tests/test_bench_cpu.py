"""benchmarks.bench_cpu writes to a scratch location by default; the committed tables only with --publish."""

from __future__ import annotations

import pytest

import benchmarks.bench_cpu as bench

ARGS = ["--models", "smollm2-135m", "--tokens", "8", "--modes", "fwd", "--repeats", "2", "--warmup", "0"]


def fake_spawn(kind, *args):
    """The workers' answers without running them (a real run takes minutes)."""
    if kind == "mem":
        return {"peak_extra_mb": 1.0, "check": {"logp_sum": 1.0, "ent_sum": 2.0}, "threads": 1}
    return {p: [2.0 - i, 2.2 - i] for i, p in enumerate(bench.PROVIDERS)}


@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    results = tmp_path / "results"
    results.mkdir()
    monkeypatch.setattr(bench, "RESULTS", results)  # the committed tables' folder, here a temporary one
    monkeypatch.setattr(bench, "_spawn", fake_spawn)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_default_run_leaves_the_committed_results_alone(sandbox):
    assert bench.main(ARGS) == 0
    assert not list((sandbox / "results").iterdir())  # it overwrote benchmarks/results/cpu.{csv,md}
    assert (sandbox / "runs/bench/cpu.csv").is_file() and (sandbox / "runs/bench/cpu.md").is_file()
    assert "| smollm2-135m | 8 | fwd | torch |" in (sandbox / "runs/bench/cpu.md").read_text()


def test_publish_and_out(sandbox, capsys):
    assert bench.main([*ARGS, "--publish"]) == 0
    assert sorted(p.name for p in (sandbox / "results").iterdir()) == ["cpu.csv", "cpu.md"]
    assert bench.main([*ARGS, "--out", str(sandbox / "mine" / "x")]) == 0
    assert (sandbox / "mine" / "x.md").is_file()
    with pytest.raises(SystemExit):
        bench.main([*ARGS, "--out", "y", "--publish"])
    with pytest.raises(SystemExit):
        bench.main([*ARGS[:-2], "--repeats", "0"])


def test_help_shows_defaults(capsys):
    with pytest.raises(SystemExit):
        bench.main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: runs/bench/cpu)" in text and "(default: 3)" in text and "--publish" in text


@pytest.mark.parametrize("mode", bench.MODES)
def test_providers_agree_at_a_tiny_shape(mode):
    """The gate a real run applies, run for real at a tiny shape: every provider installed here (trl's fused head too,
    with the trl extra) agrees with the reference path on values and gradient norms, in every mode."""
    results = {p: bench._worker_mem(p, 16, 300, 12, mode) for p in bench.PROVIDERS}
    ref = results["reference"]["check"]
    assert (mode == "fwd") == ("gh_norm" not in ref)
    for p, r in results.items():
        assert bench._agree(r["check"], ref), (p, r["check"], ref)


def test_half_zero_mode_zeroes_every_other_row():
    import torch

    g1, g2 = torch.ones(6), torch.full((6,), 2.0)
    a, b = bench._upstream("fwd+bwd-half0", g1, g2)
    assert a.tolist() == [1, 0, 1, 0, 1, 0] and b.tolist() == [2, 0, 2, 0, 2, 0]
    assert bench._upstream("fwd+bwd", g1, g2) == (g1, g2)


def _spawn_recorder(monkeypatch):
    """fake_spawn, recording each call: what a refusal before any measuring must leave empty."""
    calls = []
    monkeypatch.setattr(bench, "_spawn", lambda *a: calls.append(a) or fake_spawn(*a))
    return calls


@pytest.mark.parametrize(("out", "words"), [("afile/x", "afile is a file, not a folder"),
                                            ("", "an empty path; expected a file")])  # fmt: skip
def test_an_unwritable_out_is_refused_before_any_measuring(sandbox, monkeypatch, capsys, out, words):
    (sandbox / "afile").write_text("x")
    calls = _spawn_recorder(monkeypatch)
    with pytest.raises(SystemExit) as exc:
        bench.main([*ARGS, "--out", out])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and f"--out {out}".strip() in err and words in err, err
    assert calls == [] and "Traceback" not in err
    assert sorted(p.name for p in sandbox.iterdir()) == ["afile", "results"]  # nothing written


def test_the_command_line_is_recorded_shell_quoted(sandbox):
    import shlex

    argv = [*ARGS, "--out", "my results/x"]  # a space: ' '.join would record two arguments
    assert bench.main(argv) == 0
    line = next(x for x in (sandbox / "my results/x.md").read_text().splitlines() if x.startswith("Command: "))
    assert shlex.split(line.removeprefix("Command: ")) == ["python", "-m", "benchmarks.bench_cpu", *argv]


def test_peak_rss_counts_what_the_block_allocates_not_what_was_resident_before():
    """benchmarks.common.PeakRSS (bench_cpu's and bench_truncated's memory figure): 64 MiB touched inside the block
    reads as ~64 MiB, whatever was allocated (and freed) before it."""
    import torch

    from benchmarks.common import PeakRSS

    before = torch.ones(48 * 2**20 // 4)  # 48 MiB, freed before the block: the reset high-water mark must forget it
    del before
    with PeakRSS() as peak:
        inside = torch.ones(64 * 2**20 // 4)
    assert 60 * 2**20 <= peak.extra <= 80 * 2**20, peak.extra / 2**20
    with PeakRSS() as idle:
        pass
    assert idle.extra < 8 * 2**20, idle.extra / 2**20
    del inside
