"""One meaning on both transformers majors: 5.x, the stack the project is built and tested on, and 4.57, kept working.

`make` installs transformers 4.57 with its tokenizers and huggingface_hub into a folder of the virtual environment
(OVERLAY) that a process puts first on PYTHONPATH. The compatibility subset (COMPAT_UNITS: tokenizer, backbones,
FLOPs, export and load, and this module's in-process tests) runs there; exports written under either major are read
under the other; relative positions, which 5.x removed, are refused under 5.x and carry their limit under 4.x.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import REPO, TINY_MODEL, restored_environ
from helpers.on_transformers4 import SUBSET_END, TRAIN_MARK

from core.errors import ConfigError, SetupError
from model.backbones.base import check_model_folder, relative_positions_available, transformers_major

OVERLAY = Path(sys.prefix) / "compat-transformers4"
OVERLAY_VERSIONS = {"transformers": "4.57.6", "tokenizers": "0.22.2", "huggingface_hub": "0.36.2"}
COMPAT_UNITS = ["tests/unit/test_tokenizer.py", "tests/unit/test_backbones.py", "tests/unit/test_flops.py",
                "tests/unit/test_init_from_family.py"]
# This module's tests that start processes of their own; every other test here runs under both majors (the subset
# names them one by one: everything under tests/process/ is marked slow, so `-m "not slow"` would deselect them all).
ACROSS_PROCESSES = {"test_the_compatibility_subset_passes_on_transformers_4",
                    "test_exports_written_on_one_major_load_the_same_on_the_other",
                    "test_relative_position_runs_train_and_export_on_4_and_are_refused_on_5"}
RELKQ = "model.position_embedding=relative_key_query"
EXPECTED_STACK = "CONTRASTIVE_PRETRAIN_EXPECTED_STACK"
ROUNDTRIP = REPO / "tests" / "helpers" / "export_roundtrip.py"
ON_4X = REPO / "tests" / "helpers" / "on_transformers4.py"


def _on_4x(cmd: list[str], timeout: int = 600) -> subprocess.CompletedProcess:
    """A command under transformers 4.57 (the overlay first on the path), from the repository root."""
    assert OVERLAY.is_dir(), f"{OVERLAY} is missing: `make` installs it (the 4.x compatibility overlay)"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(OVERLAY), str(REPO)]), "OMP_NUM_THREADS": "1",
           "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", EXPECTED_STACK: "overlay"}
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


def _refused(args: list[str], capsys) -> str:
    """`python -m pretrain ARGS` in this process (a refusal comes before any process group): its one line."""
    from pretrain.cli import main

    capsys.readouterr()
    with restored_environ():  # export sets the launcher variables before it reads the config; later launches must not see them
        code = main(args)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, (code, err[-3000:])
    return lines[0]


def test_the_stack_is_the_one_this_run_expects():
    """The suite runs on transformers 5 and numpy >= 2.2; the compatibility subset on exactly the overlay's versions
    (EXPECTED_STACK says which)."""
    import numpy
    import tokenizers
    import transformers
    import huggingface_hub

    if os.environ.get(EXPECTED_STACK) == "overlay":
        have = {m.__name__: m.__version__ for m in (transformers, tokenizers, huggingface_hub)}
        assert have == OVERLAY_VERSIONS and transformers.__file__.startswith(str(OVERLAY)), (have, transformers.__file__)
        return
    assert transformers_major() == 5 and int(transformers.__version__.split(".")[0]) == 5
    assert tuple(int(x) for x in numpy.__version__.split(".")[:2]) >= (2, 2)


# ---- in-process: these run under both majors (here, and in the compatibility subset) ----------------------------
def test_the_last_layer_is_last_hidden_state_on_every_major(tmp_path):
    """ModernBERT's `hidden_states[-1]` is before its final norm in 4.x and after it in 5.x: the linear probe's last
    layer, the self-similarity's and TaCL fine-tuning's anchors are `last_hidden_state` on both."""
    from transformers import AutoModel, ModernBertConfig, ModernBertForTokenClassification

    from evaluation.finetune import task_loss_and_states
    from evaluation.linear_probe import _hidden
    from model.backbones.base import layer_states

    config = ModernBertConfig(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                              intermediate_size=64, max_position_embeddings=64, pad_token_id=0, bos_token_id=2,
                              eos_token_id=3, cls_token_id=2, sep_token_id=3, reference_compile=False, num_labels=3)
    torch.manual_seed(0)
    ModernBertForTokenClassification(config).save_pretrained(tmp_path / "m")
    ids = torch.randint(5, 120, (2, 12))
    mask = torch.ones_like(ids)
    encoder = AutoModel.from_pretrained(tmp_path / "m").eval()
    with torch.no_grad():
        out = encoder(input_ids=ids, attention_mask=mask, output_hidden_states=True)
        last = out.last_hidden_state
        assert torch.equal(_hidden(encoder, {"input_ids": ids, "attention_mask": mask}, -1), last)
        assert torch.equal(_hidden(encoder, {"input_ids": ids, "attention_mask": mask}, 2), last)
        assert torch.equal(layer_states(out)[-1], last) and len(layer_states(out)) == 3
        tagger = ModernBertForTokenClassification.from_pretrained(tmp_path / "m").eval()
        loss, anchors = task_loss_and_states(tagger, {"input_ids": ids, "attention_mask": mask,
                                                      "labels": torch.zeros_like(ids)})
    assert torch.isfinite(loss) and torch.allclose(anchors, last, atol=1e-6, rtol=0)
    if transformers_major() < 5:  # where the two tensors differ, so the checks above can fail
        assert not torch.allclose(out.hidden_states[-1], last, atol=1e-3)


def test_relative_positions_are_refused_on_5_and_limited_to_4():
    """Under 5.x a relative-position config, a saved config with them, or a folder that names its limit is refused
    with one line naming ModernBERT; under 4.x they build, and the export's limit is "<5"."""
    from model.backbones import backbone_for
    from model.encoder import EncoderConfig, model_config

    relkq = EncoderConfig(architecture="bert", position_embedding="relative_key_query", hidden_size=32, num_heads=2)
    albert = EncoderConfig(architecture="albert", position_embedding="relative_key", hidden_size=32, num_heads=2)
    saved = {"model_type": "bert", "position_embedding_type": "relative_key_query"}
    if relative_positions_available():
        relkq.validate()
        albert.validate()
        config = model_config(relkq, {"vocab_size": 120, "pad_id": 0, "cls_id": 2, "sep_id": 3}, 64)
        assert config.position_embedding_type == "relative_key_query"
        assert backbone_for(config).version_limit(config) == "<5"
        return
    for cfg, key in ((relkq, "relative_key_query"), (albert, "relative_key")):
        with pytest.raises(ConfigError, match=rf"'model.position_embedding={key}'.*model.architecture=modernbert") as err:
            cfg.validate()
        assert "\n" not in str(err.value)
    from model.encoder import config_from_dict

    with pytest.raises(ConfigError, match="position_embedding_type=relative_key_query.*no relative position"):
        config_from_dict(saved, "sdpa", "checkpoint 'x'")
    absolute = model_config(EncoderConfig(architecture="bert", hidden_size=32, num_heads=2),
                            {"vocab_size": 120, "pad_id": 0, "cls_id": 2, "sep_id": 3}, 64)
    assert "position_embedding_type" not in absolute.to_dict()  # 5.x's BertConfig has no such field: none is written
    assert backbone_for(absolute).version_limit(absolute) is None


