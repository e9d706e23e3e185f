"""Exports written under one transformers and read under another, as users on either major read them.

Usage: python tests/helpers/export_roundtrip.py READ_DIR WRITE_DIR PREPARED_DATASET
prints {"read": {case: largest difference}, "written": [case, ...]} as JSON. `read` loads each folder of READ_DIR
(written under another transformers) with transformers' own classes only, what a user has, and compares their
outputs with the recorded ones; `write` builds every case's live models with the project's code, saves them as the
exporter does, and records their outputs on a fixed input. One process does both (a start-up costs ~10 s); run it
under the other major (PYTHONPATH=the 4.x overlay) than the one that wrote READ_DIR.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from pretrain.exporting.export_check import output_tensors

# backbone options, objectives: every exported class family (BERT, ELECTRA's discriminator and generator, ModernBERT
# with a non-default layer pattern and window, ALBERT, XLNet), and BERT's relative positions where they exist.
CASES = {
    "bert": ({"architecture": "bert"}, ("mlm", "electra")),
    "modernbert": ({"architecture": "modernbert", "global_attn_every_n_layers": 2, "local_attention": 16, "num_layers": 3},
                   ("mlm", "electra")),
    "albert": ({"architecture": "albert", "embedding_size": 16}, ("mlm",)),
    "xlnet": ({"architecture": "xlnet"}, ("xlnet",)),
}
RELATIVE = {"bert-relkq": ({"architecture": "bert", "position_embedding": "relative_key_query"}, ("mlm",))}
# One sentence: outputs at padded positions mean nothing, and ModernBERT's differ between majors.
TEXT = ["In the beginning God created the heaven and the earth."]


def _inputs(folder: Path, names: list[str]) -> tuple[dict, list[list[int]]]:
    from transformers import AutoTokenizer

    enc = AutoTokenizer.from_pretrained(str(folder))(TEXT, return_tensors="pt")
    return {k: v for k, v in enc.items() if k in names}, enc["input_ids"].tolist()


def write(out: Path, prepared: Path) -> list[str]:
    """Save every case's live models as the exporter does, with their outputs; returns the case names."""
    from data_pipeline.dataset_dir import DatasetDir
    from data_pipeline.shards import read_manifest
    from model.backbones import Backbone
    from model.backbones.base import forward_input_names, relative_positions_available
    from model.encoder import EncoderConfig, model_config
    from model.objectives import ObjectiveConfig, build_objective
    from pretrain.exporting.export import write_tokenizer

    tok = read_manifest(prepared)["tokenizer"]
    cases = {**CASES, **(RELATIVE if relative_positions_available() else {})}
    written = []
    for backbone, (options, objectives) in cases.items():
        shape = {"hidden_size": 32, "num_layers": 2, "num_heads": 2, "intermediate_size": 64,
                 "max_position_embeddings": 64, **options}
        config = model_config(EncoderConfig(dropout=0.0, attention_dropout=0.0, **shape), tok, 64)
        for name in objectives:
            torch.manual_seed(0)
            for sub, live in build_objective(ObjectiveConfig(name=name), config).hf_models().items():
                case = f"{backbone}-{name}-{sub or 'root'}"
                folder = out / case
                live.eval().save_pretrained(str(folder))
                write_tokenizer(DatasetDir(prepared).tokenizer, live, folder)
                inputs, ids = _inputs(folder, forward_input_names(live))
                with torch.no_grad():
                    torch.save({"class": type(live).__name__, "inputs": inputs, "ids": ids,
                                "base": Backbone.base(live)(**inputs).last_hidden_state, "head": output_tensors(live(**inputs))},
                               folder / "expected.pt")
                written.append(case)
    return written


@torch.no_grad()
def read(out: Path) -> dict[str, float]:
    """Each case loaded with AutoModel and with its own class: the largest difference from the written outputs."""
    import transformers

    gaps = {}
    for folder in sorted(p for p in out.iterdir() if (p / "expected.pt").is_file()):
        want = torch.load(folder / "expected.pt")
        inputs = want["inputs"]
        _, ids = _inputs(folder, list(inputs))
        base = transformers.AutoModel.from_pretrained(str(folder)).eval()
        head = getattr(transformers, want["class"]).from_pretrained(str(folder)).eval()
        got = [base(**inputs).last_hidden_state, *output_tensors(head(**inputs))]
        expected = [want["base"], *want["head"]]
        same_shapes = ids == want["ids"] and len(got) == len(expected) and all(
            g.shape == w.shape for g, w in zip(got, expected))
        gaps[folder.name] = max((g - w).abs().max().item() for g, w in zip(got, expected)) if same_shapes else float("inf")
    return gaps


if __name__ == "__main__":
    gaps = read(Path(sys.argv[1]))
    print(json.dumps({"read": gaps, "written": write(Path(sys.argv[2]), Path(sys.argv[3]))}))
