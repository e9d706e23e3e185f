"""SentEval-style sentence-embedding evaluation: nested cross-validation, pair features and STS correlation against
independent computations, the CLI end to end on a suite whose answers are known by construction, and its errors."""
from __future__ import annotations

import csv
import json
import random

import numpy as np
import pytest
from conftest import run_cli
from test_evaluation import _tiny_random_bert_with_minilm_tokenizer

WORDS = "river stone bread light house garden music winter letter horse window market".split()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return _tiny_random_bert_with_minilm_tokenizer(tmp_path_factory.mktemp("sent") / "tiny")


def _write_csv(path, header, rows):
    with path.open("w", encoding="utf-8", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(header)
        writer.writerows(rows)


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    """Three tasks whose answers are known: topic by a marker word, same-or-different pairs, and graded overlap."""
    rng = random.Random(0)
    folder = tmp_path_factory.mktemp("suite")
    sentence = lambda: " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 9)))  # noqa: E731
    topics = [(f"{sentence()} {marker} {sentence()}", label) for _ in range(60)
              for marker, label in (("cat", "animal"), ("car", "vehicle"))]
    _write_csv(folder / "topics.csv", ["text", "label"], topics)
    pairs = []
    for i in range(80):
        s = sentence()
        pairs.append((s, s if i % 2 else sentence(), "1" if i % 2 else "0"))
    _write_csv(folder / "pairs.csv", ["text1", "text2", "label"], pairs)
    sts = []
    for i in range(60):
        words = [rng.choice(WORDS) for _ in range(8)]
        kept = i % 5  # 0..4 of the first words shared: the more kept, the higher the score
        other = words[:2 * kept] + [rng.choice(WORDS) for _ in range(8 - 2 * kept)]
        sts.append((" ".join(words), " ".join(other), str(kept)))
    _write_csv(folder / "sts.csv", ["text1", "text2", "score"], sts)
    (folder / "tasks.json").write_text(json.dumps({"tasks": [
        {"name": "topics", "kind": "classification", "file": "topics.csv"},
        {"name": "pairs", "kind": "pairs", "file": "pairs.csv", "text": "text1", "pair": "text2"},
        {"name": "sts", "kind": "sts", "file": "sts.csv", "text": "text1", "pair": "text2", "label": "score"}]}))
    return folder


def test_nested_cross_validation_on_known_data():
    from evaluation.sentence_embeddings import cross_validated

    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, 300)
    x = rng.normal(size=(300, 8))
    x[np.arange(300), y] += 4.0
    out = cross_validated(x, y, folds=10, c_grid=(0.1, 1.0), inner_folds=3, seed=0)
    assert out["folds"] == 10 and len(out["fold_accuracy"]) == 10 and len(out["c_chosen"]) == 10
    assert abs(out["accuracy"] - np.mean(out["fold_accuracy"])) < 1e-12 and out["accuracy"] > 0.95
    assert out["majority_class"] == np.bincount(y).max() / 300
    noise = cross_validated(x, rng.integers(0, 3, 300), folds=5, c_grid=(0.1, 1.0), inner_folds=3, seed=0)
    assert noise["accuracy"] < 0.45


def test_pair_features_cosine_and_sts_against_independent_formulas():
    from scipy.stats import pearsonr, spearmanr

    from evaluation.sentence_embeddings import cosine, pair_features, sts_scores

    rng = np.random.default_rng(1)
    u, v = rng.normal(size=(20, 5)), rng.normal(size=(20, 5))
    feats = pair_features(u, v)
    for i in range(20):
        assert np.allclose(feats[i], np.concatenate([u[i], v[i], np.abs(u[i] - v[i]), u[i] * v[i]]))
    want = np.array([np.dot(a, b) / np.linalg.norm(a) / np.linalg.norm(b) for a, b in zip(u, v)])
    assert np.allclose(cosine(u, v), want, rtol=1e-12)
    gold = rng.normal(size=20)
    got = sts_scores(u, v, gold)
    assert abs(got["spearman"] - 100 * spearmanr(want, gold)[0]) < 1e-9
    assert abs(got["pearson"] - 100 * pearsonr(want, gold)[0]) < 1e-9


