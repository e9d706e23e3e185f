"""The compiled bare loop of BERT-base MLM, one kernel lever at a time: what each is worth before the trainer adopts it.

    python -m benchmarks.kernel_levers                                    # on a GPU: every lever, seq 128, micro-batch 256
    python -m benchmarks.kernel_levers --levers baseline no_mask fused_qkv --steps 30 --warmup 10
    python -m benchmarks.kernel_levers --levers baseline no_mask no_mask+cudnn_attention   # levers stacked with +
    python -m benchmarks.kernel_levers --shape tiny --batch 4 --steps 3 --warmup 1 --device cpu   # the path on a CPU

Each lever is a fresh BertForMaskedLM (transformers' own class, the same seed) trained as one `torch.compile` graph
over forward, the MLM head at a fixed count of masked positions per row, and cross-entropy; backward, clipping and
fused AdamW outside it; autocast bf16 on a GPU. The batches are random ordinary tokens with exactly 15% of each row
masked, a new batch each step from a cycle made on the device before the timing. A lever changes one thing against
`baseline`, which is what the trainer runs (the all-ones attention mask passed, SDPA choosing its kernel):

- `no_mask`: no attention mask (rows without padding), so SDPA may pick its flash kernel;
- `cudnn_attention`: SDPA restricted to cuDNN's attention kernel;
- `fused_qkv`: Q, K and V as one matmul over the concatenated weights (model/fused_qkv.py, `train.fused_qkv`);
- `batch_512`: micro-batch 512;
- `cuda_graphs`: `mode="reduce-overhead"`;
- `fp8`: torchao's float8 training on the encoder's linear layers (needs torchao and an sm89+ GPU);
- `dropout_0.1`: BERT's recipe dropout;
- `vocab_chunk_1024`, `vocab_chunk_4096`: the head's vocabulary projection fused with the cross-entropy, that many
  rows at a time (model/vocabulary_loss.py, `train.vocab_loss_chunk`): the fp32 logits never exist whole.

Levers stack with `+`: `no_mask+cudnn_attention` is the step without a mask, held to cuDNN's kernel.

`--attention` first times SDPA alone at the step's shape (forward + backward, bf16) for each backend, with and without
the mask.

MFU counts model/flops.py's MLM FLOPs against the GPU's dense bf16 peak (pretrain/engine/hardware.py). `first_loss` is the
loss of the first step (the same weights and batch for every lever at one micro-batch): a lever that changes the
math shows there. Writes benchmarks/results/kernel_levers.json.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from typing import TYPE_CHECKING, Any, Callable, Optional

import torch
import torch.nn.functional as F

from benchmarks.arguments import add_shared, parse_checked, results_file
from benchmarks.machine import machine
from core.atomic_files import write_text_atomic

if TYPE_CHECKING:  # annotations only: transformers is imported inside the functions that build models
    from transformers import BertForMaskedLM

SHAPES = {"base": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072),
          "tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=256)}
VOCAB = 30522  # BERT's WordPiece vocabulary
FIRST_ORDINARY = 1000  # ids below are [PAD], [unused*], [CLS], [SEP], [MASK] in BERT's vocabulary
MASK_ID, MASK_PROB = 103, 0.15
LEVERS: dict[str, dict[str, Any]] = {
    "baseline": {},
    "no_mask": {"mask": False},
    "cudnn_attention": {"attention": "cudnn"},
    "fused_qkv": {"fused_qkv": True},
    "batch_512": {"batch": 512},
    "cuda_graphs": {"mode": "reduce-overhead"},
    "fp8": {"fp8": True},
    "dropout_0.1": {"dropout": 0.1},
    "vocab_chunk_1024": {"vocab_chunk": 1024},
    "vocab_chunk_4096": {"vocab_chunk": 4096},
}
NEEDS_EXTRA = {"fp8", "cudnn_attention"}  # torchao and sm89+, cuDNN: where missing, the row says why


def lever_settings(name: str) -> dict[str, Any]:
    """The settings of a lever, or of levers stacked with `+` (a later one wins where two set the same thing)."""
    settings: dict[str, Any] = {}
    for part in name.split("+"):
        if part not in LEVERS:
            raise ValueError(f"unknown lever {part!r} in {name!r}; choose from {', '.join(LEVERS)}")
        settings.update(LEVERS[part])
    return settings


def _lever(name: str) -> str:
    """argparse type of --levers: a lever or levers stacked with `+`."""
    try:
        lever_settings(name)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc
    return name


def build_model(shape: str, dropout: float, fused_qkv: bool, device: torch.device) -> BertForMaskedLM:
    """A BertForMaskedLM of this shape with seed-0 weights; `fused_qkv`: the trainer's train.fused_qkv."""
    from transformers import BertConfig, BertForMaskedLM

    from model.fused_qkv import fuse_qkv

    config = BertConfig(vocab_size=VOCAB, hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout,
                        max_position_embeddings=512, attn_implementation="sdpa", **SHAPES[shape])
    torch.manual_seed(0)
    model = BertForMaskedLM(config).to(device).train()
    if fused_qkv:
        fuse_qkv(model)
    return model


