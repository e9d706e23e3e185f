"""Write packed sequences as MDS shards, check them against their hashes, and keep the manifest."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Optional

import numpy as np

from core.atomic_files import write_text_atomic
from core.errors import InputDataError, MissingFileError
from core.json_file import read_json
from data_pipeline.dataset_dir import INDEX, MANIFEST, DatasetDir


def token_dtype(vocab_size: int) -> np.dtype:
    """Smallest unsigned dtype that holds every token id (halves shard size for vocabularies < 65536)."""
    return np.dtype(np.uint16) if vocab_size <= np.iinfo(np.uint16).max + 1 else np.dtype(np.uint32)


class SplitWriter:
    """Writes one split's samples to MDS shards (zstd or uncompressed, sha1 + xxh64 hashes)."""

    def __init__(self, out_dir: Path, columns: dict[str, str], dtype: np.dtype, compression: str | None, size_limit: int,
                 unknown_id: Optional[int] = None) -> None:
        from data_pipeline.mds import MDSShardWriter

        self.dtype = dtype
        self.sequences = 0
        self.tokens = 0
        self.unknown_id = unknown_id  # the tokenizer's [UNK], counted: text the tokenizer could not represent
        self.unknown = 0
        # Token arrays get the vocabulary's dtype; the other columns keep theirs.
        self.columns = {k: (f"ndarray:{dtype.name}" if k == "input_ids" else ("ndarray:uint8" if v == "ndarray" else v))
                        for k, v in columns.items()}
        self._writer = MDSShardWriter(out_dir, self.columns, compression, size_limit)

    def write(self, sample: dict[str, Any]) -> None:
        """Append one sample."""
        ids = np.asarray(sample["input_ids"]).astype(self.dtype)
        self._writer.write({**sample, "input_ids": ids})
        self.sequences += 1
        self.tokens += len(ids)
        if self.unknown_id is not None:
            self.unknown += int(np.count_nonzero(ids == self.unknown_id))

    def write_rows(self, rows: np.ndarray) -> None:
        """Append each row of a 2-D token array as one sample (a writer whose only column is input_ids)."""
        self._writer.write_rows(rows.astype(self.dtype, copy=False))
        self.sequences += len(rows)
        self.tokens += rows.size
        if self.unknown_id is not None:
            self.unknown += int(np.count_nonzero(rows == self.unknown_id))

    def close(self) -> dict[str, int]:
        """Finish the shards and index; return the split's counts."""
        self._writer.finish()
        return {"sequences": self.sequences, "tokens": self.tokens, "unknown_tokens": self.unknown}


class CorruptShardError(InputDataError):
    """A shard's bytes do not match the hash recorded when it was written."""


def _index_shards(index: Any, index_path: Path) -> list[dict[str, Any]]:
    """The shard entries of a split's parsed index.json, checked for what `shard_files` reads of them."""
    def corrupt(why: str) -> CorruptShardError:
        return CorruptShardError(f"shard index '{index_path}' is corrupt: {why}; prepare the dataset again")

    shards = index.get("shards") if isinstance(index, dict) else None
    if not isinstance(shards, list):
        raise corrupt("it is not a JSON object with a 'shards' list")
    for number, shard in enumerate(shards):
        if not isinstance(shard, dict):
            raise corrupt(f"shard entry {number} is not a JSON object")
        for part in ("zip_data", "raw_data"):
            info = shard.get(part)
            if not info:
                continue
            name = info.get("basename") if isinstance(info, dict) else None
            # The names become paths under the split (and a remote dataset's cache): one that leaves it is refused.
            if not isinstance(name, str) or not name or Path(name).is_absolute() or ".." in Path(name).parts:
                raise corrupt(f"shard entry {number} has no plain relative '{part}.basename' (got {name!r})")
            hashes = info.get("hashes", {})
            if not isinstance(hashes, dict) or not isinstance(hashes.get("xxh64", ""), str):
                raise corrupt(f"shard entry {number} has malformed '{part}.hashes'")
    return shards


def shard_files(split_dir: Path) -> tuple[int, list[tuple[Path, Optional[str]]]]:
    """A split's shard count and every shard file its index names that must be there, with its xxh64 (None when the
    index records none); a missing, unreadable or malformed index or a missing file is refused."""
    index_path = split_dir / INDEX
    index = read_json(index_path, "shard index", "prepare the dataset again", CorruptShardError)
    shards = _index_shards(index, index_path)
    files = []
    for shard in shards:
        for part in ("zip_data", "raw_data"):
            info = shard.get(part)
            if not info:
                continue
            path = split_dir / info["basename"]
            if not path.is_file():
                if part == "raw_data" and shard.get("zip_data"):
                    continue  # only the compressed file is kept until streaming unpacks it
                raise CorruptShardError(f"shard '{path}' is missing")
            files.append((path, info.get("hashes", {}).get("xxh64")))
    return len(shards), files


def check_shard(path: Path, expected: Optional[str]) -> None:
    """Refuse a shard file whose bytes do not match its xxh64."""
    import xxhash

    if expected is not None and xxhash.xxh64(path.read_bytes()).hexdigest() != expected:
        raise CorruptShardError(f"shard '{path}' does not match its recorded hash (corrupt or modified)")


