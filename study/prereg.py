"""The v2 study's pre-registered plans as data: for each study (its results folder's name), the arms with their
planned seeds, the contrasts (linear combinations of arms' held-out accuracy after training, paired by seed), the
Fisher tests of persistent collapse, the hypotheses and the rules that decide them. docs/study-v2-preregistration.md
states the same in words; study/decide.py evaluates a plan on a study's run files, and the report prints, for
each hypothesis, which rule fired. Frozen at the pre-registration's tag: a change after it goes into a dated addendum
(a new plan name), never into these tables.

A rule fires when all its conditions hold; a hypothesis's rules are tried in order and the first that fires is its
decision; when none does, the decision is "inconclusive". Conditions (each decided from the run files alone):
- ("equivalent", C): the 90% t-interval of contrast C lies inside +- MARGIN (two one-sided tests at 0.05);
- ("higher", C) / ("lower", C): C's mean is above / below 0 and its Holm-adjusted p (over the plan's family) < ALPHA;
- ("mean_at_least", C, x): C's mean over its seeds is >= x (a screen, no test);
- ("persistent_at_most", arm, k) / ("persistent_at_least", arm, k): the arm's runs with a persistent collapse
  (study/collapse.py) number at most / at least k (a 4th item: over those seeds, not the arm's planned ones);
- ("clip_active", arm, None, seeds): every run of the arm (of `seeds`) clipped at least one token's ratio
  (clip_frac > 0 at some step);
- ("term_active", arm, None, seeds): in every run of the arm (of `seeds`) a field preset's policy term masked,
  clipped or penalized at least one token (policy_term_frac > 0 at some step)."""

from __future__ import annotations

from dataclasses import dataclass, field

ALPHA = 0.05  # two-sided, for every test of a plan's Holm family
MARGIN = 0.10  # equivalence margin on held-out accuracy after training (90% CI inside +- MARGIN)
TEN = tuple(range(10))
FIVE = tuple(range(5))


@dataclass(frozen=True)
class Contrast:
    key: str
    weights: tuple[tuple[str, float], ...]  # (arm, weight): per seed, sum of weight x held-out accuracy after
    seeds: tuple[int, ...]  # the planned seeds (those every arm of the contrast runs)
    what: str
    family: bool = True  # tested in the plan's Holm family (False: a screen's estimate, no test)
    requires: tuple[str, str] | None = None  # (hypothesis, rule): in the family only when that rule fired


@dataclass(frozen=True)
class Fisher:
    key: str
    arm: str
    baseline: str
    what: str
    requires: tuple[str, str] | None = None


@dataclass(frozen=True)
class Rule:
    decision: str  # what the hypothesis's answer is when this rule fires
    when: tuple[tuple, ...]  # conditions, all of which must hold


@dataclass(frozen=True)
class Hypothesis:
    key: str
    statement: str
    rules: tuple[Rule, ...]
    requires: tuple[str, str] | None = None  # (hypothesis, rule): decided only when that rule fired, else "not run"


@dataclass(frozen=True)
class Plan:
    name: str
    arms: dict[str, tuple[int, ...]]  # arm -> planned seeds
    contrasts: tuple[Contrast, ...]
    fishers: tuple[Fisher, ...]
    hypotheses: tuple[Hypothesis, ...]
    adopted: dict[str, str]  # arm -> the published folder/arm its runs are copied from (study.adopt)
    # arm -> ((hypothesis, rule), seeds): the arm's planned seeds become `seeds` when that rule fired (a screen's
    # confirmation); until then, and when it did not fire, they are the ones in `arms`
    extend: dict[str, tuple[tuple[str, str], tuple[int, ...]]] = field(default_factory=dict)

    def planned(self, arm: str, fired: dict[str, str | None]) -> tuple[int, ...]:
        """The arm's planned seeds, given each hypothesis's fired rule (`fired`: {hypothesis: decision or None})."""
        if arm in self.extend:
            (h, rule), seeds = self.extend[arm]
            if fired.get(h) == rule:
                return seeds
        return self.arms[arm]


def _pair(key: str, arm: str, base: str, seeds: tuple[int, ...], what: str, **kw) -> Contrast:
    return Contrast(key, ((arm, 1.0), (base, -1.0)), seeds, what, **kw)


TR15, TR25 = "grpo_nokl_tr_lr1.5e-4", "grpo_nokl_tr_lr2.5e-4"
N75, N10, N15, N25 = "grpo_nokl_lr7.5e-5", "grpo_nokl_lr1e-4", "grpo_nokl_lr1.5e-4", "grpo_nokl_lr2.5e-4"
G10, G15, WU20 = "grpo_lr1e-4", "grpo_lr1.5e-4", "grpo_nokl_wu20_lr1.5e-4"


