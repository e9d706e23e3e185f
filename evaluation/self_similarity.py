"""TaCL's layer-wise self-similarity: how alike the token representations within a sentence are.

For a sentence of n tokens and layer l (1..L, the outputs of the Transformer layers; the
embeddings are not a layer here; layer L is the model's `last_hidden_state`, what its heads and
losses read, which for ModernBERT is after `final_norm`), the statistic is the cosine of every unordered pair of distinct
tokens. Sentences are pooled by pairs, as TaCL's analysis does (yxuansu/TaCL,
analysis/layerwise_intra_sentence_similarity.py and plot_result.py):

    self_similarity(l) = sum over sentences of sum_{i<j} cos(h_i^l, h_j^l) / sum over sentences of n(n-1)/2

so a long sentence weighs more than a short one. Special tokens: the original encodes each line as
"[CLS] text [SEP]" and keeps both in the statistic (`special_tokens="include"`, the default);
`"exclude"` drops [CLS]/[SEP]/[PAD] and every other special token from the pairs. Sentences with
fewer than 2 counted tokens add nothing. Lines longer than `max_length` tokens are truncated.
"""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Literal, Sequence

import torch

from core.errors import ConfigError, InputDataError
from core.input_paths import check_input_file
from evaluation.checks import export_tokenizer, usable_length
from model.backbones.base import LOAD_DTYPE, forward_input_names, layer_states, load_pretrained

log = logging.getLogger("pretrain.evaluate")


