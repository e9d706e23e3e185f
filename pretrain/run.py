"""Builds a training run from its config: data, objective, masking, run folder, trainer."""
from __future__ import annotations

import json
import logging
import os
import warnings
from pathlib import Path

import torch
import yaml

from core import distributed as dist
from core.atomic_files import write_text_atomic
from core.config_io import config_to_dict
from core.errors import ConfigError
from data_pipeline.loader import (
    EVAL_STREAM,
    MaskingCollate,
    build_loader,
    clean_stale_shared_memory,
    fetch_metadata,
    is_local_leader,
)
from data_pipeline.dataset_dir import SPLITS, DatasetDir
from data_pipeline.masking import build_masking, evaluation_masking, needs_word_starts
from data_pipeline.shards import read_manifest, verify_split
from data_pipeline.tokenizer import copy_tokenizer_folder, load_tokenizer, word_start_table
from model.diagnostics import unigram_entropy
from model.encoder import model_config as build_model_config
from model.objectives import build_objective, check_objective_config, objective_class
from pretrain.config import RunConfig
from pretrain.hardware import resolve_precision
from pretrain.run_dir import CONFIG_FILE, DATA_MANIFEST_FILE, MODEL_CONFIG_FILE, RunDir
from pretrain.trainer import Trainer


def quiet_libraries() -> None:
    """Keep third-party chatter out of the progress output."""
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=UserWarning, module="torch.distributed")
    for name in ("DeepSpeed", "deepspeed", "streaming", "torch.distributed", "botocore", "boto3", "s3transfer"):
        logging.getLogger(name).setLevel(logging.WARNING)


def run_files(cfg: RunConfig, model_config, manifest: dict) -> dict[str, str]:
    """What a checkpoint needs besides weights to be exported: the resolved run and model configs, the data manifest."""
    return {CONFIG_FILE: yaml.safe_dump(config_to_dict(cfg), sort_keys=False),
            MODEL_CONFIG_FILE: json.dumps(model_config.to_dict(), indent=2),
            DATA_MANIFEST_FILE: json.dumps(manifest, indent=2)}


def _write_run_files(files: dict[str, str], run_dir: RunDir, data_dir: Path) -> None:
    """The run folder is self-contained: resolved config, model config and tokenizer (for export)."""
    run_dir.root.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        write_text_atomic(run_dir.file(name), text)
    # The dataset folder keeps its tokenizer under the same name as the run folder does.
    copy_tokenizer_folder(DatasetDir(data_dir).tokenizer, run_dir.tokenizer)


def build_trainer(cfg: RunConfig) -> Trainer:
    """Initialise the process group and everything the trainer needs."""
    quiet_libraries()
    if torch.cuda.is_available():  # read when NCCL's group is created: a timeout dumps every rank's last collectives here
        recorder = RunDir(cfg.train.output_dir).flight_recorder
        recorder.mkdir(parents=True, exist_ok=True)
        os.environ.setdefault("TORCH_FR_DUMP_TEMP_FILE", str(recorder / "rank_"))
    dist.init_distributed(cfg.train.init_timeout_s)
    manifest = _checked_manifest(cfg)
    tok = manifest["tokenizer"]
    check_objective_config(cfg.objective, cfg.model, cfg.masking)
    # Resolved before the run files are written: config.yaml records the precision the run trained in.
    cfg.train.precision, why = resolve_precision(cfg.train.precision)
    model_config = build_model_config(cfg.model, tok, manifest["seq_len"])
    files = run_files(cfg, model_config, manifest)
    torch.manual_seed(cfg.train.seed)  # identical initial weights on every rank
    objective = build_objective(cfg.objective, model_config, cfg.model.init_from, cfg.masking.mask_prob)
    train_loader, eval_loader = _loaders(cfg, manifest, *_collates(cfg, tok))
    # The trainer checks the launch against what it resumes (stage, tokenizer, data, shape) before it writes
    # anything; the run files replace the folder's only after that: a refused launch leaves the run as it was.
    trainer = Trainer(cfg, objective, train_loader, eval_loader, run_files=files,
                      flops_per_token=objective.flops_per_token, unigram_entropy=None if eval_loader is None else
                      validation_unigram_entropy(eval_loader, cfg.train.eval_batches, tok),
                      notes=(f"precision {cfg.train.precision} ({why})",))
    if dist.rank() == 0:
        _write_run_files(files, RunDir(cfg.train.output_dir), Path(cfg.data.path))
    dist.barrier()
    return trainer


