"""Rebuild data/kjv.txt.gz from Debian's bible-kjv package (the bundled demo corpus).

Usage: apt-get install bible-kjv && bible 'Gen1:1-Rev22:21' | python data/make_kjv.py
Each chapter becomes one document: a title line, then one verse per line; documents are
separated by a blank line so `datasets`' text builder (sample_by="paragraph") keeps them apart.
"""
import gzip
import re
import sys

VERSE = re.compile(r"^\s+\d+\s+(.*)$")
TITLE = re.compile(r"^(\d )?[A-Z][A-Za-z ]+ \d+$")


def main() -> None:
    """Read the `bible` program's output on stdin and write data/kjv.txt.gz."""
    chapters: list[list[str]] = []
    after_blank = True
    for raw in sys.stdin.read().splitlines():
        line = raw.rstrip()
        if not line:
            after_blank = True
            continue
        match = VERSE.match(line)
        if match:
            chapters[-1].append(match.group(1))
        elif after_blank and TITLE.match(line):
            chapters.append([line])
        else:
            chapters[-1][-1] += " " + line.strip()  # the program wraps long verses
        after_blank = False
    text = "\n\n".join("\n".join(ch) for ch in chapters) + "\n"
    with gzip.GzipFile("data/kjv.txt.gz", "wb", mtime=0) as fh:
        fh.write(text.encode("utf-8"))
    print(f"{len(chapters)} chapters, {len(text)} characters", file=sys.stderr)


if __name__ == "__main__":
    main()
