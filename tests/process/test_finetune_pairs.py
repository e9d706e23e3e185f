"""Fine-tuning on sentence pairs and on a regression target (`--pair-column`, `--regression`), in process."""
from __future__ import annotations

import csv
import math
import random
from pathlib import Path

import pytest
from conftest import kjv_chapters
from test_evaluation import _tiny_random_bert_with_minilm_tokenizer

from evaluation.config import LocalTaskOptions


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    """A randomly initialised BERT (hidden 32) with MiniLM's tokenizer."""
    return _tiny_random_bert_with_minilm_tokenizer(tmp_path_factory.mktemp("pairs") / "tiny")


def _pair_task(path: Path, rows: int = 240) -> Path:
    """Verse pairs whose score is read off the second text only: 1.0 when it opens with "yes", else 0.0."""
    verses = [line.strip() for chapter in kjv_chapters(12) for line in chapter.splitlines() if line.strip()]
    rng = random.Random(0)
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(["first", "second", "score"])
        for _ in range(rows):
            yes = rng.random() < 0.5
            writer.writerow([rng.choice(verses)[:120], f"{'yes' if yes else 'no'} {rng.choice(verses)[:60]}", float(yes)])
    return path


def test_the_pair_column_is_the_second_segment(tiny, tmp_path):
    from evaluation.finetune import encode
    from evaluation.tasks import load_task
    from transformers import AutoTokenizer

    task = _pair_task(tmp_path / "pairs.csv", rows=20)
    spec, train, _ = load_task(f"csv:{task}", LocalTaskOptions(text_column="first", pair_column="second",
                                                                 label_column="score", regression=True))
    tokenizer = AutoTokenizer.from_pretrained(tiny)
    enc = encode(spec, train, tokenizer, 128)
    for i, row in enumerate(train):
        second = tokenizer(row["second"], add_special_tokens=False)["input_ids"]
        types = enc["token_type_ids"][i]
        assert sum(types) == len(second) + 1  # its tokens and their [SEP]
        assert enc["input_ids"][i][len(types) - sum(types):-1] == second
    assert enc["labels"] == [float(row["score"]) for row in train]


def test_a_regression_on_pairs_learns_what_only_the_second_text_says(tiny, tmp_path):
    from evaluation.finetune import finetune

    task = _pair_task(tmp_path / "pairs.csv")
    result = finetune(str(tiny), f"csv:{task}", [1], overrides={"lr": 5e-3, "epochs": 8, "batch_size": 16,
                                                                "max_length": 32, "warmup_ratio": 0.0},
                      local=LocalTaskOptions(text_column="first", pair_column="second", label_column="score",
                                             regression=True, val_fraction=0.25),
                      out=str(tmp_path / "result.json"))
    assert result["num_labels"] == 1 and result["majority_baseline"] is None
    metrics = result["seeds"][0]["metrics"]
    assert set(metrics) == {"pearson", "spearman"} and all(math.isfinite(v) for v in metrics.values())
    assert metrics["pearson"] > 0.8, metrics  # the score is in the pair text alone: without it, no correlation
