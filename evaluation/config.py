"""Typed configs of the evaluation commands (fine-tuning, self-similarity), loaded like training's.

`python -m pretrain finetune --config FILE.yaml key=value ...`: a YAML (with `defaults:` groups, as the
training configs), then `key=value` overrides, then the command-line flags (`--lr 3e-5` is `lr=3e-5`).
Examples: evaluation/configs/finetune/.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Optional

from core.config_io import check_range
from core.errors import ConfigError


@dataclass
class LocalTaskOptions:
    """How to read a `csv:`/`json:` task."""

    text_column: str = "text"
    pair_column: Optional[str] = None
    label_column: str = "label"
    validation_file: Optional[str] = None
    val_fraction: float = 0.1
    encoding: str = "utf-8"
    regression: bool = False
    token_task: bool = False  # text column holds word lists, label column tag lists
    ignore_tag: Optional[str] = None  # token tasks: the tag of words that carry no label (sparse annotation)

    def validate(self) -> None:
        """A held-out share that leaves rows on both sides, where one is held out (no validation file)."""
        if self.validation_file is None and not 0 < self.val_fraction < 1:
            raise ConfigError(f"config key 'data.val_fraction' must be in (0, 1), got {self.val_fraction}")


@dataclass
class FinetuneConfig:
    """Which model, which task, which recipe (docs/finetuning.md) and what to change in it."""

    model: str = ""  # an exported Hugging Face folder
    # A GLUE name (cola, sst2, mrpc, stsb, qqp, mnli, qnli, rte), NAME:FOLDER (GLUE downloaded), csv:PATH / json:PATH.
    task: str = ""
    seeds: list[int] = field(default_factory=lambda: [1, 2, 3])
    recipe: str = "taco"  # a YAML of evaluation/configs/finetune/recipe/ (hf, tacl_squad, taco, coco_lm)
    # Set to replace the recipe's value; unset (null) keeps it.
    lr: Optional[float] = None
    batch_size: Optional[int] = None
    epochs: Optional[float] = None
    max_length: Optional[int] = None
    weight_decay: Optional[float] = None
    warmup_ratio: Optional[float] = None
    # supervised-tacl adds TaCL's supervised token contrastive loss (token tasks only).
    loss: Literal["ce", "supervised-tacl"] = "ce"
    tacl_weight: float = 1.0
    tacl_temperature: float = 0.01
    # How a csv:/json: task is read (columns, validation split, encoding, regression or token task).
    data: LocalTaskOptions = field(default_factory=LocalTaskOptions)
    max_train_samples: int = 0  # 0: all
    max_eval_samples: int = 0
    out: Optional[str] = None  # the results JSON
    overwrite: bool = False  # replace an earlier result at `out` (only results an evaluation command wrote)

    def validate(self) -> None:
        """A model, a task and at least one seed; the recipe overrides in range."""
        for key in ("model", "task"):
            if not getattr(self, key):
                raise ConfigError(f"config key '{key}' is required (--{key} or {key}=...)")
        if not self.seeds:
            raise ConfigError("config key 'seeds' needs at least one seed")
        from evaluation.finetune import recipe_names

        if self.recipe not in recipe_names():
            raise ConfigError(f"config key 'recipe': unknown recipe '{self.recipe}'; options: {', '.join(recipe_names())}")
        check_range("", self, ("lr", "batch_size", "epochs", "max_length", "tacl_temperature"), above=0)
        check_range("", self, ("weight_decay", "tacl_weight"), at_least=0)
        check_range("", self, ("warmup_ratio",), at_least=0, at_most=1)
        if any(seed < 0 for seed in self.seeds):  # numpy's seed takes no sign
            raise ConfigError(f"config key 'seeds' must hold seeds >= 0, got {self.seeds}")
        check_sample_caps(self)

    def recipe_overrides(self) -> dict:
        """The recipe fields this config replaces."""
        return {k: getattr(self, k) for k in ("lr", "batch_size", "epochs", "max_length", "weight_decay", "warmup_ratio")
                if getattr(self, k) is not None}


@dataclass
class SelfSimilarityConfig:
    """TaCL's layer-wise token self-similarity of one or more exported models on a text file."""

    model: list[str] = field(default_factory=list)  # HF model folders, PATH or LABEL=PATH (seeds share a label)
    text: str = ""  # UTF-8, one sentence per line
    out: str = ""  # output path without suffix: writes OUT.json and OUT.png
    overwrite: bool = False  # replace an earlier report at `out` (only one an evaluation command wrote)
    # include: keep [CLS]/[SEP] in the pairs (as TaCL's analysis); exclude: drop them.
    special_tokens: Literal["include", "exclude"] = "include"
    max_length: int = 512
    batch_size: int = 32

    def validate(self) -> None:
        """Every input named."""
        for key in ("model", "text", "out"):
            if not getattr(self, key):
                raise ConfigError(f"config key '{key}' is required (--{key} or {key}=...)")
        if self.max_length < 2 or self.batch_size < 1:
            raise ConfigError("config keys 'max_length' must be >= 2 and 'batch_size' >= 1")


