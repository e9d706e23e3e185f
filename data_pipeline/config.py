"""Typed configuration for `python -m data_pipeline prepare`."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Optional

from core.config_io import check_range
from core.errors import ConfigError
from core.object_store import is_remote


@dataclass
class SourceConfig:
    """One raw-text source: local files (text/json/parquet) or a hub dataset."""

    kind: Literal["text", "json", "parquet", "hub"] = "text"
    # Local kinds: a file, a glob, or a comma-separated list of them. Hub: the dataset id, or the folder it was
    # downloaded to (`hf download ID --repo-type dataset --local-dir DIR`), read offline.
    path: str = ""
    # Hub only: the dataset config name (e.g. "20231101.en") and split.
    name: Optional[str] = None
    split: str = "train"
    text_column: str = "text"
    # Text files: a document is a blank-line-separated paragraph, one line, or the whole file.
    text_documents: Literal["paragraph", "line", "document"] = "paragraph"
    weight: float = 1.0

    def validate(self) -> None:
        """Reject sources that cannot be read."""
        if not self.path:
            raise ConfigError("config key 'sources[].path' is empty")
        if self.weight <= 0:
            raise ConfigError(f"config key 'sources[].weight' must be > 0, got {self.weight}")


@dataclass
class TokenizerConfig:
    """Train a sentencepiece model here, or reuse an existing Hugging Face tokenizer folder."""

    # A folder that AutoTokenizer loads; when set, nothing is trained.
    pretrained: Optional[str] = None
    model_type: Literal["unigram", "bpe"] = "unigram"
    vocab_size: int = 8000
    lowercase: bool = False
    byte_fallback: bool = False
    character_coverage: float = 0.9995
    # Train on at most this many documents (a bounded sample keeps memory flat on big corpora).
    max_training_documents: int = 200_000

    def validate(self) -> None:
        """Reject vocabularies too small to hold the special tokens, and an empty training sample."""
        if self.pretrained is None and self.vocab_size < 64:
            raise ConfigError(f"config key 'tokenizer.vocab_size' must be >= 64, got {self.vocab_size}")
        if self.max_training_documents < 1:
            raise ConfigError("config key 'tokenizer.max_training_documents' must be >= 1, got "
                              f"{self.max_training_documents}")
        # sentencepiece's own bounds, which it checks only after the corpus has been read and sampled.
        check_range("tokenizer", self, ("character_coverage",), at_least=0.98, at_most=1)


@dataclass
class PrepareConfig:
    """Everything `prepare` needs: sources, tokenizer, packing and the output folder."""

    # A folder, or an object store prefix (s3://bucket/prefix, gs://, ...): the dataset is then built in
    # `staging_dir` and uploaded, each part's shards as soon as the part is written (the staging disk holds the
    # 2 × num_workers parts at most, not the dataset), each split's index after its shards, the manifest last.
    output_dir: str = "runs/data"
    # Local folder where a dataset bound for object storage is built (default: a temporary folder in $TMPDIR,
    # removed after the upload; a named one keeps the metadata, not the shards). A job array writing to a bucket
    # needs one on a filesystem all its tasks share.
    staging_dir: Optional[str] = None
    sources: list[SourceConfig] = field(default_factory=list)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    seq_len: int = 128
    # full: RoBERTa FULL-SENTENCES across documents; document: never crosses a document boundary;
    # pairs: BERT segment A/B pairs with token_type_ids and an NSP or SOP label.
    packing: Literal["full", "document", "pairs"] = "full"
    pair_task: Literal["nsp", "sop"] = "nsp"
    # pairs mode: the chance that a sequence is shorter than seq_len (BERT's short_seq_prob).
    short_seq_prob: float = 0.1
    # How many documents back a pairs-mode worker remembers, to draw NSP's random B segments from.
    nsp_document_pool: int = 1000
    # With several weighted sources: stop at the first exhausted source, or repeat exhausted
    # sources until every one has been read once. Either way the proportions follow the weights.
    mixture_stopping: Literal["first_exhausted", "all_exhausted"] = "first_exhausted"
    # Stop after this many documents (0: no limit).
    max_documents: int = 0
    # Processes that read, tokenize, pack and write parts of the input, one core each (0: every CPU
    # this process may use, SLURM's --cpus-per-task included). The output does not depend on it.
    num_workers: int = 0
    # The input is cut into parts of about this many bytes (at document boundaries), each read and
    # written by one process on its own. 0: about 1/256 of the corpus, between 4 and 64 MiB. The
    # output depends on it (each part is packed on its own), so keep it fixed to reproduce a dataset.
    part_bytes: int = 0
    # The share of documents in the validation split: a document goes there when a seeded hash of its
    # text falls below this fraction (so copies of a document always share a split).
    val_fraction: float = 0.01
    # What to do with bytes that are not UTF-8: stop with an error, or replace them with U+FFFD.
    encoding_errors: Literal["strict", "replace"] = "strict"
    # The shards' compression: zstd, zstd:<1-22> or null (none). auto: zstd for a bucket (a run downloads less),
    # none for a local folder, where streaming would unpack every zstd shard beside its packed copy on first read
    # and keep both, growing the dataset folder (which would have to be writable).
    compression: Optional[str] = "auto"
    shard_size_limit: int = 1 << 26
    overwrite: bool = False
    seed: int = 0

    def __post_init__(self) -> None:
        if self.compression == "auto":  # resolved at once: the manifest and every writer see what is written
            self.compression = "zstd" if is_remote(self.output_dir) else None

    def validate(self) -> None:
        """Check values that the type alone cannot."""
        if not self.sources:
            raise ConfigError("config key 'sources' is empty: name at least one text source")
        if self.seq_len < 8:
            raise ConfigError(f"config key 'seq_len' must be >= 8, got {self.seq_len}")
        if self.max_documents < 0:
            raise ConfigError(f"config key 'max_documents' must be >= 0 (0: no limit), got {self.max_documents}")
        if self.nsp_document_pool < 1:
            raise ConfigError(f"config key 'nsp_document_pool' must be >= 1, got {self.nsp_document_pool}")
        if self.num_workers < 0:
            raise ConfigError(f"config key 'num_workers' must be >= 0 (0: every available CPU), got {self.num_workers}")
        if not 0 < self.shard_size_limit < 2**32:  # MDS offsets are 32-bit
            raise ConfigError(f"config key 'shard_size_limit' must be in (0, 2**32) bytes, got {self.shard_size_limit}")
        if self.part_bytes < 0:
            raise ConfigError(f"config key 'part_bytes' must be >= 0 (0: automatic), got {self.part_bytes}")
        from data_pipeline.mds import check_compression

        check_compression(self.compression)
        if not 0.0 <= self.short_seq_prob <= 1.0:
            raise ConfigError(f"config key 'short_seq_prob' must be in [0, 1], got {self.short_seq_prob}")
        if not 0.0 <= self.val_fraction < 0.5:
            raise ConfigError(f"config key 'val_fraction' must be in [0, 0.5), got {self.val_fraction}")
        if self.seed < 0:  # the tokenizer's sampling, the split's hash and the mixture's generator take no sign
            raise ConfigError(f"config key 'seed' must be >= 0, got {self.seed}")
