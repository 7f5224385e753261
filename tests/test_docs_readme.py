"""The README's Usage snippet runs as written and prints what its comments say."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def _usage_block() -> str:
    text = README.read_text()
    start = text.index("<!-- usage-snippet")
    return re.search(r"```python\n(.*?)```", text[start:], re.S).group(1)


def test_usage_snippet_runs_and_prints_its_comments():
    code = _usage_block()
    expected = [line.split("# ")[1].split(":")[0].strip() for line in code.splitlines() if line.startswith("print(")]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README.md usage snippet", "exec"), {})  # noqa: S102 -- the project's own README
    assert out.getvalue().splitlines() == expected
