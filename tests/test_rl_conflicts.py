"""conflict_weights: hand-built groups with known answers, a loop reference under hypothesis, invariants, bad inputs."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sgrpo_kernels import rl

PAD = 0


def ref_conflicts(ids, mask, adv, g, strategy="gtpo", w_pos=2.0, w_neg=0.0, combine="product"):
    """Loop reference: explicit pairwise comparisons, explicit left and right-aligned scans."""
    b, t = len(ids), len(ids[0])
    weights = [[1.0] * t for _ in range(b)]
    counts = [0] * b
    for i in range(b):
        if adv[i] == 0:
            continue
        grp = range((i // g) * g, (i // g) * g + g)
        sign = 1 if adv[i] > 0 else -1
        same = [j for j in grp if adv[j] * sign > 0]
        opp = [j for j in grp if adv[j] * sign < 0]

        def length(j):
            return max([k + 1 for k in range(t) if mask[j][k]], default=0)

        def factor(aligned_tok, pos_of, same=same, opp=opp, sign=sign):  # pos_of(j): index in row j or None
            n_same = sum(1 for j in same if pos_of(j) is not None and ids[j][pos_of(j)] == aligned_tok)
            n_opp = sum(1 for j in opp if pos_of(j) is not None and ids[j][pos_of(j)] == aligned_tok)
            if n_opp == 0:
                return None  # not a conflict
            n_pos, n_neg = (n_same, n_opp) if sign > 0 else (n_opp, n_same)
            if strategy == "gtpo":
                return w_pos if sign > 0 else w_neg
            if strategy == "skip":
                return 0.0
            if strategy == "weight":
                p = n_pos / (n_pos + n_neg)
                return p if sign > 0 else 1 - p
            return 1.0 if (n_pos >= n_neg if sign > 0 else n_neg >= n_pos) else 0.0

        pre = {}
        for k in range(t):  # prefix scan, stops at the first non-conflict
            if not mask[i][k]:
                break

            def at(j, k=k):
                return k if mask[j][k] else None

            f = factor(ids[i][k], at)
            if f is None:
                break
            pre[k] = f
        suf = {}
        li = length(i)
        for s in range(li):  # right-aligned scan from the last valid token
            k = li - 1 - s
            if not mask[i][k]:
                break

            def at_r(j, s=s):
                lj = length(j)
                q = lj - 1 - s
                return q if q >= 0 and mask[j][q] else None

            f = factor(ids[i][k], at_r)
            if f is None:
                break
            suf[k] = f
        for k in range(t):
            fp, fs = pre.get(k, 1.0), suf.get(k, 1.0)
            if combine == "product":
                weights[i][k] = fp * fs
            else:
                weights[i][k] = fp if abs(fp - 1) >= abs(fs - 1) else fs
        counts[i] = len(set(pre) | set(suf))
    return weights, counts


def run(ids, adv, g, **kw):
    ids_t = torch.tensor(ids)
    mask = ids_t != PAD
    w, n = rl.conflict_weights(ids_t, mask, torch.tensor(adv, dtype=torch.float64), g, **kw)
    return w.tolist(), n.tolist()


def test_shared_prefix():
    w, n = run([[5, 6, 7, 8], [5, 6, 9, 9]], [1.0, -1.0], 2)
    assert w == [[2, 2, 1, 1], [0, 0, 1, 1]]
    assert n == [2, 2]


def test_shared_suffix_right_aligned():
    # different lengths: the suffix is aligned at the last valid token, not at position T - 1
    w, n = run([[1, 2, 7, 8, PAD], [3, 4, 5, 7, 8]], [1.0, -1.0], 2)
    assert w == [[1, 1, 2, 2, 1], [1, 1, 1, 0, 0]]
    assert n == [2, 2]


def test_shared_prefix_and_suffix_product_and_max():
    ids = [[1, 2, 3, 9], [1, 4, 5, 9]]
    assert run(ids, [1.0, -1.0], 2)[0] == [[2, 1, 1, 2], [0, 1, 1, 0]]
    # a token in both runs: product squares the factor, max applies it once
    ids = [[1, 2], [1, PAD], [3, 2]]
    w, n = run(ids, [1.0, -1.0, -1.0], 3)
    # row 0: prefix run t0, t1 (t0 shared with row 1, t1 with row 2); suffix run only t1 (row 1 is right-aligned)
    assert w[0] == [2.0, 4.0] and n[0] == 2
    assert w[1] == [0.0, 1.0] and n[1] == 1
    w, _ = run(ids, [1.0, -1.0, -1.0], 3, combine="max")
    assert w[0] == [2.0, 2.0]
    assert w[1] == [0.0, 1.0]  # negative side: 0 once (max keeps the factor farther from 1)


def test_full_overlap():
    ids = [[1, 2, 3], [1, 2, 3]]
    w, n = run(ids, [0.5, -0.5], 2)
    assert w == [[4, 4, 4], [0, 0, 0]]
    assert n == [3, 3]
    w, _ = run(ids, [0.5, -0.5], 2, combine="max")
    assert w == [[2, 2, 2], [0, 0, 0]]


def test_no_overlap():
    w, n = run([[1, 2, 3], [4, 5, 6]], [1.0, -1.0], 2)
    assert w == [[1, 1, 1], [1, 1, 1]] and n == [0, 0]


def test_padding_never_conflicts():
    # both rows end in PAD at the same positions (same pad id) and the mask hides it: no conflict there
    w, n = run([[1, 5, PAD, PAD], [2, 6, PAD, PAD]], [1.0, -1.0], 2)
    assert w == [[1] * 4, [1] * 4] and n == [0, 0]
    # a masked token inside the prefix ends the run even if ids agree
    ids = torch.tensor([[1, 2, 3], [1, 2, 3]])
    mask = torch.tensor([[True, False, True], [True, True, True]])
    w, n = rl.conflict_weights(ids, mask, torch.tensor([1.0, -1.0]), 2)
    assert w.tolist()[0] == [2.0, 1.0, 2.0]  # t2 is in the suffix run
    assert n.tolist() == [2, 2]
    assert w.tolist()[1] == [0.0, 1.0, 0.0]


def test_zero_advantage_members_and_groups():
    ids = [[1, 2], [1, 2], [1, 2], [1, 3], [1, 3], [1, 3]]
    w, n = run(ids, [1.0, 0.0, -1.0, 0.0, 0.0, 0.0], 3)
    assert w[1] == [1, 1] and n[1] == 0  # A = 0 member keeps 1
    assert w[0] == [4, 4] and w[2] == [0, 0]
    assert all(row == [1, 1] for row in w[3:]) and n[3:] == [0, 0, 0]


def test_groups_are_separate():
    # the negative completion that shares the prefix is in another group: no conflict
    w, n = run([[1, 2], [3, 4], [1, 2], [5, 6]], [1.0, -1.0, -1.0, 1.0], 2)
    assert w == [[1, 1], [1, 1], [1, 1], [1, 1]] and n == [0, 0, 0, 0]


def test_prefix_run_stops_at_first_disagreement():
    # t2 agrees again after a disagreement at t1: not part of the prefix run (the middle is not masked)
    w, _ = run([[1, 2, 3, 7, 8], [1, 9, 3, 6, 5]], [1.0, -1.0], 2)
    assert w == [[2, 1, 1, 1, 1], [0, 1, 1, 1, 1]]


def test_other_strategies_known_answers():
    ids = [[1, 2], [1, 3], [1, 4], [5, 5]]
    adv = [1.0, 1.0, -1.0, -1.0]  # token 1 at t0: 2 positives, 1 negative
    w, _ = run(ids, adv, 4, strategy="skip")
    assert w == [[0, 1], [0, 1], [0, 1], [1, 1]]
    w, _ = run(ids, adv, 4, strategy="weight", combine="max")
    assert w[0][0] == pytest.approx(2 / 3) and w[2][0] == pytest.approx(1 / 3)
    w, _ = run(ids, adv, 4, strategy="majority")
    assert w == [[1, 1], [1, 1], [0, 1], [1, 1]]
    w, _ = run([[1], [1]], [1.0, -1.0], 2, strategy="majority")  # tie: both keep 1
    assert w == [[1], [1]]
    w, _ = run(ids, adv, 4, w_pos=3.0, w_neg=0.5)
    assert w[0][0] == 3.0 and w[2][0] == 0.5


def test_only_positives_no_conflicts():
    ids = torch.randint(0, 3, (8, 6))
    w, n = rl.conflict_weights(ids, torch.ones(8, 6, dtype=torch.bool), torch.rand(8) + 0.1, 4)
    assert (w == 1).all() and (n == 0).all()


@st.composite
def groups(draw):
    g = draw(st.integers(1, 4))
    n_groups = draw(st.integers(1, 2))
    t = draw(st.integers(1, 6))
    b = g * n_groups
    ids = [[draw(st.integers(1, 3)) for _ in range(t)] for _ in range(b)]
    lengths = [draw(st.integers(0, t)) for _ in range(b)]
    mask = [[k < lengths[i] for k in range(t)] for i in range(b)]
    for i in range(b):
        for k in range(t):
            if not mask[i][k]:
                ids[i][k] = PAD
    adv = [draw(st.sampled_from([-1.0, -0.5, 0.0, 0.5, 1.0])) for _ in range(b)]
    return g, ids, mask, adv


@settings(max_examples=60, deadline=None)
@given(groups(), st.sampled_from(rl.CONFLICT_STRATEGIES), st.sampled_from(rl.COMBINE_MODES))
def test_matches_loop_reference(case, strategy, combine):
    g, ids, mask, adv = case
    w, n = rl.conflict_weights(torch.tensor(ids), torch.tensor(mask), torch.tensor(adv), g, strategy, combine=combine)
    want_w, want_n = ref_conflicts(ids, mask, adv, g, strategy, combine=combine)
    torch.testing.assert_close(w, torch.tensor(want_w, dtype=torch.float32))
    assert n.tolist() == want_n
    # invariants: A = 0 rows untouched; gtpo never changes a token outside the runs
    for i, a in enumerate(adv):
        if a == 0:
            assert (w[i] == 1).all()
    # float masks behave like bool masks
    w2, n2 = rl.conflict_weights(
        torch.tensor(ids), torch.tensor(mask, dtype=torch.float32), torch.tensor(adv), g, strategy, combine=combine
    )
    assert torch.equal(w, w2) and torch.equal(n, n2)


def test_large_vocab_ids():
    ids = torch.tensor([[151_000, 2, 3], [151_000, 2, 4]])
    w, _ = rl.conflict_weights(ids, torch.ones(2, 3, dtype=torch.bool), torch.tensor([1.0, -1.0]), 2)
    assert w.tolist() == [[2, 2, 1], [0, 0, 1]]


@pytest.mark.parametrize(
    ("kwargs", "exc", "words"),
    [
        ({"group_size": 3}, ValueError, ["completion_ids", "group_size = 3"]),
        ({"completion_mask": torch.full((4, 5), 2, dtype=torch.int64)}, ValueError, ["completion_mask", "0 and 1"]),
        ({"completion_mask": torch.ones(4, 4, dtype=torch.bool)}, ValueError, ["completion_mask", "(4, 4)", "(4, 5)"]),
        ({"advantages": torch.ones(3)}, ValueError, ["advantages", "(3,)", "(4,)"]),
        ({"advantages": torch.ones(4, dtype=torch.int64)}, TypeError, ["advantages"]),
        ({"completion_ids": torch.ones(4, 5)}, TypeError, ["completion_ids"]),
        ({"completion_ids": torch.ones(4, dtype=torch.int64)}, ValueError, ["completion_ids", "[B, T]"]),
        ({"strategy": "causal"}, ValueError, ["strategy", "causal"]),
        ({"combine": "sum"}, ValueError, ["combine", "sum"]),
        ({"w_pos": float("nan")}, ValueError, ["w_pos"]),
    ],
)
def test_bad_inputs(kwargs, exc, words):
    args = {
        "completion_ids": torch.ones(4, 5, dtype=torch.int64),
        "completion_mask": torch.ones(4, 5, dtype=torch.bool),
        "advantages": torch.ones(4),
        "group_size": 2,
    }
    args.update(kwargs)
    with pytest.raises(exc) as info:
        rl.conflict_weights(**args)
    for w in words:
        assert w in str(info.value)
