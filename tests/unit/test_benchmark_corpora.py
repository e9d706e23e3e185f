"""The real corpora and labelled sets behind RESULTS.md are extracted whole and decoded correctly.

Expected counts are the sources' published sizes, not values computed by the extractor: WordNet 3.0
has 117,659 synsets (82,115 noun, 13,767 verb, 18,156 adjective, 3,621 adverb; wordnet.princeton.edu
statistics), the BBC news set 2,225 articles in 5 topics (Greene & Cunningham, ICML 2006), the
CrowdFlower tweets 38,158 rows (neg 16,186 / neu 15,018 / pos 6,954; the file's own line count).
"""
import collections
import csv
import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
from benchmarks import corpora


def _rows(path: Path) -> list[dict]:
    with path.open(encoding="utf-8", newline="") as f:
        return list(csv.DictReader(f))


def test_corpora_are_complete_and_clean_utf8(tmp_path):
    paths = corpora.build(tmp_path)
    glosses = [line for line in paths["wordnet_glosses.txt"].read_text(encoding="utf-8").splitlines() if line]
    assert len(glosses) == 117_659
    assert "an entity that has physical existence" in glosses

    bbc = _rows(paths["bbc_news.csv"])
    assert collections.Counter(r["label"] for r in bbc) == {"business": 510, "entertainment": 386, "politics": 417,
                                                             "sports": 511, "tech": 401}
    text = " ".join(r["text"] for r in bbc)
    assert "£" in text and "Â£" not in text  # UTF-8 files decoded as UTF-8, not as Latin-1

    tweets = _rows(paths["tweets.csv"])
    assert collections.Counter(r["label"] for r in tweets) == {"negative": 16_186, "neutral": 15_018, "positive": 6_954}

    kjv = paths["kjv.txt"].read_text(encoding="utf-8")
    assert kjv.count("\n\n") >= 1_180  # 1,189 chapters, one paragraph each
    probes = paths["probe_sentences.txt"].read_text(encoding="utf-8").splitlines()
    assert len(probes) == 600 and all(p and p in text for p in probes)
    # The token-level task: WordNet's own facts (lexnames(5WN): file 29 is verb.body, 6 noun.artifact).
    train = [json.loads(line) for line in paths["supersense_train.jsonl"].read_text().splitlines()]
    held = [json.loads(line) for line in paths["supersense_eval.jsonl"].read_text().splitlines()]
    assert len(train) == 4000 and len(held) == 1500
    for row in train + held:
        assert len(row["tokens"]) == len(row["tags"]) and sum(t != corpora.IGNORE_TAG for t in row["tags"]) == 1
    pos = [json.loads(line) for line in paths["wordpos_train.jsonl"].read_text().splitlines()]
    assert [r["tokens"] for r in pos] == [r["tokens"] for r in train]
    assert all(p == t.split(".")[0] for a, b in zip(pos, train) for p, t in zip(a["tags"], b["tags"]) if t != "-")
    assert {t for r in pos for t in r["tags"]} == {"-", "noun", "verb", "adj", "adv"}
    assert corpora.LEXNAMES[29] == "verb.body" and corpora.LEXNAMES[6] == "noun.artifact" and len(corpora.LEXNAMES) == 45


def test_supersense_rows_tag_the_synsets_own_word_and_split_by_synset():
    rows = corpora.wordnet_supersense_rows()
    by_text = {" ".join(words): dict(zip(words, tags)) for _, words, tags in rows}
    # breathe (synset 00001740, lexicographer file 29): "I can breathe better ..." and, inflected, "... is respiring".
    assert by_text["I can breathe better when the air is clean"]["breathe"] == "verb.body"
    assert by_text["The patient is respiring"]["respiring"] == "verb.body"
    train, held = corpora.supersense_split(rows)
    assert len({r[0] for r in train} & {r[0] for r in held}) == 0
