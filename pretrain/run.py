"""The composition root of a training run: every part built here, from its config, and handed to the trainer."""
from __future__ import annotations

import dataclasses
import logging
import os
import warnings

import torch
from transformers import PretrainedConfig

from core import distributed as dist
from core.config_io import config_to_dict
from core.host_memory import keep_freed_memory
from core.process_life import process_start_time
from core.seeding import RunRng, seed_all, seed_for
from data_pipeline.batches import EVAL_STREAM
from data_pipeline.dataset_dir import DatasetDir
from data_pipeline.run_data import RunData, open_run_data
from model.encoder import model_config
from model.objectives import ObjectiveSpec, resolve_objective
from pretrain.checkpointing.checkpoint_manager import CheckpointManager
from pretrain.config import RunConfig
from pretrain.engine.ds_config import gradient_accumulation
from pretrain.engine.setup import set_up_engine
from pretrain.engine.hardware import resolve_hardware
from pretrain.observe.logger import RunLogger
from pretrain.observe.metrics import MetricsReporter
from pretrain.observe.progress import Progress
from pretrain.observe.trackers import check_installed
from pretrain.checkpointing.resume_choice import ResumeChoice
from pretrain.run_dir import DEEPSPEED_CONFIG_FILE, RunDir, run_files
from pretrain.observe.sample_audit import SampleAudit
from pretrain.trainer import Trainer
from pretrain.validation import Validator


def quiet_libraries() -> None:
    """Keep third-party chatter out of the progress output."""
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=UserWarning, module="torch.distributed")
    for name in ("DeepSpeed", "deepspeed", "streaming", "torch.distributed", "botocore", "boto3", "s3transfer"):
        logging.getLogger(name).setLevel(logging.WARNING)


def start_ranks(cfg: RunConfig) -> None:
    """Start the process group; then, the world size known, refuse a global batch it does not divide before the data
    and the model are built (minutes, for a large model)."""
    dist.init_distributed(cfg.train.init_timeout_s)
    gradient_accumulation(cfg.train.global_batch_size, cfg.train.micro_batch_size, dist.world_size())


def _encoder_config(cfg: RunConfig, spec: ObjectiveSpec, data: RunData) -> PretrainedConfig:
    """The encoder's transformers config, checked against the data, which the objective has accepted first."""
    spec.check_data(data.manifest)
    return model_config(cfg.model, data.manifest["tokenizer"], data.manifest["seq_len"],
                        DatasetDir(cfg.data.path).tokenizer)


def build_trainer(cfg: RunConfig) -> Trainer:
    """Build every part of a run from its config and hand them to the trainer: the process group, the device's
    precision and peak, the data, the objective, the resume choice, the engine and the stateful parts around it."""
    quiet_libraries()
    check_installed(cfg.train.report_to)
    # Before the data and the model, so that their memory and the loader workers forked later follow it.
    allocator = keep_freed_memory() if cfg.train.keep_freed_host_memory else None
    run_dir = RunDir(cfg.train.output_dir)
    run_dir.check_place(cfg.data.path)
    if torch.cuda.is_available():  # read when NCCL's group is created: a timeout dumps every rank's last collectives here
        run_dir.flight_recorder.mkdir(parents=True, exist_ok=True)
        os.environ.setdefault("TORCH_FR_DUMP_TEMP_FILE", str(run_dir.flight_recorder / "rank_"))
    spec = resolve_objective(cfg.objective, cfg.model, cfg.masking)  # the cheapest mistakes first
    start_ranks(cfg)
    hardware = resolve_hardware(cfg.train.precision, cfg.train.peak_tflops)
    # The run's config from here on names the precision `auto` resolved to: config.yaml records what it trained in.
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, precision=hardware.precision))
    data = open_run_data(cfg.data, cfg.masking, cfg.train.micro_batch_size, cfg.train.seed,
                         bool(cfg.train.eval_every), spec.data_transform,
                         pin_memory=torch.cuda.is_available())  # the engine copies pinned batches with non_blocking
    hf_config = _encoder_config(cfg, spec, data)
    rank, world = dist.rank(), dist.world_size()
    seed_all(seed_for(cfg.train.seed))  # identical initial weights on every rank
    rng = RunRng(cfg.train.seed, rank, world)  # the streams from the first step on (started last, below)
    objective = spec.build(hf_config, cfg.model.init_from, cfg.masking.mask_prob)
    files = run_files(config_to_dict(cfg), hf_config.to_dict(), data.manifest)
    # The launch is checked against what it resumes (stage, tokenizer, data, shape) before the engine is built; the
    # run files replace the folder's only when training starts: a refused launch leaves the run as it was.
    choice = ResumeChoice(cfg, run_dir, files)
    resumed = choice.choose()
    engine, engine_notes, ds_config = set_up_engine(cfg, objective, resumed)
    files[DEEPSPEED_CONFIG_FILE] = ds_config  # the run folder and every checkpoint keep the config DeepSpeed was given
    # Before any log: reading the validation batches for their unigram entropy may refuse the data.
    validator = (Validator(engine, data.validation, cfg.train.eval_batches, world, data.manifest["tokenizer"],
                           seed_for(cfg.train.seed, rank) ^ EVAL_STREAM) if data.validation is not None else None)
    loader, progress = data.train, Progress()
    log = RunLogger(run_dir, cfg.train.max_steps, enabled=rank == 0, report_to=tuple(cfg.train.report_to),
                    config=config_to_dict(cfg), branch=choice.branching_from)
    # What was decided for the user: the precision and stage `auto` picked, the peak MFU is measured against.
    for note in (*hardware.notes, *data.notes, *([allocator] if allocator else []), *engine_notes):
        log.info(note)
    rng.start()  # dropout differs per rank; a resume overwrites it with the saved streams
    return Trainer(cfg, engine=engine, loader=loader, progress=progress, log=log, run_dir=run_dir, run_files=files,
                   checkpoints=CheckpointManager(cfg, run_dir, choice, files, engine=engine, loader=loader,
                                                 progress=progress, rng=rng, log=log),
                   validator=validator,
                   metrics=MetricsReporter(log, world, objective.flops_per_token, hardware.peak_tflops,
                                           cfg.train.precision),
                   audit=SampleAudit(run_dir, rank, world, cfg.train.record_samples),
                   start_time=process_start_time())  # train.max_wall_time counts the start-up too

