"""Typed config loading: YAML + overrides, and errors that name the key."""
from pathlib import Path

import pytest
import yaml

from core.config_io import config_changes, load_config
from core.errors import ConfigError
from data_pipeline.config import PrepareConfig
from pretrain.config import RunConfig


def test_yaml_and_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("train:\n  max_steps: 7\noptimizer:\n  lr: 1.0e-3\n")
    cfg = load_config(RunConfig, path, ["train.max_steps=9", "optimizer.betas=[0.8, 0.9]", "masking.mask_prob=0.2"])
    assert cfg.train.max_steps == 9
    assert cfg.optimizer.lr == 1e-3
    assert cfg.optimizer.betas == (0.8, 0.9)
    assert cfg.masking.mask_prob == 0.2
    assert load_config(RunConfig, None, ["optimizer.lr=3e-4"]).optimizer.lr == 3e-4  # YAML 1.1 reads this as a string


def test_unknown_key_is_named(tmp_path):
    with pytest.raises(ConfigError, match="train.max_stepz': did you mean 'train.max_steps'"):
        load_config(RunConfig, None, ["train.max_stepz=3"])
    path = tmp_path / "c.yaml"
    path.write_text("optimiser:\n  lr: 1\n")
    with pytest.raises(ConfigError, match="'optimiser': did you mean 'optimizer'"):
        load_config(RunConfig, path)
    with pytest.raises(ConfigError, match=r"'train.banana' \(valid keys"):  # nothing close: no guess
        load_config(RunConfig, None, ["train.banana=1"])


def test_bad_values_are_named():
    with pytest.raises(ConfigError, match="train.max_steps"):
        load_config(RunConfig, None, ["train.max_steps=many"])
    with pytest.raises(ConfigError, match="train.precision"):
        load_config(RunConfig, None, ["train.precision=fp8"])
    with pytest.raises(ConfigError, match="masking.mask_prob"):
        load_config(RunConfig, None, ["masking.mask_prob=1.5"])
    with pytest.raises(ConfigError, match="model.hidden_size"):
        load_config(RunConfig, None, ["model.hidden_size=30", "model.num_heads=4"])


@pytest.mark.parametrize("override, said", [
    ("optimizer.lr=-1", r"'optimizer.lr' must be >= 0 \(0: off\), got -1"),
    ("optimizer.eps=-1e-8", "'optimizer.eps' must be > 0"),
    ("optimizer.betas=[0.9]", r"'optimizer.betas': expected 2 values, got 1: \[0.9\]"),
    ("optimizer.betas=[2, 3]", r"'optimizer.betas' must be two values in \[0, 1\), got \[2.0, 3.0\]"),
    ("optimizer.weight_decay=-1", r"'optimizer.weight_decay' must be >= 0 \(0: off\)"),
    ("optimizer.grad_clip=-1", r"'optimizer.grad_clip' must be >= 0 \(0: off\)"),
    ("schedule.warmup_steps=-5", "'schedule.warmup_steps' must be >= 0, got -5"),
    ("schedule.min_lr_ratio=2", r"'schedule.min_lr_ratio' must be in \[0, 1\]"),
    ("train.seed=-1", "'train.seed' must be >= 0, got -1"),
    # torch's generators take 64 bits; each rank's stream is derived from train.seed · 1000.
    ("train.seed=18445644562081776", "'train.seed' must be <= 18445644562081775, got 18445644562081776"),
    ("data.shuffle_seed=18446744073709551616", "'data.shuffle_seed' must be >= 0 and <= 18446744073709551615, got 1844"),
    ("train.eval_batches=0", "'train.eval_batches' must be >= 1, got 0"),
    ("train.save_every_minutes=-1", "'train.save_every_minutes' must be >= 0"),
    ("train.max_wall_time=abc", "'train.max_wall_time' must be a duration such as 90m.*got 'abc'"),
    ("train.max_wall_time=-5m", "'train.max_wall_time' must be a duration.*got '-5m'"),
    ("train.output_dir=", "'train.output_dir' is empty"),
    ("model.hidden_size=0", "'model.hidden_size' must be >= 1, got 0"),
    ("model.num_heads=0", "'model.num_heads' must be >= 1, got 0"),
    ("model.num_layers=0", "'model.num_layers' must be >= 1, got 0"),
    ("model.intermediate_size=0", "'model.intermediate_size' must be >= 1, got 0"),
    ("model.dropout=2", r"'model.dropout' must be in \[0, 1\), got 2"),
])
def test_values_torch_or_the_loop_would_refuse_late_are_named_at_load(override, said):
    with pytest.raises(ConfigError, match=said):
        load_config(RunConfig, None, [override])


