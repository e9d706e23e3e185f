"""What a resume may change, checked before anything of the run is written (README: "What is refused").

| the launch, against the checkpoint        | outcome                                                     |
|-------------------------------------------|-------------------------------------------------------------|
| same tokenizer, data, objective and shape | resume                                                      |
| another tokenizer                         | refused: embeddings index the checkpoint's tokenizer's ids  |
| other data, same tokenizer                | refused, unless train.allow_new_data=true (sample order    |
|                                           | starts afresh; data_history.jsonl records both datasets)    |
| another objective or model shape          | refused: start from an export (model.init_from)             |
| an option that changes the parameters     | refused once the model is built (parameter_layout.py)       |
| another ZeRO stage                        | refused (resume_choice.py); another world size: resume      |

A checkpoint folder carries the run files it was saved with (config.yaml, model_config.json,
data_manifest.json); this launch's are held in memory until the checks pass.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import yaml

from core.errors import ConfigError
from data_pipeline.shards import data_fingerprint
from model.backbones.base import check_saved_config
from pretrain.run_dir import CONFIG_FILE, DATA_MANIFEST_FILE, MODEL_CONFIG_FILE

# HF config keys that decide the parameters' shapes (of every family registered).
SHAPE_KEYS = ("model_type", "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
              "max_position_embeddings", "type_vocab_size", "embedding_size", "num_hidden_groups", "d_model", "n_layer",
              "n_head", "d_inner")


def _saved(tag_dir: Path, name: str) -> Optional[str]:
    path = tag_dir / name
    return path.read_text() if path.is_file() else None


def check_resume(tag_dir: Path, run_files: dict[str, str], allow_new_data: bool) -> Optional[dict[str, Any]]:
    """Refuse (ConfigError) a launch that cannot resume this checkpoint; return the checkpoint's manifest when the
    data is new and allowed (None otherwise)."""
    saved_manifest, now_manifest = _saved(tag_dir, DATA_MANIFEST_FILE), run_files.get(DATA_MANIFEST_FILE)
    manifests = (json.loads(saved_manifest), json.loads(now_manifest)) if saved_manifest and now_manifest else None
    if manifests:
        was, now = manifests
        old_tok, new_tok = (m.get("tokenizer", {}).get("hash") for m in (was, now))
        if old_tok != new_tok:
            raise ConfigError(f"checkpoint {tag_dir} was trained with tokenizer {old_tok}, and data.path has tokenizer {new_tok}: "
                              "the embeddings index the first one's ids; resume on data prepared with the run's tokenizer "
                              "(tokenizer.pretrained=RUN/tokenizer), or start a new run from an export (model.init_from)")
    saved_config, now_config = _saved(tag_dir, CONFIG_FILE), run_files.get(CONFIG_FILE)
    if saved_config and now_config:
        was, now = (yaml.safe_load(t)["objective"]["name"] for t in (saved_config, now_config))
        if was != now:
            raise ConfigError(f"checkpoint {tag_dir} was trained with objective.name={was}, and this launch sets {now}: "
                              "a checkpoint resumes only its own objective; start a new run from its export (model.init_from)")
    saved_model, now_model = _saved(tag_dir, MODEL_CONFIG_FILE), run_files.get(MODEL_CONFIG_FILE)
    if saved_model:
        check_saved_config(json.loads(saved_model), f"checkpoint {tag_dir}")  # e.g. relative positions under 5.x
    if saved_model and now_model:
        was, now = json.loads(saved_model), json.loads(now_model)
        changed = [f"{k} {was.get(k)} -> {now.get(k)}" for k in SHAPE_KEYS if was.get(k) != now.get(k)]
        # transformers 5 writes no position_embedding_type: absent is absolute
        positions = [d.get("position_embedding_type", "absolute") for d in (was, now)]
        changed += [f"position_embedding_type {positions[0]} -> {positions[1]}"] if positions[0] != positions[1] else []
        if changed:
            raise ConfigError(f"checkpoint {tag_dir} holds another model shape than this launch builds ({', '.join(changed)}): "
                              "a checkpoint resumes only its own shape; start a new run from its export (model.init_from)")
    if manifests is None or data_fingerprint(manifests[0]) == data_fingerprint(manifests[1]):
        return None
    was, now = manifests
    if not allow_new_data:
        raise ConfigError(f"checkpoint {tag_dir} was trained on other data than data.path (dataset {data_fingerprint(was)}, "
                          f"now {data_fingerprint(now)}; same tokenizer): set train.allow_new_data=true to continue "
                          "pre-training on it (its sample order starts afresh), or point data.path at the run's dataset")
    return was
