"""torch.library integration (opcheck, torch.compile), input validation, backend dispatch, and the torch backend's
memory properties (no (N, V) tensor in linear_logprobs; zero-gradient rows dropped before the matrix products)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import sgrpo_kernels as sk
from sgrpo_kernels import backends
from sgrpo_kernels import reference as ref
from sgrpo_kernels.backends import BackendUnavailableError, HeadOptions, Options
from sgrpo_kernels.backends import torch_chunked as tc
from sgrpo_kernels.custom_ops import Call


def _inputs(N=6, D=8, V=37, bias=True, dtype=torch.float32, requires_grad=True):
    g = torch.Generator().manual_seed(0)
    h = torch.randn(N, D, generator=g, dtype=dtype, requires_grad=requires_grad)
    w = torch.randn(V, D, generator=g, dtype=dtype, requires_grad=requires_grad)
    b = torch.randn(V, generator=g, dtype=dtype, requires_grad=requires_grad) if bias else None
    t = torch.randint(0, V, (N,), generator=g)
    t[1] = -100
    return h, w, t, b


# ------------------------------------------------------------------------------------------------------- opcheck


def _call(backend, **opts):
    return Call(backend, True, Options(**opts)).pack()


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("return_entropy", [True, False])
def test_opcheck_linear(dev_backend, bias, return_entropy):
    device, backend = dev_backend
    h, w, t, b = (x.to(device) if x is not None else None for x in _inputs(bias=bias))
    args = (h, w, t, b, *_call(backend, temperature=0.7, return_entropy=return_entropy, need_stats=True))
    torch.library.opcheck(torch.ops.sgrpo.linear_logprobs_fwd.default, args)
    gl, ge = torch.randn(6, device=device), torch.randn(6, device=device)
    _, ent, stats = torch.ops.sgrpo.linear_logprobs_fwd(*[a.detach() if isinstance(a, torch.Tensor) else a
                                                        for a in args])
    bwd_args = (gl, ge if return_entropy else None, h.detach(), w.detach(), t, b.detach() if b is not None else None,
                stats, ent if return_entropy else None)
    for need_h, need_w in [(True, True), (True, False), (False, True)]:
        call = _call(backend, temperature=0.7, return_entropy=return_entropy, need_grad_hidden=need_h,
                     need_grad_weight=need_w)
        torch.library.opcheck(torch.ops.sgrpo.linear_logprobs_bwd.default, (*bwd_args, *call))


@pytest.mark.parametrize("return_entropy", [True, False])
def test_opcheck_logits(dev_backend, return_entropy):
    device, backend = dev_backend
    z = torch.randn(5, 29, device=device, requires_grad=True)
    t = torch.randint(0, 29, (5,), device=device)
    call = _call(backend, temperature=1.3, return_entropy=return_entropy, need_stats=True)
    args = (z, t, *call)
    torch.library.opcheck(torch.ops.sgrpo.logprobs_from_logits_fwd.default, args)
    _, ent, stats = torch.ops.sgrpo.logprobs_from_logits_fwd(z.detach(), *args[1:])
    bwd_args = (torch.randn(5, device=device), torch.randn(5, device=device) if return_entropy else None, z.detach(),
                t, stats, ent if return_entropy else None, *call)
    torch.library.opcheck(torch.ops.sgrpo.logprobs_from_logits_bwd.default, bwd_args)


def _compile_inputs(device):
    """(hidden, weight, targets, bias, logits) of the compile tests, with dynamo's caches cleared."""
    torch._dynamo.reset()
    h, w, t, b = (x.detach().to(device) if x is not None else None for x in _inputs(N=10, V=41))
    return h, w, t, b, torch.randn(10, 41, device=device)


def assert_compiled_matches_eager(f, inputs) -> None:
    """`f` compiled with fullgraph gives the eager loss and gradients for every input."""
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    leaves = [x.clone().requires_grad_(True) for x in inputs]
    loss = compiled(*leaves)
    grads = torch.autograd.grad(loss, leaves)
    leaves_e = [x.clone().requires_grad_(True) for x in inputs]
    loss_e = f(*leaves_e)
    grads_e = torch.autograd.grad(loss_e, leaves_e)
    torch.testing.assert_close(loss, loss_e)
    for a, e in zip(grads, grads_e):
        torch.testing.assert_close(a, e)


