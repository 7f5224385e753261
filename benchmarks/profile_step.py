"""Where one training step's time goes, pass by pass, measured from outside the trainer.

`python -m benchmarks.profile_step --regime decisive --arm grpo_nokl` runs a short training run of the trainer
(`python -m train`, in this process) with the study's regime and arm flags, and wraps the trainer's functions from
the outside (no change to train/): the rollout engine's generate and weight sync, the policy forwards (with grad in
the loss; forward-only for the reference, the KL-from-init probe and the mechanism measurement), every LM-head op call
(`linear_logprobs`, also the one inside `sgrpo_loss`), counted and timed with the trainer function that made it, the
LM head's own backward, the rest of the backward, gradient clipping, the optimizer step, the features' hooks.

Each wrapped call's time is split into its own ("self") time and the time of the wrapped calls inside it, so the rows
of one step add up to the step. The first `--warmup` steps are left out. Every forward and LM-head call is also
fingerprinted (the model's or head's weights and their version counters, the batch, the hidden states): a call whose
fingerprint matches an earlier call of the same step computes a result that step already has; such a call is flagged
"duplicate" and the step time without the duplicates is the floor of removing repeated work.

`--phases` (e.g. `--regime default --phases`, the default job exactly: `python -m train` with no flags) times the
whole job by phase instead: imports, model load, the rest of setup, the KL probe set-up, the held-out evals, the steps,
checkpoints, the model export.

Run the decisive regime with the vLLM environment's python (the study samples with vLLM):
  PYTHONPATH=$PWD /tmp/sgrpo-ci-venvs/vllm/bin/python -m benchmarks.profile_step --regime decisive --arm grpo_nokl
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path

import torch

from .common import RESULTS, git_sha, markdown_table

WRAPPED: dict[tuple[object, str], object] = {}  # (owner, attribute) -> the original, to restore


class Profiler:
    """A stack of wrapped calls: each call's self time (its time less the wrapped calls inside it), per step."""

    def __init__(self) -> None:
        self.stack: list[list] = []  # [call record, start, time of wrapped children]
        self.step = 0  # the step now running (0 = before the first)
        self.in_step = False
        self.calls: dict[int, list[dict]] = defaultdict(list)  # step -> its call records, in order
        self.seen: dict[int, dict[tuple, dict]] = defaultdict(dict)  # step -> fingerprint -> its first call record
        self.phases: list[tuple[str, float]] = []

    def caller(self) -> str:
        """The innermost wrapped call that names a caller (a context), for labelling ops and forwards."""
        for call, *_ in reversed(self.stack):
            if call["label"] in CONTEXTS:
                return CONTEXTS[call["label"]]
        return "?"

    @contextmanager
    def timed(self, label: str, phase: bool = False, call: dict | None = None):
        call = call if call is not None else {"label": label}
        frame = [call, time.perf_counter(), 0.0]
        self.stack.append(frame)
        try:
            yield
        finally:
            self.stack.pop()
            total = time.perf_counter() - frame[1]
            if self.stack:
                self.stack[-1][2] += total
            if phase:
                self.phases.append((label, total))
            elif self.in_step:
                call["s"] = total - frame[2]
                self.calls[self.step].append(call)

    def fingerprint(self, label: str, key: tuple, grad: bool) -> dict:
        """The call record of a call computing `key`; when this step computed the same thing before, the
        forward-only one of the two is marked duplicate (`dup_of`: the other's label); a result with grad is kept."""
        call = {"label": label, "grad": grad}
        if not self.in_step:
            return call
        first = self.seen[self.step].get(key)
        if first is None:
            self.seen[self.step][key] = call
        elif not grad or first["grad"]:
            call["dup_of"] = first["label"]
        else:
            first["dup_of"] = label
        return call


P = Profiler()
PHASES = {"on": False}  # --phases: time the whole job by phase (the steps as one phase)

# The wrapped calls that say who makes the op calls and forwards inside them.
CONTEXTS = {
    "reference log-probs": "reference_logprobs (train/policy.py)",
    "KL-from-init probe": "kl_from_init (train/probe.py)",
    "mechanism measure": "measure (train/mechanism.py)",
    "sampler correction: head_logprobs": "head_logprobs (train/mechanism.py, via update.py:loss_function)",
    "sgrpo_loss (policy_loss math)": "sgrpo_loss (train/update.py:forward_loss)",
    "gt_likelihood": "gt_likelihood (train/gt_likelihood.py)",
}