def make_batches(count: int, batch: int, seq: int, device: torch.device) -> list[dict]:
    """`count` batches of random ordinary tokens, round(0.15·seq) positions per row masked ([MASK] in every one)."""
    gen = torch.Generator().manual_seed(0)
    picks = round(MASK_PROB * seq)
    out = []
    for _ in range(count):
        ids = torch.randint(FIRST_ORDINARY, VOCAB, (batch, seq), generator=gen)
        positions = torch.rand(batch, seq - 2, generator=gen).argsort(dim=1)[:, :picks].sort(dim=1).values + 1
        labels = ids.gather(1, positions)
        ids.scatter_(1, positions, MASK_ID)
        out.append({k: v.to(device) for k, v in {"input_ids": ids, "positions": positions, "labels": labels,
                                                  "attention_mask": torch.ones_like(ids)}.items()})
    return out


def mlm_loss(model: BertForMaskedLM, batch: dict, mask: bool, vocab_chunk: int = 0) -> torch.Tensor:
    """Cross-entropy of the MLM head at the batch's masked positions (a fixed count per row: one static graph);
    `vocab_chunk` > 0: the projection fused with the loss, that many rows at a time."""
    from model.vocabulary_loss import linear_cross_entropy

    hidden = model.bert(input_ids=batch["input_ids"],
                        attention_mask=batch["attention_mask"] if mask else None).last_hidden_state
    index = batch["positions"][..., None].expand(-1, -1, hidden.shape[-1])
    rows, labels = hidden.gather(1, index).flatten(0, 1), batch["labels"].flatten()
    if vocab_chunk:
        head = model.cls.predictions
        total, _ = linear_cross_entropy(head.transform(rows), head.decoder.weight, head.decoder.bias, labels, vocab_chunk)
        return total / labels.numel()
    return F.cross_entropy(model.cls(rows).float(), labels)


BACKENDS = ("flash", "efficient", "cudnn", "math")


