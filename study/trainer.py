"""The study's one seam to the trainer: which package it is (`train` in a checkout, `sgrpo_train` as installed from
the wheel, where this package is `sgrpo_study`), how a run is started (`python -m TRAINER`), and the few trainer names
the study reads (the configuration and its parser, the collapse rule, the JSON and machine helpers). Every other
study module imports the trainer through here."""

from __future__ import annotations

import importlib

TRAINER = "sgrpo_train" if __package__ == "sgrpo_study" else "train"


def _module(name: str):
    return importlib.import_module(f"{TRAINER}.{name}")


parse_args = _module("config.cli").parse_args
TrainConfig = _module("config").TrainConfig
PRESET_LOSS_DEFAULTS = _module("config").PRESET_LOSS_DEFAULTS
field_specs = _module("config.fields").field_specs
ConfigFileError = _module("config.file").ConfigFileError
read_config_text = _module("config.file").read_config_text
CollapseRules = _module("features.collapse").CollapseRules
low_entropy_collapse = _module("features.collapse").low_entropy_collapse
write_json = _module("run.metrics").write_json
atomic_writer = _module("run.files").atomic_writer
dumps = _module("run.metrics").dumps
cpu_info = _module("run.machine").cpu_info
