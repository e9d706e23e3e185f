"""A mixture of sources prepared with worker processes records the mixture in the manifest."""
import json

from conftest import kjv_chapters
from core.config_io import load_config
from data_pipeline.config import PrepareConfig
from data_pipeline.prepare import prepare
from data_pipeline.dataset_dir import DatasetDir


def test_prepare_records_the_mixture(tmp_path):
    chapters = kjv_chapters(400)
    a, b = tmp_path / "a.jsonl", tmp_path / "b.parquet"
    a.write_text("".join(json.dumps({"text": c}) + "\n" for c in chapters[:300]))
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"content": chapters[100:400]}), b)
    cfg = load_config(PrepareConfig, None, [
        f"output_dir={tmp_path / 'out'}", "tokenizer.vocab_size=300", "seq_len=64", "max_documents=240",
        f"sources=[{{kind: json, path: '{a}', weight: 3}}, {{kind: parquet, path: '{b}', text_column: content, weight: 1}}]"])
    manifest = json.loads(DatasetDir(prepare(cfg)).manifest.read_text())
    docs = [s["documents"] for s in manifest["sources"]]
    assert sum(docs) == 240 and abs(docs[0] / 240 - 0.75) < 0.08
    assert [s["weight"] for s in manifest["sources"]] == [3.0, 1.0]
