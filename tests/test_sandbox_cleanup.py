"""The sandbox removes whatever a program left in its working directory (sgrpo_sandbox/host.py, rmtree), and never
raises into the trainer: shutil.rmtree recursed once per level, so 3,000 nested folders (where the sandbox has no
mount namespace of its own: not root, or root without CAP_SYS_ADMIN) were a RecursionError out of run_python and a
leaked folder; its fallback's chmod followed links to folders outside."""

from __future__ import annotations

import os

from sgrpo_sandbox import host


def test_a_deep_tree_with_links_and_locked_folders_is_removed(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir(mode=0o755)
    (outside / "keep").write_text("x")
    work = tmp_path / "work"
    work.mkdir()
    cwd = os.getcwd()
    try:
        os.chdir(work)
        for i in range(3000):  # deeper than the recursion limit, and past PATH_MAX (4096) as a path
            os.mkdir("a")
            os.chdir("a")
            if i % 700 == 0:
                with open("f", "w") as f:
                    f.write("y")
                os.symlink(outside, "to_outside")
                os.mkdir("locked")
                with open("locked/z", "w") as f:
                    f.write("z")
                os.chmod("locked", 0)
    finally:
        os.chdir(cwd)
    host.rmtree(str(work))
    assert not work.exists()
    assert [p.name for p in outside.iterdir()] == ["keep"] and oct(outside.stat().st_mode & 0o777) == "0o755"


def test_what_cannot_be_removed_is_said_not_raised(tmp_path, capsys, monkeypatch):
    work = tmp_path / "work"
    (work / "sub").mkdir(parents=True)

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(host.os, "rmdir", refuse)
    host.rmtree(str(work))  # no exception
    assert "the sandbox could not remove" in capsys.readouterr().err
    host.rmtree(str(tmp_path / "never-made"))  # a folder already gone: nothing to say
    assert capsys.readouterr().err == ""
