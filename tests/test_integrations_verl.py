"""The verl plugin (sgrpo_kernels.integrations.verl) against the RL layer, without a cluster: registration through
verl's entry point in a fresh process, the driver's group signals and the workers' engine-level loss on hand-built
batches (ties, all-correct and all-wrong groups, padding, rows of a group apart, groups split across micro-batches and
ranks) equal to `sgrpo_kernels.rl` in per-token weights, loss and gradients, and the errors. Skipped without verl (it
needs a venv of its own: .ci/stage_verl.sh)."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import textwrap

import pytest
import torch

if os.environ.get("SGRPO_REQUIRE_VERL") == "1":  # CI's verl stage: a broken install fails, not skips
    import verl  # noqa: F401
pytest.importorskip("verl")

from conftest import assert_refused  # noqa: E402
from tensordict import TensorDict  # noqa: E402
from verl.utils import tensordict_utils as tu  # noqa: E402

from sgrpo_kernels import rl  # noqa: E402
from sgrpo_kernels.integrations.verl import (  # noqa: E402
    POLICY_LOSSES,
    SGRPOPolicyLossConfig,
    check_verl_version,
    driver_signals,
    loss_config,
    loss_side_config,
    make_loss_fn,
)

G, T, V, P = 4, 7, 11, 3  # group size, response length, vocabulary, prompt length


def batch():
    """4 groups x 4 completions in contiguous order: mixed rewards with shared prefixes and suffixes (conflicts), all
    correct, all wrong, and tied rewards with duplicate completions; right padding of several lengths (one row of a
    single token)."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, V, (4 * G, T), generator=g)
    ids[0:4, :2] = torch.tensor([3, 5])  # group 0: a shared prefix on every completion
    ids[1, 2] = ids[2, 2] = 7
    ids[12:14] = ids[14]  # group 3: three identical completions
    lengths = torch.tensor([7, 5, 6, 1, 7, 7, 3, 4, 7, 2, 6, 7, 5, 5, 5, 7])
    mask = torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)
    ids[0, 4], ids[1, 2], ids[3, 0] = 9, 9, 3  # a suffix token shared by a success and a failure of group 0
    rewards = torch.tensor([1.0, 0, 0, 1, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 0, 0])
    return ids, mask, rewards


def policy(seed=1):
    """Logits of the current policy ([B, T, V], requires grad) with a spread of entropies, and old log-probs."""
    g = torch.Generator().manual_seed(seed)
    scale = torch.linspace(0.3, 6.0, 4 * G).view(-1, 1, 1)  # low to high entropy across the rows
    logits = (torch.randn(4 * G, T, V, generator=g) * scale).requires_grad_(True)
    old = torch.log_softmax(logits.detach() + 0.05 * torch.randn(4 * G, T, V, generator=g), -1)
    return logits, old


def logp_entropy(logits, ids):
    lsm = torch.log_softmax(logits, -1)
    return lsm.gather(-1, ids.unsqueeze(-1)).squeeze(-1), -(lsm.exp() * lsm).sum(-1)


def reference(cfg, ids, mask, rewards, logits, old_lsm, wrt=None):
    """The RL layer on the whole batch in contiguous group order: loss, metrics, d loss / d `wrt` (the logits)."""
    logp, ent = logp_entropy(logits, ids)
    old = old_lsm.gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    groups = rl.prepare_groups(cfg, rewards, ids, mask, G)
    loss, metrics = rl.policy_loss(logp, groups.advantages, mask, cfg, entropy=ent, old_logp=old,
                                   vocab_size=V, **groups.loss_kwargs())  # fmt: skip
    (grad,) = torch.autograd.grad(loss, logits if wrt is None else wrt)
    return loss.detach(), metrics, grad, groups


def engine_data(rows, ids, mask, old, signals, dp_size=1, n_tokens=None, n_seqs=None):
    """The micro-batch verl's engine hands the loss (non-nested prompts; per-token fields [B, T])."""
    m = mask[rows].float()
    td = TensorDict(
        {
            "prompts": torch.ones(len(rows), P, dtype=torch.long),
            "responses": ids[rows],
            "attention_mask": torch.cat([torch.ones(len(rows), P, dtype=torch.long), mask[rows].long()], 1),
            "response_mask": mask[rows].long(),
            "old_log_probs": old[rows] * m,
            "advantages": signals.advantages[rows].unsqueeze(1) * m,
            "sgrpo_token_weights": signals.token_weights[rows],
            "sgrpo_conflict_counts": signals.conflict_counts[rows].unsqueeze(1) * m,
        },
        batch_size=len(rows),
    )
    tu.assign_non_tensor(td, dp_size=dp_size, batch_num_tokens=n_tokens, global_batch_size=n_seqs)
    return td