@pytest.mark.parametrize("overrides, said", [
    # nan passed every range check written as a comparison; inf means nothing for any key
    (["optimizer.lr=nan"], "'optimizer.lr': expected a finite number, got nan"),
    (["masking.mask_token_fraction=.nan"], "'masking.mask_token_fraction': expected a finite number, got nan"),
    (["train.deadline_margin_s=inf"], "'train.deadline_margin_s': expected a finite number, got inf"),
    (["train.max_wall_time=10m", "train.deadline_margin_s=600"],
     r"'train.deadline_margin_s' \(600 s\) must be less than train.max_wall_time \(10m = 600 s\)"),
    (["train.micro_batch_size=4", "train.global_batch_size=30"],
     r"train.global_batch_size=30 is not divisible by train.micro_batch_size \(4\)"),  # was refused after set-up
    (["data.num_canonical_nodes=0"], "'data.num_canonical_nodes' must be >= 1, got 0"),
    (["data.shuffle_seed=-1"], "'data.shuffle_seed' must be >= 0 and <= 18446744073709551615, got -1"),
    (["data.shuffle_algo=bogus"], "'data.shuffle_algo' must be one of streaming's .*py1e.*, got 'bogus'"),
    (["objective.coco_lm.generator_width=0"], r"'objective.coco_lm.generator_width' must be > 0 and <= 1, got 0.0"),
    (["objective.coco_lm.generator_layers=0"], "'objective.coco_lm.generator_layers' must be >= 1, got 0"),
    (["objective.coco_lm.scl_temperature=0"], "'objective.coco_lm.scl_temperature' must be > 0"),
    (["objective.coco_lm.copy_weight=-50"], "'objective.coco_lm.copy_weight' must be >= 0, got -50"),
    (["objective.electra.generator_width=1.5"], "'objective.electra.generator_width' must be > 0 and <= 1, got 1.5"),
    (["objective.electra.generator_depth=0"], "'objective.electra.generator_depth' must be > 0, got 0"),
    (["objective.electra.rtd_weight=-1"], "'objective.electra.rtd_weight' must be >= 0"),
    (["objective.tacl.temperature=-0.01"], "'objective.tacl.temperature' must be > 0, got -0.01"),
    (["objective.tacl.weight=-1"], "'objective.tacl.weight' must be >= 0"),
    (["objective.taco.negatives=0"], "'objective.taco.negatives' must be >= 1, got 0"),
    (["objective.taco.temperature=0"], "'objective.taco.temperature' must be > 0"),
    (["objective.spanbert.sbo_weight=-1"], "'objective.spanbert.sbo_weight' must be >= 0"),
    (["objective.declutr.mlm_weight=-1"], "'objective.declutr.mlm_weight' must be >= 0"),
    (["objective.declutr.temperature=0"], "'objective.declutr.temperature' must be > 0, got 0.0"),
])
def test_values_that_trained_something_else_or_failed_late_are_named_at_load(overrides, said):
    """Found by an audit: each of these loaded, then trained another objective than asked (a maximised loss, a
    generator clamped to one unit, an order that depends on the cluster), never saved before the deadline, or failed
    with a traceback after the set-up."""
    with pytest.raises(ConfigError, match=said):
        load_config(RunConfig, None, overrides)