def test_a_folder_refuses_the_transformers_it_names_as_wrong(tmp_path):
    """`requires_transformers` in a config.json (what an export under 4.x with relative positions writes) is read
    before evaluation loads the folder."""
    import transformers

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert", "requires_transformers": "<5"}))
    if transformers_major() >= 5:
        with pytest.raises(ConfigError, match=rf"only in transformers<5 .* not in the installed {transformers.__version__}"):
            check_model_folder(tmp_path)
    else:
        check_model_folder(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert", "requires_transformers": ">=4.57"}))
    check_model_folder(tmp_path)


def test_an_export_that_loads_differently_is_refused(tmp_path):
    """The export's read-back: the folder as written passes; one whose config.json transformers reads into another
    model (here a LayerNorm epsilon) is refused with one line."""
    from transformers import BertConfig, BertForPreTraining

    from data_pipeline.tokenizer import save_tokenizer, train_sentencepiece
    from data_pipeline.config import TokenizerConfig
    from pretrain.exporting.export_check import check_loads_the_same
    from conftest import kjv_chapters

    save_tokenizer(train_sentencepiece(kjv_chapters(20), TokenizerConfig(vocab_size=200)), tmp_path / "m", 64)
    torch.manual_seed(0)
    live = BertForPreTraining(BertConfig(vocab_size=200, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                         intermediate_size=64, max_position_embeddings=64, pad_token_id=0)).eval()
    live.save_pretrained(tmp_path / "m")
    check_loads_the_same(tmp_path / "m", live, "the root model")
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    (tmp_path / "m" / "config.json").write_text(json.dumps({**config, "layer_norm_eps": 0.5}))
    with pytest.raises(SetupError, match=r"export refused: the root model loads in transformers .* other outputs"):
        check_loads_the_same(tmp_path / "m", live, "the root model")


def test_a_folder_saved_in_bfloat16_is_read_in_float32(tmp_path):
    """transformers 5 loads a folder in the dtype it was saved in (4.x: float32): `model.init_from` and the
    evaluation's loaders ask for float32, so training and probes keep float32 weights whatever the folder holds."""
    from transformers import BertConfig, BertForPreTraining

    from conftest import kjv_chapters
    from data_pipeline.config import TokenizerConfig
    from data_pipeline.tokenizer import save_tokenizer, train_sentencepiece
    from evaluation.linear_probe import _load
    from model.encoder import EncoderConfig, model_config
    from model.objectives import ObjectiveConfig, build_objective

    folder = tmp_path / "bf16"
    save_tokenizer(train_sentencepiece(kjv_chapters(20), TokenizerConfig(vocab_size=200)), folder, 64)
    BertForPreTraining(BertConfig(vocab_size=200, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                  intermediate_size=64, max_position_embeddings=64)).to(torch.bfloat16).save_pretrained(folder)
    config = model_config(EncoderConfig(init_from=str(folder)), {"vocab_size": 200}, 64)
    objective = build_objective(ObjectiveConfig(name="mlm"), config, str(folder))
    assert {p.dtype for p in objective.parameters()} == {torch.float32}
    assert {p.dtype for p in _load(str(folder))[1].parameters()} == {torch.float32}


# ---- across processes and majors ----------------------------------------------------------------------------
RELATIVE_RUN = ["train", "--config", "pretrain/configs/demo_mlm.yaml", *TINY_MODEL, RELKQ, "train.micro_batch_size=4",
                "train.global_batch_size=4", "train.max_steps=2", "train.eval_every=0", "train.save_every=2"]


@pytest.fixture(scope="module")
def on_4x(prepared, tmp_path_factory) -> dict:
    """The three parts that run under 4.57, in one process (tests/helpers/on_transformers4.py): the compatibility
    subset, the exports written here read there and its own written, a run with relative positions trained and
    exported. {"stdout", "report": each part's {"result"} or {"error"}, "base": the folder}."""
    sys.path.insert(0, str(ROUNDTRIP.parent))
    try:
        import export_roundtrip
    finally:
        sys.path.remove(str(ROUNDTRIP.parent))
    base = tmp_path_factory.mktemp("on_4x")
    written = export_roundtrip.write(base / "from5", prepared)
    both = [name for name in globals() if name.startswith("test_") and name not in ACROSS_PROCESSES]
    spec = {"subset": ["-v", "-p", "no:cacheprovider", *COMPAT_UNITS,
                       *(f"{Path(__file__).relative_to(REPO)}::{name}" for name in both)],
            "read": str(base / "from5"), "write": str(base / "from4"), "prepared": str(prepared),
            "train": [*RELATIVE_RUN, f"data.path={prepared}", f"train.output_dir={base / 'run4'}"],
            "export": ["export", "--checkpoint", str(base / "run4"), "--out", str(base / "export4")]}
    (base / "spec.json").write_text(json.dumps(spec))
    try:
        proc = _on_4x([sys.executable, str(ON_4X), str(base / "spec.json")], timeout=1800)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"the 4.57 process ran past {exc.timeout} s:\n{(exc.stdout or b'')[-3000:]!r}") from None
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return {"stdout": proc.stdout, "report": json.loads(proc.stdout.strip().splitlines()[-1]), "base": base,
            "written_5": written, "both": both}


