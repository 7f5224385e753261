"""A checkpoint written before LossConfig gained a field resumes: a key the checkpoint lacks is compared with that
field's default, not with "<absent>" (the field did not exist, so the run used what its default now means)."""

from __future__ import annotations

import dataclasses

from conftest import tiny_cfg

from sgrpo_kernels.rl import LossConfig
from train.run.rundir import config_differences


def _saved(cfg, loss_cfg, drop=()):
    loss = {k: v for k, v in dataclasses.asdict(loss_cfg).items() if k not in drop}
    return {"config": dataclasses.asdict(cfg), "loss_config": loss}


def test_a_loss_field_the_checkpoint_lacks_is_its_default(tmp_path):
    cfg = tiny_cfg(tmp_path / "run")
    loss_cfg = cfg.loss_config()
    new = [f.name for f in dataclasses.fields(LossConfig)][-3:]  # e.g. fields added after a checkpoint was written
    assert config_differences(_saved(cfg, loss_cfg, drop=new), cfg, loss_cfg) == []


def test_a_lacking_field_set_away_from_its_default_is_still_a_difference(tmp_path):
    cfg = tiny_cfg(tmp_path / "run")
    loss_cfg = cfg.loss_config()
    saved = _saved(cfg, loss_cfg, drop=["beta"])
    changed = dataclasses.replace(loss_cfg, beta=loss_cfg.beta + 0.5)
    diffs = config_differences(saved, cfg, changed)
    assert any(d.startswith("loss.beta:") for d in diffs), diffs


def test_a_present_field_that_differs_is_reported(tmp_path):
    cfg = tiny_cfg(tmp_path / "run")
    loss_cfg = cfg.loss_config()
    saved = _saved(cfg, loss_cfg)
    saved["loss_config"]["beta"] = 0.123
    assert any(d.startswith("loss.beta: checkpoint 0.123") for d in config_differences(saved, cfg, loss_cfg))
