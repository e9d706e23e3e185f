"""The README.md (model card) of an export: what was trained, on what, for how long, to which losses."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

from model.objectives import objective_class
from pretrain.run_dir import RunDir

def shown(path: Optional[str]) -> Optional[str]:
    """A path as a model card may show it: a local path by its last name only (the card is published; the machine's
    folders are not), a URL or a hub name as it is; each of a comma-separated list on its own."""
    if not path:
        return path

    def one(part: str) -> str:
        part = part.strip()
        if "://" in part or not (Path(part).is_absolute() or ".." in Path(part).parts or part.startswith("~")):
            return part
        return Path(part).name

    return ",".join(one(part) for part in path.split(","))


def _public(manifest: dict) -> dict:
    """The manifest without the command line and the local config it was prepared with, its sources by name."""
    out = {k: v for k, v in manifest.items() if k not in ("command", "config")}
    out["sources"] = [{**s, "path": shown(s.get("path"))} for s in manifest.get("sources", [])]
    return out


def final_losses(run_dir: RunDir, step: int) -> tuple[Optional[dict], Optional[dict]]:
    """The last train and validation rows of the run's metrics at or before `step`."""
    last = {split: None for split in ("train", "validation")}
    for row in run_dir.metric_rows():
        if row["step"] <= step and row["split"] in last:
            last[row["split"]] = row
    return last["train"], last["validation"]


def _deepspeed_text(train: dict, run_dir: RunDir) -> str:
    """How the run used DeepSpeed: the config the engine was given (saved in the run folder), else the run config."""
    path = run_dir.deepspeed_config
    zero = json.loads(path.read_text()).get("zero_optimization", {}) if path.is_file() else None
    if zero is None:  # a run from before the folder kept it: name the JSON file it used
        return f"DeepSpeed config `{shown(train.get('deepspeed_config')) or 'deepspeed_configs/base.json'}`"
    parts = [f"DeepSpeed ZeRO stage {zero.get('stage', 0)}"]
    parts += [f"{what} offload" for what, key in (("optimizer", "offload_optimizer"), ("parameter", "offload_param"))
              if zero.get(key, {}).get("device", "none") != "none"]
    if train.get("deepspeed_config"):
        parts.append(f"config `{shown(train['deepspeed_config'])}`")
    return ", ".join(parts)


def _losses_text(row: Optional[dict]) -> str:
    if row is None:
        return "not logged"
    keys = [k for k in row if k == "loss" or k.endswith("_loss") or k.endswith("accuracy")]
    return f"step {row['step']}: " + ", ".join(f"{k} {row[k]:.4f}" for k in keys)


def render(cfg: dict[str, Any], model_config: dict[str, Any], manifest: Optional[dict], state: dict[str, Any], tag: str,
           run_dir: RunDir, params: dict[str, int], classes: dict[str, str], version_limit: Optional[str] = None) -> str:
    """Markdown for the export's README.md; `classes` names each exported sub-folder's transformers class, and
    `version_limit` the transformers versions that alone load it as trained (None: every supported one)."""
    objective = cfg["objective"]["name"]
    spec = objective_class(objective)
    auto = spec.export_loader
    holds = spec.export_holds.format(root=classes.get(""), generator=classes.get("generator"))
    root = classes.get("") or ""
    lines = [
        "---",
        "library_name: transformers",
        f"tags: [contrastive-pretrain, {objective.replace('_', '-')}, fill-mask]" if auto == "AutoModelForMaskedLM"
        else f"tags: [contrastive-pretrain, {objective.replace('_', '-')}]",
        "---",
        "",
        f"# {objective} encoder (contrastive-pretrain, {tag})",
        "",
        f"Pre-trained with the `{objective}` objective by contrastive-pretrain. This folder holds {holds}.",
        "",
        "```python",
        f"from transformers import AutoTokenizer, {auto}",
        f"model = {auto}.from_pretrained(PATH)  # no custom code",
        "tokenizer = AutoTokenizer.from_pretrained(PATH)",
        "```",
        "",
        "`AutoModel`, `AutoModelForSequenceClassification` and `AutoModelForTokenClassification` load it too "
        "(the classification heads are new and need fine-tuning: `python -m pretrain finetune`"
        + (f"; its `{root}` holds the objective's 1-label classifier, so pass `ignore_mismatched_sizes=True` for "
           "another label count)." if root.endswith("Classification") else ")."),
        "",
        *_version_lines(version_limit),
    ]
    lines += [*_training_lines(cfg, state, tag, run_dir), *_model_lines(model_config, params), "## Data", "",
              *_data_lines(cfg, manifest), ""]
    return "\n".join(lines)