def test_torch_compile_fullgraph(dev_backend):
    backend = dev_backend[1]
    h, w, t, b, z = _compile_inputs(dev_backend[0])

    def f(h, w, b, z):
        lp, ent = sk.linear_logprobs(h, w, t, bias=b, temperature=0.9, backend=backend)
        lp2, ent2 = sk.logprobs_from_logits(z, t, temperature=1.1, backend=backend)
        return (lp * 0.3 + ent * 0.7).sum() + (lp2 - 0.5 * ent2).sum()

    assert_compiled_matches_eager(f, (h, w, b, z))


def test_torch_compile_fullgraph_named_results(dev_backend):
    """The NamedTuple results by field name under fullgraph, max_logprob and the head options included."""
    backend = dev_backend[1]
    h, w, t, b, z = _compile_inputs(dev_backend[0])

    def f(h, w, b, z):
        out = sk.linear_logprobs(h, w, t, bias=b, temperature=0.9, logit_scale=0.5, softcap=3.0, backend=backend,
                                 return_max_logprob=True)  # fmt: skip
        plain = sk.logprobs_from_logits(z, t, temperature=1.1, backend=backend)
        assert plain.max_logprob is None
        return (out.logp * 0.3 + out.entropy * 0.7 + out.max_logprob).sum() + (plain.logp - 0.5 * plain.entropy).sum()

    assert_compiled_matches_eager(f, (h, w, b, z))


# ---------------------------------------------------------------------------------- the options, field by field


def _non_default(f):
    """A value of Options field `f` other than its default, of the field's type."""
    return {"bool": not f.default, "int": f.default + 7, "float": f.default + 0.25}[f.type]


def test_every_options_field_is_in_every_schema_and_round_trips():
    """The schemas are generated from Options (the HeadOptions fields first): a new field is a new schema argument
    of every custom op, and Call.pack / Call.unpack carry every field, whatever its value."""
    fields = dataclasses.fields(Options)
    head = [f.name for f in dataclasses.fields(HeadOptions)]
    assert [f.name for f in fields[: len(head)]] == head and issubclass(Options, HeadOptions)
    names = ["backend", "check_targets"] + [f.name for f in fields]
    for op in (torch.ops.sgrpo.linear_logprobs_fwd, torch.ops.sgrpo.linear_logprobs_bwd,
               torch.ops.sgrpo.logprobs_from_logits_fwd, torch.ops.sgrpo.logprobs_from_logits_bwd,
               torch.ops.sgrpo.logprobs_from_logits_bwd_):  # fmt: skip
        args = op.default._schema.arguments
        assert [a.name for a in args[len(args) - len(names):]] == names, op
    for f in fields:
        call = Call("torch", False, Options(**{f.name: _non_default(f)}))
        assert Call.unpack(call.pack()) == call, f.name
    every = Call("torch", True, Options(**{f.name: _non_default(f) for f in fields}))
    assert Call.unpack(every.pack()) == every


def test_every_head_option_has_a_check_and_a_public_keyword():
    """Each HeadOptions field carries its validator; from_kwargs applies it and keeps the defaults of the others."""
    for f in dataclasses.fields(HeadOptions):
        assert callable(f.metadata["check"]), f.name
    assert HeadOptions.from_kwargs("op", {}) == HeadOptions()
    got = HeadOptions.from_kwargs("op", {"temperature": 2, "softcap": None, "logit_scale": 3})
    assert got == HeadOptions(temperature=2.0, logit_scale=3.0, softcap=0.0) and type(got.temperature) is float
    with pytest.raises(TypeError, match=r"op\(\) got an unexpected keyword argument 'return_entropy'"):
        HeadOptions.from_kwargs("op", {"return_entropy": True})  # a per-call field, not a head option
    with pytest.raises(TypeError, match="unexpected keyword argument 'softcap'"):
        HeadOptions.from_kwargs("op", {"softcap": 2.0}, accepted=("temperature",))


