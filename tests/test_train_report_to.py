"""--report-to tensorboard (train/run/dashboards.py): the event files, read back with TensorBoard's own reader, hold
every metrics.jsonl number under TRL's GRPOTrainer names (train/reward, train/frac_reward_zero_std, ...); the name map
covers what a step record has; a resume does not log the replayed steps twice."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("tensorboard")

from conftest import tiny_cfg  # noqa: E402
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

import train.loop as loop  # noqa: E402
from train.config.cli import parse_args  # noqa: E402
from train.run.dashboards import EVAL_NAMES, TRL_NAMES, dashboard_tags  # noqa: E402
from train.run.metrics import MetricsLog  # noqa: E402

LOSS = {"entropy_filter": None, "entropy_coef": 0.01}
# What TRL's GRPOTrainer logs (trl 1.16, GRPOTrainer._metrics; transformers' callbacks add the train/ prefix)
TRL_LOGGED = {"reward", "reward_std", "frac_reward_zero_std", "completions/mean_length", "entropy", "kl", "loss",
              "clip_ratio/region_mean", "learning_rate", "grad_norm"}  # fmt: skip


def records(out) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def scalars(out) -> dict[str, dict[int, float]]:
    acc = EventAccumulator(str(out / "tensorboard"))
    acc.Reload()
    return {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}


def test_tensorboard_events_hold_the_metrics_under_trl_names(tmp_path):
    out = tmp_path / "run"
    loop.train(tiny_cfg(out, max_steps=3, report_to="tensorboard"), LOSS)
    tb = scalars(out)
    steps = [r for r in records(out) if r.get("event") != "eval"]
    evals = [r for r in records(out) if r.get("event") == "eval"]
    assert len(steps) == 3 and len(evals) == 2
    for ours, trl in TRL_NAMES.items():
        tag = f"train/{trl}"
        assert tb[tag] == {r["step"]: pytest.approx(r[ours], rel=1e-6) for r in steps if r[ours] is not None}, tag
    assert {f"train/{n}" for n in TRL_LOGGED} <= set(tb)
    assert "reward_mean" not in str(sorted(tb))  # our names stay in metrics.jsonl
    assert tb["train/sgrpo/masked_frac"][1] == pytest.approx(steps[0]["masked_frac"])  # ours, namespaced
    assert tb["eval/accuracy"] == {e["step"]: pytest.approx(e["eval_acc"]) for e in evals}
    assert tb["eval/pass@2"] == {e["step"]: pytest.approx(e["eval_pass@2"]) for e in evals}


def test_no_dashboard_by_default(tmp_path):
    out = tmp_path / "run"
    loop.train(tiny_cfg(out, max_steps=1, eval_k=0, kl_every=0), LOSS)
    assert not (out / "tensorboard").exists()


def test_trl_names_cover_a_step_record_one_to_one(tmp_path):
    out = tmp_path / "run"
    loop.train(tiny_cfg(out, max_steps=1, eval_k=0, kl_every=0, save_model=False), LOSS)
    step = next(r for r in records(out) if r.get("event") != "eval")
    assert set(TRL_NAMES) <= set(step)  # a renamed metric fails here, not silently in a dashboard
    assert len(set(TRL_NAMES.values())) == len(TRL_NAMES)
    tags = dashboard_tags(step)
    numeric = [k for k, v in step.items() if k != "step" and isinstance(v, int | float) and not isinstance(v, bool)]
    assert len(tags) == len([k for k in numeric if step[k] == step[k]])  # every finite number, each under one tag
    ev = dashboard_tags({"step": 3, "event": "eval", "eval_acc": 0.5, "eval_acc_se": 0.1, "eval_pass@4": 0.75})
    assert ev == {"eval/accuracy": 0.5, "eval/accuracy_se": 0.1, "eval/pass@4": 0.75}
    assert set(EVAL_NAMES) == {"eval_acc", "eval_acc_se"}


def test_resume_does_not_log_replayed_steps_twice(tmp_path):
    """A run killed after its last checkpoint (the checkpoint had written 2 records, the log has 3): the resume writes
    step 3 again, and TensorBoard shows it once, with the resumed run's value."""
    path = tmp_path / "metrics.jsonl"
    with MetricsLog(path, None, "tensorboard") as log:
        for step in (1, 2, 3):
            log.write({"step": step, "reward_mean": float(step)})
    with MetricsLog(path, 2, "tensorboard") as log:  # --resume from the checkpoint of step 2
        log.write({"step": 3, "reward_mean": 30.0})
        log.write({"step": 4, "reward_mean": 40.0})
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("train/reward")] == [(1, 1.0), (2, 2.0), (3, 30.0), (4, 40.0)]


def test_report_to_flag_refuses_unknown_dashboards(capsys):
    assert parse_args(["--report-to", "tensorboard"])[0].report_to == "tensorboard"
    with pytest.raises(SystemExit):
        parse_args(["--report-to", "wandb"])
    err = capsys.readouterr().err
    assert "--report-to" in err and "'wandb'" in err and "tensorboard" in err