def tensor_key(t: torch.Tensor | None) -> tuple:
    if t is None:
        return (None,)
    d = t.detach()
    return (tuple(d.shape), str(d.dtype), float(d.double().sum()), float(d.double().abs().sum()))


def weights_key(module) -> tuple:
    """The weights' identity and version: in-place optimizer updates bump the version counters."""
    return tuple((p.data_ptr(), p._version) for p in module.parameters())


def wrap(owner, name: str, make) -> bool:
    fn = getattr(owner, name, None)
    if fn is None or (owner, name) in WRAPPED:
        return False
    WRAPPED[(owner, name)] = fn
    setattr(owner, name, make(fn))
    return True


def plain(label: str, phase: bool = False):
    def make(fn):
        def wrapper(*args, **kwargs):
            with P.timed(label, phase):
                return fn(*args, **kwargs)

        return wrapper

    return make


def op(name: str):
    """An LM-head op call, labelled with its caller, fingerprinted by hidden states, weight (and version), targets."""

    def make(fn):
        def wrapper(hidden, weight, targets, *args, **kwargs):
            key = ("lm_head", tensor_key(hidden), weight.data_ptr(), weight._version, tensor_key(targets),
                   kwargs.get("temperature"))  # fmt: skip
            grad = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
            call = P.fingerprint(f"LM head {name} <- {P.caller()}" + (" (fwd, grad)" if grad else " (fwd)"), key, grad)
            with P.timed(call["label"], call=call):
                return fn(hidden, weight, targets, *args, **kwargs)

        return wrapper

    return make


def forward(kind: str):
    """A decoder forward over a batch's completions: `kind` "loss" (PolicyHidden.forward) or "no grad"."""

    def make(fn):
        def wrapper(*args, **kwargs):
            if kind == "loss":  # PolicyHidden.forward(self, prompt_ids, prompt_mask, completion_ids, completion_mask)
                model, ids = args[0].model, (args[1], args[3], args[4])
            else:  # completion_hidden(model, batch, group_size)
                model, batch = args[0], args[1]
                ids = (batch.prompt_ids, batch.completion_ids, batch.completion_mask)
            key = ("forward", id(model), weights_key(model), *(tensor_key(t) for t in ids))
            grad = torch.is_grad_enabled()
            where = "policy_update (train/update.py:forward_loss)" if kind == "loss" else P.caller()
            call = P.fingerprint(f"decoder forward <- {where}" + (" (grad)" if grad else " (no grad)"), key, grad)
            with P.timed(call["label"], call=call):
                return fn(*args, **kwargs)

        return wrapper

    return make


def copy_of_weights(where: str):
    """A copy of the trained weights (theta_old): two copies of the same weights and versions in one step are one
    copy too many."""

    def make(fn):
        def wrapper(params, *args, **kwargs):
            params = list(params)
            key = ("snapshot", tuple((p.data_ptr(), p._version) for p in params))
            call = P.fingerprint(f"copy of the trained weights (snapshot) <- {where}", key, False)
            with P.timed(call["label"], call=call):
                return fn(params, *args, **kwargs)

        return wrapper

    return make


def backward_split(fn):
    def wrapper(*args, **kwargs):
        with P.timed("LM head backward (linear_logprobs_bwd)"):
            return fn(*args, **kwargs)

    return wrapper