@pytest.mark.parametrize("op", ["linear", "logits"])
def test_every_head_option_reaches_the_backend(monkeypatch, op):
    """Each head option given as a keyword arrives, as given, in the Options the backend's forward and backward
    receive (through the custom op's schema and setup_context); the scale is not folded while a softcap is set."""
    seen = []

    def spy(name):
        real = getattr(tc, name)

        def fn(*args):
            seen.append((name, args[-1]))
            return real(*args)

        monkeypatch.setattr(tc, name, fn)

    prefix = "linear_logprobs" if op == "linear" else "logprobs_from_logits"
    spy(f"{prefix}_fwd")
    spy(f"{prefix}_bwd")
    head = dict(temperature=0.8, ignore_index=7)
    if op == "linear":
        head |= dict(logit_scale=0.5, softcap=3.0)
        assert set(head) == {f.name for f in dataclasses.fields(HeadOptions)}  # every head option
    h, w, t, b = _inputs()
    t = torch.where(t == -100, 7, t)  # the row _inputs ignores, under the custom ignore_index
    if op == "linear":
        lp, ent = sk.linear_logprobs(h, w, t, bias=b, backend="torch", **head)
    else:
        lp, ent = sk.logprobs_from_logits(h @ w.T, t, backend="torch", **head)
    (lp.sum() + ent.sum()).backward()
    assert [name for name, _ in seen] == [f"{prefix}_fwd", f"{prefix}_bwd"]
    for _, opts in seen:
        assert {k: getattr(opts, k) for k in head} == head
    assert lp[1] == 0 and ent[1] == 0  # the custom ignore_index


@pytest.mark.parametrize("frozen", ["weight", "hidden", "bias"])
def test_frozen_inputs_get_no_gradient_and_others_stay_exact(dev_backend, frozen):
    """A frozen input (e.g. the LM head under LoRA) gets no gradient; the others match the reference."""
    device, backend = dev_backend
    h, w, t, b = (x.detach().to(device) for x in _inputs(N=9, V=53))
    leaves = {"hidden": h.clone(), "weight": w.clone(), "bias": b.clone()}
    for k, v in leaves.items():
        v.requires_grad_(k != frozen)
    lp, ent = sk.linear_logprobs(leaves["hidden"], leaves["weight"], t, bias=leaves["bias"], backend=backend)
    (lp.sum() - 0.3 * ent.sum()).backward()
    ref_leaves = {k: v.double().requires_grad_(True) for k, v in (("hidden", h), ("weight", w), ("bias", b))}
    lr, er = ref.linear_logprobs(ref_leaves["hidden"], ref_leaves["weight"], t, bias=ref_leaves["bias"],
                                 out_dtype=None)
    (lr.sum() - 0.3 * er.sum()).backward()
    for k, v in leaves.items():
        if k == frozen:
            assert v.grad is None
        else:
            torch.testing.assert_close(v.grad.double(), ref_leaves[k].grad, atol=5e-5, rtol=5e-5)


# ------------------------------------------------------------------------------------------------- bad inputs


def _call_linear(**over):
    h, w, t, b = _inputs(requires_grad=False)
    kw = dict(hidden=h, weight=w, targets=t, bias=b)
    kw.update(over)
    extra = {k: kw.pop(k) for k in list(kw) if k not in ("hidden", "weight", "targets")}
    return sk.linear_logprobs(kw["hidden"], kw["weight"], kw["targets"], **extra)


