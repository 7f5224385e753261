"""What an `SGRPOConfig` asks of the loss: the `LossConfig` (preset, overrides, TRL's beta, Dr. GRPO's normalizer, the
off-policy mask), and the refusals, by name, of TRL fields that would be ignored or cannot be served."""

from __future__ import annotations

import dataclasses
import math
import re

from sgrpo_kernels.rl import LossConfig, parse_overrides, preset, preset_with
from sgrpo_kernels.rl.sampler_is import check_is_bounds

__all__ = ["TRL_IS_MODES", "check_trl_is_fields", "loss_config"]

TRL_IS_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")  # TRL 1.16's

# TRL fields of its own loss and advantages that a preset does not read: (field, TRL's default, what to do instead).
# Set to anything else under a preset, they are refused rather than silently ignored.
IGNORED_UNDER_A_PRESET = (
    ("entropy_coef", 0.0, "the preset's entropy bonus is sgrpo_loss='entropy_coef=...'"),
    ("use_adaptive_entropy", False, "the presets have no adaptive entropy coefficient"),
    ("delta", None, "the presets have no two-sided (delta) clip"),
    ("importance_sampling_level", "token", "the sequence-level ratio is sgrpo_loss='importance_level=sequence'"),
    ("multi_objective_aggregation", "sum_then_normalize",
     "the presets' advantages come from the weighted sum of the reward functions (TRL's sum_then_normalize)"),
)  # fmt: skip


def check_ignored_fields(args) -> None:
    """Refuse TRL loss fields a preset would silently ignore (IGNORED_UNDER_A_PRESET), naming the field."""
    for name, default, instead in IGNORED_UNDER_A_PRESET:
        value = getattr(args, name, default)
        if value != default:
            raise ValueError(
                f"SGRPOConfig({name}={value!r}): TRL's own loss reads it, the preset {args.sgrpo_preset!r} does not; "
                f"{instead}; set {name}={default!r}, or sgrpo_preset=None for TRL's loss"
            )


def check_trl_is_fields(args) -> None:
    """TRL's sampler-mismatch fields, refused by name when they make no sense (TRL itself checks some of them only
    at the first generation)."""
    mode = args.vllm_importance_sampling_mode
    if mode not in TRL_IS_MODES:
        raise ValueError(f"SGRPOConfig(vllm_importance_sampling_mode={mode!r}): expected one of {TRL_IS_MODES}")
    try:
        check_is_bounds(mode, args.vllm_importance_sampling_clip_max, args.vllm_importance_sampling_clip_min,
                        where="vllm_importance_sampling_")  # fmt: skip
    except (TypeError, ValueError) as exc:
        raise ValueError(f"SGRPOConfig: {exc}") from None
    thr = args.off_policy_mask_threshold
    if thr is not None and (isinstance(thr, bool) or not isinstance(thr, (int, float)) or not math.isfinite(thr)
                            or thr < 0):  # fmt: skip
        raise ValueError(f"SGRPOConfig(off_policy_mask_threshold={thr!r}): expected None or a finite number >= 0 "
                         "(the mean log-prob drift, in nats, above which a negative-advantage completion is dropped)")


def _bounds(base: LossConfig, name: str) -> str | None:
    """What a numeric LossConfig field accepts, in LossConfig's own words ("a finite number >= 0.0 and < 1.0"), found
    by building it with a large negative and a large positive value (within float32: a value beyond it is refused for
    that first, which hid the bounds); None when that finds no bound (the caller then quotes LossConfig's refusal)."""
    found = []
    for probe in (-1e30, 1e30):
        try:
            dataclasses.replace(base, **{name: probe})
        except TypeError:
            return None  # not a number field
        except ValueError as exc:
            found += re.findall(rf"LossConfig\.{re.escape(name)} must be ([<>]=? [^,\s]+), got", str(exc))
    return "a finite number " + " and ".join(found) if found else None


def _refusal(args, exc: Exception) -> str:
    """`exc` of building the LossConfig, said with the SGRPOConfig field, the value given and what is accepted."""
    where = f"SGRPOConfig(sgrpo_preset={args.sgrpo_preset!r}, sgrpo_loss={args.sgrpo_loss!r})"
    named = re.match(r"LossConfig\.(\w+) must be", str(exc))
    try:
        given = parse_overrides(args.sgrpo_loss)
        base = preset(args.sgrpo_preset)
    except (TypeError, ValueError):
        return f"{where}: {exc}"
    if named is None or named.group(1) not in given:
        return f"{where}: {exc}"
    name = named.group(1)
    expected = _bounds(base, name)
    if expected is None:
        return f"{where}: sgrpo_loss {name}={given[name]!r} refused: {exc}"
    return f"{where}: sgrpo_loss {name}={given[name]!r} refused: expected {expected}"


