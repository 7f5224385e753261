"""`--report-to tensorboard|trackio`: every metrics.jsonl record also goes to a dashboard, under the names TRL's
GRPOTrainer logs (through transformers' callbacks: `train/reward`, `train/frac_reward_zero_std`, ...), so a run of
this trainer and a TRL run of the same job overlay in one TensorBoard. metrics.jsonl keeps our names; `TRL_NAMES` is
the one-to-one map (docs/trainer.md, "Dashboards"). A number TRL has no name for goes under `train/sgrpo/<our name>`,
an eval event's under `eval/<our name without eval_>`.

TensorBoard: event files in OUTPUT_DIR/tensorboard/ (`tensorboard --logdir OUTPUT_DIR`; `pip install
.[tensorboard]`). trackio: project `sgrpo`, the run named after OUTPUT_DIR and the run's id (`trackio_name`: two runs
in folders with the same last name, such as every study arm's `seed0`, are two runs; a --resume continues its own;
`pip install .[trackio]`). A dashboard package that is missing or fails to import refuses the run before it starts."""

from __future__ import annotations

import hashlib
import math
import os
from pathlib import Path

from ..errors import Refused
from ..run.files import check_not_link, read_manifest

# our metrics.jsonl key -> TRL's name (without the train/ prefix transformers adds). Where the definitions differ:
# reward_std is the batch's std (TRL: the mean of the groups' stds); clip_frac counts low and high clips (TRL's
# clip_ratio/region_mean too); accuracy is the correctness reward's mean (TRL: rewards/<function name>/mean).
TRL_NAMES = {
    "reward_mean": "reward",
    "reward_std": "reward_std",
    "zero_var_frac": "frac_reward_zero_std",
    "completion_len": "completions/mean_length",
    "entropy_mean": "entropy",
    "clip_frac": "clip_ratio/region_mean",
    "loss": "loss",
    "kl_ref": "kl",
    "lr": "learning_rate",
    "grad_norm": "grad_norm",
    "accuracy": "rewards/correctness/mean",
}
EVAL_NAMES = {"eval_acc": "accuracy", "eval_acc_se": "accuracy_se"}  # eval events (TRL has no held-out accuracy)
KINDS = ("none", "tensorboard", "trackio")


def dashboard_tags(record: dict) -> dict[str, float]:
    """A metrics.jsonl record -> {dashboard tag: value}: its finite numbers only (a null, a text sample, a list are
    left out)."""
    is_eval = record.get("event") == "eval"
    out = {}
    for key, value in record.items():
        if key in ("step", "event") or isinstance(value, bool) or not isinstance(value, int | float):
            continue
        if not math.isfinite(value):
            continue
        if is_eval:
            tag = "eval/" + EVAL_NAMES.get(key, key.removeprefix("eval_"))
        else:
            tag = "train/" + TRL_NAMES.get(key, "sgrpo/" + key)
        out[tag] = float(value)
    return out


def trackio_name(out_dir: Path) -> str:
    """The trackio run of OUTPUT_DIR: its last name and the run's id from its manifest (a fresh run, --overwrite
    included, gets a new id; a resume keeps it), or, without a manifest, a hash of the folder's full path."""
    folder = Path(out_dir).resolve()
    manifest = read_manifest(folder)
    tag = manifest["run_id"][:8] if manifest else hashlib.sha256(os.fsencode(folder)).hexdigest()[:8]
    return f"{folder.name}-{tag}"


def dashboard_backend(kind: str):
    """The package `--report-to KIND` writes with (TensorBoard's SummaryWriter, or trackio), imported; one that is
    missing or fails to import (a protobuf it does not accept, say) is a refusal naming it. The trainer calls this
    before it starts, so such a run stops before anything is loaded or written."""
    if kind not in KINDS or kind == "none":
        raise ValueError(f"report_to={kind!r}: expected tensorboard or trackio")
    package = kind  # each dashboard is the package of its name
    try:
        if kind == "tensorboard":
            from torch.utils.tensorboard import SummaryWriter

            return SummaryWriter
        import trackio

        return trackio
    except Exception as exc:  # noqa: BLE001 - ImportError, or whatever the package raises while importing
        raise Refused(
            f"--report-to {kind}: {package} cannot be imported ({type(exc).__name__}: {str(exc).splitlines()[0]}); "
            f"pip install {package} (or repair its install), or leave --report-to out (metrics.jsonl has every "
            "record)"
        ) from None


class Dashboard:
    """One run's dashboard; `log(record)` for each record metrics.jsonl gets. `purge_step`: on a resume, the first
    step whose records will be written again (TensorBoard drops what an interrupted run logged from there on)."""

    def __init__(self, kind: str, out_dir: Path, config: dict | None = None, purge_step: int | None = None,
                 logged_through: int | None = None):  # fmt: skip
        backend = dashboard_backend(kind)
        self.kind = kind
        # trackio has no purge: on a resume, the steps the stopped run had already logged are not sent again (a
        # resume recomputes them exactly); TensorBoard drops them itself (purge_step)
        self.skip_through = logged_through if kind == "trackio" and logged_through is not None else -1
        if kind == "tensorboard":
            log_dir = Path(out_dir) / "tensorboard"
            check_not_link(log_dir)  # (open_output_dir refuses one too; this is for the race)
            self.writer = backend(log_dir=str(log_dir), purge_step=purge_step)
        else:
            self.trackio = backend
            backend.init(project="sgrpo", name=trackio_name(out_dir), config=config or {}, resume="allow")

    def log(self, record: dict) -> None:
        tags, step = dashboard_tags(record), int(record.get("step", 0))
        if self.kind == "tensorboard":
            for tag, value in tags.items():
                self.writer.add_scalar(tag, value, step)
            self.writer.flush()
        elif step > self.skip_through:
            self.trackio.log(tags, step=step)

    def close(self) -> None:
        if self.kind == "tensorboard":
            self.writer.close()
        else:
            self.trackio.finish()
