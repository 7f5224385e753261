"""The command line of `python -m train`, built from `TrainConfig`'s declarations (train_config.py): every field is a
`--flag` (shown with dashes; `--max_steps` works too) with its help, default and accepted values; every field of the
RL layer's `LossConfig` is a `--loss.FIELD` flag that overrides the chosen preset. Each value is checked as it is
parsed; a refusal names the flag, the value and what is accepted. Imports neither torch nor the package until a
loss override is parsed: `--help` stays fast."""

from __future__ import annotations

import argparse
import ast
import functools
import importlib.util
import re
import sys
from dataclasses import fields
from pathlib import Path

from .fields import ConfigError, OneOf, field_specs
from .inert import inert_warnings
from .train_config import RUN_PRESETS, TrainConfig, parse_flag_text


def _parse_value(text: str):
    """Loss-config values, as the RL layer reads them (sgrpo_kernels.rl.parse_value)."""
    from sgrpo_kernels.rl.algorithm import parse_value

    return parse_value(text)


def _cli_type(name: str):
    """The argparse `type` of field `name`: text -> value, checked against the field's declaration. A refused value
    is an argparse error naming the flag, the value and what is accepted."""
    spec = field_specs(TrainConfig)[name]

    def parse(text: str):
        try:
            return parse_flag_text(name, text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"{text!r} refused: {exc}") from None

    parse.__name__ = spec.kind.__name__  # argparse's "invalid <name> value" wording, if it ever shows
    return parse


def _flag_default(name: str, default) -> str:
    def show(v) -> str:
        if isinstance(v, bool):
            return str(v).lower()
        return "none" if v is None else repr(v) if isinstance(v, str) else str(v)

    base = show(RUN_PRESETS["default"].get(name, default))
    others = [f"{p}: {show(v[name])}" for p, v in RUN_PRESETS.items() if p != "default" and name in v]
    return base + (f" (--run-preset {', '.join(others)})" if others else "")


def _help(text: str) -> str:
    return text.replace("%", "%%")


