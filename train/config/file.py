"""`--config FILE`: a run's configuration from a YAML (or JSON) file, read into the same fields the flags set.

A file is a mapping of TrainConfig fields (`max_steps: 60`, `max-steps` works too), optionally `run_preset: NAME` and
`loss.FIELD: value` keys (the --loss.FIELD flags), or a run directory's own `config.json` (`{"train": {...}, "loss":
{...}, "world_size": N}`, what every run writes), whose --loss.FIELD overrides are recovered from its effective
LossConfig, so re-running a run is one command. Every value is checked as a flag's is; an unknown key is refused with
its name (and the closest field). Precedence: the dataclass default < the run preset < the file < a flag you type.

Torch-free unless the file is a run's config.json (recovering its loss overrides needs the RL layer)."""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
import re
import stat
from dataclasses import dataclass, field, fields
from pathlib import Path

from ..strict_json import dumps
from .fields import ConfigError, check_field, field_specs
from .train_config import RUN_PRESETS, TrainConfig, parse_flag_text

# Keys of a run's config.json "train" section that are actions of the invocation that wrote it, not configuration:
# re-running from the file starts a new run (add --resume or --overwrite to the command to say otherwise).
ACTIONS = ("resume", "overwrite")


class ConfigFileError(ValueError):
    """A refused config file: the message names the file, the key, the value and what is accepted."""


@dataclass
class ConfigFile:
    path: Path
    values: dict = field(default_factory=dict)  # TrainConfig field -> value (checked)
    loss_overrides: dict = field(default_factory=dict)  # LossConfig field -> value (the --loss.FIELD flags)
    run_preset: str | None = None
    record: bool = False  # a run's own config.json: every field as that run had it, not only what a user chose


# What a config file may be: a small, flat mapping. A file past these limits is refused (one line naming the file, the
# place and the limit) before anything is built from it: a YAML alias bomb or a 5000-digit number never expands.
MAX_BYTES = 1 << 20  # the file
MAX_DEPTH = 4  # nesting of mappings and lists (a run's config.json: 3)
MAX_ALIASES = 32  # YAML `*alias` uses, each of a scalar only (an alias of a list or mapping is refused)
MAX_NUMBER_CHARS = 64  # the text of one number