BAD_LINEAR = [
    (dict(targets=torch.tensor([0, 1, 2, 3, 4, 37])), ValueError, r"targets must lie in \[0, 37\)"),
    (dict(targets=torch.tensor([0, 1, 2, 3, 4, -1])), ValueError, "ignore_index=-100"),
    (dict(targets=torch.zeros(6)), TypeError, "targets must be an integer tensor"),
    (dict(targets=torch.zeros(6, dtype=torch.bool)), TypeError, "targets must be an integer tensor"),
    (dict(targets=torch.zeros(5, dtype=torch.long)), ValueError, r"targets has shape \(5,\), expected .* \(6,\)"),
    (dict(targets=torch.zeros(6, 1, dtype=torch.long)), ValueError, "targets has shape"),
    (dict(hidden=torch.randn(6, 9)), ValueError, r"hidden has last dim 9 .* expected D = 8"),
    (dict(weight=torch.randn(37, 8, 1)), ValueError, r"weight must be 2-D .* got shape \(37, 8, 1\)"),
    (dict(weight=torch.randn(0, 8)), ValueError, "V = 0"),
    (dict(bias=torch.randn(36)), ValueError, r"bias must have shape \(37,\)"),
    (dict(bias=torch.randn(37, dtype=torch.float64)), TypeError, "bias has dtype torch.float64"),
    (dict(hidden=torch.randn(6, 8, dtype=torch.bfloat16)), TypeError, "hidden has dtype torch.bfloat16 but weight"),
    (dict(hidden=torch.randn(6, 8, device="meta")), ValueError, "hidden is on meta but weight is on cpu"),
    (dict(bias=torch.randn(37, device="meta")), ValueError, "bias is on meta but weight is on cpu"),
    (dict(hidden=torch.randint(0, 3, (6, 8))), TypeError, "hidden must be a floating tensor"),
    (dict(hidden=torch.randn(6, 8).numpy()), TypeError, "hidden must be a torch.Tensor"),
    (dict(temperature=0.0), ValueError, "temperature must be a finite number > 0"),
    (dict(temperature=-1.0), ValueError, "temperature"),
    (dict(temperature=float("nan")), ValueError, "temperature"),
    (dict(temperature=float("inf")), ValueError, "temperature"),
    (dict(temperature=torch.tensor(1.0)), TypeError, "temperature must be a real number"),
    (dict(ignore_index=1.5), TypeError, "ignore_index must be a Python int"),
    (dict(memory_budget=-5), ValueError, "memory_budget"),
    (dict(memory_budget=2**63), ValueError, r"memory_budget must be in \[0, 2\*\*63\)"),
    (dict(memory_budget="1"), TypeError, "memory_budget must be an int number of bytes"),
    (dict(memory_budget=1e6), TypeError, "memory_budget must be an int number of bytes"),
    (dict(ignore_index=2**63), ValueError, "ignore_index must fit in int64"),
    (dict(return_entropy="False"), TypeError, "return_entropy must be a bool, got str 'False'"),
    (dict(check_targets="no"), TypeError, "check_targets must be a bool"),
    (dict(deterministic=True), TypeError, "unexpected keyword argument 'deterministic'"),
    (dict(need_stats=False), TypeError, "unexpected keyword argument 'need_stats'"),  # per call: the op's to set
    (dict(hidden=torch.randn(6, 0), weight=torch.randn(37, 0)), ValueError, "the hidden size D must not be 0"),
    (dict(backend="nope"), ValueError, "unknown backend"),
]


@pytest.mark.parametrize("over,exc,match", BAD_LINEAR, ids=[m for _, _, m in BAD_LINEAR])
def test_linear_bad_inputs(over, exc, match):
    with pytest.raises(exc, match=match):
        _call_linear(**over)


def test_numpy_int_memory_budget_is_accepted():
    import numpy as np

    logp, _ = _call_linear(memory_budget=np.int64(4096))
    assert torch.isfinite(logp).all()


@pytest.mark.parametrize("env, ok", [("inf", False), ("nan", False), ("-5", False), ("abc", False), ("1e30", False),
                                     ("0", True), ("0.5", True), (" 64 ", True)])
def test_memory_budget_env_is_checked(monkeypatch, env, ok):
    monkeypatch.setenv("SGRPO_MEMORY_BUDGET_MB", env)
    if ok:
        assert torch.isfinite(_call_linear()[0]).all()
    else:
        with pytest.raises(ValueError, match=f"env SGRPO_MEMORY_BUDGET_MB={env.strip()!r}: expected a finite number"):
            _call_linear()


@pytest.mark.parametrize("env, ok", [("1", True), ("off", True), ("FALSE", True), ("Yes", True), ("", True),
                                     ("maybe", False), ("2", False)])
