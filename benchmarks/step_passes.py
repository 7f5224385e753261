"""The wrappers of `benchmarks.profile_step`: the trainer's functions wrapped from outside, each call timed (its
self time: its time less the wrapped calls inside it), labelled with its caller, and fingerprinted (weights and their
version counters, the batch, the hidden states) so that a call computing what its step already computed is marked
duplicate; and the per-step summary of the calls.

`install` knows two layouts of train/: the current one (the loss in train/loss.py, the step in train/step.py, the
optional features in train/features/) and the one of commit 7fda393 (train/update.py, train/mechanism.py), at
which benchmarks/results/step_profile_cpu_7fda393.md was made; it returns the targets it did not find, which a test
keeps empty for the current layout (tests/test_bench_profile_step.py)."""

from __future__ import annotations

import time
from collections import defaultdict
from contextlib import contextmanager

import torch

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

# The wrapped calls that say who makes the op calls and forwards inside them (the innermost one names the caller).
CONTEXTS: dict[str, str] = {}
CONTEXTS_NOW = {
    "reference log-probs": "reference_logprobs (train/policy.py, via train/loss.py:loss_function)",
    "KL-from-init probe": "kl_from_init (train/probe.py)",
    "mechanism measure": "measure (train/features/mechanism.py)",
    "sgrpo_loss (policy_loss math)": "sgrpo_loss (sgrpo_kernels/rl/fused.py, via train/loss.py:forward_loss)",
    "gt_likelihood": "gt_likelihood (train/gt_likelihood.py, via train/features/dense_reward.py)",
    "features: loss_inputs": "loss_inputs (train/features/: ppo_epochs.py's old log-probs)",
}
# The layout of 7fda393 (train/update.py, train/mechanism.py): benchmarks/results/step_profile_cpu_7fda393.md
CONTEXTS_7FDA393 = {
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


def uninstall() -> None:
    """Puts every wrapped function back and forgets the calls recorded (for a test: the next `install` starts anew)."""
    for (owner, name), fn in reversed(list(WRAPPED.items())):
        setattr(owner, name, fn)
    WRAPPED.clear()
    CONTEXTS.clear()
    P.__init__()
    PHASES["on"] = False


def plain(label: str, phase: bool = False):
    def make(fn):
        def wrapper(*args, **kwargs):
            with P.timed(label, phase):
                return fn(*args, **kwargs)

        return wrapper

    return make


def op(name: str):
    """An LM-head op call, labelled with its caller, fingerprinted by hidden states, weight (and version), targets,
    temperature and the sampler's support."""

    def make(fn):
        def wrapper(hidden, weight, targets, *args, **kwargs):
            key = ("lm_head", tensor_key(hidden), weight.data_ptr(), weight._version, tensor_key(targets),
                   *(kwargs.get(k) for k in ("temperature", "top_k", "top_p", "min_p")))  # fmt: skip
            grad = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
            call = P.fingerprint(f"LM head {name} <- {P.caller()}" + (" (fwd, grad)" if grad else " (fwd)"), key, grad)
            with P.timed(call["label"], call=call):
                return fn(hidden, weight, targets, *args, **kwargs)

        return wrapper

    return make


def forward(kind: str, where: str | None = None):
    """A decoder forward: `kind` "loss" (PolicyHidden.forward(self, prompt ids/mask, completion ids/mask), the loss's,
    made in `where`), "completions" (completion_hidden(model, batch, group_size): forward-only log-probs) or "text"
    (policy_hidden(model, input_ids, attention_mask): the ground-truth likelihood's)."""

    def make(fn):
        def wrapper(*args, **kwargs):
            if kind == "loss":
                model, ids = args[0].model, (args[1], args[3], args[4])
            elif kind == "completions":
                model, batch = args[0], args[1]
                ids = (batch.prompt_ids, batch.completion_ids, batch.completion_mask)
            else:
                model, ids = args[0], args[1:3]
            key = ("forward", id(model), weights_key(model), *(tensor_key(t) for t in ids))
            grad = torch.is_grad_enabled()
            call = P.fingerprint(f"decoder forward <- {where or P.caller()}" + (" (grad)" if grad else " (no grad)"),
                                 key, grad)  # fmt: skip
            with P.timed(call["label"], call=call):
                return fn(*args, **kwargs)

        return wrapper

    return make


def copy_of_weights(where: str, method: bool = False):
    """A copy of the trained weights (theta_old): `snapshot(params)`, or with `method` `rl.TrustRegion.snapshot(self)`
    (its `params`). Two copies of the same weights and versions in one step are one copy too many."""

    def make(fn):
        def wrapper(*args, **kwargs):
            if method:
                params = args[0].params
            else:  # (a generator is read once, here)
                params = list(args[0])
                args = (params, *args[1:])
            key = ("snapshot", tuple((p.data_ptr(), p._version) for p in params))
            call = P.fingerprint(f"copy of the trained weights (snapshot) <- {where}", key, False)
            with P.timed(call["label"], call=call):
                return fn(*args, **kwargs)

        return wrapper

    return make


def backward_split(fn):
    def wrapper(*args, **kwargs):
        with P.timed("LM head backward (linear_logprobs_bwd)"):
            return fn(*args, **kwargs)

    return wrapper


HOOKS = ("rescore", "after_rollout", "before_update", "loss_inputs", "after_backward", "before_optimizer_step",
         "after_optimizer_step")  # fmt: skip


def install(phases: bool) -> list[str]:
    """Wraps the trainer from outside; returns the targets that were not found (the trainer moved them). Knows the
    current layout of train/ (train/loss.py, train/step.py, train/features/) and the one of commit 7fda393
    (train/update.py, train/mechanism.py), at which benchmarks/results/step_profile_cpu_7fda393.md was made."""
    import importlib

    def mod(name):
        try:
            return importlib.import_module(name)
        except ImportError:
            return None

    old = mod("train.update")  # the layout of 7fda393; None: the current one
    loop, step, policy, setup = (mod(f"train.{m}") for m in ("loop", "step", "policy", "setup"))
    mech = mod("train.mechanism" if old else "train.features.mechanism")
    loss = old or mod("train.loss")  # where the loss of a batch is made
    tr = mod("train.features.trust_region")
    CONTEXTS.clear()
    CONTEXTS.update(CONTEXTS_7FDA393 if old else CONTEXTS_NOW)
    missing = []

    def w(owner, name, make):
        if owner is None or not wrap(owner, name, make):
            missing.append(f"{getattr(owner, '__name__', owner)}.{name}")

    # phases of the whole job
    w(setup, "load_policy", plain("model load (policy + reference)", True))
    w(setup, "make_engine", plain("rollout engine start", True))
    w(setup, "kl_probe", plain("KL probe set-up (sampling + log-probs)", True))
    w(loop, "setup", plain("setup (all of it)", True))
    w(loop, "export_model" if old else "export_finished", plain("model export", True))
    w(loop, "save", plain("checkpoint saves", True))
    w(loop, "heldout_eval", lambda fn: lambda cfg, run, st, label=None: _eval(fn, cfg, run, st, label))
    w(loop, "run_step", lambda fn: lambda cfg, run, state: _step(fn, cfg, run, state))
    w(loop, "kl_from_init", lambda fn: lambda *a, **k: _kl(fn, *a, **k))
    if phases:
        return missing
    # passes of one step, timed as they are: (owner, function, label), in the order of a step
    hf, vllm = (getattr(mod(f"train.engines.{m}"), c, None) for m, c in (("hf", "HFEngine"), ("vllm", "VLLMEngine")))
    region = None if old else getattr(mod("sgrpo_kernels.rl.trust_region"), "TrustRegion", None)
    guard = None if old else getattr(mod("train.features.step_guard"), "StepGuard", None)  # (7fda393: in the hooks)
    timed = [
        (step, "roll", "rollout: tokenize, score (rest)"), (mod("train.rollout"), "score", "rollout: rewards"),
        (hf, "generate", "rollout: HFEngine.generate"), (hf, "sync", "weight sync: HFEngine.sync"),
        (vllm, "generate", "rollout: VLLMEngine.generate"), (vllm, "sync", "weight sync: VLLMEngine.sync"),
        (step, "advantages", "advantages (prepare_groups)"), (step, "step_record", "step record (train/record.py)"),
        (loop, "commit", "commit"),
    ]
    if old:  # the trust region's projection
        timed.append((tr, "project_step", "trust region: project_step (step norm, projection)"))
    else:  # the trust region's projection, the step guard's copy and check
        timed += [(region, "project", "trust region: rl.TrustRegion.project (step norm, projection)"),
                  (guard, "take", "step guard: copy of the trained weights and Adam state (StepGuard.take)"),
                  (guard, "non_finite", "step guard: non-finite check (StepGuard.non_finite)")]  # fmt: skip
    timed += [(mech, "step_norm", "mechanism: update norm (step_norm)"),
              (loss, "reference_logprobs", "reference log-probs")]  # fmt: skip
    if old:
        timed.append((old, "head_logprobs", "sampler correction: head_logprobs"))
    timed += [(loss, "sampler_correction", "sampler correction: mismatch, TIS"),
              (old or mech, "measure", "mechanism measure"), (loss, "sgrpo_loss", "sgrpo_loss (policy_loss math)"),
              (old or step, "optimizer_step", "optimizer step (AdamW + features)"),
              (mod("train.features.dense_reward"), "gt_likelihood", "gt_likelihood")]  # fmt: skip
    for owner, name, label in timed:
        w(owner, name, plain(label))
    # the weight snapshots (fingerprinted: a second copy of the same weights is flagged)
    if old:
        w(old, "snapshot", copy_of_weights("policy_update for --log-mechanism (train/update.py)"))
        w(tr, "snapshot", copy_of_weights("TrustRegion.before_optimizer_step (train/features/trust_region.py)"))
    else:
        w(mech, "snapshot", copy_of_weights("MechanismLog.before_update (train/features/mechanism.py)"))
        w(region, "snapshot", copy_of_weights("TrustRegion.before_optimizer_step (train/features/trust_region.py, "
                                              "rl.TrustRegion.snapshot)", method=True))  # fmt: skip
    # the forwards, every LM-head call (labelled with its caller), the backward, clipping
    where = "policy_update (train/update.py:forward_loss)" if old else "loss_function (train/loss.py:forward_loss)"
    w(getattr(policy, "PolicyHidden", None), "forward", forward("loss", where))
    w(policy, "completion_hidden", forward("completions"))
    gt = mod("train.gt_likelihood")
    w(gt, "policy_hidden", forward("text"))
    for owner in ((mech,) if old else ()) + (policy, gt, mod("sgrpo_kernels.rl.fused")):
        w(owner, "linear_logprobs", op("linear_logprobs"))
    w(mod("sgrpo_kernels.custom_ops"), "linear_logprobs_bwd", backward_split)
    w(torch.Tensor, "backward", plain("backward (decoder + loss math)"))
    w(torch.nn.utils, "clip_grad_norm_", plain("clip_grad_norm_"))
    # the features' hooks (train/features/base.py)
    feats = getattr(mod("train.features.base"), "Features", None)
    for hook in HOOKS + (() if old else ("after_update",)):
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
