"""Experiment trackers beside TensorBoard (train.report_to): Weights & Biases and MLflow, on rank 0.

Each tracker gets the run's resolved config once and every scalar row the run logs (the rows of
metrics.jsonl, keyed `split/name`). The tracker's run id is kept in the run folder (trackers.json),
so a resumed or requeued run continues the same tracked run instead of starting a new one.
A step a tracker has already seen (the steps a killed run redoes after its last checkpoint) is not
sent again: W&B refuses steps that go back, and MLflow would keep both values. A train.resume_from branch redoes
steps with other values (another lr, after a divergence): it starts tracked runs of its own, named for the checkpoint
it branches from, so that its curve is not dropped for the abandoned one's.
"""
from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.util
import json
import logging
import os
import threading
import time
import uuid
from typing import Any, Optional

from core.atomic_files import write_text_atomic
from core.errors import InputDataError, SetupError, one_line
from core.process_life import to_stderr
from pretrain.lifecycle.exit_status import EXIT_USER_ERROR
from pretrain.observe.tracker_sender import SENDER_THREAD, TrackerSender
from pretrain.run_dir import RunDir

PROJECT = "contrastive-pretrain"
# A row's key for when it was logged (W&B's own name, which its `log` keeps): a row sent late, after an outage, keeps
# its time on the charts, and one sent again after an answer that was lost is the same point to MLflow, not a second.
LOGGED_AT = "_timestamp"
# At the end of a run (a preempted one's included, within its grace time): for the rows still waiting, then for the
# tracked runs to be ended.
CLOSE_ROWS_S, CLOSE_WAIT_S = 10.0, 15.0
# A first launch's wait for a tracker's run to open (W&B's own init timeout): a library may retry for many minutes
# (MLflow over HTTP to a host that drops packets: 7 tries of 120 s), while the other ranks wait at the first collective.
FIRST_OPEN_S = 90.0


def _not_from_a_sender(record: logging.LogRecord) -> bool:
    return not (record.threadName or "").startswith(SENDER_THREAD)  # (None where logging.logThreads is off)


# The sender says a service's failure in one line, and its recovery: the libraries' own lines for each try it makes
# (MLflow's traceback for each failed SQL statement, urllib3's for each retry) read as a crash, and an outage of an
# hour prints hundreds of them. Only the senders' records are dropped: the same loggers speak for other work too
# (urllib3's for the object store's).
LIBRARY_LOGGERS = ("mlflow.store.db.utils", "urllib3.connectionpool")


def _flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


class Tracker:
    """One tracking backend: `log` a row of scalars at a step, `close` at the end."""

    name = ""

    run_id = ""

    hint = ""  # what the user sets when the library refuses to open the run

    @staticmethod
    def refusals() -> tuple[type[BaseException], ...]:
        """The errors by which the library says its service or its settings refused the run (no key, no network, a
        tracking URI it will not use): the user's to fix, not a bug."""
        return ()

    @staticmethod
    def final(exc: BaseException) -> Optional[str]:
        """What the user does about a failure that no later try mends (the tracked run deleted, say), or None for one
        that may pass (a service down)."""
        return None

    @classmethod
    def open_failures(cls) -> tuple[type[BaseException], ...]:
        """The errors by which a run does not open: the library's refusals, and the OSError of a service not reached."""
        return (*cls.refusals(), OSError)

    def log(self, step: int, values: dict[str, float]) -> None:
        """Send one row (keys already prefixed with the split, and LOGGED_AT: when it was logged)."""
        raise NotImplementedError

    def close(self, exit_code: int = 0) -> None:
        """Flush and end the tracked run (it stays resumable), as failed where `exit_code` is not 0."""


