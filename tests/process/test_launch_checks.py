"""A launch is checked against the checkpoint it resumes before it writes anything (issue 34): another tokenizer,
other data, another model shape or stage is refused in one line, exit 2, and the run folder stays byte-identical
apart from its logs; new data is allowed on purpose (train.allow_new_data) and recorded; export refuses a tokenizer
that is not the checkpoint's."""
import hashlib
import json
import shutil
from pathlib import Path

import pytest
from conftest import TINY_MODEL, kjv_chapters, plant_payload, prepare_corpus, run_cli
from data_pipeline.dataset_dir import DatasetDir
from pretrain.run_dir import CONFIG_FILE, DATA_MANIFEST_FILE, MODEL_CONFIG_FILE, RunDir

LOGS = ("train.log", "metrics.jsonl", "tensorboard")


def _args(data: Path, out: Path, *extra: str) -> list[str]:
    return ["train", "--config", "pretrain/configs/demo_mlm.yaml", f"data.path={data}", f"train.output_dir={out}",
            *TINY_MODEL, "train.micro_batch_size=4", "train.global_batch_size=8", "train.max_steps=9",
            "train.save_every=3", "train.keep_last=5", "train.eval_every=0", "train.log_every=3", "train.zero_stage=2",
            *extra]


@pytest.fixture(scope="module")
def trained(prepared, tmp_path_factory) -> Path:
    """A run of 9 steps with checkpoints at 3, 6 and 9; each test works on a copy."""
    run = tmp_path_factory.mktemp("launch_run") / "run"
    run_cli("pretrain", _args(prepared, run))
    return run


def _copy(run: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(run, tmp_path / "run"))


