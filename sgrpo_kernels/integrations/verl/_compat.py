"""The verl versions this plugin is written against, checked once on import with a message a user can act on.

The plugin uses verl's extension points and a few internals whose shape changes between minor versions: the policy-loss
registry and ``agg_loss`` normalizers (``verl.trainer.ppo.core_algos``), the engine-level loss contract
``loss_fn(model_output=, data=, dp_group=)`` and the ``dp_size`` / ``batch_num_tokens`` / ``global_batch_size`` keys the
engine puts in each micro-batch, ``no_padding_2_padding`` (``verl.workers.utils``), and the v1 trainer's
``_setup`` / ``_compute_advantage`` / ``_update_actor`` steps (``verl.trainer.ppo.v1``)."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

__all__ = ["VERL_MAX", "VERL_MIN", "check_verl_version"]

VERL_MIN = (0, 9, 1)  # tested
VERL_MAX = (0, 10, 0)  # exclusive: the next minor may move the internals listed above


def _parse(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split("+")[0].split("."):
        digits = "".join(ch for ch in piece if ch.isdigit())
        if not digits:
            break
        parts.append(int(digits))
        if not piece.isdigit():  # 0.10.0rc1 -> (0, 10, 0): a pre-release counts as its release
            break
    return tuple(parts)


def check_verl_version(found: str | None = None) -> str:
    """The installed verl version, or ImportError naming it and the supported range."""
    if found is None:
        try:
            found = version("verl")
        except PackageNotFoundError:
            raise ImportError(
                "sgrpo_kernels.integrations.verl needs verl (pip install 'sgrpo-kernels[verl]'); verl is not installed"
            ) from None
    lo, hi = ".".join(map(str, VERL_MIN)), ".".join(map(str, VERL_MAX))
    if not VERL_MIN <= _parse(found)[:3] < VERL_MAX:
        raise ImportError(
            f"sgrpo_kernels.integrations.verl supports verl >= {lo}, < {hi}; found verl {found}. Install a supported "
            f"version (pip install 'verl>={lo},<{hi}') or the sgrpo-kernels release that supports yours"
        )
    return found