@functools.cache
def loss_fields() -> tuple[tuple[str, str, str], ...]:
    """(name, type, description) of every LossConfig field, read from the RL layer's source with `ast` (importing it
    would import torch: --help must stay fast); the description is the field's entry in the LossConfig docstring.
    Falls back to importing LossConfig when the source is not on disk."""
    spec = importlib.util.find_spec("sgrpo_kernels")
    source = None
    if spec is not None and spec.submodule_search_locations:
        path = Path(list(spec.submodule_search_locations)[0]) / "rl" / "config.py"
        source = path.read_text() if path.is_file() else None
    if source is None:  # pragma: no cover -- a zipped install
        from sgrpo_kernels.rl import LossConfig

        return tuple((f.name, str(f.type), "") for f in fields(LossConfig) if f.name != "name")
    cls = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == "LossConfig")
    names = {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    entries: dict[str, str] = {}
    current: list[str] = []
    for line in (ast.get_docstring(cls) or "").splitlines():
        m = re.match(r"^ {4}([a-z_]+(?:\s*/\s*[a-z_]+)*): (.*)$", line)
        if m and {x.strip() for x in m.group(1).split("/")} <= names:  # "    field / field: text"
            current = [x.strip() for x in m.group(1).split("/")]
            for name in current:
                entries[name] = m.group(2)
        elif current and line.startswith(" " * 4):  # the entry's next line
            for name in current:
                entries[name] += " " + line.strip()
        else:
            current = []
    out = []
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id != "name":
            out.append((node.target.id, ast.unparse(node.annotation), _first_sentence(entries.get(node.target.id, ""))))
    return tuple(out)


def _first_sentence(text: str) -> str:
    """The first sentence of a docstring entry, without reST markup (:func:`~a.b.f` -> f, ``x`` -> x)."""
    text = re.sub(r":\w+:`~?(?:[\w.]+\.)?([^`]+)`", r"\1", text).replace("``", "")
    return re.split(r"(?<=[a-z)][a-z)]\.)\s+(?=[A-Z])", text.strip())[0].rstrip(".")  # not after "Dr."


ALIASES = {"--data": "--data-path"}  # other spellings of a field's flag (refusals name the field's own flag)


class _JoinAction(argparse.Action):
    """A flag that may be given more than once: the values joined with commas (each one checked as it is parsed)."""

    def __call__(self, parser, namespace, values, option_string=None):
        before = getattr(namespace, self.dest, None)
        setattr(namespace, self.dest, values if before in (None, self.default) else f"{before},{values}")


USAGE = "%(prog)s [--config FILE] [--run-preset NAME] [--FLAG VALUE ...] [--loss.FIELD VALUE ...]"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sgrpo-train" if Path(sys.argv[0]).name == "sgrpo-train" else f"python -m {__package__.split('.')[0]}",
        usage=USAGE,
        description="GRPO-family RL (S-GRPO, GTPO, GRPO, ...) of a causal LM on verifiable tasks. Every TrainConfig "
        "field is a flag (train/config/; --max_steps works like --max-steps). Numbers must be finite. Precedence: "
        "a flag you type > --config FILE > --run-preset > the dataclass default.",
        formatter_class=lambda prog: argparse.HelpFormatter(prog, max_help_position=30),
        allow_abbrev=False,
    )
    parser.add_argument(
        "--run-preset",
        default="default",
        choices=sorted(RUN_PRESETS),
        help="named sizes applied before the other flags: default (the default job, docs/trainer.md: the defaults "
        "below), smoke (2 tiny steps), gpu [default: default]",
    )
    parser.add_argument(
        "--config",
        metavar="FILE",
        help="a YAML or JSON file of fields (max_steps: 60, loss.beta: 0.1, run_preset: smoke), or a run's own "
        "OUTPUT_DIR/config.json; flags you type override it; unknown keys are refused [default: none; with --resume, "
        "OUTPUT_DIR/config.json]",
    )
    specs = field_specs(TrainConfig)
    for f in fields(TrainConfig):
        spec = specs[f.name]
        kwargs = {"default": f.default, "type": _cli_type(f.name), "dest": f.name}
        accepted = "" if spec.kind is str and not spec.checks else f"; accepts {spec.expected()}"
        if spec.kind is bool:
            kwargs |= {"nargs": "?", "const": True, "metavar": "BOOL"}
            accepted = f"; accepts {spec.expected()}; the bare flag means true"
        else:
            kwargs["metavar"] = {int: "N", float: "X", str: "TEXT"}[spec.kind]
            for c in spec.checks:
                if isinstance(c, OneOf):
                    short = None not in c.choices and len(",".join(c.choices)) <= 24
                    kwargs["metavar"] = "{" + ",".join(c.choices) + "}" if short else "NAME"
        kwargs["help"] = _help(f"{spec.help or f.name} [default: {_flag_default(f.name, f.default)}{accepted}]")
        if f.name == "reward":  # given again: one more function (the field holds them comma-separated)
            kwargs["action"] = _JoinAction
        parser.add_argument("--" + f.name.replace("_", "-"), **kwargs)
    loss_group = parser.add_argument_group(
        "loss overrides",
        "--loss.FIELD VALUE overrides one LossConfig field of the chosen --preset [default: the preset's value, after "
        "--loss]; values are JSON (0.1, true, null) or text. Fields: the LossConfig docstring, docs/rl.md.",
    )
    for name, annotation, doc in loss_fields():
        text = f"{doc} " if doc else ""
        loss_group.add_argument(
            f"--loss.{name}",
            dest=f"loss.{name}",
            type=_parse_value,
            default=None,
            metavar="V",
            help=_help(f"{text}[{annotation.replace(' | ', ' or ').replace('None', 'null')}]"),
        )
    return parser


def _normalize(argv: list[str]) -> list[str]:
    """The other spelling of a flag: --max_steps -> --max-steps, --loss.epsilon-low -> --loss.epsilon_low, --data ->
    --data-path."""
    out = []
    for arg in argv:
        if arg.startswith("--") and len(arg) > 2:
            name, eq, value = arg.partition("=")
            if name.startswith("--loss."):
                name = "--loss." + name[len("--loss.") :].replace("-", "_")
            else:
                name = "--" + name[2:].replace("_", "-")
                name = ALIASES.get(name, name)
            arg = name + eq + value
        out.append(arg)
    return out


def _explicit_flags(argv: list[str]) -> set[str]:
    """The dests the user actually typed, even when the value typed equals the default (`--time-budget-s 0` must
    beat a run preset's 480): a second parse in which no option has a default."""
    quiet = build_parser()
    for action in quiet._actions:
        action.default = argparse.SUPPRESS
    return set(vars(quiet.parse_args(argv)))


def _flag_of(field: str) -> str:
    return "--" + field.replace("_", "-")