def verify_split(split_dir: Path) -> int:
    """Check every shard file of a split against the xxh64 hashes in its index; return the shard count."""
    count, files = shard_files(split_dir)
    for path, expected in files:
        check_shard(path, expected)
    return count


def write_manifest(out_dir: Path, manifest: dict[str, Any]) -> None:
    """Write manifest.json (what was built, from what, and how)."""
    write_text_atomic(out_dir / MANIFEST, json.dumps(manifest, indent=2) + "\n")


def data_fingerprint(manifest: dict[str, Any]) -> str:
    """What identifies a prepared dataset's contents, wherever it lies: tokenizer, shape, counts per split and source
    (not the paths, the date or the command, which differ for the same data moved or prepared again)."""
    sources = [{k: v for k, v in s.items() if k != "path"} for s in manifest.get("sources", [])]
    identity = {key: manifest.get(key) for key in ("seq_len", "packing", "pair_task", "token_dtype", "splits",
                                                   "replaced_characters")}
    identity.update(tokenizer=manifest.get("tokenizer", {}).get("hash"), sources=sources)
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]


# What the trainer reads of a manifest's tokenizer entry, each an int (special_ids: a list of them).
TOKENIZER_IDS = ("vocab_size", "pad_id", "cls_id", "sep_id", "mask_id")


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _check_manifest(manifest: Any, path: Path) -> None:
    """Refuse a manifest whose structure is not what `prepare` writes, in one line naming the key at fault."""
    def corrupt(why: str) -> InputDataError:
        return InputDataError(f"dataset manifest '{path}' is corrupt: {why}; prepare the dataset again")

    if not isinstance(manifest, dict):
        raise corrupt(f"it holds a JSON {type(manifest).__name__}, not an object")
    splits = manifest.get("splits")
    if not isinstance(splits, dict) or "train" not in splits:
        raise corrupt("it has no 'splits' object with a 'train' split")
    tokenizer = manifest.get("tokenizer", {})  # (a manifest that only counts sequences, as benchmarks write, has none)
    if not isinstance(tokenizer, dict) or not isinstance(tokenizer.get("files", []), list):
        raise corrupt("'tokenizer' is not an object with a 'files' list")
    # The names are joined into local paths (a remote dataset's cache among them): one that climbs out is refused.
    for name in [*tokenizer.get("files", []), *splits]:
        if not isinstance(name, str) or not name or "/" in name or "\\" in name or name in (".", ".."):
            raise InputDataError(f"'{path}' names a file or split {name!r} that is not a plain file name; "
                                 "prepare the dataset again")
    for name, counts in splits.items():
        if not isinstance(counts, dict) or not _is_count(counts.get("sequences")):
            raise corrupt(f"'splits.{name}.sequences' is not a count")
    if "tokenizer" in manifest:
        bad = [key for key in TOKENIZER_IDS if not _is_count(tokenizer.get(key))]
        specials = tokenizer.get("special_ids")
        if not isinstance(specials, list) or not all(_is_count(i) for i in specials):
            bad.append("special_ids")
        if bad:
            raise corrupt(f"'tokenizer.{bad[0]}' is missing or not a token id")
    if "seq_len" in manifest and not (_is_count(manifest["seq_len"]) and manifest["seq_len"] > 0):
        raise corrupt(f"'seq_len' is {manifest['seq_len']!r}, not a positive length")


def read_manifest(data_dir: str | Path) -> dict[str, Any]:
    """Read a prepared dataset's manifest, with one clear line when the folder is not one, the manifest is damaged or
    the tokenizer files it lists are missing or damaged."""
    from data_pipeline.tokenizer import check_tokenizer_folder, tokenizer_hash

    path = Path(data_dir) / MANIFEST
    if not path.is_file():
        raise MissingFileError(
            f"'{data_dir}' is not a prepared dataset (no {MANIFEST}); run `python -m data_pipeline prepare` first"
        )
    manifest = read_json(path, "dataset manifest", "prepare the dataset again")
    _check_manifest(manifest, path)
    files, recorded = manifest.get("tokenizer", {}).get("files"), manifest.get("tokenizer", {}).get("hash")
    advice = f"the dataset '{data_dir}' is incomplete or damaged: copy its tokenizer folder back whole, or prepare the " \
             "dataset again"
    if not files:  # a manifest from before the tokenizer's files were listed
        return manifest
    folder = DatasetDir(data_dir).tokenizer
    # Here, before a run writes anything, rather than when it copies the tokenizer or is exported.
    check_tokenizer_folder(folder, files, advice)
    if extra := sorted({p.name for p in folder.iterdir() if p.is_file()} - set(files)):
        raise InputDataError(f"tokenizer folder '{folder}' holds {', '.join(extra)}, which prepare did not write (its "
                             f"manifest lists {', '.join(files)}): remove it, or prepare the dataset again")
    # A damaged model file passes the checks above, trains, and leaves a run whose export is refused (its tokenizer is
    # not the one the checkpoint was trained with).
    if recorded and (found := tokenizer_hash(folder)) != recorded:
        raise InputDataError(f"tokenizer folder '{folder}' holds tokenizer {found}, not the {recorded} its dataset's "
                             f"manifest recorded; {advice}")
    return manifest
