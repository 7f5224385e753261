"""benchmarks.bench_cpu writes to a scratch location by default; the committed tables only with --publish."""

from __future__ import annotations

import pytest

import benchmarks.bench_cpu as bench

ARGS = ["--models", "smollm2-135m", "--tokens", "8", "--modes", "fwd", "--repeats", "2", "--warmup", "0"]


def fake_spawn(kind, *args):
    """The workers' answers without running them (a real run takes minutes)."""
    if kind == "mem":
        return {"peak_extra_mb": 1.0, "check": {"logp_sum": 1.0, "ent_sum": 2.0}, "threads": 1}
    return {"reference": [2.0, 2.2], "torch": [1.0, 1.1]}


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
