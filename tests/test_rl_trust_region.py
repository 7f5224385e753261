"""The trust region on parameters (sgrpo_kernels.rl.TrustRegion): the projected step against a float64 formula written
here, the bundled trainer's arithmetic bit for bit (strict=False), steps inside the ball and non-finite steps left
alone, max_norm=inf only measuring, bf16 and fp32 weights, gradient accumulation, LoRA, DDP (every rank the same
decision) and FSDP2 / DTensor and plain-tensor shards (the norm of the whole, unsharded step), bad inputs refused."""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist
from procs import spawn_gloo

from sgrpo_kernels.rl import TrustRegion, project_step, step_norm


def _model(dtype=torch.float32, seed=0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(7, 13), torch.nn.Tanh(), torch.nn.Linear(13, 5)).to(dtype)


def _loss(model, seed=1, n=9):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 7, generator=g).to(next(model.parameters()).dtype)
    return (model(x) ** 2).sum()


def _step(model, opt, seed=1):
    opt.zero_grad()
    _loss(model, seed).backward()
    opt.step()


def _flat64(params) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1).to(torch.float64) for p in params])


def test_projection_matches_the_float64_formula_and_keeps_the_direction():
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=0.05)
    free = _model()  # the same weights and step without the cap
    free_opt = torch.optim.AdamW(free.parameters(), lr=0.05)
    before = _flat64(model.parameters())
    tr = TrustRegion(opt, 0.01)
    _step(model, opt)
    _step(free, free_opt)
    d = _flat64(free.parameters()) - before
    assert d.norm() > 0.01  # the step had to be projected
    want = before + d * (0.01 / d.norm())
    got = _flat64(model.parameters())
    assert tr.last.projected and tr.steps == 1 and tr.projected_steps == 1
    assert tr.last.norm == pytest.approx(float(d.norm()), rel=1e-6)
    assert tr.last.norm_after <= 0.01
    torch.testing.assert_close(got, want, rtol=0, atol=2e-7)  # fp32 rounding of the weights
    cos = torch.dot(got - before, d) / ((got - before).norm() * d.norm())
    assert float(cos) > 1 - 1e-6


def test_a_step_inside_the_ball_is_untouched_bit_for_bit():
    model, free = _model(), _model()
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    free_opt = torch.optim.SGD(free.parameters(), lr=1e-4)
    tr = TrustRegion(opt, 10.0)
    _step(model, opt)
    _step(free, free_opt)
    assert not tr.last.projected and tr.last.norm == tr.last.norm_after > 0
    for p, q in zip(model.parameters(), free.parameters()):
        assert torch.equal(p, q)


def test_inf_only_measures():
    model, free = _model(), _model()
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    free_opt = torch.optim.AdamW(free.parameters(), lr=0.1)
    before = _flat64(model.parameters())
    tr = TrustRegion(opt, math.inf)
    for seed in (1, 2):
        _step(model, opt, seed)
        _step(free, free_opt, seed)
    for p, q in zip(model.parameters(), free.parameters()):
        assert torch.equal(p, q)
    assert not tr.last.projected and tr.steps == 2 and tr.projected_steps == 0
    assert tr.last.norm > 0 and math.isfinite(tr.last.norm)
    old = [b.reshape(p.shape).float() for b, p in zip(before.split([p.numel() for p in model.parameters()]),
                                                        model.parameters())]  # fmt: skip
    assert step_norm(model.parameters(), old) == pytest.approx(float((_flat64(model.parameters()) - before).norm()))


