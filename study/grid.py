"""What a study runs: the arms (a name, an algorithm preset, its loss overrides), the named regimes (trainer overrides
applied to every arm), and one run of the grid (`RunSpec`: arm x seed, its directories and its command line)."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path

from .trainer import PRESET_LOSS_DEFAULTS, TRAINER, TrainConfig, field_specs, parse_args


@dataclass(frozen=True)
class Arm:
    name: str
    preset: str
    loss: str = ""  # LossConfig overrides on the preset; "" = the preset exactly as defined
    about: str = ""
    # trainer flags of the arm's method ({field: value}, as `python -m train --FIELD VALUE` takes them), for methods
    # that are trainer options rather than loss fields (dynamic sampling, trust region, gradient penalty); a regime or
    # --set may not set them too
    train: dict[str, str] = field(default_factory=dict, hash=False)

    def as_dict(self) -> dict:
        out = {"preset": self.preset, "loss": self.loss, "about": self.about}
        # no "train" key for an arm without trainer flags: its entry stays equal to the one a results folder recorded
        # for it, which the manifest compares (a changed arm is refused)
        return out | ({"train": dict(self.train)} if self.train else {})


# The arms of the S-GRPO proposal's comparison (docs/study.md), plus the naive reference-free baseline. Each arm passes
# its loss overrides explicitly, so an arm never depends on the trainer's defaults.
ARMS: dict[str, Arm] = {
    a.name: a
    for a in (
        Arm("grpo", "grpo", "", "GRPO with a KL penalty (beta 0.04) to a frozen reference model (DeepSeekMath)"),
        Arm("grpo_nokl", "grpo", "beta=0", "GRPO with beta = 0: the naive reference-free baseline"),
        Arm("gtpo", "gtpo", "", "GTPO: conflict masks, skip negative conflicts, completion entropy filter"),
        Arm(
            "s_grpo",
            "s_grpo",
            PRESET_LOSS_DEFAULTS["s_grpo"],
            "S-GRPO as the default job runs it (completion filter at the batch's 75% entropy quantile)",
        ),
        Arm("s_grpo_ln2", "s_grpo", "", "S-GRPO exactly as the preset defines it (ln 2 completion entropy filter)"),
        Arm("grpo_ef", "grpo_ef", "", "GRPO + entropy floor only (ablation)"),
        Arm("grpo_tc", "grpo_tc", "", "GRPO + token-conflict handling only (ablation)"),
    )
}


def _on_s_grpo(name: str, about: str, loss: str = "", **train: str) -> Arm:
    """An arm built on the s_grpo arm: its preset and quantile completion filter (PRESET_LOSS_DEFAULTS), plus the
    method's `loss` overrides and trainer flags (`train`)."""
    base = PRESET_LOSS_DEFAULTS["s_grpo"]
    return Arm(name, "s_grpo", f"{base},{loss}" if loss else base, about, train=train)