def test_cli_on_a_suite_with_known_answers(tiny, suite, tmp_path):
    out = tmp_path / "report"
    proc = run_cli("pretrain", ["evaluate", "sentence-embeddings", "--model", str(tiny), "--suite", str(suite),
                                "--out", str(out), "folds=5", "inner_folds=3"])
    report = json.loads(out.with_suffix(".json").read_text())
    res = report["results"][str(tiny)]
    for feature in ("mean", "cls"):
        assert res["topics"][feature]["folds"] == 5 and res["topics"][feature]["examples"] == 120
    # The marker word decides the topic, identical pairs have |u - v| = 0, and overlap orders the STS scores.
    assert res["topics"]["mean"]["accuracy"] > 0.9 and res["topics"]["mean"]["majority_class"] == 0.5
    assert res["pairs"]["mean"]["accuracy"] > 0.9
    assert res["sts"]["mean"]["spearman"] > 50 and res["sts"]["mean"]["examples"] == 60
    table = out.with_suffix(".md").read_text()
    assert table == report["table"] and "| topics (acc) | pairs (acc) | sts (ρ) | mean |" in table
    assert f"{100 * res['topics']['mean']['accuracy']:.1f}" in proc.stdout
    from pretrain.cli import main  # the same entry point in this process: a new interpreter costs ~10 s per call

    assert main(["evaluate", "sentence-embeddings", "--model", str(tiny), "--suite", str(suite), "--tasks", "sts",
                 "--max-examples", "40", "--out", str(tmp_path / "sts_only")]) == 0
    only = json.loads((tmp_path / "sts_only.json").read_text())["results"][str(tiny)]
    assert list(only) == ["sts"] and only["sts"]["mean"]["examples"] == 40  # a sample of the task's 60 pairs


def test_bad_suites_and_models_are_one_line_errors(tiny, suite, tmp_path, capsys):
    from pretrain.cli import main

    def fails(args, match):
        assert main(["evaluate", "sentence-embeddings", *args]) == 2  # a UserError, not a bug's traceback
        err = capsys.readouterr().err
        assert match in err and len(err.strip().splitlines()) == 1, err

    fails(["--model", str(tiny), "--suite", str(tmp_path)], "no tasks.json")
    fails(["--model", str(tmp_path / "nope"), "--suite", str(suite)], "not a Hugging Face model folder")
    fails(["--model", str(tiny), "--suite", str(suite), "--tasks", "mr"], "not in the suite")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "tasks.json").write_text(json.dumps({"tasks": [{"name": "x", "kind": "regression", "file": "x.csv"}]}))
    fails(["--model", str(tiny), "--suite", str(bad)], "has kind 'regression'")
    (bad / "tasks.json").write_text(json.dumps({"tasks": [{"name": "x", "kind": "classification", "file": "x.csv",
                                                           "label": "topic"}]}))
    (bad / "x.csv").write_bytes(b"text,label\nfine,1\n")
    fails(["--model", str(tiny), "--suite", str(bad)], "no column(s) ['topic']")
    (bad / "x.csv").write_bytes(b"text,topic\ncaf\xe9,1\n")
    fails(["--model", str(tiny), "--suite", str(bad)], "is not UTF-8")
    (bad / "x.csv").write_bytes(b"text,topic\nfine,1\nshort\n")  # a user-built suite's row with a cell missing
    fails(["--model", str(tiny), "--suite", str(bad)], "row 2 has no value in column(s) ['topic']")
    for index in ({"tasks": 3}, {"tasks": ["x.csv"]}):
        (bad / "tasks.json").write_text(json.dumps(index))
        fails(["--model", str(tiny), "--suite", str(bad)], "is not a task index")
    (bad / "tasks.json").write_text(json.dumps({"tasks": [{"name": "x", "kind": "classification", "file": None}]}))
    fails(["--model", str(tiny), "--suite", str(bad)], "needs name, kind and file")