def packed(values, mask):
    """[B, T] response values -> the engine's packed (total_nnz,) output: per row P prompt positions + its response,
    the response's values shifted one position left (position P - 1 predicts the first response token)."""
    parts = []
    for v, m in zip(values, mask):
        r = int(m.sum())
        parts += [torch.zeros(P - 1), v[:r], torch.zeros(1)]
    return torch.cat(parts)


def verl_path(cfg, ids, mask, rewards, logits, old_lsm, order, splits, dp_size=1):
    """The plugin: driver signals on the batch in verl's row order `order` (groups apart), then the engine-level loss
    on each micro-batch (`splits`: lists of positions in that order) summed, as verl's engine sums them. Returns
    (loss, d loss / d logits, signals in contiguous order)."""
    ids_v, mask_v, rew_v = ids[order], mask[order], rewards[order]
    uid = [f"prompt-{int(i) // G}" for i in order]
    logp, ent = logp_entropy(logits, ids)
    logp_v, ent_v = logp[order], ent[order]
    old = old_lsm.gather(-1, ids.unsqueeze(-1)).squeeze(-1)[order]
    sig = driver_signals(cfg, rew_v, ids_v, mask_v, uid, G, entropy=ent_v.detach(), vocab_size=V)
    fn = make_loss_fn(loss_side_config(cfg))
    n_tokens, n_seqs = int(mask.sum()) * 1, len(order)
    total = 0.0
    for rows in splits:
        rows = torch.tensor(rows)
        data = engine_data(rows, ids_v, mask_v, old, sig, dp_size, n_tokens * dp_size, n_seqs * dp_size)
        out = {"log_probs": packed(logp_v[rows], mask_v[rows]), "entropy": packed(ent_v[rows], mask_v[rows])}
        loss, metrics = fn(model_output=out, data=data)
        assert "actor/pg_loss" in metrics
        total = total + loss
    (grad,) = torch.autograd.grad(total, logits)
    back = torch.argsort(order)
    contiguous = dataclasses.replace(sig, advantages=sig.advantages[back], token_weights=sig.token_weights[back],
                                     conflict_counts=sig.conflict_counts[back])  # fmt: skip
    return total.detach(), grad, contiguous


ORDER = torch.tensor([5, 0, 12, 9, 3, 14, 1, 8, 6, 15, 2, 11, 4, 13, 7, 10])  # verl's balancing puts groups apart


def check_equal(name, overrides="", splits=(list(range(16)),), atol=1e-6):
    cfg = rl.preset_with(name, overrides)
    ids, mask, rewards = batch()
    logits, old_lsm = policy()
    ref_loss, ref_metrics, ref_grad, groups = reference(cfg, ids, mask, rewards, logits, old_lsm)
    loss, grad, sig = verl_path(cfg, ids, mask, rewards, logits, old_lsm, ORDER, splits)
    # per-token weights: the RL layer's conflict weights x its entropy filter's kept completions
    w = groups.token_weights if groups.token_weights is not None else torch.ones(4 * G, T)
    if cfg.entropy_filter is not None:
        h_seq = rl.completion_entropy(logp_entropy(logits, ids)[1].detach(), mask)
        thr = rl.entropy_threshold(cfg.entropy_filter, h_seq, mask.any(1), rewards=rewards, group_size=G,
                                   vocab_size=V)  # fmt: skip
        keep = h_seq <= thr
        w = w * keep.unsqueeze(1)
        assert 0 < int(keep.sum()) < 4 * G, "the batch must exercise the filter both ways"
    torch.testing.assert_close(sig.token_weights, torch.where(mask, w, 0.0), atol=0, rtol=0)
    torch.testing.assert_close(sig.advantages, groups.advantages, atol=0, rtol=0)
    torch.testing.assert_close(loss, ref_loss, atol=atol, rtol=1e-5)
    torch.testing.assert_close(grad, ref_grad, atol=atol, rtol=1e-5)
    assert ref_grad.abs().sum() > 0
    return ref_metrics