# Research arms for the methods of docs/rl.md: not part of the main comparison (`--arms` defaults to ARMS only); run
# them by name, e.g. `--arms s_grpo,s_grpo_afn`. Each arm spells its method as overrides of an existing preset (the
# trainer's --preset takes train.config's PRESET_NAMES and FIELD_PRESET_NAMES). The s_grpo-based arms keep the s_grpo
# arm's quantile:0.75 completion filter (PRESET_LOSS_DEFAULTS) unless the filter is what they test.
RESEARCH_ARMS: dict[str, Arm] = {
    a.name: a
    for a in (
        Arm("grpo_tc_causal", "grpo_tc", "conflict_strategy=causal",
            "GRPO-TC with counterfactual credit on GTPO's prefix/suffix conflicts (conflict_strategy=causal)"),
        Arm("grpo_tc_anywhere", "grpo_tc", "conflict_detect=anywhere",
            "GRPO-TC with conflicts detected anywhere (token id in a positive and a negative completion)"),
        _on_s_grpo("s_grpo_anywhere",
            "the s_grpo arm with conflicts detected anywhere (the seed's pseudo-code)",
            loss="conflict_detect=anywhere"),
        _on_s_grpo("s_grpo_afn",
            "the s_grpo arm + A = -1 for all-fail groups (the RL preset s_grpo_afn with the quantile filter)",
            loss="advantage_method=all_fail_negative,all_fail_c=1.0"),
        Arm("s_grpo_coverage", "s_grpo", "entropy_filter=coverage",
            "S-GRPO with the derived per-group filter H_thr = min(ln n_eff, ln |V|) (entropy_filter=coverage)"),
        _on_s_grpo("s_grpo_pc",
            "the s_grpo arm + probability compensation C = min(2 - p/p_max, 1 + eps) on positive completions",
            loss="prob_compensation=positive"),
        _on_s_grpo("s_grpo_ds",
            "the s_grpo arm + DAPO dynamic sampling (constant groups dropped and resampled, at most 4 rollouts a step)",
            dynamic_sampling="true", dynamic_sampling_max_tries="4"),
        # delta 0.1: the default job's AdamW steps measured 0.08, 0.12, 0.14, 0.17 over its first 4 steps (warm-up to
        # lr 5e-5), so the ball binds from the full learning rate on
        _on_s_grpo("s_grpo_tr",
            "the s_grpo arm + trust region ||theta - theta_old|| <= 0.1 (each step projected onto the ball)",
            trust_region="0.1"),
        # the ablation of s_grpo_tr: whatever the trust region does without S-GRPO's masks and filters
        Arm("grpo_nokl_tr", "grpo", "beta=0",
            "GRPO with beta = 0 + the same trust region ||theta - theta_old|| <= 0.1 (ablation of s_grpo_tr)",
            train={"trust_region": "0.1"}),
        # gamma 1 = the clip norm; lambda 0.05: ||H u|| measured 3 to 27 over the first 4 steps with ||g|| 0.75 to 1.9,
        # so the penalty's term lambda (||g|| - gamma) ||H u|| is up to ~1, the gradient's own scale
        _on_s_grpo("s_grpo_gp",
            "the s_grpo arm + gradient penalty 0.05/2 max(0, ||g|| - 1)^2 (finite-difference Hessian-vector product)",
            grad_penalty="0.05", grad_penalty_gamma="1.0"),
        # wrong completions that share what precedes their answer get the same likelihood, so on answer-only completions
        # the group-normalized advantages are mostly the binary reward's (docs/trainer.md, "Dense reward from the
        # ground-truth likelihood")
        _on_s_grpo("s_grpo_gtl",
            "the s_grpo arm, a wrong completion's reward P(GT answer | its reasoning) (--dense-reward gt_likelihood)",
            dense_reward="gt_likelihood"),
    )
}  # fmt: skip