def read_sentences(path: str | Path) -> list[str]:
    """Non-empty lines of a UTF-8 text file (one sentence per line)."""
    path = check_input_file(path, "--text", example="sentences.txt")
    try:
        lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
    except UnicodeDecodeError as exc:
        raise InputDataError(f"--text '{path}' is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    lines = [line for line in lines if line]
    if not lines:
        raise InputDataError(f"--text '{path}' has no non-empty lines")
    return lines


def pair_sums(hidden: torch.Tensor, keep: torch.Tensor) -> tuple[float, float]:
    """(sum of cos over unordered pairs of kept tokens, number of such pairs) for one sequence [n, h]."""
    h = torch.nn.functional.normalize(hidden[keep].double(), dim=-1)
    n = h.shape[0]
    if n < 2:
        return 0.0, 0.0
    cos = h @ h.T
    return float((cos.sum() - cos.diagonal().sum()) / 2), n * (n - 1) / 2


@torch.no_grad()
def self_similarity(model_dir: str | Path, sentences: Sequence[str], special_tokens: Literal["include", "exclude"] = "include",
                    max_length: int = 512, batch_size: int = 32) -> list[float]:
    """Self-similarity of layers 1..L of the model in `model_dir` over `sentences`."""
    from transformers import AutoModel

    tokenizer = export_tokenizer(model_dir)
    model = load_pretrained(AutoModel, model_dir, dtype=LOAD_DTYPE).eval()
    max_length = usable_length(model.config, max_length)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model.to(device)
    accepted = forward_input_names(model)
    sums = pair_counts = None
    start = time.time()
    for first in range(0, len(sentences), batch_size):
        enc = tokenizer(list(sentences[first:first + batch_size]), truncation=True, max_length=max_length, padding=True,
                        return_tensors="pt", return_special_tokens_mask=True)
        special = enc.pop("special_tokens_mask").bool()
        keep = enc["attention_mask"].bool()
        if special_tokens == "exclude":
            keep &= ~special
        inputs = {k: v.to(device) for k, v in enc.items() if k in accepted}  # ModernBERT takes no token_type_ids
        out = model(**inputs, output_hidden_states=True)
        hidden = layer_states(out)[1:]
        if sums is None:
            sums, pair_counts = [0.0] * len(hidden), [0.0] * len(hidden)
        for layer, states in enumerate(hidden):
            for row in range(states.shape[0]):
                s, c = pair_sums(states[row].cpu(), keep[row])
                sums[layer] += s
                pair_counts[layer] += c
        done = min(first + batch_size, len(sentences))
        if done == len(sentences) or (first // batch_size) % 20 == 0:
            rate = done / max(time.time() - start, 1e-9)
            log.info("%s: %d/%d sentences, %.0f sentences/s, ETA %.0fs", model_dir, done, len(sentences), rate,
                     (len(sentences) - done) / rate)
    if not pair_counts or not any(pair_counts):
        raise InputDataError("--text: no sentence has two counted tokens: nothing to measure")
    return [s / c for s, c in zip(sums, pair_counts)]


def model_spec(spec: str) -> tuple[str, str]:
    """`LABEL=PATH` or `PATH` -> (label, path); models given one label are seeds of one line in the figure."""
    label, sep, path = spec.partition("=")
    if sep and label and not Path(spec).exists():
        return label, path
    return spec, spec


def check_depths(labels: dict[str, str]) -> None:
    """Refuse, before any model runs, models given one label (one model's seeds) whose config.json says another
    depth: their layer-wise values cannot be averaged."""
    from transformers import AutoConfig

    depths: dict[str, set[int]] = {}
    for path, label in labels.items():
        depths.setdefault(label, set()).add(AutoConfig.from_pretrained(path).num_hidden_layers)
    for label, found in depths.items():
        if len(found) > 1:
            raise ConfigError(f"--model: the models labelled '{label}' differ in depth ({sorted(found)} layers); one "
                              "label is one model's seeds")


def by_label(results: dict[str, list[float]], labels: dict[str, str]) -> dict[str, dict]:
    """Per label: the layer-wise mean, sample std, min and max over its models (its seeds), and which models."""
    groups: dict[str, list[str]] = {}
    for model in results:
        groups.setdefault(labels.get(model, model), []).append(model)
    out = {}
    for label, models in groups.items():
        if len({len(results[m]) for m in models}) > 1:
            raise ConfigError(f"--model: the models labelled '{label}' differ in depth; one label is one model's seeds")
        table = torch.tensor([results[m] for m in models], dtype=torch.float64)
        std = table.std(dim=0, unbiased=True) if len(models) > 1 else torch.zeros(table.shape[1], dtype=torch.float64)
        out[label] = {"models": models, "mean": table.mean(0).tolist(), "std": std.tolist(),
                      "min": table.min(0).values.tolist(), "max": table.max(0).values.tolist()}
    return out


def write_report(results: dict[str, list[float]], out: str | Path, meta: dict, labels: dict[str, str] | None = None,
                 reference: dict[str, dict[int, float]] | None = None,
                 reference_title: str = "Reference values") -> tuple[Path, Path]:
    """OUT.json (per model and per label, per layer) and OUT.png: one line per label, its seeds' range shaded.

    `reference` (label -> {layer: value}) is drawn in a second panel beside it, e.g. the values read off a
    paper's figure, whose model may be deeper than the ones measured."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from core.atomic_files import save_figure_atomic
    from evaluation.results_files import write_results_json

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    json_path, png_path = out.with_suffix(".json"), out.with_suffix(".png")
    groups = by_label(results, labels or {})
    payload = {**meta, "self_similarity": results, "by_label": groups}
    if reference:
        payload["reference"] = {name: {str(k): v for k, v in values.items()} for name, values in reference.items()}
    write_results_json(json_path, payload)
    fig, axes = plt.subplots(1, 2 if reference else 1, figsize=(11 if reference else 6, 4), squeeze=False)
    ax = axes[0][0]
    for label, g in groups.items():
        layers = range(1, len(g["mean"]) + 1)
        seeds = f" ({len(g['models'])} seeds, range shaded)" if len(g["models"]) > 1 else ""
        line, = ax.plot(layers, g["mean"], marker="o", label=label + seeds)
        if len(g["models"]) > 1:
            ax.fill_between(layers, g["min"], g["max"], color=line.get_color(), alpha=0.2)
    ax.set_xticks(range(1, 1 + max(len(g["mean"]) for g in groups.values())))
    ax.set_xlabel("layer")
    ax.set_ylabel("self-similarity (mean pairwise cosine)")
    ax.set_title("Token self-similarity within a sentence")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    if reference:
        ref_ax = axes[0][1]
        for name, values in reference.items():
            layers = sorted(values)
            ref_ax.plot(layers, [values[k] for k in layers], marker="s", linestyle="--", label=name)
        ref_ax.set_xlabel("layer")
        ref_ax.set_title(reference_title)
        ref_ax.legend(fontsize=8)
        ref_ax.grid(alpha=0.3)
    save_figure_atomic(fig, png_path)
    plt.close(fig)
    return json_path, png_path
