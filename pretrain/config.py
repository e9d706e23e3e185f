"""The training run's typed config: data, model, objective, masking, optimizer, schedule, train."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Optional, Union

from core.config_io import check_range
from core.errors import ConfigError
from core.seeding import MAX_RUN_SEED
from core.object_store import is_remote
from data_pipeline.loader import LoaderConfig
from data_pipeline.masking import MaskingConfig
from model.backbones.base import transformers_major
from model.encoder import EncoderConfig
from model.objectives import ObjectiveConfig
from pretrain.lifecycle.preemption import parse_duration
from pretrain.run_dir import TENSORBOARD, TRACKERS


@dataclass
class OptimizerConfig:
    """AdamW or LAMB; biases and LayerNorm weights get no weight decay."""

    name: Literal["adamw", "lamb"] = "adamw"
    # torch: torch.optim.AdamW (fused: the fastest here) / the project's LAMB, the paper's (no compiled op, any device).
    # deepspeed: FusedAdam / FusedLamb on GPU, DeepSpeedCPUAdam on CPU (compiled on first use). FusedLamb is another
    # LAMB than the paper's (README, "Optimizers and schedules").
    impl: Literal["torch", "deepspeed"] = "torch"
    lr: float = 5e-4
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.98)
    eps: float = 1e-6
    grad_clip: float = 1.0

    def validate(self) -> None:
        """Check values that the type alone cannot (torch's optimizers would refuse them only once the engine is built)."""
        if not self.eps > 0:
            raise ConfigError(f"config key 'optimizer.eps' must be > 0, got {self.eps}")
        # lr 0 is allowed: a step that leaves the weights as they are (a probe of the loss, of a resume's data order).
        for key in ("lr", "weight_decay", "grad_clip"):
            if not getattr(self, key) >= 0:
                raise ConfigError(f"config key 'optimizer.{key}' must be >= 0 (0: off), got {getattr(self, key)}")
        if not all(0.0 <= beta < 1.0 for beta in self.betas):
            raise ConfigError(f"config key 'optimizer.betas' must be two values in [0, 1), got {list(self.betas)}")


@dataclass
class ScheduleConfig:
    """Linear warmup, then decay to `min_lr_ratio * lr` at `max_steps`."""

    warmup_steps: int = 100
    # wsd: warmup-stable-decay (constant lr, then linear decay over the last `decay_fraction`).
    decay: Literal["linear", "cosine", "polynomial", "constant", "wsd"] = "linear"
    decay_fraction: float = 0.2
    min_lr_ratio: float = 0.0
    # polynomial: (1 - progress) ** power (power 1 is linear).
    power: float = 2.0

    def validate(self) -> None:
        """Check values that the type alone cannot."""
        if not 0.0 < self.decay_fraction <= 1.0:
            raise ConfigError(f"config key 'schedule.decay_fraction' must be in (0, 1], got {self.decay_fraction}")
        if self.warmup_steps < 0:
            raise ConfigError(f"config key 'schedule.warmup_steps' must be >= 0, got {self.warmup_steps}")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ConfigError(f"config key 'schedule.min_lr_ratio' must be in [0, 1], got {self.min_lr_ratio}")
        if not self.power > 0:
            raise ConfigError(f"config key 'schedule.power' must be > 0, got {self.power}")


@dataclass
class TrainConfig:
    """Loop, precision, checkpointing and logging."""

    output_dir: str = "runs/train"
    max_steps: int = 1000
    micro_batch_size: int = 16
    # Samples per optimizer step over all ranks; accumulation = global / (micro * world).
    global_batch_size: int = 32
    # auto: bf16 where the hardware runs it natively (a recent GPU, a CPU with AMX or AVX512-BF16), else fp32.
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    # DeepSpeed ZeRO stage (0: plain data parallelism, 1: optimizer states sharded, 2: + gradients,
    # 3: + parameters) and CPU offload, written with the precision into deepspeed_configs/base.json.
    # auto: the lowest stage whose model states fit (pretrain/engine/zero_stage.py): 0 on one rank, and over several
    # ranks where the gradients can be all-reduced in buckets (overlap_grad_reduce); or the stage of the
    # checkpoints a run resumes. The choice and why are logged at start.
    zero_stage: Union[Literal["auto"], int] = "auto"
    # With several ranks, the gradients all-reduced while backward still runs: at ZeRO stage 0 in buckets filed as
    # autograd finishes each gradient, as torch's DDP does (pretrain/engine/grad_buckets.py; DeepSpeed's own stage 0
    # reduces all of them in one pass after backward), at stages 1-3 DeepSpeed's `overlap_comm` with
    # `contiguous_gradients`. auto: at stage 0 with several ranks, at stages 1-2 with several GPU ranks (on CPU, over
    # gloo, DeepSpeed's hooks only cost host time). BENCHMARKS.md, "The gradient all-reduce during backward".
    overlap_grad_reduce: Union[Literal["auto"], bool] = "auto"
    # MiB of gradients per all-reduce at stage 0 with the above (torch DDP's bucket_cap_mb; its default).
    grad_bucket_mb: float = 25.0
    offload_optimizer: bool = False
    offload_params: bool = False  # ZeRO-3 only
    # A DeepSpeed JSON of one's own instead of the template ("" = the template).
    deepspeed_config: str = ""
    # torch.compile (ZeRO 0-2; checkpoints and exports unchanged; compile time at every start). true / step: the
    # objective's whole step (encoders, heads, losses) as one graph of fixed shapes; layers: each encoder layer on
    # its own, and the objective's `compile_regions` (a head and its loss), which measured faster on an H200
    # (BENCHMARKS.md, "The trainer's step against the compiled bare loop, kernel by kind"); auto: the mode the run's
    # backbone measured fastest in on an H200 (its `compile_mode`: ModernBERT's whole step with its rotary tables,
    # the others' layers; BENCHMARKS.md, "The second run of the GPU queue").
    compile: Union[bool, Literal["step", "layers", "auto"]] = False
    # One matmul for Q, K and V in every BERT-layout attention (BERT; ELECTRA's and COCO-LM's networks; ModernBERT has
    # its own), over the three weights concatenated at each call: checkpoints and exports keep transformers' layout.
    # ZeRO 0-2 (ZeRO-3 gathers each projection's weight when its own module runs). BENCHMARKS.md, "Kernel levers".
    fused_qkv: bool = False
    # ModernBERT's rotary cos/sin read from tables of every position, built once on the training device
    # (model/rotary_tables.py), instead of computed at each forward: the same values (bit for bit eagerly), and a
    # compiled graph loads them where it would evaluate cos and sin again for every element of Q and K. Buffers the
    # state dict does not keep: checkpoints and exports are unchanged. BENCHMARKS.md, "Rotary tables".
    rotary_tables: bool = True
    # Rows of an MLM head's vocabulary projection taken with its cross-entropy and their gradients per pass, so the
    # [predicted rows, vocabulary] float32 logits never exist whole (model/vocabulary_loss.py); 0: the head's logits at
    # once, as transformers' modules compute them. ZeRO 0-2 (it reads the projection's weight directly). Every
    # objective's vocabulary loss (generators' included; their sampling still forms its logits whole, without a
    # gradient). Under train.compile keep it in the thousands: the compiler unrolls one copy per chunk.
    # BENCHMARKS.md, "The vocabulary loss in chunks".
    vocab_loss_chunk: int = 0
    # An attention-mask column the loader padded nothing in (with `packing: full`, all batches but those holding a
    # prepared part's last, shorter row) reaches the encoders as no mask: the same attention, without transformers
    # reading the mask back from the device to find it all ones (on a GPU a host wait per forward). auto: drop, except
    # where the step is compiled whole (train.compile true or step, or auto taking it), where the step with the mask
    # measured faster (drop there compiles a second graph for padded batches); keep: always hand the mask over.
    # BENCHMARKS.md, "Unpadded batches without an attention mask".
    unpadded_mask: Literal["auto", "drop", "keep"] = "auto"
    # glibc keeps the host memory a step frees for the next step instead of returning it to the kernel, which
    # costs page faults at every step (core/host_memory.py; BENCHMARKS.md). false: glibc's defaults.
    keep_freed_host_memory: bool = True
    seed: int = 42
    log_every: int = 10
    save_every: int = 100
    # Also save when this many minutes passed since the last save (0: off).
    save_every_minutes: float = 0.0
    # Save, mark PREEMPTED and exit 75 before this much wall time ("23:45:00", "90m"; "" = none).
    # Inside SLURM the job's end time is a deadline too.
    max_wall_time: str = ""
    use_slurm_deadline: bool = True
    # Seconds kept free before a deadline, beyond two steps and the longest save seen.
    deadline_margin_s: float = 60.0
    # Dense peak TFLOP/s of one device for MFU (0: a known GPU's data sheet, else measured once and cached).
    peak_tflops: float = 0.0
    keep_last: int = 3
    # How long a collective may wait for the other ranks: at start (process group, ZeRO set-up, data, the
    # first step) and in saves and evaluations; then, from the second step on, in every training step.
    # A rank that died ends the others within step_timeout_s even when its host sends nothing (exit 76).
    init_timeout_s: float = 600.0
    step_timeout_s: float = 120.0
    # Also keep checkpoints in object storage (s3://bucket/prefix, ...): each complete checkpoint is uploaded
    # with its COMPLETE marker last, and a run whose folder has none (a requeue onto another node) resumes
    # from the newest complete one there. keep_last applies to the bucket too (s3:// only). Rank 0 uploads after
    # each save, in the background while training goes on (the attempt's last save while the others wait); an upload
    # longer than checkpoint_upload_timeout_s is given up with a warning (a background one at the first logging step
    # past it, or when a save waits for it).
    checkpoint_remote: Optional[str] = None
    checkpoint_upload_timeout_s: float = 3600.0
    # Where metrics go besides metrics.jsonl and train.log: any of tensorboard, wandb, mlflow (rank 0 only).
    # wandb: WANDB_PROJECT / WANDB_MODE as usual; mlflow: MLFLOW_TRACKING_URI (default: RUN/mlflow.db, SQLite),
    # MLFLOW_EXPERIMENT_NAME.
    report_to: list[str] = field(default_factory=lambda: [TENSORBOARD])
    eval_every: int = 0
    eval_batches: int = 20
    # Stop (after saving) once this many steps ran in this invocation; 0 runs to max_steps.
    stop_after: int = 0
    # Write every sample id each rank trained on to samples/rank<N>.jsonl (an audit of the order).
    record_samples: bool = False
    resume: Literal["auto", "never"] = "auto"
    # Resume on a dataset other than the checkpoint's (same tokenizer): continued pre-training on new data. The
    # sample order starts afresh on it, and data_history.jsonl in the run folder records both datasets.
    allow_new_data: bool = False
    # Resume from this checkpoint (a tag like step_00000750, or its step) instead of the newest intact one.
    resume_from: str = ""
    # A checkpoint's files are read as data (weights, plain values) before DeepSpeed unpickles them at resume, and
    # one that holds anything else is refused. true: load the chosen checkpoint with pickle unread, for a
    # checkpoint from a source you trust (pickle can run code).
    trust_checkpoint: bool = False

    def _check_wall_time(self) -> None:
        """A duration or nothing, and a deadline margin that leaves time to train."""
        try:
            wall = parse_duration(self.max_wall_time)
        except ValueError:
            wall = -1.0
        if wall < 0 or (self.max_wall_time.strip() and wall == 0):
            raise ConfigError(f"config key 'train.max_wall_time' must be a duration such as 90m, 3600, 23:30:00 or "
                              f"1-00:00:00 (\"\": none), got {self.max_wall_time!r}")
        if wall > 0 and self.deadline_margin_s >= wall:  # every launch would stop, save and requeue at once
            raise ConfigError(f"config key 'train.deadline_margin_s' ({self.deadline_margin_s:g} s) must be less than "
                              f"train.max_wall_time ({self.max_wall_time} = {wall:g} s)")

    def validate(self) -> None:
        """Check values that the type alone cannot."""
        if not self.output_dir.strip():
            raise ConfigError("config key 'train.output_dir' is empty: name the run's folder")
        for key in ("max_steps", "micro_batch_size", "global_batch_size", "log_every", "save_every", "keep_last",
                    "eval_batches"):
            if getattr(self, key) < 1:
                raise ConfigError(f"config key 'train.{key}' must be >= 1, got {getattr(self, key)}")
        if self.global_batch_size % self.micro_batch_size:  # whatever the world size (checked again once it is known)
            raise ConfigError(f"train.global_batch_size={self.global_batch_size} is not divisible by "
                              f"train.micro_batch_size ({self.micro_batch_size})")
        for key in ("seed", "eval_every", "stop_after", "save_every_minutes", "deadline_margin_s", "peak_tflops"):
            if getattr(self, key) < 0:
                raise ConfigError(f"config key 'train.{key}' must be >= 0, got {getattr(self, key)}")
        check_range("train", self, ("seed",), at_most=MAX_RUN_SEED)
        self._check_wall_time()
        if self.zero_stage not in ("auto", 0, 1, 2, 3):
            raise ConfigError(f"config key 'train.zero_stage' must be auto, 0, 1, 2 or 3, got {self.zero_stage!r}")
        if self.overlap_grad_reduce not in ("auto", True, False):
            raise ConfigError(f"config key 'train.overlap_grad_reduce' must be auto, true or false, got "
                              f"{self.overlap_grad_reduce!r}")
        if self.grad_bucket_mb <= 0:
            raise ConfigError(f"config key 'train.grad_bucket_mb' must be > 0 MiB, got {self.grad_bucket_mb}")
        if self.vocab_loss_chunk < 0:
            raise ConfigError(f"config key 'train.vocab_loss_chunk' must be >= 0 rows (0: off), got {self.vocab_loss_chunk}")
        for key in ("init_timeout_s", "step_timeout_s", "checkpoint_upload_timeout_s"):
            if getattr(self, key) <= 0:
                raise ConfigError(f"config key 'train.{key}' must be > 0 seconds, got {getattr(self, key)}")
        unknown = sorted(set(self.report_to) - set(TRACKERS))
        if unknown:
            raise ConfigError(f"config key 'train.report_to' has {', '.join(unknown)}; choose from {', '.join(TRACKERS)}")
        if self.checkpoint_remote is not None and not is_remote(self.checkpoint_remote):
            raise ConfigError(f"config key 'train.checkpoint_remote' must be an object store URL such as "
                              f"s3://bucket/prefix, got {self.checkpoint_remote!r}")
        if self.compile and self.zero_stage == 3:
            raise ConfigError(f"train.compile={str(self.compile).lower()} needs ZeRO stage 0-2: ZeRO-3's hooks gather "
                              "parameters inside the layers a compiled region would capture (set train.compile=false)")
        if self.fused_qkv and transformers_major() < 5:
            raise ConfigError("train.fused_qkv=true needs transformers 5 (its attention interface); set it false")
        if self.vocab_loss_chunk and self.zero_stage == 3:
            raise ConfigError(f"train.vocab_loss_chunk={self.vocab_loss_chunk} needs ZeRO stage 0-2: ZeRO-3 gathers the "
                              "vocabulary projection's weight only when its module runs (set train.vocab_loss_chunk=0)")
        if self.fused_qkv and self.zero_stage == 3:
            raise ConfigError("train.fused_qkv=true needs ZeRO stage 0-2: ZeRO-3 gathers the Q, K and V weights only when "
                              "their own modules run (set train.fused_qkv=false)")


@dataclass
class RunConfig:
    """A whole pre-training run."""

    data: LoaderConfig = field(default_factory=LoaderConfig)
    model: EncoderConfig = field(default_factory=EncoderConfig)
    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig)
    masking: MaskingConfig = field(default_factory=MaskingConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
