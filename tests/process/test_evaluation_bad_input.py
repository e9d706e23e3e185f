"""Bad input to the evaluation commands is one line naming the file, and exit 2: a damaged model folder (also as
`model.init_from`), a tokenizer larger than the model's vocabulary, unreadable task files, and output paths that
cannot be written. All in-process: the function that refuses, or the command's `main`, is called directly."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from test_evaluation import _tiny_random_bert_with_minilm_tokenizer

from core.errors import CheckpointError, ConfigError, InputDataError, MissingFileError, OutputExistsError
from data_pipeline.dataset_dir import DatasetDir


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    """A randomly initialised BERT (hidden 32) with MiniLM's tokenizer: a whole, loadable export."""
    return _tiny_random_bert_with_minilm_tokenizer(tmp_path_factory.mktemp("bad_input") / "tiny")


def _copy(folder: Path, to: Path) -> Path:
    shutil.copytree(folder, to)
    return to


def _second_shard_missing(folder: Path, to: Path, weights: str) -> Path:
    """A copy of `folder` whose `weights` file is the first of the two shards its index names: the second is missing."""
    copy = _copy(folder, to)
    stem, suffix = weights.split(".", 1)
    first, second = (f"{stem}-0000{i}-of-00002.{suffix}" for i in (1, 2))
    (copy / weights).rename(copy / first)
    (copy / f"{weights}.index.json").write_text(json.dumps({"weight_map": {"a": first, "b": second}}))
    return copy


def _truncate(path: Path, keep: int) -> None:
    path.write_bytes(path.read_bytes()[:keep])


# ---- damaged model folders ----------------------------------------------------------------------------------


def test_a_damaged_model_folder_is_refused_naming_the_file(tiny, tmp_path):
    """A truncated model.safetensors or config.json, a missing shard, or no weights: one CheckpointError naming the
    file, from the evaluation loaders and from `model.init_from` (the backbone's `from_folder`) alike."""
    from evaluation.finetune import finetune
    from evaluation.linear_probe import sequence_features
    from evaluation.self_similarity import self_similarity
    from model.backbones.base import check_model_folder
    from model.encoder import EncoderConfig, model_config

    weights = _copy(tiny, tmp_path / "weights")
    _truncate(weights / "model.safetensors", 5000)
    for load in (lambda: self_similarity(weights, ["in the beginning"]),
                 lambda: sequence_features(str(weights), ["in the beginning"]),
                 lambda: finetune(str(weights), f"csv:{tmp_path / 'task.csv'}", [1]),
                 lambda: model_config(EncoderConfig(init_from=str(weights)), {"vocab_size": 30522}, 64)):
        with pytest.raises(CheckpointError, match=r"model\.safetensors' cannot be read .*truncated or damaged") as err:
            load()
        assert "\n" not in str(err.value) and str(weights) in str(err.value)

    config = _copy(tiny, tmp_path / "config")
    _truncate(config / "config.json", 50)
    with pytest.raises(CheckpointError, match=r"config\.json' is not valid JSON"):
        check_model_folder(config)
    with pytest.raises(CheckpointError, match=r"config\.json' is not valid JSON"):
        sequence_features(str(config), ["in the beginning"])
    with pytest.raises(CheckpointError, match=r"config\.json' is not valid JSON"):  # as `model.init_from`
        model_config(EncoderConfig(init_from=str(config)), {"vocab_size": 30522}, 64)

    with pytest.raises(CheckpointError, match=r"shard '.*model-00002-of-00002\.safetensors' is missing"):
        check_model_folder(_second_shard_missing(tiny, tmp_path / "sharded", "model.safetensors"))

    bare = _copy(tiny, tmp_path / "bare")
    (bare / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"'.*bare' has no weights"):
        sequence_features(str(bare), ["in the beginning"])
    check_model_folder(bare)  # a config alone passes where no weights are read


