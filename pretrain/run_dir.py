"""The layout of a run folder, in one place: every file the trainer, checkpoints, logs and export read or write.

    OUTPUT/
      config.yaml             the resolved run config (the current one: a resume applies the config given)
      model_config.json       the transformers config of the model trained
      data_manifest.json      the prepared dataset's manifest (tokenizer, splits, hashes)
      deepspeed_config.json   what DeepSpeed was given
      tokenizer/              a copy of the dataset's tokenizer (export needs no dataset)
      checkpoints/step_NNNNNNNN/   DeepSpeed files + meta.json + COMPLETE (sizes and hashes)
      train.log, metrics.jsonl, tensorboard/   progress, one row per step, scalars
      trackers.json, wandb/, mlflow.db   with train.report_to: the tracked runs' ids, W&B's files, MLflow's default store
      branches.jsonl          with train.resume_from: the branches taken, and where later checkpoints were moved
      data_history.jsonl      with train.allow_new_data: the datasets trained on, from which step
      samples/rank<N>.jsonl   with train.record_samples: the sample ids each rank trained on, per step
      PREEMPTED, FAILED       markers of the last attempt (for the sbatch wrapper and the user)
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import yaml

from core.atomic_files import check_folder_path
from core.errors import ConfigError
from core.jsonl import read_jsonl
from core.object_store import is_remote

CONFIG_FILE = "config.yaml"
MODEL_CONFIG_FILE = "model_config.json"
DATA_MANIFEST_FILE = "data_manifest.json"
DEEPSPEED_CONFIG_FILE = "deepspeed_config.json"
TOKENIZER_DIR = "tokenizer"
CHECKPOINTS_DIR = "checkpoints"
PREEMPTED = "PREEMPTED"
TENSORBOARD = "tensorboard"
# What train.report_to may name; tensorboard writes TENSORBOARD/, wandb wandb/, mlflow MLFLOW_DB (unless
# MLFLOW_TRACKING_URI says otherwise).
TRACKERS = (TENSORBOARD, "wandb", "mlflow")
FAILED = "FAILED"  # the run stopped on an error: what it was and at which step (the requeue must not hide it)


@dataclass(frozen=True)
class RunDir:
    """Paths of one run folder."""

    root: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", Path(self.root))

    def check_place(self, data_path: str) -> None:
        """Refuse a run folder that is a file, lies inside one, or is the dataset's folder or inside it."""
        check_folder_path(self.root, "config key 'train.output_dir'")
        if is_remote(data_path):
            return
        data, root = Path(data_path).resolve(), self.root.resolve()
        if root == data or data in root.parents:
            raise ConfigError(f"config key 'train.output_dir' ({self.root}) is the dataset's folder or inside it "
                              f"(data.path={data_path}): the run's files would mix with the dataset's; choose another")

    @property
    def config(self) -> Path:
        """The resolved run config."""
        return self.root / CONFIG_FILE

    @property
    def checkpoints(self) -> Path:
        """The folder of checkpoint tags."""
        return self.root / CHECKPOINTS_DIR

    @property
    def tokenizer(self) -> Path:
        """The tokenizer copied from the dataset."""
        return self.root / TOKENIZER_DIR

    @property
    def data_manifest(self) -> Path:
        """The dataset manifest saved with the run."""
        return self.root / DATA_MANIFEST_FILE

    @property
    def deepspeed_config(self) -> Path:
        """The DeepSpeed config the engine was given."""
        return self.root / DEEPSPEED_CONFIG_FILE

    @property
    def text_log(self) -> Path:
        """The progress lines."""
        return self.root / "train.log"

    @property
    def metrics(self) -> Path:
        """One JSON row per logged step (train, validation, resume)."""
        return self.root / "metrics.jsonl"

    def metric_rows(self, split: Optional[str] = None) -> list[dict]:
        """The rows of metrics.jsonl in order (those of one split: train, validation, resume, ...); [] before any."""
        rows = read_jsonl(self.metrics)
        return [row for row in rows if split is None or row.get("split") == split]

    def checkpoint(self, tag: str) -> Path:
        """One checkpoint's folder (tag: step_NNNNNNNN)."""
        return self.checkpoints / tag

    @property
    def branches(self) -> Path:
        """Where train.resume_from branched the run: one JSON row each (the tag, the checkpoints moved aside)."""
        return self.root / "branches.jsonl"

    @property
    def data_history(self) -> Path:
        """The datasets a run trained on, one JSON row each with the step it started at (train.allow_new_data)."""
        return self.root / "data_history.jsonl"

    @property
    def tensorboard(self) -> Path:
        """TensorBoard event files."""
        return self.root / TENSORBOARD

    @property
    def flight_recorder(self) -> Path:
        """Where NCCL's flight recorder dumps each rank's last collectives on a timeout (GPU runs)."""
        return self.root / "flight_recorder"

    @property
    def tracker_ids(self) -> Path:
        """The ids of the W&B and MLflow runs this run logs to (a resume continues them)."""
        return self.root / "trackers.json"

    @property
    def wandb(self) -> Path:
        """Where W&B keeps its files (offline runs included)."""
        return self.root

    @property
    def mlflow_db(self) -> Path:
        """MLflow's store when MLFLOW_TRACKING_URI is not set."""
        return self.root / "mlflow.db"

    def samples(self, rank: int) -> Path:
        """The sample audit of one rank."""
        return self.root / "samples" / f"rank{rank}.jsonl"

    def marker(self, name: str) -> Path:
        """A run marker (PREEMPTED or FAILED)."""
        if name not in (PREEMPTED, FAILED):
            raise ValueError(f"not a run marker: {name}")
        return self.root / name

    def write_marker(self, name: str, fields: dict, replace: bool = True) -> None:
        """Write a run marker as one JSON line (atomically: the sbatch wrapper may read it at any moment); with
        `replace` False, only where the run has none."""
        from core.atomic_files import write_text_atomic

        write_text_atomic(self.marker(name), json.dumps(fields) + "\n", replace=replace)

    def file(self, name: str) -> Path:
        """One of the run files written at start (config, model config, data manifest, DeepSpeed config)."""
        if name not in (CONFIG_FILE, MODEL_CONFIG_FILE, DATA_MANIFEST_FILE, DEEPSPEED_CONFIG_FILE):
            raise ValueError(f"not a run file: {name}")
        return self.root / name

    def write_run_files(self, files: dict[str, str], tokenizer: Path) -> None:
        """Make the run folder self-contained for export: the run files (`run_files`) and a copy of the dataset's
        tokenizer folder, each written whole or not at all."""
        from core.atomic_files import write_text_atomic
        from data_pipeline.tokenizer import copy_tokenizer_folder

        self.root.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            write_text_atomic(self.file(name), text)
        copy_tokenizer_folder(tokenizer, self.tokenizer)


def run_files(config: dict, model_config: dict, manifest: dict) -> dict[str, str]:
    """What a checkpoint needs besides weights to be exported, as text by file name: the resolved run config, the
    transformers config of the model, the data manifest."""
    return {CONFIG_FILE: yaml.safe_dump(config, sort_keys=False), MODEL_CONFIG_FILE: json.dumps(model_config, indent=2),
            DATA_MANIFEST_FILE: json.dumps(manifest, indent=2)}