class WandbTracker(Tracker):
    """Weights & Biases: WANDB_PROJECT (default contrastive-pretrain), WANDB_ENTITY, WANDB_MODE=offline as usual."""

    name = "wandb"
    hint = "set WANDB_API_KEY (or run `wandb login`), or WANDB_MODE=offline where the nodes have no internet"

    @staticmethod
    def refusals() -> tuple[type[BaseException], ...]:
        """No API key, a refused one, no network, or W&B's own error of another kind (its base class: an answer it
        does not sort, its local service that would not start)."""
        from wandb.errors import Error

        return (Error,)

    @staticmethod
    def final(exc: BaseException) -> Optional[str]:
        """A key W&B refused: it is read when the run opens, so no later try takes another."""
        from wandb.errors import AuthenticationError

        if isinstance(exc, AuthenticationError):
            return "set WANDB_API_KEY (or run `wandb login`) and requeue the job; its run continues"
        return None

    def __init__(self, run_dir: RunDir, config: dict[str, Any], run_id: Optional[str], run_name: str) -> None:
        import wandb

        self.run_id = run_id or uuid.uuid4().hex[:8]
        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", PROJECT), id=self.run_id, resume="allow",
                              dir=str(run_dir.wandb), name=run_name, config=config)

    def log(self, step: int, values: dict[str, float]) -> None:
        """Send one row to the W&B run at this step."""
        self.run.log(values, step=step)

    def close(self, exit_code: int = 0) -> None:
        """Finish the W&B run (resumable by its id): W&B shows it failed where `exit_code` is not 0."""
        self.run.finish(exit_code=exit_code or None)  # None: W&B's own (0, as no exception reaches its hooks)


class MlflowTracker(Tracker):
    """MLflow: MLFLOW_TRACKING_URI (default a SQLite file in the run folder), MLFLOW_EXPERIMENT_NAME."""

    name = "mlflow"
    hint = "check MLFLOW_TRACKING_URI (unset, the run folder's SQLite file mlflow.db is used)"

    @staticmethod
    def refusals() -> tuple[type[BaseException], ...]:
        """MLflow's answer, a tracking URI it will not use or a server that refused, or its SQL store's (locked,
        damaged), which MLflow raises unwrapped while it opens the store."""
        from mlflow.exceptions import MlflowException
        from sqlalchemy.exc import SQLAlchemyError

        return MlflowException, SQLAlchemyError

    @staticmethod
    def final(exc: BaseException) -> Optional[str]:
        """The run deleted, a store that does not hold it (another tracking URI), a store whose schema differs from
        this MLflow's."""
        from mlflow.exceptions import MlflowException

        if not isinstance(exc, MlflowException):
            return None
        gone = "remove its id from the run folder's trackers.json to start a new run at the next launch"
        if exc.error_code == "RESOURCE_DOES_NOT_EXIST":
            return f"the tracking store does not hold the run (is MLFLOW_TRACKING_URI the first launch's?); {gone}"
        if "must be in the 'active' state" in str(exc):
            return (f"restore it (`mlflow runs restore --run-id` with the id above, MLFLOW_TRACKING_URI set to the run's "
                    f"store) for the next launch to continue it, or {gone}")
        if "out-of-date database schema" in str(exc):
            return ("the store's schema and this MLflow's differ: upgrade the older of the two (the store: `mlflow db "
                    "upgrade URI`, after a backup) and requeue the job")
        return None

    def __init__(self, run_dir: RunDir, config: dict[str, Any], run_id: Optional[str], run_name: str) -> None:
        import mlflow
        from mlflow.entities import Metric, Param

        self._metric = Metric
        uri = os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{run_dir.mlflow_db.resolve()}"
        self.client = mlflow.MlflowClient(tracking_uri=uri)
        self.uri = uri
        if run_id is None:
            name = os.environ.get("MLFLOW_EXPERIMENT_NAME", PROJECT)
            experiment = self.client.get_experiment_by_name(name)
            experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(name)
            run_id = self.client.create_run(experiment_id, run_name=run_name).info.run_id
            # MLflow caps a parameter's value at 6000 characters; a config's values are far shorter.
            params = [Param(k, (v if isinstance(v, str) else json.dumps(v))[:6000]) for k, v in _flatten(config).items()]
            for i in range(0, len(params), 100):
                self.client.log_batch(run_id, params=params[i:i + 100])
        else:
            self.client.update_run(run_id, status="RUNNING")
        self.run_id = run_id

    def log(self, step: int, values: dict[str, float]) -> None:
        """Send one row to the MLflow run as one batch of metrics at this step, stamped when it was logged."""
        when = int(values.get(LOGGED_AT, time.time()) * 1000)
        self.client.log_batch(self.run_id, metrics=[self._metric(k, float(v), when, step)
                                                    for k, v in values.items() if k != LOGGED_AT])

    def close(self, exit_code: int = 0) -> None:
        """Mark the MLflow run finished, or failed where `exit_code` is not 0 (resumable by its id either way)."""
        from mlflow.entities import RunStatus

        self.client.set_terminated(self.run_id, RunStatus.to_string(RunStatus.FAILED if exit_code else RunStatus.FINISHED))