def install(phases: bool) -> list[str]:
    """Wraps the trainer from outside; returns the targets that were not found (the trainer moved them)."""
    import importlib

    def mod(name):
        try:
            return importlib.import_module(name)
        except ImportError:
            return None

    loop, step, update, policy, mech = (mod(f"train.{m}") for m in ("loop", "step", "update", "policy", "mechanism"))
    setup = mod("train.setup")
    missing = []

    def w(owner, name, make):
        if owner is None or not wrap(owner, name, make):
            missing.append(f"{getattr(owner, '__name__', owner)}.{name}")

    # phases of the whole job
    w(setup, "load_policy", plain("model load (policy + reference)", True))
    w(setup, "make_engine", plain("rollout engine start", True))
    w(setup, "kl_probe", plain("KL probe set-up (sampling + log-probs)", True))
    w(loop, "setup", plain("setup (all of it)", True))
    w(loop, "export_model", plain("model export", True))
    w(loop, "save", plain("checkpoint saves", True))
    w(loop, "heldout_eval", lambda fn: lambda cfg, run, st, label=None: _eval(fn, cfg, run, st, label))
    w(loop, "run_step", lambda fn: lambda cfg, run, state: _step(fn, cfg, run, state))
    w(loop, "kl_from_init", lambda fn: lambda *a, **k: _kl(fn, *a, **k))
    if phases:
        return missing
    # passes of one step
    w(step, "roll", plain("rollout: tokenize, score (rest)"))
    w(mod("train.rollout"), "score", plain("rollout: rewards"))
    for cls_name in ("HFEngine", "VLLMEngine"):
        cls = getattr(mod(f"train.engines.{'hf' if cls_name == 'HFEngine' else 'vllm'}"), cls_name, None)
        w(cls, "generate", plain(f"rollout: {cls_name}.generate"))
        w(cls, "sync", plain(f"weight sync: {cls_name}.sync"))
    w(step, "advantages", plain("advantages (prepare_groups)"))
    w(step, "step_record", plain("step record (train/record.py)"))
    w(loop, "commit", plain("commit"))
    w(update, "snapshot", copy_of_weights("policy_update for --log-mechanism (train/update.py)"))
    tr = mod("train.features.trust_region")
    w(tr, "snapshot", copy_of_weights("TrustRegion.before_optimizer_step (train/features/trust_region.py)"))
    w(tr, "project_step", plain("trust region: project_step (step norm, projection)"))
    w(mech, "step_norm", plain("mechanism: update norm (step_norm)"))
    w(update, "reference_logprobs", plain("reference log-probs"))
    w(update, "head_logprobs", plain("sampler correction: head_logprobs"))
    w(update, "sampler_correction", plain("sampler correction: mismatch, TIS"))
    w(update, "measure", plain("mechanism measure"))
    w(update, "sgrpo_loss", plain("sgrpo_loss (policy_loss math)"))
    w(update, "optimizer_step", plain("optimizer step (AdamW + features)"))
    w(getattr(policy, "PolicyHidden", None), "forward", forward("loss"))
    w(policy, "completion_hidden", forward("no grad"))
    for owner in (mech, policy, mod("train.gt_likelihood"), mod("sgrpo_kernels.rl.fused")):
        w(owner, "linear_logprobs", op("linear_logprobs"))
    w(mod("sgrpo_kernels.custom_ops"), "linear_logprobs_bwd", backward_split)
    w(torch.Tensor, "backward", plain("backward (decoder + loss math)"))
    w(torch.nn.utils, "clip_grad_norm_", plain("clip_grad_norm_"))
    feats = getattr(mod("train.features.base"), "Features", None)
    for hook in ("rescore", "after_rollout", "before_update", "loss_inputs", "after_backward",
                 "before_optimizer_step", "after_optimizer_step"):  # fmt: skip
        w(feats, hook, plain(f"features: {hook}"))
    return missing


def _eval(fn, cfg, run, st, label):
    with P.timed(f"held-out eval ({label or 'every'})", True):
        return fn(cfg, run, st, label)


def _kl(fn, *args, **kwargs):
    """The probe runs after the step's record (loop.py:run_phase) and its time joins the step's `step_s`."""
    P.in_step = True
    try:
        with P.timed("KL-from-init probe", PHASES["on"]):
            return fn(*args, **kwargs)
    finally:
        P.in_step = False


def _step(fn, cfg, run, state):
    P.step, P.in_step = state.step + 1, True
    try:
        with P.timed(
            "steps (run_step: rollout .. optimizer step, sync)" if PHASES["on"] else "step: other (unwrapped)",
            PHASES["on"],
        ):
            return fn(cfg, run, state)
    finally:
        P.in_step = False


# ------------------------------------------------------------------------------------------------ one profiled run


def arm_flags(name: str) -> list[str]:
    """The trainer flags of a study arm (preset, loss overrides, the arm's trainer flags), as the study passes them."""
    try:
        from train.study.grid import ARMS, RESEARCH_ARMS
    except ImportError:  # the study moved to its own package
        from study.grid import ARMS, RESEARCH_ARMS
    arm = {**ARMS, **RESEARCH_ARMS}[name]
    out = ["--preset", arm.preset, "--loss", arm.loss]
    for k, v in arm.train.items():
        out += [f"--{k.replace('_', '-')}", v]
    return out


def regime_flags(name: str) -> dict[str, str]:
    try:
        from train.study.grid import REGIMES
    except ImportError:
        from study.grid import REGIMES
    return dict(REGIMES[name])