def _part(on_4x: dict, name: str):
    """A part's result; its traceback (and the process's last output) as the failure when it raised."""
    part = on_4x["report"][name]
    assert "error" not in part, part.get("error", "") + on_4x["stdout"][-3000:]
    return part["result"]


def test_the_compatibility_subset_passes_on_transformers_4(on_4x):
    """The subset's tests pass on the overlay's transformers 4.57 (its first test checks the versions it runs on)."""
    both = on_4x["both"]
    assert ACROSS_PROCESSES < set(globals()) and "test_the_stack_is_the_one_this_run_expects" in both
    out = on_4x["stdout"].split(SUBSET_END)[0]
    assert _part(on_4x, "subset") == 0, out[-6000:]
    assert " failed" not in out and " skipped" not in out and " deselected" not in out, out[-500:]
    assert all(f"::{name} PASSED" in out for name in both), out[-6000:]


def test_exports_written_on_one_major_load_the_same_on_the_other(on_4x):
    """Every exported class family saved under 5.x gives the same outputs (1e-5) in 4.57, and the reverse; BERT
    with relative positions, saved under 4.x, does not under 5.x (the limit is real) and is refused there."""
    sys.path.insert(0, str(ROUNDTRIP.parent))
    try:
        import export_roundtrip
    finally:
        sys.path.remove(str(ROUNDTRIP.parent))
    report, base = _part(on_4x, "roundtrip"), on_4x["base"]
    gaps = report["read"]
    assert sorted(gaps) == sorted(on_4x["written_5"]) and len(gaps) == 8
    assert all(gap <= 1e-5 for gap in gaps.values()), gaps

    gaps = export_roundtrip.read(base / "from4")
    assert sorted(gaps) == sorted(report["written"]) and "bert-relkq-mlm-root" in gaps
    relative = gaps.pop("bert-relkq-mlm-root")
    assert all(gap <= 1e-5 for gap in gaps.values()), gaps
    assert relative > 1e-2  # 5.x reads the folder with no error and computes something else
    with pytest.raises(ConfigError, match="position_embedding_type=relative_key_query"):
        check_model_folder(base / "from4" / "bert-relkq-mlm-root")


