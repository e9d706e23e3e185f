"""Per-rank parameter + optimizer memory: ZeRO-3 against no ZeRO (stage 0), 2 ranks, one real training step.

Counts the bytes of the tensors each rank holds after the step (exact, unlike RSS on a CPU):
parameters (ZeRO-3: each parameter's local partition `ds_tensor`), and optimizer state (Adam's
moments, plus ZeRO-3's fp32 master partitions). Gradients are freed after the step by both.

    python -m benchmarks.zero_memory            # launches itself under torchrun with 2 ranks
    python -m benchmarks.zero_memory --albert   # ALBERT-base against BERT-base (H 768, 12 layers), both stages

`--albert` compares ALBERT's factorized embeddings (E = 128) and cross-layer sharing with BERT of the
same width and depth, as masked LMs with their pre-training heads (AlbertForPreTraining,
BertForPreTraining), and writes benchmarks/results/zero_memory_albert.json.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from benchmarks.arguments import add_shared, results_file

if TYPE_CHECKING:  # annotations only: transformers is imported where a model is built
    from transformers import PreTrainedModel

REPO = Path(__file__).resolve().parents[1]


def _tensor_bytes(obj, seen: set) -> int:
    import torch

    if isinstance(obj, torch.Tensor):
        key = (obj.untyped_storage().data_ptr(), obj.dtype)
        if key in seen or obj.numel() == 0:
            return 0
        seen.add(key)
        return obj.untyped_storage().nbytes()
    if isinstance(obj, dict):
        return sum(_tensor_bytes(v, seen) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_bytes(v, seen) for v in obj)
    return 0


def build_model(name: str) -> PreTrainedModel:
    """The benchmarked model: the small BERT MLM, or BERT-base / ALBERT-base with their pre-training heads."""
    from transformers import AlbertConfig, AlbertForPreTraining, BertConfig, BertForMaskedLM, BertForPreTraining

    if name == "bert_small":
        return BertForMaskedLM(BertConfig(vocab_size=30522, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                                          intermediate_size=1024, max_position_embeddings=128))
    base = dict(vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
                max_position_embeddings=128)
    if name == "bert_base":
        return BertForPreTraining(BertConfig(**base))
    return AlbertForPreTraining(AlbertConfig(**base, embedding_size=128, num_hidden_groups=1, hidden_act="gelu_new"))


def worker(stage: int, precision: str, name: str = "bert_small") -> dict:
    """Build the engine at this stage, train one step, and count this rank's bytes."""
    import deepspeed
    import torch

    from core.distributed import init_distributed

    init_distributed()
    torch.manual_seed(0)
    model = build_model(name)
    n_params = sum(p.numel() for p in model.parameters())
    zero = {"stage": stage}
    if stage == 3:
        zero.update(stage3_allgather_sequential=True, stage3_param_persistence_threshold=0)
    config = {"train_micro_batch_size_per_gpu": 2, "zero_optimization": zero, "bf16": {"enabled": precision == "bf16"}}
    engine, opt, _, _ = deepspeed.initialize(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-4),
                                             config=config)
    ids = torch.randint(5, 30522, (2, 64))
    loss = engine(input_ids=ids, labels=ids).loss if name == "bert_small" else engine(input_ids=ids).prediction_logits.mean()
    engine.backward(loss)
    engine.step()
    seen: set = set()
    if stage == 3:
        params = sum(_tensor_bytes(p.ds_tensor, seen) for p in engine.module.parameters())
    else:
        params = sum(_tensor_bytes(p.data, seen) for p in engine.module.parameters())
    inner = getattr(opt, "optimizer", opt)
    optimizer = _tensor_bytes(dict(inner.state), seen)
    # What else the ZeRO / bf16 wrapper keeps: fp32 master partitions (optimizer memory) and gradient
    # buffers (reported apart: the measure here is parameters + optimizer state).
    grads = 0
    if opt is not inner:
        for name, value in vars(opt).items():
            if "grad" in name:
                grads += _tensor_bytes(value, seen)
            else:
                optimizer += _tensor_bytes(value, seen)
    return {"stage": stage, "rank": torch.distributed.get_rank(), "param_bytes": params, "optimizer_bytes": optimizer,
            "grad_buffer_bytes": grads, "model_params": n_params, "precision": precision, "model": name}