def loss_config(args) -> LossConfig | None:
    """The LossConfig an SGRPOConfig asks for (None: TRL's own loss); a clear error for what TRL cannot serve."""
    if not isinstance(args.sgrpo_loss, str):
        raise ValueError(f"SGRPOConfig(sgrpo_loss={args.sgrpo_loss!r}): expected a string of LossConfig overrides "
                         "'field=value,...' ('' for the preset as it is)")
    if args.sgrpo_preset is None:
        if args.sgrpo_loss:
            raise ValueError(f"SGRPOConfig(sgrpo_preset=None, sgrpo_loss={args.sgrpo_loss!r}): overrides need a "
                             "preset; set sgrpo_preset (e.g. 's_grpo') or sgrpo_loss=''")
        return None
    try:
        cfg = preset_with(args.sgrpo_preset, args.sgrpo_loss)
    except (TypeError, ValueError) as exc:
        raise ValueError(_refusal(args, exc)) from None
    if cfg.entropy_filter in ("adaptive", "coverage"):  # per-group thresholds from the group's rewards
        raise ValueError(
            f"SGRPOConfig: entropy_filter={cfg.entropy_filter!r} needs each training micro-batch to hold whole groups "
            f"with their rewards; TRL shuffles and splits the groups. Use entropy_filter='ln2', a number or "
            f"'quantile:q' (preset {cfg.name!r})"
        )
    check_ignored_fields(args)
    _check_beta(args, cfg)
    _check_top_entropy(args, cfg)
    cfg = _with_completion_length(args, cfg)
    thr = args.off_policy_mask_threshold
    if thr is not None:
        if cfg.off_policy_mask_threshold is not None and cfg.off_policy_mask_threshold != thr:
            raise ValueError(
                f"SGRPOConfig: off_policy_mask_threshold={thr!r} and sgrpo_loss off_policy_mask_threshold="
                f"{cfg.off_policy_mask_threshold!r} differ; set one of them"
            )
        cfg = dataclasses.replace(cfg, off_policy_mask_threshold=float(thr))
    return cfg


def _check_beta(args, cfg: LossConfig) -> None:
    """TRL's `beta` (the KL coefficient; TRL loads the reference model only when it is != 0) must be the loss's."""
    if args.beta == cfg.beta:
        return
    if "beta" in parse_overrides(args.sgrpo_loss):
        raise ValueError(f"SGRPOConfig: beta={args.beta!r} and sgrpo_loss beta={cfg.beta!r} differ; set both to the "
                         "KL coefficient you want")
    mine = ",".join(filter(None, (args.sgrpo_loss.strip(), f"beta={args.beta!r}")))
    raise ValueError(
        f"SGRPOConfig: beta={args.beta!r} (TRL's KL coefficient) differs from the preset {cfg.name!r}, beta="
        f"{cfg.beta!r}; to use yours, set sgrpo_loss={mine!r} too; for the preset's, set beta={cfg.beta!r} (TRL loads "
        "the reference model and computes its log-probs only when beta != 0)"
    )


def _check_top_entropy(args, cfg: LossConfig) -> None:
    """TRL's `top_entropy_quantile` (1.0: off) is not read under a preset: refused unless it is the loss's own."""
    q, mine = getattr(args, "top_entropy_quantile", 1.0), cfg.top_entropy_quantile
    if q == (1.0 if mine is None else mine):
        return
    raise ValueError(
        f"SGRPOConfig(top_entropy_quantile={q!r}): TRL's own loss reads it, the preset {cfg.name!r} has "
        f"top_entropy_quantile={mine!r}; to use yours, set sgrpo_loss='top_entropy_quantile={q!r}' too"
    )


def _with_completion_length(args, cfg: LossConfig) -> LossConfig:
    """loss_agg='seq-mean-token-sum-norm' (dr_grpo) divides by B x max_completion_length, as TRL's loss_type='dr_grpo':
    TRL's `max_completion_length`, not each micro-batch's padded length."""
    mcl = args.max_completion_length
    if cfg.loss_agg != "seq-mean-token-sum-norm" or mcl is None or cfg.max_completion_length == mcl:
        return cfg
    if cfg.max_completion_length is not None:
        raise ValueError(
            f"SGRPOConfig: max_completion_length={mcl!r} and sgrpo_loss max_completion_length="
            f"{cfg.max_completion_length!r} differ (loss_agg='seq-mean-token-sum-norm' divides by it); set one of them"
        )
    try:
        return dataclasses.replace(cfg, max_completion_length=mcl)
    except (TypeError, ValueError):
        raise ValueError(f"SGRPOConfig(max_completion_length={mcl!r}): expected an int >= 1") from None