def _snapshot(run: Path) -> dict[str, str]:
    """Every file of the run folder but its logs, by content."""
    return {str(p.relative_to(run)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(run.rglob("*"))
            if p.is_file() and p.relative_to(run).parts[0] not in LOGS}


def _refused(args: list[str], run: Path, *expected: str, shadow: Path | None = None) -> None:
    before = _snapshot(run)
    proc = _launch(args, shadow)
    assert proc.returncode == 2, proc.stderr[-3000:]
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("error: ") and all(e in line for e in expected), line
    assert "Traceback" not in proc.stderr
    assert _snapshot(run) == before  # config.yaml, manifest, model config, tokenizer/, checkpoints: untouched


@pytest.fixture(scope="module")
def datasets(tmp_path_factory, corpus_file, prepared):
    """Another tokenizer (300 tokens), and other text prepared with the run's own tokenizer."""
    root = tmp_path_factory.mktemp("launch_data")
    other_text = root / "other.txt"
    other_text.write_text("\n\n".join(kjv_chapters(90)[60:]) + "\n", encoding="utf-8")
    other_tok = prepare_corpus(root / "other_tokenizer", corpus_file, "tokenizer.vocab_size=300")
    same_tok = prepare_corpus(root / "same_tokenizer", other_text, f"tokenizer.pretrained={DatasetDir(prepared).tokenizer}")
    return other_tok, same_tok


def test_a_launch_that_cannot_resume_writes_nothing(prepared, datasets, trained, tmp_path):
    other_tok, same_tok = datasets
    run = _copy(trained, tmp_path)
    _refused(_args(other_tok, run, "train.zero_stage=3"), run, "tokenizer", "tokenizer.pretrained=RUN/tokenizer")
    _refused(_args(same_tok, run), run, "other data", "train.allow_new_data=true")
    _refused(_args(prepared, run, "train.zero_stage=3"), run, "ZeRO stage 2", "stage 3")
    _refused(_args(prepared, run, "model.num_layers=3"), run, "another model shape", "model.init_from")
    _refused(_args(prepared, run, "train.resume_from=7"), run, "train.resume_from=7: no complete checkpoint step_00000007")
    # Continued pre-training on new data, asked for: it resumes the weights, reads the new data from its start and
    # records both datasets.
    resumed = run_cli("pretrain", _args(same_tok, run, "train.allow_new_data=true", "train.max_steps=12"))
    assert "resumed from" in resumed.stdout and "at step 9" in resumed.stdout and "on new data" in resumed.stdout
    history = [json.loads(line) for line in RunDir(run).data_history.read_text().splitlines()]
    assert [row["from_step"] for row in history] == [0, 9] and history[0]["dataset"] != history[1]["dataset"]
    assert history[0]["tokenizer"] == history[1]["tokenizer"]
    assert (RunDir(run).checkpoints / "step_00000012" / "COMPLETE").is_file()


def _launch(args: list[str], shadow: Path | None):
    """`python -m pretrain ARGS`, with the packages in `shadow` (if any) hiding the installed ones."""
    if shadow is None:
        return run_cli("pretrain", args, check=False)
    return run_cli("tests/helpers/shadowed.py", [str(shadow), "pretrain", *args], check=False)


def test_a_launch_refused_after_its_engine_is_built_writes_no_run_file(prepared, trained, tmp_path):
    """What a launch changes in the run folder happens when training starts: a launch refused once its engine is
    built (here a tracker whose library cannot be imported) neither branches (train.resume_from moves later checkpoints
    aside) nor writes the run files and the DeepSpeed config; a new folder gets none of them."""
    hidden = tmp_path / "no_wandb" / "wandb"
    hidden.mkdir(parents=True)
    (hidden / "__init__.py").write_text('raise ImportError("no module named wandb here")\n')
    tracked = "train.report_to=[tensorboard,wandb]"
    run = _copy(trained, tmp_path)
    _refused(_args(prepared, run, tracked, "train.resume_from=3"), run,
             "train.report_to has wandb, but its library is not installed", shadow=hidden.parent)
    fresh = RunDir(tmp_path / "fresh")
    proc = _launch(_args(prepared, fresh.root, tracked), hidden.parent)
    assert proc.returncode == 2 and "its library is not installed" in proc.stderr.strip().splitlines()[-1], \
        proc.stderr[-3000:]
    assert not any(path.exists() for path in (fresh.file(CONFIG_FILE), fresh.file(MODEL_CONFIG_FILE),
                                              fresh.file(DATA_MANIFEST_FILE), fresh.deepspeed_config, fresh.tokenizer))


def _in_process(module: str, args: list[str], capsys) -> tuple[int, str]:
    """The command line's own entry point in this process (a subprocess costs its imports): (exit code, last line)."""
    main = __import__(f"{module}.cli", fromlist=["main"]).main
    code = main(args)
    err = capsys.readouterr().err
    assert "Traceback" not in err, err[-3000:]
    return code, (err.strip().splitlines() or [""])[-1]


def test_another_model_shape_or_objective_is_refused(trained):
    """The checks themselves on the checkpoint's own run files (the command-line path is the test above's)."""
    from core.errors import ConfigError
    from pretrain.checkpointing.resume_checks import check_resume
    from pretrain.run_dir import CONFIG_FILE, DATA_MANIFEST_FILE, MODEL_CONFIG_FILE

    tag_dir = RunDir(trained).checkpoints / "step_00000009"
    files = {name: (tag_dir / name).read_text() for name in (CONFIG_FILE, MODEL_CONFIG_FILE, DATA_MANIFEST_FILE)}
    assert check_resume(tag_dir, files, allow_new_data=False) is None  # the same launch resumes
    wider = {**files, MODEL_CONFIG_FILE: files[MODEL_CONFIG_FILE].replace('"hidden_size": 32', '"hidden_size": 48')}
    with pytest.raises(ConfigError, match=r"another model shape .*hidden_size 32 -> 48.*model.init_from"):
        check_resume(tag_dir, wider, allow_new_data=False)
    other = {**files, CONFIG_FILE: files[CONFIG_FILE].replace("name: mlm", "name: taco", 1)}
    with pytest.raises(ConfigError, match=r"objective.name=mlm, and this launch sets taco.*model.init_from"):
        check_resume(tag_dir, other, allow_new_data=False)


def test_export_overwrites_only_its_own_folders_and_ships_only_the_checkpoints_tokenizer(prepared, trained, tmp_path,
                                                                                          capsys):
    run, export = _copy(trained, tmp_path), tmp_path / "export"
    exporting = ["export", "--checkpoint", str(run), "--overwrite"]
    assert _in_process("pretrain", [*exporting, "--out", str(export)], capsys)[0] == 0
    assert _in_process("pretrain", [*exporting, "--out", str(export)], capsys)[0] == 0  # an export of ours: replaced
    assert (export / "config.json").is_file()
    card = (export / "README.md").read_text()  # published with the model: no path of this machine in it
    assert str(prepared) not in card and str(tmp_path) not in card and "/pytest-of-" not in card
    assert f"prepared dataset: `{prepared.name}`" in card and '"command"' not in card
    unrelated = tmp_path / "mine"
    unrelated.mkdir()
    (unrelated / "notes.txt").write_text("keep me")
    for out, expected in ((run, "which this command reads"), (RunDir(run).checkpoints, "which this command reads"),
                          (unrelated, "is not one")):
        before = _snapshot(out)
        code, line = _in_process("pretrain", [*exporting, "--out", str(out)], capsys)
        assert code == 2 and line.startswith("error: ") and expected in line, line
        assert _snapshot(out) == before
    vocab = next(p for p in RunDir(run).tokenizer.iterdir() if p.suffix == ".json")
    vocab.write_bytes(vocab.read_bytes() + b"\n")  # what another tokenizer's files in the run folder would be
    code, line = _in_process("pretrain", ["export", "--checkpoint", str(run), "--out", str(tmp_path / "export2")], capsys)
    assert code == 2 and "refusing to ship a model with another tokenizer's files" in line
    assert not (tmp_path / "export2").exists()


def test_prepare_overwrites_only_a_dataset_and_never_what_it_reads(prepared, corpus_file, tmp_path, capsys):
    from data_pipeline.dataset_dir import MANIFEST

    sources = f"sources=[{{kind: text, path: '{corpus_file}'}}]"
    base = ["prepare", "--config", "data_pipeline/configs/demo.yaml", sources, "tokenizer.vocab_size=300", "seq_len=64",
            "overwrite=true"]
    data = tmp_path / "data"
    assert _in_process("data_pipeline", [*base, f"output_dir={data}"], capsys)[0] == 0
    assert _in_process("data_pipeline", [*base, f"output_dir={data}"], capsys)[0] == 0  # a dataset of ours: replaced
    (data / ".contrastive-pretrain.json").unlink()  # a dataset prepared before the marker: its manifest says it is ours
    assert _in_process("data_pipeline", [*base, f"output_dir={data}"], capsys)[0] == 0
    assert (data / MANIFEST).is_file()
    unrelated = tmp_path / "mine"
    unrelated.mkdir()
    (unrelated / "notes.txt").write_text("keep me")
    for out, expected in ((corpus_file.parent, "which this command reads"), (unrelated, "is not one")):
        before = _snapshot(out)
        code, line = _in_process("data_pipeline", [*base, f"output_dir={out}"], capsys)
        assert code == 2 and line.startswith("error: ") and expected in line, line
        assert _snapshot(out) == before


def test_local_cluster_removes_only_a_folder_it_made(tmp_path):
    """slurm/local_cluster.sh runs as root and clears SLURM_LOCAL_DIR on start: a non-empty folder without its marker
    is refused (an empty one, as the tests make, is taken)."""
    import os
    import subprocess

    from conftest import REPO

    mine = tmp_path / "precious"
    mine.mkdir()
    (mine / "thesis.tex").write_text("keep me")
    proc = subprocess.run(["bash", str(REPO / "slurm" / "local_cluster.sh"), "start", "1"], capture_output=True, text=True,
                          env={**os.environ, "SLURM_LOCAL_DIR": str(mine)}, timeout=60)
    assert proc.returncode == 2 and "not made by local_cluster.sh" in proc.stderr
    assert (mine / "thesis.tex").read_text() == "keep me"


def test_resume_from_branches_once_and_keeps_the_later_checkpoints(prepared, trained, tmp_path):
    """Branching from step 3 moves steps 6 and 9 aside (kept); a requeue with the same overrides resumes the branch's
    newest checkpoint, not step 3 again; a tag that is not one of the run's is refused."""
    run = _copy(trained, tmp_path)
    ckpts = RunDir(run).checkpoints
    from core.config_io import load_config
    from core.errors import ConfigError
    from pretrain.config import RunConfig
    from pretrain.checkpointing.resume_choice import ResumeChoice

    for bad in ("../../elsewhere/step_00000003", "step_3"):
        choice = ResumeChoice(load_config(RunConfig, None, [f"train.output_dir={run}", f"train.resume_from={bad}"]),
                              RunDir(run))
        with pytest.raises(ConfigError, match="'train.resume_from'.*neither a step nor a tag"):
            choice.choose()
    branch = _args(prepared, run, "train.resume_from=3", "train.stop_after=1")
    first = run_cli("pretrain", branch)
    assert "at step 3" in first.stdout and "moved aside" in first.stdout
    # What differs from the checkpoint's config is named, each key with both values (the run was copied: its folder).
    moved = f'train.output_dir "{trained}" -> "{run}"'
    assert (f'note: the config differs from the one checkpoint step_00000003 was saved with ({moved}, '
            'train.stop_after 0 -> 1, train.resume_from "" -> "3"); the current one applies') in first.stdout, \
        first.stdout[-3000:]
    assert sorted(p.name for p in ckpts.glob("step_*")) == ["step_00000003", "step_00000004"]
    (aside,) = ckpts.glob("aside-after-step_00000003-*")
    assert sorted(p.name for p in aside.iterdir()) == ["step_00000006", "step_00000009"]
    assert all((aside / name / "COMPLETE").is_file() for name in ("step_00000006", "step_00000009"))
    requeued = run_cli("pretrain", branch)  # SLURM requeues with the same overrides
    assert "at step 4" in requeued.stdout and "was applied by an earlier attempt" in requeued.stdout
    assert "note: the config differs" not in requeued.stdout  # step 4 was saved by this same config
    assert sorted(p.name for p in ckpts.glob("step_*"))[-1] == "step_00000005"
    assert [json.loads(line)["from"] for line in RunDir(run).branches.read_text().splitlines()] == ["step_00000003"]


def test_export_skips_a_damaged_newest_checkpoint(trained, tmp_path, capsys, caplog):
    """A newest checkpoint whose files no longer match their recorded hashes is named and skipped for the newest
    intact one; the model card says which step was exported."""
    run = _copy(trained, tmp_path)
    model_file = RunDir(run).checkpoints / "step_00000009" / "mp_rank_00_model_states.pt"
    model_file.write_bytes(model_file.read_bytes()[:1000])
    with caplog.at_level("WARNING"):
        assert _in_process("pretrain", ["export", "--checkpoint", str(run), "--out", str(tmp_path / "export")], capsys)[0] == 0
    assert "step_00000009 is damaged" in caplog.text and "exporting an older one" in caplog.text
    card = (tmp_path / "export" / "README.md").read_text()
    assert "checkpoint: `step_00000006`: step 6 of max_steps 9" in card


def test_export_reads_a_checkpoint_as_data_and_refuses_one_that_holds_code(trained, tmp_path, capsys):
    """A checkpoint whose files (and completion marker) were rewritten to carry a pickled call is refused unread
    (exit 2, one line naming the file and what it holds); --trust-checkpoint reads it with pickle, which runs it."""
    run = _copy(trained, tmp_path)
    tag, ran = RunDir(run).checkpoints / "step_00000009", tmp_path / "the-payload-ran"
    model_file = plant_payload(tag, ran)
    args = ["export", "--checkpoint", str(tag), "--out", str(tmp_path / "export")]
    code, line = _in_process("pretrain", args, capsys)
    assert code == 2, line
    assert f"checkpoint file '{model_file}' holds more than weights and plain data (io.open)" in line  # builtins.open pickles by its home
    assert "--trust-checkpoint" in line and not ran.exists() and not (tmp_path / "export").exists()
    assert _in_process("pretrain", [*args, "--trust-checkpoint"], capsys)[0] == 0 and ran.exists()
    assert (tmp_path / "export" / "config.json").is_file()


def test_export_refuses_a_checkpoint_file_that_is_no_zip_archive_in_one_line(trained, tmp_path, capsys):
    """A model file in torch's old (pre-zip) format, its completion record rewritten to match: the data-only loader
    cannot read it; one line naming the file, exit 2, not torch's RuntimeError."""
    import torch
    from pretrain.checkpointing.checkpoint_dir import COMPLETE, file_manifest

    run = _copy(trained, tmp_path)
    tag = RunDir(run).checkpoints / "step_00000009"
    model_file = tag / "mp_rank_00_model_states.pt"
    torch.save(torch.load(model_file, weights_only=False), model_file, _use_new_zipfile_serialization=False)
    (tag / COMPLETE).write_text(json.dumps({**json.loads((tag / COMPLETE).read_text()), "files": file_manifest(tag)}))
    code, line = _in_process("pretrain", ["export", "--checkpoint", str(tag), "--out", str(tmp_path / "export")], capsys)
    assert code == 2 and f"checkpoint file '{model_file}' is not a zip archive" in line and "--trust-checkpoint" in line
    assert not (tmp_path / "export").exists()


def test_resume_reads_a_checkpoint_as_data_and_refuses_one_that_holds_code(trained, tmp_path):
    """The newest checkpoint rewritten to carry a pickled call, its completion record rewritten to match: a resume
    refuses it before DeepSpeed unpickles anything (exit 2, one line, the run untouched, the call not made);
    train.trust_checkpoint=true resumes from it with pickle, which makes the call."""
    run = _copy(trained, tmp_path)
    tag, ran = RunDir(run).checkpoints / "step_00000009", tmp_path / "the-payload-ran"
    model_file = plant_payload(tag, ran)
    resume = _args(Path(_data_of(trained)), run, "train.max_steps=10")
    _refused(resume, run, f"checkpoint file '{model_file}' holds more than weights and plain data (io.open)",
             "train.trust_checkpoint=true")
    assert not ran.exists()
    trusted = run_cli("pretrain", [*resume, "train.trust_checkpoint=true"])
    assert "resumed from" in trusted.stdout and "at step 9" in trusted.stdout and ran.exists()


def _data_of(run: Path) -> str:
    """The dataset a run trained on (its saved config's data.path)."""
    import yaml

    return yaml.safe_load((run / CONFIG_FILE).read_text())["data"]["path"]


def test_sbatch_overrides_are_split_into_words_never_run_and_bad_quoting_is_refused(tmp_path):
    """slurm/shell_words.sh, which the three sbatch templates source: quoted values keep their spaces, a command
    substitution stays text, and quotes that do not close stop the job (exit 2) instead of dropping every override."""
    import os
    import subprocess
    import sys
    from conftest import REPO

    def split(text: str) -> subprocess.CompletedProcess:
        script = f'source "{REPO}/slurm/shell_words.sh"; split_words got OVERRIDES "$1"; echo -n "${{#got[@]}}"; printf "<%s>" "${{got[@]}}"'
        env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
        return subprocess.run(["bash", "-c", script, "bash", text], cwd=tmp_path, env=env, capture_output=True, text=True)

    ok = split(f"a=1 'b=[x, y]' c=$(touch {tmp_path / 'ran'})")
    assert ok.returncode == 0 and ok.stdout == f"4<a=1><b=[x, y]><c=$(touch><{tmp_path / 'ran'})>", ok
    assert not (tmp_path / "ran").exists() and split("").stdout == "0<>"
    bad = split("a=1 'b=2")
    assert bad.returncode == 2 and bad.stdout == ""
    assert "OVERRIDES cannot be split into words (ValueError: No closing quotation)" in bad.stderr, bad.stderr