def _launch(stage: int, precision: str, name: str, tmp: str) -> list[dict]:
    """One 2-rank worker run; each rank's result."""
    out = Path(tmp) / f"{name}_{precision}_stage{stage}.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m",
                    "benchmarks.zero_memory", "--worker", str(stage), precision, str(out), name],
                   cwd=REPO, env=env, check=True, capture_output=True)
    return [json.loads(out.with_name(f"{out.stem}.rank{r}.json").read_text()) for r in range(2)]


def compare_albert() -> None:
    """ALBERT-base against BERT-base: parameters and per-rank parameter + optimizer bytes, ZeRO-3 and not."""
    import tempfile

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("bert_base", "albert_base"):
            for stage in (0, 3):
                ranks = _launch(stage, "fp32", name, tmp)
                worst = max(ranks, key=lambda x: x["param_bytes"] + x["optimizer_bytes"])
                rows.append({"model": name, "stage": stage, "model_params": worst["model_params"],
                             "param_mib_per_rank": worst["param_bytes"] / 2**20,
                             "optimizer_mib_per_rank": worst["optimizer_bytes"] / 2**20,
                             "total_mib_per_rank": (worst["param_bytes"] + worst["optimizer_bytes"]) / 2**20})
    print("H 768, 12 layers, vocabulary 30522, fp32, AdamW, 2 ranks (ALBERT: E 128, one shared layer)")
    print(f"{'model':>12} {'stage':>5} {'parameters':>12} {'params MiB/rank':>16} {'optimizer MiB/rank':>19} {'total MiB/rank':>15}")
    for r in rows:
        print(f"{r['model']:>12} {r['stage']:>5} {r['model_params']:>12,} {r['param_mib_per_rank']:>16.1f} "
              f"{r['optimizer_mib_per_rank']:>19.1f} {r['total_mib_per_rank']:>15.1f}")
    out = REPO / "benchmarks" / "results" / "zero_memory_albert.json"
    out.write_text(json.dumps({"machine": platform.platform(), "rows": rows}, indent=2) + "\n")


def main() -> None:
    """Run both stages on 2 ranks; print per-rank bytes and the ratio."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--albert", action="store_true", help="compare ALBERT with BERT of the same width and depth")
    add_shared(parser, out=results_file("zero_memory"))
    parser.add_argument("--worker", nargs="+", metavar="STAGE PRECISION OUT [MODEL]", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        stage, precision, out, *model = args.worker
        result = worker(int(stage), precision, model[0] if model else "bert_small")
        Path(out).with_name(f"{Path(out).stem}.rank{result['rank']}.json").write_text(json.dumps(result))
        return
    if args.albert:
        compare_albert()
        return
    import tempfile

    summary = {}
    with tempfile.TemporaryDirectory() as tmp:
        for precision in ("bf16", "fp32"):
            results = {}
            for stage in (0, 3):
                results[stage] = _launch(stage, precision, "bert_small", tmp)
            per_rank = {s: max(r["param_bytes"] + r["optimizer_bytes"] for r in rs) for s, rs in results.items()}
            summary[precision] = {"results": results, "ratio": per_rank[3] / per_rank[0]}
            print(f"BertForMaskedLM, {results[0][0]['model_params']:,} parameters, {precision}, AdamW, 2 ranks")
            print(f"{'stage':>5} {'params MiB/rank':>16} {'optimizer MiB/rank':>19} {'total MiB/rank':>15} {'(grad buffers)':>15}")
            for s, rs in results.items():
                r = max(rs, key=lambda x: x["param_bytes"] + x["optimizer_bytes"])
                print(f"{s:>5} {r['param_bytes'] / 2**20:>16.1f} {r['optimizer_bytes'] / 2**20:>19.1f} "
                      f"{(r['param_bytes'] + r['optimizer_bytes']) / 2**20:>15.1f} {r['grad_buffer_bytes'] / 2**20:>15.1f}")
            print(f"ZeRO-3 / stage 0 per rank ({precision}): {summary[precision]['ratio']:.3f}\n")
    Path(args.out).write_text(json.dumps({"machine": platform.platform(), **summary}, indent=2) + "\n")


if __name__ == "__main__":
    main()