BACKENDS = {"wandb": WandbTracker, "mlflow": MlflowTracker}


def _not_installed(name: str, why: str) -> str:
    return (f"train.report_to has {name}, but its library is not installed ({why}); pip install "
            f"{'wandb' if name == 'wandb' else 'mlflow-skinny sqlalchemy alembic'}")


# What each tracker imports to open a run: MLflow's SQL store needs SQLAlchemy and Alembic beside mlflow-skinny.
NEEDS = {"wandb": ("wandb",), "mlflow": ("mlflow", "sqlalchemy", "alembic")}


def check_installed(report_to: list[str]) -> None:
    """Refuse a tracker whose library is not installed, on every rank before the model is built: only rank 0 opens
    the trackers, and it would learn it after the build, its peers then ending as lost."""
    for name in report_to:
        for module in NEEDS.get(name, ()):
            spec = importlib.util.find_spec(module)
            if spec is None or spec.origin is None:  # no origin: a folder of that name (W&B's ./wandb), not the library
                raise SetupError(_not_installed(name, f"no module named {module!r}"))


class NotOpened(Exception):
    """A continued run's service did not open it (yet): the sender says why and tries again."""


class PendingTracker(Tracker):
    """A tracked run an earlier attempt opened, which this launch continues: the first row sent opens it, from the
    sender's thread, which tries again (backing off) until the service answers. So a service that is down or slow at
    a requeue holds no rank: the library may retry for many minutes, and the other ranks wait at the first
    collective only train.init_timeout_s."""

    def __init__(self, backend: type[Tracker], args: tuple, run_id: str) -> None:
        self.name, self.run_id = backend.name, run_id
        self._backend, self._args = backend, args
        self.opened: Optional[Tracker] = None

    def refusals(self) -> tuple[type[BaseException], ...]:  # type: ignore[override]
        """A run that did not open, and what the backend's open run refuses with."""
        return NotOpened, *self._backend.open_failures()

    def final(self, exc: BaseException) -> Optional[str]:  # type: ignore[override]
        """The backend's word on its own error (a run that did not open: on what stopped it)."""
        return self._backend.final(exc.__cause__ if isinstance(exc, NotOpened) else exc)

    def _open(self) -> Tracker:
        """The backend's run, opened at the first call that it answers."""
        if self.opened is None:
            try:
                self.opened = self._backend(*self._args)
            except Exception as exc:
                # The settings opened this run before: whatever the library raises now (MLflow's SQLite store,
                # locked, raises SQLAlchemy's error; a server down, requests'), the rows wait for the service.
                named = isinstance(exc, self._backend.open_failures())
                raise NotOpened(f"its tracked run did not open: {'' if named else type(exc).__name__ + ': '}"
                                f"{one_line(exc)}") from exc
        return self.opened

    def log(self, step: int, values: dict[str, float]) -> None:
        """Open the run if it is not yet open, then send the row."""
        self._open().log(step, values)

    def close(self, exit_code: int = 0) -> None:
        """End the run if it was opened; a launch that failed before its first new row opens it to say so (the run
        would keep the last attempt's status, RUNNING after a lost node). One that stopped so early (a preemption's
        grace time) leaves it as it was."""
        if self.opened is not None or exit_code:
            self._open().close(exit_code)


