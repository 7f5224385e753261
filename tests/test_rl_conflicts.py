"""conflict_weights: hand-built groups with known answers, a loop reference under hypothesis, invariants, bad inputs."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sgrpo_kernels import rl

PAD = 0


def ref_conflicts(ids, mask, adv, g, strategy="gtpo", w_pos=2.0, w_neg=0.0, combine="product", detect="positional"):
    """Loop reference: explicit pairwise comparisons, explicit left and right-aligned scans (positional) or explicit
    token sets (anywhere); causal credit from explicit holder / non-holder means in float64."""
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
        signed = [j for j in grp if adv[j] != 0]

        def length(j):
            return max([k + 1 for k in range(t) if mask[j][k]], default=0)

        def factor(aligned_tok, holds, same=same, opp=opp, sign=sign, signed=signed):  # holds(j, tok) -> bool
            n_same = sum(1 for j in same if holds(j, aligned_tok))
            n_opp = sum(1 for j in opp if holds(j, aligned_tok))
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
            if strategy == "causal":
                with_ = [float(adv[j]) for j in signed if holds(j, aligned_tok)]
                without = [float(adv[j]) for j in signed if not holds(j, aligned_tok)]
                vals = [float(adv[j]) for j in signed]
                if not without:
                    return 0.0
                delta = (sum(with_) / len(with_) - sum(without) / len(without)) / (max(vals) - min(vals))
                return max(0.0, delta if sign > 0 else -delta)
            return 1.0 if (n_pos >= n_neg if sign > 0 else n_neg >= n_pos) else 0.0

        if detect == "anywhere":

            def holds_any(j, tok):
                return any(mask[j][k] and ids[j][k] == tok for k in range(t))

            for k in range(t):
                if mask[i][k]:
                    f = factor(ids[i][k], holds_any)
                    if f is not None:
                        weights[i][k] = f
                        counts[i] += 1
            continue

        def at_to_holds(pos_of):  # pos_of(j): index in row j or None
            return lambda row, tok: pos_of(row) is not None and ids[row][pos_of(row)] == tok

        pre = {}
        for k in range(t):  # prefix scan, stops at the first non-conflict
            if not mask[i][k]:
                break

            def at(j, k=k):
                return k if mask[j][k] else None

            f = factor(ids[i][k], at_to_holds(at))
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

            f = factor(ids[i][k], at_to_holds(at_r))
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


def test_anywhere_detection_is_position_independent():
    # token 5 is at t0 in the positive and at t2, t3 in the negative; token 7 at t2 / t1: positional sees nothing
    ids = [[5, 6, 7, 8], [9, 7, 5, 5]]
    assert run(ids, [1.0, -1.0], 2) == ([[1, 1, 1, 1], [1, 1, 1, 1]], [0, 0])
    w, n = run(ids, [1.0, -1.0], 2, detect="anywhere")
    assert w == [[2, 1, 2, 1], [1, 0, 0, 0]]  # every occurrence, no runs, one factor (no prefix x suffix product)
    assert n == [2, 3]
    assert run(ids, [1.0, -1.0], 2, detect="anywhere", combine="max") == (w, n)  # combine changes nothing


def test_anywhere_counts_a_completion_once_per_token():
    # token 1 appears twice in the positive row 0 and once in the negative row 2: n+ = 1 (not 2), n- = 1 -> p = 1/2
    w, n = run([[1, 1], [2, 2], [1, 5]], [1.0, 1.0, -1.0], 3, strategy="weight", detect="anywhere")
    assert w == [[0.5, 0.5], [1, 1], [0.5, 1]] and n == [2, 0, 1]
    # masked tokens never count (row 1's 3 is masked, so row 0's 3 is no conflict) and groups stay separate (row 2's
    # 3 is in another group than row 1)
    ids = torch.tensor([[3, 4], [4, 3], [3, 9], [8, 9]])
    mask = torch.tensor([[True, True], [True, False], [True, True], [True, True]])
    w, n = rl.conflict_weights(ids, mask, torch.tensor([1.0, -1.0, 1.0, -1.0]), 2, detect="anywhere")
    assert w.tolist() == [[1, 2], [0, 1], [1, 2], [1, 0]] and n.tolist() == [1, 1, 1, 1]


def _grpo_adv(rewards, g):
    return rl.group_advantages(torch.tensor(rewards, dtype=torch.float64), g)


def test_causal_hand_computed_binary():
    """G = 5, rewards [1, 1, 0, 0, 0]. delta_y = P(r=1 | y) - P(r=1 | not y) over the group (reward range 1).

    Token 7 (t0 of rows 0, 1, 2): holders r = {1, 1, 0} -> 2/3, the others {0, 0} -> 0: delta = 2/3.
    Token 9 (row 0 t2, row 3 t1, row 4 t0; anywhere only): holders {1, 0, 0} -> 1/3, others {1, 0} -> 1/2:
    delta = -1/6. Positive side keeps max(0, delta), negative side max(0, -delta)."""
    ids = [[7, 1, 9], [7, 3, 4], [7, 5, 6], [8, 9, 5], [9, 6, 8]]
    adv = _grpo_adv([1, 1, 0, 0, 0], 5)
    mask = torch.ones(5, 3, dtype=torch.bool)
    w, n = rl.conflict_weights(torch.tensor(ids), mask, adv, 5, "causal")
    want = [[2 / 3, 1, 1], [2 / 3, 1, 1], [0, 1, 1], [1, 1, 1], [1, 1, 1]]
    torch.testing.assert_close(w, torch.tensor(want, dtype=torch.float64))
    assert n.tolist() == [1, 1, 1, 0, 0]
    w, n = rl.conflict_weights(torch.tensor(ids), mask, adv, 5, "causal", detect="anywhere")
    want = [[2 / 3, 1, 0], [2 / 3, 1, 1], [0, 1, 1], [1, 1 / 6, 1], [1 / 6, 1, 1]]
    torch.testing.assert_close(w, torch.tensor(want, dtype=torch.float64))
    assert n.tolist() == [2, 1, 1, 1, 1]
    # the contrast is the same for any affine advantage (dr_grpo: r - mean; rloo)
    for method in ("dr_grpo", "rloo"):
        a = rl.group_advantages(torch.tensor([1.0, 1, 0, 0, 0], dtype=torch.float64), 5, method)
        w2, _ = rl.conflict_weights(torch.tensor(ids), mask, a, 5, "causal", detect="anywhere")
        torch.testing.assert_close(w2, torch.tensor(want, dtype=torch.float64))


def test_causal_continuous_rewards_and_edge_cases():
    # dr_grpo, rewards [1, 0.5, 0, 0] -> A = [0.625, 0.125, -0.375, -0.375]; token 4 held by rows 0 and 2:
    # mean A with = 0.125, without = (0.125 - 0.375) / 2 = -0.125, range 1.0 -> delta = 0.25
    # (in rewards: mean 0.5 with, 0.25 without, range 1)
    # (T = 1: the token is in the prefix and the suffix run; "max" applies the factor once, "product" squares it)
    adv = rl.group_advantages(torch.tensor([1.0, 0.5, 0.0, 0.0], dtype=torch.float64), 4, "dr_grpo")
    ids, mask = torch.tensor([[4], [5], [4], [6]]), torch.ones(4, 1)
    w, _ = rl.conflict_weights(ids, mask, adv, 4, "causal", combine="max")
    torch.testing.assert_close(w, torch.tensor([[0.25], [1], [0], [1]], dtype=torch.float64))
    w, _ = rl.conflict_weights(ids, mask, adv, 4, "causal")
    torch.testing.assert_close(w, torch.tensor([[0.0625], [1], [0], [1]], dtype=torch.float64))
    # a token every signed completion holds has no counterfactual: 0 on both sides (like skip)
    w, n = run([[1, 2], [1, 3]], [1.0, -1.0], 2, strategy="causal")
    assert w == [[0, 1], [0, 1]] and n == [1, 1]
    # A = 0 completions are neither holders nor non-holders, and keep 1: rewards [1, 0.5, 0] (dr_grpo A = [0.5, 0,
    # -0.5]); token 4 is in every signed completion -> 0, although the A = 0 row 1 lacks it
    w, _ = run([[4, 1], [2, 2], [4, 3]], [0.5, 0.0, -0.5], 3, strategy="causal")
    assert w == [[0, 1], [1, 1], [0, 1]]
    # a token that goes with failure: kept on the negative side only
    w, _ = run([[1], [2], [1], [1]], [1.0, 1.0, -1.0, -1.0], 4, strategy="causal", detect="anywhere")
    # token 1: holders A = {1, -1, -1} mean -1/3, without {1}: delta = (-1/3 - 1) / 2 = -2/3
    torch.testing.assert_close(torch.tensor(w), torch.tensor([[0.0], [1.0], [2 / 3], [2 / 3]]))


def test_config_selects_detection_and_causal():
    cfg = rl.preset_with("grpo_tc", "conflict_detect=anywhere,conflict_strategy=causal")
    assert (cfg.conflict_detect, cfg.conflict_strategy) == ("anywhere", "causal")
    ids = torch.tensor([[7, 1, 9], [7, 3, 4], [7, 5, 6], [8, 9, 5], [9, 6, 8]])
    rewards = torch.tensor([1.0, 1, 0, 0, 0], dtype=torch.float64)
    groups = rl.prepare_groups(cfg, rewards, ids, torch.ones(5, 3, dtype=torch.bool), 5)
    want, _ = rl.conflict_weights(ids, torch.ones(5, 3), groups.advantages, 5, "causal", detect="anywhere")
    assert torch.equal(groups.token_weights, want) and groups.conflict_counts.tolist() == [2, 1, 1, 1, 1]
    assert rl.preset("grpo_tc").conflict_detect == "positional"  # every existing preset keeps GTPO's rule
    with pytest.raises(ValueError, match="LossConfig.conflict_detect 'middle'"):
        rl.LossConfig(conflict_detect="middle")


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


@settings(max_examples=100, deadline=None)
@given(
    groups(),
    st.sampled_from(rl.CONFLICT_STRATEGIES),
    st.sampled_from(rl.COMBINE_MODES),
    st.sampled_from(rl.CONFLICT_DETECTS),
)
def test_matches_loop_reference(case, strategy, combine, detect):
    g, ids, mask, adv = case
    w, n = rl.conflict_weights(
        torch.tensor(ids), torch.tensor(mask), torch.tensor(adv), g, strategy, combine=combine, detect=detect
    )
    want_w, want_n = ref_conflicts(ids, mask, adv, g, strategy, combine=combine, detect=detect)
    torch.testing.assert_close(w, torch.tensor(want_w, dtype=torch.float32))
    assert n.tolist() == want_n
    # invariants: A = 0 rows untouched; gtpo never changes a token outside the runs
    for i, a in enumerate(adv):
        if a == 0:
            assert (w[i] == 1).all()
    # float masks behave like bool masks
    w2, n2 = rl.conflict_weights(
        torch.tensor(ids), torch.tensor(mask, dtype=torch.float32), torch.tensor(adv), g, strategy, combine=combine,
        detect=detect,
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
        ({"strategy": "counterfactual"}, ValueError, ["strategy", "counterfactual", "causal"]),
        ({"detect": "middle"}, ValueError, ["detect", "middle", "positional", "anywhere"]),
        ({"detect": None}, TypeError, ["detect"]),
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