def test_relative_position_runs_train_and_export_on_4_and_are_refused_on_5(on_4x, prepared, tmp_path, capsys):
    """Under 5.x training with relative positions exits 2 with one line; under 4.x it trains and exports, its model
    card and config.json naming the limit; that run's export under 5.x exits 2 with one line."""
    train = [*RELATIVE_RUN, f"data.path={prepared}"]
    refused = _refused([*train, f"train.output_dir={tmp_path / 'run5'}"], capsys)
    assert "model.position_embedding=relative_key_query" in refused and "model.architecture=modernbert" in refused
    assert not (tmp_path / "run5").exists()

    run4 = on_4x["base"] / "run4"  # trained in the fixture's process
    log = on_4x["stdout"].split(TRAIN_MARK)[-1]
    assert _part(on_4x, "relative") == {"train": 0, "export": 0} and "finished at step 2" in log, log[-3000:]
    assert "warning: schedule.warmup_steps (56) >= train.max_steps (2): the lr warms up for the whole run" in log
    export4 = on_4x["base"] / "export4"
    assert json.loads((export4 / "config.json").read_text())["requires_transformers"] == "<5"
    assert "loads correctly only in transformers<5" in (export4 / "README.md").read_text()

    line = _refused(["export", "--checkpoint", str(run4), "--out", str(tmp_path / "export5")], capsys)
    assert "relative_key_query" in line and "transformers<5" in line and "modernbert" in line
    assert not (tmp_path / "export5").exists()
    # Resuming it under 5.x, with the only position setting 5.x accepts, is refused by the checkpoint's own config.
    before = sorted(p.name for p in run4.iterdir())
    absolute = [a for a in train if a != RELKQ] + ["train.max_steps=4", f"train.output_dir={run4}"]
    line = _refused(absolute, capsys)
    assert "checkpoint" in line and "position_embedding_type=relative_key_query" in line and "modernbert" in line
    assert sorted(p.name for p in run4.iterdir()) == before