def _three_way(key: str, c: str, what: str, better: str, equal: str, worse: str) -> Hypothesis:
    return Hypothesis(key, what, (Rule(equal, (("equivalent", c),)), Rule(better, (("higher", c),)),
                                  Rule(worse, (("lower", c),))))  # fmt: skip


PHASE1 = Plan(
    name="v2-phase1",
    arms={TR15: TEN, N15: TEN, G15: TEN, N75: TEN, TR25: TEN, N25: FIVE, N10: TEN, G10: TEN, WU20: TEN},
    contrasts=(
        _pair("C1", TR15, N75, TEN, "the cap at 1.5e-4 vs the lr with the cap's path length, no cap"),
        _pair("C2", TR25, TR15, TEN, "the cap at 2.5e-4 vs the cap at 1.5e-4"),
        Contrast(
            "C3",
            ((TR25, 1.0), (N25, -1.0), (TR15, -1.0), (N15, 1.0)),
            FIVE,
            "interaction: the cap's gain at 2.5e-4 minus its gain at 1.5e-4",
        ),
        _pair("C4", TR15, N10, TEN, "the cap at 1.5e-4 vs no cap at 1e-4"),
        _pair("C5", TR15, N15, TEN, "the cap at 1.5e-4 vs no cap at 1.5e-4 (the published pair, re-tested)"),
        _pair("C6", TR15, N25, FIVE, "the cap at 1.5e-4 vs no cap at 2.5e-4"),
        _pair("C7", TR15, WU20, TEN, "the cap vs a 20-step warm-up, both at 1.5e-4"),
        _pair("C8", G10, N10, TEN, "the KL reference at 1e-4"),
    ),
    fishers=(
        Fisher("F1", TR25, N25, "persistent collapse: the cap vs none at 2.5e-4"),
        Fisher("F2", TR15, N15, "persistent collapse: the cap vs none at 1.5e-4"),
        Fisher("F3", G10, N10, "persistent collapse: the reference vs none at 1e-4"),
    ),
    hypotheses=(
        Hypothesis(
            "H1",
            "The cap is a smaller step: at 1.5e-4 it matches plain reference-free GRPO at the lr that "
            "moves the weights as far (7.5e-5).",
            (
                Rule("the cap = a smaller step", (("equivalent", "C1"), ("persistent_at_most", N75, 1))),
                Rule("the cap beats the lr-matched control", (("higher", "C1"),)),
                Rule("the lr-matched control beats the cap", (("lower", "C1"),)),
            ),
        ),
        Hypothesis(
            "H2",
            "The cap widens the usable learning rate: at 2.5e-4 it stays within 0.10 of itself at "
            "1.5e-4 with no persistent collapse, while plain reference-free GRPO fails there.",
            (
                Rule(
                    "the cap widens the usable lr",
                    (("equivalent", "C2"), ("persistent_at_most", TR25, 0), ("higher", "C3")),
                ),
                Rule("the cap does not hold at 2.5e-4", (("lower", "C2"),)),
                Rule("the cap does not hold at 2.5e-4", (("persistent_at_least", TR25, 2),)),
            ),
        ),
        Hypothesis(
            "H3",
            "The cap is more than a step size: at 1.5e-4 it beats plain reference-free GRPO at every "
            "lr tried (7.5e-5, 1e-4, 1.5e-4, 2.5e-4).",
            (
                Rule(
                    "the cap beats every lr of the baseline",
                    (("higher", "C1"), ("higher", "C4"), ("higher", "C5"), ("higher", "C6")),
                ),
                Rule("some lr of the baseline matches the cap", (("equivalent", "C1"),)),
                Rule("some lr of the baseline matches the cap", (("equivalent", "C4"),)),
                Rule("some lr of the baseline matches the cap", (("equivalent", "C5"),)),
            ),
        ),
        _three_way(
            "H4",
            "C7",
            "The cap is a longer warm-up: at 1.5e-4 a 20-step warm-up matches it.",
            "the cap beats a 20-step warm-up",
            "the cap = a longer warm-up",
            "a 20-step warm-up beats the cap",
        ),
        _three_way(
            "H5",
            "C8",
            "The KL reference matters at a learning rate away from the edge of stability (1e-4).",
            "the reference helps at 1e-4",
            "the reference makes no difference beyond +-0.10 at 1e-4",
            "the reference hurts at 1e-4",
        ),
    ),
    adopted={G15: "decisive/grpo", N15: "decisive/grpo_nokl", TR15: "decisive/grpo_nokl_tr"},
)

