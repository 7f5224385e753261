"""The bundled trainer: `python -m train` (see train/README.md and the Training section of README.md)."""
