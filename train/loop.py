"""The training loop, top to bottom: rollouts -> rewards -> advantages -> conflict weights -> sgrpo_loss on hidden
states -> optimizer step, with evaluation, KL-from-init probes, collapse detection, checkpoints and resume."""

from __future__ import annotations

import dataclasses
import json
import math
import random
import time
import warnings
from pathlib import Path

import torch

from sgrpo_kernels import linear_logprobs, sgrpo_loss
from train.config import TrainConfig
from train.model import (
    add_lora,
    head_weight,
    load_model_and_tokenizer,
    param_bytes,
    policy_hidden_grouped,
    resolve_device,
    resolve_dtype,
    set_trainable,
)
from train.rewards import answers_match
from train.rollout import Batch, VLLMEngine, majority, rollout
from train.tasks import make_task

# ----------------------------------------------------------------------------------------------------- helpers


def completion_hidden(model, batch: Batch, group_size: int) -> torch.Tensor:
    """Hidden states [N, T, D] at the positions that predict each completion token; each group's shared prompt is
    run once (rows g*G .. g*G+G-1 have the same prompt)."""
    return policy_hidden_grouped(
        model,
        batch.prompt_ids[::group_size],
        batch.prompt_mask[::group_size],
        batch.completion_ids,
        batch.completion_mask,
        group_size,
    )


@torch.no_grad()
def token_logprobs(model, batch: Batch, temperature: float, backend: str | None, group_size: int) -> torch.Tensor:
    """Forward-only log-probs [N, T] of the completion tokens (no autograd state, no logits)."""
    hidden = completion_hidden(model, batch, group_size)
    targets = torch.where(batch.completion_mask, batch.completion_ids, -100)
    logp, _ = linear_logprobs(
        hidden, head_weight(model), targets, temperature=temperature, return_entropy=False, backend=backend
    )
    return logp


def lr_lambda(cfg: TrainConfig):
    def f(step: int) -> float:
        if step < cfg.warmup_steps:
            return (step + 1) / (cfg.warmup_steps + 1)
        progress = (step - cfg.warmup_steps) / max(1, cfg.max_steps - cfg.warmup_steps)
        return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    return f


def peak_mem_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    try:
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
    except ImportError:  # pragma: no cover
        return float("nan")


def is_collapsed(history: list[dict], cfg: TrainConfig) -> bool:
    """Collapse rule: over the last `collapse_window` steps, every step had mean token entropy < `collapse_entropy`
    AND no learning signal (every group's rewards equal, zero_var_frac == 1) AND the batch was not all solved
    (reward_mean < max). A policy that emits one near-deterministic wrong answer per prompt trips it; a policy that
    has solved the task does not."""
    recent = history[-cfg.collapse_window :]
    if len(recent) < cfg.collapse_window:
        return False
    return all(
        h["entropy_mean"] < cfg.collapse_entropy and h["zero_var_frac"] >= 1.0 and h["accuracy"] < 1.0 for h in recent
    )


