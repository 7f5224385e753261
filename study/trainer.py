"""The study's one seam to the trainer: which package it is (`train` in a checkout, `sgrpo_train` as installed from
the wheel, where this package is `sgrpo_study`), how a run is started (`python -m TRAINER`), and the few trainer names
the study reads (the configuration and its parser, the collapse rule, the JSON and machine helpers). Every other
study module imports the trainer through here."""

from __future__ import annotations

import importlib

TRAINER = "sgrpo_train" if __package__ == "sgrpo_study" else "train"


def _names(module: str, *names: str) -> tuple:
    """The named attributes of one trainer module (`module` relative to the trainer package), in order."""
    mod = importlib.import_module(f"{TRAINER}.{module}")
    return tuple(getattr(mod, name) for name in names)


# one line per trainer module the study reads
(parse_args,) = _names("config.cli", "parse_args")
TrainConfig, PRESET_LOSS_DEFAULTS = _names("config", "TrainConfig", "PRESET_LOSS_DEFAULTS")
(field_specs,) = _names("config.fields", "field_specs")
ConfigFileError, read_config_text = _names("config.file", "ConfigFileError", "read_config_text")
CollapseRules, low_entropy_collapse = _names("features.collapse", "CollapseRules", "low_entropy_collapse")
write_json, dumps = _names("run.metrics", "write_json", "dumps")
(atomic_writer,) = _names("run.files", "atomic_writer")
(cpu_info,) = _names("run.machine", "cpu_info")
