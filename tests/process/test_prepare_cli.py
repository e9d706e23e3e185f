"""The prepare and train command lines on a dataset whose manifest names climb out of it."""
import json
import re
from pathlib import Path

import pytest
from core.errors import InputDataError
from data_pipeline.dataset_dir import DatasetDir


@pytest.mark.parametrize("where,name", [("tokenizer", "../../outside.json"), ("tokenizer", ".."), ("split", "../escape")])
def test_a_manifest_name_that_climbs_out_of_the_dataset_is_refused(prepared, tmp_path, where, name):
    """Manifest names become local paths (a remote dataset's cache too): a separator or '..' is bad input, exit 2."""
    from conftest import run_cli

    from data_pipeline.shards import read_manifest

    m = json.loads((DatasetDir(prepared).manifest).read_text())
    if where == "tokenizer":
        m["tokenizer"]["files"].append(name)
    else:
        m["splits"][name] = m["splits"]["train"]
    (DatasetDir(tmp_path).manifest).write_text(json.dumps(m))
    with pytest.raises(InputDataError, match=re.escape(repr(name))):
        read_manifest(tmp_path)
    if name == "..":  # once through the command line: one line, exit 2
        proc = run_cli("pretrain", ["train", "--config", "pretrain/configs/demo_mlm.yaml", f"data.path={tmp_path}",
                                    f"train.output_dir={tmp_path}-run"], check=False)
        assert proc.returncode == 2 and "not a plain file name" in proc.stderr and "Traceback" not in proc.stderr
        assert not Path(f"{tmp_path}-run").exists()
