"""Each fine-tuning recipe reaches the optimizer it names: its lr, betas, eps and weight decay (on matrices only) and
its warmup, checked against AdamW written out in float64 from its formula (Loshchilov & Hutter's decoupled decay)."""
import math
from dataclasses import replace

import pytest
import torch
from transformers import BertConfig, BertForSequenceClassification

from evaluation.finetune import _optimizer, recipe, recipe_names

TOTAL = 32  # optimizer steps of the run the schedule is built for


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    config = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
                        max_position_embeddings=32, num_labels=3)
    return BertForSequenceClassification(config)


def _lr_factor(step: int, warmup: int) -> float:
    """Linear warmup over `warmup` steps, then linear decay to 0 at TOTAL. The first update already at 1/warmup of the
    lr, as fairseq's polynomial-decay schedule (COCO-LM's code) starts; transformers' linear schedule starts at 0."""
    if step < warmup:
        return (step + 1) / warmup
    return (TOTAL - step) / (TOTAL - warmup)


@pytest.mark.parametrize("name", recipe_names())
def test_the_recipe_is_the_schedule_it_names(name):
    hp = recipe(name, 16)
    optimizer, schedule = _optimizer(_model(), hp, TOTAL)
    warmup = int(TOTAL * hp.warmup_ratio)
    for step in range(TOTAL):
        for group in optimizer.param_groups:
            assert math.isclose(group["lr"], hp.lr * _lr_factor(step, warmup), rel_tol=1e-12), (name, step)
        optimizer.step()
        schedule.step()


@pytest.mark.parametrize("name", recipe_names())
def test_the_recipe_is_the_optimizer_it_names(name):
    """Four updates against the float64 formula. The lr is raised so that a float32 parameter near 1 shows the decay
    (lr x weight decay a step); the gradients are as small as eps, so that a wrong eps shows too."""
    hp = replace(recipe(name, 16), lr=1e-2)
    model = _model()
    optimizer, schedule = _optimizer(model, hp, TOTAL)
    decayed = {n for n, p in model.named_parameters() if p.ndim == 2 and "LayerNorm" not in n}
    assert "bert.embeddings.word_embeddings.weight" in decayed and "classifier.weight" in decayed
    assert not any(n.endswith("bias") or "LayerNorm" in n for n in decayed)

    names = {id(p): n for n, p in model.named_parameters()}
    start = {n: p.detach().double().clone() for n, p in model.named_parameters()}
    state = {n: (torch.zeros_like(x), torch.zeros_like(x)) for n, x in start.items()}
    reference = dict(start)
    generator = torch.Generator().manual_seed(1)
    warmup = int(TOTAL * hp.warmup_ratio)
    b1, b2 = hp.betas
    for step in range(4):
        lr = hp.lr * _lr_factor(step, warmup)
        for p in model.parameters():
            p.grad = torch.randn(p.shape, generator=generator) * 1e-6
        grads = {names[id(p)]: p.grad.double() for p in model.parameters()}
        optimizer.step()
        schedule.step()
        for n, x in reference.items():
            m, v = state[n]
            m, v = b1 * m + (1 - b1) * grads[n], b2 * v + (1 - b2) * grads[n] ** 2
            state[n] = (m, v)
            x = x * (1 - lr * hp.weight_decay) if n in decayed else x
            m_hat, v_hat = m / (1 - b1 ** (step + 1)), v / (1 - b2 ** (step + 1))
            reference[n] = x - lr * m_hat / (v_hat.sqrt() + hp.eps)
    for n, p in model.named_parameters():
        # Within a few float32 roundings of the parameter and of its updates (1e-8 here): a wrong decay, beta or eps
        # moves a parameter by 2e-5 or more.
        moved, expected = p.detach().double() - start[n], reference[n] - start[n]
        off = (moved - expected).abs() - (1e-4 * expected.abs() + 4 * 2**-23 * start[n].abs() + 1e-8)
        assert off.max() <= 0, (name, n, off.max())


def test_the_recipes_differ_where_their_papers_do():
    """The values the test above runs: without them every recipe could be AdamW's defaults and still pass."""
    coco, hf, squad = recipe("coco_lm", 16), recipe("hf", 768), recipe("tacl_squad", 768)
    assert (coco.betas, coco.eps, coco.weight_decay, coco.warmup_ratio, coco.lr) == ((0.9, 0.98), 1e-6, 0.01, 0.0625, 5e-5)
    assert (hf.betas, hf.eps, hf.weight_decay, hf.warmup_ratio, hf.batch_size) == ((0.9, 0.999), 1e-8, 0.0, 0.0, 8)
    assert (squad.max_length, squad.epochs, squad.batch_size) == (384, 2, 12)


def test_each_command_s_help_says_what_its_flags_do_there(capsys):
    """finetune's --lr/--batch-size/--max-length override a recipe; the evaluations have none to override."""
    import re

    from pretrain.cli import main

    def helps(*command: str) -> dict[str, str]:
        with pytest.raises(SystemExit):
            main([*command, "--help"])
        text = re.sub(r"\s+", " ", capsys.readouterr().out.split("options:", 1)[1])
        return {flag: re.search(rf"--{flag} [A-Z_]+(?: \[[A-Z_]+ \.\.\.\])? (.*?)(?= --|$)", text).group(1)
                for flag in ("model", "batch-size", "max-length")}

    finetune = helps("finetune")
    assert finetune["batch-size"] == finetune["max-length"] == "override the recipe"
    assert "LABEL=PATH" not in finetune["model"]
    for command in (("evaluate", "self-similarity"), ("evaluate", "linear-probe"), ("evaluate", "sentence-embeddings")):
        said = helps(*command)
        assert "recipe" not in said["batch-size"] + said["max-length"], (command, said)
        assert ("LABEL=PATH" in said["model"]) == (command[1] == "self-similarity"), (command, said)