@torch.no_grad()
def evaluate(model, tok, problems, cfg: TrainConfig, engine=None, system_prompt: str | None = None) -> dict:
    """Held-out greedy accuracy (with its standard error), and pass@k / maj@k from k samples at the train temperature.
    Uses its own RNG (fork_rng), so evaluating never changes the training trajectory."""

    def run(greedy: bool, n: int, probs) -> list[str]:
        texts = []
        for i in range(0, len(probs), max(1, cfg.eval_batch_size // n)):
            chunk = probs[i : i + max(1, cfg.eval_batch_size // n)]
            texts += rollout(
                model,
                tok,
                chunk,
                group_size=n,
                max_new_tokens=cfg.max_new_tokens,
                temperature=cfg.temperature,
                top_p=cfg.top_p,
                system_prompt=system_prompt,
                greedy=greedy,
                engine=engine,
            ).texts
        return texts

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed + 12345)
        greedy = run(True, 1, problems)
        acc = sum(answers_match_text(t, p.answer) for t, p in zip(greedy, problems)) / len(problems)
        out = {
            "eval_acc": acc,
            "eval_acc_se": math.sqrt(acc * (1 - acc) / len(problems)),
            "eval_n": len(problems),
            "eval_samples": [
                {"q": p.question, "answer": p.answer, "greedy": t} for p, t in zip(problems[:5], greedy[:5])
            ],
        }
        k = cfg.eval_k
        if k > 0:
            subset = problems[: cfg.eval_k_problems]
            sampled = run(False, k, subset)
            groups = [sampled[i * k : (i + 1) * k] for i in range(len(subset))]
            out[f"eval_pass@{k}"] = sum(
                any(answers_match_text(t, p.answer) for t in g) for g, p in zip(groups, subset)
            ) / len(subset)
            out[f"eval_maj@{k}"] = sum(answers_match(majority(g), p.answer) for g, p in zip(groups, subset)) / len(
                subset
            )
    return out


def answers_match_text(text: str, answer: str) -> bool:
    from train.rewards import correctness_reward

    return correctness_reward(text, answer) > 0


# ----------------------------------------------------------------------------------------------------- checkpoints


def rng_snapshot(task_rng: random.Random) -> dict:
    return {
        "torch_rng": torch.get_rng_state(),
        "task_rng": task_rng.getstate(),
        "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
    }


def save_checkpoint(path: Path, model, optimizer, scheduler, step: int, rngs: dict, history, cfg):
    """`rngs` is the RNG state at the *start* of step `step + 1` (a Ctrl-C mid-step has already advanced the live
    generators), so --resume replays that step exactly."""
    path.mkdir(parents=True, exist_ok=True)
    trainable = {n: p.detach().cpu() for n, p in model.named_parameters() if p.requires_grad}
    state = {
        "step": step,
        "trainable": trainable,  # full weights of trained layers, or the LoRA adapter; frozen ones are the base model
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        **rngs,
        "history": history,
        "config": dataclasses.asdict(cfg),
    }
    tmp = path / "state.pt.tmp"
    torch.save(state, tmp)
    tmp.replace(path / "state.pt")  # atomic: a Ctrl-C during the save never leaves a torn checkpoint


def load_checkpoint(path: Path, model, optimizer, scheduler, task_rng: random.Random):
    state = torch.load(path / "state.pt", weights_only=False)
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, value in state["trainable"].items():
            params[name].copy_(value)
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    torch.set_rng_state(state["torch_rng"])
    if state["cuda_rng"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda_rng"])
    task_rng.setstate(state["task_rng"])
    return state["step"], state["history"]


# ----------------------------------------------------------------------------------------------------- the loop


def train(cfg: TrainConfig, loss_overrides: dict | None = None, model_and_tokenizer=None) -> dict:
    """Run RL training; returns a summary dict (also written to OUTPUT_DIR/summary.json)."""
    t_start = time.time()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    loss_cfg = cfg.loss_config(loss_overrides)  # preset + cfg.loss + --loss.FIELD
    out_dir = Path(cfg.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    ckpt_dir = out_dir / "checkpoint"
    if not cfg.resume and (out_dir / "metrics.jsonl").exists():
        (out_dir / "metrics.jsonl").unlink()
    (out_dir / "config.json").write_text(
        json.dumps({"train": dataclasses.asdict(cfg), "loss": dataclasses.asdict(loss_cfg)}, indent=2, default=str)
    )

    device = resolve_device(cfg.device)
    dtype = resolve_dtype(cfg.dtype, device)
    torch.manual_seed(cfg.seed)
    if model_and_tokenizer is None:
        model, tok = load_model_and_tokenizer(cfg.model, device, dtype, cfg.seed)
    else:
        model, tok = model_and_tokenizer
    ref_model = None
    if loss_cfg.needs_ref:  # only the KL presets (grpo) pay for a frozen reference
        ref_model, _ = load_model_and_tokenizer(cfg.model, device, dtype, cfg.seed)
        ref_model.requires_grad_(False).eval()
        print(f"reference model: {param_bytes(ref_model) / 2**20:.1f} MiB of weights")
    if cfg.lora:
        model = add_lora(model, cfg.lora_r, cfg.lora_alpha)
    params = set_trainable(model, cfg.train_layers, cfg.train_lm_head)
    print(
        f"policy: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M params, "
        f"{sum(p.numel() for p in params) / 1e6:.1f}M trained, {dtype}, {device}; loss preset {loss_cfg.name}"
    )
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.99))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(cfg))
    engine = None
    if cfg.use_vllm == "on" or (cfg.use_vllm == "auto" and device.type == "cuda" and not cfg.lora):
        try:
            engine = VLLMEngine(model, cfg.model)
        except Exception as exc:  # noqa: BLE001 -- vllm missing or unable to start: fall back to HF generate
            if cfg.use_vllm == "on":
                raise
            print(f"vLLM unavailable ({type(exc).__name__}); using HF generate")

    task = make_task(
        cfg.task,
        difficulty=cfg.difficulty,
        data_path=cfg.data_path,
        prompt_template=cfg.prompt_template,
        heldout_frac=cfg.heldout_frac,
        seed=cfg.seed,
    )
    task_rng = random.Random(cfg.seed)
    heldout = task.heldout(cfg.eval_problems, cfg.seed)
    system_prompt = cfg.system_prompt if cfg.system_prompt is not None else task.system_prompt

    # KL-from-init probes: completions sampled once from the initial policy; their initial log-probs are cached, so
    # no reference model stays resident. Stored in the run directory so a resumed run uses the same probes.
    probe_path = out_dir / "probe.pt"
    if cfg.kl_every and cfg.resume and probe_path.exists():
        probe = torch.load(probe_path, weights_only=False)
    elif cfg.kl_every:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(cfg.seed + 777)
            probe_batch = rollout(
                model,
                tok,
                task.sample(cfg.probe_size, random.Random(f"probe-{cfg.seed}")),
                group_size=1,
                max_new_tokens=cfg.max_new_tokens,
                temperature=cfg.temperature,
                top_p=cfg.top_p,
                system_prompt=system_prompt,
            )
        probe = {"batch": probe_batch, "logp0": token_logprobs(model, probe_batch, cfg.temperature, cfg.backend, 1)}
        torch.save(probe, probe_path)

    start_step, history = 0, []
    if cfg.resume:
        if not (ckpt_dir / "state.pt").exists():
            raise FileNotFoundError(f"--resume: no checkpoint at {ckpt_dir / 'state.pt'}")
        start_step, history = load_checkpoint(ckpt_dir, model, optimizer, scheduler, task_rng)
        lines = (out_dir / "metrics.jsonl").read_text().splitlines() if (out_dir / "metrics.jsonl").exists() else []
        keep = [ln for ln in lines if json.loads(ln).get("step", 0) <= start_step]  # drop steps after the checkpoint
        (out_dir / "metrics.jsonl").write_text("".join(ln + "\n" for ln in keep))
        print(f"resumed from step {start_step}")
    log = (out_dir / "metrics.jsonl").open("a")

    def write(record: dict) -> None:
        log.write(json.dumps(record) + "\n")
        log.flush()

    summary: dict = {"output_dir": str(out_dir), "preset": loss_cfg.name, "model": cfg.model}
    if start_step == 0:
        ev = evaluate(model, tok, heldout, cfg, engine, system_prompt)
        summary["before"] = ev
        write({"step": 0, "event": "eval", **ev})
        print(f"held-out before: acc {ev['eval_acc']:.3f} +- {ev['eval_acc_se']:.3f} (n={ev['eval_n']})")
    elif (out_dir / "summary.json").exists():
        summary["before"] = json.loads((out_dir / "summary.json").read_text()).get("before")

    bar = None
    if cfg.progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=cfg.max_steps, initial=start_step, desc=f"{loss_cfg.name}", dynamic_ncols=True)
    step = start_step
    kl_from_init = history[-1]["kl_from_init"] if history else 0.0
    interrupted = False
    rngs = rng_snapshot(task_rng)
    try:
        t_train = time.time()
        while step < cfg.max_steps:
            if cfg.time_budget_s and time.time() - t_train > cfg.time_budget_s:
                print(f"\ntime budget of {cfg.time_budget_s:.0f}s reached after {step} steps")
                summary["stopped_by_time_budget"] = True
                break
            t0 = time.time()
            rngs = rng_snapshot(task_rng)
            problems = task.sample(cfg.prompts_per_step, task_rng)
            batch = rollout(
                model,
                tok,
                problems,
                group_size=cfg.group_size,
                max_new_tokens=cfg.max_new_tokens,
                temperature=cfg.temperature,
                top_p=cfg.top_p,
                system_prompt=system_prompt,
                format_weight=cfg.format_reward_weight,
                engine=engine,
            )
            t_gen = time.time() - t0
            rewards = batch.rewards.to(device)
            adv, adv_stats = loss_cfg.advantages(rewards, cfg.group_size, return_stats=True)
            weights, counts = loss_cfg.conflict_weights(
                batch.completion_ids, batch.completion_mask, adv, cfg.group_size
            )
            targets = torch.where(batch.completion_mask, batch.completion_ids, -100)
            G = cfg.group_size
            old_logp = token_logprobs(model, batch, cfg.temperature, cfg.backend, G) if cfg.ppo_epochs > 1 else None
            ref_logp = token_logprobs(ref_model, batch, cfg.temperature, cfg.backend, G) if ref_model else None

            model.train()
            skipped, grad_norm, metrics = 0, float("nan"), {}
            for _ in range(cfg.ppo_epochs):
                optimizer.zero_grad(set_to_none=True)
                hidden = completion_hidden(model, batch, G)  # [N, T, D]: the policy forward never makes logits
                loss, metrics = sgrpo_loss(
                    hidden,
                    head_weight(model),
                    targets,
                    adv,
                    batch.completion_mask,
                    loss_cfg,
                    temperature=cfg.temperature,
                    old_logp=old_logp,
                    ref_logp=ref_logp,
                    token_weights=weights,
                    conflict_counts=counts,
                    rewards=rewards,
                    group_size=cfg.group_size,
                    compute_entropy=True,
                    backend=cfg.backend,
                )
                if not torch.isfinite(loss):
                    skipped += 1  # non-finite loss: no backward, no step; the weights are untouched
                    continue
                loss.backward()
                norm = torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
                grad_norm = float(norm)
                if not math.isfinite(grad_norm):
                    skipped += 1  # non-finite gradient: drop it (Adam state and weights untouched)
                    optimizer.zero_grad(set_to_none=True)
                    continue
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            with warnings.catch_warnings():  # a skipped (non-finite) update still advances the schedule
                warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step\\(\\)` before")
                scheduler.step()
            if engine is not None:
                engine.sync(model)
            step += 1

            if cfg.kl_every and (step % cfg.kl_every == 0 or step == cfg.max_steps):
                logp = token_logprobs(model, probe["batch"], cfg.temperature, cfg.backend, 1)
                d = (logp - probe["logp0"])[probe["batch"].completion_mask]  # log(pi / pi_init) on init samples
                kl_from_init = float((d.exp() - 1 - d).mean())  # k3 estimate of KL(pi_init || pi), >= 0
            n_tok = int(batch.completion_mask.sum())
            step_s = time.time() - t0
            record = {
                "step": step,
                "reward_mean": float(batch.rewards.mean()),
                "reward_std": float(batch.rewards.std()) if len(batch.rewards) > 1 else 0.0,
                "accuracy": float(batch.correct.float().mean()),
                "zero_var_frac": float(adv_stats.get("zero_variance_frac", float("nan"))),
                "entropy_mean": float(metrics.get("entropy_mean", float("nan"))),
                "grad_norm": grad_norm,
                "clip_frac": float(metrics.get("clip_frac_low", 0.0) + metrics.get("clip_frac_high", 0.0)),
                "masked_frac": float(metrics.get("zero_weight_frac", float("nan"))),
                "filtered_frac": float(metrics.get("filtered_frac", float("nan"))),
                "completion_len": n_tok / len(batch.texts),
                "kl_from_init": kl_from_init,
                "loss": float(metrics.get("loss", float("nan"))),
                "kl_ref": float(metrics.get("kl", 0.0)),
                "lr": scheduler.get_last_lr()[0],
                "skipped": skipped,
                "tokens_per_s": n_tok / step_s,
                "gen_s": t_gen,
                "step_s": step_s,
                "peak_mem_mb": peak_mem_mb(device),
                "sample": batch.texts[0],
            }
            history.append({k: record[k] for k in ("entropy_mean", "zero_var_frac", "accuracy", "kl_from_init")})
            record["collapse"] = is_collapsed(history, cfg)
            if skipped:
                print(f"step {step}: non-finite loss or gradient, {skipped} update(s) skipped")
            write(record)
            if bar is not None:
                bar.set_postfix(
                    reward=f"{record['reward_mean']:.2f}",
                    H=f"{record['entropy_mean']:.2f}",
                    gn=f"{grad_norm:.2f}",
                    refresh=False,
                )
                bar.update(1)
            if cfg.eval_every and step % cfg.eval_every == 0 and step < cfg.max_steps:
                write({"step": step, "event": "eval", **evaluate(model, tok, heldout, cfg, engine, system_prompt)})
            if cfg.save_every and step % cfg.save_every == 0:
                save_checkpoint(ckpt_dir, model, optimizer, scheduler, step, rng_snapshot(task_rng), history, cfg)
        rngs = rng_snapshot(task_rng)
    except KeyboardInterrupt:
        interrupted = True
        print(f"\ninterrupted: saving checkpoint at step {step} (continue with --resume)")
    finally:
        if bar is not None:
            bar.close()
    save_checkpoint(ckpt_dir, model, optimizer, scheduler, step, rngs, history, cfg)
    summary["steps"] = step
    if not interrupted:
        ev = evaluate(model, tok, heldout, cfg, engine, system_prompt)
        summary["after"] = ev
        write({"step": step, "event": "eval", **ev})
        print(f"held-out after:  acc {ev['eval_acc']:.3f} +- {ev['eval_acc_se']:.3f} (n={ev['eval_n']})")
        if summary.get("before"):
            b, a = summary["before"], summary["after"]
            diff_se = math.sqrt(b["eval_acc_se"] ** 2 + a["eval_acc_se"] ** 2)
            summary["delta"] = a["eval_acc"] - b["eval_acc"]
            summary["delta_in_se"] = summary["delta"] / diff_se if diff_se > 0 else float("nan")
            print(f"held-out change: {summary['delta']:+.3f} ({summary['delta_in_se']:+.1f} standard errors)")
    log.close()
    summary["wall_s"] = time.time() - t_start
    summary["interrupted"] = interrupted
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    print(f"done in {summary['wall_s']:.0f}s; metrics in {out_dir / 'metrics.jsonl'}")
    return summary
