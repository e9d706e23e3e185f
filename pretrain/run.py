"""The composition root of a training run: from its config to a trainer handed its parts."""
from __future__ import annotations

import logging
import os
import warnings

import torch

from core import distributed as dist
from core.config_io import config_to_dict
from core.host_memory import keep_freed_memory
from core.seeding import seed_all, seed_for
from data_pipeline.run_data import open_run_data
from model.diagnostics import validation_unigram_entropy
from model.encoder import model_config
from model.objectives import resolve_objective
from pretrain.config import RunConfig
from pretrain.hardware import resolve_hardware
from pretrain.run_dir import RunDir, run_files
from pretrain.trainer import Trainer


def quiet_libraries() -> None:
    """Keep third-party chatter out of the progress output."""
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=UserWarning, module="torch.distributed")
    for name in ("DeepSpeed", "deepspeed", "streaming", "torch.distributed", "botocore", "boto3", "s3transfer"):
        logging.getLogger(name).setLevel(logging.WARNING)


def build_trainer(cfg: RunConfig) -> Trainer:
    """Initialise the process group and everything the trainer needs: the device's precision and peak, the data, the
    objective, the run files."""
    quiet_libraries()
    # Before the data and the model, so that their memory and the loader workers forked later follow it.
    allocator = keep_freed_memory() if cfg.train.keep_freed_host_memory else None
    run_dir = RunDir(cfg.train.output_dir)
    if torch.cuda.is_available():  # read when NCCL's group is created: a timeout dumps every rank's last collectives here
        run_dir.flight_recorder.mkdir(parents=True, exist_ok=True)
        os.environ.setdefault("TORCH_FR_DUMP_TEMP_FILE", str(run_dir.flight_recorder / "rank_"))
    spec = resolve_objective(cfg.objective, cfg.model, cfg.masking)  # the cheapest mistakes first
    dist.init_distributed(cfg.train.init_timeout_s)
    # Resolved before the run files are made: config.yaml records the precision the run trained in.
    hardware = resolve_hardware(cfg.train.precision, cfg.train.peak_tflops)
    cfg.train.precision = hardware.precision
    data = open_run_data(cfg.data, cfg.masking, cfg.train.micro_batch_size, cfg.train.seed,
                         bool(cfg.train.eval_every), spec.data_transform,
                         pin_memory=torch.cuda.is_available())  # the engine copies pinned batches with non_blocking
    tokenizer = data.manifest["tokenizer"]
    hf_config = model_config(cfg.model, tokenizer, data.manifest["seq_len"])
    seed_all(seed_for(cfg.train.seed))  # identical initial weights on every rank
    objective = spec.build(hf_config, cfg.model.init_from, cfg.masking.mask_prob)
    files = run_files(config_to_dict(cfg), hf_config.to_dict(), data.manifest)
    # The trainer checks the launch against what it resumes (stage, tokenizer, data, shape); the run files replace the
    # folder's only when it starts training: a refused launch leaves the run as it was.
    return Trainer(cfg, objective, data.train, data.validation, run_files=files,
                   flops_per_token=objective.flops_per_token, peak_tflops=hardware.peak_tflops,
                   unigram_entropy=None if data.validation is None else
                   validation_unigram_entropy(data.validation, cfg.train.eval_batches, tokenizer),
                   notes=(*hardware.notes, *data.notes, *([allocator] if allocator else [])))