def _read_bytes(path: Path) -> bytes:
    """The file's bytes: a regular file of at most MAX_BYTES (a FIFO or device is refused, never waited on)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise ConfigFileError(f"--config {path}: cannot read it ({exc.strerror or exc})") from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise ConfigFileError(f"--config {path}: not a regular file; expected a YAML or JSON file")
        data = f.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise ConfigFileError(f"--config {path}: larger than {MAX_BYTES} bytes; a config file is a short mapping")
    return data


def _decode(path: Path, data: bytes) -> str:
    try:
        return data.decode("utf-8-sig")  # a byte-order mark, as editors on Windows write one, is read past
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise ConfigFileError(f"--config {path}: line {line}: not UTF-8 text ({exc.reason}); expected a UTF-8 YAML "
                              "or JSON file") from None  # fmt: skip


def _parse_json(path: Path, text: str) -> object:
    def pairs(items):
        out = {}
        for key, value in items:
            if key in out:
                raise ConfigFileError(f"--config {path}: key {key!r} given twice; give each key once")
            out[key] = value
        return out

    def number(kind):
        def parse(t: str):
            if len(t) > MAX_NUMBER_CHARS:
                raise ConfigFileError(f"--config {path}: a number of {len(t)} characters ({t[:12]}...); numbers of "
                                      f"at most {MAX_NUMBER_CHARS} characters are accepted")  # fmt: skip
            return kind(t)

        return parse

    def constant(name: str):
        raise ConfigFileError(f"--config {path}: {name} refused; expected finite numbers (strict JSON)")

    try:
        data = json.loads(text, object_pairs_hook=pairs, parse_int=number(int), parse_float=number(float),
                          parse_constant=constant)  # fmt: skip
    except json.JSONDecodeError as exc:
        raise ConfigFileError(f"--config {path}: not valid JSON ({exc.msg}, line {exc.lineno})") from None
    except RecursionError:
        raise ConfigFileError(f"--config {path}: nested deeper than {MAX_DEPTH} levels; expected a mapping of "
                              "fields") from None  # fmt: skip
    if _depth(data) > MAX_DEPTH:
        raise ConfigFileError(f"--config {path}: nested deeper than {MAX_DEPTH} levels; expected a mapping of fields")
    return data


def _depth(obj, level: int = 0) -> int:
    if level > MAX_DEPTH:
        return level
    if isinstance(obj, dict):
        return max((_depth(v, level + 1) for v in obj.values()), default=level + 1)
    if isinstance(obj, list):
        return max((_depth(v, level + 1) for v in obj), default=level + 1)
    return level


def _limited_loader(path: Path):
    """PyYAML's SafeLoader, composing within the limits: nesting, aliases (of scalars only), number length and
    duplicate keys are checked on the node graph, before any value is built."""
    import yaml

    def refuse(mark, what: str) -> ConfigFileError:
        return ConfigFileError(f"--config {path}: line {mark.line + 1}: {what}")

    numbers = ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")

    class Limited(yaml.SafeLoader):
        depth, aliases = 0, 0

        def compose_node(self, parent, index):
            if self.check_event(yaml.AliasEvent):
                event = self.peek_event()
                self.aliases += 1
                node = self.anchors.get(event.anchor)
                if node is not None and not isinstance(node, yaml.ScalarNode):
                    kind = "list" if isinstance(node, yaml.SequenceNode) else "mapping"
                    raise refuse(event.start_mark, f"alias *{event.anchor} stands for a {kind}; aliases of single "
                                 "values only are accepted")  # fmt: skip
                if self.aliases > MAX_ALIASES:
                    raise refuse(event.start_mark, f"more than {MAX_ALIASES} aliases (*name); write the values out")
                return super().compose_node(parent, index)
            self.depth += 1
            try:
                if self.depth > MAX_DEPTH + 1:
                    raise refuse(self.peek_event().start_mark, f"nested deeper than {MAX_DEPTH} levels; expected a "
                                 "mapping of fields")  # fmt: skip
                return super().compose_node(parent, index)
            finally:
                self.depth -= 1

        def compose_scalar_node(self, anchor):
            node = super().compose_scalar_node(anchor)
            if node.tag in numbers and len(node.value) > MAX_NUMBER_CHARS:
                raise refuse(node.start_mark, f"a number of {len(node.value)} characters ({node.value[:12]}...); "
                             f"numbers of at most {MAX_NUMBER_CHARS} characters are accepted")  # fmt: skip
            octal = node.tag == numbers[0] and re.fullmatch(r"[-+]?0[0-9_]+", node.value)
            if octal or (node.tag in numbers and ":" in node.value):  # YAML 1.1's; YAML 1.2 and JSON read neither
                kind = ("an octal number (YAML 1.1: 010 is 8): write it without its leading zeros" if octal
                        else "a base-60 number (YAML 1.1: 1:30 is 90): write it in decimal")  # fmt: skip
                raise refuse(node.start_mark, f"{node.value} is read as {kind}, or quote it as text")
            return node

        def compose_mapping_node(self, anchor):
            node = super().compose_mapping_node(anchor)
            seen = set()
            for key, _ in node.value:
                if isinstance(key, yaml.ScalarNode):
                    if key.value in seen:
                        raise refuse(key.start_mark, f"key {key.value[:80]!r} given twice; give each key once")
                    seen.add(key.value)
            return node

    return Limited


def _parse_text(path: Path) -> object:
    """The file's content (YAML, or JSON for a .json file), parsed within the limits above; ConfigFileError else."""
    text = _decode(path, _read_bytes(path))
    if path.suffix == ".json":
        return _parse_json(path, text)
    try:
        import yaml
    except ImportError:  # pragma: no cover -- pyyaml is in the [train] extra
        raise ConfigFileError(f"--config {path}: reading YAML needs PyYAML (pip install pyyaml), or use JSON") from None
    try:
        return yaml.load(text, Loader=_limited_loader(path))  # noqa: S506 -- a SafeLoader, with limits
    except ConfigFileError:
        raise
    except yaml.MarkedYAMLError as exc:  # a syntax error: where it is and what (a tab, an unclosed quote, ...)
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        what = "; ".join(x for x in (exc.problem, exc.context) if x) or type(exc).__name__
        raise ConfigFileError(f"--config {path}: {where}not valid YAML ({what})") from None
    except (yaml.YAMLError, ValueError, RecursionError) as exc:
        first = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        raise ConfigFileError(f"--config {path}: not valid YAML ({first})") from None


def _field_value(name: str, value, where: str):
    """A file's value for field `name`, checked as the flag's: text is parsed exactly as the flag parses it (YAML reads
    `5e-5` as text), an integer is accepted for a number, a number for a text field is its text (`difficulty: 3`),
    and 0 / 1 for a boolean field are false / true (the flag's 1/0)."""
    spec = field_specs(TrainConfig)[name]
    if not isinstance(value, str | int | float | bool | None):  # a list, a mapping, a date: never a field's value
        raise ConfigFileError(f"{where}: key {name!r}: {_show(value)} refused: expected {spec.expected()}")
    if isinstance(value, bool) and spec.kind is str:  # `use_vllm: off`: YAML 1.1 reads yes/no/on/off as booleans
        raise ConfigFileError(f"{where}: key {name!r}: {_show(value)} refused: expected {spec.expected()}; an unquoted "
                              f"on/off/yes/no is a boolean in YAML: quote the text ({name}: 'off')")  # fmt: skip
    if isinstance(value, int | float) and not isinstance(value, bool):
        if spec.kind is str:  # `difficulty: 3`: YAML and JSON read the number the flag gets as text
            value = str(value)
        elif spec.kind is bool and isinstance(value, int) and value in (0, 1):  # `progress: 1`: the flag's 1/0
            value = bool(value)
    try:
        if isinstance(value, str) and spec.kind is not str:
            return parse_flag_text(name, value)
        if spec.kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        check_field(name, value, TrainConfig)
    except (ConfigError, ValueError) as exc:
        detail = exc.detail if isinstance(exc, ConfigError) else str(exc)
        raise ConfigFileError(f"{where}: key {name!r}: {_show(value)} refused: {detail}") from None
    return value


