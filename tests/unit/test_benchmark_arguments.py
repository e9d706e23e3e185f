"""Every benchmark's command line parses (`--help` exits 0), and the arguments several of them take are defined once
(benchmarks/arguments.py): a script redefines one only with a help of its own, for a meaning of its own."""
import ast
import importlib
import sys

import pytest
from conftest import REPO

# The performance tools and the experiments behind RESULTS.md: both take the shared arguments.
TOOLS = ("benchmarks", "experiments")
SCRIPTS = sorted(f"{folder}.{p.stem}" for folder in TOOLS for p in (REPO / folder).glob("*.py")
                 if "def main(" in p.read_text())


@pytest.mark.parametrize("name", SCRIPTS)
def test_every_benchmark_parses_its_command_line(name, monkeypatch, capsys):
    module = importlib.import_module(name)
    monkeypatch.setattr(sys, "argv", [name, "--help"])
    with pytest.raises(SystemExit) as exc:
        module.main()
    assert exc.value.code == 0 and "usage:" in capsys.readouterr().out


@pytest.mark.parametrize("name, argv, said", [
    ("benchmarks.gpu_throughput", ["--steps", "10", "--warmup", "10"], "--warmup must be below --steps"),
    ("benchmarks.kernel_levers", ["--steps", "10", "--warmup", "0"], "--warmup must be at least 1"),
    ("benchmarks.vocabulary_loss", ["--chunks", "-1"], "--chunks must be >= 0"),
    ("benchmarks.rotary_tables", ["--rounds", "0"], "--rounds must be >= 1"),
])
def test_arguments_the_parser_takes_but_the_benchmark_cannot_are_refused_in_one_line(name, argv, said, monkeypatch,
                                                                                    capsys):
    # Before any model is built: through main, as a user's command line reaches it.
    monkeypatch.setattr(sys, "argv", [name, *argv])
    with pytest.raises(SystemExit) as exc:
        importlib.import_module(name).main()
    assert exc.value.code == 2 and said in capsys.readouterr().err.strip().splitlines()[-1]


def test_shared_arguments_are_defined_once():
    from benchmarks.arguments import SHARED

    redefined = []
    for path in sorted(p for folder in TOOLS for p in (REPO / folder).glob("*.py")):
        for call in ast.walk(ast.parse(path.read_text())):
            if isinstance(call, ast.Call) and getattr(call.func, "attr", None) == "add_argument" and call.args:
                flag = getattr(call.args[0], "value", "")
                own_help = any(k.arg == "help" for k in call.keywords)
                if flag.startswith("--") and flag[2:].replace("-", "_") in SHARED and not own_help:
                    redefined.append(f"{path.name}: {flag}")
    assert not redefined, redefined
    assert len(SCRIPTS) >= 15


def test_loader_workers_take_auto_or_a_count():
    """--loader-workers takes auto (the trainer's default, resolved where it runs) or a count, and nothing else."""
    import argparse

    from benchmarks.arguments import add_shared

    parser = argparse.ArgumentParser()
    add_shared(parser, loader_workers="auto")
    assert parser.parse_args([]).loader_workers == "auto"
    assert parser.parse_args(["--loader-workers", "3"]).loader_workers == 3
    with pytest.raises(SystemExit):
        parser.parse_args(["--loader-workers", "many"])


def test_a_timing_longer_than_one_pass_over_the_data_is_refused(tmp_path):
    """The trainer's loader restarts at the end of a pass; a run whose steps cross it is refused before it starts."""
    import json

    from benchmarks.host_overhead import fits_one_epoch
    from data_pipeline.dataset_dir import DatasetDir

    DatasetDir(tmp_path).manifest.write_text(json.dumps({"splits": {"train": {"sequences": 7424}}}))
    fits_one_epoch(tmp_path, 256, 29)  # 29 x 256 = 7424 sequences: exactly one pass
    with pytest.raises(SystemExit, match="29 batches of 256 per pass, fewer than the 30 steps"):
        fits_one_epoch(tmp_path, 256, 30)


def test_the_plain_loop_reads_a_fresh_batch_each_step(prepared):
    """host_overhead's plain loop masks one batch per step, as the trainer reads one: its sparse head's row count
    varies from step to step. A few batches cycled would reuse their matmul kernels, which the trainer cannot."""
    import types

    from benchmarks.host_overhead import plain_batches
    from core.config_io import load_config
    from data_pipeline.shards import read_manifest
    from pretrain.config import RunConfig

    cfg = load_config(RunConfig, str(REPO / "pretrain/configs/demo_mlm.yaml"), ["masking.mask_prob=0.15"])
    batches = plain_batches(cfg, read_manifest(prepared)["tokenizer"], types.SimpleNamespace(steps=40, batch=4, seq=64))
    masked = {int((b["labels"] != -100).sum()) for b in batches}
    assert len(batches) == 40 and len(masked) > 8, sorted(masked)


def test_the_compiled_yardstick_s_static_loss_is_the_masked_loss():
    """host_overhead --plain-compile gathers a fixed count of positions per row (rows with fewer masked tokens fill up
    with ignored ones): its loss is the mean cross-entropy over the masked tokens, against a float64 reference."""
    import torch
    from transformers import BertConfig, BertForMaskedLM

    from benchmarks.host_overhead import masked_positions, static_mlm_loss

    torch.manual_seed(0)
    model = BertForMaskedLM(BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                       intermediate_size=32, max_position_embeddings=16)).double().eval()
    ids = torch.randint(5, 50, (3, 12))
    labels = torch.full_like(ids, -100)
    for row, cols in enumerate(([1, 4, 7], [2], [0, 3, 5, 9, 11])):  # 3, 1 and 5 masked tokens
        labels[row, cols] = ids[row, cols]
    index = masked_positions(labels, 5)
    assert index.tolist()[0][:3] == [1, 4, 7] and index.tolist()[1][0] == 2 and sorted(index.tolist()[2]) == [0, 3, 5, 9, 11]
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids),
             "labels": labels}
    got = static_mlm_loss(model.bert, model.cls.predictions, batch, {"token_type_ids"}, count=5)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits.double()
    terms = [torch.logsumexp(logits[r, c], 0) - logits[r, c, labels[r, c]] for r, c in (labels != -100).nonzero().tolist()]
    reference = sum(terms) / len(terms)
    assert len(terms) == 9 and abs(got.item() - reference.item()) <= 1e-6 * abs(reference.item())


@pytest.mark.parametrize("what", ["the objective's step (encoders, heads and losses)",
                                  "4 encoder layer(s), each on its own, and predict"])
def test_gpu_throughput_reads_back_what_the_trainer_compiled(what):
    """Each GPU point records what `train.compile` compiled (under auto, the mode it took), from the trainer's log."""
    from pretrain.engine.setup import compiled_in_log, compiled_note

    log = f"2026-11-29 20:00:00 ZeRO stage 0\n2026-11-29 20:00:00 {compiled_note(what)}\n2026-11-29 20:00:01 step 5/30\n"
    assert compiled_in_log(log) == what
    assert compiled_in_log(log.replace(compiled_note(what), "optimizer torch's fused AdamW")) == ""