def _end_opened(items: list[Tracker]) -> None:
    """End as failed the runs a refused first launch opened (not those it continues: the next launch does), so that
    none is left running; trackers.json is not written, so the next launch starts them anew. The refusal is the
    error: a failure here is a warning."""
    for tracker in items:
        if isinstance(tracker, PendingTracker):
            continue
        try:
            tracker.close(EXIT_USER_ERROR)
        except Exception as exc:
            to_stderr(f"warning: {tracker.name}: could not end the run it opened ({one_line(exc)})")


def _open_within(backend: type[Tracker], args: tuple, seconds: float) -> Tracker:
    """`backend(*args)`, refused in one line where it has not answered within `seconds` (then left to itself)."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["tracker"] = backend(*args)
        except BaseException as exc:  # raised again on the caller's thread
            outcome["error"] = exc

    thread = threading.Thread(target=run, name=f"{SENDER_THREAD}{backend.name}-open", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise SetupError(f"train.report_to has {backend.name}, but its service did not open the run within {seconds:g} s "
                         f"(its library may still be retrying); {backend.hint}")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["tracker"]


class Trackers:
    """The trackers named in train.report_to (besides tensorboard, which the run logger writes itself).

    Their runs open once the launch has committed to what it resumes (`open`, at the rewind): a launch refused before
    training (a branch whose checkpoint does not fit) opens none and leaves trackers.json as it was. The libraries are
    imported at once (`check_installed` refused a missing one on every rank before the model was built). Rows go out
    from a thread per tracker (`TrackerSender`): a service that fails mid-run is said in the log, not raised, and a
    run that a requeue continues is opened by its sender (`PendingTracker`), so that a service down or slow then
    delays that run's opening, not the training.
    """

    def __init__(self, run_dir: RunDir, report_to: list[str], config: dict[str, Any],
                 branch: Optional[str] = None) -> None:
        self.run_dir, self.config, self.branch = run_dir, config, branch
        self.backends = [name for name in report_to if name in BACKENDS]
        for name in LIBRARY_LOGGERS:
            if _not_from_a_sender not in logging.getLogger(name).filters:
                logging.getLogger(name).addFilter(_not_from_a_sender)
        for name in self.backends:
            try:
                importlib.import_module(name)
            except ImportError as exc:
                raise SetupError(_not_installed(name, str(exc))) from exc
        self.items: Optional[list[Tracker]] = None
        self.senders: dict[str, TrackerSender] = {}
        self.last_logged = -1  # the last step an earlier attempt sent to the runs this one continues
        self.continued: dict[str, bool] = {}  # per backend: whether its run got an earlier attempt's rows
        self.exit_code = 0  # the run's, set at close: a tracked run ends as failed where it is not 0

    def _open(self) -> list[Tracker]:
        """Continue the runs trackers.json names, or, for a new train.resume_from branch, start runs of its own."""
        path = self.run_dir.tracker_ids
        before = path.read_text() if path.is_file() else None
        try:
            saved = json.loads(before) if before is not None else {}
            if not isinstance(saved, dict):
                raise ValueError(f"a JSON {type(saved).__name__}, not an object")
        except (ValueError, UnicodeDecodeError) as exc:  # written whole or not at all: damaged by hand or by the disk
            raise InputDataError(f"'{path}' is damaged ({exc}): it names the tracked runs this run continues; restore "
                                 "it, or remove it to start new ones") from None
        launch = hashlib.sha256(json.dumps(self.config, sort_keys=True, default=str).encode()).hexdigest()[:16]
        if self.branch is not None and (saved.get("branch"), saved.get("branch_config")) != (self.branch, launch):
            # A new branch (the same branch launched again with the same config, before it saved, goes on in its own).
            saved = {"name": f"{self.run_dir.root.name} (branch from {self.branch})", "branch": self.branch,
                     "branch_config": launch}
        saved.setdefault("name", self.run_dir.root.name)  # passed again on a resume: W&B would rename the run
        items: list[Tracker] = []
        for name in self.backends:
            backend = BACKENDS[name]
            args = (self.run_dir, self.config, saved.get(name), saved["name"])
            if saved.get(name):  # the settings worked: a service down at the requeue must not end a job that would train
                items.append(PendingTracker(backend, args, saved[name]))
            else:  # at a first launch the settings are suspect: a refusal stops it before its first step
                try:
                    items.append(_open_within(backend, args, FIRST_OPEN_S))
                except SetupError:  # no answer in time
                    _end_opened(items)
                    raise
                except backend.open_failures() as exc:  # anything else the library raises is a bug's traceback
                    _end_opened(items)
                    raise SetupError(f"train.report_to has {name}, but it could not open its run ({one_line(exc)}); "
                                     f"{backend.hint}") from exc
            self.continued[name] = bool(saved.get(name))
        text = json.dumps({**saved, **{t.name: t.run_id for t in items}}, indent=2) + "\n"
        if items and text != before:
            # Synced, file and rename: a node lost a moment later must leave it whole and named, or the requeue would
            # stop on an empty file or open new runs beside these.
            write_text_atomic(path, text, fsync=True)
        return items

    def resumed(self, last_logged: int) -> None:
        """Rows up to `last_logged` were sent by an earlier attempt; the steps it redoes are not sent twice to the
        runs it sent them to."""
        self.last_logged = last_logged

    def open(self) -> None:
        """Open the tracked runs of a first launch (once), before the first step: a tracker's start-up (W&B's, over the
        network) is kept out of the steps, whose collectives wait only train.step_timeout_s. The runs a requeue
        continues open from their senders."""
        if self.items is None:
            self.items = self._open()
            self.senders = {t.name: TrackerSender(t.name, t.log, t.refusals(), end=functools.partial(self._end, t),
                                                  final=t.final) for t in self.items}

    def log(self, step: int, values: dict[str, float], prefix: str, new: bool = False) -> None:
        """One row of scalars to every tracker; a `new` row (no redo of an earlier attempt's: what this attempt's
        start found) goes to a continued run at the step after the last it got, where W&B, which takes only rising
        steps, keeps it."""
        if not self.backends:
            return
        self.open()
        row = {**{f"{prefix}/{k}": v for k, v in values.items()}, LOGGED_AT: time.time()}
        for tracker in self.items:
            # Only a run that got the earlier attempt's rows skips the steps this one redoes (known once rewound).
            last = self.last_logged if self.continued[tracker.name] else -1
            if new:
                self.senders[tracker.name].put(max(step, last + 1), row)
            elif step > last:
                self.senders[tracker.name].put(step, row)

    def messages(self) -> list[str]:
        """What the trackers' services did since the last call (a failure, a recovery), one line each, for the log."""
        return [line for sender in self.senders.values() for line in sender.messages()]

    def _end(self, tracker: Tracker) -> None:
        tracker.close(self.exit_code)

    def close(self, exit_code: int = 0) -> None:
        """Send what waits, then end every tracked run (each stays resumable by its id in trackers.json), as failed
        where the run ends with a non-zero `exit_code`, all within CLOSE_WAIT_S; a service that fails or hangs here is
        said in `messages`, not raised or waited for."""
        self.exit_code = exit_code
        start = time.monotonic()
        for sender in self.senders.values():  # side by side: a service that is down takes no time from another
            sender.stop_soon()
        for sender in self.senders.values():
            sender.stop(start + CLOSE_ROWS_S, start + CLOSE_WAIT_S)
