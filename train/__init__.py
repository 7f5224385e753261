"""The bundled trainer: `python -m train` (docs/trainer.md), and from Python:

    from train import TrainConfig, train
    summary = train(TrainConfig(model="tiny", max_steps=2, output_dir="runs/try"))

`train(cfg, loss_overrides=None, model_and_tokenizer=None) -> dict` runs training (the summary it also writes);
`TrainConfig` is every flag as a field; `Feature` and `register_feature(factory)` add a plug-in to the step;
`register_task(name, help=...)` adds a task (`unregister_*` take them back); `main(argv=None) -> int` is the command
line itself, for a launcher that imports its plug-ins first. The names load on first use: `import train` (and
`--help`) stay torch-free."""

from __future__ import annotations

import importlib

_PUBLIC = {
    "TrainConfig": "train.config",
    "train": "train.loop",
    "Feature": "train.features",
    "register_feature": "train.features",
    "register_task": "train.tasks",
    "unregister_feature": "train.features",
    "unregister_task": "train.tasks",
    "main": "train.__main__",
}
__all__ = sorted(_PUBLIC)


def __getattr__(name: str):
    if name not in _PUBLIC:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_PUBLIC[name].replace("train", __name__, 1)), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PUBLIC))
