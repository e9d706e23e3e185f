"""Every config error a user can make is reported with the key or file it concerns (exit code 2, no traceback)."""
import json

import pytest
from conftest import TINY_MODEL, run_cli

from pretrain.cli import main as pretrain_main

CASES = [
    ("train.max_stepz=3", "train.max_stepz"),
    ("train.max_steps=lots", "train.max_steps"),
    ("train.precision=fp8", "train.precision"),
    ("train.deepspeed_config=deepspeed_configs/nope.json", "nope.json"),
    ("train.deepspeed_config=deepspeed_configs", "'deepspeed_configs' is a folder; name the JSON file in it"),
    ("train.global_batch_size=30", "global_batch_size=30"),
    ("masking.strategy=random", "masking.strategy"),
    ("objective.name=bert", "objective.name"),
    ("objective.coco_lm.copy_weigth=1", "objective.coco_lm.copy_weigth"),
    ("model.hidden_size=30 model.num_heads=4", "model.hidden_size"),
    ("model.vocab_size=123", "model.vocab_size"),
    ("model.vocab_size=30522", "400"),  # the message names both sizes
    ("model.init_from=/nonexistent/bert", "model.init_from"),
    ("objective.name=tacl", "model.init_from"),
    ("data.path=/nonexistent/data", "/nonexistent/data"),
    ("optimizer.impl=deepspeed optimizer.name=lamb train.zero_stage=0", "optimizer.impl=torch"),
    ("optimizer.name=lamb", "train.zero_stage=0"),
    ("train.zero_stage=4", "train.zero_stage"),
    ("train.checkpoint_remote=file:///tmp/checkpoints", "train.checkpoint_remote"),
    ("train.offload_params=true", "train.offload_params=false"),
    ("train.zero_stage=0 train.offload_optimizer=true", "train.offload_optimizer=false"),
    ("objective.name=coco_lm", "masking.strategy=coco"),
    ("train.micro_batch_size=100000 train.global_batch_size=100000", "fewer than one batch"),
    ("model.architecture=modernbert model.position_embedding=relative_key", "model.position_embedding"),
    # A key of another family is an error naming the family that reads it, not a setting silently ignored.
    ("model.architecture=bert model.local_attention=64", "model.architecture=modernbert reads it"),
    ("model.attn_implementation=flash_attention_2", "model.attn_implementation=flash_attention_2"),
    ("masking.strategy=span masking.count=exact", "masking.count=exact"),
    ("schedule.decay=wsd schedule.decay_fraction=0", "schedule.decay_fraction"),
    ("model.architecture=modernbert objective.mlm.pair_head=nsp", "needs model.architecture=bert"),
    # The data's packing against the objective (the manifest is read once the process group has started).
    ("objective.mlm.pair_head=sop", "objective.mlm.pair_head=sop needs data prepared with packing=pairs pair_task=sop "
                                    "(data.path has packing=full)"),
    ("objective.name=declutr", "objective.name=declutr needs data prepared with packing=document (data.path has "
                               "packing=full"),
]
# Checked after the process group starts: these run in a separate process (all in one, see the helper).
NEEDS_PROCESS_GROUP = {"model.vocab_size", "400", "model.init_from", "/nonexistent/data", "optimizer.impl=torch",
                       "train.zero_stage=0", "train.offload_params=false",
                       "train.offload_optimizer=false", "masking.strategy=coco", "nope.json",
                       "'deepspeed_configs' is a folder; name the JSON file in it", "fewer than one batch",
                       "needs model.architecture=bert", *(expected for _, expected in CASES[-2:])}


def _args(prepared, out, override):
    return ["train", "--config", "pretrain/configs/demo_mlm.yaml", f"data.path={prepared}", f"train.output_dir={out}",
            *TINY_MODEL, "train.micro_batch_size=4", *override.split()]


@pytest.fixture(scope="module")
def subprocess_results(prepared, tmp_path_factory):
    """Every case that needs the process group, run in one `python` process with the real CLI."""
    base = tmp_path_factory.mktemp("config_errors")
    cases = {f"{i}": _args(prepared, base / f"run{i}", override) for i, (override, expected) in enumerate(CASES)
             if expected in NEEDS_PROCESS_GROUP}
    (base / "cases.json").write_text(json.dumps(cases))
    run_cli("tests/helpers/cli_cases.py", [str(base / "cases.json"), str(base / "out.json")])
    return json.loads((base / "out.json").read_text())


