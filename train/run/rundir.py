"""What a run may do with its output directory before it starts: `open_output_dir` refuses to mix two runs (a fresh
run over an existing one needs --overwrite; --resume needs a checkpoint and the checkpoint's configuration), and
`config_differences` names the settings a resume would change.

The folder is the trainer's only where it holds a run of it: OUTPUT_DIR/run-manifest.json (`MANIFEST`, written before
any other file of a run) says which names there are the trainer's (`RUN_FILES`, `RUN_DIRS`) and carries the run's id.
A file of one of those names in a folder without a manifest or a run is someone else's: the run is refused, with or
without --overwrite, and nothing is touched. A symbolic link in place of any of them is refused too.

`open_output_dir` only checks; `OutputDir.claim`, which setup calls once every check that can refuse the run has
passed, deletes the run --overwrite replaces and writes the manifest, with the identity of the run's data (the data
file's and the held-out problems' sha256) that a --resume checks."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import secrets
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path

from sgrpo_kernels.rl import LossConfig

from ..config import RESUME_SAFE, TrainConfig
from ..errors import Refused
from ..run.checkpoint import STATE_FILE, CheckpointError, read_checkpoint
from ..run.files import MANIFEST, OWNER, output_path, read_manifest, read_text
from ..run.metrics import dumps, write_json

# What a run writes into OUTPUT_DIR (and --overwrite deletes); anything else there is left alone.
RUN_FILES = (
    "metrics.jsonl",
    "metrics.jsonl.tmp",
    "summary.json",
    "summary.json.tmp",
    "config.json",
    "config.json.tmp",
    "probe.pt",
    "probe.pt.tmp",
    "heldout.jsonl",
    "heldout.jsonl.tmp",
    f"checkpoint/{STATE_FILE}",
    f"checkpoint/{STATE_FILE}.tmp",
)

RUN_DIRS = ("model", "model.tmp", "tensorboard")  # the trained policy (train/export.py), --report-to tensorboard


def write_manifest(out_dir: Path, run_id: str | None = None, data: dict | None = None) -> dict:
    """A new manifest: every name the run may write, the run's id (`run_id`, or a new random one) and, when given,
    the identity of its data (`data`: the data file's and the held-out problems' sha256, which --resume checks)."""
    m = {"owner": OWNER, "run_id": run_id or secrets.token_hex(8), "files": sorted({*RUN_FILES, *RUN_DIRS, MANIFEST})}
    if data is not None:
        m["data"] = data
    write_json(Path(out_dir) / MANIFEST, m, indent=2)
    return m


def _present(out_dir: Path) -> list[str]:
    """The trainer's names that exist in OUTPUT_DIR (links included), a folder as NAME/."""
    return [n + ("/" if os.path.isdir(out_dir / n) else "") for n in (*RUN_FILES, *RUN_DIRS, "checkpoint")
            if os.path.lexists(out_dir / n)]  # fmt: skip


def _refuse_links(out_dir: Path) -> None:
    links = [n for n in (*RUN_FILES, *RUN_DIRS, MANIFEST, "checkpoint") if os.path.islink(out_dir / n)]
    if links:
        raise Refused(
            f"{out_dir}: {', '.join(links)} {'is a symbolic link' if len(links) == 1 else 'are symbolic links'}; the "
            "trainer never reads or writes through a link in its output folder. Remove the link(s), or use another "
            "--output-dir."
        )


def _refuse_wrong_types(out_dir: Path) -> None:
    """Refused: one of the trainer's names in OUTPUT_DIR is a folder where the trainer keeps a file, or not a folder
    where it keeps one; checked before anything is read, written or deleted (--overwrite would delete half a run and
    stop). A FIFO or device where a file belongs is the readers' to refuse (files.open_existing, safe_load)."""
    if not os.path.isdir(out_dir):
        return  # (no folder yet, or not one: the run's mkdir says so)
    folders = {*RUN_DIRS, "checkpoint"}
    for name in (*RUN_FILES, MANIFEST, *RUN_DIRS, "checkpoint"):
        try:
            is_dir = stat.S_ISDIR(os.lstat(out_dir / name).st_mode)
        except (FileNotFoundError, NotADirectoryError):
            continue
        if is_dir != (name in folders):
            what = "a folder, where the trainer keeps a file" if is_dir else "not a folder, where the trainer keeps one"
            raise Refused(
                f"{out_dir / name} is {what}; nothing was read, written or deleted. Move it away, or use another "
                "--output-dir."
            )


def _refuse_foreign(out_dir: Path) -> None:
    """Refused: OUTPUT_DIR holds no run of this trainer (no manifest, no run) but files of the names it writes."""
    foreign = [n for n in _present(out_dir) if n != "checkpoint/" or any((out_dir / "checkpoint").iterdir())]
    if foreign:
        raise Refused(
            f"{out_dir} holds {', '.join(foreign)}, which no run of this trainer wrote there (it has no {MANIFEST}); "
            "a run would overwrite them, so nothing was started or touched. Move them, or use another --output-dir."
        )


