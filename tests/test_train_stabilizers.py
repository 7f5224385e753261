"""The stabilizers in the bundled trainer (issue: the update-size cap and the field's losses in every trainer):
`--trust-region` as a thin user of `sgrpo_kernels.rl.TrustRegion` (bit for bit the arithmetic of the committed runs),
the field's losses as `--preset` names, TRL's sampler-correction modes as `--tis-mode` / `--tis-min` (today's TIS kept
as `token_truncate`), the off-policy sequence mask fed with the sampler's log-probs, and the study's phase-2 arms."""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("transformers")

import conftest  # noqa: E402

from sgrpo_kernels import rl  # noqa: E402
from train.config import FIELD_PRESET_NAMES, SAMPLER_IS_MODES, ConfigError, TrainConfig  # noqa: E402
from train.config.cli import parse_args  # noqa: E402

tiny_cfg = functools.partial(conftest.tiny_cfg, max_steps=2, warmup_steps=0, lr=1e-2, save_every=0)


def steps_of(out) -> list[dict]:
    recs = [json.loads(x) for x in (Path(out) / "metrics.jsonl").read_text().splitlines()]
    return [r for r in recs if "event" not in r]


# ------------------------------------------------------------------------------------------------ trust region


@torch.no_grad()
def _committed_projection(params, old, delta):
    """The trainer's projection as the committed study runs computed it (train/features/trust_region.py before it
    used the RL layer): norms of the differences in the weights' dtype accumulated in float64, one lerp."""

    def norm():
        return float(torch.linalg.vector_norm(torch.stack(
            [torch.linalg.vector_norm(p - o, dtype=torch.float64) for p, o in zip(params, old)])))  # fmt: skip

    before = norm()
    if not math.isfinite(before) or before <= delta:
        return before, before
    for p, o in zip(params, old):
        p.copy_(o.lerp(p, delta / before))
    return before, norm()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("delta", [1e-3, 0.05, 10.0])
def test_the_feature_projects_bit_for_bit_as_the_committed_runs(dtype, delta):
    from train.features.trust_region import TrustRegion

    g = torch.Generator().manual_seed(3)
    params = [torch.nn.Parameter(torch.randn(s, generator=g).to(dtype)) for s in ((7, 5), (13,), (2, 3, 4))]
    opt = torch.optim.SGD(params, lr=0.1)
    feature = TrustRegion(opt, params, delta)
    feature.before_update()
    feature.before_optimizer_step()
    old = [p.detach().clone() for p in params]
    with torch.no_grad():
        for p in params:
            p.add_(0.01 * torch.randn(p.shape, generator=g).to(dtype))
    expected = [p.detach().clone() for p in params]
    want = _committed_projection(expected, old, delta)
    feature.after_optimizer_step("update")
    rec = feature.record({})
    assert (rec["tr_step_norm"], rec["tr_step_norm_after"]) == want  # exact floats
    assert rec["tr_projected"] == int(want[0] > delta)
    assert all(torch.equal(p.detach(), e) for p, e in zip(params, expected))
    assert feature.region.projected_steps == int(want[0] > delta)


def test_the_feature_does_not_hook_the_optimizer():
    """The trainer orders the snapshot among its features' hooks: `opt.step()` alone must not project."""
    from train.features.trust_region import TrustRegion

    p = torch.nn.Parameter(torch.zeros(4))
    opt = torch.optim.SGD([p], lr=1.0)
    TrustRegion(opt, [p], 1e-3)
    p.grad = torch.ones(4)
    opt.step()
    assert torch.equal(p.detach(), -torch.ones(4))


def test_an_undone_step_drops_the_snapshot():
    from train.features.trust_region import TrustRegion

    p = torch.nn.Parameter(torch.zeros(4))
    feature = TrustRegion(torch.optim.SGD([p], lr=1.0), [p], 1e-3)
    feature.before_optimizer_step()
    assert feature.undo_step(first=True) is False
    with pytest.raises(RuntimeError, match="snapshot"):
        feature.after_optimizer_step("update")


# ----------------------------------------------------------------------------------------------- field presets


@pytest.mark.parametrize("name", FIELD_PRESET_NAMES)
def test_field_presets_are_trainer_presets(name, tmp_path):
    cfg, overrides = parse_args(["--preset", name, "--output-dir", str(tmp_path)])
    assert cfg.preset == name and cfg.loss_config(overrides) == rl.preset(name)  # no trainer override of the preset


