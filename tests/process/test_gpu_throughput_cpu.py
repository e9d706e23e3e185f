"""benchmarks/gpu_throughput.py, the GPU benchmark the queue runs most, on its CPU path (`--tiny`): the dataset
prepared from the corpora when missing and reused when there, one trainer point measured beside the eager and the
compiled bare loop, and the row and the table written."""
import json

from conftest import kjv_chapters, run_cli

from benchmarks.gpu_throughput import ensure_data
from data_pipeline.dataset_dir import DatasetDir


def test_a_tiny_point_runs_with_its_data_prepared_once(tmp_path):
    corpora, work = tmp_path / "corpora", tmp_path / "work"
    corpora.mkdir()
    text = "\n\n".join(kjv_chapters(40)) + "\n"
    (corpora / "kjv.txt").write_text(text, encoding="utf-8")
    (corpora / "wordnet_glosses.txt").write_text(text[: len(text) // 4], encoding="utf-8")
    data = ensure_data(128, corpora, work)
    manifest = DatasetDir(data).manifest.stat().st_mtime_ns
    assert ensure_data(128, corpora, work) == data and DatasetDir(data).manifest.stat().st_mtime_ns == manifest
    out = tmp_path / "gpu.json"
    proc = run_cli("benchmarks.gpu_throughput", [
        "--tiny", "--steps", "12", "--warmup", "2", "--seqs", "128", "--batches-128", "4", "--objectives", "mlm",
        "--backbones", "bert", "--compile", "off", "--precision", "fp32", "--corpora", str(corpora),
        "--work", str(work), "--out", str(out)], timeout=600)
    (row,) = json.loads(out.read_text())["rows"]
    assert (row["objective"], row["backbone"], row["seq"], row["batch"], row["compile"]) == ("mlm", "bert", 128, 4, False)
    assert row["tokens_per_s"] > 0 and row["bare_tokens_per_s"] > 0 and row["bare_compiled_tokens_per_s"] > 0
    assert abs(row["vs_bare"] - row["tokens_per_s"] / row["bare_tokens_per_s"]) < 1e-9
    assert "| mlm | bert | 128 | 4 | off |" in proc.stdout
