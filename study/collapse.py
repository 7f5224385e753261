"""Transient and persistent collapse of a run, from its metrics.jsonl and summary.json (the v2 study's collapse
endpoint, docs/study-v2-preregistration.md). The three collapse rules are study/stability.py's (low entropy, entropy
blow-up, signal death, each over a window of consecutive steps); what is new is when a rule counts:

- an *event* is a step at which a rule holds (its window ends there);
- a run **collapsed persistently** when an event falls in its last `LAST` steps (the degenerate state was still there
  at the end), or when its held-out accuracy after training is at most the one before (whatever the events: training
  left it no better than it started);
- a run **collapsed transiently** when it had events, none in its last `LAST` steps, and it ended better than it
  started (the reward came back).

The published studies counted a run as collapsed at its first event (`run_metrics`' "collapse"); in 4 of their 9
flagged non-GTPO runs signal death held for one window and the reward came back (the audit of 2026-11-28). The
persistent count is the v2 study's primary collapse endpoint; the transient one is reported beside it."""

from __future__ import annotations

import math

from .stability import RULES, CollapseRules

LAST = 10  # an event in the last LAST steps of a run makes its collapse persistent


def event_steps(steps: list[dict], rules: CollapseRules) -> dict[str, list[int]]:
    """{rule name: the step numbers at which the rule holds}, for each rule of study/stability.py's RULES. `steps`:
    the run's step records, in step order."""
    return {name: [steps[i]["step"] for i in range(len(steps)) if rule(steps[: i + 1], rules)]
            for name, rule in RULES.items()}  # fmt: skip


def classify(records: list[dict], summary: dict, rules: CollapseRules, last: int = LAST) -> dict:
    """A run's collapse as {"persistent": bool, "transient": bool, "events": {rule: [steps]}, "late_events": bool
    (an event in the last `last` steps), "no_gain": bool (held-out after <= before; False when either is missing)}.
    `records`: metrics.jsonl's records (eval events are skipped); `summary`: summary.json."""
    steps = sorted((r for r in records if "event" not in r), key=lambda r: r["step"])
    if not steps:
        raise ValueError("no step records: the run trained no step")
    events = event_steps(steps, rules)
    final = steps[-1]["step"]
    late = any(s > final - last for ss in events.values() for s in ss)
    before = summary.get("before", {}).get("eval_acc")
    after = summary.get("after", {}).get("eval_acc")
    no_gain = _finite(before) and _finite(after) and after <= before
    persistent = late or no_gain
    any_event = any(events.values())
    return {"persistent": persistent, "transient": any_event and not persistent, "events": events,
            "late_events": late, "no_gain": bool(no_gain)}  # fmt: skip


def _finite(x) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)