def test_checks_against_the_model_and_masking_sections_name_what_to_set():
    """plm masks nothing (XLNet's permutation reads the input whole): MLM on it learned to copy its input. A
    ModernBERT window under 2 tokens leaves each token only itself; ALBERT's 0 groups were read as 1."""
    from model.backbones import backbone_for
    from model.objectives import resolve_objective

    def checked(*overrides: str) -> None:
        cfg = load_config(RunConfig, None, list(overrides))
        resolve_objective(cfg.objective, cfg.model, cfg.masking)
        backbone_for(cfg.model.architecture).check(cfg.model)

    for name, masking in (("mlm", "masking.strategy=bert"), ("spanbert", "masking.strategy=span"),
                          ("coco_lm", "masking.strategy=coco masking.crop_ratio=0.9")):
        with pytest.raises(ConfigError, match=f"masking.strategy=plm is XLNet's \\(objective.name=xlnet\\); "
                                              f"objective.name={name} needs masking that hides tokens \\({masking}\\)"):
            checked(f"objective.name={name}", "masking.strategy=plm")
    checked("objective.name=xlnet", "model.architecture=xlnet", "masking.strategy=plm")
    modern = "model.architecture=modernbert"
    with pytest.raises(ConfigError, match="'model.local_attention' must be >= 2, got 1"):
        checked(modern, "model.local_attention=1")
    with pytest.raises(ConfigError, match="'model.global_attn_every_n_layers' must be >= 1, got 0"):
        checked(modern, "model.global_attn_every_n_layers=0")
    checked(modern, "model.local_attention=2", "model.global_attn_every_n_layers=1")
    with pytest.raises(ConfigError, match=r"'model.num_hidden_groups' \(0\) must divide"):
        checked("model.architecture=albert", "model.num_hidden_groups=0")


def test_prepare_and_evaluation_values_their_libraries_refuse_late_are_named_at_load():
    """sentencepiece's coverage bounds (checked after the corpus is read and sampled), seeds numpy and xxhash take no
    sign of, a held-out share that leaves nothing, a warmup past the run or a negative decay in fine-tuning."""
    from evaluation.config import FinetuneConfig, LinearProbeConfig, SentenceEmbeddingConfig

    source = ["sources=[{kind: text, path: corpus.txt}]", "output_dir=out"]
    for override, said in (("tokenizer.character_coverage=0.9", "'tokenizer.character_coverage' must be >= 0.98 and "
                                                                "<= 1, got 0.9"),
                           ("seed=-1", "'seed' must be >= 0, got -1")):
        with pytest.raises(ConfigError, match=said):
            load_config(PrepareConfig, None, [*source, override])
    load_config(PrepareConfig, None, [*source, "tokenizer.character_coverage=0.98"])
    task = ["model=m", "task=csv:t.csv"]
    for override, said in (("warmup_ratio=1.5", "'warmup_ratio' must be >= 0 and <= 1, got 1.5"),
                           ("weight_decay=-0.01", "'weight_decay' must be >= 0"),
                           ("tacl_temperature=0", "'tacl_temperature' must be > 0"),
                           ("seeds=[1, -2]", r"'seeds' must hold seeds >= 0, got \[1, -2\]"),
                           ("data.val_fraction=0", r"'data.val_fraction' must be in \(0, 1\), got 0")):
        with pytest.raises(ConfigError, match=said):
            load_config(FinetuneConfig, None, [*task, override])
    load_config(FinetuneConfig, None, [*task, "data.val_fraction=0", "data.validation_file=dev.csv"])  # not read
    for cls in (LinearProbeConfig, SentenceEmbeddingConfig):
        with pytest.raises(ConfigError, match="'seed' must be >= 0, got -3"):
            load_config(cls, None, ["model=[m]", "task=csv:t.csv", "seed=-3"] if cls is LinearProbeConfig
                        else ["model=[m]", "seed=-3"])


def test_a_config_file_that_is_not_yaml_or_not_utf8_is_named_in_one_line(tmp_path):
    from core.errors import one_line

    path = tmp_path / "run.yaml"
    path.write_text("train:\n  max_steps: [1, 2\n")
    with pytest.raises(ConfigError) as caught:
        load_config(RunConfig, path)
    assert one_line(caught.value) == (f"config file {path} is not valid YAML: while parsing a flow sequence expected "
                                      "',' or ']', but got '<stream end>' at line 3, column 1")
    path.write_bytes(b"train:\n  max_steps: 7 # \xe9t\xe9\n")  # Latin-1
    with pytest.raises(ConfigError, match=r"run.yaml is not UTF-8 text \(byte 24: invalid continuation byte\)"):
        load_config(RunConfig, path)


