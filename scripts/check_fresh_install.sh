#!/usr/bin/env bash
# The README's install route, as a new user takes it beside an existing transformers 5 stack: a new virtual
# environment gets `transformers>=5` and `numpy>=2.2` first, then the project's wheel and mosaicml-streaming without
# its metadata. Checks that nothing was downgraded, then prepares, trains on 2 ranks, exports and loads the export.
# Slow (it installs torch into a new environment): a developer's check, not part of `make test`.
# Usage: scripts/check_fresh_install.sh [WORK_DIR]
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
WORK="${1:-$(mktemp -d)}"
mkdir -p "$WORK"
PY="$WORK/venv/bin/python"

python3 -m venv "$WORK/venv"
"$PY" -m pip install --quiet --upgrade pip
"$PY" -m pip install --quiet "transformers>=5" "numpy>=2.2" torch
before=$("$PY" -m pip list --format=freeze | grep -iE '^(transformers|numpy|tokenizers|huggingface[-_]hub|torch)==' | sort)

"$PY" -m pip wheel --quiet --no-deps "$REPO" -w "$WORK/dist"
"$PY" -m pip install --quiet "$WORK"/dist/contrastive_pretrain-*.whl             # the README's two lines
"$PY" -m pip install --quiet --no-deps "mosaicml-streaming==0.13.0"
after=$("$PY" -m pip list --format=freeze | grep -iE '^(transformers|numpy|tokenizers|huggingface[-_]hub|torch)==' | sort)
echo "before the project: $before" | tr '\n' ' '; echo
echo "after the project:  $after" | tr '\n' ' '; echo
if [ "$before" != "$after" ]; then echo "FAIL: installing the project changed the stack above"; exit 1; fi

cd "$WORK"   # away from the checkout: the installed package, its configs included, is what runs
export OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1
"$PY" -m data_pipeline prepare --config data_pipeline/configs/demo.yaml output_dir=data \
  "sources=[{kind: text, path: '$REPO/data/kjv.txt.gz', text_documents: paragraph}]" tokenizer.vocab_size=2000 seq_len=64
"$PY" -m torch.distributed.run --standalone --nproc_per_node 2 -m pretrain train \
  --config pretrain/configs/demo_mlm.yaml data.path=data train.output_dir=run train.max_steps=20 train.eval_every=10 train.save_every=10 schedule.warmup_steps=2
"$PY" -m pretrain export --checkpoint run --out export
"$PY" - <<'PY'
import transformers
from transformers import AutoModelForMaskedLM, AutoTokenizer

model = AutoModelForMaskedLM.from_pretrained("export")
tok = AutoTokenizer.from_pretrained("export")
out = model(**tok(["In the beginning God created the heaven and the [MASK]."], return_tensors="pt"))
print(f"transformers {transformers.__version__}: {type(model).__name__} loads the export, logits {tuple(out.logits.shape)}")
PY
echo "OK: $WORK"
