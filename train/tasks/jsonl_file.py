"""Reading a JSON Lines data file (`--data-path`): its bytes to (line number, row) pairs, each way a file can be
unusable refused naming the file, the line and what is expected (train/tasks/jsonl.py builds the tasks from the
rows)."""

from __future__ import annotations

import codecs
import json
from pathlib import Path

JSONL_EXPECTED = (
    "expected JSON Lines: one JSON object per line with a question (one of question/problem/prompt) and an answer "
    '(answer/solution), e.g. {"question": "What is 2 + 3?", "answer": "5"}'
)


class _DuplicateKey(Exception):
    """A JSON object of a data line names a key twice (the message: the key)."""


def _unique_keys(pairs: list[tuple[str, object]]) -> dict:
    """json's object_pairs_hook: the object as a dict (the same dict json makes), refusing a key given twice, which
    json would silently resolve to its last value."""
    row = dict(pairs)
    if len(row) < len(pairs):
        seen = set()
        raise _DuplicateKey(next(k for k, _ in pairs if k in seen or seen.add(k)))
    return row


def _unencodable(value) -> str | None:
    """The first string (a key or a value, at any depth) of a parsed JSON value that UTF-8 cannot encode, else None."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return item
    return None


def _wide_text(data: bytes) -> int | None:
    """32 or 16 when `data` is UTF-32 / UTF-16 text (a byte-order mark, or ASCII's zero bytes in its first 4), else
    None (it was refused as "a NUL byte: a binary file")."""
    if data.startswith((codecs.BOM_UTF32_LE, codecs.BOM_UTF32_BE)):
        return 32
    if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        return 16
    head = data[:4]
    if len(head) == 4 and head.count(0) == 3:
        return 32
    return 16 if len(head) == 4 and (head[0] == head[2] == 0 or head[1] == head[3] == 0) else None


def read_jsonl(path: str | Path) -> list[tuple[int, dict]]:
    """(line number, row) of every non-blank line of a JSON Lines file (a UTF-8 byte-order mark is read past). A file
    that is not UTF-8 text, a line that is not JSON, an object with a key given twice (at any depth), a row that is
    not an object, or a string with a lone surrogate ("\\ud800") raises ValueError naming the file, the line and what
    was expected."""
    data = Path(path).read_bytes()
    wide = _wide_text(data)
    if wide is not None:
        raise ValueError(f"{path}: UTF-{wide} text (from its first bytes); save it as UTF-8; {JSONL_EXPECTED}")
    if b"\x00" in data:
        line = data[: data.index(b"\x00")].count(b"\n") + 1
        raise ValueError(f"{path}: line {line}: a NUL byte: a binary file, not text; {JSONL_EXPECTED}")
    data = data.removeprefix(codecs.BOM_UTF8)  # a byte-order mark is read past, as config files are
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise ValueError(f"{path}: line {line}: not UTF-8 text ({exc.reason}); {JSONL_EXPECTED}") from None
    rows = []
    for number, line in enumerate(text.split("\n"), 1):  # not splitlines: JSON text may hold U+2028, U+0085 raw
        if not line.strip():
            continue
        try:
            row = json.loads(line, object_pairs_hook=_unique_keys)
        except _DuplicateKey as exc:
            raise ValueError(
                f"{path}: line {number}: key {exc.args[0]!r} given twice (JSON would keep only the last value); "
                f"remove one; {JSONL_EXPECTED}"
            ) from None
        except json.JSONDecodeError as exc:
            raise ValueError(
                f"{path}: line {number}: not valid JSON ({exc.msg}, column {exc.colno}); {JSONL_EXPECTED}"
            ) from None
        except (ValueError, RecursionError) as exc:  # a number past Python's digit limit, nesting past the stack's
            why = "nested too deeply" if isinstance(exc, RecursionError) else str(exc).split(";")[0][:120]
            raise ValueError(f"{path}: line {number}: not usable JSON ({why}); {JSONL_EXPECTED}") from None
        if not isinstance(row, dict):
            raise ValueError(f"{path}: line {number}: a JSON {type(row).__name__}, not an object; {JSONL_EXPECTED}")
        bad = _unencodable(row)
        if bad is not None:  # "\\ud800": a \\u escape of half a UTF-16 pair (JSON reads it; UTF-8 cannot encode it)
            raise ValueError(
                f"{path}: line {number}: the text {bad[:60]!r} holds a lone surrogate (a \\u escape of half a UTF-16 "
                f"pair), which is not a character and cannot be tokenized; write the character itself, or both "
                f"halves of its pair; {JSONL_EXPECTED}"
            )
        rows.append((number, row))
    return rows
