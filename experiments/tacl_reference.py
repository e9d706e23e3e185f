"""An independent reference loop for TaCL's self-similarity result (issue 31, item 2).

Plain PyTorch and transformers: no code from `model/`, `pretrain/`, `data_pipeline/`, DeepSpeed or the
project's loader. It reads the prepared MDS shards with mosaicml-streaming's own `LocalDataset`, masks
them itself and writes the losses from the paper (Su et al. 2022, eq. 1-3):

    anchors  a_i = student's last-layer state at a position i picked for masking (80/10/10, 15%)
    L_TaCL   = mean_i -log( exp(cos(a_i, t_i)/tau) / sum_{j in the sequence, not padding} exp(cos(a_i, t_j)/tau) )
    L        = L_MLM + L_TaCL                (t = the frozen teacher's last-layer states of the clean text)

with the budget of RESULTS.md's TaCL rows: the teacher's own weights as the student's start, 400 steps x 32
sequences of 128 tokens, AdamW (lr 5e-4, betas 0.9/0.98, eps 1e-6, weight decay 0.01 off biases and
LayerNorm weights), 40 warm-up steps then linear decay to 0, gradient clipping at 1.0; in fp32, where the
project's rows trained in bf16 autocast: a difference between the two then points at precision first.
Validation shows every picked token as [MASK] (as the trainer's validation does); training masks 80/10/10.

Variants (`--variant`):
- `tacl`: the loss above;
- `mlm`: MLM only (the same masks and data order as `tacl` of the same seed);
- `tacl-unmasked`: TaCL's anchors are only the positions the student reads unchanged (not picked for
  masking, or picked and kept): the anchors read clean text, as the self-similarity measurement does;
- `tacl-no-same-id`: TaCL with the negatives that carry the anchor's own token id removed from the
  denominator (the positive stays): no pressure to separate same-id tokens by context.

Every `--every` steps (and at step 0, the teacher itself) it records the self-similarity of every layer
(the last one is `last_hidden_state`) on the probe sentences ([CLS] s [SEP], pairs pooled over sentences)
and on clean validation windows, the self-similarity of the anchors' own last-layer states on masked
validation windows (80/10/10 as in training; pairs of anchors within a window), the last layer's over every position of the masked
windows (what the trainer's TaCL validation diagnostic reads), and the validation MLM and TaCL losses (the
paper's TaCL loss, whatever the variant trains).

    python -m experiments.tacl_reference --teacher runs/results/tacl_bert/teacher_bert \\
        --data runs/equal_compute/data --sentences runs/corpora/probe_sentences.txt \\
        --variant tacl --seed 1 --out experiments/results/tacl_reference/tacl_seed1.json
"""
from __future__ import annotations

import argparse
import json
import math
import os
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from benchmarks.arguments import add_shared

SPECIAL_MAX = 4  # the prepared vocabularies put pad, unk, cls, sep, mask at ids 0..4
PAD = 0
VARIANTS = ("tacl", "mlm", "tacl-unmasked", "tacl-no-same-id")


def windows(split_dir: Path) -> torch.Tensor:
    """Every window of a split as one [N, L] int64 tensor, read with streaming's LocalDataset; short ones padded with 0."""
    from streaming import LocalDataset

    data = LocalDataset(str(split_dir))
    rows = [torch.from_numpy(data[i]["input_ids"].astype("int64")) for i in range(len(data))]
    return torch.nn.utils.rnn.pad_sequence(rows, batch_first=True, padding_value=PAD)


def mask_batch(ids: torch.Tensor, vocab: int, mask_id: int, prob: float, gen: torch.Generator):
    """BERT's masking: each non-special token picked with `prob`; picked -> 80% [MASK], 10% random, 10% kept."""
    can = ids > SPECIAL_MAX
    picked = (torch.rand(ids.shape, generator=gen) < prob) & can
    action = torch.rand(ids.shape, generator=gen)
    random_ids = torch.randint(SPECIAL_MAX + 1, vocab, ids.shape, generator=gen)
    inputs = torch.where(picked & (action < 0.8), torch.full_like(ids, mask_id), ids)
    inputs = torch.where(picked & (action >= 0.8) & (action < 0.9), random_ids, inputs)
    return inputs, picked


