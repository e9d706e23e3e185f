"""Reading a source in parts gives exactly the documents of reading it whole with `datasets`."""
import gzip
import json
import re

import numpy as np
import pytest
from conftest import kjv_chapters

from core.config_io import load_config
from core.errors import InputDataError
from data_pipeline.config import PrepareConfig
from data_pipeline.input_parts import plan_parts
from data_pipeline.raw_text import ReadStats, iter_part


def _cfg(source: str, part_bytes: int) -> PrepareConfig:
    return load_config(PrepareConfig, None, [f"sources=[{source}]", f"part_bytes={part_bytes}"])


def _read_in_parts(cfg: PrepareConfig):
    parts, _ = plan_parts(cfg)
    return parts, [d for p in parts for d in iter_part(cfg.sources[0], p, "strict", ReadStats())]


def _datasets_documents(kind: str, path, **kwargs) -> list[str]:
    """The reference: `datasets` reading the whole file, stripped, empty documents dropped (as before parts)."""
    import datasets

    column = kwargs.pop("column", "text")
    rows = datasets.load_dataset(kind, data_files=[str(path)], split="train", streaming=True, **kwargs)
    return [r[column].strip() for r in rows if r[column].strip()]


def _awkward_text() -> str:
    """Paragraphs separated by 2-5 newlines (some CRLF), whitespace-only paragraphs, multi-byte characters."""
    rng = np.random.default_rng(0)
    seps = ["\n\n", "\n\n\n", "\r\n\r\n", "\n\n\n\n\n", "\n \n\n", "\n\n  \n\n", "\r\n\r\n\r\n"]
    chapters = [c.replace(" LORD", " LÖRD — ✓") for c in kjv_chapters(30)]
    out = chapters[0]
    for c in chapters[1:]:
        out += seps[rng.integers(len(seps))] + c
    return out + "\r\n"


@pytest.mark.parametrize("mode", ["paragraph", "line"])
def test_text_parts_equal_the_whole_file(tmp_path, mode):
    path = tmp_path / "a.txt"
    path.write_bytes(_awkward_text().encode("utf-8"))
    parts, docs = _read_in_parts(_cfg(f"{{kind: text, path: '{path}', text_documents: {mode}}}", 700))
    assert len(parts) > 20
    assert [p.stop for p in parts[:-1]] == [p.start for p in parts[1:]] and parts[-1].stop == path.stat().st_size
    assert docs == _datasets_documents("text", path, sample_by=mode)


def test_text_documents_document_reads_each_file_whole_as_one_document(tmp_path):
    for name, text in (("a.txt", _awkward_text()), ("b.txt", "one line\n\nand another paragraph\n")):
        (tmp_path / name).write_bytes(text.encode("utf-8"))
    cfg = _cfg(f"{{kind: text, path: '{tmp_path}/*.txt', text_documents: document}}", 700)
    parts, _ = plan_parts(cfg)
    docs = [d for p in parts for d in iter_part(cfg.sources[0], p, "strict", ReadStats())]
    assert len(parts) == 2  # a file is one part: a document may not be cut
    want = [d for name in ("a.txt", "b.txt") for d in _datasets_documents("text", tmp_path / name, sample_by="document")]
    assert len(want) == 2 and "one line\n\nand another paragraph" in want and sorted(docs) == sorted(want)


def test_json_lines_parts_equal_the_whole_file(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_text("".join(json.dumps({"body": d, "n": i}) + "\n" + ("\n" if i % 7 == 0 else "")
                            for i, d in enumerate(kjv_chapters(40))))
    parts, docs = _read_in_parts(_cfg(f"{{kind: json, path: '{path}', text_column: body}}", 3000))
    assert len(parts) > 10 and {p.reader for p in parts} == {"jsonl"}
    assert docs == _datasets_documents("json", path, column="body")


def test_json_array_and_compressed_files_are_one_part_each(tmp_path):
    docs = kjv_chapters(12)
    (tmp_path / "a.json").write_text(json.dumps([{"text": d} for d in docs]))
    with gzip.open(tmp_path / "b.txt.gz", "wt", encoding="utf-8") as fh:
        fh.write("\n\n".join(docs))
    parts, got = _read_in_parts(_cfg(f"{{kind: json, path: '{tmp_path / 'a.json'}'}}", 100))
    assert [p.reader for p in parts] == ["datasets"] and got == [d.strip() for d in docs]
    parts, got = _read_in_parts(_cfg(f"{{kind: text, path: '{tmp_path / 'b.txt.gz'}'}}", 100))
    assert [(p.reader, p.codec) for p in parts] == [("text", "gzip")] and got == [d.strip() for d in docs]


def test_parquet_parts_are_row_groups(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    docs = kjv_chapters(50)
    pq.write_table(pa.table({"content": docs}), tmp_path / "a.parquet", row_group_size=4)
    parts, got = _read_in_parts(_cfg(f"{{kind: parquet, path: '{tmp_path / 'a.parquet'}', text_column: content}}", 10_000))
    assert len(parts) > 3 and parts[0].reader == "parquet" and parts[-1].stop == 13
    assert got == [d.strip() for d in docs]


def test_bad_utf8_names_the_file_and_byte(tmp_path):
    path = tmp_path / "bad.txt"
    good = ("\n\n".join(kjv_chapters(5)) + "\n\n").encode()
    path.write_bytes(good + b"caf\xe9\n")
    with pytest.raises(InputDataError, match=rf"bad.txt' is not valid UTF-8 \(byte {len(good) + 3}"):
        _read_in_parts(_cfg(f"{{kind: text, path: '{path}'}}", 500))


def test_a_hub_folder_s_bad_utf8_names_the_file_in_it_and_the_byte(tmp_path):
    """`datasets` reads a downloaded folder's files without saying which one failed: the folder is searched."""
    folder = tmp_path / "download"
    (folder / "data").mkdir(parents=True)
    (folder / ".cache").mkdir()
    (folder / ".cache" / "x.lock").write_bytes(b"\xff")  # hidden: the hub client's, not data
    good = "\n\n".join(kjv_chapters(5)) + "\n\ncaf\u00e9\n"
    (folder / "data" / "a.txt").write_text(good, encoding="utf-8")
    # A two-byte character across the 1 MiB chunk the search reads, then the bad byte.
    head = b"x" * ((1 << 20) - 1) + "\u00e9".encode()
    (folder / "data" / "b.txt").write_bytes(head + b" au lait\ncaf\xe9\n")
    bad = folder / "data" / "b.txt"
    with pytest.raises(InputDataError, match=rf"'{re.escape(str(bad))}' is not valid UTF-8 \(byte {len(head) + 12}: "
                                             r"b'\\xe9\\n'\)"):
        _read_in_parts(_cfg(f"{{kind: hub, path: '{folder}'}}", 500))