# Phase 2: a screen of what the field runs, at 2.5e-4 (where plain reference-free GRPO is expected to fail), against
# the cap at the same lr (phase 1's runs, adopted). Each method: 5 seeds; passes the screen when its mean difference
# from the cap is >= -MARGIN and at most 1 of its 5 runs collapses persistently; a method that passes gets seeds 5-9
# and its 10-seed contrast with the cap enters the Holm family.
CAP = TR25
SCREENED = ("grpo_nokl_ppo2_lr2.5e-4", "dppo_tv_lr2.5e-4", "cispo_lr2.5e-4", "clip_cov_lr2.5e-4", "kl_cov_lr2.5e-4")


def _screen(i: int, arm: str, active: tuple = ()) -> tuple[Contrast, Contrast, Fisher, Hypothesis, Hypothesis]:
    s, c = f"S{i}", f"K{i}"
    passed = ("screen", f"{arm} passes the screen")
    return (
        _pair(s, arm, CAP, FIVE, f"screen: {arm} vs the cap, seeds 0-4", family=False),
        _pair(c, arm, CAP, TEN, f"confirmation: {arm} vs the cap, seeds 0-9", requires=(s, passed[1])),
        Fisher(f"F{i}", arm, CAP, f"persistent collapse: {arm} vs the cap, seeds 0-9", requires=(s, passed[1])),
        Hypothesis(
            s,
            f"Screen: {arm} is not clearly worse than the cap at 2.5e-4.",
            (Rule(passed[1], (("mean_at_least", s, -0.10), ("persistent_at_most", arm, 1, FIVE), *active)),),
        ),  # fmt: skip
        Hypothesis(
            c,
            f"Confirmation: {arm} against the cap at 2.5e-4, 10 seeds.",
            (
                Rule(f"{arm} = the cap", (("equivalent", c),)),
                Rule(f"{arm} beats the cap", (("higher", c),)),
                Rule(f"the cap beats {arm}", (("lower", c),)),
            ),
            requires=(s, passed[1]),
        ),  # fmt: skip
    )


_P2 = [_screen(i + 1, arm, (("clip_active", arm, None, FIVE),) if "ppo2" in arm else ())
       for i, arm in enumerate(SCREENED)]  # fmt: skip
PHASE2 = Plan(
    name="v2-phase2",
    arms={CAP: TEN, **{arm: FIVE for arm in SCREENED}},
    extend={arm: ((f"S{i + 1}", f"{arm} passes the screen"), TEN) for i, arm in enumerate(SCREENED)},  # seeds 5-9
    contrasts=tuple(x for group in _P2 for x in group[:2]),
    fishers=tuple(group[2] for group in _P2),
    hypotheses=tuple(x for group in _P2 for x in group[3:]),
    adopted={CAP: f"v2-phase1/{TR25}"},
)

# Phase 2b (addendum 2026-11-30 (e), written after phase 2's screen was read): phase 2's screen and confirmation rules,
# unchanged, for the four field stabilizers with their terms engaged by a second pass over each rollout batch (at one
# pass DPPO-TV, CISPO and KL-Cov compute plain GRPO's gradient); a method passes only if its term acted in all 5 runs.
# Its own Holm family (at most 8 tests); the cap's runs adopted from phase 1, as in phase 2.
SCREENED_2B = tuple(f"{m}_ppo2_lr2.5e-4" for m in ("dppo_tv", "cispo", "clip_cov", "kl_cov"))
_P2B = [_screen(i + 1, arm, (("term_active", arm, None, FIVE),)) for i, arm in enumerate(SCREENED_2B)]
PHASE2B = Plan(
    name="v2-phase2b",
    arms={CAP: TEN, **{arm: FIVE for arm in SCREENED_2B}},
    extend={arm: ((f"S{i + 1}", f"{arm} passes the screen"), TEN) for i, arm in enumerate(SCREENED_2B)},
    contrasts=tuple(x for group in _P2B for x in group[:2]),
    fishers=tuple(group[2] for group in _P2B),
    hypotheses=tuple(x for group in _P2B for x in group[3:]),
    adopted={CAP: f"v2-phase1/{TR25}"},
)

PLANS: dict[str, Plan] = {p.name: p for p in (PHASE1, PHASE2, PHASE2B)}
