"""benchmarks.common.out_error / check_out: a benchmark's output path is checked before any measuring (a run whose
results cannot be written was lost at its end, with a traceback)."""

from __future__ import annotations

import argparse

import pytest

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
