"""The study arms of trainer options (Arm.train): RunSpec.argv passes their flags, the trainer accepts them and gets
the intended TrainConfig, the manifests of the other arms stay as they were, and a regime or --set cannot override
an arm's own flags."""

from __future__ import annotations

import pytest

from study.grid import ARMS, RESEARCH_ARMS, grid

# arm -> the TrainConfig fields its trainer flags set
TRAIN_ARMS = {
    "s_grpo_ds": {"dynamic_sampling": True, "dynamic_sampling_max_tries": 4},
    "s_grpo_tr": {"trust_region": 0.1},
    "grpo_nokl_tr": {"trust_region": 0.1},
    "s_grpo_gp": {"grad_penalty": 0.05, "grad_penalty_gamma": 1.0},
    "s_grpo_gtl": {"dense_reward": "gt_likelihood"},
    # the v2 study's arms (docs/study-v2-preregistration.md)
    "grpo_lr1e-4": {"lr": 1e-4},
    "grpo_lr1.5e-4": {"lr": 1.5e-4},
    "grpo_nokl_lr7.5e-5": {"lr": 7.5e-5},
    "grpo_nokl_lr1e-4": {"lr": 1e-4},
    "grpo_nokl_lr1.5e-4": {"lr": 1.5e-4},
    "grpo_nokl_lr2.5e-4": {"lr": 2.5e-4},
    "grpo_nokl_tr_lr1.5e-4": {"lr": 1.5e-4, "trust_region": 0.1},
    "grpo_nokl_tr_lr2.5e-4": {"lr": 2.5e-4, "trust_region": 0.1},
    "grpo_nokl_wu20_lr1.5e-4": {"lr": 1.5e-4, "warmup_steps": 20},
    "grpo_nokl_ppo2_lr2.5e-4": {"lr": 2.5e-4, "ppo_epochs": 2},
    **{f"{m}_lr2.5e-4": {"lr": 2.5e-4} for m in ("dppo_tv", "cispo", "clip_cov", "kl_cov")},  # phase 2
    **{f"{m}_ppo2_lr2.5e-4": {"lr": 2.5e-4, "ppo_epochs": 2} for m in ("dppo_tv", "cispo", "clip_cov", "kl_cov")},
}


def test_arms_of_trainer_options_pass_their_flags(tmp_path):
    specs = {s.arm.name: s for s in grid(list(TRAIN_ARMS), [0], {"max_steps": "5"}, tmp_path / "w", tmp_path / "r")}
    for name, fields in TRAIN_ARMS.items():
        spec = specs[name]
        argv = spec.argv(threads=1, resume=False)
        for key, value in spec.arm.train.items():
            flag = "--" + key.replace("_", "-")
            assert argv[argv.index(flag) + 1] == value, (name, flag)
        assert argv[argv.index("--max-steps") + 1] == "5"  # the regime's overrides still apply
        cfg = spec.config()
        assert {k: getattr(cfg, k) for k in fields} == fields, name
        assert spec.arm.as_dict()["train"] == spec.arm.train
    assert {n for n, a in RESEARCH_ARMS.items() if a.train} == set(TRAIN_ARMS)


def test_the_other_arms_are_unchanged():
    for arm in {**ARMS, **RESEARCH_ARMS}.values():
        if not arm.train:
            assert arm.as_dict() == {"preset": arm.preset, "loss": arm.loss, "about": arm.about}
    assert not any(a.train for a in ARMS.values())


def test_an_arm_flag_cannot_be_overridden(tmp_path):
    with pytest.raises(ValueError, match="sets \\['dynamic_sampling'\\] itself"):
        grid(["s_grpo_ds"], [0], {"dynamic_sampling": "false"}, tmp_path / "w", tmp_path / "r")