@pytest.mark.parametrize("name", POLICY_LOSSES)
def test_whole_batch_equals_rl(name):
    """One micro-batch holding the mini-batch: every preset's loss and gradients are the RL layer's exactly (the
    entropy floor included)."""
    overrides = "entropy_filter=quantile:0.5" if name in ("s_grpo", "s_grpo_afn", "gtpo") else ""
    metrics = check_equal(name, overrides)
    if name in ("gtpo", "grpo_tc", "s_grpo"):
        assert float(metrics["zero_weight_frac"]) > 0  # conflicts (and the filter) removed tokens


@pytest.mark.parametrize(
    "name,overrides",
    [("gtpo", "entropy_filter=quantile:0.5"), ("grpo_tc", ""), ("gtpo_official", ""),
     ("s_grpo", "entropy_filter=coverage,entropy_penalty_coef=0.0"),
     ("s_grpo", "loss_agg=token-mean,entropy_penalty_coef=0.0"),
     ("grpo_tc", "loss_agg=seq-mean-token-sum")],
)  # fmt: skip
def test_split_micro_batches_equal_rl(name, overrides):
    """Groups split across 3 uneven micro-batches: the summed micro-batch losses and their gradients are the RL layer's
    on the whole batch for every aggregation (the per-group filters `coverage` included: decided on the driver)."""
    check_equal(name, overrides, splits=([0, 1, 2, 3, 4], [5, 6, 7, 8, 9, 10, 11, 12], [13, 14, 15]))


