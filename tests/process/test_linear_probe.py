"""Frozen-encoder linear probes: the features against an independent per-sentence computation, the probe
against data whose separability is known by construction, and the CLI on a sequence and a token task."""
from __future__ import annotations

import csv
import json
import random

import numpy as np
import pytest
import torch
from conftest import run_cli
from test_evaluation import _tiny_random_bert_with_minilm_tokenizer


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A randomly initialised BERT (hidden 32) with MiniLM's WordPiece tokenizer: its features still carry word identity."""
    return _tiny_random_bert_with_minilm_tokenizer(tmp_path_factory.mktemp("probe") / "tiny")


def test_probe_separates_separable_classes_and_not_noise():
    from evaluation.linear_probe import fit_probe

    rng = np.random.default_rng(0)
    y = rng.integers(0, 4, 600)
    x = rng.normal(size=(600, 16))
    x[np.arange(600), y] += 4.0  # class k is shifted along axis k: linearly separable up to the noise
    pred, chosen = fit_probe(x[:400], y[:400], x[400:])
    assert (pred == y[400:]).mean() > 0.95
    assert chosen["folds"] == 5 and set(chosen["cv_scores"]) == {"0.01", "0.1", "1.0", "10.0"}
    assert chosen["cv_metric"] == "accuracy"
    assert chosen["c"] in (0.01, 0.1, 1.0, 10.0) and chosen["cv_scores"][str(chosen["c"])] == max(chosen["cv_scores"].values())
    noise = rng.integers(0, 4, 600)  # labels independent of the features
    pred, _ = fit_probe(x[:400], noise[:400], x[400:])
    assert (pred == noise[400:]).mean() < 0.4


def test_probe_falls_back_to_the_grid_middle_without_folds():
    from evaluation.linear_probe import fit_probe

    x = np.array([[0.0], [1.0], [2.0]])
    _, chosen = fit_probe(x, np.array([0, 1, 2]), x, c_grid=(0.1, 1.0, 10.0))
    assert chosen == {"c": 1.0, "folds": 0, "cv_metric": "accuracy", "cv_scores": {}}  # no class fills two folds: no CV


def test_probe_picks_c_by_the_tasks_metric_not_accuracy():
    """88/12 classes and a weak signal: accuracy's best C predicts the common class (Matthews 0); the Matthews of
    each C is the mean over the same stratified folds, computed here with scikit-learn directly."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import matthews_corrcoef
    from sklearn.model_selection import StratifiedKFold
    from sklearn.preprocessing import StandardScaler

    from evaluation.linear_probe import fit_probe
    from evaluation.tasks import GLUE

    rng = np.random.default_rng(1)
    y = (rng.random(300) < 0.12).astype(int)
    x = rng.normal(size=(300, 20))
    x[:, 0] += 0.9 * y
    grid = (0.001, 0.01, 0.1, 1.0, 10.0)
    _, by_accuracy = fit_probe(x[:200], y[:200], x[200:], c_grid=grid)
    pred, chosen = fit_probe(x[:200], y[:200], x[200:], c_grid=grid, metric=GLUE["cola"].selection_metric())
    assert chosen["cv_metric"] == "matthews" and by_accuracy["c"] == 0.001 and chosen["c"] == 1.0
    for c in grid:
        mcc = []
        for tr, te in StratifiedKFold(5, shuffle=True, random_state=0).split(x[:200], y[:200]):
            scale = StandardScaler().fit(x[tr])
            fit = LogisticRegression(C=c, max_iter=2000).fit(scale.transform(x[tr]), y[tr])
            mcc.append(matthews_corrcoef(y[te], fit.predict(scale.transform(x[te]))))
        assert chosen["cv_scores"][str(c)] == pytest.approx(np.mean(mcc), abs=1e-12)
    assert len(set(pred)) == 2  # the chosen probe predicts the rare class too


def test_features_equal_an_independent_per_sentence_computation(tiny):
    """Batched, padded features equal each sentence's own forward: mean over its tokens, its first token, word means."""
    from transformers import AutoModel, AutoTokenizer

    from evaluation.linear_probe import sequence_features, word_features

    texts = ["the cat sat", "a considerably longer sentence about unbelievable tokenisation", "hi"]
    words = [t.split() for t in texts]
    tok, model = AutoTokenizer.from_pretrained(tiny), AutoModel.from_pretrained(tiny).eval()
    for layer in (-1, 1):
        feats = sequence_features(str(tiny), texts, layer=layer, batch_size=2)
        per_word = word_features(str(tiny), words, layer=layer, batch_size=2)
        for i, text in enumerate(texts):
            with torch.no_grad():
                h = model(**tok(text, return_tensors="pt"), output_hidden_states=True).hidden_states[layer][0].double()
            np.testing.assert_allclose(feats["mean"][i], h.mean(0).numpy(), rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(feats["cls"][i], h[0].numpy(), rtol=1e-5, atol=1e-5)
            enc = tok(words[i], is_split_into_words=True, return_tensors="pt")
            with torch.no_grad():
                hw = model(**enc, output_hidden_states=True).hidden_states[layer][0].double()
            ids = enc.word_ids(0)
            assert per_word[i].shape == (len(words[i]), 32)
            for w in range(len(words[i])):
                rows = [j for j, k in enumerate(ids) if k == w]
                np.testing.assert_allclose(per_word[i][w], hw[rows].mean(0).numpy(), rtol=1e-5, atol=1e-5)
    assert len(tok.tokenize("unbelievable tokenisation")) > 2  # the word means above did average sub-tokens


def test_features_of_a_model_with_few_positions_read_the_text_it_can_hold(tmp_path):
    """An export of 16 positions, texts longer than that: the features of their first 16 tokens (max_length 128
    would have handed the model positions it has no embedding for)."""
    from transformers import AutoModel, AutoTokenizer, BertConfig, BertModel

    from evaluation.linear_probe import sequence_features, word_features

    short = _tiny_random_bert_with_minilm_tokenizer(tmp_path / "short")
    BertModel(BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=64, max_position_embeddings=16)).save_pretrained(str(short))
    texts = ["a considerably longer sentence about unbelievable tokenisation than sixteen tokens could ever hold"]
    tok, model = AutoTokenizer.from_pretrained(short), AutoModel.from_pretrained(short).eval()
    assert len(tok(texts[0])["input_ids"]) > 16
    with torch.no_grad():
        h = model(**tok(texts[0], truncation=True, max_length=16, return_tensors="pt")).last_hidden_state[0].double()
    np.testing.assert_allclose(sequence_features(str(short), texts)["mean"][0], h.mean(0).numpy(), rtol=1e-5, atol=1e-5)
    words = word_features(str(short), [texts[0].split()])[0]
    assert np.isfinite(words[0]).all() and np.isnan(words[-1]).all()  # the words past the limit were cut away
    # XLNet has no limit (its config says -1): the text is read whole.
    from transformers import XLNetConfig, XLNetModel

    XLNetModel(XLNetConfig(vocab_size=30522, d_model=32, n_layer=1, n_head=2, d_inner=64)).save_pretrained(str(short))
    assert AutoModel.from_pretrained(short).config.max_position_embeddings == -1
    words = word_features(str(short), [texts[0].split()])[0]
    assert np.isfinite(words).all() and sequence_features(str(short), texts)["mean"].shape == (1, 32)