@dataclass
class LinearProbeConfig:
    """Frozen-encoder logistic-regression probes of one or more exports on one task (evaluation/linear_probe.py)."""

    model: list[str] = field(default_factory=list)  # HF model folders (exports)
    task: str = ""  # a GLUE name, NAME:FOLDER, or csv:PATH / json:PATH, as fine-tuning
    data: LocalTaskOptions = field(default_factory=LocalTaskOptions)
    layer: int = -1  # hidden-state index: -1 the last layer, 0 the embeddings
    features: list[str] = field(default_factory=lambda: ["mean", "cls"])  # sequence tasks; token tasks use the word vector
    c_grid: list[float] = field(default_factory=lambda: [0.01, 0.1, 1.0, 10.0])  # inverse L2 strengths tried by CV
    folds: int = 5  # stratified k-fold CV on the training split picks C
    max_train_samples: int = 0  # 0: all (a shuffled subset otherwise)
    max_eval_samples: int = 0
    max_length: int = 128
    batch_size: int = 64
    seed: int = 0
    out: Optional[str] = None  # the results JSON (one entry per model)
    overwrite: bool = False  # replace an earlier result at `out` (only results an evaluation command wrote)

    def validate(self) -> None:
        """Models and a task named; the grid and folds usable."""
        for key in ("model", "task"):
            if not getattr(self, key):
                raise ConfigError(f"config key '{key}' is required (--{key} or {key}=...)")
        if not self.c_grid or any(c <= 0 for c in self.c_grid):
            raise ConfigError(f"config key 'c_grid' needs positive values, got {self.c_grid}")
        if self.folds < 2:
            raise ConfigError(f"config key 'folds' must be >= 2, got {self.folds}")
        if self.max_length < 2 or self.batch_size < 1:
            raise ConfigError("config keys 'max_length' must be >= 2 and 'batch_size' >= 1")
        check_range("", self, ("seed",), at_least=0)
        check_sample_caps(self)


def check_sample_caps(cfg: FinetuneConfig | LinearProbeConfig) -> None:
    """`max_train_samples` and `max_eval_samples` are counts, 0 for all (-1 selected no row: fine-tuning never ended)."""
    for key in ("max_train_samples", "max_eval_samples"):
        if getattr(cfg, key) < 0:
            raise ConfigError(f"config key '{key}' must be >= 0 (0: all rows), got {getattr(cfg, key)}")


@dataclass
class SentenceEmbeddingConfig:
    """SentEval-style evaluation of frozen sentence embeddings (evaluation/sentence_embeddings.py)."""

    model: list[str] = field(default_factory=list)  # HF model folders (exports)
    suite: str = "runs/senteval"  # a folder with tasks.json (evaluation/senteval_data.py builds one)
    tasks: list[str] = field(default_factory=list)  # a subset of the suite's tasks (empty: all)
    features: list[str] = field(default_factory=lambda: ["mean", "cls"])
    layer: int = -1
    folds: int = 10  # outer stratified k-fold (SentEval: 10)
    inner_folds: int = 5  # inner k-fold that picks C inside each outer training part
    c_grid: list[float] = field(default_factory=lambda: [0.01, 0.1, 1.0, 10.0])
    max_examples: int = 0  # a seeded sample of this many rows per task (0: all)
    max_length: int = 128
    batch_size: int = 64
    seed: int = 0
    out: Optional[str] = None  # writes OUT.json and OUT.md
    overwrite: bool = False  # replace an earlier report at `out` (only one an evaluation command wrote)

    def validate(self) -> None:
        """Models named; folds, grid and lengths usable."""
        if not self.model:
            raise ConfigError("config key 'model' is required (--model or model=...)")
        if self.folds < 2 or self.inner_folds < 2:
            raise ConfigError(f"config keys 'folds' and 'inner_folds' must be >= 2, got {self.folds}, {self.inner_folds}")
        if not self.c_grid or any(c <= 0 for c in self.c_grid):
            raise ConfigError(f"config key 'c_grid' needs positive values, got {self.c_grid}")
        if self.max_length < 2 or self.batch_size < 1 or self.max_examples < 0:
            raise ConfigError("config keys 'max_length' must be >= 2, 'batch_size' >= 1 and 'max_examples' >= 0")
        check_range("", self, ("seed",), at_least=0)