# The v2 study's arms (docs/study-v2-preregistration.md; study/prereg.py's plans): a method at a learning rate
# of its own, so arms at several rates share a results folder (the regime must then leave lr to the arms: no --set lr).
# Named METHOD_lrRATE; the 1.5e-4 ones are the decisive study's grpo, grpo_nokl and grpo_nokl_tr, adopted by seed.
_NOKL, _TR = "GRPO with beta = 0", "GRPO with beta = 0 + the trust region ||theta - theta_old|| <= 0.1"
RESEARCH_ARMS |= {
    a.name: a
    for a in (
        *(Arm(f"grpo_lr{lr}", "grpo", "", f"the grpo arm (KL to a reference) at lr {lr}", train={"lr": lr})
          for lr in ("1e-4", "1.5e-4")),
        *(Arm(f"grpo_nokl_lr{lr}", "grpo", "beta=0", f"{_NOKL} at lr {lr}", train={"lr": lr})
          for lr in ("7.5e-5", "1e-4", "1.5e-4", "2.5e-4")),
        *(Arm(f"grpo_nokl_tr_lr{lr}", "grpo", "beta=0", f"{_TR} at lr {lr}", train={"trust_region": "0.1", "lr": lr})
          for lr in ("1.5e-4", "2.5e-4")),
        Arm("grpo_nokl_wu20_lr1.5e-4", "grpo", "beta=0", f"{_NOKL} at lr 1.5e-4 with a 20-step linear warm-up (not 3)",
            train={"lr": "1.5e-4", "warmup_steps": "20"}),
        # PPO's ratio clip made active: a second pass over each rollout batch (the first is on-policy: ratio 1)
        Arm("grpo_nokl_ppo2_lr2.5e-4", "grpo", "beta=0", f"{_NOKL} at lr 2.5e-4, 2 PPO epochs per rollout batch",
            train={"lr": "2.5e-4", "ppo_epochs": "2"}),
        # the field's losses at the regime's learning rate (research arms, not part of a pre-registered plan)
        *(Arm(m, m, "", f"the RL layer's {m} preset (verl 0.9.1's defaults for that loss mode, beta 0)")
          for m in ("dppo_tv", "dppo_kl", "cispo", "sapo", "gmpo", "clip_cov", "kl_cov")),
        # phase 2's stabilizers (pre-registration section 9.1): `--preset M --lr 2.5e-4`, nothing else changed; the
        # presets are the RL layer's FIELD_PRESETS (verl 0.9.1's defaults for that loss mode, beta 0)
        *(Arm(f"{m}_lr2.5e-4", m, "", f"{about} (verl 0.9.1's defaults, beta 0) at lr 2.5e-4", train={"lr": "2.5e-4"})
          for m, about in (("dppo_tv", "DPPO, total-variation trust region"),
                           ("cispo", "CISPO, clipped importance-sampling weights"),
                           ("clip_cov", "Clip-Cov, high-covariance tokens get no gradient"),
                           ("kl_cov", "KL-Cov, a KL penalty on the high-covariance tokens"))),
        # phase 2b (addendum 2026-11-30 (e)): the same four with their terms engaged as PPO's clip was in phase 2, by a
        # second pass over each rollout batch (at one pass the ratio is 1 and DPPO-TV, CISPO, KL-Cov are plain GRPO)
        *(Arm(f"{m}_ppo2_lr2.5e-4", m, "", f"the {m} preset (verl 0.9.1's defaults, beta 0) at lr 2.5e-4, 2 passes per "
              "rollout batch", train={"lr": "2.5e-4", "ppo_epochs": "2"})
          for m in ("dppo_tv", "cispo", "clip_cov", "kl_cov")),
    )
}  # fmt: skip

# The trainer overrides of the study's named regimes (applied to every arm; `--set` adds to them). Each value is what
# `python -m train --FLAG VALUE` takes.
REGIMES: dict[str, dict[str, str]] = {
    # The default job (docs/trainer.md) (30 steps, 4 prompts x 8 completions, lr 5e-5, top 12 layers), with 100 held-out
    # problems instead of 200 (the seed-to-seed spread dominates the error; see docs/study.md) evaluated every 10
    # steps for the accuracy curve.
    "default": {"eval_problems": "100", "eval_every": "10"},
    # The decisive study (docs/study.md, "The decisive study"): a task with room (arithmetic levels 2, 3, 5 with a
    # step-by-step format; 500 distinct held-out problems, base greedy accuracy 0.138 on seed 0's, completions 31.5
    # tokens on average), 60 steps, the mechanism fields logged every step, vLLM rollouts (the same engine in every
    # arm; run the study from the vLLM venv). The learning rate is the calibrated variable: `--set lr=...`.
    "decisive": {
        "difficulty": "2,3,5",
        "system_prompt": "Show your calculation step by step, then write 'The answer is N.'",
        "max_new_tokens": "48",
        "max_steps": "60",
        "eval_problems": "500",
        "eval_k": "0",
        "eval_every": "0",
        "use_vllm": "on",
        "vllm_dtype": "float32",  # the sampler exact on every machine (auto would pick bf16 on a CPU with bf16 ones)
        "log_mechanism": "true",
    },
    # Peak memory of each arm, short (docs/study.md, "Memory"): partial fine-tuning (the default), all layers, LoRA.
    "memory-partial": {"max_steps": "3", "eval_problems": "20", "eval_k": "0"},
    "memory-full": {"max_steps": "3", "eval_problems": "20", "eval_k": "0", "train_layers": "-1"},
    "memory-lora": {"max_steps": "3", "eval_problems": "20", "eval_k": "0", "lora": "true"},
}

# What the study decides itself: the run directory, seed, algorithm, threads and output; --set cannot change them.
RESERVED = ("output_dir", "seed", "preset", "loss", "threads", "progress", "resume", "overwrite")