def with_backend(fn: Callable[..., Any], backend: str) -> Callable[..., Any]:
    """`fn` with SDPA restricted to one backend (flash, efficient, cudnn or math)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    chosen = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
              "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}[backend]

    def run(*a, **k):
        with sdpa_kernel([chosen]):
            return fn(*a, **k)
    return run


def attention_times(args: argparse.Namespace) -> list[dict]:
    """ms per forward + backward of SDPA alone at the step's shape, per backend, with and without a padding mask."""
    device = torch.device(args.device)
    heads, width = SHAPES[args.shape]["num_attention_heads"], SHAPES[args.shape]["hidden_size"]
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    q, k, v = (torch.randn(args.batch, heads, args.seq, width // heads, device=device, dtype=dtype, requires_grad=True)
               for _ in range(3))
    mask = torch.ones(args.batch, 1, args.seq, args.seq, dtype=torch.bool, device=device)
    rows = []
    for backend in BACKENDS:
        for masked in (True, False):
            attend = with_backend(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask if masked else None),
                                  backend)
            try:
                for i in range(12):
                    if i == 2:
                        sync(device)
                        start = time.perf_counter()
                    attend().sum().backward()
                sync(device)
                rows.append({"backend": backend, "mask": masked, "ms": (time.perf_counter() - start) / 10 * 1e3})
            except RuntimeError as exc:  # a backend that does not take this shape, dtype or mask
                rows.append({"backend": backend, "mask": masked, "error": str(exc).splitlines()[0][:200]})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (a no-op on a CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize()


def to_float8(model: BertForMaskedLM) -> None:
    """torchao's float8 training for the encoder's linear layers (the tied vocabulary projection stays bf16)."""
    from torchao.float8 import convert_to_float8_training

    convert_to_float8_training(model.bert.encoder, module_filter_fn=lambda module, name: isinstance(module, torch.nn.Linear))


def run_lever(name: str, args: argparse.Namespace) -> dict:
    """Train one lever's model for `args.steps` steps; tokens/s, MFU, peak memory and the first and last losses."""
    from model.flops import TRAIN, mlm_forward
    from pretrain.engine.hardware import datasheet_peak_tflops

    lever = {"mask": True, "attention": None, "fused_qkv": False, "batch": args.batch, "mode": None, "fp8": False,
             "dropout": 0.0, "vocab_chunk": 0, **lever_settings(name)}
    device = torch.device(args.device)
    torch._dynamo.reset()
    model = build_model(args.shape, lever["dropout"], lever["fused_qkv"], device)
    if lever["fp8"]:
        to_float8(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
    loss_fn = torch.compile(mlm_loss, mode=lever["mode"]) if args.compile else mlm_loss
    if lever["attention"]:
        loss_fn = with_backend(loss_fn, lever["attention"])
    batches = make_batches(args.cycle, lever["batch"], args.seq, device)
    bf16 = device.type == "cuda"
    losses, times = [], []
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    for step in range(args.steps):
        if device.type == "cuda":
            torch.compiler.cudagraph_mark_step_begin()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            loss = loss_fn(model, batches[step % len(batches)], lever["mask"], lever["vocab_chunk"])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step in (0, args.steps - 1) or step == args.warmup - 1:
            losses.append(float(loss.detach()))  # a device sync: the timing starts after it and ends with it
            times.append(time.perf_counter())
    tokens = (args.steps - args.warmup) * lever["batch"] * args.seq
    tokens_per_s = tokens / (times[-1] - times[-2])
    config = model.config
    tflops = TRAIN * mlm_forward(config, args.seq, round(MASK_PROB * args.seq) / args.seq) * tokens_per_s / 1e12
    peak = datasheet_peak_tflops("bf16" if bf16 else "fp32")
    return {"lever": name, **lever, "tokens_per_s": tokens_per_s, "model_tflops": tflops,
            "mfu": tflops / peak if peak else None, "first_loss": losses[0], "last_loss": losses[-1],
            "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else None}


def build_parser() -> argparse.ArgumentParser:
    """This benchmark's arguments."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_shared(parser, steps=30, warmup=10, batch=256, seq=128, out=results_file("kernel_levers"))
    parser.add_argument("--levers", nargs="+", type=_lever, default=list(LEVERS),
                        help=f"any of {', '.join(LEVERS)}, or several joined with + (stacked)")
    parser.add_argument("--shape", choices=list(SHAPES), default="base")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--cycle", type=int, default=8, help="distinct batches, made on the device before timing")
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--attention", action="store_true", help="time SDPA alone per backend first")
    return parser


def check_args(args: argparse.Namespace) -> str:
    """What is wrong with parsed arguments that the parser alone cannot see ("" for nothing)."""
    if not 0 < args.warmup < args.steps:
        return "--warmup must be at least 1 and below --steps"
    return ""


def main(argv: Optional[list[str]] = None) -> int:
    """Run each lever in turn and write their figures and the ratio to `baseline` (when it ran)."""
    args = parse_checked(build_parser(), check_args, argv)
    attention = attention_times(args) if args.attention else []
    rows = []
    for name in args.levers:
        try:
            row = run_lever(name, args)
        except (ImportError, RuntimeError) as exc:
            if not NEEDS_EXTRA & set(name.split("+")):
                raise
            row = {"lever": name, "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"}
        rows.append(row)
        print(json.dumps(row), flush=True)
    base = next((r for r in rows if r["lever"] == "baseline" and "error" not in r), None)
    for r in rows:
        if base and "error" not in r:
            r["vs_baseline"] = r["tokens_per_s"] / base["tokens_per_s"]
    write_text_atomic(args.out, json.dumps({"env": machine(), "args": vars(args), "attention": attention, "levers": rows},
                                           indent=1))
    print(f"{'lever':<18} {'tokens/s':>10} {'MFU':>7} {'vs base':>8} {'first loss':>11} {'peak GiB':>9}")
    for r in rows:
        if "error" in r:
            print(f"{r['lever']:<18} {r['error']}")
            continue
        mfu = f"{r['mfu']:.1%}" if r["mfu"] is not None else "-"
        memory = f"{r['peak_memory_gib']:.1f}" if r["peak_memory_gib"] is not None else "-"
        print(f"{r['lever']:<18} {r['tokens_per_s']:>10,.0f} {mfu:>7} {r.get('vs_baseline', 0):>8.3f} "
              f"{r['first_loss']:>11.5f} {memory:>9}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
