#!/usr/bin/env bash
# The whole path on the bundled KJV corpus, on CPU, in a few minutes:
# prepare (tokenizer + MDS shards) -> 2-rank DeepSpeed ZeRO-2 MLM (ModernBERT) -> checkpoint -> HF export ->
# validation MLM loss against the unigram entropy -> fill-mask.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${DEMO_OUT:-runs/demo}
NPROC=${DEMO_NPROC:-2}
rm -rf "$OUT"   # the demo always starts fresh; real runs resume from their output folder

python -m data_pipeline prepare --config data_pipeline/configs/demo.yaml output_dir="$OUT/data"

OMP_NUM_THREADS=1 torchrun --standalone --nproc_per_node "$NPROC" -m pretrain train \
  --config pretrain/configs/demo_mlm.yaml data.path="$OUT/data" train.output_dir="$OUT/train"

python -m pretrain export --checkpoint "$OUT/train" --out "$OUT/export"

HF_HUB_OFFLINE=1 python - "$OUT/export" "$OUT/train/metrics.jsonl" <<'PY'
import json
import sys
from transformers import pipeline

# Did it learn? The validation MLM loss (every picked token shown as [MASK]) against the unigram
# entropy of the same validation tokens: the loss of a model that learned only word frequencies.
val = [r for r in map(json.loads, open(sys.argv[2])) if r["split"] == "validation"][-1]
print(f"validation at step {val['step']}: MLM loss {val['mlm_loss']:.3f} nats, unigram entropy "
      f"{val['unigram_entropy']:.3f} nats: {val['mlm_loss_below_unigram']:.2f} nats below unigram")
fill = pipeline("fill-mask", model=sys.argv[1])
for text, want in [("In the beginning God created the heaven and the [MASK].", "earth"),
                   ("And the LORD spake unto [MASK], saying,", "moses"),
                   ("And it came to [MASK], when", "pass"),
                   ("and the children of [MASK] went out", "israel")]:
    preds = fill(text, top_k=3)
    guesses = ", ".join(f"{p['token_str']!r} {p['score']:.2f}" for p in preds)
    hit = any(p["token_str"].strip().lower() == want for p in preds)
    print(f"fill-mask: {text}  ->  {guesses}  [{'top 3 has' if hit else 'top 3 lacks'} {want!r}]")
PY

cat <<MSG

Demo finished. Artefacts:
  shards + manifest   $OUT/data/{train,validation}/  $OUT/data/manifest.json
  tokenizer           $OUT/data/tokenizer/
  checkpoints         $OUT/train/checkpoints/
  TensorBoard logs    $OUT/train/tensorboard/   (tensorboard --logdir $OUT/train/tensorboard)
  plain-text log      $OUT/train/train.log  and per-step metrics in $OUT/train/metrics.jsonl
  Hugging Face export $OUT/export/   (AutoModelForMaskedLM.from_pretrained("$OUT/export"))
  model card          $OUT/export/README.md   (objective, steps, tokens, final losses, data manifest)
MSG