def tacl_term(student: torch.Tensor, teacher: torch.Tensor, anchors: torch.Tensor, keys: torch.Tensor,
              tau: float, drop_same_id: torch.Tensor | None = None) -> torch.Tensor:
    """Mean over anchors of -log softmax over the sequence's teacher tokens of cos/tau, the positive at the anchor."""
    s = F.normalize(student, dim=-1)
    t = F.normalize(teacher, dim=-1)
    losses = []
    for b in range(student.shape[0]):
        rows = anchors[b].nonzero().squeeze(1)
        if rows.numel() == 0:
            continue
        logits = s[b, rows] @ t[b].T / tau  # [anchors, L]
        allowed = keys[b][None, :].expand(len(rows), -1).clone()
        if drop_same_id is not None:  # same id as the anchor's own token, except the positive itself
            allowed &= drop_same_id[b][None, :] != drop_same_id[b, rows][:, None]
            allowed[torch.arange(len(rows)), rows] = True
        logits = logits.masked_fill(~allowed, float("-inf"))
        losses.append(-(logits[torch.arange(len(rows)), rows] - torch.logsumexp(logits, dim=1)))
    return torch.cat(losses).mean() if losses else student.sum() * 0.0


def pooled_pairs(states: torch.Tensor, keep: torch.Tensor) -> tuple[float, float]:
    """(sum of cosines over unordered pairs of kept rows, number of pairs) of one sequence's states [L, H]."""
    h = F.normalize(states[keep].double(), dim=-1)
    n = h.shape[0]
    if n < 2:
        return 0.0, 0.0
    cos = h @ h.T
    return float((cos.sum() - n) / 2), n * (n - 1) / 2  # the diagonal of unit vectors sums to n


def layers_of(encoder, ids: torch.Tensor, attention: torch.Tensor) -> list[torch.Tensor]:
    """Layer outputs 1..L, the last taken from last_hidden_state (what the heads and the losses read)."""
    out = encoder(input_ids=ids, attention_mask=attention, output_hidden_states=True)
    return [*out.hidden_states[1:-1], out.last_hidden_state]


@torch.no_grad()
def probe_self_similarity(encoder, tokenizer, sentences: list[str]) -> list[float]:
    """Per layer: cosines of every pair of tokens of `[CLS] s [SEP]`, pooled over the sentences."""
    totals = pairs = None
    for first in range(0, len(sentences), 64):
        enc = tokenizer(sentences[first:first + 64], truncation=True, padding=True, return_tensors="pt",
                        max_length=min(512, encoder.config.max_position_embeddings))
        hidden = layers_of(encoder, enc["input_ids"], enc["attention_mask"])
        totals = totals or [0.0] * len(hidden)
        pairs = pairs or [0.0] * len(hidden)
        for layer, h in enumerate(hidden):
            for row in range(h.shape[0]):
                s, c = pooled_pairs(h[row], enc["attention_mask"][row].bool())
                totals[layer] += s
                pairs[layer] += c
    return [t / c for t, c in zip(totals, pairs)]


@torch.no_grad()
def validation_measures(student, teacher, val: torch.Tensor, val_inputs: torch.Tensor, val_picked: torch.Tensor,
                        val_train_inputs: torch.Tensor, tau: float) -> dict:
    """Self-similarity of every layer on clean windows, of the anchors on masked windows, and the losses."""
    attention = (val != PAD).long()
    anchor_sum = anchor_pairs = masked_sum = masked_pairs = 0.0
    totals = pairs = None
    mlm_sum = tacl_sum = count = 0.0
    for first in range(0, len(val), 32):
        ids, inputs, picked = val[first:first + 32], val_inputs[first:first + 32], val_picked[first:first + 32]
        train_inputs = val_train_inputs[first:first + 32]
        att = attention[first:first + 32]
        hidden = layers_of(student.base_model, ids, att)
        totals = totals or [0.0] * len(hidden)
        pairs = pairs or [0.0] * len(hidden)
        for layer, h in enumerate(hidden):
            for row in range(h.shape[0]):
                s, c = pooled_pairs(h[row], att[row].bool())
                totals[layer] += s
                pairs[layer] += c
        masked_last = student.base_model(input_ids=inputs, attention_mask=att).last_hidden_state
        anchor_last = student.base_model(input_ids=train_inputs, attention_mask=att).last_hidden_state  # 80/10/10, as in training
        for row in range(len(ids)):
            s, c = pooled_pairs(anchor_last[row], picked[row])
            anchor_sum += s
            anchor_pairs += c
            s, c = pooled_pairs(masked_last[row], att[row].bool())  # what the trainer's TaCL diagnostic reads
            masked_sum += s
            masked_pairs += c
        logits = mlm_logits(student, masked_last[picked])
        mlm_sum += float(F.cross_entropy(logits.double(), ids[picked], reduction="sum"))
        teacher_last = teacher(input_ids=ids, attention_mask=att).last_hidden_state
        n = int(picked.sum())
        tacl_sum += float(tacl_term(anchor_last.double(), teacher_last.double(), picked, att.bool(), tau)) * n
        count += n
    return {"self_similarity_validation": [t / c for t, c in zip(totals, pairs)],
            "anchor_self_similarity": anchor_sum / anchor_pairs,
            "masked_window_self_similarity": masked_sum / masked_pairs,
            "mlm_loss": mlm_sum / count, "tacl_loss": tacl_sum / count}