def test_a_damaged_pytorch_model_bin_is_refused_naming_it_and_a_whole_one_loads(tiny, tmp_path):
    """A folder whose weights are torch.save's pytorch_model.bin (as older exports hold): a whole one loads; one cut
    short, a web page in its place, or a missing shard, is one CheckpointError naming it (transformers' was an OSError
    naming no file); so is a Git LFS pointer in place of model.safetensors."""
    from safetensors.torch import load_file

    from evaluation.linear_probe import sequence_features
    from model.backbones.base import check_model_folder

    pickled = _copy(tiny, tmp_path / "pickled")
    torch.save(load_file(pickled / "model.safetensors"), pickled / "pytorch_model.bin")
    (pickled / "model.safetensors").unlink()
    whole, original = (sequence_features(str(folder), ["in the beginning"]) for folder in (pickled, tiny))
    assert whole.keys() == original.keys() and all(np.array_equal(whole[k], original[k]) for k in whole)

    cut = _copy(pickled, tmp_path / "cut")
    _truncate(cut / "pytorch_model.bin", (cut / "pytorch_model.bin").stat().st_size // 2)
    with pytest.raises(CheckpointError, match=r"pytorch_model\.bin' cannot be read \(its zip archive is incomplete"
                       r".*truncated or damaged") as err:
        sequence_features(str(cut), ["in the beginning"])
    assert "\n" not in str(err.value) and str(cut) in str(err.value)

    page = _copy(pickled, tmp_path / "page")
    (page / "pytorch_model.bin").write_bytes(b"<!DOCTYPE html>\n<html><body>Sign in</body></html>\n")
    with pytest.raises(CheckpointError, match=r"pytorch_model\.bin' is a web page, not the weights"):
        check_model_folder(page)

    pointer = _copy(tiny, tmp_path / "pointer")  # a clone made without git-lfs
    (pointer / "model.safetensors").write_text("version https://git-lfs.github.com/spec/v1\noid sha256:0123\nsize 9\n")
    with pytest.raises(CheckpointError, match=r"model\.safetensors' is a Git LFS pointer, not the weights: run `git "
                       r"lfs pull`"):
        sequence_features(str(pointer), ["in the beginning"])

    with pytest.raises(CheckpointError, match=r"shard '.*pytorch_model-00002-of-00002\.bin' is missing"):
        check_model_folder(_second_shard_missing(pickled, tmp_path / "sharded", "pytorch_model.bin"))


# ---- a tokenizer that does not fit the model ----------------------------------------------------------------


def test_a_tokenizer_larger_than_the_vocabulary_is_refused(tiny, tmp_path):
    """An export of a 1,000-token model beside MiniLM's 30,522-token tokenizer: one line naming both sizes, before
    torch's IndexError; a folder with no tokenizer (which transformers 5 reads as a 5-token one) is refused too."""
    from transformers import BertConfig, BertModel

    from evaluation.finetune import finetune
    from evaluation.linear_probe import sequence_features
    from evaluation.self_similarity import self_similarity

    small = tmp_path / "small"
    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=1000, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=64)).save_pretrained(str(small))
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        if (tiny / name).is_file():
            shutil.copy(tiny / name, small / name)
    for load in (lambda: self_similarity(small, ["in the beginning"]),
                 lambda: sequence_features(str(small), ["in the beginning"]),
                 lambda: finetune(str(small), f"csv:{tmp_path / 'task.csv'}", [1])):
        with pytest.raises(CheckpointError, match=r"tokenizer has 30522 tokens but the model's vocab_size is 1000") as err:
            load()
        assert str(small) in str(err.value) and "\n" not in str(err.value)

    untokenized = _copy(tiny, tmp_path / "untokenized")
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        (untokenized / name).unlink(missing_ok=True)
    with pytest.raises(MissingFileError, match="has no tokenizer"):
        sequence_features(str(untokenized), ["in the beginning"])


# ---- task files ---------------------------------------------------------------------------------------------