def _show(value) -> str:
    """A value as a refusal shows it: short (a refusal never writes a long or nested value out)."""
    if isinstance(value, dict | list):
        return f"a {'mapping' if isinstance(value, dict) else 'list'} of {len(value)} item(s)"
    if not isinstance(value, str | int | float | bool | None):
        return f"a {type(value).__name__}"
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:60]}... ({len(text)} characters)"


def _loss_value(key: str, value, where: str):
    """A `loss.FIELD` value: text is read as the --loss.FIELD flag reads it (YAML reads `1e-3` as text)."""
    if key == "name":
        raise ConfigFileError(f"{where}: key 'loss.name' refused: the loss's name is the preset's label, not a "
                              "setting; choose the preset with `preset:` (and `loss:`)")  # fmt: skip
    if not isinstance(value, str):
        return value
    from sgrpo_kernels.rl.algorithm import parse_value  # (the flag's parser; torch-free)

    try:
        return parse_value(value)
    except ValueError as exc:
        raise ConfigFileError(f"{where}: key 'loss.{key}': {_show(value)} refused: {exc}") from None


def _unknown(key: str, where: str) -> ConfigFileError:
    names = [f.name for f in fields(TrainConfig)] + ["run_preset"]
    close = difflib.get_close_matches(key.replace("-", "_"), names, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return ConfigFileError(
        f"{where}: unknown key {key!r}{hint}; expected TrainConfig fields (python -m train --help), run_preset or "
        "loss.FIELD"
    )


def _loss_overrides_of(train: dict, loss: dict, where: str) -> dict:
    """The --loss.FIELD overrides a run had: the fields where its effective LossConfig (config.json's "loss") differs
    from the one its preset and `loss` string make."""
    cfg = TrainConfig(**train)
    base = json.loads(dumps(dataclasses.asdict(cfg.loss_config())))  # as config.json holds it (tuples as lists)
    unknown = sorted(set(loss) - set(base))
    if unknown:
        raise ConfigFileError(f'{where}: "loss" has unknown LossConfig field(s) {unknown}')
    return {k: v for k, v in loss.items() if base[k] != v and k != "name"}


def read_config_file(path: str | Path) -> ConfigFile:
    """Read and check `path` (see the module docstring). Raises ConfigFileError naming the file and the key."""
    path = Path(path).expanduser()  # `--config=~/run.yaml`: no shell expands a ~ after "="
    if not path.is_file():
        what = "is a folder, not a file" if path.is_dir() else "is not a regular file" if path.exists() else ""
        raise ConfigFileError(f"--config {path}: {what or 'no such file'}")
    data = _parse_text(path)
    where = f"--config {path}"
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigFileError(f"{where}: expected a mapping of fields (field: value), got a {type(data).__name__}")
    run_dir = "train" in data and isinstance(data["train"], dict)  # a run's own config.json
    out = ConfigFile(path, record=run_dir)
    if "train" in data and not run_dir:
        shape = '{"train": {"max_steps": 30, ...}, "loss": {...}}'
        raise ConfigFileError(f"{where}: key 'train': {_show(data['train'])} refused: a run's config.json holds "
                              f'"train": a mapping of fields ({shape})')  # fmt: skip
    if run_dir:
        extra = sorted(set(data) - {"train", "loss", "world_size"})
        if extra:
            raise _unknown(extra[0], where)
        items = {k: v for k, v in data["train"].items() if k not in ACTIONS}
    else:
        items = data
    names, seen = {f.name for f in fields(TrainConfig)}, {}
    for key, value in items.items():
        if not isinstance(key, str):
            raise _unknown(_show(key), where)
        name = {"data": "data_path"}.get(key.replace("-", "_"), key.replace("-", "_"))  # --data
        if name in seen:  # max-steps and max_steps, data and data_path: one setting written twice
            raise ConfigFileError(f"{where}: keys {seen[name]!r} and {key!r} both set {name}; give it once")
        seen[name] = key
        if name.startswith("loss."):
            out.loss_overrides[name[len("loss.") :]] = _loss_value(name[len("loss.") :], value, where)
        elif name == "run_preset":
            if not isinstance(value, str) or value not in RUN_PRESETS:
                raise ConfigFileError(f"{where}: key 'run_preset': {_show(value)} refused: expected one of "
                                      f"{', '.join(sorted(RUN_PRESETS))}")  # fmt: skip
            out.run_preset = value
        elif name in names:
            out.values[name] = _field_value(name, value, where)
        else:
            raise _unknown(key, where)
    if run_dir and isinstance(data.get("loss"), dict):
        try:
            out.loss_overrides = _loss_overrides_of(out.values, data["loss"], where)
        except ConfigError as exc:
            raise ConfigFileError(f"{where}: key {exc.field!r}: {exc}") from None
    return out


# the public name of the YAML/JSON reader (the study reads its own --config files with it)
read_config_text = _parse_text