def unigram_entropy(ids: torch.Tensor) -> float:
    """Entropy (nats) of the non-special token frequencies, the loss of a model that ignores context.

    With the Miller-Madow term (K - 1) / 2N, as the trainer reports it: the plug-in estimate from a few
    thousand tokens of an 8k vocabulary reads about 0.07 nats low."""
    tokens = ids[ids > SPECIAL_MAX]
    p = torch.bincount(tokens).double()
    p = p[p > 0] / p.sum()
    return float(-(p * p.log()).sum() + (p.numel() - 1) / (2 * tokens.numel()))


def mlm_logits(student, hidden: torch.Tensor) -> torch.Tensor:
    """The masked-LM head of a transformers BertForMaskedLM (`cls`) or ModernBertForMaskedLM (`head`, `decoder`)."""
    if hasattr(student, "cls"):
        return student.cls(hidden)
    return student.decoder(student.head(hidden))


def optimizer_for(model, lr: float, weight_decay: float) -> torch.optim.AdamW:
    """AdamW with no decay on biases and LayerNorm weights."""
    decay, plain = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (plain if p.ndim < 2 or "LayerNorm" in name or "norm" in name.lower() else decay).append(p)
    return torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay}, {"params": plain, "weight_decay": 0.0}],
                             lr=lr, betas=(0.9, 0.98), eps=1e-6)


def summarize(folder: Path) -> dict:
    """Per variant, over its seeds: the change of every measurement from step 0 (the teacher) to the last step."""
    import statistics

    runs: dict[str, list[dict]] = {}
    for path in sorted(folder.glob("*_seed*.json")):
        record = json.loads(path.read_text())
        runs.setdefault(record["args"]["variant"], []).append(record)
    table = {}
    for variant in [v for v in VARIANTS if v in runs]:
        rows = []
        for record in runs[variant]:
            first, last = record["points"][0], record["points"][-1]
            rows.append({"seed": record["args"]["seed"],
                         "probe_change_by_layer": [b / a - 1.0 for a, b in zip(first["self_similarity_probe"], last["self_similarity_probe"])],
                         "validation_change_by_layer": [b / a - 1.0 for a, b in
                                                        zip(first["self_similarity_validation"], last["self_similarity_validation"])],
                         "teacher_probe": first["self_similarity_probe"], "probe": last["self_similarity_probe"],
                         "anchors": [first["anchor_self_similarity"], last["anchor_self_similarity"]],
                         "masked_windows": [first["masked_window_self_similarity"], last["masked_window_self_similarity"]],
                         "mlm_loss": last["mlm_loss"], "tacl_loss": last["tacl_loss"],
                         "below_unigram": record["unigram_entropy_validation"] - last["mlm_loss"],
                         "probe_last_by_step": {p["step"]: p["self_similarity_probe"][-1] for p in record["points"]}})
        last_change = [r["probe_change_by_layer"][-1] for r in rows]
        table[variant] = {"seeds": rows, "last_layer_change_mean": statistics.mean(last_change),
                          "last_layer_change_std": statistics.stdev(last_change) if len(rows) > 1 else 0.0}
        print(f"{variant:16s} last layer (probe) {table[variant]['last_layer_change_mean']:+.1%} ± "
              f"{table[variant]['last_layer_change_std']:.1%} over {len(rows)} seed(s); by layer "
              + " / ".join("[" + ", ".join(f"{c:+.1%}" for c in r["probe_change_by_layer"]) + "]" for r in rows)
              + "; anchors " + " / ".join(f"{r['anchors'][0]:.3f}->{r['anchors'][1]:.3f}" for r in rows)
              + "; masked windows " + " / ".join(f"{r['masked_windows'][0]:.3f}->{r['masked_windows'][1]:.3f}" for r in rows)
              + "; val MLM " + " / ".join(f"{r['mlm_loss']:.3f} ({r['below_unigram']:.2f} below unigram)" for r in rows))
    return table


