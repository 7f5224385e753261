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
from dataclasses import dataclass, field, fields
from pathlib import Path

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


def _parse_text(path: Path) -> object:
    text = path.read_text()
    if path.suffix == ".json":
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigFileError(f"--config {path}: not valid JSON ({exc.msg}, line {exc.lineno})") from None
    try:
        import yaml
    except ImportError:  # pragma: no cover -- pyyaml is in the [train] extra
        raise ConfigFileError(f"--config {path}: reading YAML needs PyYAML (pip install pyyaml), or use JSON") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigFileError(f"--config {path}: not valid YAML ({first})") from None


def _field_value(name: str, value, where: str):
    """A file's value for field `name`, checked as the flag's: text is parsed exactly as the flag parses it (YAML reads
    `5e-5` as text), an integer is accepted for a number."""
    spec = field_specs(TrainConfig)[name]
    try:
        if isinstance(value, str) and spec.kind is not str:
            return parse_flag_text(name, value)
        if spec.kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        check_field(name, value, TrainConfig)
    except (ConfigError, ValueError) as exc:
        detail = exc.detail if isinstance(exc, ConfigError) else str(exc)
        raise ConfigFileError(f"{where}: key {name!r}: {value!r} refused: {detail}") from None
    return value


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
    from ..run.metrics import dumps

    cfg = TrainConfig(**train)
    base = json.loads(dumps(dataclasses.asdict(cfg.loss_config())))  # as config.json holds it (tuples as lists)
    unknown = sorted(set(loss) - set(base))
    if unknown:
        raise ConfigFileError(f'{where}: "loss" has unknown LossConfig field(s) {unknown}')
    return {k: v for k, v in loss.items() if base[k] != v and k != "name"}


def read_config_file(path: str | Path) -> ConfigFile:
    """Read and check `path` (see the module docstring). Raises ConfigFileError naming the file and the key."""
    path = Path(path)
    if not path.is_file():
        raise ConfigFileError(f"--config {path}: no such file")
    data = _parse_text(path)
    where = f"--config {path}"
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigFileError(f"{where}: expected a mapping of fields (field: value), got a {type(data).__name__}")
    out = ConfigFile(path)
    run_dir = "train" in data and isinstance(data["train"], dict)  # a run's own config.json
    if run_dir:
        extra = sorted(set(data) - {"train", "loss", "world_size"})
        if extra:
            raise _unknown(extra[0], where)
        items = {k: v for k, v in data["train"].items() if k not in ACTIONS}
    else:
        items = data
    names = {f.name for f in fields(TrainConfig)}
    for key, value in items.items():
        if not isinstance(key, str):
            raise _unknown(str(key), where)
        name = {"data": "data_path"}.get(key.replace("-", "_"), key.replace("-", "_"))  # --data
        if name.startswith("loss."):
            out.loss_overrides[name[len("loss.") :]] = value
        elif name == "run_preset":
            if value not in RUN_PRESETS:
                raise ConfigFileError(f"{where}: key 'run_preset': {value!r} refused: expected one of "
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