def test_a_non_finite_step_is_left_alone():
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    tr = TrustRegion(opt, 1e-3)
    opt.zero_grad()
    _loss(model).backward()
    next(model.parameters()).grad[0, 0] = float("nan")
    opt.step()
    assert math.isnan(tr.last.norm) and not tr.last.projected
    first = next(model.parameters())
    assert torch.isnan(first[0, 0]) and torch.isfinite(first[1:]).all()  # the optimizer's step, not projected


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_same_arithmetic_as_the_bundled_trainer(dtype):
    """strict=False is train/features/trust_region.py's project_step, bit for bit (norms and weights)."""
    from train.features.trust_region import project_step as trainer_project

    results = []
    for which in ("trainer", "rl"):
        model = _model(dtype)
        opt = torch.optim.AdamW(model.parameters(), lr=0.05)
        params = list(model.parameters())
        old = [p.detach().clone() for p in params]
        _step(model, opt)
        if which == "trainer":
            norms = trainer_project(params, old, 0.02)
        else:
            s = project_step(params, old, 0.02, strict=False)
            norms = (s.norm, s.norm_after)
        results.append((norms, [p.detach().clone() for p in params]))
    (n1, w1), (n2, w2) = results
    assert n1 == n2 and n1[0] > 0.02
    assert all(torch.equal(a, b) for a, b in zip(w1, w2))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_strict_keeps_the_reported_norm_inside_the_ball(dtype):
    """The weights' rounding can leave a single projection above the cap (bf16: visibly); strict re-projects until
    the measured norm is <= max_norm, and the step keeps its direction."""
    for delta in (0.5, 0.05, 3e-3):
        model = _model(dtype, seed=3)
        opt = torch.optim.AdamW(model.parameters(), lr=0.2)
        before = _flat64(model.parameters())
        tr = TrustRegion(opt, delta)
        _step(model, opt)
        assert tr.last.projected and tr.last.norm_after <= delta
        got = _flat64(model.parameters()) - before
        assert float(got.norm()) == pytest.approx(tr.last.norm_after, rel=1e-9)
        # where the ball is coarse against the weights' resolution (bf16, delta 3e-3: each weight's share of the
        # step is below an ulp) the step left is inside but shorter; elsewhere it is on the sphere up to rounding
        if dtype == torch.float32 or delta >= 0.05:
            assert float(got.norm()) >= delta * (0.95 if dtype == torch.bfloat16 else 0.9999)


def test_fp32_master_weights_are_capped_not_the_bf16_copy():
    """Mixed precision with fp32 master weights: the optimizer updates the masters; the cap is on them."""
    model = _model(torch.bfloat16)
    masters = [p.detach().float().requires_grad_() for p in model.parameters()]
    opt = torch.optim.AdamW(masters, lr=0.1)
    tr = TrustRegion(opt, 0.01)
    opt.zero_grad()
    _loss(model).backward()
    for m, p in zip(masters, model.parameters()):
        m.grad = p.grad.float()
    before = _flat64(masters)
    opt.step()
    assert tr.last.projected and float((_flat64(masters) - before).norm()) <= 0.01


def test_gradient_accumulation_projects_once_per_optimizer_step():
    acc, whole = _model(), _model()
    opt_a = torch.optim.SGD(acc.parameters(), lr=0.5)
    opt_w = torch.optim.SGD(whole.parameters(), lr=0.5)
    tr_a, tr_w = TrustRegion(opt_a, 0.05), TrustRegion(opt_w, 0.05)
    opt_a.zero_grad()
    for seed in (1, 2, 3):  # three micro-batches, one step
        _loss(acc, seed).backward()
    opt_a.step()
    opt_w.zero_grad()
    sum(_loss(whole, seed) for seed in (1, 2, 3)).backward()
    opt_w.step()
    assert tr_a.steps == 1 and tr_a.last.projected
    assert tr_a.last.norm == pytest.approx(tr_w.last.norm, rel=1e-5)
    for p, q in zip(acc.parameters(), whole.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_lora_caps_the_adapters_and_leaves_the_base_alone():
    peft = pytest.importorskip("peft")
    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Linear(7, 13), torch.nn.Tanh(), torch.nn.Linear(13, 5))
    model = peft.get_peft_model(base, peft.LoraConfig(r=4, target_modules=["0", "2"], init_lora_weights="gaussian"))
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    trained = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trained, lr=0.1)
    tr = TrustRegion(opt, 0.02)
    before = _flat64(trained)
    _step(model, opt)
    assert tr.last.projected and tr.last.norm_after <= 0.02
    assert float((_flat64(trained) - before).norm()) == pytest.approx(tr.last.norm_after, rel=1e-9)
    for n, p in model.named_parameters():
        if n in frozen:
            assert torch.equal(p, frozen[n])