ANIMALS, TOOLS, FILLER = ["cat", "dog", "horse", "sheep"], ["hammer", "saw", "drill", "spade"], ["the", "a", "big", "old", "red"]


def _token_rows(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        target = rng.choice(ANIMALS + TOOLS)
        words = [rng.choice(FILLER) for _ in range(rng.randint(1, 4))] + [target] + [rng.choice(FILLER)]
        rows.append({"tokens": words, "tags": ["-" if w != target else ("animal" if w in ANIMALS else "tool") for w in words]})
    return rows


def test_token_probe_cli_scores_only_the_tagged_words(tiny, tmp_path):
    train, dev = tmp_path / "train.jsonl", tmp_path / "dev.jsonl"
    for path, rows in ((train, _token_rows(200, 1)), (dev, _token_rows(80, 2))):
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "probe.json"
    proc = run_cli("pretrain", ["evaluate", "linear-probe", "--model", str(tiny), "--task", f"json:{train}",
                                "--validation-file", str(dev), "--token-task", "--text-column", "tokens", "--label-column",
                                "tags", "--ignore-tag=-", "--out", str(out)])
    result = json.loads(out.read_text())["results"][0]
    assert result["kind"] == "token" and result["label_names"] == ["animal", "tool"]
    assert result["train_examples"] == 200 and result["eval_examples"] == 80  # one tagged word per row; '-' is no example
    assert result["probes"]["word"]["accuracy"] > 0.9 > result["majority_baseline"]["accuracy"]
    assert "word accuracy" in proc.stdout


def test_sequence_probe_cli_and_its_errors(tiny, tmp_path):
    rng = random.Random(0)
    path = tmp_path / "topics.csv"
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["text", "topic"])
        for _ in range(240):
            topic = rng.choice(["animals", "tools"])
            words = [rng.choice(FILLER) for _ in range(6)] + [rng.choice(ANIMALS if topic == "animals" else TOOLS)]
            rng.shuffle(words)
            w.writerow([" ".join(words), topic])
    out = tmp_path / "probe.json"
    run_cli("pretrain", ["evaluate", "linear-probe", "--model", str(tiny), "--task", f"csv:{path}", "--label-column",
                         "topic", "layer=0", "--out", str(out)])
    saved = json.loads(out.read_text())
    result = saved["results"][0]
    assert saved["config"]["layer"] == 0 and saved["config"]["data"]["label_column"] == "topic"
    assert set(result["probes"]) == {"mean", "cls"} and result["eval_examples"] == 24  # val_fraction 0.1
    # The mean of the embeddings carries the topic word; the [CLS] embedding is the same for every row.
    assert result["probes"]["mean"]["accuracy"] > 0.9
    assert result["probes"]["cls"]["accuracy"] <= result["majority_baseline"]["accuracy"] + 0.1

    from pretrain.cli import main

    cases = [(["--task", f"csv:{path}"], "no column 'label'"),
             (["--task", f"csv:{path}", "--label-column", "topic", "features=[max]"], "unknown probe feature"),
             (["--task", f"csv:{path}", "--label-column", "topic", "folds=1"], "'folds' must be >= 2"),
             (["--task", f"csv:{tmp_path / 'missing.csv'}"], "missing.csv")]
    for extra, message in cases:
        refused = run_cli("pretrain", ["evaluate", "linear-probe", "--model", str(tiny), *extra], check=False)
        assert refused.returncode == 2 and message in refused.stderr, (extra, refused.stderr)
        assert refused.stderr.strip().count("\n") == 0 and "Traceback" not in refused.stderr
    assert main(["evaluate", "linear-probe", "--task", "sst2"]) == 2


