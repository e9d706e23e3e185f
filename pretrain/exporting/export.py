"""Export a run's checkpoint as Hugging Face folders, through DeepSpeed's fp32 consolidation (no engine needed)."""
from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Optional

import torch
import yaml

from core.atomic_files import check_overwrite, mark_output, prepare_output, publish, readable_as_umask_allows
from core.config_io import config_to_dict, load_config
from core.distributed import set_up_for_this_call
from core.errors import CheckpointError
from data_pipeline.dataset_dir import DatasetDir
from data_pipeline.tokenizer import copy_tokenizer_folder, make_portable, tokenizer_hash
from model.backbones import backbone_for
from model.backbones.base import forward_input_names
from model.encoder import config_from_dict, trained_keys
from model.objectives import build_objective
from pretrain.checkpointing import checkpoint as ckpt
from pretrain.exporting import model_card
from pretrain.checkpointing.checkpoint_data import check_tag_is_data, read_as_data
from pretrain.checkpointing.checkpoint_dir import COMPLETE, TAG_RE, CheckpointDir
from pretrain.exporting.export_check import check_loads_the_same
from pretrain.config import RunConfig
from pretrain.run_dir import CHECKPOINTS_DIR, CONFIG_FILE, DATA_MANIFEST_FILE, MODEL_CONFIG_FILE, RunDir

log = logging.getLogger("pretrain.exporting.export")


def resolve_checkpoint(path: str | Path) -> tuple[RunDir, Path, str]:
    """(run dir, checkpoint dir, tag) from either RUN_DIR (newest complete tag) or RUN_DIR/checkpoints/TAG."""
    path = Path(path)
    if TAG_RE.match(path.name) and path.parent.name == CHECKPOINTS_DIR:
        folder = CheckpointDir(path.parent)
        if not folder.is_complete(path.name):
            raise CheckpointError(f"checkpoint '{path}' is incomplete (no {COMPLETE} marker)")
        if problem := folder.damage(path.name):
            raise CheckpointError(f"checkpoint '{path}' is damaged: {problem}")
        return RunDir(path.parent.parent), path.parent, path.name
    run_dir = RunDir(path)
    if run_dir.config.is_file():
        ckpt_dir = run_dir.checkpoints
        tag, damaged = CheckpointDir(ckpt_dir).newest_intact()
        for bad, why in damaged:
            log.warning("checkpoint %s is damaged (%s): exporting an older one", ckpt_dir / bad, why)
        if tag is None:
            raise CheckpointError(f"run '{run_dir.root}' has no intact complete checkpoint in {ckpt_dir}"
                                  + "".join(f"; {bad} is damaged: {why}" for bad, why in damaged))
        return run_dir, ckpt_dir, tag
    raise CheckpointError(f"'{path}' is neither a run folder (with {CONFIG_FILE}) nor a checkpoint tag folder in one")


def _manifest(config_dir: Path, run_dir: RunDir, cfg: RunConfig) -> Optional[dict]:
    """The data manifest saved with the checkpoint (or the run), else the dataset's own if it is still there."""
    for path in (config_dir / DATA_MANIFEST_FILE, run_dir.data_manifest, DatasetDir(cfg.data.path).manifest):
        if path.is_file():
            return json.loads(path.read_text())
    return None


def _client_state(tag_dir: Path, trust: bool) -> dict:
    """Step, samples, tokens and time of a checkpoint (the trainer's client state in the rank-0 model file)."""
    path = ckpt.rank0_module_states(tag_dir)
    if path is None:
        return {}
    state = torch.load(path, map_location="cpu", weights_only=False) if trust else read_as_data(path)
    return {k: state[k] for k in ("step", "samples_seen", "tokens_seen", "elapsed_s") if k in state}


EXPORT = "export"


def _legacy_export(folder: Path) -> bool:
    """An export written before folders carried their marker: a model card of ours beside a config.json."""
    card = folder / "README.md"
    return (folder / "config.json").is_file() and card.is_file() and "tags: [contrastive-pretrain" in card.read_text()


def _check_tokenizer(run_dir: RunDir, config_dir: Path) -> None:
    """The run folder's tokenizer must be the one the checkpoint was trained with (its manifest names the hash)."""
    saved = config_dir / DATA_MANIFEST_FILE
    want = json.loads(saved.read_text()).get("tokenizer", {}).get("hash") if saved.is_file() else None
    if want is None or not run_dir.tokenizer.is_dir():
        return  # a run from before checkpoints carried their manifest
    have = tokenizer_hash(run_dir.tokenizer)
    if have != want:
        raise CheckpointError(f"checkpoint in {config_dir} was trained with tokenizer {want}, but {run_dir.tokenizer} "
                              f"holds tokenizer {have}: refusing to ship a model with another tokenizer's files")