def test_check_targets_env_is_checked(monkeypatch, env, ok):
    # the strict flag parser: junk such as "maybe" used to read as on (`!= "0"`)
    monkeypatch.setenv("SGRPO_CHECK_TARGETS", env)
    if ok:
        assert torch.isfinite(_call_linear()[0]).all()
    else:
        with pytest.raises(ValueError, match="env SGRPO_CHECK_TARGETS="):
            _call_linear()


def test_check_targets_env_values(monkeypatch):
    from sgrpo_kernels import ops

    for env, want in [("1", True), ("on", True), ("TRUE", True), ("no", False), ("off", False), ("0", False)]:
        monkeypatch.setenv("SGRPO_CHECK_TARGETS", env)
        assert ops._check_targets(None) is want, env
    monkeypatch.delenv("SGRPO_CHECK_TARGETS")
    assert ops._check_targets(None) is True and ops._check_targets(False) is False


def test_check_targets_keyword_skips_the_range_check():
    h, w = torch.randn(3, 8), torch.randn(5, 8)
    bad = torch.tensor([0, 7, 1])
    with pytest.raises(ValueError, match="targets must lie in"):
        sk.linear_logprobs(h, w, bad)
    with pytest.raises(ValueError, match="targets must lie in"):
        sk.logprobs_from_logits(h @ w.T, bad)
    good = torch.tensor([0, 4, 1])
    for check in (True, False):
        logp, _ = sk.linear_logprobs(h, w, good, check_targets=check)
        assert torch.allclose(logp, torch.log_softmax(h @ w.T, -1).gather(1, good[:, None])[:, 0], atol=1e-5)


def test_the_target_check_runs_once_per_call_through_ops(monkeypatch):
    """The forward custom ops call `sgrpo_kernels.ops.check_target_values` (a trainer counts it there): once per
    call, never with check_targets=False."""
    from sgrpo_kernels import ops

    calls = []
    real = ops.check_target_values
    monkeypatch.setattr(ops, "check_target_values", lambda *a: calls.append(a) or real(*a))
    h, w, t, b = _inputs()
    sk.linear_logprobs(h, w, t, bias=b)[0].sum().backward()
    sk.logprobs_from_logits(h @ w.T, t)
    assert len(calls) == 2
    sk.linear_logprobs(h, w, t, bias=b, check_targets=False)
    sk.logprobs_from_logits(h @ w.T, t, check_targets=False)
    assert len(calls) == 2


@pytest.mark.skipif(not torch.backends.mps.is_available() and not torch.cuda.is_available(),
                    reason="needs a second device to test device mismatch")
def test_linear_device_mismatch():
    other = "cuda" if torch.cuda.is_available() else "mps"
    with pytest.raises(ValueError, match="hidden is on"):
        _call_linear(hidden=torch.randn(6, 8, device=other))


def test_device_mismatch_message_for_targets():
    # a meta-device targets tensor stands in for "another device" on a CPU-only machine
    with pytest.raises(ValueError, match="targets is on meta, expected cpu"):
        _call_linear(targets=torch.zeros(6, dtype=torch.long, device="meta"))


BAD_LOGITS = [
    (dict(targets=torch.tensor([0, 1, 29, 3])), ValueError, r"targets must lie in \[0, 29\)"),
    (dict(targets=torch.zeros(4, 2, dtype=torch.long)), ValueError, "expected the leading shape of logits"),
    (dict(targets=torch.zeros(4)), TypeError, "integer tensor"),
    (dict(logits=torch.randint(0, 3, (4, 29))), TypeError, "logits must be a floating tensor"),
    (dict(logits=torch.randn(4, 0)), ValueError, "vocabulary"),
    (dict(temperature=0), ValueError, "temperature"),
    (dict(return_entropy=1), TypeError, "return_entropy must be a bool"),
    (dict(inplace_backward="yes"), TypeError, "inplace_backward must be a bool"),
    (dict(memory_budget=-1), ValueError, "memory_budget must be in"),
    (dict(ignore_index=1.5), TypeError, "ignore_index must be a Python int"),
    (dict(softcap=30.0), TypeError, "logprobs_from_logits\\(\\) got an unexpected keyword argument 'softcap'"),
    (dict(logit_scale=0.5), TypeError, "unexpected keyword argument 'logit_scale'"),
]