def config_differences(saved: dict, cfg: TrainConfig, loss_cfg: LossConfig) -> list[str]:
    """'field: checkpoint X, now Y' for every TrainConfig field outside RESUME_SAFE and every field of the effective
    LossConfig that differs from the checkpoint's. (The `loss` string itself is compared through the LossConfig it
    makes, together with the --loss.FIELD flags.)"""
    out = []
    for f in dataclasses.fields(TrainConfig):
        if f.name in RESUME_SAFE or f.name == "loss" or f.name not in saved["config"]:
            continue
        before, now = saved["config"][f.name], getattr(cfg, f.name)
        if before != now:
            out.append(f"--{f.name.replace('_', '-')}: checkpoint {before!r}, now {now!r}")
    now_loss = dataclasses.asdict(loss_cfg)
    # a field the checkpoint lacks was added to LossConfig after it was written: that run used its default
    defaults = {f.name: f.default for f in dataclasses.fields(LossConfig) if f.default is not dataclasses.MISSING}
    for key in sorted(set(now_loss) | set(saved["loss_config"])):
        before = saved["loss_config"].get(key, defaults.get(key, "<absent>"))
        now = now_loss.get(key, "<absent>")
        if before != now:
            out.append(f"loss.{key}: checkpoint {before!r}, now {now!r}")
    return out


def edited_config(out_dir: Path, saved: dict) -> list[str]:
    """'FIELD: checkpoint X, config.json Y' for every setting outside RESUME_SAFE where OUTPUT_DIR/config.json (which
    the run wrote from the same configuration as its checkpoint, and --resume reads) disagrees with the checkpoint:
    the file was edited. Empty when it agrees, or cannot be read as a run's config.json."""
    try:
        data = json.loads(read_text(out_dir / "config.json"))
        train, loss = data["train"], data["loss"]
    except (OSError, ValueError, TypeError, KeyError):
        return []
    if not (isinstance(train, dict) and isinstance(loss, dict)):
        return []

    def changed(section: dict, key: str, value) -> bool:  # compared as config.json holds them (tuples as lists)
        return json.loads(dumps(value)) != json.loads(dumps(section.get(key, "<absent>")))

    out = [
        f"--{k.replace('_', '-')}: checkpoint {v!r}, config.json {train.get(k, '<absent>')!r}"
        for k, v in saved["config"].items()
        if k not in RESUME_SAFE and changed(train, k, v)
    ]
    out += [
        f"loss.{k}: checkpoint {v!r}, config.json {loss.get(k, '<absent>')!r}"
        for k, v in saved["loss_config"].items()
        if changed(loss, k, v)
    ]
    return out


def _differs(out_dir: Path, ckpt_file: Path, saved: dict, diffs: list[str]) -> str:
    """The refusal of a --resume whose configuration differs from the checkpoint's (`diffs`)."""
    safe = ", ".join("--" + f.replace("_", "-") for f in sorted(RESUME_SAFE))
    config = out_dir / "config.json"
    edited = edited_config(out_dir, saved)
    if not edited:
        missing = not os.path.lexists(config)  # deleted: the defaults stood for every setting not typed
        return (
            (f"--resume: {config} is missing (a resume without --config reads the run's settings from it), so the "
             "configuration given" if missing else "--resume: the configuration")
            + f" differs from the one {ckpt_file} was trained with:\n  "
            + "\n  ".join(diffs)
            + f"\nOnly these may change on --resume: {safe}.\n"
            + ("Type the checkpoint's value of each as its flag (loss.FIELD as --loss.FIELD), or put the run's "
               "config.json back; or start a new run in another --output-dir." if missing else
               f"Resume with the checkpoint's values (all of them are in {config}), or start a new run in another "
               "--output-dir.")
        )  # fmt: skip
    names = {line.split(":")[0] for line in edited}
    if names & {"--preset", "--loss"}:  # the loss edited: every loss.FIELD that changes with it is the file's doing
        names |= {line.split(":")[0] for line in diffs if line.startswith("loss.")}
    typed = [line for line in diffs if line.split(":")[0] not in names]  # (a flag typed, or another --config file)
    return (
        f"--resume: {config} disagrees with the checkpoint {ckpt_file}: it was edited after the run wrote it (a "
        "resume without --config reads its settings from it):\n  "
        + "\n  ".join(edited)
        + ("\nand the configuration given also differs from the checkpoint:\n  " + "\n  ".join(typed) if typed else "")
        + f"\nOnly these may change on --resume: {safe}.\n"
        f"To continue the run, put the checkpoint's values above back into {config} (or type each as a flag: a "
        f"flag you type overrides the file). To train with the edited settings, start a new run from it: "
        f"--config {config} --output-dir ANOTHER_DIR."
    )


