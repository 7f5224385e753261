"""The trainer's configuration: `TrainConfig` and its named presets (train_config.py), the field declarations they
are built from (fields.py), the command line (cli.py) and `--config FILE` (file.py). Below the rest of the trainer:
it imports the task registry, the reward spec checks and strict_json only, never torch."""

from .train_config import *  # noqa: F403
from .train_config import __all__  # noqa: F401
