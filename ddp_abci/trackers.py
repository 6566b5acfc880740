"""Accelerate's trackers (`log_with`, `init_trackers`, `accelerator.log`) in raw form: the
dashboards a run writes to, on rank 0 only. --track tensorboard,wandb,mlflow (fit(track=...)):

    tensorboard   torch.utils.tensorboard's SummaryWriter in TRACK_DIR/tensorboard (or --tensorboard
                  DIR); a resumed run writes into the same folder with purge_step at its first step:
                  the steps a killed job logged past its last checkpoint are hidden, not doubled
    wandb         wandb.init in TRACK_DIR, the project --project; WANDB_MODE=offline where the nodes
                  have no route out (`wandb sync` from a login node afterwards)
    mlflow        a run in the experiment --project, at MLFLOW_TRACKING_URI, else a SQLite store in
                  TRACK_DIR/mlflow.db (MLflow 3.18 refuses new runs in its file store,
                  "maintenance mode"; SQLite needs sqlalchemy and alembic, in the extra)

Each tracker's run id is kept in CKPT_DIR/trackers.json, and a resumed job logs into the same
run: a chain's jobs make one curve. W&B keeps the steps increasing itself (it drops a step below
its last); MLflow would keep both, so a resumed MLflow run skips the steps it already holds.
The config is logged once, the training and evaluation figures at the metrics' cadence. A
tracker that fails while the run trains (a disk full, a server gone) is one warning and is
dropped: it never costs the training. A missing package is one line before any work, naming
the pip command.
"""
from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import os
import secrets
import sys
from pathlib import Path
from typing import Any, Iterator

from . import run_folder
from .atomic_text import replace_text
from .errors import UsageError

PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow"}
INSTALL = "pip install 'ddp_abci[trackers]'"


def check_installed(names: tuple[str, ...]) -> None:
    """Raises: UsageError naming the pip command for the first tracker whose package is missing."""
    for name in names:
        if importlib.util.find_spec(PACKAGES[name]) is None:
            raise UsageError(f"--track {name} needs the {PACKAGES[name]} package: install it with "
                             f"pip install {PACKAGES[name]} (or {INSTALL})")


def track_dir(config: Any) -> Path:
    """Where the trackers write: --track-dir, else CKPT_DIR/tracking, else ./tracking."""
    if config.track_dir:
        return Path(config.track_dir)
    return Path(config.ckpt_dir) / "tracking" if config.ckpt_dir else Path("tracking")


class TensorBoard:
    name = "tensorboard"

    def __init__(self, folder: Path, first_step: int, config: dict, kept: str | None) -> None:
        from torch.utils.tensorboard import SummaryWriter  # noqa: PLC0415  (optional extra)

        self.writer = SummaryWriter(log_dir=str(folder), purge_step=first_step if first_step > 1 else None)
        self.writer.add_text("config", "    " + json.dumps(config, indent=1).replace("\n", "\n    "), first_step)
        self.run_id = str(folder)

    def log(self, step: int, values: dict[str, float]) -> None:
        for name, value in values.items():
            self.writer.add_scalar(name, value, step)

    def close(self) -> None:
        self.writer.close()


class WandB:
    name = "wandb"

    def __init__(self, folder: Path, first_step: int, config: dict, kept: str | None, project: str) -> None:
        import wandb  # noqa: PLC0415  (optional extra)

        folder.mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(project=project, dir=str(folder), config=config, id=kept or secrets.token_hex(4),
                              resume="allow")
        self.run_id = self.run.id

    def log(self, step: int, values: dict[str, float]) -> None:
        self.run.log(values, step=step)

    def close(self) -> None:
        self.run.finish()


@contextlib.contextmanager
def _quiet(logger: str) -> Iterator[None]:
    """A library's own log lines held back while it runs for us: a failure of its store is one
    warning of ours (Trackers._drop), not its ERROR lines and a stack (MLflow's, about 90 lines)."""
    log = logging.getLogger(logger)
    level, log.level = log.level, logging.CRITICAL
    try:
        yield
    finally:
        log.level = level