@pytest.mark.parametrize("over,exc,match", BAD_LOGITS, ids=[m for _, _, m in BAD_LOGITS])
def test_logits_bad_inputs(over, exc, match):
    kw = dict(logits=torch.randn(4, 29), targets=torch.tensor([0, 1, 2, -100]))
    kw.update(over)
    extra = {k: kw.pop(k) for k in list(kw) if k not in ("logits", "targets")}
    with pytest.raises(exc, match=match):
        sk.logprobs_from_logits(kw["logits"], kw["targets"], **extra)


def test_int32_targets_and_custom_ignore_index():
    h, w, t, b = _inputs(requires_grad=False)
    t = t.clone()
    t[1] = 7
    lp, _ = sk.linear_logprobs(h, w, t.int(), bias=b, ignore_index=7)
    lr, _ = ref.linear_logprobs(h.double(), w.double(), t, bias=b.double(), ignore_index=7, out_dtype=None)
    assert lp[t == 7].eq(0).all()
    torch.testing.assert_close(lp.double(), lr, atol=2e-5, rtol=2e-5)


# ------------------------------------------------------------------------------------------------------ dispatch


def test_dispatch_default_and_env(monkeypatch):
    monkeypatch.delenv(backends.ENV_BACKEND, raising=False)
    assert backends.resolve(None, torch.device("cpu")) == "torch"
    monkeypatch.setenv(backends.ENV_BACKEND, "torch")
    assert backends.resolve(None, torch.device("cpu")) == "torch"
    monkeypatch.setenv(backends.ENV_BACKEND, "bogus")
    with pytest.raises(ValueError, match=r"env SGRPO_BACKEND='bogus': unknown backend"):
        backends.resolve(None, torch.device("cpu"))
    # the keyword wins over the environment
    assert backends.resolve("torch", torch.device("cpu")) == "torch"


