"""The bundled trainer: `python -m train` (see train/README.md and docs/train.md)."""