def write_tokenizer(tokenizer_dir: Path, model: torch.nn.Module, target: Path) -> None:
    """The run's tokenizer files beside an exported model, set to emit only the inputs that model's forward takes.

    ModernBERT's forward has no `token_type_ids`; a tokenizer that emits them breaks
    `model(**tokenizer(text, return_tensors="pt"))`, the way users call an encoder."""
    copy_tokenizer_folder(tokenizer_dir, target)
    config_path = Path(target) / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8")) if config_path.is_file() else {}
    config["model_input_names"] = forward_input_names(model)
    config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    make_portable(target)  # a dataset prepared before its tokenizer was saved portably


def export(checkpoint: str | Path, out_dir: str | Path, overwrite: bool = False, trust_checkpoint: bool = False) -> Path:
    """Write the objective's Hugging Face models, with tokenizer files, to `out_dir` (atomically); the checkpoint's
    files are read as data only unless `trust_checkpoint`."""
    with set_up_for_this_call():
        return _export(checkpoint, out_dir, overwrite, trust_checkpoint)


def _trained_config(config_dir: Path, saved_model: dict) -> RunConfig:
    """The run config saved beside the checkpoint, its `model.*` keys naming the model its model config recorded."""
    # The init_from folder is not read: a run started before the model.* keys had to match that folder may have saved
    # a model group's family and shape beside another's weights, and the folder may have changed since.
    # The training loop's speed options change no weight, and their checks are of the launch's environment (fused
    # Q/K/V needs transformers 5): an export, perhaps in another environment, does not repeat them.
    launch_only = ["train.fused_qkv=false", "train.compile=false", "train.vocab_loss_chunk=0"]
    cfg = load_config(RunConfig, config_dir / CONFIG_FILE, [*trained_keys(saved_model), "model.init_from=null",
                                                            *launch_only])
    # The card still names the folder the run started from.
    cfg.model.init_from = (yaml.safe_load((config_dir / CONFIG_FILE).read_text()).get("model") or {}).get("init_from")
    return cfg


def _export(checkpoint: str | Path, out_dir: str | Path, overwrite: bool, trust_checkpoint: bool) -> Path:
    run_dir, ckpt_dir, tag = resolve_checkpoint(checkpoint)
    # The checkpoint's own copies of the configs win over the run folder's (a later launch may
    # have rewritten those).
    config_dir = ckpt_dir / tag if (ckpt_dir / tag / CONFIG_FILE).is_file() else run_dir.root
    out_dir = Path(out_dir)
    reads = (ckpt_dir / tag, run_dir.tokenizer)
    check_overwrite(out_dir, overwrite, EXPORT, reads, _legacy_export)  # before the slow consolidation
    _check_tokenizer(run_dir, config_dir)
    saved_model = json.loads((config_dir / MODEL_CONFIG_FILE).read_text())
    cfg = _trained_config(config_dir, saved_model)
    # The attention kernel is a training choice (flash-attn needs a GPU); the export is built, run and read back on
    # the CPU with transformers' default.
    model_config = config_from_dict(saved_model, "sdpa", f"checkpoint '{ckpt_dir / tag}'")
    backbone = backbone_for(model_config)  # the run's (an ELECTRA export's classes are no backbone of their own)
    limit = backbone.version_limit(model_config)
    objective = build_objective(cfg.objective, model_config)
    if not trust_checkpoint:
        check_tag_is_data(ckpt_dir / tag)  # before DeepSpeed's consolidation reads them with pickle
    state = ckpt.fp32_weights(ckpt_dir, tag)
    missing, unexpected = objective.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise CheckpointError(f"checkpoint {ckpt_dir / tag} does not match the model: missing {missing[:5]}, unexpected {unexpected[:5]}")
    models = objective.hf_models()
    card = model_card.render(
        config_to_dict(cfg), model_config.to_dict(), _manifest(config_dir, run_dir, cfg), _client_state(ckpt_dir / tag, trust_checkpoint), tag,
        run_dir, {sub: sum(p.numel() for p in m.parameters()) for sub, m in models.items()},
        {sub: type(m).__name__ for sub, m in models.items()}, limit)
    tmp = prepare_output(out_dir, overwrite, EXPORT, reads, _legacy_export)
    try:
        for sub, model in models.items():
            target = tmp / sub if sub else tmp
            if limit:  # config.json says it too: the card may not travel with the weights
                model.config.requires_transformers = limit
            backbone.for_export(model.config)
            model.save_pretrained(str(target))
            write_tokenizer(run_dir.tokenizer, model, target)
            check_loads_the_same(target, model, f"the {sub or 'root'} model ({type(model).__name__})")
        for name, head in objective.side_heads().items():
            head.save(tmp, name)
        (tmp / "README.md").write_text(card, encoding="utf-8")
        mark_output(tmp, EXPORT)
        readable_as_umask_allows(tmp)
        publish(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info("exported %s (%s) to %s", ckpt_dir / tag, cfg.objective.name, out_dir)
    return out_dir