def trainer_argv(args, out_dir: str) -> list[str]:
    """The `python -m train` arguments of the profiled run."""
    if args.phases:  # the job exactly as given (the default job: no flags), only its output directory moved
        return ["--output-dir", out_dir, "--overwrite", *args.set]
    flags = regime_flags(args.regime) if args.regime != "default" else {}
    flags.update(max_steps=str(args.warmup + args.steps), eval_problems=str(args.eval_problems), eval_k="0")
    for item in args.set:
        k, _, v = item.partition("=")
        flags[k.replace("-", "_")] = v
    argv = ["--output-dir", out_dir, "--seed", str(args.seed), *arm_flags(args.arm), "--threads", str(args.threads)]
    argv += ["--progress", "false", "--save-model", "false", "--overwrite"]
    for k, v in flags.items():
        argv += [f"--{k.replace('_', '-')}", v]
    return argv


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def environment() -> dict:
    from train.run.machine import cpu_info, cpu_label

    info = {"cpu": cpu_label(), "bf16": [f for f in cpu_info()["isa"] if "bf16" in f] or "none (no avx512_bf16/amx)",
            "cores": os.cpu_count(), "python": platform.python_version(), "torch": torch.__version__,
            "git_sha": git_sha()}  # fmt: skip
    for name in ("transformers", "vllm"):
        try:
            info[name] = __import__(name).__version__
        except ImportError:
            pass
    return info


def summarize(calls: dict[int, list[dict]], steps: list[int], kl_every: int) -> dict:
    """Per row: calls per step, seconds per step, share of the step; the duplicates and the floor. The KL probe's
    rows (measured on the steps where it ran) count at its regime rate, one call every `kl_every` steps."""
    rows: dict[str, dict] = {}
    for st in steps:
        for c in calls[st]:
            r = rows.setdefault(c["label"], {"calls": 0, "s": 0.0, "dup_s": 0.0, "dup_of": set(), "kl": False})
            r["calls"] += 1
            r["s"] += c["s"]
            if c.get("dup_of"):
                r["dup_s"] += c["s"]
                r["dup_of"].add(c["dup_of"])
            r["kl"] = r["kl"] or ("kl_from_init" in c["label"] or c["label"].startswith("KL-from-init"))
    n = len(steps)
    kl_steps = sum(any(c["label"].startswith("KL-from-init") for c in calls[st]) for st in steps)
    out = []
    for label, r in rows.items():
        scale = (1 / n) if not r["kl"] else (1 / max(kl_steps, 1) / (kl_every or 1)) if kl_every else 0.0
        out.append({"pass": label, "calls_per_step": r["calls"] * scale, "s_per_step": r["s"] * scale,
                    "duplicate_s_per_step": r["dup_s"] * scale, "duplicate_of": sorted(r["dup_of"])})  # fmt: skip
    total = sum(r["s_per_step"] for r in out)
    dup = sum(r["duplicate_s_per_step"] for r in out)
    for r in out:
        r["share"] = r["s_per_step"] / total if total else 0.0
    out.sort(key=lambda r: -r["s_per_step"])
    return {"rows": out, "step_s": total, "duplicate_s": dup, "floor_s": total - dup, "measured_steps": steps,
            "kl_steps_measured": kl_steps, "kl_every": kl_every}  # fmt: skip


def profile_one(args) -> dict:
    PHASES["on"] = args.phases
    t_import = time.perf_counter()
    import train.__main__ as entry

    missing = install(args.phases)
    t_import = time.perf_counter() - t_import
    out_dir = args.output_dir or tempfile.mkdtemp(prefix="profile_step_")
    argv = trainer_argv(args, out_dir)
    load = {"start": uptime()}
    t0 = time.perf_counter()
    rc = entry.main(argv)
    wall = time.perf_counter() - t0
    load["end"] = uptime()
    raw = {"wall_s": wall, "load": load, "phases": P.phases, "calls": P.calls, "argv": argv}
    (args.out / f"raw_{'phases' if args.phases else args.arm}.pyjson").write_text(json.dumps(raw, default=str))
    if rc:
        raise SystemExit(f"the trainer exited with status {rc}")
    from train.cli import parse_args

    cfg, _ = parse_args(argv)
    result = {"regime": args.regime, "arm": None if args.phases else args.arm, "phases_mode": args.phases,
              "trainer_argv": argv, "threads": args.threads, "wall_s": wall, "import_s": t_import, "load": load,
              "not_wrapped": missing, "env": environment(),
              "summary": json.loads((Path(out_dir) / "summary.json").read_text())}  # fmt: skip
    recs = [json.loads(x) for x in (Path(out_dir) / "metrics.jsonl").read_text().splitlines() if x.strip()]
    steps = [r for r in recs if "step_s" in r and r.get("event") is None]
    result["step_s_recorded"] = [r["step_s"] for r in steps]
    if args.phases:
        agg: dict[str, list[float]] = defaultdict(list)
        for label, s in P.phases:
            agg[label].append(s)
        result["phases"] = [{"phase": k, "calls": len(v), "s": sum(v)} for k, v in agg.items()]
        result["peak_rss_mb"] = _peak_rss_mb()
    else:
        measured = [s for s in sorted(P.calls) if s > args.warmup]
        result["profile"] = summarize(P.calls, measured, cfg.kl_every)
        result["step_s_recorded_measured"] = [r["step_s"] for r in steps if r.get("step", 0) > args.warmup]
    return result