def test_a_message_over_several_lines_keeps_every_line_and_a_workers_traceback_only_its_last():
    from core.errors import InputDataError, one_line

    quoted = InputDataError("tokenizer folder /data/tok cannot be read:\nYou need to have sentencepiece installed\n")
    assert one_line(quoted) == "tokenizer folder /data/tok cannot be read: You need to have sentencepiece installed"
    worker = InputDataError("Caught InputDataError in DataLoader worker process 0.\nOriginal Traceback (most recent "
                            "call last):\n  File \"x.py\", line 1, in f\ncore.errors.InputDataError: shard 3 is damaged")
    assert one_line(worker) == "shard 3 is damaged"


def test_list_of_sections():
    cfg = load_config(PrepareConfig, None, ["sources=[{kind: json, path: a.jsonl, text_column: body}]"])
    assert cfg.sources[0].kind == "json" and cfg.sources[0].text_column == "body"
    with pytest.raises(ConfigError, match=r"sources\[0\].colour"):
        load_config(PrepareConfig, None, ["sources=[{path: a.txt, colour: red}]"])


def test_missing_config_file():
    with pytest.raises(ConfigError, match="not found"):
        load_config(RunConfig, "/nonexistent/run.yaml")


def test_global_batch_must_divide():
    from pretrain.engine.ds_config import gradient_accumulation

    assert gradient_accumulation(32, 4, 2) == 4
    with pytest.raises(ConfigError, match="global_batch_size=30"):
        gradient_accumulation(30, 4, 2)


def test_every_example_config_loads_and_passes_its_objective_checks():
    """The shipped run configs are valid: typed keys, and each objective's own checks against model and masking."""
    from pathlib import Path

    from model.objectives import resolve_objective

    configs = sorted((Path(__file__).resolve().parents[2] / "pretrain" / "configs").glob("*.yaml"))
    assert len(configs) >= 7
    for path in configs:
        overrides = ["model.init_from=."] if "tacl" in path.name else []  # TaCL's teacher folder is the user's
        cfg = load_config(RunConfig, path, overrides)
        if "tacl" not in path.name:
            resolve_objective(cfg.objective, cfg.model, cfg.masking)


def test_the_base_model_groups_are_the_published_shapes_and_the_gpu_group_divides():
    """model=bert_base and model=modernbert_base build the papers' encoders (their published parameter counts with
    their vocabularies), and train=gpu_base's global batch divides over 1, 2, 4 and 8 GPUs."""
    import torch
    from transformers import AutoModel, BertConfig, ModernBertConfig

    from model.encoder import model_config
    from pretrain.engine.ds_config import gradient_accumulation

    repo_configs = Path(__file__).resolve().parents[2] / "pretrain" / "configs"
    # The encoders' (AutoModel's) published counts with their vocabularies; transformers' default configs of both
    # classes are these base models, so every other field is checked against them.
    published = {"bert_base": (30522, 109_482_240, BertConfig()), "modernbert_base": (50368, 149_014_272, ModernBertConfig())}
    for group, (vocab, params, reference) in published.items():
        cfg = load_config(RunConfig, repo_configs / "mlm_bert_base.yaml", [f"model={group}"])
        tokenizer = {"vocab_size": vocab, "pad_id": 0, "cls_id": 1, "sep_id": 2, "mask_id": 3}
        config = model_config(cfg.model, tokenizer, 512)
        with torch.device("meta"):  # the shapes, without allocating the weights
            encoder = AutoModel.from_config(config)
        assert sum(p.numel() for p in encoder.parameters()) == params, group
        fields = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "max_position_embeddings",
                  "position_embedding_type", "hidden_dropout_prob", "attention_probs_dropout_prob", "local_attention",
                  "global_attn_every_n_layers", "embedding_dropout", "mlp_dropout", "attention_dropout")
        for field in (f for f in fields if hasattr(reference, f)):
            assert getattr(config, field) == getattr(reference, field), (group, field)
    train = load_config(RunConfig, repo_configs / "mlm_bert_base.yaml").train
    assert [gradient_accumulation(train.global_batch_size, train.micro_batch_size, gpus) for gpus in (1, 2, 4, 8)] == [8, 4, 2, 1]


