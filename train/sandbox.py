"""The code-execution sandbox, kept here as a re-export of `sgrpo_sandbox` (its own package since the trainer's
layout split): `from train.sandbox import run_check, FunctionCheck, Limits` keeps working."""

from sgrpo_sandbox import *  # noqa: F403
from sgrpo_sandbox import __all__  # noqa: F401