def _version_lines(version_limit: Optional[str]) -> list[str]:
    """Which transformers load the export as it was trained (the export was read back with the one that wrote it)."""
    import transformers

    if version_limit:
        return [f"**This model loads correctly only in transformers{version_limit}.** It uses BERT's relative position "
                "embeddings (`position_embedding_type` in config.json), which transformers 5.0 removed: transformers 5 "
                "loads it without an error but runs absolute positions and ignores the trained distance embeddings. "
                "`requires_transformers` in config.json says the same.", ""]
    return [f"Written with transformers {transformers.__version__} and read back with it to the trained model's outputs. "
            "The project's tests check that transformers 4.57 and 5.x give the same outputs for every model class it "
            "exports.", ""]


def _training_lines(cfg: dict[str, Any], state: dict[str, Any], tag: str, run_dir: RunDir) -> list[str]:
    """The card's training section: objective, masking, checkpoint, what was seen, recipe and final losses."""
    objective = cfg["objective"]["name"]
    step = int(state.get("step", 0))
    train_row, val_row = final_losses(run_dir, step)
    return [
        "## Training",
        "",
        f"- objective: `{objective}`, options: `{json.dumps(cfg['objective'].get(objective, {}), sort_keys=True)}`",
        f"- masking: `{json.dumps(cfg.get('masking', {}), sort_keys=True)}`",
        f"- checkpoint: `{tag}`: step {step} of max_steps {cfg['train']['max_steps']}",
        f"- seen: {int(state.get('samples_seen', 0)):,} sequences, {int(state.get('tokens_seen', 0)):,} tokens "
        f"(non-padding), in {float(state.get('elapsed_s', 0.0)):.0f} s of training",
        f"- global batch {cfg['train']['global_batch_size']}, optimizer `{cfg['optimizer']['name']}` lr {cfg['optimizer']['lr']}, "
        f"schedule `{cfg['schedule']['decay']}` with {cfg['schedule']['warmup_steps']} warmup steps, precision "
        f"`{cfg['train']['precision']}`, {_deepspeed_text(cfg['train'], run_dir)}",
        f"- started from: `{shown(cfg['model'].get('init_from')) or 'random initialisation'}`",
        f"- final training losses ({_losses_text(train_row)})",
        f"- final validation losses ({_losses_text(val_row)})",
        "",
    ]


def _model_lines(model_config: dict[str, Any], params: dict[str, int]) -> list[str]:
    """The card's model section: shape and parameter counts."""
    return [
        "## Model",
        "",
        f"- {model_config.get('model_type')}: {model_config.get('num_hidden_layers')} layers, hidden {model_config.get('hidden_size')}, "
        f"{model_config.get('num_attention_heads')} heads, FFN {model_config.get('intermediate_size')}, "
        f"vocabulary {model_config.get('vocab_size')}, max positions {model_config.get('max_position_embeddings')}",
        "- parameters: " + ", ".join(f"{name or 'root'} {n:,}" for name, n in params.items()),
        "",
    ]


def _data_lines(cfg: dict[str, Any], manifest: Optional[dict]) -> list[str]:
    """The card's data section: the prepared dataset, its tokenizer, splits and sources, and the manifest itself."""
    lines: list[str] = []
    if manifest is None:
        lines.append(f"- prepared dataset: `{shown(cfg['data']['path'])}` (its manifest was not found)")
    else:
        tok = manifest.get("tokenizer", {})
        lines.append(f"- prepared dataset: `{shown(cfg['data']['path'])}`, sequence length {manifest.get('seq_len')}, packing "
                     f"`{manifest.get('packing')}`")
        lines.append(f"- tokenizer: vocabulary {tok.get('vocab_size')}, hash `{tok.get('hash', '?')}`")
        for split, info in manifest.get("splits", {}).items():
            lines.append(f"- {split}: {info.get('sequences', '?'):,} sequences, {info.get('tokens', '?'):,} tokens"
                         if isinstance(info.get("sequences"), int) and isinstance(info.get("tokens"), int)
                         else f"- {split}: {json.dumps(info)}")
        for source in manifest.get("sources", []):
            lines.append(f"- source: `{source.get('kind')}` `{shown(source.get('path'))}` (weight {source.get('weight', 1)}, "
                         f"{source.get('documents', '?')} documents)")
        lines += ["", "<details><summary>manifest.json</summary>", "", "```json", json.dumps(_public(manifest), indent=2), "```",
                  "", "</details>"]
    return lines
