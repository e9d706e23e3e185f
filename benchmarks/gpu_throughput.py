"""BERT-base training throughput and MFU per GPU for MLM, COCO-LM and TaCL (bf16), at seq 128 and 512.

    python benchmarks/corpora.py --out runs/corpora
    python benchmarks/gpu_throughput.py                     # on a GPU machine (one process, one GPU)
    python benchmarks/gpu_throughput.py --tiny --steps 20   # the same path at CPU size (a check, not a figure)

Each point is a real `python -m pretrain train` run (torchrun, one rank, DeepSpeed ZeRO-2, bf16) of a
BERT-base-shaped model (hidden 768, 12 layers, 12 heads, FFN 3072, BERT's 30,522-token WordPiece
vocabulary) on real packed shards (WordNet glosses + KJV, MiniLM's WordPiece tokenizer), so the loader,
dynamic masking and the engine are all in the timing. tokens/s and MFU are the trainer's own logged
values (MFU = the objective's `flops_per_token` × tokens/s / the GPU's dense bf16 peak, model/flops.py),
the median over logged intervals after `--warmup` steps. TaCL's teacher is a BERT-base-shaped folder
with fresh weights (its speed does not depend on its values); COCO-LM's generator has 4 layers (the
paper's base setting). Writes benchmarks/results/gpu_throughput.json.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from repro_common import REPO, fresh_bert, minilm_dir, prepare, run, setup_logging  # noqa: E402

BASE = {"hidden_size": 768, "num_layers": 12, "num_heads": 12, "intermediate_size": 3072}
TINY = {"hidden_size": 64, "num_layers": 2, "num_heads": 2, "intermediate_size": 256}
OBJECTIVES = {"mlm": ["objective.name=mlm", "masking.strategy=bert"],
              "coco_lm": ["objective.name=coco_lm", "masking.strategy=coco", "masking.crop_ratio=0.9"],
              "tacl": ["objective.name=tacl", "masking.strategy=bert"]}


def teacher_folder(shape: dict, seq: int, tokenizer_dir: Path, out: Path) -> Path:
    """A BertForMaskedLM folder of this shape with fresh weights and the data's tokenizer (TaCL's teacher)."""
    from transformers import BertConfig

    config = BertConfig(vocab_size=30522, hidden_size=shape["hidden_size"], num_hidden_layers=shape["num_layers"],
                        num_attention_heads=shape["num_heads"], intermediate_size=shape["intermediate_size"],
                        max_position_embeddings=max(512, seq))
    return fresh_bert(config, tokenizer_dir, out, seed=0, mlm_head=True)


def measure(rows: list[dict], warmup: int) -> dict:
    """Median tokens/s, MFU and peak memory over the logged training intervals after warm-up."""
    train = [r for r in rows if r.get("split") == "train" and r["step"] > warmup and "tokens_per_s" in r]
    if not train:
        raise SystemExit("no training interval after the warm-up was logged: raise --steps or lower --warmup")
    out = {"tokens_per_s": statistics.median(r["tokens_per_s"] for r in train),
           "samples_per_s": statistics.median(r["samples_per_s"] for r in train),
           "model_tflops_per_device": statistics.median(r["model_tflops_per_device"] for r in train),
           "peak_memory_gib": max(r.get("peak_memory_gib", 0.0) for r in train), "intervals": len(train)}
    mfu = [r["mfu"] for r in train if "mfu" in r]
    out["mfu"] = statistics.median(mfu) if mfu else None
    return out


def main() -> None:
    """Run every (objective, sequence length) point and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--corpora", default="runs/corpora")
    parser.add_argument("--work", default="runs/bench_gpu")
    parser.add_argument("--objectives", nargs="+", default=list(OBJECTIVES), choices=list(OBJECTIVES))
    parser.add_argument("--seqs", type=int, nargs="+", default=[128, 512])
    parser.add_argument("--batch-128", type=int, default=64, help="micro-batch per GPU at seq 128")
    parser.add_argument("--batch-512", type=int, default=16, help="micro-batch per GPU at seq 512")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--precision", default="bf16", choices=["bf16", "fp16", "fp32"])
    parser.add_argument("--tiny", action="store_true", help="a 2-layer, hidden-64 model (checks the path on a CPU)")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "gpu_throughput.json"))
    args = parser.parse_args()
    setup_logging()
    import torch

    shape = TINY if args.tiny else BASE
    corpora, work = Path(args.corpora).resolve(), Path(args.work).resolve()
    tokenizer = minilm_dir()
    results = []
    for seq in args.seqs:
        data = prepare({"sources": [{"kind": "text", "path": f"{corpora / 'wordnet_glosses.txt'},{corpora / 'kjv.txt'}",
                                     "text_documents": "paragraph"}],
                        "tokenizer": {"pretrained": str(tokenizer)}, "seq_len": seq, "packing": "full", "val_fraction": 0.01},
                       work / f"data{seq}")
        batch = args.batch_128 if seq <= 128 else args.batch_512
        teacher = teacher_folder(shape, seq, tokenizer, work / f"teacher_{'tiny' if args.tiny else 'base'}_{seq}")
        for name in args.objectives:
            run_dir = work / f"{name}_seq{seq}{'_tiny' if args.tiny else ''}"
            overrides = [f"model.{k}={v}" for k, v in shape.items()] + OBJECTIVES[name] + [
                f"data.path={data}", f"model.max_position_embeddings={max(512, seq)}", f"train.output_dir={run_dir}",
                f"train.max_steps={args.steps}", f"train.micro_batch_size={batch}", f"train.global_batch_size={batch}",
                f"train.precision={args.precision}", "train.log_every=5", f"train.save_every={args.steps}",
                "train.resume=never", "schedule.warmup_steps=10", "optimizer.lr=1e-4"]
            if name == "tacl":
                overrides.append(f"model.init_from={teacher}")
            if name == "coco_lm":
                overrides.append(f"objective.coco_lm.generator_layers={1 if args.tiny else 4}")
            if run_dir.exists():
                shutil.rmtree(run_dir)
            run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1", "-m", "pretrain", "train", "--config",
                 "pretrain/configs/demo_mlm.yaml", *overrides])
            rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
            results.append({"objective": name, "seq_len": seq, "micro_batch": batch, **measure(rows, args.warmup)})
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else f"CPU ({os.cpu_count()} cores)"
    print(f"\n{device}; {'tiny' if args.tiny else 'BERT-base'}, {args.precision}, ZeRO-2, 1 rank, steps {args.warmup}..{args.steps}")
    print("| objective | seq | micro-batch | tokens/s/GPU | samples/s | model TFLOP/s | MFU | peak memory GiB |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        mfu = "n/a" if r["mfu"] is None else f"{100 * r['mfu']:.1f}%"
        print(f"| {r['objective']} | {r['seq_len']} | {r['micro_batch']} | {r['tokens_per_s']:,.0f} | {r['samples_per_s']:.1f} | "
              f"{r['model_tflops_per_device']:.2f} | {mfu} | {r['peak_memory_gib']:.1f} |")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"device": device, "machine": platform.platform(), "torch": torch.__version__,
                                          "args": vars(args), "shape": shape, "rows": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