def _peak_rss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# --------------------------------------------------------------------------------------------------------- report


def fmt_profile(res: dict) -> str:
    p = res["profile"]
    rows = [{"pass": r["pass"] + (" **DUPLICATE** of: " + "; ".join(r["duplicate_of"]) if r["duplicate_of"] else ""),
             "calls/step": f"{r['calls_per_step']:.2f}", "s/step": f"{r['s_per_step']:.3f}",
             "share": f"{100 * r['share']:.1f}%"} for r in p["rows"]]  # fmt: skip
    rec = res.get("step_s_recorded_measured") or []
    lines = [
        f"### {res['regime']} regime, arm `{res['arm']}` ({len(p['measured_steps'])} measured steps "
        f"{p['measured_steps']}, threads {res['threads']})",
        "",
        markdown_table(rows, ["pass", "calls/step", "s/step", "share"]),
        "",
        f"- step (sum of the rows): **{p['step_s']:.2f} s**; the trainer's own `step_s` of the measured steps: "
        + ", ".join(f"{x:.2f}" for x in rec)
        + " s (the KL probe joins `step_s` only on its steps, one in "
        f"{p['kl_every']}: its rows count at that rate)",
        f"- duplicates: **{p['duplicate_s']:.2f} s/step** ({100 * p['duplicate_s'] / p['step_s']:.1f}%); floor without "
        f"them: **{p['floor_s']:.2f} s/step** (x{p['step_s'] / p['floor_s']:.2f} faster at most from removing them)",
        f"- load: start `{res['load']['start']}`; end `{res['load']['end']}`",
        f"- not wrapped (absent in this trainer): {res['not_wrapped'] or 'none'}",
        "",
    ]
    return "\n".join(lines)


def fmt_phases(res: dict) -> str:
    total = res["wall_s"] + res["import_s"]
    rows = [{"phase": "imports (train, torch, transformers)", "calls": 1, "s": f"{res['import_s']:.1f}",
             "share": f"{100 * res['import_s'] / total:.1f}%"}]  # fmt: skip
    nested = ("model load", "rollout engine", "KL probe set-up")  # inside "setup (all of it)"
    for ph in res["phases"]:
        inner = ph["phase"].startswith(nested)
        rows.append({"phase": ("  - " if inner else "") + ph["phase"], "calls": ph["calls"], "s": f"{ph['s']:.1f}",
                     "share": f"{100 * ph['s'] / total:.1f}%"})  # fmt: skip
    known = res["import_s"] + sum(p["s"] for p in res["phases"] if not p["phase"].startswith(nested))
    rows.append({"phase": "rest (CLI, run directory, summary, exit)", "calls": "", "s": f"{total - known:.1f}",
                 "share": f"{100 * (total - known) / total:.1f}%"})  # fmt: skip
    steps = res["step_s_recorded"]
    s = res["summary"]
    return "\n".join(
        [
            f"### The default job by phase (`python -m train`, no flags; {len(steps)} steps)",
            "",
            markdown_table(rows, ["phase", "calls", "s", "share"]),
            "",
            f"- wall: **{total:.0f} s** ({total // 60:.0f}:{total % 60:02.0f}) from the imports to the end; the "
            f"summary's `wall_s` {s['wall_s']:.0f} s; peak RSS {res['peak_rss_mb'] / 1024:.2f} GiB",
            f"- the records' `step_s`: sum {sum(steps):.0f} s, mean {sum(steps) / max(len(steps), 1):.1f} s",
            f"- held-out: before {s.get('before', {}).get('eval_acc')}, after {s.get('after', {}).get('eval_acc')}",
            f"- load: start `{res['load']['start']}`; end `{res['load']['end']}`",
            "",
        ]
    )