def _config_file(parser: argparse.ArgumentParser, path: str | None, typed: dict):
    """The --config file, read and checked; with --resume and no --config, the run's own OUTPUT_DIR/config.json (so a
    resume needs no flag typed again; flags that are typed again are checked against the checkpoint as always)."""
    from .file import ConfigFileError, read_config_file

    implicit = path is None and typed.get("resume")
    if implicit:
        own = Path(typed.get("output_dir", TrainConfig.output_dir)).expanduser() / "config.json"  # (as train() does)
        path = str(own) if own.is_file() else None
    if path is None:
        return None
    try:
        return read_config_file(path)
    except ConfigFileError as exc:  # (with --resume alone the file is the run's own, not one the user named)
        parser.error(str(exc).replace(f"--config {path}", f"--resume: the run's {path}", 1) if implicit else str(exc))


def _given(typed: dict, file) -> dict[str, str]:
    """The fields the user gave, and where ("" typed, else the --config file): the flags typed and a hand-written
    file's keys. A run's own config.json (a --resume reads it without --config) records every field of that run,
    its run preset's included, so its values are not taken as given: the run that wrote it warned about its own."""
    from_file = file.values if file is not None and not file.record else {}
    return {name: f"--config {file.path}" for name in from_file} | dict.fromkeys(typed, "")


def parse_args(argv: list[str] | None = None, *, warn: bool = False) -> tuple[TrainConfig, dict]:
    """CLI -> (TrainConfig, LossConfig overrides). Precedence: dataclass default < --run-preset < --config file <
    explicit flag. Every refusal is an argparse error (exit status 2) naming the flag (or the file's key). `warn`
    (`python -m train`): print a line on stderr for each field given that does nothing in this combination (inert.py);
    off for callers that only check a configuration (the study), so that its runs' own logs say it once."""
    argv = _normalize(list(sys.argv[1:] if argv is None else argv))
    parser = build_parser()
    args = parser.parse_args(argv)
    once = {"--config": "give one file (flags typed after it override it)",
            "--loss": "give one, its fields comma-separated (--loss 'a=1,b=2'), or --loss.FIELD flags"}  # fmt: skip
    for flag, fix in once.items():
        if sum(a == flag or a.startswith(flag + "=") for a in argv) > 1:  # argparse would keep the last silently
            parser.error(f"argument {flag}: given more than once; {fix}")
    explicit = _explicit_flags(argv)
    typed = {f.name: getattr(args, f.name) for f in fields(TrainConfig) if f.name in explicit}
    file = _config_file(parser, args.config, typed)
    preset = args.run_preset if "run_preset" in explicit or file is None else file.run_preset or "default"
    base = {f.name: f.default for f in fields(TrainConfig)} | RUN_PRESETS[preset]
    values = base | (file.values if file is not None else {}) | typed
    overrides = dict(file.loss_overrides) if file is not None else {}
    flagged = {k.split(".", 1)[1]: v for k, v in vars(args).items() if k.startswith("loss.") and v is not None}
    overrides |= flagged
    try:
        cfg = TrainConfig(**values)
    except ConfigError as exc:
        where = _flag_of(exc.field) if exc.field in typed or file is None else f"{exc.field} (--config {file.path})"
        parser.error(f"argument {where}: {exc}")
    if cfg.report_to != "none" and importlib.util.find_spec(cfg.report_to) is None:
        name = cfg.report_to
        parser.error(f"argument --report-to: {name!r} needs the {name} package: pip install {name} (the {name} extra)")
    if cfg.reward:  # the functions imported and their signatures checked now (their values: before training)
        from ..rewards import RewardError, RewardFunctions

        try:
            RewardFunctions(cfg.reward)
        except RewardError as exc:
            where = "--reward" if "reward" in typed or file is None else f"reward (--config {file.path})"
            parser.error(f"argument {where}: {exc}")
    try:
        cfg.loss_config(overrides)  # the --loss.FIELD values, with the RL layer's messages
    except (TypeError, ValueError) as exc:
        head = str(exc).split("expected", 1)[0]  # (an unknown field's message goes on with every known name)
        named = [k for k in overrides if f"LossConfig.{k}" in head or repr(k) in head] or list(overrides)
        if file is not None and not any(k in flagged for k in named):  # the file's loss.FIELD keys: name them
            parser.error(f"--config {file.path}: key(s) {', '.join(f'loss.{k}' for k in named)}: {exc}")
        parser.error(f"argument {'/'.join(f'--loss.{k}' for k in named)}: {exc}")
    for line in inert_warnings(cfg, _given(typed, file), base) if warn else ():
        print(line, file=sys.stderr)
    if warn and file is not None and not (file.values or file.loss_overrides or file.run_preset):
        print(f"warning: --config {file.path} sets nothing (empty, or comments only): every value is a flag's or "
              "the default", file=sys.stderr)  # fmt: skip
    return cfg, overrides
