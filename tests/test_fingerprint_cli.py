"""benchmarks/fingerprint.py's command line refuses what would fail, before any case runs (an adversarial review's
findings): an --out that cannot be written and a --check that cannot be read (found only after every case ran: a
whole run's results lost to a traceback), --jobs below 1 (a ValueError traceback), an empty --cases (ran every
case). Parsing only: `run_case` is replaced, so no case runs here."""

from __future__ import annotations

import json

import pytest

import benchmarks.fingerprint as fp


@pytest.fixture
def ran(monkeypatch):
    """The cases main() would have run (none runs)."""
    names = []
    monkeypatch.setattr(fp, "run_case", lambda name, flags, scratch: names.append(name) or {"steps": "x"})
    return names


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1, err
    return err


def test_bad_out_and_check_are_refused_before_any_case(ran, tmp_path, capsys):
    missing = tmp_path / "missing.json"
    argv = ["--cases", "seed1", "--jobs", "1", "--out", "/proc/nope/fp.json", "--check", str(missing)]
    assert fp.main(argv) == 2
    assert ran == []
    err = _one_line_error(capsys)
    assert "--out /proc/nope/fp.json: /proc/nope is not a writable directory" in err
    assert f"--check {missing}: cannot be read (No such file or directory)" in err


@pytest.mark.parametrize("content, why", [("{", "not JSON"), ("[1]", "not a fingerprint"), ('{"a": 1}', "not a")])
def test_a_check_that_is_no_fingerprint_is_refused_before_any_case(ran, tmp_path, capsys, content, why):
    ref = tmp_path / "ref.json"
    ref.write_text(content)
    assert fp.main(["--cases", "seed1", "--check", str(ref)]) == 2
    assert ran == []
    assert f"--check {ref}: {why}" in _one_line_error(capsys)


def test_out_that_is_a_folder_is_refused(ran, tmp_path, capsys):
    assert fp.main(["--cases", "seed1", "--out", str(tmp_path)]) == 2
    assert ran == [] and f"--out {tmp_path}: not a writable file" in _one_line_error(capsys)


@pytest.mark.parametrize("jobs", ["0", "-1", "two"])
def test_jobs_below_one_is_refused_at_parse_time(ran, capsys, jobs):
    with pytest.raises(SystemExit) as exit_:
        fp.main(["--cases", "seed1", "--jobs", jobs])
    assert exit_.value.code == 2 and ran == []
    assert "argument --jobs: expected a whole number >= 1" in capsys.readouterr().err


@pytest.mark.parametrize("cases", ["", ","])
def test_empty_cases_is_refused(ran, capsys, cases):
    with pytest.raises(SystemExit) as exit_:
        fp.main(["--cases", cases])
    assert exit_.value.code == 2 and ran == []
    assert "--cases: empty" in capsys.readouterr().err


def test_good_paths_still_run_and_compare(ran, tmp_path, capsys):
    """With run_case replaced: the chosen case "runs", --out is written and --check compared."""
    ref, out = tmp_path / "ref.json", tmp_path / "out.json"
    ref.write_text(json.dumps({"seed1": {"steps": "x"}}))
    assert fp.main(["--cases", "seed1", "--jobs", "1", "--out", str(out), "--check", str(ref)]) == 0
    assert ran == ["seed1"] and json.loads(out.read_text()) == {"seed1": {"steps": "x"}}
    assert "1 of 1 cases identical" in capsys.readouterr().out