def test_unreadable_task_files_are_one_line_naming_the_file(tmp_path):
    """Empty, not UTF-8, malformed JSON lines, a header and no rows (also as the validation file), an unknown
    encoding: an InputDataError or ConfigError naming the file or key, not datasets' DatasetGenerationError."""
    from evaluation.tasks import LocalTaskOptions, load_task

    good = tmp_path / "good.csv"
    good.write_text("text,label\n" + "".join(f"row {i},{i % 2}\n" for i in range(20)), encoding="utf-8")
    files = {"empty.csv": b"", "latin.csv": "text,label\ncaf\u00e9,0\nb,1\n".encode("latin-1"),
             "header.csv": b"text,label\n", "blank.csv": b"\n\n \n", "broken.jsonl": b'{"text": "a"}\n{"text": broken\n',
             "empty.jsonl": b"", "one_row.csv": b"text,label\na,0\n",
             # pyarrow keeps a latin-1 byte inside a JSON string without a word: only a check of its own sees it
             "latin.jsonl": '{"text": "caf\u00e9", "label": 0}\n{"text": "b", "label": 1}\n'.encode("latin-1")}
    expected = {"empty.csv": "is empty", "latin.csv": r"is not utf-8 text .*--encoding", "header.csv": "has no rows",
                "blank.csv": "is not valid csv", "broken.jsonl": "is not valid JSON lines", "empty.jsonl": "is empty",
                "one_row.csv": r"has 1 row\(s\): too few to hold out val_fraction 0.1",
                "latin.jsonl": "is not UTF-8 text .*near byte 13"}
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
        kind = "csv" if name.endswith(".csv") else "json"
        with pytest.raises(InputDataError, match=expected[name]) as err:
            load_task(f"{kind}:{tmp_path / name}", LocalTaskOptions())
        assert f"task file '{tmp_path / name}'" in str(err.value) and "\n" not in str(err.value)
        if kind == "csv" and name != "one_row.csv":  # the validation file is named when it is the bad one
            with pytest.raises(InputDataError, match=expected[name]) as err:
                load_task(f"csv:{good}", LocalTaskOptions(validation_file=str(tmp_path / name)))
            assert f"task file '{tmp_path / name}'" in str(err.value)
    with pytest.raises(ConfigError, match="'data.encoding': 'utf-99'"):
        load_task(f"csv:{good}", LocalTaskOptions(encoding="utf-99"))
    spec, train, evaluation = load_task(f"csv:{tmp_path / 'latin.csv'}", LocalTaskOptions(encoding="latin-1", val_fraction=0.5))
    assert sorted([*train["text"], *evaluation["text"]]) == ["b", "caf\u00e9"]


