"""The layout of a prepared dataset's folder, in one place (as pretrain/run_dir.py is the run folder's).

    DATA/
      manifest.json           written last: what was prepared (tokenizer, sequence length, packing, splits, hashes)
      tokenizer/              the tokenizer the ids were made with (a Hugging Face tokenizer folder)
      train/, validation/     MDS shards, merged index.json, one sub-folder per part while preparing
      parts/                  while preparing: done markers of the finished parts (a re-run skips them)

The same names are the object keys of a dataset uploaded to object storage.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

MANIFEST = "manifest.json"
INDEX = "index.json"  # of a split, and of each part inside it while preparing
TOKENIZER = "tokenizer"
SPLITS = ("train", "validation")


@dataclass(frozen=True)
class DatasetDir:
    """Paths of one prepared dataset folder."""

    root: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", Path(self.root))

    @property
    def manifest(self) -> Path:
        """The manifest (present only when the dataset is complete)."""
        return self.root / MANIFEST

    @property
    def tokenizer(self) -> Path:
        """The tokenizer folder."""
        return self.root / TOKENIZER

    def split(self, name: str) -> Path:
        """A split's folder of shards."""
        return self.root / name

    def index(self, split: str) -> Path:
        """A split's merged MDS index."""
        return self.root / split / INDEX

    def is_complete(self) -> bool:
        """Whether the manifest, written last, is there."""
        return self.manifest.is_file()
