"""The data one training run reads, built in one place: the prepared dataset (fetched and checked once per node),
the masking its loader workers apply, and the training and validation loaders.

The objective's view of the masking (views built around it, as DeCLUTR's spans) comes in as a callable, so this
package knows no objective.
"""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from core import distributed as dist
from core.errors import ConfigError
from data_pipeline.batches import EVAL_STREAM, MaskingCollate
from data_pipeline.dataset_dir import SPLITS, DatasetDir
from data_pipeline.loader import LoaderConfig, build_loader, clean_stale_shared_memory, is_local_leader
from data_pipeline.masking import (MaskingConfig, batch_prediction_slots, build_masking, evaluation_masking,
                                   needs_word_starts)
from data_pipeline.shard_record import verify_split_once
from data_pipeline.shards import read_manifest, shard_files
from data_pipeline.tokenizer import load_tokenizer, word_start_table

# (the masking transform, pad id, cls id, sep id) -> the loader's per-sample transform
WrapMasking = Callable[[Any, int, int, int], Any]


def open_dataset(cfg: LoaderConfig) -> dict[str, Any]:
    """The prepared dataset's manifest; a remote dataset's metadata fetched and the shards' hashes checked first, once
    per node."""
    if is_local_leader():
        if cfg.remote:
            from data_pipeline.remote_dataset import fetch_metadata

            fetch_metadata(cfg.remote, Path(cfg.path))
        else:  # the files not checked as they are now: all of them only the first time
            folder = DatasetDir(cfg.path)
            for split in SPLITS:
                if folder.index(split).is_file():
                    if cfg.verify_hashes:
                        verify_split_once(folder.split(split))
                    else:  # the index still read as the project's, so that a damaged one is named before streaming's
                        shard_files(folder.split(split))
    dist.barrier()
    return read_manifest(cfg.path)


@dataclass
class RunData:
    """The dataset's manifest and the run's loaders (no validation loader when evaluation is off or the split is too
    small)."""

    manifest: dict[str, Any]
    train: Any
    validation: Optional[Any]
    notes: tuple[str, ...] = ()  # what `auto` chose, for the run's log


def open_run_data(cfg: LoaderConfig, masking: MaskingConfig, micro_batch_size: int, seed: int, validation: bool,
                  wrap: WrapMasking, pin_memory: bool = False) -> RunData:
    """The dataset opened (`open_dataset`) and loaders masked in their workers over it (validation shows every picked
    token as [MASK], the same each time); a validation loader only with `validation` and a split that holds a batch
    per rank."""
    manifest = open_dataset(cfg)
    tok = manifest["tokenizer"]
    per_step = micro_batch_size * dist.world_size()
    train_sequences = manifest["splits"]["train"]["sequences"]
    if train_sequences < per_step:
        raise ConfigError(f"the training split has {train_sequences} sequences, fewer than one batch "
                          f"(micro_batch_size {micro_batch_size} x {dist.world_size()} ranks)")
    word_starts = None
    if needs_word_starts(masking):
        word_starts = word_start_table(load_tokenizer(DatasetDir(cfg.path).tokenizer))
    specials = (tok["pad_id"], tok["cls_id"], tok["sep_id"])
    train_transform, eval_transform = (wrap(build_masking(
        m, tok["vocab_size"], tok["mask_id"], tok["special_ids"], word_starts=word_starts, pad_id=tok["pad_id"],
        cls_id=tok["cls_id"], sep_id=tok["sep_id"]), *specials) for m in (masking, evaluation_masking(masking)))
    stale = clean_stale_shared_memory(cfg)
    train = build_loader(cfg, "train", micro_batch_size, pin_memory=pin_memory,
                         collate_fn=MaskingCollate(train_transform, tok["pad_id"], seed,
                                                   batch_slots=functools.partial(batch_prediction_slots, masking)))
    notes = (f"{train.num_workers} loader worker(s) per rank (data.num_workers=auto)",) if cfg.num_workers == "auto" else ()
    if stale:
        notes += (f"removed {len(stale)} streaming shared-memory segment(s) no process held (a killed run's): "
                  f"{', '.join(sorted(stale)[:4])}{', ...' if len(stale) > 4 else ''}",)
    if not validation:
        return RunData(manifest, train, None, notes)
    held_out = manifest["splits"]["validation"]["sequences"]
    if held_out < per_step:
        notes += (f"warning: no validation (train.eval_every is set): the validation split has {held_out} sequence(s), "
                  f"fewer than one batch (micro_batch_size {micro_batch_size} x {dist.world_size()} ranks)",)
        return RunData(manifest, train, None, notes)
    # Unshuffled, over one canonical node whatever the training's: the batches each evaluation reads stay the same
    # when a resume asks for another num_canonical_nodes (which the training's own order keeps from its checkpoint).
    validation = build_loader(dataclasses.replace(cfg, num_canonical_nodes=1), "validation", micro_batch_size,
                              shuffle=False, pin_memory=pin_memory,
                              collate_fn=MaskingCollate(eval_transform, tok["pad_id"], seed, stream=EVAL_STREAM,
                                                        per_epoch=False, batch_slots=functools.partial(
                                                            batch_prediction_slots, evaluation_masking(masking))))
    return RunData(manifest, train, validation, notes)