def test_manual_mode_and_remove():
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    tr = TrustRegion(opt, 0.01, attach=False)
    _step(model, opt)  # not attached: nothing measured
    assert tr.last is None and tr.steps == 0
    with pytest.raises(RuntimeError, match="snapshot"):
        tr.project()
    tr.snapshot()
    opt.zero_grad()
    _loss(model).backward()
    opt.step()
    assert tr.project().projected
    tr2 = TrustRegion(opt, 0.01)
    tr2.remove()
    _step(model, opt)
    assert tr2.last is None


def test_a_param_group_added_after_construction_is_capped_too():
    # found by an adversarial review: the parameter list was taken once, so a group added later moved 30 under a cap
    # of 0.1 and `last` measured only the old parameters
    a, b = torch.nn.Parameter(torch.zeros(4)), torch.nn.Parameter(torch.zeros(3))
    opt = torch.optim.SGD([a], lr=1.0)
    tr = TrustRegion(opt, 0.1)
    opt.add_param_group({"params": [b]})
    (a.sum() * -5 + b.sum() * -10).backward()
    opt.step()
    whole = torch.cat([a.detach(), b.detach()])
    assert tr.last.projected and float(whole.double().norm()) == pytest.approx(0.1, rel=1e-6)
    step = torch.cat([torch.full((4,), 5.0), torch.full((3,), 10.0)]).double()
    torch.testing.assert_close(whole.double(), step / step.norm() * 0.1, rtol=1e-6, atol=0)  # the direction kept
    fixed = TrustRegion(torch.optim.SGD([a], lr=1.0), 0.1, params=[a], attach=False)
    assert fixed.params == [a]  # given params stay as given


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"max_norm": float("nan")}, ["max_norm", "nan", "> 0"]),
        ({"max_norm": -0.1}, ["max_norm", "-0.1", "> 0"]),
        ({"max_norm": 0}, ["max_norm", "0", "> 0"]),
        ({"max_norm": True}, ["max_norm", "True", "number"]),
        ({"max_norm": "0.1"}, ["max_norm", "'0.1'", "number"]),
        ({"max_norm": 0.1, "strict": "yes"}, ["strict", "bool"]),
        ({"max_norm": 0.1, "params": [torch.zeros(3, dtype=torch.long)]}, ["params[0]", "floating-point"]),
    ],
)
def test_bad_inputs_are_refused_naming_the_argument(kwargs, words):
    opt = torch.optim.SGD(_model().parameters(), lr=1.0)
    with pytest.raises((TypeError, ValueError)) as info:
        TrustRegion(opt, **kwargs)
    for w in words:
        assert w in str(info.value)
    with pytest.raises(TypeError, match="torch.optim.Optimizer"):
        TrustRegion([torch.zeros(1)], 0.1)


# ------------------------------------------------------------------------------------------------- distributed


def _reference(delta: float):
    """The unsharded model, its capped step, in one process: (norm before, weights after)."""
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    tr = TrustRegion(opt, delta)
    _step(model, opt)
    return tr.last, [p.detach().clone() for p in model.parameters()]


def _ddp_worker(rank: int, world: int, out: str) -> None:
    model = torch.nn.parallel.DistributedDataParallel(_model())
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    tr = TrustRegion(opt, 0.05)
    opt.zero_grad()
    (_loss(model, seed=1 + rank) * world).backward()  # each rank its half; DDP averages
    opt.step()
    torch.save({"last": tr.last, "w": [p.detach() for p in model.parameters()]}, f"{out}/ddp{rank}.pt")