@pytest.mark.parametrize("name", ["gtpo", "gtpo_official", "grpo_tc"])
def test_data_parallel_share(name):
    """Rank 0 of 2, the other rank holding the same groups: verl averages the ranks' gradients, so one rank's loss
    and gradient (identical on both) must be the RL layer's on the global batch of 2 x 16 completions (per-completion
    means: the same as on 16; `seq-sum-token-mean` of gtpo_official: twice)."""
    cfg = rl.preset_with(name, "entropy_filter=quantile:0.5" if name == "gtpo" else "")
    ids, mask, rewards = batch()
    logits, old_lsm = policy()
    two = torch.cat([logits, logits])  # both ranks' rows, one set of parameters
    ref_loss, _, ref_grad, _ = reference(cfg, ids.repeat(2, 1), mask.repeat(2, 1), rewards.repeat(2), two,
                                         old_lsm.repeat(2, 1, 1), wrt=logits)  # fmt: skip
    loss, grad, _ = verl_path(cfg, ids, mask, rewards, logits, old_lsm, ORDER, [list(range(8)), list(range(8, 16))],
                              dp_size=2)  # fmt: skip
    torch.testing.assert_close(loss, ref_loss, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(grad, ref_grad, atol=1e-6, rtol=1e-5)
    if name == "gtpo_official":
        assert not torch.allclose(ref_loss, reference(cfg, ids, mask, rewards, logits, old_lsm)[0])


def test_entropy_floor_per_micro_batch():
    """The floor (a function of a mean, not a sum) is taken per micro-batch: summed over the split it differs from the
    whole batch's by design (docs/verl.md), while the policy term alone (coef 0) is exact (the tests above)."""
    cfg_floor = "entropy_filter=quantile:0.5,entropy_floor=5.0,entropy_penalty_coef=1.0"
    with pytest.raises(AssertionError):
        check_equal("s_grpo", cfg_floor, splits=([0, 1, 2, 3, 4], list(range(5, 16))))
    check_equal("s_grpo", cfg_floor)


def test_driver_signals_refuse_incomplete_groups():
    ids, mask, rewards = batch()
    uid = [f"p{i // G}" for i in range(15)] + ["p-extra"]
    assert_refused(lambda: driver_signals(rl.preset("grpo_tc"), rewards, ids, mask, uid, G), ValueError,
                   ["rollout.n = 4", "p3", "p-extra"])  # fmt: skip
    assert_refused(lambda: driver_signals(rl.preset("s_grpo"), rewards, ids, mask, [i // G for i in range(16)], G),
                   ValueError, ["entropy", "ln2"])  # fmt: skip


def test_loss_config_from_verl_keys():
    assert loss_config(SGRPOPolicyLossConfig(loss_mode="s_grpo")) == rl.preset("s_grpo")
    cfg = loss_config(SGRPOPolicyLossConfig(loss_mode="gtpo", sgrpo_loss="entropy_filter=quantile:0.75"))
    assert cfg.entropy_filter == "quantile:0.75" and cfg.conflict_strategy == "gtpo"
    assert_refused(lambda: loss_config(SGRPOPolicyLossConfig(loss_mode="vanilla")), ValueError,
                   ["loss_mode='vanilla'", "s_grpo"])  # fmt: skip
    assert_refused(lambda: loss_config(SGRPOPolicyLossConfig(loss_mode="s_grpo", sgrpo_loss="entropy_flter=1")),
                   ValueError, ["sgrpo_loss='entropy_flter=1'", "entropy_flter"])  # fmt: skip
    norm = SGRPOPolicyLossConfig(loss_mode="grpo_tc", sgrpo_loss="loss_agg=seq-mean-token-sum-norm")
    assert_refused(lambda: loss_config(norm), ValueError, ["seq-mean-token-sum-norm", "max_completion_length"])


def test_loss_refuses_batches_without_driver_fields():
    ids, mask, rewards = batch()
    logits, old_lsm = policy()
    sig = driver_signals(rl.preset("grpo_tc"), rewards, ids, mask, [i // G for i in range(16)], G)
    data = engine_data(torch.arange(16), ids, mask, torch.zeros(16, T), sig)
    del data["sgrpo_token_weights"]
    logp, ent = logp_entropy(logits, ids)
    out = {"log_probs": packed(logp, mask)}
    assert_refused(lambda: make_loss_fn(rl.preset("grpo_tc"))(model_output=out, data=data), ValueError,
                   ["sgrpo_token_weights", "trainer_mode=sgrpo"])  # fmt: skip
    assert_refused(lambda: make_loss_fn(rl.preset("grpo_ef"))(model_output=out, data=data), ValueError,
                   ["entropy", "calculate_entropy"])  # fmt: skip


def test_version_range():
    assert check_verl_version() .startswith("0.9.")
    assert_refused(lambda: check_verl_version("0.10.0"), ImportError, ["0.10.0", ">= 0.9.1, < 0.10.0"])
    assert_refused(lambda: check_verl_version("0.8.2"), ImportError, ["0.8.2"])
    assert check_verl_version("0.9.3rc1") == "0.9.3rc1"


def _fresh(code: str, **env) -> subprocess.CompletedProcess:
    env = {**os.environ, **env}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env,
                          timeout=300, cwd="/")  # fmt: skip


def test_registration_through_entry_point():
    """A fresh process that only imports verl: our loss names and trainer mode are registered (nothing of ours
    imported by hand), verl's ppo_loss path refuses our names with what to set, and with plugins disabled verl does
    not know them. One process each."""
    code = """
        import sys, verl
        from verl.trainer.ppo.core_algos import get_policy_loss_fn
        assert not any(m == "sgrpo_kernels.integrations.verl" for m in sys.argv), "nothing imported by hand"
        for name in %r:
            fn = get_policy_loss_fn(name)
            try:
                fn(None, None, None, None)
            except RuntimeError as exc:
                assert "trainer.v1.trainer_mode=sgrpo" in str(exc), exc
            else:
                raise AssertionError(name)
        from verl.trainer.ppo.v1 import get_trainer_cls
        cls = get_trainer_cls("sgrpo")
        print("OK", cls.__module__, cls.__mro__[1].__name__)
    """.replace("%r", repr(POLICY_LOSSES))
    res = _fresh(code)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "OK sgrpo_kernels.integrations.verl.trainer PPOTrainerSync" in res.stdout
    off = _fresh("""
        import verl
        from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY
        print(sorted(set(%r) & set(POLICY_LOSS_REGISTRY)))
    """.replace("%r", repr(POLICY_LOSSES)), VERL_USE_EXTERNAL_PLUGINS="none")
    assert off.returncode == 0 and off.stdout.strip().endswith("[]"), off.stderr[-2000:]


_REGISTERED_CHECK = textwrap.dedent("""
    import verl
    from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY
    for name in %r:
        assert name in POLICY_LOSS_REGISTRY, name
        try:
            POLICY_LOSS_REGISTRY[name](None, None, None, None)
        except RuntimeError as exc:
            assert all(w in str(exc) for w in WORDS), exc
        else:
            raise AssertionError(name)
    print("OK")
""").replace("%r", repr(POLICY_LOSSES))


def test_registration_when_the_package_is_imported_before_verl():
    """Review finding 4: `import sgrpo_kernels.integrations.verl` before `import verl` (a launcher that builds the
    policy-loss config in Python) registers the loss names and the trainer mode, as verl first does. It registered
    nothing: verl's plugin loading ran while the package was half-initialized and failed on a circular import."""
    code = textwrap.dedent("""
        import sgrpo_kernels.integrations.verl
        WORDS = ["trainer.v1.trainer_mode=sgrpo"]
    """) + _REGISTERED_CHECK + textwrap.dedent("""
        from verl.trainer.ppo.v1 import get_trainer_cls
        print("trainer", get_trainer_cls("sgrpo").__module__)
    """)
    res = _fresh(code)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    assert "OK\ntrainer sgrpo_kernels.integrations.verl.trainer" in res.stdout
    assert "failed to register" not in res.stderr, res.stderr[-3000:]


@pytest.mark.parametrize("first, broken, words", [
    # the package first (its import succeeds, with a warning), then verl; transferqueue is installed but broken
    ("import sgrpo_kernels.integrations.verl", "transfer_queue", "simulated broken transfer_queue"),
    # verl first; one of the package's modules cannot be imported (the package's own import fails)
    ("import sys; sys.modules['sgrpo_kernels.integrations.verl.signals'] = None", None,
     "sgrpo_kernels.integrations.verl.signals"),
])  # fmt: skip
def test_broken_install_registers_names_that_raise_the_error(tmp_path, first, broken, words):
    """Review finding 4: a failed registration logs a warning and registers each loss name as a function that raises
    the original error, as plugin.py promises (it registered nothing in both cases: the fallback itself imported the
    half-initialized or failing package, and its error was swallowed)."""
    env = {}
    if broken:
        (tmp_path / broken).mkdir()
        (tmp_path / broken / "__init__.py").write_text(f"raise ImportError('simulated broken {broken}')\n")
        env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])
    code = f"{first}\nWORDS = {['verl plugin failed to load', words]!r}\n" + _REGISTERED_CHECK
    res = _fresh(code, **env)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    assert res.stdout.strip().endswith("OK") and "failed to register s_grpo / gtpo" in res.stderr, res.stderr[-3000:]


def _verl_default_config(*overrides):
    """verl's own default PPO config (hydra), with rollout.n=4, loss_mode=s_grpo and adv_estimator=grpo (verl's
    default, gae, builds a critic: refused, test_trainer_refuses_a_critic)."""
    from hydra import compose, initialize_config_module

    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        return compose(config_name="ppo_trainer", overrides=["actor_rollout_ref.rollout.n=4",
                                                             "actor_rollout_ref.actor.policy_loss.loss_mode=s_grpo",
                                                             "algorithm.adv_estimator=grpo", *overrides])  # fmt: skip


def test_trainer_refuses_a_critic():
    """Review finding 6: verl's default adv_estimator=gae (or critic.enable=True) built and trained a critic whose
    returns the sgrpo trainer overwrites (and that ran under the actor's trust region); gae without a critic has no
    values. Refused naming the keys and what to set; a critic-free estimator passes."""
    pytest.importorskip("transfer_queue")
    from sgrpo_kernels.integrations.verl.trainer import check_verl_config

    cfg = rl.preset("s_grpo")
    fix, gae = ["critic-free", "algorithm.adv_estimator=grpo", "critic.enable"], "algorithm.adv_estimator='gae'"
    for overrides, words in [(["algorithm.adv_estimator=gae"], [gae, "train a critic"]),
                             (["critic.enable=True"], ["critic.enable=True", "train a critic"]),
                             (["algorithm.adv_estimator=gae", "critic.enable=False"],
                              [gae, "critic.enable=False", "critic's values"])]:  # fmt: skip
        bad = _verl_default_config(*overrides)
        assert_refused(lambda bad=bad: check_verl_config(bad, cfg), ValueError, words + fix)
    for overrides in ([], ["critic.enable=False"], ["algorithm.adv_estimator=rloo"]):
        check_verl_config(_verl_default_config(*overrides), cfg)


def test_trainer_refuses_what_the_loss_does_not_serve():
    """The sgrpo trainer's config check (before any worker starts), on verl's own default PPO config."""
    pytest.importorskip("transfer_queue")
    from sgrpo_kernels.integrations.verl.trainer import check_verl_config

    base = _verl_default_config()
    cfg = loss_config(base.actor_rollout_ref.actor.policy_loss)
    assert cfg == rl.preset("s_grpo")
    check_verl_config(base, cfg)  # verl's defaults (no KL loss, no entropy bonus, no KL in reward) pass
    for key, value, words in [("actor_rollout_ref.actor.use_kl_loss", True, "use_kl_loss=True"),
                              # the override it suggested could not be pasted (no Hydra path, quotes or _target_)
                              ("actor_rollout_ref.actor.entropy_coeff", 0.01,
                               ["entropy_coeff=0.01", "policy_loss.sgrpo_loss=\"entropy_coef=",
                                "'+actor_rollout_ref.actor.policy_loss.sgrpo_loss=",
                                "'++actor_rollout_ref.actor.policy_loss._target_="]),
                              ("algorithm.use_kl_in_reward", True, "use_kl_in_reward=True"),
                              ("actor_rollout_ref.rollout.n", 1, "rollout.n=1"),
                              # was TypeError: '<' not supported between instances of 'NoneType' and 'int'
                              ("actor_rollout_ref.rollout.n", None, ["rollout.n=None", "int >= 2"]),
                              ("actor_rollout_ref.rollout.n", 2.5, ["rollout.n=2.5", "int >= 2"]),
                              # was accepted, and the preset's std-divided advantages used
                              ("algorithm.norm_adv_by_std_in_grpo", False,
                               ["norm_adv_by_std_in_grpo=False", "divides by the group's std",
                                'sgrpo_loss="advantage_method=dr_grpo"'])]:  # fmt: skip
        bad = _with(base, key, value)
        assert_refused(lambda bad=bad: check_verl_config(bad, cfg), ValueError, words)
    no_std = _with(base, "algorithm.norm_adv_by_std_in_grpo", False)  # consistent with a mean-centred preset: passes
    check_verl_config(no_std, dataclasses.replace(cfg, advantage_method="dr_grpo"))
    assert_refused(lambda: check_verl_config(base, dataclasses.replace(cfg, beta=0.04)), ValueError, "beta=0.04")


def test_trainer_refuses_verl_loss_settings_the_loss_would_ignore():
    """verl's clip ratios, loss_agg_mode, ... are refused when the sgrpo loss would not use them (they were accepted,
    and the loss used the preset's 0.2, seq-mean-token-mean, ...), naming the sgrpo_loss override that sets them;
    verl's defaults (read as "not set") and values equal to the loss's pass."""
    pytest.importorskip("transfer_queue")
    from sgrpo_kernels.integrations.verl.trainer import check_verl_config

    base = _verl_default_config()
    cfg = loss_config(base.actor_rollout_ref.actor.policy_loss)
    actor, pl = "actor_rollout_ref.actor", "actor_rollout_ref.actor.policy_loss"
    for key, value, words in [(f"{actor}.clip_ratio_high", 0.28, ["clip_ratio_high=0.28", "epsilon_high=0.2",
                                                                  'sgrpo_loss="epsilon_high=0.28"', "SGRPOPolicy"]),
                              (f"{actor}.clip_ratio_low", 0.1, ["clip_ratio_low=0.1", 'sgrpo_loss="epsilon_low=0.1"']),
                              (f"{actor}.clip_ratio", 0.3, ['sgrpo_loss="epsilon_low=0.3,epsilon_high=0.3"']),
                              (f"{actor}.clip_ratio_c", 10.0, ["clip_ratio_c=10.0", 'sgrpo_loss="dual_clip=10.0"']),
                              (f"{actor}.loss_agg_mode", "seq-mean-token-sum",
                               ["loss_agg_mode='seq-mean-token-sum'", 'sgrpo_loss="loss_agg=seq-mean-token-sum"']),
                              (f"{actor}.loss_scale_factor", 512, ['sgrpo_loss="max_completion_length=512"']),
                              (f"{actor}.tau_pos", 2.0, ["tau_pos=2.0", 'sgrpo_loss="sapo_tau_pos=2.0"']),
                              (f"{pl}.clip_cov_ratio", 0.05, ["policy_loss.clip_cov_ratio=0.05", "cov_ratio=0.05"]),
                              (f"{pl}.dro_beta", 0.5, ["policy_loss.dro_beta=0.5", "no such setting"])]:  # fmt: skip
        bad = _with(base, key, value)
        assert_refused(lambda bad=bad: check_verl_config(bad, cfg), ValueError, words)
    # a verl setting equal to what the loss uses passes: set on our side (sgrpo_loss), or the preset's own value
    for key, value, changes in [(f"{actor}.clip_ratio_high", 0.28, {"epsilon_high": 0.28}),
                                (f"{actor}.clip_ratio_c", 10.0, {"dual_clip": 10.0}),
                                (f"{actor}.loss_agg_mode", "seq-mean-token-mean", {}),
                                (f"{actor}.loss_agg_mode", "token-mean", {"loss_agg": "token-mean"})]:  # fmt: skip
        check_verl_config(_with(base, key, value), dataclasses.replace(cfg, **changes))
    dppo = dataclasses.replace(cfg, policy_term="dppo_tv")
    assert_refused(lambda: check_verl_config(_with(base, f"{actor}.clip_ratio_c", 10.0), dppo), ValueError,
                   'sgrpo_loss="dppo_ratio_cap=10.0"')  # fmt: skip
    from_keys = loss_config({"loss_mode": "s_grpo", "sgrpo_loss": "epsilon_high=0.28"})  # the suggested override
    check_verl_config(_with(base, f"{actor}.clip_ratio_high", 0.28), from_keys)


def _with(config, key: str, value):
    """A copy of the OmegaConf `config` with the dotted `key` set to `value`."""
    from omegaconf import open_dict

    out = config.copy()
    with open_dict(out):
        parent, leaf = key.rsplit(".", 1)
        node = out
        for part in parent.split("."):
            node = node[part]
        node[leaf] = value
    return out


# ------------------------------------------------------------------ the field's losses against verl's own functions

# our preset -> verl 0.9.1's registered loss_mode
FIELD_MODES = {"dppo_tv": "dppo_tv", "dppo_kl": "dppo_kl", "cispo": "cispo", "sapo": "sapo", "gmpo": "geo_mean",
               "clip_cov": "clip_cov", "kl_cov": "kl_cov"}  # fmt: skip
VERL_AGGS = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
# verl's sapo and geo_mean aggregate their own way whatever loss_agg_mode says (sapo: seq-mean-token-mean; geo_mean: a
# mean over the rows of the sequence term, which is seq-mean-token-mean when no row is empty)
OWN_AGG = {"sapo": "seq-mean-token-mean", "gmpo": "seq-mean-token-mean"}


def _verl_actor_config(agg: str, **policy_loss):
    from verl.workers.config import ActorConfig, PolicyLossConfig

    return ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, ppo_mini_batch_size=1,
                       loss_agg_mode=agg, policy_loss=PolicyLossConfig(**policy_loss))  # fmt: skip


def _field_inputs(seed: int, b: int = 6, t: int = 9):
    """Random log-probs (float64), off-policy old log-probs, per-completion advantages as verl's [B, T], and a mask
    with lengths 1..T and a hole (no empty row: verl counts empty rows in some denominators, the RL layer does not)."""
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(b, t, generator=g, dtype=torch.float64) * 4 - 0.01
    old = (logp + 0.35 * torch.randn(b, t, generator=g, dtype=torch.float64)).clamp(max=-1e-4)
    lengths = torch.tensor([t, 1, 4, t - 1, 2, 6])[:b]
    mask = torch.arange(t).unsqueeze(0) < lengths.unsqueeze(1)
    mask[0, 3] = False
    adv = torch.randn(b, generator=g, dtype=torch.float64)
    adv[2] = 0.0
    return logp, old, mask, adv


@pytest.mark.parametrize("agg", VERL_AGGS)
@pytest.mark.parametrize("name", list(FIELD_MODES))
def test_field_losses_equal_verls_registered_functions(name, agg):
    """Loss and gradient w.r.t. the log-probs of each preset equal verl 0.9.1's own registered policy loss, for every
    aggregation mode verl accepts, on random inputs with masks and off-policy old log-probs. Clip-Cov draws with the
    global generator in both (the same seed); kl_cov's and clip_cov's token ratios are raised so that tokens are
    selected."""
    from verl.trainer.ppo.core_algos import get_policy_loss_fn

    extra = {"clip_cov": {"cov_ratio": 0.05, "clip_cov_lb": -0.3, "clip_cov_ub": 0.3},
             "kl_cov": {"cov_ratio": 0.1}}.get(name, {})  # fmt: skip
    verl_extra = {"clip_cov": {"clip_cov_ratio": 0.05, "clip_cov_lb": -0.3, "clip_cov_ub": 0.3},
                  "kl_cov": {"kl_cov_ratio": 0.1}}.get(name, {})  # fmt: skip
    cfg = dataclasses.replace(rl.preset(name), loss_agg=OWN_AGG.get(name, agg), **extra)
    logp, old, mask, adv = _field_inputs(len(name) * 10 + VERL_AGGS.index(agg))
    x = logp.clone().requires_grad_()
    torch.manual_seed(3)
    ours, metrics = rl.policy_loss(x, adv, mask, cfg, old_logp=old)
    (g_ours,) = torch.autograd.grad(ours, x)
    y = logp.clone().requires_grad_()
    fn = get_policy_loss_fn(FIELD_MODES[name])
    torch.manual_seed(3)
    theirs, _ = fn(old, y, adv.unsqueeze(1).expand_as(logp) * mask, mask.to(torch.float64), loss_agg_mode=agg,
                   config=_verl_actor_config(agg, **verl_extra))  # fmt: skip
    (g_theirs,) = torch.autograd.grad(theirs, y)
    # verl's token-count denominators carry + 1e-8 (n + 1e-8 with n >= 1: a relative 1e-8 per row)
    torch.testing.assert_close(ours, theirs, rtol=1e-7, atol=1e-7)
    torch.testing.assert_close(g_ours, g_theirs, rtol=1e-7, atol=1e-8)
    if name in ("clip_cov", "kl_cov", "cispo"):
        assert float(metrics["policy_term_frac"]) > 0  # the term's selection or clipping was exercised


@pytest.mark.parametrize("name", ["dppo_tv", "dppo_kl"])
def test_dppo_region_equal_verl_where_it_masks(name):
    """DPPO with thresholds tight enough that the region masks tokens (verl's keys clip_ratio_low / _high)."""
    from verl.trainer.ppo.core_algos import get_policy_loss_fn

    cfg = dataclasses.replace(rl.preset(name), epsilon_low=0.01, epsilon_high=0.02, dppo_ratio_cap=1.3)
    logp, old, mask, adv = _field_inputs(5)
    x = logp.clone().requires_grad_()
    ours, metrics = rl.policy_loss(x, adv, mask, cfg, old_logp=old)
    (g_ours,) = torch.autograd.grad(ours, x)
    c = _verl_actor_config("token-mean")
    c = dataclasses.replace(c, clip_ratio_low=0.01, clip_ratio_high=0.02, clip_ratio_c=1.3)
    y = logp.clone().requires_grad_()
    theirs, _ = get_policy_loss_fn(name)(old, y, adv.unsqueeze(1).expand_as(logp) * mask, mask.to(torch.float64),
                                         loss_agg_mode="token-mean", config=c)  # fmt: skip
    torch.testing.assert_close(ours, theirs, rtol=1e-7, atol=1e-10)
    torch.testing.assert_close(g_ours, torch.autograd.grad(theirs, y)[0], rtol=1e-7, atol=1e-10)
    assert 0 < float(metrics["policy_term_frac"]) < 1


def test_field_presets_carry_verl_defaults():
    """Each preset's numbers are verl 0.9.1's defaults for its loss mode, read from verl's own config classes."""
    c = _verl_actor_config("token-mean")
    pl = c.policy_loss
    for name in FIELD_MODES:
        p = rl.preset(name)
        assert (p.epsilon_low, p.epsilon_high) == (c.clip_ratio_low, c.clip_ratio_high) == (c.clip_ratio,) * 2
        if name not in OWN_AGG:
            assert p.loss_agg == c.loss_agg_mode
    assert rl.preset("dppo_tv").dppo_ratio_cap == rl.preset("dppo_kl").dppo_ratio_cap == c.clip_ratio_c
    assert (rl.preset("sapo").sapo_tau_pos, rl.preset("sapo").sapo_tau_neg) == (c.tau_pos, c.tau_neg)
    cc, kc = rl.preset("clip_cov"), rl.preset("kl_cov")
    assert (cc.cov_ratio, cc.clip_cov_lb, cc.clip_cov_ub) == (pl.clip_cov_ratio, pl.clip_cov_lb, pl.clip_cov_ub)
    assert (kc.cov_ratio, kc.kl_cov_coef) == (pl.kl_cov_ratio, pl.ppo_kl_coef)