def test_rows_a_task_cannot_use_are_refused_by_their_number(tiny, tmp_path, capsys):
    """A blank or missing text or pair, a missing label, a regression label that is not a finite number, a list where
    a sequence task wants one text or label, a token row that is a string (it was split into characters), has a tag
    count unlike its word count or a missing tag: one line naming the file, the row and the column, before any model
    is loaded. A csv's 'NA' is a class, not a missing label."""
    from evaluation.tasks import LocalTaskOptions, load_task
    from pretrain.cli import main

    rows = "".join(f"word {i},other {i},{i % 2}\n" for i in range(12))
    csv = {"blank_text.csv": ("text,pair,label\n" + rows + '"  ",b,1\n', {"pair_column": "pair"},
                              "row 13: column 'text' has no text"),
           "no_pair.csv": ("text,pair,label\n" + rows + "a,,1\n", {"pair_column": "pair"},
                           "row 13: column 'pair' has no text"),
           "no_label.csv": ("text,pair,label\n" + rows + "a,b,\n", {}, "row 13: column 'label' has no label"),
           "no_score.csv": ("text,pair,label\n" + rows + "a,b, \n", {"regression": True},
                            "row 13: column 'label' has no label"),
           "word_label.csv": ("text,pair,label\n" + rows + "a,b,high\n", {"regression": True},
                              "row 13: label 'high' in column 'label' is not a finite number (data.regression=true)"),
           "inf_label.csv": ("text,pair,label\n" + rows + "a,b,inf\n", {"regression": True},
                             "row 13: label inf in column 'label' is not a finite number")}
    tokens = [{"tokens": ["in", "the", "beginning"], "tags": ["O", "O", "N"]}] * 12
    jsonl = {"string_words.jsonl": ([*tokens, {"tokens": "in the beginning", "tags": ["O", "O", "N"]}],
                                   {"token_task": True}, "row 13: column 'tokens' holds a str, not a list of words"),
            "short_tags.jsonl": ([*tokens, {"tokens": ["in", "the"], "tags": ["O"]}], {"token_task": True},
                                 "row 13: column 'tags' holds 1 tags for 2 words (a token task needs one tag per word)"),
            "empty_word.jsonl": ([*tokens, {"tokens": ["in", ""], "tags": ["O", "N"]}], {"token_task": True},
                                 "row 13: column 'tokens' has no words or an empty word"),
            "null_tag.jsonl": ([*tokens, {"tokens": ["in", "the"], "tags": ["O", None]}], {"token_task": True},
                               "row 13: column 'tags' has no tag for word 2"),
            "word_list.jsonl": ([*tokens, {"tokens": ["in"], "tags": ["O"]}], {}, "row 1: column 'tokens' holds a "
                                "list; a sequence task reads one text (data.token_task=true for a list per row)"),
            "tag_list.jsonl": ([{"tokens": "in the beginning", "tags": ["O"]}] * 13, {}, "row 1: column 'tags' holds "
                               "a list; a sequence task needs one label per row (data.token_task=true for a list per row)")}
    cases = [(name, text.encode(), opts, message) for name, (text, opts, message) in csv.items()]
    cases += [(name, "".join(json.dumps(r) + "\n" for r in data).encode(), opts, message)
              for name, (data, opts, message) in jsonl.items()]
    for name, data, opts, message in cases:
        (tmp_path / name).write_bytes(data)
        kind = "csv" if name.endswith(".csv") else "json"
        if kind == "json":
            opts = {"text_column": "tokens", "label_column": "tags", **opts}
        with pytest.raises(InputDataError, match=re.escape(f"task file '{tmp_path / name}' {message}")) as err:
            load_task(f"{kind}:{tmp_path / name}", LocalTaskOptions(**opts))
        assert "\n" not in str(err.value)
    # A csv cell is its text: 'NA' is a class, 'N/A' and '3' are texts (pandas' default reads the first two as
    # missing), and a label 0 is a label.
    named = tmp_path / "named.csv"
    named.write_text("text,label\n" + "".join(f"word {i},{['NA', 'yes', 0][i % 3]}\n" for i in range(12))
                     + "N/A,NA\n3,yes\n", encoding="utf-8")
    spec, train, evaluation = load_task(f"csv:{named}", LocalTaskOptions(val_fraction=0.5))
    assert spec.label_names == ("0", "NA", "yes")
    assert {"N/A", "3"} <= {*train["text"], *evaluation["text"]}
    good = tmp_path / "good.jsonl"
    good.write_text("".join(json.dumps(r) + "\n" for r in tokens), encoding="utf-8")
    spec, train, evaluation = load_task(f"json:{good}", LocalTaskOptions(text_column="tokens", label_column="tags",
                                                                         token_task=True))
    assert spec.kind == "token" and spec.label_names == ("N", "O") and len(train) + len(evaluation) == 12
    assert main(["finetune", "--model", str(tiny), "--task", f"csv:{tmp_path / 'word_label.csv'}",
                 "data.regression=true"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "row 13: label 'high'" in err, err


def test_a_bad_task_file_exits_2_with_one_line(tiny, tmp_path, capsys):
    """Through the command: exit 2 and the one `error:` line; datasets logs no "Failed to read file" line of its own
    (its handler writes to the stderr it found at import, so the record is what is checked)."""
    import logging

    from pretrain.cli import main

    bad = tmp_path / "bad.csv"
    bad.write_bytes("text,label\ncaf\u00e9,0\nb,1\n".encode("latin-1"))
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = records.append
    logging.getLogger("datasets").addHandler(handler)
    try:
        assert main(["evaluate", "linear-probe", "--model", str(tiny), "--task", f"csv:{bad}"]) == 2
    finally:
        logging.getLogger("datasets").removeHandler(handler)
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and str(bad) in err, err
    assert not [r for r in records if r.levelno >= logging.WARNING], [r.getMessage() for r in records]


def test_settings_the_model_or_data_cannot_meet_are_one_line(tiny, tmp_path, capsys):
    """A layer past the model's depth, a negative sample cap (-1 once selected no row, and fine-tuning never ended), a
    validation file without the columns the train file has, an --out that names no file: exit 2 and one line, before
    the work."""
    from evaluation.linear_probe import _labels, check_layer
    from evaluation.tasks import GLUE
    from pretrain.cli import main

    train, dev = tmp_path / "train.csv", tmp_path / "dev.csv"
    train.write_text("text,label\n" + "".join(f"word {i},{i % 2}\n" for i in range(20)), encoding="utf-8")
    dev.write_text("text,topic\nword,0\nother,1\n", encoding="utf-8")
    one_class, two_class_dev = tmp_path / "one_class.csv", tmp_path / "two_class_dev.csv"
    one_class.write_text("text,label\n" + "".join(f"word {i},a\n" for i in range(20)), encoding="utf-8")
    two_class_dev.write_text("text,label\nword,a\nother,b\n", encoding="utf-8")
    text = tmp_path / "sentences.txt"
    text.write_text("in the beginning\n", encoding="utf-8")
    probe = ["evaluate", "linear-probe", "--model", str(tiny), "--task", f"csv:{train}"]
    cases = [([*probe, "layer=4"], f"config key 'layer' is 4, but '{tiny}' has 3 layers"),
             ([*probe, "layer=-5"], "config key 'layer' is -5, but"),
             ([*probe, "max_train_samples=-1"], "config key 'max_train_samples' must be >= 0 (0: all rows), got -1"),
             (["finetune", "--model", str(tiny), "--task", f"csv:{train}", "max_eval_samples=-1"],
              "config key 'max_eval_samples' must be >= 0"),
             ([*probe, f"data.validation_file={dev}"], f"task file '{dev}' has no column 'label'"),
             (["evaluate", "linear-probe", "--model", str(tiny), "--task", f"csv:{one_class}",
               f"data.validation_file={two_class_dev}"],  # sklearn's ValueError, a traceback, before
              "the probe's 20 training example(s) hold 1 class(es): a classifier needs two"),
             (["evaluate", "self-similarity", "--model", str(tiny), "--text", str(text), "--out", "."],
              "--out '.' names a folder"),
             (["evaluate", "self-similarity", "--model", str(tiny), "--text", str(tmp_path), "--out",
               str(tmp_path / "s.json")],
              f"--text '{tmp_path}' is a folder; name a file in it"),
             (["finetune", "--model", str(tiny), "--task", f"csv:{tmp_path}"], f"task file '{tmp_path}' is a folder")]
    for argv, message in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("error: ") and message in err and err.count("\n") == 1, (argv, err)
    for layer in (0, 3, -1, -4):  # the embeddings, the last layer counted from either end, the embeddings again
        check_layer(str(tiny), layer)
    # A GLUE task's labels are integers already (its spec names none): they were looked up by name and raised.
    assert not GLUE["sst2"].label_names
    assert _labels(GLUE["sst2"], [1, 0, 1]).tolist() == [1, 0, 1]


def test_linear_probe_checks_every_model_folder_before_the_first_model_s_work(tiny, tmp_path, capsys, monkeypatch):
    """`--model A B` with B missing or too shallow for --layer: refused in one line before A's probe (minutes on a
    real model, then lost)."""
    import evaluation.linear_probe as probe_module
    from pretrain.cli import main

    train = tmp_path / "train.csv"
    train.write_text("text,label\n" + "".join(f"word {i},{i % 2}\n" for i in range(20)), encoding="utf-8")
    probed = []
    real = probe_module.linear_probe
    monkeypatch.setattr(probe_module, "linear_probe", lambda model, *a, **k: (probed.append(model), real(model, *a, **k))[1])
    for models, message in (([str(tiny), str(tmp_path / "missing")], str(tmp_path / "missing")),
                            ([str(tiny), str(tiny)], None)):
        code = main(["evaluate", "linear-probe", "--model", *models, "--task", f"csv:{train}", "layer=3"])
        err = capsys.readouterr().err
        if message:
            assert code == 2 and message in err and err.count("\n") == 1 and probed == [], (err, probed)
    assert code == 0 and probed == [str(tiny), str(tiny)]  # both folders pass: each is probed, in order


def test_one_label_over_models_of_two_depths_is_refused_before_any_model_runs(tiny, tmp_path, capsys, monkeypatch):
    """`self-similarity --model a=X a=Y`: one label is one model's seeds, averaged layer by layer; X of 3 layers and Y
    of 2 are refused from their config.json before either runs (it was refused after both had)."""
    import json

    import evaluation.self_similarity as module
    from pretrain.cli import main

    shallow = _copy(tiny, tmp_path / "shallow")
    config = json.loads((shallow / "config.json").read_text())
    (shallow / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 2}))
    text = tmp_path / "sentences.txt"
    text.write_text("in the beginning god created the heaven and the earth\n", encoding="utf-8")
    ran = []
    monkeypatch.setattr(module, "self_similarity", lambda model, *a, **k: ran.append(model))
    assert main(["evaluate", "self-similarity", "--model", f"a={tiny}", f"a={shallow}", "--text", str(text),
                 "--out", str(tmp_path / "report")]) == 2
    err = capsys.readouterr().err
    assert "the models labelled 'a' differ in depth ([2, 3] layers)" in err and err.count("\n") == 1, err
    assert ran == [] and not list(tmp_path.glob("report*"))


