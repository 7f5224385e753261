"""Trainer: a training step, grouped-prompt forward, resume equivalence, the non-finite guard and the CLI, all on a
tiny random-weight Llama built in-process (no GGUF, no downloads)."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("transformers")

from conftest import NanGrad, tiny_argv, tiny_cfg  # noqa: E402

import train.loop as loop  # noqa: E402
import train.loss as update_module  # noqa: E402
import train.step as step_module  # noqa: E402
from sgrpo_kernels import sgrpo_loss  # noqa: E402
from sgrpo_kernels.rl import preset  # noqa: E402
from train.__main__ import main  # noqa: E402
from train.config import TrainConfig  # noqa: E402
from train.config.cli import parse_args  # noqa: E402
from train.model import head_weight, tiny_model_and_tokenizer  # noqa: E402
from train.policy import completion_hidden, policy_hidden, policy_hidden_grouped  # noqa: E402
from train.rollout import completion_mask, rollout  # noqa: E402
from train.tasks import ArithmeticTask  # noqa: E402

# A loss that always has a gradient on a random model (whose rewards are all 0): an entropy bonus, no filter.
LOSS = {"entropy_filter": None, "entropy_coef": 0.01}


def test_completion_mask_keeps_first_eos():
    ids = torch.tensor([[5, 6, 2, 2, 2], [5, 2, 7, 8, 2], [5, 6, 7, 8, 9]])
    assert completion_mask(ids, {2}).tolist() == [[1, 1, 1, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 1, 1]]


def test_grouped_forward_matches_full_sequences():
    model, _ = tiny_model_and_tokenizer(0)
    b, g, p, t = 3, 4, 7, 5
    pids = torch.randint(3, 50, (b, p))
    pmask = torch.ones(b, p, dtype=torch.long)
    pmask[0, :3] = 0  # left padding
    cids = torch.randint(3, 50, (b * g, t))
    cmask = torch.ones(b * g, t, dtype=torch.bool)
    cmask[1, 3:] = False  # right padding after EOS
    full = policy_hidden(
        model,
        torch.cat([pids.repeat_interleave(g, 0), cids], 1),
        torch.cat([pmask.repeat_interleave(g, 0), cmask.long()], 1),
    )[:, p - 1 : -1]
    grouped = policy_hidden_grouped(model, pids, pmask, cids, cmask, g)
    torch.testing.assert_close(grouped[cmask], full[cmask], rtol=1e-5, atol=1e-5)
    w = torch.randn_like(full)
    params = [q for q in model.parameters() if q.requires_grad]
    g_full = torch.autograd.grad((full * w)[cmask].sum(), params, allow_unused=True)
    g_grp = torch.autograd.grad((grouped * w)[cmask].sum(), params, allow_unused=True)
    for a, c in zip(g_full, g_grp):
        if a is not None:
            torch.testing.assert_close(c, a, rtol=1e-4, atol=1e-5)


def test_training_step_changes_weights():
    torch.manual_seed(0)
    model, tok = tiny_model_and_tokenizer(0)
    problems = ArithmeticTask("1").sample(2, __import__("random").Random(0))
    batch = rollout(model, tok, problems, group_size=4, max_new_tokens=5, temperature=1.0, top_p=1.0)
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0])  # pretend some were right
    cfg = preset("s_grpo")
    cfg = type(cfg)(**{**cfg.__dict__, "entropy_filter": None})
    adv = cfg.advantages(rewards, 4)
    weights, counts = cfg.conflict_weights(batch.completion_ids, batch.completion_mask, adv, 4)
    hidden = completion_hidden(model, batch, 4)
    assert hidden.shape[:2] == batch.completion_ids.shape
    targets = torch.where(batch.completion_mask, batch.completion_ids, -100)
    loss, metrics = sgrpo_loss(
        hidden,
        head_weight(model),
        targets,
        adv,
        batch.completion_mask,
        cfg,
        token_weights=weights,
        conflict_counts=counts,
        compute_entropy=True,
    )
    assert torch.isfinite(loss) and metrics["entropy_mean"] > 0
    before = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    opt.step()
    assert any(not torch.equal(a, p) for a, p in zip(before, model.parameters()))


def test_run_writes_metrics_and_summary(tmp_path):
    summary = loop.train(tiny_cfg(tmp_path / "run", max_steps=2), LOSS)
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in lines if r.get("event") != "eval"]
    evals = [r for r in lines if r.get("event") == "eval"]
    assert [r["step"] for r in steps] == [1, 2] and [r["step"] for r in evals] == [0, 2]
    need = (
        "step reward_mean reward_std accuracy zero_var_frac entropy_mean grad_norm clip_frac masked_frac "
        "filtered_frac completion_len kl_from_init collapse tokens_per_s step_s peak_mem_mb"
    ).split()
    for r in steps:
        assert all(k in r for k in need), set(need) - set(r)
    assert steps[-1]["kl_from_init"] > 0  # lr 1e-3 moved the policy away from its initial log-probs
    assert {"eval_acc", "eval_acc_se", "eval_pass@2", "eval_maj@2"} <= set(evals[0])
    assert summary["steps"] == 2 and "after" in summary
    assert (tmp_path / "run" / "checkpoint" / "state.pt").exists()


def test_resume_is_exact(tmp_path, monkeypatch):
    ref = loop.train(tiny_cfg(tmp_path / "a" / "run", max_steps=3), LOSS)
    ref_steps = [json.loads(x) for x in (tmp_path / "a" / "run" / "metrics.jsonl").read_text().splitlines()]
    ref_losses = [r["loss"] for r in ref_steps if r.get("event") != "eval"]
    assert ref["steps"] == 3

    # The same run, interrupted (Ctrl-C) during step 3, then resumed.
    calls = {"n": 0}
    real_rollout = step_module.rollout

    def interrupting_rollout(*args, **kwargs):
        if not kwargs.get("greedy") and kwargs.get("group_size") == 4:  # a training rollout
            calls["n"] += 1
            if calls["n"] == 3:
                raise KeyboardInterrupt
        return real_rollout(*args, **kwargs)

    monkeypatch.setattr(step_module, "rollout", interrupting_rollout)
    out = loop.train(tiny_cfg(tmp_path / "b" / "run", max_steps=3), LOSS)
    assert out["interrupted"] and out["steps"] == 2
    monkeypatch.setattr(step_module, "rollout", real_rollout)
    resumed = loop.train(tiny_cfg(tmp_path / "b" / "run", max_steps=3, resume=True), LOSS)
    assert resumed["steps"] == 3
    lines = [json.loads(x) for x in (tmp_path / "b" / "run" / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in lines if r.get("event") != "eval"]
    assert len(losses) == 3
    assert losses == pytest.approx(ref_losses, rel=1e-6, abs=1e-9)  # step 3 after the resume == uninterrupted
    assert losses[2] != 0.0


@pytest.mark.parametrize("kind", ["loss", "grad"])
def test_non_finite_guard_skips_step(tmp_path, monkeypatch, kind):
    real = update_module.sgrpo_loss

    def bad_loss(*args, **kwargs):
        loss, metrics = real(*args, **kwargs)
        return (loss * float("nan") if kind == "loss" else NanGrad.apply(loss)), metrics

    monkeypatch.setattr(update_module, "sgrpo_loss", bad_loss)
    model, tok = tiny_model_and_tokenizer(0)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    loop.train(tiny_cfg(tmp_path / "run", max_steps=2, kl_every=0, eval_k=0), LOSS, model_and_tokenizer=(model, tok))
    for n, p in model.named_parameters():
        assert torch.equal(p, before[n]), n  # the weights were never touched
    steps = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["skipped"] for r in steps if r.get("event") != "eval"] == [1, 1]


def test_cli_help_lists_every_field(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    for flag in (
        "--preset",
        "--model",
        "--task",
        "--max-steps",
        "--output-dir",
        "--seed",
        "--resume",
        "--lr",
        "--group-size",
        "--lora",
        "--loss.beta",
        "--loss.entropy_floor",
    ):
        assert flag in text
    for name in TrainConfig.__dataclass_fields__:
        assert f"--{name.replace('_', '-')}" in text


def test_cli_overrides():
    cfg, over = parse_args(
        [
            "--preset",
            "gtpo",
            "--max-steps",
            "7",
            "--lora",
            "--loss.beta",
            "0.1",
            "--loss.entropy_filter",
            "ln2",
            "--run-preset",
            "smoke",
        ]
    )
    assert cfg.preset == "gtpo" and cfg.max_steps == 7 and cfg.lora is True and cfg.group_size == 4
    assert over == {"beta": 0.1, "entropy_filter": "ln2"}
    assert cfg.loss_config(over).beta == 0.1
    with pytest.raises(SystemExit):
        parse_args(["--preset", "nope"])
    with pytest.raises(SystemExit):  # the RL layer's message, as an argparse error
        parse_args(["--loss.epsilon_low", "2.0"])


def test_cli_explicit_flag_equal_to_default_beats_the_run_preset():
    """`--max-steps 30` (the dataclass default) beats the smoke preset's 2, `--lr` at its default beats the gpu
    preset's: a flag typed with the default's value was taken as "not given"."""
    default_steps = TrainConfig.__dataclass_fields__["max_steps"].default
    assert parse_args(["--run-preset", "smoke"])[0].max_steps != default_steps
    assert parse_args(["--run-preset", "smoke", "--max-steps", str(default_steps)])[0].max_steps == default_steps
    default_lr = TrainConfig.__dataclass_fields__["lr"].default
    assert parse_args(["--run-preset", "gpu"])[0].lr != default_lr
    assert parse_args(["--run-preset", "gpu", "--lr", str(default_lr)])[0].lr == default_lr


def test_cli_runs_and_plots(tmp_path):
    out = tmp_path / "cli"
    assert main(tiny_argv(out, "--max-steps", "2", "--preset", "gtpo")) == 0
    assert json.loads((out / "summary.json").read_text())["steps"] == 2
    from study.plot import main as plot_main

    assert plot_main([str(out), "-o", str(tmp_path / "p.png")]) == 0
    assert (tmp_path / "p.png").stat().st_size > 1000


def test_grpo_preset_loads_reference(tmp_path, capsys):
    loop.train(tiny_cfg(tmp_path / "run", preset="grpo", max_steps=1, eval_k=0, kl_every=0))
    assert "reference model:" in capsys.readouterr().out


def test_lora_and_multiple_epochs(tmp_path):
    pytest.importorskip("peft")
    loop.train(tiny_cfg(tmp_path / "run", max_steps=2, lora=True, lora_r=4, ppo_epochs=2, eval_k=0, lr=1e-2), LOSS)
    steps = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in steps if r.get("event") != "eval"]
    assert all(r["grad_norm"] > 0 and r["skipped"] == 0 for r in steps)
    assert steps[-1]["kl_from_init"] > 0


def test_one_target_check_per_step(tmp_path, monkeypatch):
    """old_logp, ref_logp, both PPO epochs' losses and the KL probe run on the same targets: the range check (one
    host sync) runs on the first of them only. Counted between consecutive step records (a step's rollout, update
    and KL probe; the held-out evals call no log-prob op)."""
    import sgrpo_kernels.ops as ops
    import train.policy as policy_module
    from train.run.metrics import MetricsLog

    monkeypatch.delenv("SGRPO_CHECK_TARGETS", raising=False)
    checks, ops_calls, per_step, last = [0], [0], [], [None]
    real_check, real_ll, real_write = ops.check_target_values, policy_module.linear_logprobs, MetricsLog.write

    def counting_check(*args, **kwargs):
        checks[0] += 1
        return real_check(*args, **kwargs)

    def counting_ll(*args, **kwargs):
        ops_calls[0] += 1
        return real_ll(*args, **kwargs)

    def counting_write(self, record):
        if last[0] is not None and record.get("event") != "eval":
            per_step.append((checks[0] - last[0][0], ops_calls[0] - last[0][1]))
        last[0] = (checks[0], ops_calls[0])
        return real_write(self, record)

    monkeypatch.setattr(ops, "check_target_values", counting_check)
    monkeypatch.setattr(policy_module, "linear_logprobs", counting_ll)  # old_logp, ref_logp and the KL probe
    monkeypatch.setattr(MetricsLog, "write", counting_write)
    loop.train(tiny_cfg(tmp_path / "run", preset="grpo", max_steps=2, ppo_epochs=2, kl_every=1, eval_k=0))
    assert per_step == [(1, 3), (1, 3)]  # 3 forward-only calls + 2 losses per step, one check
    assert checks[0] == 1 + 2  # + the probe's own check when it was created


def test_renamed_metric_fails_loudly(tmp_path, monkeypatch):
    """A metric the RL layer stops reporting (or renames) is a KeyError, not a NaN in metrics.jsonl."""
    real = update_module.sgrpo_loss

    def renamed(*args, **kwargs):
        loss, metrics = real(*args, **kwargs)
        metrics["entropy"] = metrics.pop("entropy_mean")
        return loss, metrics

    monkeypatch.setattr(update_module, "sgrpo_loss", renamed)
    with pytest.raises(KeyError, match="entropy_mean"):
        loop.train(tiny_cfg(tmp_path / "run", max_steps=1, kl_every=0, eval_k=0), LOSS)


def test_metrics_log_fresh_and_resumed(tmp_path):
    from train.run.metrics import MetricsLog

    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 9}\n')
    with MetricsLog(path) as log:  # a fresh run starts empty
        for step in (0, 1, 2, 3):
            log.write({"step": step, "x": step})
    assert [json.loads(x)["step"] for x in path.read_text().splitlines()] == [0, 1, 2, 3]
    with MetricsLog(path, keep_lines=3) as log:  # resumed from a checkpoint that had written 3 records
        assert log.lines == 3
        log.write({"step": 3, "x": 30})
        assert log.lines == 4
    assert [json.loads(x)["x"] for x in path.read_text().splitlines()] == [0, 1, 2, 30]
    with pytest.raises(RuntimeError):
        log.write({"step": 4})


def test_cli_bool_flags_are_strict(capsys):
    assert parse_args(["--lora", "off", "--progress", "YES"])[0].lora is False
    assert parse_args(["--lora"])[0].lora is True
    with pytest.raises(SystemExit):
        parse_args(["--lora", "maybe"])
    err = capsys.readouterr().err
    assert "--lora" in err and "maybe" in err


def test_the_s_grpo_loss_default_applies_to_s_grpo_only():
    """Regression: the trainer's default `--loss entropy_filter=quantile:0.75` (meant for s_grpo) was applied to every
    preset, so `--preset grpo` silently ran with a completion entropy filter GRPO does not have."""
    from sgrpo_kernels.rl import preset
    from train.config import PRESET_LOSS_DEFAULTS, TrainConfig
    from train.config.cli import parse_args

    for name in ("grpo", "gtpo", "dapo", "grpo_tc"):
        assert TrainConfig(preset=name).loss_config() == preset(name), name
        cfg, _ = parse_args(["--preset", name])
        assert cfg.loss_config() == preset(name), name
    assert TrainConfig().loss_config().entropy_filter == "quantile:0.75" == PRESET_LOSS_DEFAULTS["s_grpo"].split("=")[1]
    assert TrainConfig(loss="").loss_config() == preset("s_grpo")  # "" = the preset as defined
    assert TrainConfig(preset="grpo", loss="beta=0").loss_config().beta == 0.0
