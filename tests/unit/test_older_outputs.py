"""What the tool still accepts from folders written by its earlier versions (before output markers, before
checkpoints carried their data manifest and meta, before run folders kept DeepSpeed's config), on literal folders."""
import json

import pytest

from core.atomic_files import OutputExistsError, check_overwrite
from core.errors import CheckpointError
from data_pipeline.dataset_dir import DatasetDir
from data_pipeline.prepare import DATASET, _legacy_dataset
from data_pipeline.tokenizer import tokenizer_hash
from pretrain.checkpointing.checkpoint_dir import META, CheckpointDir
from pretrain.exporting.export import EXPORT, _check_tokenizer, _legacy_export
from pretrain.exporting.model_card import _deepspeed_text
from pretrain.run_dir import DATA_MANIFEST_FILE, RunDir


def test_an_export_from_before_markers_is_replaced_only_when_its_card_is_ours(tmp_path):
    ours, other = tmp_path / "ours", tmp_path / "other"
    for folder, card in ((ours, "---\ntags: [contrastive-pretrain, mlm]\n---\n"), (other, "# someone's model\n")):
        folder.mkdir()
        (folder / "config.json").write_text("{}")
        (folder / "README.md").write_text(card)
    check_overwrite(ours, True, EXPORT, legacy=_legacy_export)
    with pytest.raises(OutputExistsError, match="replaces only a export folder this tool wrote"):
        check_overwrite(other, True, EXPORT, legacy=_legacy_export)


def test_a_dataset_from_before_markers_is_replaced_only_when_its_manifest_is_ours(tmp_path):
    ours, other = tmp_path / "ours", tmp_path / "other"
    for folder, fmt in ((ours, "contrastive-pretrain/mds-v1"), (other, "somebody-else/v2")):
        folder.mkdir()
        DatasetDir(folder).manifest.write_text(json.dumps({"format": fmt}))
    assert _legacy_dataset(ours) and not _legacy_dataset(other)
    check_overwrite(ours, True, DATASET, legacy=_legacy_dataset)
    with pytest.raises(OutputExistsError):
        check_overwrite(other, True, DATASET, legacy=_legacy_dataset)


def test_the_tokenizer_check_skips_a_checkpoint_without_its_manifest_and_refuses_another_tokenizer(tmp_path):
    run_dir = RunDir(tmp_path / "run")
    run_dir.tokenizer.mkdir(parents=True)
    (run_dir.tokenizer / "tokenizer.json").write_text('{"model": "ours"}')
    checkpoint = run_dir.checkpoints / "step_00000002"
    checkpoint.mkdir(parents=True)
    _check_tokenizer(run_dir, checkpoint)  # a checkpoint from before they carried the data manifest: nothing to check
    (checkpoint / DATA_MANIFEST_FILE).write_text(json.dumps({"tokenizer": {"hash": tokenizer_hash(run_dir.tokenizer)}}))
    _check_tokenizer(run_dir, checkpoint)
    (checkpoint / DATA_MANIFEST_FILE).write_text(json.dumps({"tokenizer": {"hash": "0123456789abcdef"}}))
    with pytest.raises(CheckpointError, match="trained with tokenizer 0123456789abcdef"):
        _check_tokenizer(run_dir, checkpoint)


def test_the_model_card_names_the_deepspeed_json_of_a_run_folder_without_its_config(tmp_path):
    run_dir = RunDir(tmp_path)
    assert _deepspeed_text({}, run_dir) == "DeepSpeed config `deepspeed_configs/base.json`"
    assert _deepspeed_text({"deepspeed_config": "/home/me/zero2.json"}, run_dir) == "DeepSpeed config `zero2.json`"
    run_dir.deepspeed_config.write_text(json.dumps({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}))
    assert _deepspeed_text({}, run_dir) == "DeepSpeed ZeRO stage 2, optimizer offload"


def test_a_checkpoint_without_meta_reads_as_saved_with_nothing_known(tmp_path):
    (tmp_path / "step_00000004").mkdir()
    (tmp_path / "step_00000008").mkdir()
    (tmp_path / "step_00000008" / META).write_text(json.dumps({"world_size": 2, "zero_stage": 1}))
    folder = CheckpointDir(tmp_path)
    assert folder.meta("step_00000004") == {}
    assert folder.meta("step_00000008") == {"world_size": 2, "zero_stage": 1}