def report(folder: Path, publish: bool, command: str) -> Path:
    results = [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]
    if not results:
        raise SystemExit(f"--report: no results (*.json) in {folder}")
    env = results[0]["env"]
    head = [
        "# One training step by pass (CPU)",
        "",
        "Measured by `benchmarks/profile_step.py` from outside the trainer (its functions wrapped; train/ unchanged). "
        "Each row is the self time of one kind of call (its time less the wrapped calls inside it), so the rows of a "
        "step add up to the step. A row marked DUPLICATE computed a result the same step already had (same weights "
        "and version counters, same batch / hidden states, same targets); the floor is the step without them.",
        "",
        "**The machine was SHARED with other jobs** (2 cores, several other sessions; load averages below): absolute "
        "seconds are inflated and noisy, only the shares and call counts are firm.",
        "",
        f"- CPU: {env['cpu']}; bf16 instructions: {env['bf16']}; {env['cores']} cores",
        f"- versions: python {env['python']}, torch {env['torch']}, transformers {env.get('transformers')}, vLLM "
        f"{env.get('vllm', 'not installed')} (per run below where they differ); git {env['git_sha']}",
        f"- command: `{command}`",
        "",
    ]
    body = []
    for res in results:
        body.append(fmt_phases(res) if res["phases_mode"] else fmt_profile(res))
        body.append(f"- trainer flags: `python -m train {' '.join(_quote(a) for a in res['trainer_argv'])}`; "
                    f"env {res['env']['git_sha']}, vLLM {res['env'].get('vllm', 'none')}\n")  # fmt: skip
    text = "\n".join(head + body)
    dest = RESULTS if publish else folder
    (dest / "step_profile_cpu.md").write_text(text)
    (dest / "step_profile_cpu.json").write_text(json.dumps(results, indent=1, default=str))
    return dest / "step_profile_cpu.md"


def _quote(a: str) -> str:
    return repr(a) if (" " in a or not a) else a


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.profile_step", description=__doc__.split("\n\n")[0])
    ap.add_argument("--regime", default="decisive", help="the study's regime (train/study/grid.py REGIMES) or default")
    ap.add_argument("--arms", default="grpo_nokl", help="comma-separated study arms, each profiled in its own process")
    ap.add_argument("--arm", default=None, help=argparse.SUPPRESS)  # one arm, in this process (what --arms runs)
    ap.add_argument("--steps", type=int, default=4, help="measured steps")
    ap.add_argument("--warmup", type=int, default=1, help="steps run first and left out")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (the study: 1 per worker)")
    ap.add_argument("--eval-problems", type=int, default=8, help="held-out problems (eval is not part of a step)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="more trainer overrides")
    ap.add_argument("--phases", action="store_true", help="time the whole job by phase (the job as given: no flags)")
    ap.add_argument("--output-dir", default=None, help="the trainer's run directory (default: a temporary one)")
    ap.add_argument("--out", type=Path, default=Path("runs/bench/profile_step"), help="where each run's JSON goes")
    ap.add_argument("--report", action="store_true", help="only write the markdown/JSON from the JSONs in --out")
    ap.add_argument("--publish", action="store_true", help="write the report to benchmarks/results/")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    command = "python -m benchmarks.profile_step " + " ".join(sys.argv[1:] if argv is None else argv)
    if args.report:
        print(report(args.out, args.publish, command))
        return 0
    if args.phases or args.arm:
        res = profile_one(args)
        name = "default_phases" if args.phases else f"{args.regime}_{args.arm}"
        (args.out / f"{name}.json").write_text(json.dumps(res, indent=1, default=str))
        print(fmt_phases(res) if args.phases else fmt_profile(res))
        return 0
    rest = [a for a in (sys.argv[1:] if argv is None else argv)]
    for arm in args.arms.split(","):  # one process per arm: each run has its own engine and wrappers
        env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}  # as the study starts its runs
        rc = subprocess.call([sys.executable, "-m", "benchmarks.profile_step", *rest, "--arm", arm], env=env)
        if rc:
            return rc
    print(report(args.out, args.publish, command))
    return 0


if __name__ == "__main__":
    sys.exit(main())
