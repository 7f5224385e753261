"""`python -m train [--preset s_grpo] [--max-steps N] ...`: see `python -m train --help`.

Exit status: 0 done; 130 stopped by Ctrl-C (SIGINT), 143 by SIGTERM (the run is checkpointed: continue with
--resume); 2 refused before starting (output directory in use or holding another run, --resume with a different
configuration); 1 any other failure (the message says what was saved). Under torchrun a refusal by rank 0 alone
(its output folder, lock or checkpoint) stops every rank with its exit status, the message printed once, by rank 0."""

from __future__ import annotations

import sys

from .config.cli import parse_args
from .errors import TrainError, report
from .run.files import output_path
from .run.signals import EXIT_CODES, signal_name


def main(argv: list[str] | None = None) -> int:
    cfg, loss_overrides = parse_args(argv, warn=True)  # (a warning for each setting that does nothing here)
    from .loop import train  # after the CLI: --help does not import the model stack

    try:
        summary = train(cfg, loss_overrides)
    except TrainError as exc:
        report(exc)  # (once: under torchrun a refusal by rank 0 alone is printed by rank 0 only)
        return exc.exit_code
    except KeyboardInterrupt as exc:  # outside the loop's own handling: loading, the probe, the last bookkeeping
        name = signal_name(exc)
        from .run.checkpoint import STATE_FILE

        ckpt = output_path(cfg.output_dir) / "checkpoint" / STATE_FILE
        saved = f"its last checkpoint stays ({ckpt}: --resume continues)" if ckpt.is_file() else "nothing was saved"
        print(f"\n{name}: stopped outside a training step; {saved}", file=sys.stderr)
        return EXIT_CODES[name]
    return EXIT_CODES[summary["signal"]] if summary["interrupted"] else 0


if __name__ == "__main__":
    sys.exit(main())