def test_an_unknown_preset_names_the_field_presets(capsys):
    with pytest.raises(SystemExit) as exc:
        parse_args(["--preset", "cispoo"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "cispoo" in err and "cispo" in err and "kl_cov" in err


@pytest.mark.parametrize("name", ["cispo", "clip_cov", "dppo_tv"])
def test_a_field_preset_trains(name, tmp_path):
    import train.loop as loop

    summary = loop.train(tiny_cfg(tmp_path / "run", preset=name), {"cov_ratio": 0.5} if name == "clip_cov" else None)
    recs = steps_of(tmp_path / "run")
    assert summary["steps"] == 2 and len(recs) == 2
    assert all(math.isfinite(r["loss"]) for r in recs)
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert saved["train"]["preset"] == name and saved["loss"]["policy_term"] == name


def test_a_field_preset_records_how_often_its_term_acted(tmp_path):
    """policy_term_frac (the study's check that a stabilizer's term acted) is in every step of a field preset's run,
    from the last pass: at one epoch CISPO's ratio is 1 and nothing is clipped; at two epochs the second pass's ratio
    leaves the band. A PPO-clip run has no such key. (The tiny model's rewards are all equal: the entropy bonus gives
    the update its gradient.)"""
    import train.loop as loop

    fracs = {}
    for epochs in (1, 2):
        out = tmp_path / f"cispo{epochs}"
        loop.train(tiny_cfg(out, preset="cispo", ppo_epochs=epochs, lr=0.05), {"entropy_coef": 0.01})
        fracs[epochs] = [r["policy_term_frac"] for r in steps_of(out)]
    assert len(fracs[1]) == len(fracs[2]) >= 2 and set(fracs[1]) == {0.0}, fracs
    assert max(fracs[2]) > 0.0, fracs
    loop.train(tiny_cfg(tmp_path / "grpo", preset="grpo", max_steps=1), None)
    assert all("policy_term_frac" not in r for r in steps_of(tmp_path / "grpo"))


# -------------------------------------------------------------------------------------- sampler correction


def _batch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(4, 6, dtype=torch.bool)
    mask[1, 4:] = False
    mask[3, 2:] = False
    trainer = -torch.rand(4, 6, generator=g) * 3
    sampler = trainer + 0.8 * torch.randn(4, 6, generator=g)
    batch = SimpleNamespace(sampler_logp=sampler, completion_mask=mask)
    groups = SimpleNamespace(loss_kwargs=lambda: dict(token_weights=None, conflict_counts=None, rewards=None,
                                                      group_size=2))  # fmt: skip
    return trainer, sampler, mask, batch, groups


def _run(**kw):
    loss_cfg = rl.preset_with("grpo", {"off_policy_mask_threshold": kw.pop("threshold", None)})
    return SimpleNamespace(loss_cfg=loss_cfg, **{"tis_cap": 3.0, "tis_mode": "token_truncate", "tis_min": 0.0, **kw})


@pytest.mark.parametrize("mode", SAMPLER_IS_MODES)
@pytest.mark.parametrize("clip_min", [0.0, 0.5])
def test_each_mode_weights_the_loss_as_the_rl_layer(mode, clip_min):
    from train.batch import Update
    from train.loss import sampler_correction

    trainer, sampler, mask, batch, groups = _batch()
    kw = sampler_correction(_run(tis_mode=mode, tis_min=clip_min), batch, groups, trainer, Update())
    want = rl.sampler_importance_weights(trainer, sampler, mask, mode, clip_max=3.0, clip_min=clip_min or None)
    assert torch.equal(kw["token_weights"], want)
    assert "sampler_logp" not in kw  # only the off-policy mask reads it


def test_token_truncate_is_the_committed_tis():
    from train.batch import Update
    from train.loss import sampler_correction

    trainer, sampler, mask, batch, groups = _batch(1)
    kw = sampler_correction(_run(), batch, groups, trainer, Update())
    assert torch.equal(kw["token_weights"], rl.truncated_importance_weights(trainer, sampler, mask, 3.0))
    assert not torch.equal(kw["token_weights"], torch.ones_like(trainer))  # the correction was active


def test_the_off_policy_mask_gets_the_samplers_logprobs():
    from train.batch import Update
    from train.loss import sampler_correction

    trainer, sampler, mask, batch, groups = _batch(2)
    kw = sampler_correction(_run(threshold=0.1, tis_cap=0.0), batch, groups, trainer, Update())
    assert kw["sampler_logp"] is sampler and kw["token_weights"] is None


@pytest.mark.parametrize(
    "fields, words",
    [
        ({"tis_mode": "sequence_mask", "tis_cap": 0.0}, ["tis_mode", "sequence_mask", "tis_cap"]),
        ({"tis_min": 0.5, "tis_cap": 0.0}, ["tis_min", "0.5", "tis_cap"]),
        ({"tis_min": 3.0}, ["tis_min", "3.0", "below tis_cap"]),
        ({"tis_min": -0.1}, ["tis_min", "-0.1"]),
        ({"tis_min": math.nan}, ["tis_min", "nan"]),
        ({"tis_mode": "token_clip"}, ["tis_mode", "token_clip", "sequence_mask"]),
    ],
)
def test_sampler_correction_refusals(fields, words, tmp_path):
    conftest.assert_refused(lambda: TrainConfig(output_dir=str(tmp_path), **fields), ConfigError, words)


def test_the_modes_are_the_rl_layers():
    assert SAMPLER_IS_MODES == rl.SAMPLER_IS_MODES


def test_flags_reach_the_config(tmp_path):
    cfg, _ = parse_args(["--tis-mode", "geometric_mask", "--tis-min", "0.25", "--output-dir", str(tmp_path)])
    assert (cfg.tis_mode, cfg.tis_min, cfg.tis_cap) == ("geometric_mask", 0.25, 3.0)


# ---------------------------------------------------------------------------------------------- phase-2 arms


@pytest.mark.parametrize("method", ["dppo_tv", "cispo", "clip_cov", "kl_cov"])
def test_phase2_arms_are_the_preregistered_definition(method, tmp_path):
    """Pre-registration section 9.1: `--preset M --lr 2.5e-4` under the decisive regime, nothing else changed."""
    from study.grid import RESEARCH_ARMS, RunSpec
    from study.prereg import SCREENED

    name = f"{method}_lr2.5e-4"
    arm = RESEARCH_ARMS[name]
    assert name in SCREENED
    assert (arm.preset, arm.loss, arm.train) == (method, "", {"lr": "2.5e-4"})
    argv = RunSpec(arm, 0, {}, tmp_path / "w", tmp_path / "r").argv(threads=1, resume=False)
    cfg, overrides = parse_args(argv[3:])  # after `python -m train`
    assert cfg.lr == 2.5e-4 and cfg.loss_config(overrides) == rl.preset(method)
