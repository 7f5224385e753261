"""How a configuration field declares what it accepts and what it means, once, beside the field:

    lr: float = option(5e-5, "AdamW peak learning rate", Range(gt=0, le=1))

`option` keeps the help text and the checks (`Range`, `OneOf`, `Check`) in the dataclass field's metadata;
`check_field` checks a value against them (its type first), and the CLI builds each flag, its help and its parser from
the same declaration. A field declared without `option` is checked against its type only. Torch-free: `--help` stays
fast."""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, fields


@dataclass(frozen=True)
class Range:
    """A finite number within the bounds given (ge / gt: lower, le / lt: upper); nan and inf are always refused."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None

    def check(self, value) -> None:
        ok = math.isfinite(value)
        ok = ok and (self.ge is None or value >= self.ge) and (self.gt is None or value > self.gt)
        ok = ok and (self.le is None or value <= self.le) and (self.lt is None or value < self.lt)
        if not ok:
            raise ValueError(self.describe())

    def describe(self) -> str:
        lo = f"{self.ge} <= " if self.ge is not None else f"{self.gt} < " if self.gt is not None else ""
        hi = f" <= {self.le}" if self.le is not None else f" < {self.lt}" if self.lt is not None else ""
        if lo and hi:
            return f"{lo}x{hi}"
        if lo:
            return f">= {self.ge}" if self.ge is not None else f"> {self.gt}"
        return hi.strip()


@dataclass(frozen=True)
class OneOf:
    """One of a fixed set of values."""

    choices: tuple

    def __init__(self, *choices) -> None:
        object.__setattr__(self, "choices", choices)

    def check(self, value) -> None:
        if value not in self.choices:
            raise ValueError(self.describe())

    def describe(self) -> str:
        return "one of " + ", ".join("none" if c is None else str(c) for c in self.choices)


@dataclass(frozen=True)
class Check:
    """A custom check: `fn(value)` raises ValueError (its message says what is wrong) for a refused value."""

    fn: Callable[[object], object]
    text: str  # what is accepted, for --help

    def check(self, value) -> None:
        if value is not None:
            self.fn(value)

    def describe(self) -> str:
        return self.text


def option(default, help: str, *checks) -> dataclasses.Field:
    """A dataclass field with its default, its one-line help (the `--help` text) and what it accepts."""
    return dataclasses.field(default=default, metadata={"help": help, "checks": checks})


class ConfigError(ValueError):
    """A refused TrainConfig value: `field` names the field (the CLI names its flag), `detail` says why without
    repeating the field's name and value."""

    def __init__(self, field: str, message: str, detail: str | None = None):
        super().__init__(message)
        self.field, self.detail = field, detail or message


@dataclass(frozen=True)
class FieldSpec:
    kind: type  # bool, int, float or str
    optional: bool  # None accepted
    checks: tuple  # Range / OneOf / Check declarations
    help: str = ""  # the one-line description (--help)

    def expected(self) -> str:
        """What the field accepts, in words: 'integer >= 1', 'number with 0 < x <= 1', 'one of a, b'."""
        kind = {bool: "true/false, 1/0, yes/no or on/off", int: "integer", float: "number", str: "text"}[self.kind]
        parts = []
        for c in self.checks:
            text = c.describe()
            if isinstance(c, Range):
                text = f"{kind} {text}" if text[:1] in "<>" else f"{kind} with {text}" if text else kind
            parts.append(text)
        text = " and ".join(parts) or kind
        if self.optional and not any(isinstance(c, OneOf) for c in self.checks):
            text += " or none"
        return text


@functools.cache
def field_specs(cls: type) -> dict[str, FieldSpec]:
    """Each field's FieldSpec: its type from the annotation, its help and checks from `option`'s metadata."""
    hints = typing.get_type_hints(cls)
    out = {}
    for f in fields(cls):
        hint = hints[f.name]
        args = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
        kinds = [a for a in args if a is not type(None)]
        kind = kinds[0] if len(kinds) == 1 else str
        checks, text = tuple(f.metadata.get("checks", ())), f.metadata.get("help", "")
        out[f.name] = FieldSpec(kind, type(None) in args, checks, text)
    return out


def check_field(name: str, value, cls: type) -> None:
    """Raise ConfigError when `value` is not what field `name` accepts (its type, then its declared checks)."""
    spec = field_specs(cls)[name]
    if value is None and spec.optional:
        ok_type = True
    elif spec.kind is bool:
        ok_type = isinstance(value, bool)
    elif spec.kind is int:
        ok_type = isinstance(value, int) and not isinstance(value, bool)
    elif spec.kind is float:
        ok_type = isinstance(value, (int, float)) and not isinstance(value, bool)
    else:
        ok_type = isinstance(value, spec.kind)
    expected = f"expected {spec.expected()}" + (" (finite)" if spec.kind is float else "")
    prefix = f"{name}={value!r}: "
    if not ok_type:
        if spec.kind is bool:  # (a Python value: the text forms are the command line's and a config file's)
            expected = "expected True or False (a bool; the command line and a config file also take true/false, "
            expected += "1/0, yes/no, on/off)"
        raise ConfigError(name, prefix + expected, expected)
    if spec.kind is float and value is not None and not math.isfinite(value):  # with or without a declared range
        raise ConfigError(name, prefix + expected, expected)
    for c in spec.checks:
        if value is None and not isinstance(c, OneOf):
            continue
        try:
            c.check(value)
        except ValueError as exc:
            detail = str(exc).removeprefix(prefix) if isinstance(c, Check) else expected
            raise ConfigError(name, prefix + detail, detail) from None
