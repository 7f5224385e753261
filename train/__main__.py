"""`python -m train [--preset s_grpo] [--max-steps N] ...`: see `python -m train --help`."""

from __future__ import annotations

import sys

from train.config import parse_args
from train.loop import train


def main(argv: list[str] | None = None) -> int:
    cfg, loss_overrides = parse_args(argv)
    train(cfg, loss_overrides)
    return 0


if __name__ == "__main__":
    sys.exit(main())