def test_trackio_gets_the_same_names(tmp_path, monkeypatch):
    """trackio's API (init / log / finish), with a stand-in module: trackio itself is an optional extra."""
    import types

    calls = []
    fake = types.SimpleNamespace(
        init=lambda **kw: calls.append(("init", kw)),
        log=lambda metrics, step=None: calls.append(("log", metrics, step)),
        finish=lambda: calls.append(("finish",)),
    )
    monkeypatch.setitem(sys.modules, "trackio", fake)
    path = tmp_path / "run" / "metrics.jsonl"
    path.parent.mkdir()
    with MetricsLog(path, None, "trackio", {"lr": 0.1}) as log:
        log.write({"step": 1, "reward_mean": 0.5, "zero_var_frac": 0.25, "sample": "text", "kl_from_init": None})
    name = calls[0][1].pop("name")  # the folder's name and a tag of the run (issue 39: no two runs share a name)
    assert name.startswith("run-") and len(name) == len("run-") + 8, name
    assert calls[0] == ("init", {"project": "sgrpo", "config": {"lr": 0.1}, "resume": "allow"})
    assert calls[1] == ("log", {"train/reward": 0.5, "train/frac_reward_zero_std": 0.25}, 1)
    assert calls[2] == ("finish",)


def test_a_resume_does_not_send_trackio_the_steps_it_already_has(tmp_path, monkeypatch):
    """A run killed after step 13, resumed from its checkpoint of step 10: steps 11-13 appeared twice in trackio
    (TensorBoard drops them with purge_step; trackio has no purge). The resume recomputes them exactly, so they are
    not sent again; the steps after are."""
    import types

    logged = []
    fake = types.SimpleNamespace(init=lambda **kw: None, log=lambda metrics, step=None: logged.append(step),
                                 finish=lambda: None)  # fmt: skip
    monkeypatch.setitem(sys.modules, "trackio", fake)
    path = tmp_path / "run" / "metrics.jsonl"
    path.parent.mkdir()
    with MetricsLog(path, None, "trackio") as log:
        for step in range(1, 14):
            log.write({"step": step, "reward_mean": 0.1 * step})
    assert logged == list(range(1, 14))
    logged.clear()
    with MetricsLog(path, 10, "trackio") as log:  # the checkpoint had written 10 records
        for step in range(11, 16):
            log.write({"step": step, "reward_mean": 0.1 * step})
    assert logged == [14, 15]
    assert [json.loads(x)["step"] for x in path.read_text().splitlines()] == list(range(1, 16))


def test_report_to_without_its_package_is_refused_at_parse_time(capsys, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "trackio" else real(name, *a))
    with pytest.raises(SystemExit):
        parse_args(["--report-to", "trackio"])
    err = capsys.readouterr().err
    assert "--report-to: 'trackio' needs the trackio package: pip install trackio" in err


def test_trackio_for_real_stores_trls_names(tmp_path):
    """The real trackio package (the [trackio] extra; in the test extra so CI runs this): a run's records land in
    trackio's own local store under TRL's names, read back with trackio's storage API. In a subprocess: trackio fixes
    its data directory (TRACKIO_DIR) when imported."""
    pytest.importorskip("trackio")
    import os
    import subprocess
    import textwrap

    script = textwrap.dedent(
        """
        import json, sys
        from pathlib import Path
        from train.run.metrics import MetricsLog

        run = Path(sys.argv[1]) / "myrun"
        run.mkdir()
        with MetricsLog(run / "metrics.jsonl", None, "trackio", {"lr": 0.1}) as log:
            log.write({"step": 1, "reward_mean": 0.5, "zero_var_frac": 0.25, "sample": "text"})
            log.write({"step": 2, "reward_mean": 0.75, "zero_var_frac": 0.0})
        from trackio.sqlite_storage import SQLiteStorage
        from train.run.dashboards import trackio_name
        logs = SQLiteStorage.get_logs(project="sgrpo", run=trackio_name(run))  # myrun-<a hash of its path>
        print(json.dumps([{k: v for k, v in r.items() if k.startswith("train/") or k == "step"} for r in logs]))
        """
    )
    env = {**os.environ, "TRACKIO_DIR": str(tmp_path / "trackio")}
    out = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)],
        env=env,
        cwd=Path(__file__).resolve().parents[1],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    logs = json.loads(out.stdout.strip().splitlines()[-1])
    assert [r["step"] for r in logs] == [1, 2]
    assert [r["train/reward"] for r in logs] == [0.5, 0.75]
    assert [r["train/frac_reward_zero_std"] for r in logs] == [0.25, 0.0]


@pytest.mark.parametrize("kind", ["tensorboard", "trackio"])
def test_a_dashboard_that_fails_to_import_refuses_the_run_before_it_starts(tmp_path, monkeypatch, kind):
    # was a traceback after the model had loaded and config.json was written (a TypeError from a protobuf the
    # package does not accept is the common case); now a refusal naming the package and what it raised
    from train.errors import Refused

    fake = tmp_path / "site"
    name = "tensorboard" if kind == "tensorboard" else "trackio"
    (fake / name).mkdir(parents=True)
    (fake / name / "__init__.py").write_text("raise TypeError('Descriptors cannot be created directly.\\nmore')\n")
    monkeypatch.syspath_prepend(str(fake))
    for mod in [m for m in sys.modules if m.split(".")[0] == name or m.startswith("torch.utils.tensorboard")]:
        monkeypatch.delitem(sys.modules, mod)
    out = tmp_path / "run"
    with pytest.raises(Refused, match=rf"--report-to {kind}: {name} cannot be imported \(TypeError: Descriptors "
                                      r"cannot be created directly.\); pip install"):  # fmt: skip
        loop.train(tiny_cfg(out, max_steps=1, report_to=kind), LOSS)
    assert not out.exists()