def _checked_manifest(cfg: RunConfig) -> dict:
    """The prepared dataset's manifest, its metadata fetched (a remote dataset) and its shards' hashes checked once
    per node."""
    data_dir = Path(cfg.data.path)
    if is_local_leader():
        fetch_metadata(cfg.data)
        if cfg.data.verify_hashes and not cfg.data.remote:
            for split in SPLITS:
                if DatasetDir(data_dir).index(split).is_file():
                    verify_split(DatasetDir(data_dir).split(split))
    dist.barrier()
    return read_manifest(data_dir)


def _collates(cfg: RunConfig, tok: dict) -> tuple[MaskingCollate, MaskingCollate]:
    """The loader workers' per-batch transforms: the objective's view of the masking, for training and validation."""
    word_starts = None
    if needs_word_starts(cfg.masking):
        word_starts = word_start_table(load_tokenizer(DatasetDir(cfg.data.path).tokenizer))
    objective_cls = objective_class(cfg.objective.name)
    transform, eval_transform = (objective_cls.wrap_masking(getattr(cfg.objective, cfg.objective.name), build_masking(
        masking, tok["vocab_size"], tok["mask_id"], tok["special_ids"], word_starts=word_starts,
        pad_id=tok["pad_id"], cls_id=tok["cls_id"], sep_id=tok["sep_id"],
    ), tok["pad_id"], tok["cls_id"], tok["sep_id"]) for masking in (cfg.masking, evaluation_masking(cfg.masking)))
    # Masked in the loader (its workers): validation shows every picked token as [MASK], the same each time.
    return (MaskingCollate(transform, tok["pad_id"], cfg.train.seed),
            MaskingCollate(eval_transform, tok["pad_id"], cfg.train.seed, stream=EVAL_STREAM, per_epoch=False))


def _loaders(cfg: RunConfig, manifest: dict, train_collate: MaskingCollate, eval_collate: MaskingCollate):
    """The training loader, and the validation loader when evaluation is on and the split holds a batch per rank."""
    pin = torch.cuda.is_available()  # the engine copies pinned batches with non_blocking
    per_step = cfg.train.micro_batch_size * dist.world_size()
    train_sequences = manifest["splits"]["train"]["sequences"]
    if train_sequences < per_step:
        raise ConfigError(f"the training split has {train_sequences} sequences, fewer than one batch "
                          f"(micro_batch_size {cfg.train.micro_batch_size} x {dist.world_size()} ranks)")
    clean_stale_shared_memory(cfg.data)
    train_loader = build_loader(cfg.data, "train", cfg.train.micro_batch_size, collate_fn=train_collate, pin_memory=pin)
    eval_loader = None
    if cfg.train.eval_every and manifest["splits"]["validation"]["sequences"] >= per_step:
        eval_loader = build_loader(cfg.data, "validation", cfg.train.micro_batch_size, shuffle=False,
                                   collate_fn=eval_collate, pin_memory=pin)
    return train_loader, eval_loader


def validation_unigram_entropy(eval_loader, batches: int, tok: dict) -> float:
    """Entropy of the ordinary tokens in the validation batches: the MLM loss of a model that learned only word counts.

    Counted once over the same batches evaluation reads, summed over ranks.
    """
    counts = torch.zeros(tok["vocab_size"], dtype=torch.float64)
    for _, batch in zip(range(batches), eval_loader):
        ids = batch["original_input_ids"][batch["attention_mask"].bool()].long()  # the clean tokens, not the masked
        counts += torch.bincount(ids, minlength=tok["vocab_size"])[: tok["vocab_size"]].double()
    counts[[i for i in tok["special_ids"] if i < tok["vocab_size"]]] = 0
    return unigram_entropy(dist.all_reduce_sum(counts))