def test_ignored_tags_are_not_labels_when_fine_tuning(tiny, tmp_path):
    from transformers import AutoTokenizer

    from evaluation.finetune import encode
    from evaluation.tasks import LocalTaskOptions, load_task

    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in _token_rows(20, 3)))
    spec, train, _ = load_task(f"json:{path}", LocalTaskOptions(text_column="tokens", label_column="tags", token_task=True,
                                                                ignore_tag="-"))
    assert spec.label_names == ("animal", "tool")
    tok = AutoTokenizer.from_pretrained(tiny)
    enc = encode(spec, train, tok, 64)
    for i, row in enumerate(train):
        ids = tok(row["tokens"], is_split_into_words=True).word_ids()
        labelled = [lab for lab in enc["labels"][i] if lab != -100]
        target = next(w for w, t in enumerate(row["tags"]) if t != "-")
        assert labelled == [spec.label_names.index(row["tags"][target])]  # only the tagged word's first sub-token
        assert enc["labels"][i][ids.index(target)] == labelled[0]


def test_tagged_words_past_max_length_are_counted_and_warned_of(tiny, tmp_path, caplog):
    """A word past the tokens read is neither trained on nor scored: fine-tuning's encoding and the probe count such
    words per split, the result says how many, and a warning names them. MiniLM reads each word here as one token."""
    from transformers import AutoTokenizer

    from evaluation.finetune import cut_words, encode
    from evaluation.linear_probe import linear_probe
    from evaluation.tasks import LocalTaskOptions, load_task

    tok = AutoTokenizer.from_pretrained(tiny)
    assert all(len(tok.tokenize(w)) == 1 for w in ANIMALS + TOOLS + FILLER)
    dense = tmp_path / "dense.jsonl"  # every word tagged: 14 of 30 fit in 16 tokens ([CLS] and [SEP] take two)
    dense.write_text("".join(json.dumps({"tokens": ["cat", "saw"] * 15, "tags": ["animal", "tool"] * 15}) + "\n"
                             for _ in range(4)))
    spec, rows, _ = load_task(f"json:{dense}", LocalTaskOptions(text_column="tokens", label_column="tags", token_task=True,
                                                                validation_file=str(dense)))
    assert cut_words(spec, rows, encode(spec, rows, tok, 16)) == {"tagged": 120, "cut": 64}
    assert cut_words(spec, rows, encode(spec, rows, tok, 64)) == {"tagged": 120, "cut": 0}

    train, dev = tmp_path / "train.jsonl", tmp_path / "dev.jsonl"
    late = [{"tokens": ["the"] * 10 + [w], "tags": ["-"] * 10 + ["animal" if w in ANIMALS else "tool"]}
            for w in ANIMALS + TOOLS]  # the tagged word is the 11th: past max_length 8 (6 words)
    train.write_text("".join(json.dumps(r) + "\n" for r in _token_rows(120, 1)))
    dev.write_text("".join(json.dumps(r) + "\n" for r in _token_rows(40, 2) + late))
    options = LocalTaskOptions(text_column="tokens", label_column="tags", token_task=True, ignore_tag="-",
                               validation_file=str(dev))
    with caplog.at_level("WARNING", logger="pretrain.evaluation"):
        result = linear_probe(str(tiny), f"json:{train}", options, max_length=8)
    assert result["words"] == {"training": {"tagged": 120, "cut": 0}, "evaluation": {"tagged": 48, "cut": 8}}
    assert result["eval_examples"] == 40
    assert "8 of the 48 tagged words of the evaluation split are not read, past the 8 tokens read" in caplog.text
    assert "training split" not in caplog.text