# ---- output paths -------------------------------------------------------------------------------------------


def test_outputs_that_cannot_be_written_are_refused_before_the_work(tiny, tmp_path, capsys):
    """`--out` inside a file, or an existing folder as the results file: exit 2 with one line, nothing computed."""
    from evaluation.checks import check_output
    from evaluation.finetune import finetune
    from evaluation.sentence_embeddings import evaluate_suite
    from pretrain.cli import main

    a_file = tmp_path / "a_file"
    a_file.write_text("kept\n")
    a_folder = tmp_path / "a_folder"
    a_folder.mkdir()
    text = tmp_path / "sentences.txt"
    text.write_text("in the beginning\nand the earth was without form\n", encoding="utf-8")
    cases = [(["evaluate", "self-similarity", "--model", str(tiny), "--text", str(text), "--out", str(a_file / "x")],
              f"'{a_file}' is a file, not a folder"),
             (["evaluate", "linear-probe", "--model", str(tiny), "--task", "csv:x.csv", "--out", str(a_folder)],
              f"--out '{a_folder}' is a folder"),
             (["finetune", "--model", str(tiny), "--task", "csv:x.csv", "--out", str(a_file / "deeper" / "r.json")],
              f"'{a_file}' is a file, not a folder")]
    for argv, message in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("error: ") and message in err and err.count("\n") == 1, (argv, err)
    assert a_file.read_text() == "kept\n" and not any(a_folder.iterdir())
    with pytest.raises(OutputExistsError):
        finetune(str(tiny), "csv:x.csv", [1], out=str(a_folder))
    with pytest.raises(OutputExistsError, match="is a file, not a folder"):
        evaluate_suite([str(tiny)], tmp_path / "no_suite", out=a_file / "report")
    with pytest.raises(ConfigError, match="names a folder"):
        evaluate_suite([str(tiny)], tmp_path / "no_suite", out=f"{a_folder}/")
    check_output(tmp_path / "new" / "folders" / "results.json")  # folders still to be made are fine