@pytest.mark.parametrize("index", range(len(CASES)), ids=[c[0] for c in CASES])
def test_config_errors_are_named(prepared, tmp_path, capsys, subprocess_results, index):
    override, expected = CASES[index]
    if expected in NEEDS_PROCESS_GROUP:
        code, err = subprocess_results[str(index)]["code"], subprocess_results[str(index)]["stderr"]
    else:
        code, err = pretrain_main(_args(prepared, tmp_path / "run", override)), capsys.readouterr().err
    assert code == 2, err[-2000:]
    assert expected in err and "Traceback" not in err


def test_a_run_folder_that_is_a_file_or_inside_the_dataset_is_named_and_nothing_is_written(prepared, tmp_path, capsys):
    notes = tmp_path / "notes.txt"
    notes.write_text("kept")
    before = sorted(p.relative_to(prepared) for p in prepared.rglob("*"))
    for out, said in [(notes, f"'train.output_dir' '{notes}': '{notes}' is a file, not a folder"),
                      (notes / "run", f"'train.output_dir' '{notes / 'run'}': '{notes}' is a file, not a folder"),
                      (prepared, f"'train.output_dir' ({prepared}) is the dataset's folder or inside it"),
                      (prepared / "run", f"'train.output_dir' ({prepared / 'run'}) is the dataset's folder or inside it")]:
        code, err = pretrain_main(_args(prepared, out, "")), capsys.readouterr().err
        assert code == 2 and said in err and "Traceback" not in err, err[-2000:]
    assert notes.read_text() == "kept" and sorted(p.relative_to(prepared) for p in prepared.rglob("*")) == before


def test_a_status_folder_that_is_a_file_is_named_before_anything_is_written(prepared, tmp_path, capsys, monkeypatch):
    notes = tmp_path / "notes.txt"
    notes.write_text("kept")
    monkeypatch.setenv("PRETRAIN_STATUS_DIR", str(notes))
    code, err = pretrain_main(_args(prepared, tmp_path / "run", "")), capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err[-2000:]
    assert f"PRETRAIN_STATUS_DIR (the sbatch's STATUS_DIR) '{notes}': '{notes}' is a file, not a folder" in err
    assert notes.read_text() == "kept" and not (tmp_path / "run").exists()


def test_a_launcher_layout_that_does_not_add_up_is_named_in_one_line(prepared, tmp_path, capsys, monkeypatch):
    """RANK and its siblings come from a launcher or a user's export; DeepSpeed would fail on them with a traceback."""
    good = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": "29500"}
    for change, said in [({"RANK": "abc"}, "RANK='abc' is not a whole number"),
                         ({"LOCAL_RANK": None}, "RANK is set but LOCAL_RANK is not"),
                         ({"MASTER_ADDR": None}, "RANK is set but MASTER_ADDR is not"),
                         ({"RANK": "1"}, "RANK=1 with WORLD_SIZE=1: a rank counts from 0 to WORLD_SIZE - 1"),
                         ({"LOCAL_RANK": "2", "WORLD_SIZE": "4", "RANK": "2"},
                          "LOCAL_RANK=2 with LOCAL_WORLD_SIZE=1"),
                         ({"MASTER_PORT": "70000"}, "MASTER_PORT=70000 is not a TCP port")]:
        with monkeypatch.context() as m:
            for name, value in {**good, **change}.items():
                m.delenv(name, raising=False) if value is None else m.setenv(name, value)
            code, err = pretrain_main(_args(prepared, tmp_path / "run", "")), capsys.readouterr().err
        assert code == 2 and said in err and "Traceback" not in err, (change, err[-2000:])
    assert not (tmp_path / "run").exists()
    # srun's variables, read when no launcher set RANK.
    with monkeypatch.context() as m:
        for name in good:
            m.delenv(name, raising=False)
        m.setenv("SLURM_STEP_ID", "0"), m.setenv("SLURM_PROCID", "0"), m.setenv("SLURM_NTASKS", "1")
        m.setenv("SLURM_JOB_ID", "12a")
        code, err = pretrain_main(_args(prepared, tmp_path / "run", "")), capsys.readouterr().err
    assert code == 2 and "SLURM_JOB_ID='12a' is not a job number" in err and "Traceback" not in err, err[-2000:]
    with monkeypatch.context() as m:  # srun with one task on the first machine and two on the second
        for name in good:
            m.delenv(name, raising=False)
        for name, value in {"SLURM_STEP_ID": "0", "SLURM_PROCID": "2", "SLURM_NTASKS": "3", "SLURM_LOCALID": "1",
                            "SLURM_JOB_ID": "12", "SLURM_TASKS_PER_NODE": "1,2"}.items():
            m.setenv(name, value)
        code, err = pretrain_main(_args(prepared, tmp_path / "run", "")), capsys.readouterr().err
    assert code == 2 and "SLURM_TASKS_PER_NODE=1,2: give every machine the same number of tasks" in err, err[-2000:]


