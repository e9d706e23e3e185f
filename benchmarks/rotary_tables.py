"""ModernBERT's encoder compiled, forward + backward, with its rotary cos/sin computed (transformers) or read from
tables (`train.rotary_tables`), the two taking turns in one process.

    python -m benchmarks.rotary_tables                                  # the CPU proxy: hidden 64 x 12 layers, 4 x 128
    python -m benchmarks.rotary_tables --shape base --batch 256 --device cuda     # ModernBERT-base's width, bf16

Both sides are transformers' `ModernBertModel` with the same weights, each compiled as one graph (`dynamic=False`)
over its forward and a loss on the last hidden states (against a fixed random probe); the tabled copy has
`model/rotary_tables.py` applied. They run in rounds of `--steps` steps, A then B then A ..., and each round's ratio
is taken against its neighbour, so a machine whose speed drifts compares like with like. Reported: ms per step of
each side (median over rounds), the ratio tables / computed per round, and both sides' first loss (the same to 1e-5,
or the tables changed the model). The head and its vocabulary are left out: the lever is in the encoder. First it
counts the cos and sin entries that differ from what transformers computes on the device, for tables made there (as
the trainer makes them: 0 expected) and for tables made on the CPU and moved (a GPU's cos and sin may differ in
the last bit from a CPU's).
"""
from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from typing import Callable, Optional

import torch
from torch import nn

from benchmarks.arguments import add_shared, parse_checked, results_file
from benchmarks.host_overhead import MODERNBERT_BASE_FFN, SHAPES
from benchmarks.machine import machine
from core.atomic_files import write_text_atomic
from model.rotary_tables import tabulate_rotary


def encoder(shape: str, seq: int, vocab: int) -> nn.Module:
    """transformers' ModernBERT encoder at `shape`, with a sliding window shorter than `seq` where it fits."""
    from transformers import ModernBertConfig, ModernBertModel

    dims = dict(SHAPES[shape])
    if shape == "base":
        dims["intermediate_size"] = MODERNBERT_BASE_FFN
    config = ModernBertConfig(vocab_size=vocab, hidden_size=dims["hidden_size"], num_hidden_layers=dims["num_layers"],
                              num_attention_heads=dims["num_heads"], intermediate_size=dims["intermediate_size"],
                              max_position_embeddings=seq, local_attention=min(128, seq), pad_token_id=0,
                              bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2, reference_compile=False,
                              embedding_dropout=0.0, mlp_dropout=0.0, attention_dropout=0.0)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return ModernBertModel(config)


def differing_entries(module: nn.Module, tabled: nn.Module, device: torch.device) -> int:
    """How many cos and sin entries, over every position and attention kind, the tabled rotary embedding gives
    otherwise than transformers' forward does on `device` (0: the same bit for bit)."""
    x = torch.zeros(1, device=device)
    positions = torch.arange(module.max_seq_len_cached, device=device)[None]
    return sum(int((want != got).sum()) for kind in module.layer_types
               for want, got in zip(module(x, positions, kind), tabled(x, positions, kind)))


def step_fn(model: nn.Module, probe: torch.Tensor) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """Forward and a loss on the last hidden states (their mean against a fixed random `probe`), compiled as one
    graph."""
    def step(ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return (model(input_ids=ids, attention_mask=mask).last_hidden_state.float() * probe).mean()
    return torch.compile(step, dynamic=False)


def run(args: argparse.Namespace) -> dict:
    """Time the two sides in turn; their ms per step by round, the ratios and first losses."""
    device = torch.device(args.device)
    computed = encoder(args.shape, args.seq, args.vocab).to(device)
    tabled = copy.deepcopy(computed)
    if tabulate_rotary(tabled) != 1:  # on `device`, where the model is: as the trainer builds them
        raise RuntimeError("transformers' ModernBERT here has no rotary embedding the tables can replace")
    elsewhere = copy.deepcopy(computed.rotary_emb).cpu()
    tabulate_rotary(elsewhere)
    differing = {"tables_differing_entries": differing_entries(computed.rotary_emb, tabled.rotary_emb, device),
                 "cpu_tables_differing_entries": differing_entries(computed.rotary_emb, elsewhere.to(device), device)}
    gen = torch.Generator().manual_seed(0)
    probe = torch.randn(args.seq, computed.config.hidden_size, generator=gen).to(device)
    sides = {"computed": (computed, step_fn(computed, probe)), "tables": (tabled, step_fn(tabled, probe))}
    ids = torch.randint(5, args.vocab, (args.batch, args.seq), generator=gen).to(device)
    mask = torch.ones_like(ids)
    bf16 = args.precision == "bf16"

    def steps(name: str, count: int) -> tuple[float, float]:
        model, step = sides[name]
        loss = None
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(count):
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                loss = step(ids, mask)
            loss.backward()
            for p in model.parameters():
                p.grad = None
        if device.type == "cuda":
            torch.cuda.synchronize()
        return (time.perf_counter() - start) / count * 1e3, float(loss.detach())

    first = {name: steps(name, 1)[1] for name in sides}  # the compiling step, kept out of the timing
    for name in sides:
        if args.warmup:
            steps(name, args.warmup)
    ms = {name: [] for name in sides}
    for _ in range(args.rounds):
        for name in sides:
            ms[name].append(steps(name, args.steps)[0])
    ratios = [t / c for t, c in zip(ms["tables"], ms["computed"])]
    return {**differing, "ms_computed": statistics.median(ms["computed"]), "ms_tables": statistics.median(ms["tables"]),
            "ratio_tables_over_computed": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
            "rounds": {"computed": ms["computed"], "tables": ms["tables"]},
            "first_loss_computed": first["computed"], "first_loss_tables": first["tables"]}


def build_parser() -> argparse.ArgumentParser:
    """This benchmark's arguments."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_shared(parser, steps=10, warmup=3, batch=4, seq=128, out=results_file("rotary_tables"))
    parser.add_argument("--shape", choices=["proxy", "tiny", "base"], default="proxy")
    parser.add_argument("--rounds", type=int, default=6, help="turns of each side")
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--precision", choices=["fp32", "bf16"], default=None, help="default: bf16 on a GPU, else fp32")
    return parser


def check_args(args: argparse.Namespace) -> str:
    """What is wrong with parsed arguments that the parser alone cannot see ("" for nothing)."""
    if args.steps < 1 or args.warmup < 0 or args.rounds < 1:
        return "--steps and --rounds must be >= 1, --warmup >= 0"
    return ""


def main(argv: Optional[list[str]] = None) -> int:
    """Measure, print a line and write the results with the environment."""
    args = parse_checked(build_parser(), check_args, argv)
    args.precision = args.precision or ("bf16" if torch.device(args.device).type == "cuda" else "fp32")
    result = run(args)
    print(f"ModernBERT {args.shape} {args.batch} x {args.seq} {args.precision} on {args.device}: computed "
          f"{result['ms_computed']:.2f} ms, tables {result['ms_tables']:.2f} ms per step; tables / computed "
          f"{result['ratio_tables_over_computed']:.3f} ({result['ratio_min']:.3f}-{result['ratio_max']:.3f}); first loss "
          f"{result['first_loss_computed']:.7e} and {result['first_loss_tables']:.7e}; entries unlike transformers': "
          f"{result['tables_differing_entries']} in tables made on {args.device}, "
          f"{result['cpu_tables_differing_entries']} in tables made on the CPU", flush=True)
    env = {**machine(), "threads": torch.get_num_threads()}
    write_text_atomic(args.out, json.dumps({"env": env, "args": vars(args), "result": result}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