def test_an_existing_output_is_replaced_only_with_overwrite_and_only_if_an_evaluation_wrote_it(tiny, tmp_path, capsys):
    """Without --overwrite an existing result is refused; with it, a report an evaluation command wrote is replaced,
    and a file of another kind (the model's config.json, the task file, a dataset's manifest) never is."""
    from evaluation.results_files import LARGEST_RESULTS_BYTES, written_here
    from pretrain.cli import main

    model = _copy(tiny, tmp_path / "model")
    text = tmp_path / "sentences.txt"
    text.write_text("in the beginning\nand the earth was without form\n", encoding="utf-8")
    task = tmp_path / "task.csv"
    task.write_text("text,label\nkept,0\n", encoding="utf-8")
    manifest = DatasetDir(tmp_path / "data").manifest
    manifest.parent.mkdir()
    manifest.write_text('{"format": "mds"}\n', encoding="utf-8")
    originals = {path: path.read_bytes() for path in (model / "config.json", task, manifest)}

    def refused(argv: list[str], message: str) -> None:
        capsys.readouterr()  # what the runs before it printed
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("error: ") and message in err and err.count("\n") == 1, (argv, err)

    similarity = ["evaluate", "self-similarity", "--model", str(model), "--text", str(text)]
    report = tmp_path / "report"
    assert main([*similarity, "--out", str(report)]) == 0
    first = json.loads(report.with_suffix(".json").read_text())
    assert first["written_by"] == "contrastive-pretrain evaluation" and report.with_suffix(".png").is_file()
    report.with_suffix(".json").write_text(json.dumps({**first, "sentences": -1}))  # to see it replaced
    refused([*similarity, "--out", str(report)], f"--out '{report}.json' already exists; pass --overwrite")
    assert json.loads(report.with_suffix(".json").read_text())["sentences"] == -1
    assert main([*similarity, "--out", str(report), "--overwrite"]) == 0
    assert json.loads(report.with_suffix(".json").read_text())["sentences"] == 2

    # A result written before the JSONs named their writer (a fine-tuning result's keys) is replaced too.
    earlier = tmp_path / "earlier.json"
    earlier.write_text(json.dumps({"model": "m", "seeds": [], "summary": {}, "majority_baseline": None}))
    assert written_here(earlier) and not written_here(model / "config.json")
    # One larger than any result is not read to find out (a model's weights named by mistake).
    padded = tmp_path / "padded.json"
    padded.write_text(json.dumps(first) + " " * LARGEST_RESULTS_BYTES)
    assert not written_here(padded)

    not_ours = "--overwrite replaces only results an evaluation command wrote"
    refused([*similarity, "--out", str(model / "config"), "--overwrite"], f"'{model / 'config.json'}' is not one")
    probe = ["evaluate", "linear-probe", "--model", str(model), "--task", f"csv:{task}"]
    refused([*probe, "--out", str(task), "--overwrite"], not_ours)
    refused([*probe, "--out", str(task)], "already exists; pass --overwrite")
    refused(["finetune", "--model", str(model), "--task", f"csv:{task}", "--out", str(manifest), "--overwrite"], not_ours)
    refused(["evaluate", "sentence-embeddings", "--model", str(model), "--suite", str(tmp_path / "no_suite"),
             "--out", str(manifest.with_suffix("")), "--overwrite"], not_ours)
    assert {path: path.read_bytes() for path in originals} == originals