def test_ddp_every_rank_takes_the_same_decision(tmp_path):
    spawn_gloo(_ddp_worker, (str(tmp_path),), nprocs=2)
    r0, r1 = (torch.load(tmp_path / f"ddp{r}.pt", weights_only=False) for r in (0, 1))
    assert r0["last"] == r1["last"] and r0["last"].projected
    assert all(torch.equal(a, b) for a, b in zip(r0["w"], r1["w"]))
    # the same as one process on the whole batch (sum of the two halves' losses)
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    tr = TrustRegion(opt, 0.05)
    opt.zero_grad()
    (_loss(model, seed=1) + _loss(model, seed=2)).backward()
    opt.step()
    assert r0["last"].norm == pytest.approx(tr.last.norm, rel=1e-5)
    for a, b in zip(r0["w"], model.parameters()):
        torch.testing.assert_close(a, b.detach(), rtol=1e-5, atol=1e-6)


def _sharded_worker(rank: int, world: int, out: str, how: str) -> None:
    full = _model()
    g_model = _model()
    _loss(g_model).backward()
    grads = [p.grad for p in g_model.parameters()]
    if how == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        model = _model()
        fully_shard(model)
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        tr = TrustRegion(opt, 0.05)
        opt.zero_grad()
        _loss(model).backward()  # FSDP2: every rank the same batch, reduce-scattered gradients (mean)
        opt.step()
        weights = [p.full_tensor().detach() for p in model.parameters()]
    elif how == "dtensor":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Shard, distribute_tensor

        mesh = init_device_mesh("cpu", (world,))
        params = [torch.nn.Parameter(distribute_tensor(p.detach(), mesh, [Shard(0)])) for p in full.parameters()]
        for p, g in zip(params, grads):
            p.grad = distribute_tensor(g, mesh, [Shard(0)])
        opt = torch.optim.SGD(params, lr=0.5)
        tr = TrustRegion(opt, 0.05)
        opt.step()
        weights = [p.full_tensor().detach() for p in params]
    else:  # plain-tensor shards (FSDP1 flat parameters): rank r holds rows r::world of each flattened tensor
        params = [torch.nn.Parameter(p.detach().reshape(-1)[rank::world].clone()) for p in full.parameters()]
        for p, g in zip(params, grads):
            p.grad = g.reshape(-1)[rank::world].clone()
        opt = torch.optim.SGD(params, lr=0.5)
        tr = TrustRegion(opt, 0.05, process_group=dist.group.WORLD)
        opt.step()
        weights = []
        for p, q in zip(params, full.parameters()):
            parts = [None] * world
            dist.all_gather_object(parts, p.detach())  # (uneven shards)
            flat = torch.empty(q.numel())
            for r in range(world):
                flat[r::world] = parts[r]
            weights.append(flat.reshape(q.shape))
    torch.save({"last": tr.last, "w": weights}, f"{out}/{how}{rank}.pt")


@pytest.mark.parametrize("how", ["dtensor", "plain_shards", "fsdp2"])
def test_sharded_norm_is_the_norm_of_the_whole_step(tmp_path, how):
    spawn_gloo(_sharded_worker, (str(tmp_path), how), nprocs=2)
    r0, r1 = (torch.load(tmp_path / f"{how}{r}.pt", weights_only=False) for r in (0, 1))
    assert r0["last"] == r1["last"]  # every rank measured the same whole norm
    ref_last, ref_w = _reference(0.05)
    assert ref_last.projected and r0["last"].projected
    assert r0["last"].norm == pytest.approx(ref_last.norm, rel=1e-6)
    assert r0["last"].norm_after <= 0.05
    for a, b in zip(r0["w"], ref_w):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