def test_config_groups_compose_in_order_and_can_be_swapped(tmp_path):
    """A run YAML's `defaults:` merge group files in order, its own keys on top, then overrides; group=option swaps one."""
    repo_configs = Path(__file__).resolve().parents[2] / "pretrain" / "configs"
    cfg = load_config(RunConfig, repo_configs / "electra.yaml")
    assert (cfg.model.architecture, cfg.model.hidden_size, cfg.objective.name) == ("modernbert", 128, "electra")
    assert cfg.optimizer.betas == (0.9, 0.999) and cfg.optimizer.lr == 1e-3  # the objective's β2, the file's lr
    swapped = load_config(RunConfig, repo_configs / "electra.yaml", ["model=bert_small", "recipe=coco_lm",
                                                                      "model.hidden_size=64"])
    assert (swapped.model.architecture, swapped.model.dropout) == ("bert", 0.0)
    assert swapped.model.hidden_size == 64 and swapped.objective.name == "coco_lm" and swapped.masking.strategy == "coco"
    assert swapped.optimizer.betas == (0.9, 0.98)  # the recipe brings COCO-LM's β2 with its objective
    # objective=NAME picks the objective inside the recipe and keeps the recipe's masking and optimizer.
    only = load_config(RunConfig, repo_configs / "electra.yaml", ["objective=taco"])
    assert only.objective.name == "taco" and only.objective.taco.negatives == 50
    assert only.masking.count == "exact" and only.optimizer.betas == (0.9, 0.999)  # ELECTRA's recipe otherwise
    # The objective group holds objectives only: no masking, no optimizer.
    for path in sorted((repo_configs / "objective").glob("*.yaml")):
        keys = set(yaml.safe_load(path.read_text()))
        assert keys == {"objective"}, (path.name, keys)
    with pytest.raises(ConfigError, match="no config group option 'model/huge'.*modernbert_small"):
        load_config(RunConfig, repo_configs / "electra.yaml", ["model=huge"])
    with pytest.raises(ConfigError, match="no config group 'schedule'"):
        load_config(RunConfig, repo_configs / "electra.yaml", ["schedule=cosine"])

    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "a.yaml").write_text("hidden_size: 48\nnum_layers: 3\n")
    (tmp_path / "model" / "b.yaml").write_text("num_layers: 5\n")
    (tmp_path / "run.yaml").write_text("defaults: [model/a]\nmodel: {num_layers: 4}\n")
    cfg = load_config(RunConfig, tmp_path / "run.yaml")
    assert (cfg.model.hidden_size, cfg.model.num_layers) == (48, 4)  # the file's own key wins over its group
    assert load_config(RunConfig, tmp_path / "run.yaml", ["model.num_layers=6"]).model.num_layers == 6
    cfg = load_config(RunConfig, tmp_path / "run.yaml", ["model=b"])
    assert (cfg.model.hidden_size, cfg.model.num_layers) == (RunConfig().model.hidden_size, 4)
    (tmp_path / "model" / "c.yaml").write_text("hidden_sise: 48\n")
    with pytest.raises(ConfigError, match="model.hidden_sise"):  # a group file's typo is named like any other
        load_config(RunConfig, tmp_path / "run.yaml", ["model=c"])
    (tmp_path / "bad.yaml").write_text("defaults: model/a\n")
    with pytest.raises(ConfigError, match="'defaults' must be a list"):
        load_config(RunConfig, tmp_path / "bad.yaml")