def parse_sets(items: list[str]) -> dict[str, str]:
    """`--set field=value` items -> {field: value}, each checked now (field name and value, as the trainer's CLI would)
    so a typo fails before hours of runs."""
    specs = field_specs(TrainConfig)
    out: dict[str, str] = {}
    for item in items:
        key, eq, value = item.partition("=")
        key = key.strip().replace("-", "_")
        if not eq or not key:
            raise ValueError(f"--set {item!r}: expected field=value (e.g. --set lr=5e-4)")
        if key not in specs:
            raise ValueError(f"--set {item!r}: {key!r} is not a trainer field (python -m train --help lists them)")
        if key in RESERVED:
            raise ValueError(f"--set {item!r}: the study sets {key} itself (arms, seeds and directories are its own)")
        out[key] = value.strip()
    try:
        parse_args([a for k, v in out.items() for a in (f"--{k}", v)])  # refusals print the trainer's message
    except SystemExit:
        raise ValueError("--set: a value was refused (the trainer's message is above)") from None
    return out


@dataclass(frozen=True)
class RunSpec:
    """One run of the grid: `arm` with `seed` under `overrides`; trains in `work_dir` (checkpoints live there), and
    its finished files are copied to `result_dir`."""

    arm: Arm
    seed: int
    overrides: dict[str, str] = field(hash=False)
    work_dir: Path
    result_dir: Path

    @property
    def key(self) -> str:
        return f"{self.arm.name}/seed{self.seed}"

    def argv(self, threads: int, resume: bool) -> list[str]:
        args = [sys.executable, "-m", TRAINER, "--output-dir", str(self.work_dir), "--seed", str(self.seed)]
        args += ["--preset", self.arm.preset, "--loss", self.arm.loss, "--threads", str(threads), "--progress", "false"]
        args += ["--save-model", "false"]  # a study keeps its runs' files, not 500 MB of weights per run
        for k, v in self.arm.train.items():
            args += [f"--{k.replace('_', '-')}", v]
        for k, v in self.overrides.items():
            args += [f"--{k.replace('_', '-')}", v]
        args.append("--resume" if resume else "--overwrite")
        return args

    def config(self) -> TrainConfig:
        """The TrainConfig this run will use (checked before anything starts)."""
        argv = self.argv(threads=1, resume=False)[3:-1]  # drop python -m train and --overwrite
        try:
            cfg, _ = parse_args(argv)
        except SystemExit:
            raise ValueError(f"{self.key}: the trainer refused its arguments (message above)") from None
        if cfg.max_steps < 1:  # the trainer accepts 0 (evaluate only); a study of runs that train nothing has no report
            raise ValueError(f"{self.key}: max_steps={cfg.max_steps} trains nothing; a study needs max_steps >= 1")
        return cfg


def parse_seeds(text: str) -> list[int]:
    """--seeds (argparse's `type`): the seeds of a comma-separated list such as 0,1,2, sorted, each once; an
    ArgumentTypeError saying what is expected otherwise (none, a negative, not an integer)."""
    try:
        out = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} refused: expected comma-separated seeds, e.g. 0,1,2") from None
    if not out or min(out) < 0:
        raise argparse.ArgumentTypeError(f"{text!r} refused: expected one or more seeds >= 0, e.g. 0,1,2")
    return out


def grid(arms: list[str], seeds: list[int], overrides: dict[str, str], work: Path, results: Path) -> list[RunSpec]:
    """The runs, seed-major (every arm's seed 0 first), so that an interrupted study has whole seeds of all arms."""
    known = {**ARMS, **RESEARCH_ARMS}
    unknown = [a for a in arms if a not in known]
    if unknown:
        raise ValueError(f"--arms: unknown arm(s) {unknown}; expected names from {sorted(known)}")
    for a in arms:
        both = sorted(set(known[a].train) & set(overrides))
        if both:
            raise ValueError(f"arm {a!r} sets {both} itself (its method); the regime or --set may not override them")
    return [
        RunSpec(known[a], s, dict(overrides), work / a / f"seed{s}", results / "runs" / a / f"seed{s}")
        for s in seeds
        for a in arms
    ]