def describe_existing(out_dir: Path) -> str | None:
    """None when OUTPUT_DIR holds no run; else what is there (from summary.json, which is cheap to read)."""
    metrics = out_dir / "metrics.jsonl"
    ckpt = out_dir / "checkpoint" / STATE_FILE
    tmp = out_dir / "checkpoint" / (STATE_FILE + ".tmp")
    summary = out_dir / "summary.json"
    if not (summary.exists() or ckpt.exists() or tmp.exists() or (metrics.exists() and metrics.stat().st_size > 0)):
        return None
    try:
        s = json.loads(read_text(summary))
        if s.get("interrupted"):
            return f"a run interrupted at step {s.get('steps')}"
        return f"a finished run ({s.get('steps')} steps)"
    except (OSError, ValueError, AttributeError):
        return "a run" + (" with a checkpoint" if ckpt.exists() else " without a checkpoint")


def _own_checkpoint(file: Path) -> bool:
    """Whether `file` is a checkpoint this trainer reads (a run written before manifests is told so from other
    files: a metrics.jsonl or summary.json alone may be any tool's)."""
    try:
        read_checkpoint(file)
    except (FileNotFoundError, CheckpointError):
        return False
    return True


def _data_file(cfg: TrainConfig) -> dict:
    """The data file's identity ({"data_path", "data_sha256"}; empty without --data-path or when it cannot be read:
    the task's build says why)."""
    if cfg.data_path is None:
        return {}
    digest = hashlib.sha256()
    try:
        with open(cfg.data_path, "rb") as f:  # (TrainConfig expanded ~)
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
    except OSError:
        return {}
    return {"data_path": cfg.data_path, "data_sha256": digest.hexdigest()}


def heldout_sha256(heldout: list) -> str:
    """The held-out problems' identity: sha256 of their prompts and answers, in order."""
    return hashlib.sha256(dumps([[p.prompt, str(p.answer)] for p in heldout]).encode()).hexdigest()


def _changed_data(recorded, now: dict, key: str) -> bool:
    """Whether the manifest's data record (None or not a dict: a folder written before it) says `key` changed."""
    if not (isinstance(recorded, dict) and isinstance(recorded.get(key), str)):
        return False
    return now.get(key) is not None and recorded[key] != now[key]


@dataclass
class OutputDir:
    """The output folder as `open_output_dir` checked it. Nothing has been written or deleted there yet: `claim`
    does that (setup calls it once every check that can refuse the run has passed), so a refused run, --overwrite
    included, leaves the folder as it was."""

    path: Path
    ckpt: dict | None  # --resume: the checkpoint (read and checked); None: a fresh run
    overwrite: bool
    existing: str | None  # the run that --overwrite deletes, described (None: none)
    manifest: dict | None
    data: dict  # the data file's identity now (`_data_file`)

    def claim(self, heldout: list) -> None:
        """Make the folder this run's: a resume checks that its held-out problems are the checkpoint's (then records
        the data, in a folder whose manifest predates the record); a fresh run deletes the previous run's files
        (--overwrite) and writes a new manifest with the data's identity, before any other file."""
        record = self.data | {"heldout_sha256": heldout_sha256(heldout)}
        if self.ckpt is not None:
            recorded = (self.manifest or {}).get("data")
            if _changed_data(recorded, record, "heldout_sha256"):
                raise Refused(
                    f"--resume: the held-out problems differ from those {self.path / 'checkpoint' / STATE_FILE} was "
                    f"trained and evaluated with ({MANIFEST} records their sha256): the task's data changed since "
                    "the checkpoint. Continuing would compare evaluations of different problems and could train on "
                    "the old held-out ones. Restore the data, or start a new run in another --output-dir."
                )
            (self.path / "checkpoint" / (STATE_FILE + ".tmp")).unlink(missing_ok=True)  # an interrupted save's
            if self.manifest is None:  # a run written before manifests: the checkpoint makes it ours
                write_manifest(self.path, data=record)
            elif not isinstance(recorded, dict):  # a run that started before the data was recorded
                write_json(self.path / MANIFEST, self.manifest | {"data": record}, indent=2)
            return
        if self.existing is not None:
            print(f"--overwrite: deleting {self.existing} in {self.path}")
        if self.overwrite:
            _delete_run(self.path, self.manifest)
        write_manifest(self.path, data=record)  # a fresh run: a new id (its dashboard run is not the deleted one's)


