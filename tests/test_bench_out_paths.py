"""benchmarks.common.out_error / check_out: a benchmark's output path is checked before any measuring (a run whose
results cannot be written was lost at its end, with a traceback); and where the GPU scripts write when --out is not
given."""

from __future__ import annotations

import argparse

import pytest

from benchmarks import bench_gpu, common, profile_gpu
from benchmarks.common import check_out, out_error


@pytest.fixture
def tree(tmp_path):
    (tmp_path / "afile").write_text("x")
    (tmp_path / "adir").mkdir()
    return tmp_path


@pytest.mark.parametrize(
    ("rel", "kind", "words"),
    [
        ("adir", "file", "is a folder; expected a file"),
        ("adir", "stem", "expected a file name (suffixes are added)"),
        ("afile", "dir", "exists and is not a folder"),
        ("afile/x.md", "file", "afile is a file, not a folder"),
        ("afile/sub/x", "dir", "afile is a file, not a folder"),
    ],
)
def test_a_path_that_cannot_be_written_is_named(tree, rel, kind, words):
    err = out_error("--out", tree / rel, kind)
    assert err is not None and err.startswith(f"--out {tree / rel}: ") and words in err, err


@pytest.mark.parametrize(("rel", "kind"), [("new/deeper/x.md", "file"), ("new/dir", "dir"), ("adir", "dir"),
                                           ("afile", "file"), ("adir/stem", "stem")])  # fmt: skip
def test_a_writable_path_passes_and_nothing_is_made(tree, rel, kind):
    assert out_error("--out", tree / rel, kind) is None
    assert not (tree / "new").exists()


def test_empty_and_unwritable_paths_are_refused():
    assert out_error("--out", "") == "--out: an empty path; expected a file to write"
    assert "/proc is not a writable folder" in out_error("--out", "/proc/nope.md")  # (root may write anywhere else)


def test_check_out_exits_2_naming_the_flag(tree, capsys):
    ap = argparse.ArgumentParser(prog="bench")
    check_out(ap, "--csv", None)  # not given: nothing to check
    with pytest.raises(SystemExit) as exc:
        check_out(ap, "--csv", tree / "adir")
    assert exc.value.code == 2 and "--csv" in capsys.readouterr().err


# -------------------------------------------------------------- where bench_gpu and profile_gpu write without --out

# (script, its arguments for a tiny CPU smoke run, what that run writes to the scratch folder, words its table holds)
SMOKE_RUNS = [
    (bench_gpu, ["--shapes", "4x8x16", "--providers", "reference", "--modes", "fwd"], ("gpu_smoke.md", "gpu_smoke.csv"),
     "reference"),
    (profile_gpu, ["--backend", "torch", "--shape", "4x8x16", "--mode", "fwd"], ("profile_gpu_smoke.md",),
     "M=4 D=8 V=16"),
]  # fmt: skip
TINY_CPU = ["--device", "cpu", "--dtype", "float32", "--repeats", "1", "--warmup", "0"]


@pytest.mark.parametrize(("script", "argv", "names", "words"), SMOKE_RUNS, ids=["bench_gpu", "profile_gpu"])
def test_a_cpu_smoke_run_without_out_writes_to_scratch_not_results(script, argv, names, words, tmp_path, monkeypatch):
    """Before: `--device cpu` without --out overwrote the committed benchmarks/results/gpu.{csv,md,png} (bench_gpu)
    and benchmarks/results/profile_gpu.md (profile_gpu)."""
    results, scratch = tmp_path / "results", tmp_path / "scratch"
    monkeypatch.setattr(common, "RESULTS", results)  # (a failing run cannot reach the repository's results)
    monkeypatch.setattr(common, "scratch_dir", lambda: scratch)
    assert script.main([*TINY_CPU, *argv]) == 0
    assert not results.exists(), sorted(p.name for p in results.iterdir())
    assert words in (scratch / names[0]).read_text() and all((scratch / n).is_file() for n in names)


@pytest.mark.parametrize(("script", "argv", "names", "words"), SMOKE_RUNS, ids=["bench_gpu", "profile_gpu"])
def test_installed_a_cuda_run_defaults_to_scratch_not_the_package(script, argv, names, words, tmp_path, monkeypatch,
                                                                   capsys):  # fmt: skip
    """From the wheel (sgrpo-bench gpu / profile) RESULTS is inside site-packages: the default goes to the scratch
    folder. A folder in the scratch default's way shows which default was taken, without a GPU."""
    monkeypatch.setattr(common, "RESULTS", tmp_path / "package")
    monkeypatch.setattr(common, "installed", lambda: True)
    monkeypatch.setattr(common, "scratch_dir", lambda: tmp_path / "scratch")
    (tmp_path / "scratch" / names[0]).mkdir(parents=True)

    def refuse(*args, **kwargs):
        pytest.fail(f"{script.__name__} measured before refusing its --out")

    monkeypatch.setattr(script, "lm_head_inputs", refuse)
    with pytest.raises(SystemExit) as exc:
        script.main(argv)  # no --device: cuda, the default
    assert exc.value.code == 2
    assert f"--out {tmp_path / 'scratch' / names[0]}: is a folder" in capsys.readouterr().err
