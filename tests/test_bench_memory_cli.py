"""benchmarks.memory_on_paper's command line: --out is checked before the report is built (a folder, an unwritable
place or an empty path is a one-line refusal naming it, exit 2, nothing written), and the default stays the committed
benchmarks/results/memory_on_paper.md."""

from __future__ import annotations

import pytest

from benchmarks import memory_on_paper as mp


@pytest.fixture
def tree(tmp_path, monkeypatch):
    (tmp_path / "adir").mkdir()
    (tmp_path / "afile").write_text("x")
    monkeypatch.setattr(mp, "RESULTS", tmp_path / "results")  # (a failing test cannot reach the repository's results)
    return tmp_path


@pytest.mark.parametrize(
    ("where", "words"),
    [
        ("adir", "is a folder; expected a file"),
        ("afile/m.md", "afile is a file, not a folder"),
        ("/proc/nope.md", "/proc is not a writable folder"),
        ("", "an empty path; expected a file to write"),
    ],
)
def test_an_unwritable_out_is_refused_before_the_report(tree, where, words, capsys):
    """Before: IsADirectoryError / FileNotFoundError / NotADirectoryError tracebacks after the report was built."""
    out = where if where.startswith("/") or not where else str(tree / where)
    with pytest.raises(SystemExit) as exc:
        mp.main(["--out", out])
    assert exc.value.code == 2
    got = capsys.readouterr()
    assert got.out == ""  # no report printed
    (line,) = [x for x in got.err.splitlines() if not x.startswith("usage:")]  # one line, no traceback
    assert line.startswith(f"{mp.COMMAND}: error: --out{' ' + out if out else ''}: ") and words in line, got.err
    assert sorted(p.name for p in tree.iterdir()) == ["adir", "afile"] and (tree / "afile").read_text() == "x"


def test_the_default_out_is_the_results_file(tree):
    assert mp.main([]) == 0
    assert (tree / "results" / "memory_on_paper.md").read_text() == mp.report()


def test_installed_the_default_out_is_the_scratch_folder_not_the_package(tree, monkeypatch, tmp_path):
    """From the wheel (sgrpo-bench memory) the default wrote into the installed package, inside site-packages."""
    scratch = tmp_path / "cwd" / "runs" / "bench"
    monkeypatch.setattr(mp, "installed", lambda: True)
    monkeypatch.setattr(mp, "scratch_dir", lambda: scratch)
    assert mp.main([]) == 0
    assert (scratch / "memory_on_paper.md").read_text() == mp.report()
    assert not (tree / "results" / "memory_on_paper.md").exists()