def _delete_run(out_dir: Path, manifest: dict | None) -> None:
    """--overwrite: the trainer's names that the manifest lists (before manifests: all of them, the run having a
    checkpoint of this trainer)."""
    owned = set(manifest["files"]) if manifest is not None else {*RUN_FILES, *RUN_DIRS}
    for name in RUN_FILES:
        if name in owned:
            (out_dir / name).unlink(missing_ok=True)
    for name in RUN_DIRS:
        if name in owned:
            shutil.rmtree(out_dir / name, ignore_errors=True)
    try:
        (out_dir / "checkpoint").rmdir()  # when nothing else is in it
    except OSError:
        pass


def _open_resume(cfg: TrainConfig, loss_cfg: LossConfig, out_dir: Path, manifest: dict | None) -> OutputDir:
    ckpt_file = out_dir / "checkpoint" / STATE_FILE
    if not ckpt_file.exists():
        tmp = ckpt_file.with_name(STATE_FILE + ".tmp")
        why = f" (only {tmp.name}: a save that did not complete)" if tmp.exists() else ""
        raise Refused(
            f"--resume: no checkpoint at {ckpt_file}{why}. Start the run again without --resume "
            "(with --overwrite if the directory holds its metrics)."
        )
    ckpt = read_checkpoint(ckpt_file)
    diffs = config_differences(ckpt, cfg, loss_cfg)
    if diffs:
        raise Refused(_differs(out_dir, ckpt_file, ckpt, diffs))
    threads = ckpt["config"].get("threads", cfg.threads)
    if threads != cfg.threads:  # allowed (another machine), but CPU float sums follow the thread count
        print(f"warning: --threads {cfg.threads}, the checkpoint's run {threads}: on a CPU the number of threads "
              "changes the order of float sums, so the run is not bitwise the one it would have been")  # fmt: skip
    data, recorded = _data_file(cfg), (manifest or {}).get("data")
    if _changed_data(recorded, data, "data_sha256"):
        raise Refused(
            f"--resume: {cfg.data_path} changed since the checkpoint {ckpt_file} was written (sha256 "
            f"{recorded['data_sha256'][:16]}... then, {data['data_sha256'][:16]}... now; {out_dir / MANIFEST} records "
            "it): its held-out and training problems would no longer be the run's. Put the file back as it was, or "
            "start a new run in another --output-dir (or with --overwrite)."
        )
    return OutputDir(out_dir, ckpt, False, None, manifest, data)


def open_output_dir(cfg: TrainConfig, loss_cfg: LossConfig) -> OutputDir:
    """Call with the directory's lock held. Checks the folder, writes and deletes nothing (`OutputDir.claim` does).
    --resume: the checkpoint (read and checked, weights_only), refused when its configuration differs from `cfg` /
    `loss_cfg` beyond RESUME_SAFE, or its data file changed. A fresh run: refused when OUTPUT_DIR already holds a run,
    unless --overwrite (whose deletion `claim` does)."""
    out_dir = output_path(cfg.output_dir)
    ckpt_file = out_dir / "checkpoint" / STATE_FILE
    _refuse_links(out_dir)
    _refuse_wrong_types(out_dir)
    manifest = read_manifest(out_dir)
    if cfg.resume and cfg.overwrite:
        raise Refused("--resume continues the run in OUTPUT_DIR, --overwrite deletes it: pass one of them")
    if cfg.resume:
        return _open_resume(cfg, loss_cfg, out_dir, manifest)
    existing = describe_existing(out_dir)
    if manifest is None and (existing is None or not _own_checkpoint(ckpt_file)):
        _refuse_foreign(out_dir)  # without a manifest, only a checkpoint of this trainer makes a run its own
    if existing is not None and not cfg.overwrite:
        raise Refused(
            f"{out_dir} already holds {existing}. Continue it with --resume, start over with --overwrite "
            "(deletes its metrics, summary and checkpoint), or use another --output-dir."
        )
    return OutputDir(out_dir, None, cfg.overwrite, existing, manifest, _data_file(cfg))


def drop_exported_model(out_dir: Path, why: str) -> None:
    """A resumed run stopped without writing its own model/ (`why`: "stopped at step N before its finish", ...):
    OUTPUT_DIR/model/, the policy exported when the run finished earlier, is not the run's and is removed (the run's
    own: the manifest lists it), so that nothing beside the run reads as its trained policy. A failure to remove it is
    said, never raised."""
    folder = out_dir / "model"
    manifest = read_manifest(out_dir)
    if manifest is None or "model" not in manifest["files"] or not os.path.lexists(folder):
        return
    try:
        if os.path.islink(folder) or not os.path.isdir(folder):
            os.unlink(folder)
        else:
            shutil.rmtree(folder)
    except OSError as exc:
        print(f"warning: {folder} could not be removed ({exc.strerror or exc}); it is the policy of the run's earlier "
              f"finish, not of this run ({why})")  # fmt: skip
        return
    print(f"removed {folder}, the policy of the run's earlier finish: the run {why} (a finish writes model/ again, "
          "with --save-model)")  # fmt: skip