def test_dispatch_unavailable_backend_is_named(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    for name in ("triton", "npu"):
        status = backends.available_backends()[name]
        if status == "available":
            continue  # a machine with the real device
        with pytest.raises(BackendUnavailableError, match=f"backend '{name}'"):
            backends.resolve(name, torch.device("cpu"))
    with pytest.raises(BackendUnavailableError, match="reference"):
        backends.resolve("reference", torch.device("cpu"))


# ------------------------------------------------------------------------------------- torch backend: memory shape


class _RecordShapes(TorchDispatchMode):
    """Records the element count of every tensor an aten op produces, and the (M, K, N) of every matmul."""

    def __init__(self):
        super().__init__()
        self.max_numel = 0
        self.fp32_max_numel = 0
        self.matmuls: list[tuple[int, ...]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for o in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(o, torch.Tensor):
                self.max_numel = max(self.max_numel, o.numel())
                if o.dtype == torch.float32:
                    self.fp32_max_numel = max(self.fp32_max_numel, o.numel())
        if func.overloadpacket in (torch.ops.aten.mm, torch.ops.aten.addmm, torch.ops.aten.addmm_):
            a, b = (args[1], args[2]) if "addmm" in str(func.overloadpacket) else (args[0], args[1])
            self.matmuls.append((a.shape[0], a.shape[1], b.shape[1]))  # (M, K, N)
        return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_torch_backend_never_allocates_full_logits(dtype):
    N, D, V = 64, 16, 4096
    h, w, t, b = _inputs(N=N, D=D, V=V, dtype=dtype, requires_grad=False)
    opts = Options(temperature=0.9, memory_budget=64 * 1024)  # tile of 4096 elements << N * V = 262144
    with _RecordShapes() as rec:
        logp, ent, stats = tc.linear_logprobs_fwd(h, w, t, b, opts)
        tc.linear_logprobs_bwd(torch.randn(N), torch.randn(N), h, w, t, b, stats, ent, opts)
    # the largest tensor is the weight-sized gradient, never anything of N * V elements
    assert rec.max_numel <= max(V * D, 4 * 4096), rec.max_numel
    assert rec.max_numel < N * V


def test_torch_backend_drops_zero_gradient_rows_before_matmuls():
    N, D, V = 40, 8, 300
    h, w, t, b = _inputs(N=N, D=D, V=V, requires_grad=False)
    g_logp, g_ent = torch.randn(N), torch.randn(N)
    dead = torch.arange(N) % 4 != 0  # 30 of 40 rows have no upstream gradient
    g_logp[dead] = 0
    g_ent[dead] = 0
    t[0] = -100  # ignored rows drop too, even with a non-zero upstream gradient
    opts = Options(memory_budget=1 << 30)
    logp, ent, stats = tc.linear_logprobs_fwd(h, w, t, b, opts)
    with _RecordShapes() as rec:
        gh, gw, gb = tc.linear_logprobs_bwd(g_logp, g_ent, h, w, t, b, stats, ent, opts)
    active = int((~dead & (t != -100)).sum())
    assert active == 9
    # the recompute (M = rows), grad_hidden (M = rows) and grad_weight (K = rows) products all see 9 rows, not 40
    kinds = {(m == active, k == active) for m, k, _ in rec.matmuls}
    assert len(rec.matmuls) == 3 and kinds == {(True, False), (False, True)}, rec.matmuls
    # ... and the result equals the dense computation
    dense = tc.linear_logprobs_bwd(torch.where(dead, 1e-30, g_logp), torch.where(dead, 0.0, g_ent), h, w, t, b, stats,
                                   ent, opts)
    for a, e in zip((gh, gw, gb), dense):
        torch.testing.assert_close(a, e)


@pytest.mark.parametrize("col_bytes", [0, 2 * 896 * 4])
def test_chunk_sizes_respect_budget(col_bytes):
    for n, v, budget in [(1, 151936, 0), (2048, 151936, 0), (8192, 49152, 2**20), (10**6, 151936, 0), (3, 7, 1),
                         (8, 49152, 0)]:
        rows, vc = tc.chunk_sizes(n, v, budget, 4, col_bytes)
        assert 1 <= rows <= max(n, 1) and 1 <= vc <= v
        effective = budget or tc.DEFAULT_MEMORY_BUDGET
        if vc > 256:  # above the minimum chunk the tile and the per-column copies fit the budget
            assert rows * vc * 4 * tc._TILE_TEMPS + vc * col_bytes <= effective


def test_small_n_bf16_does_not_copy_the_whole_weight():
    """At small N, weight-sized temporaries (fp32 weight copies, fp32 grad accumulators) still respect the budget."""
    N, D, V = 8, 64, 8192
    h, w, t, b = _inputs(N=N, D=D, V=V, dtype=torch.bfloat16, requires_grad=False)
    opts = Options(memory_budget=256 * 1024)
    with _RecordShapes() as rec:
        logp, ent, stats = tc.linear_logprobs_fwd(h, w, t, b, opts)
        tc.linear_logprobs_bwd(torch.randn(N), torch.randn(N), h, w, t, b, stats, ent, opts)
    # the only weight-sized tensor is the bf16 gradient itself; fp32 temporaries are chunk-sized
    assert rec.max_numel <= V * D
    assert rec.fp32_max_numel * 4 <= 256 * 1024, rec.fp32_max_numel


@pytest.mark.parametrize("where", ["scattered", "whole_chunk"])
def test_neg_inf_logits(dev_backend, where):
    """-inf logits (masked vocabulary, -inf bias) get p = 0: finite logp, entropy and gradients, as in float64."""
    device, backend = dev_backend
    N, V = 5, 600
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(N, V, generator=g, dtype=torch.float64) * 3
    if where == "scattered":
        logits[torch.rand(N, V, generator=g) < 0.3] = float("-inf")
    else:
        logits[:, :300] = float("-inf")  # the whole first vocab chunk of a small budget
    t = torch.randint(0, V, (N,), generator=g)
    t = torch.where(torch.isinf(logits.gather(1, t[:, None]).squeeze(1)), logits.argmax(1), t)  # finite targets
    gl, ge = torch.randn(N, generator=g), torch.randn(N, generator=g)
    z = logits.float().to(device).requires_grad_(True)
    lp, ent = sk.logprobs_from_logits(z * 1, t.to(device), backend=backend, memory_budget=1)
    (lp * gl.to(device)).sum().add((ent * ge.to(device)).sum()).backward()
    zr = logits.clone().requires_grad_(True)
    lr, er = ref.logprobs_from_logits(zr, t, out_dtype=None)
    ((lr * gl.double()).sum() + (er * ge.double()).sum()).backward()
    assert torch.isfinite(lp).all() and torch.isfinite(ent).all() and torch.isfinite(z.grad).all()
    assert torch.isfinite(zr.grad).all()
    torch.testing.assert_close(lp.double().cpu(), lr, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(ent.double().cpu(), er, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(z.grad.double().cpu(), zr.grad, atol=5e-5, rtol=5e-5)
    # the same through the linear op, with the -inf coming from the bias
    D = 8
    h = torch.randn(N, D, generator=g, dtype=torch.float64)
    w = torch.randn(V, D, generator=g, dtype=torch.float64)
    bias = torch.where(torch.isinf(logits[0]), logits[0], torch.zeros(V, dtype=torch.float64))
    t2 = torch.full((N,), int(torch.isfinite(bias).nonzero()[0]))
    leaves = [x.float().to(device).requires_grad_(True) for x in (h, w)]
    lp2, ent2 = sk.linear_logprobs(*leaves, t2.to(device), bias=bias.float().to(device), backend=backend,
                                   memory_budget=1)
    (lp2.sum() + ent2.sum()).backward()
    ref_leaves = [x.clone().requires_grad_(True) for x in (h, w)]
    lr2, er2 = ref.linear_logprobs(*ref_leaves, t2, bias=bias, out_dtype=None)
    (lr2.sum() + er2.sum()).backward()
    torch.testing.assert_close(lp2.double().cpu(), lr2, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(ent2.double().cpu(), er2, atol=2e-5, rtol=2e-5)
    for a, e in zip(leaves, ref_leaves):
        assert torch.isfinite(a.grad).all()
        torch.testing.assert_close(a.grad.double().cpu(), e.grad, atol=5e-5, rtol=5e-5)


def test_inplace_backward_refuses_a_leaf():
    z = torch.randn(3, 11, requires_grad=True)
    with pytest.raises(ValueError, match="inplace_backward=True would overwrite logits"):
        sk.logprobs_from_logits(z, torch.zeros(3, dtype=torch.long), inplace_backward=True)


@pytest.mark.parametrize(
    "view", [lambda x: x.view(6, 5), lambda x: x[:, :5], lambda x: x.t(), lambda x: x.view(2, 3, 5)]
)
def test_inplace_backward_refuses_a_view_of_a_leaf(view):
    # issue 11 item 4: a view shares the leaf's storage; the in-place backward would overwrite the leaf's data with
    # its own gradient (before the fix x.data came back equal to x.grad)
    x = torch.randn(6, 5, requires_grad=True)
    z = view(x)
    with pytest.raises(ValueError, match="view of\\) a leaf tensor that requires grad"):
        sk.logprobs_from_logits(z, torch.zeros(z.shape[:-1], dtype=torch.long), inplace_backward=True)


def test_inplace_backward_allows_a_view_of_a_non_leaf():
    h = torch.randn(6, 4, dtype=torch.float64, requires_grad=True)
    w = torch.randn(5, 4, dtype=torch.float64)
    t = torch.randint(0, 5, (2, 3))
    lp, ent = sk.logprobs_from_logits((h @ w.T).view(2, 3, 5), t, inplace_backward=True)
    (lp.sum() + ent.sum()).backward()
    h2 = h.detach().clone().requires_grad_(True)
    lr, er = ref.logprobs_from_logits((h2 @ w.T).view(2, 3, 5), t, out_dtype=None)
    (lr.sum() + er.sum()).backward()
    torch.testing.assert_close(h.grad, h2.grad)
