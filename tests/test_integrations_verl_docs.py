"""The verl command lines that docs/verl.md and the plugin's messages give a user, as a shell hands them to verl
(`shlex.split`: bash's quote removal) and composed by verl's own Hydra config: each composes, selects our policy-loss
dataclass and keeps the `sgrpo_loss` text whole. Before, the docs' `+...policy_loss._target_=` was refused by Hydra
(verl's config has a `_target_`: "An item is already at ...") and `+...sgrpo_loss="a=b"` reached Hydra without its
quotes, a parse error."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

pytest.importorskip("verl")

from sgrpo_kernels.integrations.verl.config import TARGET, loss_config  # noqa: E402

DOC = Path(__file__).resolve().parent.parent / "docs" / "verl.md"
PL = "actor_rollout_ref.actor.policy_loss"


def compose(*overrides: str):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_module

    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        return hydra_compose(config_name="ppo_trainer", overrides=list(overrides))


def shell_words(text: str) -> list[str]:
    """What a shell passes on for `text` (line continuations joined)."""
    return shlex.split(text.replace("\\\n", " "))


def doc_blocks() -> list[str]:
    return [b for b in re.findall(r"```bash\n(.*?)```", DOC.read_text(), re.S) if "actor_rollout_ref" in b]


def test_the_docs_switch_and_override_lines_compose_to_our_dataclass():
    switch, overrides = doc_blocks()[:2]
    cfg = compose(*shell_words(switch), *shell_words(overrides))
    pl = cfg.actor_rollout_ref.actor.policy_loss
    assert pl._target_ == TARGET and pl.loss_mode == "s_grpo"
    assert pl.sgrpo_loss == "entropy_filter=quantile:0.75"
    assert loss_config(pl).entropy_filter == "quantile:0.75"
    assert cfg.trainer.v1.trainer_mode == "sgrpo"


def test_every_sgrpo_loss_override_the_docs_quote_composes():
    target = shell_words(doc_blocks()[1])[0]  # the ++..._target_ line
    spans = re.findall(r"`('\+actor_rollout_ref[^`]*)`", DOC.read_text())
    assert spans, "docs/verl.md quotes no sgrpo_loss override"
    for span in spans:
        (word,) = shell_words(span)
        want = word.split("=", 1)[1].strip('"')
        assert compose(target, word).actor_rollout_ref.actor.policy_loss.sgrpo_loss == want, span


def test_the_unquoted_form_is_what_hydra_refuses():
    """The check above can fail: the docs' old line, as the shell passed it on."""
    with pytest.raises(Exception, match="mismatched input"):
        compose(*shell_words(f'++{PL}._target_={TARGET} +{PL}.sgrpo_loss="entropy_filter=quantile:0.75"'))
    with pytest.raises(Exception, match="already at"):
        compose(f"+{PL}._target_={TARGET}")


def test_the_overrides_the_plugin_suggests_compose():
    pytest.importorskip("transfer_queue")
    from sgrpo_kernels.integrations.verl.trainer import QUANTILE_HINT, check_verl_config

    base = compose("actor_rollout_ref.rollout.n=4", f"{PL}.loss_mode=s_grpo", "algorithm.adv_estimator=grpo",
                   "actor_rollout_ref.actor.clip_ratio_high=0.28")  # fmt: skip
    with pytest.raises(ValueError) as refused:
        check_verl_config(base, loss_config(base.actor_rollout_ref.actor.policy_loss))
    suggested = " ".join(re.findall(r"'\+[^']*'", str(refused.value)))  # the quoted overrides in the message
    assert suggested.count("'+") == 2, str(refused.value)
    for hint, want in ((suggested, "epsilon_high=0.28"), (QUANTILE_HINT, "entropy_filter=quantile:0.75")):
        pl = compose(*shell_words(hint)).actor_rollout_ref.actor.policy_loss
        assert pl._target_ == TARGET and pl.sgrpo_loss == want, hint
    fixed = compose("actor_rollout_ref.rollout.n=4", f"{PL}.loss_mode=s_grpo", "algorithm.adv_estimator=grpo",
                    "actor_rollout_ref.actor.clip_ratio_high=0.28", *shell_words(suggested))  # fmt: skip
    check_verl_config(fixed, loss_config(fixed.actor_rollout_ref.actor.policy_loss))


def test_our_keys_on_verls_dataclass_are_refused_by_the_driver():
    """`+...trust_region=0.1` without our `_target_` passed the driver's checks and failed later, in a worker, with
    verl's TypeError; now the driver refuses it naming the override that selects our dataclass."""
    pytest.importorskip("transfer_queue")
    from sgrpo_kernels.integrations.verl.trainer import check_verl_config

    job = ("actor_rollout_ref.rollout.n=4", f"{PL}.loss_mode=s_grpo", "algorithm.adv_estimator=grpo")
    bare = compose(*job, f"+{PL}.trust_region=0.1")
    with pytest.raises(ValueError, match=re.escape(f"'++{PL}._target_={TARGET}'")):
        check_verl_config(bare, loss_config(bare.actor_rollout_ref.actor.policy_loss))
    ours = compose(*job, f"++{PL}._target_={TARGET}", f"+{PL}.trust_region=0.1")
    check_verl_config(ours, loss_config(ours.actor_rollout_ref.actor.policy_loss))