def test_missing_config_file(capsys):
    assert pretrain_main(["train", "--config", "/nonexistent/run.yaml"]) == 2
    assert "/nonexistent/run.yaml" in capsys.readouterr().err


def test_a_run_config_of_one_family_starting_from_a_folder_of_another_is_refused(prepared, tmp_path, capsys):
    """The demo config's model group is ModernBERT; a BERT teacher for TaCL would have trained BERT under that name."""
    teacher = tmp_path / "teacher"
    teacher.mkdir()
    (teacher / "config.json").write_text(json.dumps({"model_type": "bert"}))
    args = ["train", "--config", "pretrain/configs/demo_mlm.yaml", f"data.path={prepared}",
            f"train.output_dir={tmp_path / 'run'}", "objective.name=tacl", f"model.init_from={teacher}"]
    code, err = pretrain_main(args), capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err[-2000:]
    assert err.strip().splitlines()[-1].endswith(
        f"config key 'model.architecture' is modernbert, but model.init_from '{teacher}' holds a bert model: set "
        "model.architecture=bert, or leave it unset (then the folder's family is used)"), err
    assert not (tmp_path / "run").exists()


def test_the_pretrained_model_group_trains_the_folders_shape_with_the_dropout_set(prepared, tmp_path):
    """README's `--config demo_mlm.yaml model=pretrained model.init_from=DIR`: the keys left unset are the folder's, in
    the model trained and in the config.yaml that records it; a dropout set applies over the folder's."""
    import yaml
    from transformers import BertConfig, BertForMaskedLM

    from pretrain.run_dir import RunDir

    teacher = tmp_path / "teacher"
    BertForMaskedLM(BertConfig(vocab_size=400, hidden_size=48, num_hidden_layers=3, num_attention_heads=4,
                               intermediate_size=96, max_position_embeddings=80, hidden_dropout_prob=0.2,
                               attention_probs_dropout_prob=0.3)).save_pretrained(teacher)
    out = tmp_path / "run"
    run_cli("pretrain", ["train", "--config", "pretrain/configs/demo_mlm.yaml", "model=pretrained",
                         f"model.init_from={teacher}", "model.dropout=0.05", f"data.path={prepared}",
                         f"train.output_dir={out}", "train.max_steps=1", "train.micro_batch_size=4",
                         "train.global_batch_size=4", "train.save_every=1", "train.eval_every=0"])
    saved = yaml.safe_load(RunDir(out).config.read_text())["model"]
    assert {key: saved[key] for key in ("architecture", "hidden_size", "num_layers", "num_heads", "intermediate_size",
                                        "max_position_embeddings", "vocab_size", "dropout", "attention_dropout")} == {
        "architecture": "bert", "hidden_size": 48, "num_layers": 3, "num_heads": 4, "intermediate_size": 96,
        "max_position_embeddings": 80, "vocab_size": 400, "dropout": 0.05, "attention_dropout": 0.3}
    trained = json.loads((out / "model_config.json").read_text())
    assert (trained["hidden_size"], trained["num_hidden_layers"], trained["hidden_dropout_prob"],
            trained["attention_probs_dropout_prob"]) == (48, 3, 0.05, 0.3)