def test_a_config_json_that_the_weights_do_not_fit_is_refused_not_run_on_random_weights(tiny, tmp_path, capsys):
    """No model_type, one transformers does not know, or a config.json whose layers or width the weights do not fill
    (transformers initialises the rest at random, or stops with a traceback): one line naming the folder, exit 2, from
    each evaluation command's loader. A task head the export lacks is still made fresh."""
    from evaluation.finetune import finetune
    from evaluation.linear_probe import sequence_features
    from pretrain.cli import main

    text = tmp_path / "sentences.txt"
    text.write_text("in the beginning\nand the earth was without form\n", encoding="utf-8")
    task = tmp_path / "task.csv"
    task.write_text("text,label\n" + "".join(f"{w} day,{i % 2}\n" for i, w in enumerate(["first", "second"] * 10)),
                    encoding="utf-8")
    config = json.loads((tiny / "config.json").read_text())
    cases = {"no_type": ({k: v for k, v in config.items() if k != "model_type"}, "its config.json names no model_type"),
             "unknown": ({**config, "model_type": "nonsense"}, "model_type 'nonsense' is not one transformers"),
             "deeper": ({**config, "num_hidden_layers": 5},
                        "its weights do not fit its config.json: 32 weight(s) missing (encoder.layer.3."),
             "wider": ({**config, "hidden_size": 64, "intermediate_size": 128},
                       # 16 tensors in each of 3 layers and 5 in the embeddings (the pooler is made fresh)
                       "its weights do not fit its config.json: 53 of another shape (embeddings.LayerNorm.bias [32] "
                       "(config.json: [64])")}
    for name, (edited, says) in cases.items():
        model = _copy(tiny, tmp_path / name)
        (model / "config.json").write_text(json.dumps(edited))
        assert main(["evaluate", "self-similarity", "--model", str(model), "--text", str(text),
                     "--out", str(tmp_path / f"{name}_report")]) == 2, name
        err = capsys.readouterr().err.splitlines()[-1]
        assert err.startswith(f"error: model '{model}'") and says in err and "Traceback" not in err, (name, err)
        assert not (tmp_path / f"{name}_report.json").exists()
    for load in (lambda m: sequence_features(str(m), ["in the beginning"]), lambda m: finetune(str(m), f"csv:{task}", [1])):
        with pytest.raises(CheckpointError, match="32 weight\\(s\\) missing"):
            load(tmp_path / "deeper")
    result = finetune(str(tiny), f"csv:{task}", [1], overrides={"epochs": 1})  # the classifier: made fresh, no refusal
    assert result["num_labels"] == 2