class MLflow:
    name = "mlflow"

    def __init__(self, folder: Path, first_step: int, config: dict, kept: str | None, project: str) -> None:
        import mlflow  # noqa: PLC0415  (optional extra)

        with _quiet("mlflow"):
            self._start(mlflow, folder, config, kept, project)

    def _start(self, mlflow: Any, folder: Path, config: dict, kept: str | None, project: str) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.client = mlflow.MlflowClient(tracking_uri=os.environ.get("MLFLOW_TRACKING_URI") or
                                          f"sqlite:///{(folder / 'mlflow.db').resolve()}")
        if kept:
            self.run_id = kept
            self.held = max((m.step for m in self.client.get_metric_history(kept, "loss")), default=0)
        else:
            experiment = self.client.get_experiment_by_name(project)
            experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(project)
            self.run_id, self.held = self.client.create_run(experiment_id).info.run_id, 0
            for key, value in config.items():
                self.client.log_param(self.run_id, key, json.dumps(value)[:6000])

    def log(self, step: int, values: dict[str, float]) -> None:
        if step > self.held:  # a resumed run's steps the killed job logged already: kept as they were
            with _quiet("mlflow"):
                for name, value in values.items():
                    self.client.log_metric(self.run_id, name, value, step=step)

    def close(self) -> None:
        with _quiet("mlflow"):
            self.client.set_terminated(self.run_id, "FINISHED")


class Trackers:
    """Rank 0's trackers, opened from the config (their run ids kept in CKPT_DIR/trackers.json)."""

    def __init__(self, config: Any, first_step: int, settings: dict) -> None:
        """Raises: OSError where a tracker's folder cannot be made (the caller makes it one line)."""
        self.open: list[Any] = []
        names = list(config.trackers)
        if config.tensorboard:  # the older spelling: TensorBoard in the folder named
            names = [n for n in names if n != "tensorboard"]
            self.open.append(TensorBoard(Path(config.tensorboard), first_step, settings, None))
        folder, kept = track_dir(config), self._kept(config)
        for name in names:
            if name == "tensorboard":
                self.open.append(TensorBoard(folder / "tensorboard", first_step, settings, None))
            elif name == "wandb":
                self.open.append(WandB(folder, first_step, settings, kept.get(name), config.project))
            else:
                self.open.append(MLflow(folder, first_step, settings, kept.get(name), config.project))
        self._keep(config, {t.name: t.run_id for t in self.open if t.name != "tensorboard"})

    @staticmethod
    def _kept(config: Any) -> dict:
        path = run_folder.path(config.ckpt_dir, run_folder.TRACKERS) if config.ckpt_dir and config.resume else None
        try:
            return json.loads(Path(path).read_text()) if path else {}
        except (OSError, ValueError):
            return {}

    @staticmethod
    def _keep(config: Any, ids: dict) -> None:
        path = run_folder.path(config.ckpt_dir, run_folder.TRACKERS) if config.ckpt_dir else None
        if path and ids:
            replace_text(path, json.dumps(ids) + "\n")  # a kill mid-write leaves the old ids, not half a file

    def log(self, step: int, values: dict[str, float | None]) -> None:
        """The figures at `step` to every tracker still open; None values left out."""
        values = {k: float(v) for k, v in values.items() if v is not None}
        for tracker in list(self.open):
            try:
                tracker.log(step, values)
            except Exception as e:  # noqa: BLE001  (any tracker's failure: a warning, never the training)
                self._drop(tracker, e)

    def close(self) -> None:
        for tracker in list(self.open):
            try:
                tracker.close()
            except Exception as e:  # noqa: BLE001
                self._drop(tracker, e)
        self.open = []

    def _drop(self, tracker: Any, error: BaseException) -> None:
        self.open.remove(tracker)
        text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        print(f"warning: the {tracker.name} tracker failed ({text}); it stops here, training goes on",
              file=sys.stderr, flush=True)
