"""Run bookkeeping, apart from the algorithm: the output directory and its lock, signals, checkpoints and the random
streams they hold, the metrics file, the loop's state between phases, progress bars."""
