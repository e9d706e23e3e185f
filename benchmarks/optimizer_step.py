"""Which optimizer implementation to use on this machine, and what share of a training step it costs.

    python -m benchmarks.optimizer_step                       # hidden 512, 4 layers (the issue's benchmark shape)
    python -m benchmarks.optimizer_step --hidden 768 --layers 12 --heads 12 --ffn 3072

One process with the threads of one rank (1 by default: two ranks on two cores). For an MLM step of
the shape (micro-batch 16 × 128 tokens, sparse head at 15%), it times forward + backward, then each
optimizer's `step()` over the same gradients, on what the optimizer sees in each engine setting:
- `params`: the model's parameter tensors (ZeRO-0);
- `flat/N`: one flat fp32 partition of 1/N of them (ZeRO-1/2 on N ranks hand the optimizer flat slices).
Variants: torch AdamW for-loop (torch's CPU default), `foreach=True`, `fused=True`, and DeepSpeedCPUAdam
(compiled on first use; skipped with a note where it cannot be built). Also checks that each variant is
deterministic: two identical runs give bit-identical weights (what exact resume needs).
Writes benchmarks/results/optimizer_step.json.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Callable

import torch
from benchmarks.arguments import add_shared, results_file



def median_seconds(fn: Callable[[], object], reps: int) -> float:
    """Median wall time of `fn()` over `reps` calls after one warm-up call."""
    fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def make_optimizer(variant: str, params: list[torch.Tensor]) -> torch.optim.Optimizer:
    """The optimizer `variant` over `params` (lr and betas as the demo's)."""
    kwargs = dict(lr=1e-3, betas=(0.9, 0.98), eps=1e-6, weight_decay=0.01)
    if variant == "torch-for-loop":
        return torch.optim.AdamW(params, foreach=False, **kwargs)
    if variant == "torch-foreach":
        return torch.optim.AdamW(params, foreach=True, **kwargs)
    if variant == "torch-fused":
        return torch.optim.AdamW(params, fused=True, **kwargs)
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    return DeepSpeedCPUAdam(params, adamw_mode=True, **kwargs)


def time_optimizer(variant: str, shapes: list[torch.Size], reps: int) -> tuple[float, bool]:
    """(median seconds per step, deterministic) for fresh tensors of these shapes with fixed gradients."""
    def run(steps: int) -> tuple[list[torch.Tensor], float]:
        g = torch.Generator().manual_seed(0)
        params = [torch.nn.Parameter(torch.randn(s, generator=g)) for s in shapes]
        for p in params:
            p.grad = torch.randn(p.shape, generator=g) * 1e-2
        opt = make_optimizer(variant, params)
        seconds = median_seconds(opt.step, steps) if steps else 0.0
        return [p.detach().clone() for p in params], seconds

    first, seconds = run(reps)
    again, _ = run(reps)
    return seconds, all(torch.equal(a, b) for a, b in zip(first, again))


def main() -> None:
    """Time forward + backward and every optimizer variant; print the table and write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--ffn", type=int, default=2048)
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--micro-batch", type=int, default=16)
    add_shared(parser, seq=128, threads=1)
    parser.add_argument("--reps", type=int, default=5)
    add_shared(parser, out=results_file("optimizer_step"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from transformers import BertConfig

    from model.objectives import ObjectiveConfig, build_objective

    config = BertConfig(vocab_size=args.vocab, hidden_size=args.hidden, num_hidden_layers=args.layers,
                        num_attention_heads=args.heads, intermediate_size=args.ffn, max_position_embeddings=args.seq,
                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    model = build_objective(ObjectiveConfig(name="mlm"), config)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, args.vocab, (args.micro_batch, args.seq), generator=g)
    labels = torch.where(torch.rand(ids.shape, generator=g) < 0.15, ids, torch.full_like(ids, -100))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels,
             "token_type_ids": torch.zeros_like(ids)}

    def forward_backward() -> None:
        model.zero_grad(set_to_none=True)
        loss, _ = model(batch)
        loss.backward()

    fwd_bwd = median_seconds(forward_backward, args.reps)
    shapes = [p.shape for p in model.parameters()]
    n_params = sum(p.numel() for p in model.parameters())
    layouts = {"params": shapes, "flat/1": [torch.Size([n_params])], "flat/2": [torch.Size([n_params // 2])]}
    rows = []
    print(f"MLM BERT hidden {args.hidden}, {args.layers} layers, FFN {args.ffn}, vocab {args.vocab}: {n_params / 1e6:.1f} M "
          f"parameters; forward + backward of {args.micro_batch} x {args.seq} tokens: {fwd_bwd * 1e3:.1f} ms "
          f"({args.threads} thread{'s' if args.threads > 1 else ''})")
    print("\n| optimizer | what it steps | ms per step | share of (fwd+bwd + step) | deterministic |\n|---|---|---|---|---|")
    for variant in ("torch-for-loop", "torch-foreach", "torch-fused", "deepspeed-cpu-adam"):
        for layout, layout_shapes in layouts.items():
            try:
                seconds, deterministic = time_optimizer(variant, layout_shapes, args.reps)
            except Exception as exc:  # DeepSpeedCPUAdam needs a compiler toolchain; say so and go on
                print(f"| {variant} | {layout} | not available: {type(exc).__name__}: {str(exc)[:80]} | | |")
                rows.append({"optimizer": variant, "layout": layout, "error": f"{type(exc).__name__}: {exc}"[:300]})
                break
            share = seconds / (fwd_bwd + seconds)
            rows.append({"optimizer": variant, "layout": layout, "seconds": seconds, "share": share,
                         "deterministic": deterministic})
            print(f"| {variant} | {layout} | {seconds * 1e3:.1f} | {100 * share:.1f}% | {deterministic} |")
    from core.atomic_files import write_text_atomic

    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(Path(args.out), json.dumps({"args": vars(args), "parameters": n_params,
                                                  "forward_backward_seconds": fwd_bwd, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