def draw_trajectories(table: dict, out: Path) -> None:
    """Last-layer probe self-similarity against the step, one line per variant (mean of its seeds, range shaded)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for variant, entry in table.items():
        by_step = [{int(k): v for k, v in seed["probe_last_by_step"].items()} for seed in entry["seeds"]]
        steps = sorted(by_step[0])
        values = [[seed[k] for k in steps] for seed in by_step]
        mean = [sum(v) / len(v) for v in zip(*values)]
        line, = ax.plot(steps, mean, marker="o", label=f"{variant} ({len(values)} seeds)")
        ax.fill_between(steps, [min(v) for v in zip(*values)], [max(v) for v in zip(*values)], color=line.get_color(), alpha=0.2)
    ax.set_xlabel("step (step 0: the teacher)")
    ax.set_ylabel("last-layer self-similarity (probe sentences)")
    ax.set_title("Reference loop, from the 2-layer BERT teacher")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120, bbox_inches="tight")
    plt.close(fig)


def main() -> None:
    """Train one variant from the teacher and write its measurements every --every steps (or --summarize a folder)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--summarize", default=None, help="a folder of this script's JSONs: print and write summary.json")
    parser.add_argument("--figure", default=None, help="with --summarize: a PNG of the last layer against the step")
    parser.add_argument("--teacher", help="the teacher's HF folder (an MLM export)")
    add_shared(parser, data=None)
    parser.add_argument("--sentences", help="probe sentences, one per line")
    parser.add_argument("--variant", choices=VARIANTS, default="tacl")
    parser.add_argument("--seed", type=int, default=1)
    add_shared(parser, steps=400, batch=32, lr=5e-4, warmup=40)
    parser.add_argument("--mask-prob", type=float, default=0.15)
    parser.add_argument("--tau", type=float, default=0.01)
    parser.add_argument("--every", type=int, default=100)
    parser.add_argument("--val-windows", type=int, default=256)
    add_shared(parser, threads=int(os.environ.get("OMP_NUM_THREADS", "2")))
    add_shared(parser, out=None)
    args = parser.parse_args()
    if args.summarize:
        folder = Path(args.summarize)
        table = summarize(folder)
        (folder / "summary.json").write_text(json.dumps(table, indent=1) + "\n")
        if args.figure:
            draw_trajectories(table, Path(args.figure))
        return
    if not all((args.teacher, args.data, args.sentences, args.out)):
        parser.error("--teacher, --data, --sentences and --out are required to train")
    torch.set_num_threads(args.threads)
    from transformers import AutoModel, AutoModelForMaskedLM, AutoTokenizer

    torch.manual_seed(args.seed)
    tokenizer = AutoTokenizer.from_pretrained(args.teacher)
    student, info = AutoModelForMaskedLM.from_pretrained(args.teacher, output_loading_info=True, dtype=torch.float32)
    if info["missing_keys"]:
        raise SystemExit(f"{args.teacher}: the masked-LM head is not in the export ({info['missing_keys']})")
    student.train()
    teacher = AutoModel.from_pretrained(args.teacher, dtype=torch.float32).eval().requires_grad_(False)
    with torch.no_grad():  # the student starts as the teacher: the same encoder output
        probe = torch.arange(SPECIAL_MAX + 1, SPECIAL_MAX + 17)[None]
        student.eval()
        if not torch.allclose(student.base_model(input_ids=probe).last_hidden_state, teacher(input_ids=probe).last_hidden_state):
            raise SystemExit("the student's encoder does not start from the teacher's weights")
        student.train()
    vocab, mask_id = student.config.vocab_size, tokenizer.mask_token_id
    train_ids, val = windows(Path(args.data) / "train"), windows(Path(args.data) / "validation")[:args.val_windows]
    sentences = [s.strip() for s in Path(args.sentences).read_text(encoding="utf-8").splitlines() if s.strip()]
    val_gen = torch.Generator().manual_seed(12345)  # the same validation masks for every run
    val_train_inputs, val_picked = mask_batch(val, vocab, mask_id, args.mask_prob, val_gen)
    val_inputs = torch.where(val_picked, torch.full_like(val, mask_id), val)  # validation shows every pick as [MASK], as the trainer's
    order = torch.randperm(len(train_ids), generator=torch.Generator().manual_seed(args.seed))
    mask_gen = torch.Generator().manual_seed(1000 + args.seed)  # same masks for every variant of a seed
    opt = optimizer_for(student, args.lr, 0.01)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: (s + 1) / args.warmup if s < args.warmup else max(0.0, (args.steps - s) / (args.steps - args.warmup)))
    record = {"args": vars(args), "unigram_entropy_validation": unigram_entropy(val), "points": []}

    def measure(step: int, train_losses: dict) -> None:
        student.eval()
        point = {"step": step, "train": train_losses,
                 "self_similarity_probe": probe_self_similarity(student.base_model, tokenizer, sentences),
                 **validation_measures(student, teacher, val, val_inputs, val_picked, val_train_inputs, args.tau)}
        student.train()
        record["points"].append(point)
        print(f"step {step}: probe self-sim {['%.3f' % v for v in point['self_similarity_probe']]}, "
              f"validation {['%.3f' % v for v in point['self_similarity_validation']]}, anchors "
              f"{point['anchor_self_similarity']:.3f}, val MLM {point['mlm_loss']:.3f} "
              f"(unigram {record['unigram_entropy_validation']:.3f}), val TaCL {point['tacl_loss']:.3f}", flush=True)

    measure(0, {})
    start, window = time.time(), {"mlm": 0.0, "tacl": 0.0, "n": 0}
    for step in range(1, args.steps + 1):
        ids = train_ids[order[(step - 1) * args.batch:step * args.batch]]
        inputs, picked = mask_batch(ids, vocab, mask_id, args.mask_prob, mask_gen)
        attention = (ids != PAD).long()
        hidden = student.base_model(input_ids=inputs, attention_mask=attention).last_hidden_state
        mlm = F.cross_entropy(mlm_logits(student, hidden[picked]), ids[picked])
        loss = mlm
        tacl = torch.zeros(())
        if args.variant != "mlm":
            with torch.no_grad():
                teacher_hidden = teacher(input_ids=ids, attention_mask=attention).last_hidden_state
            anchors = (inputs == ids) & (ids > SPECIAL_MAX) if args.variant == "tacl-unmasked" else picked
            tacl = tacl_term(hidden, teacher_hidden, anchors, attention.bool(), args.tau,
                             ids if args.variant == "tacl-no-same-id" else None)
            loss = mlm + tacl
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(student.parameters(), 1.0)
        opt.step()
        schedule.step()
        window["mlm"] += mlm.item()
        window["tacl"] += tacl.item()
        window["n"] += 1
        if step % args.every == 0 or step == args.steps:
            train_losses = {"mlm_loss": window["mlm"] / window["n"], "tacl_loss": window["tacl"] / window["n"],
                            "seconds": time.time() - start}
            window = {"mlm": 0.0, "tacl": 0.0, "n": 0}
            measure(step, train_losses)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=1) + "\n")
    os.replace(tmp, out)
    first, last = record["points"][0], record["points"][-1]
    change = last["self_similarity_probe"][-1] / first["self_similarity_probe"][-1] - 1.0
    print(f"{args.variant} seed {args.seed}: last-layer probe self-similarity {first['self_similarity_probe'][-1]:.3f} -> "
          f"{last['self_similarity_probe'][-1]:.3f} ({change:+.1%}); wrote {out}")
    if not math.isfinite(last["mlm_loss"]):
        raise SystemExit("the run diverged")


if __name__ == "__main__":
    main()