def test_a_toy_objective_is_one_file_and_one_yaml(tmp_path, monkeypatch):
    """The objective's module (options + class) and a group YAML selecting it: its options become the typed
    section objective.<name>, and nothing shared is edited but the one-line registry entry."""
    import dataclasses
    import sys

    import model.objectives as objectives
    from data_pipeline.masking import MaskingConfig

    (tmp_path / "toy_objective.py").write_text(
        "from dataclasses import dataclass\nfrom model.objectives.base import Objective\n\n"
        "@dataclass\nclass ToyOptions:\n    alpha: float = 1.0\n\n"
        "class Toy(Objective):\n    options_class = ToyOptions\n")
    (tmp_path / "objective").mkdir()
    (tmp_path / "objective" / "toy.yaml").write_text(
        "# @package _global_\nobjective: {name: toy, toy: {alpha: 3.0}}\nmasking: {mask_prob: 0.2}\n")
    (tmp_path / "run.yaml").write_text("defaults: [objective/toy]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(objectives.REGISTRY, "toy", "toy_objective:Toy")  # the registry entry (one line in the real file)
    monkeypatch.delitem(sys.modules, "toy_objective", raising=False)
    objective_config = objectives._objective_config_class()
    run_config = dataclasses.make_dataclass("Run", [
        ("objective", objective_config, dataclasses.field(default_factory=objective_config)),
        ("masking", MaskingConfig, dataclasses.field(default_factory=MaskingConfig))])

    cfg = load_config(run_config, tmp_path / "run.yaml")
    assert cfg.objective.name == "toy" and cfg.objective.toy.alpha == 3.0 and cfg.masking.mask_prob == 0.2
    assert cfg.objective.electra.generator_width == 0.25  # the registered objectives keep their sections
    assert load_config(run_config, None, ["objective.name=toy", "objective.toy.alpha=2.5"]).objective.toy.alpha == 2.5
    with pytest.raises(ConfigError, match="objective.toy.beta"):
        load_config(run_config, None, ["objective.toy.beta=1"])
    with pytest.raises(ConfigError, match="objective.toy.alpha"):
        load_config(run_config, None, ["objective.toy.alpha=[1, 2]"])
    # The project's own config, built without the entry, refuses the name.
    with pytest.raises(ConfigError, match="'toy' is not one of"):
        load_config(RunConfig, None, ["objective.name=toy"])


def test_every_evaluation_key_is_a_flag_and_a_flag_is_its_key():
    """The evaluation commands' flags are generated from their config dataclasses (no flag mirrors a key by hand):
    every key has one, nested `data.*` keys included, and a flag sets exactly the key=value it names."""
    import argparse
    import dataclasses

    from core.config_flags import flag_overrides
    from evaluation.cli import add_commands
    from evaluation.config import FinetuneConfig, LinearProbeConfig

    parser = argparse.ArgumentParser()
    add_commands(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["finetune", "--model", "m", "--task", "csv:t.csv", "--lr", "3e-5", "--seeds", "1", "2",
                              "--token-task", "--text-column", "words", "--recipe", "hf", "--max-train-samples", "8"])
    by_flags = load_config(FinetuneConfig, None, flag_overrides(args, FinetuneConfig))
    by_keys = load_config(FinetuneConfig, None, ["model=m", "task=csv:t.csv", "lr=3e-5", "seeds=[1, 2]", "data.token_task=true",
                                                 "data.text_column=words", "recipe=hf", "max_train_samples=8"])
    assert by_flags == by_keys and by_flags.data.token_task and by_flags.lr == 3e-5
    probe = parser.parse_args(["evaluate", "linear-probe", "--c-grid", "0.5", "2", "--folds", "3"])
    assert flag_overrides(probe, LinearProbeConfig) == ["c_grid=[0.5, 2.0]", "folds=3"]
    # A list flag takes every word up to the next flag: a key=value among them is the override it reads as (a model
    # 'layer=0' was refused as no model folder); a word whose left side is no key stays in the list (a model's label).
    swallowed = parser.parse_args(["evaluate", "linear-probe", "--model", "run-a/", "layer=0", "a=run-b/",
                                   "data.text_column=words", "--task", "csv:t.csv"])
    assert flag_overrides(swallowed, LinearProbeConfig) == ["layer=0", "data.text_column=words",
                                                           'model=["run-a/", "a=run-b/"]', 'task="csv:t.csv"']
    probe_cfg = load_config(LinearProbeConfig, None, flag_overrides(swallowed, LinearProbeConfig))
    assert probe_cfg.model == ["run-a/", "a=run-b/"] and probe_cfg.layer == 0 and probe_cfg.data.text_column == "words"
    flags = {a.dest for a in parser._subparsers._group_actions[0].choices["finetune"]._actions}
    keys = {f.name for f in dataclasses.fields(FinetuneConfig) if f.name != "data"}
    assert keys | {f"data.{f.name}" for f in dataclasses.fields(FinetuneConfig().data)} <= flags
    with pytest.raises(SystemExit):  # a Literal's choices are the flag's
        parser.parse_args(["finetune", "--loss", "nope"])


@pytest.mark.parametrize("command", ["pretrain", "data_pipeline"])
def test_key_value_overrides_count_wherever_they_stand_among_the_flags(command, capsys):
    """`--config c a=1 --flag b=2`: argparse alone leaves `b=2` unrecognized; every command line takes it as the next
    override, in order, and still refuses a misspelt flag or a word that is no override."""
    from core.config_flags import parse_with_overrides

    if command == "pretrain":
        from pretrain.cli import build_parser

        line = ["finetune", "--model", "m", "lr=1e-4", "--task", "sst2", "seeds=[1]", "--overwrite", "epochs=2"]
        words = ["lr=1e-4", "seeds=[1]", "epochs=2"]
        train = parse_with_overrides(build_parser(), ["train", "a=1", "--config", "c.yaml", "b=2", "a=3"])
        assert (train.config, train.overrides) == ("c.yaml", ["a=1", "b=2", "a=3"])
    else:
        from data_pipeline.cli import build_parser

        line = ["prepare", "--config", "d.yaml", "seq_len=64", "--overwrite", "output_dir=out", "seq_len=128"]
        words = ["seq_len=64", "output_dir=out", "seq_len=128"]
    args = parse_with_overrides(build_parser(), line)
    assert args.overrides == words and args.overwrite
    for stray in (["--overwritten"], ["stray"]):
        with pytest.raises(SystemExit) as exit_:
            parse_with_overrides(build_parser(), line + stray)
        err = capsys.readouterr().err  # one line, as a bad key=value's: not argparse's usage first
        assert exit_.value.code == 2 and f"unrecognized arguments: {stray[0]}" in err and err.count("\n") == 1, err
        assert err.startswith(f"error: python -m {command}: "), err


def test_config_changes_name_each_key_that_differs_with_both_values():
    """What a resume's note lists: nested keys dotted, values as JSON, keys only one side has against null."""
    old = {"model": {"dropout": 0.1, "init_from": None}, "train": {"max_steps": 10, "tags": ["a"]}, "gone": 1}
    new = {"model": {"dropout": 0.0, "init_from": "dir"}, "train": {"max_steps": 10, "tags": ["a", "b"]}, "added": True}
    assert config_changes(old, new) == ['model.dropout 0.1 -> 0.0', 'model.init_from null -> "dir"',
                                        'train.tags ["a"] -> ["a", "b"]', "added null -> true", "gone 1 -> null"]
    assert config_changes(new, new) == []


def test_a_defaults_list_left_empty_is_no_defaults_and_a_non_list_is_refused(tmp_path):
    """`defaults:` with every entry commented out reads as null: no groups (it raised a TypeError); a number is refused
    in one line naming the file."""
    empty = tmp_path / "empty_defaults.yaml"
    empty.write_text("defaults:\n#  - model/bert_small\ntrain:\n  max_steps: 3\n", encoding="utf-8")
    assert load_config(RunConfig, empty, []).train.max_steps == 3
    assert load_config(RunConfig, empty, ["train.max_steps=4"]).train.max_steps == 4
    number = tmp_path / "number_defaults.yaml"
    number.write_text("defaults: 3\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=f"config file {number}: 'defaults' must be a list of group/option names"):
        load_config(RunConfig, number, [])


def test_a_config_path_that_is_a_folder_is_named_as_one(tmp_path):
    """`--config DIR` is a folder, not a missing file."""
    with pytest.raises(ConfigError, match=f"config file {tmp_path} is a folder; give a YAML file in it"):
        load_config(RunConfig, tmp_path, [])
    with pytest.raises(ConfigError, match=f"config file not found: {tmp_path / 'absent.yaml'}"):
        load_config(RunConfig, tmp_path / "absent.yaml", [])


def _resolved(path: Path, *overrides: str):
    from model.objectives import resolve_objective

    cfg = load_config(RunConfig, path, list(overrides))
    return resolve_objective(cfg.objective, cfg.model, cfg.masking)


def _prepared_as(data_group: Path) -> dict:
    """The manifest fields of the dataset a run config's data group names, from the prepare command its comment gives
    (packing=full, demo.yaml's, where it names none)."""
    command = next(line for line in data_group.read_text().splitlines() if "data_pipeline prepare" in line)
    given = dict(word.split("=", 1) for word in command.replace(")", " ").split() if word.count("=") == 1)
    packing = given.get("packing", "full")
    return {"packing": packing, "pair_task": given.get("pair_task", "nsp") if packing == "pairs" else None}


def test_data_packed_for_another_task_than_the_objectives_is_refused_naming_both():
    """A sentence-pair head learns the pair task the data was prepared with (NSP labels under ALBERT's SOP head would
    be next-sentence prediction logged as sop_loss), and DeCLUTR's positives come from the anchor's own document."""
    configs = Path(__file__).resolve().parents[2] / "pretrain" / "configs"
    nsp, sop = {"packing": "pairs", "pair_task": "nsp"}, {"packing": "pairs", "pair_task": "sop"}
    full, document = {"packing": "full", "pair_task": None}, {"packing": "document", "pair_task": None}
    refused = [
        ("albert.yaml", (), nsp, "objective.mlm.pair_head=sop needs data prepared with packing=pairs pair_task=sop "
                                 "(data.path has packing=pairs pair_task=nsp)"),
        ("albert.yaml", (), full, "objective.mlm.pair_head=sop needs data prepared with packing=pairs pair_task=sop "
                                  "(data.path has packing=full)"),
        ("mlm_nsp.yaml", (), sop, "objective.mlm.pair_head=nsp needs data prepared with packing=pairs pair_task=nsp "
                                  "(data.path has packing=pairs pair_task=sop)"),
        ("tacl_minilm.yaml", ("model.init_from=.", "objective.tacl.pair_head=nsp", "model.architecture=bert"), document,
         "objective.tacl.pair_head=nsp needs data prepared with packing=pairs pair_task=nsp (data.path has "
         "packing=document)"),
        ("declutr.yaml", (), full, "objective.name=declutr needs data prepared with packing=document (data.path has "
                                   "packing=full: its rows cross documents"),
        ("declutr.yaml", (), nsp, "objective.name=declutr needs data prepared with packing=document (data.path has "
                                  "packing=pairs"),
    ]
    for name, overrides, manifest, said in refused:
        with pytest.raises(ConfigError) as raised:
            _resolved(configs / name, *overrides).check_data(manifest)
        assert said in str(raised.value), (name, manifest, str(raised.value))
    for name, manifest in [("albert.yaml", sop), ("mlm_nsp.yaml", nsp), ("declutr.yaml", document),
                           ("demo_mlm.yaml", nsp), ("demo_mlm.yaml", document), ("spanbert.yaml", full)]:
        _resolved(configs / name).check_data(manifest)  # no pair head: MLM reads pairs' tokens as any other
    # Each shipped config against the dataset its data group's comment says to prepare: what it says works.
    for path in sorted(configs.glob("*.yaml")):
        if "tacl" in path.name:  # its data is the user's, prepared with the teacher's tokenizer
            continue
        groups = yaml.safe_load(path.read_text())["defaults"]
        _resolved(path).check_data(_prepared_as(next(configs / f"{g}.yaml" for g in groups if g.startswith("data/"))))


def test_leading_zeros_and_dates_are_read_as_written_not_as_yaml_11_octal_or_dates(tmp_path):
    """YAML 1.1 reads 00000750 as octal (488), 0x10 as 16, and 2024-06-01 as a date: a step copied from a tag would
    resume another checkpoint. A text key keeps what was written; a number key reads it in decimal."""
    from core.config_io import load_config, read_config_yaml
    from core.errors import ConfigError
    from pretrain.checkpointing.checkpoint_dir import as_tag
    from pretrain.config import RunConfig

    cfg = load_config(RunConfig, None, ["train.resume_from=00000750", "train.seed=0042", "train.output_dir=2024-06-01",
                                        "train.max_wall_time=0100"])
    assert as_tag(cfg.train.resume_from) == "step_00000750" and cfg.train.seed == 42
    assert cfg.train.output_dir == "2024-06-01" and cfg.train.max_wall_time == "0100"
    config = tmp_path / "run.yaml"
    config.write_text("train:\n  resume_from: 0750\n  seed: 017\n  output_dir: 2024-06-01 10:00:00\n")
    cfg = load_config(RunConfig, config)
    assert (cfg.train.resume_from, cfg.train.seed, cfg.train.output_dir) == ("0750", 17, "2024-06-01 10:00:00")
    with pytest.raises(ConfigError, match="'train.seed': expected a number, got '0x10'"):
        load_config(RunConfig, None, ["train.seed=0x10"])
    # What YAML 1.2 reads as numbers stays numbers.
    assert read_config_yaml("[0, -0, 12, 1_000, 0.5, 007.5, +3]") == [0, 0, 12, 1000, 0.5, 7.5, 3]