def test_a_validation_split_smaller_than_a_batch_is_a_warning_not_a_silent_skip(prepared, tmp_path):
    """train.eval_every set, and fewer held-out sequences than one batch: the run trains, says in its log that it does
    not validate and why, and writes no validation row (it used to skip validation without a word)."""
    from data_pipeline.shards import read_manifest
    from pretrain.run_dir import RunDir

    splits = read_manifest(prepared)["splits"]
    batch = splits["validation"]["sequences"] + 1
    assert batch <= splits["train"]["sequences"]
    out = tmp_path / "run"
    proc = run_cli("pretrain", ["train", "--config", "pretrain/configs/demo_mlm.yaml", f"data.path={prepared}",
                                f"train.output_dir={out}", *TINY_MODEL, "train.max_steps=1", f"train.micro_batch_size={batch}",
                                f"train.global_batch_size={batch}", "train.save_every=1", "train.eval_every=1"])
    assert (f"warning: no validation (train.eval_every is set): the validation split has {batch - 1} sequence(s), "
            f"fewer than one batch (micro_batch_size {batch} x 1 ranks)") in proc.stdout, proc.stdout[-3000:]
    assert "finished at step 1" in proc.stdout and RunDir(out).metric_rows("validation") == []


def test_a_global_batch_the_launched_ranks_do_not_divide_is_refused_before_the_data_is_opened(prepared, tmp_path):
    """16 = 4 x 2 ranks x 2 accumulation steps works; 4 on 2 ranks of 4 does not. The data path here is missing too:
    the batch comes first, since the world size is known as soon as the process group starts."""
    args = _args(prepared, tmp_path / "run", "train.global_batch_size=4 data.path=/nonexistent/data")
    proc = run_cli("pretrain", args, nproc=2, check=False)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and errors, proc.stderr[-3000:]
    assert all(line == "error: train.global_batch_size=4 is not divisible by micro_batch_size (4) x world size (2) = 8"
               for line in errors), errors
    run = tmp_path / "run"  # on a GPU machine the flight recorder's folder is made first; nothing else
    assert "Traceback" not in proc.stderr and not [p for p in run.glob("*") if p.name != "flight_recorder"]


def test_a_start_folder_with_another_tokenizer_than_the_datas_is_refused_in_one_line(prepared, tmp_path):
    """`model.init_from` with an export whose tokenizer maps tokens to other ids than the dataset's, at the same
    vocabulary size: one line naming both and what to do, exit 2, before any model is built or any file written."""
    import shutil

    from transformers import BertConfig, BertForMaskedLM

    from data_pipeline.dataset_dir import DatasetDir
    from data_pipeline.shards import read_manifest

    start = tmp_path / "start"
    vocab = read_manifest(prepared)["tokenizer"]["vocab_size"]
    BertForMaskedLM(BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                               vocab_size=vocab, max_position_embeddings=64)).save_pretrained(start)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (DatasetDir(prepared).tokenizer / name).is_file():
            shutil.copy(DatasetDir(prepared).tokenizer / name, start / name)
    spec = json.loads((start / "tokenizer.json").read_text(encoding="utf-8"))
    pieces = spec["model"]["vocab"]
    pieces[50], pieces[51] = pieces[51], pieces[50]  # another vocabulary, as large, with the same special ids
    (start / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
    out = tmp_path / "run"
    args = ["train", "--config", "pretrain/configs/demo_mlm.yaml", f"data.path={prepared}", f"train.output_dir={out}",
            "train.micro_batch_size=4", "model=pretrained", f"model.init_from={start}"]
    proc = run_cli("pretrain", args, check=False)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, (proc.returncode, proc.stderr[-3000:])
    first = min(pieces[50][0], pieces[51][0])  # named first: in the start folder at 50 or 51, in the data's at the other
    here = 50 if pieces[50][0] == first else 51
    assert lines == [f"error: 'model.init_from' {start} has another tokenizer than the dataset's (2 token(s) with other "
                     f"ids ({first!r}: {here} against {101 - here})): its embeddings index the other one's ids; prepare the "
                     f"data with its tokenizer (tokenizer.pretrained={start})"], lines
    assert not out.exists()
