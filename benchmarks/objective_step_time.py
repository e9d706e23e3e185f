"""Step time of each objective relative to MLM, on the same main model and batch.

    python -m benchmarks.objective_step_time                       # CPU, a small BERT (what CI machines can run)
    python -m benchmarks.objective_step_time --device cuda --bf16 --hidden 768 --layers 12 --heads 12 \\
        --intermediate 3072 --batch 32 --seq 128                   # BERT-base on a GPU

A step is forward + backward + AdamW update of the objective module (no DeepSpeed, no data
loading), timed after warm-up; the median of `--steps` steps is reported. COCO-LM's generator has
`--coco-generator-layers` layers (4 for base in the paper), ELECTRA's 1/4 of the width.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch
from benchmarks.arguments import add_shared, results_file

OBJECTIVES = ["mlm", "electra", "coco_lm", "tacl", "taco"]


def make_batch(name: str, args: argparse.Namespace, vocab: int, device: str, generator: torch.Generator) -> dict:
    """Random full-length sequences, masked as the objective's example config masks them, with the loader's
    `prediction_index` (its picks padded to the batch's budget)."""
    from data_pipeline.masking import MaskingConfig, batch_prediction_slots, build_masking, build_prediction_index

    ids = torch.randint(5, vocab, (args.batch, args.seq), generator=generator)
    ids[:, 0], ids[:, -1] = 2, 3
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids)}
    masking = MaskingConfig(strategy="coco" if name == "coco_lm" else "bert", crop_ratio=0.9 if name == "coco_lm" else None)
    out = build_masking(masking, vocab, 4, [0, 1, 2, 3, 4], pad_id=0, cls_id=2, sep_id=3)(batch, generator)
    slots = batch_prediction_slots(masking, args.batch, args.seq)
    out["prediction_index"] = build_prediction_index(out["labels"], slots, out["masked_positions"].numel())
    return {k: v.to(device) for k, v in out.items()}


def time_objective(name: str, args: argparse.Namespace, device: str) -> dict:
    """Median step time of one objective."""
    from transformers import BertConfig

    from model.objectives import ObjectiveConfig, build_objective

    config = BertConfig(vocab_size=args.vocab, hidden_size=args.hidden, num_hidden_layers=args.layers,
                        num_attention_heads=args.heads, intermediate_size=args.intermediate, max_position_embeddings=512)
    config._attn_implementation = "sdpa"
    oc = ObjectiveConfig(name=name)
    oc.coco_lm.generator_layers = args.coco_generator_layers
    torch.manual_seed(0)
    model = build_objective(oc, config).to(device)
    model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    batch = make_batch(name, args, args.vocab, device, torch.Generator().manual_seed(0))
    autocast = torch.autocast(device_type=device.split(":")[0], dtype=torch.bfloat16, enabled=args.bf16)
    times = []
    for i in range(args.warmup + args.steps):
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        start = time.perf_counter()
        with autocast:
            loss, _ = model(batch)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        if i >= args.warmup:
            times.append(time.perf_counter() - start)
    params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return {"objective": name, "step_s": statistics.median(times), "trainable_params": params}


def main() -> None:
    """Time every objective; print a table relative to MLM and write JSON."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--bf16", action="store_true")
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--intermediate", type=int, default=1024)
    parser.add_argument("--coco-generator-layers", type=int, default=1)
    add_shared(parser, batch=16, seq=128, warmup=3, steps=10, out=results_file("objective_step_time"))
    args = parser.parse_args()
    rows = [time_objective(name, args, args.device) for name in OBJECTIVES]
    base = rows[0]["step_s"]
    for r in rows:
        r["relative_to_mlm"] = round(r["step_s"] / base, 2)
        r["step_s"] = round(r["step_s"], 4)
    where = torch.cuda.get_device_name() if args.device.startswith("cuda") else f"CPU, {torch.get_num_threads()} threads"
    print(f"{where}; hidden {args.hidden}, {args.layers} layers, batch {args.batch} x {args.seq}, bf16={args.bf16}")
    print(f"{'objective':10} {'step (s)':>9} {'vs MLM':>7} {'trainable params':>17}")
    for r in rows:
        print(f"{r['objective']:10} {r['step_s']:>9} {r['relative_to_mlm']:>6}x {r['trainable_params']:>17,}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"device": where, "machine": platform.platform(), "cpu_count": os.cpu_count(),
                                          "args": vars(args), "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
