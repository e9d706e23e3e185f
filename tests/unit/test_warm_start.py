"""Any HF BERT folder starts a run: the real MiniLM-L6 (a BertModel with no MLM head) warm-starts every objective."""
import pytest
import torch
from test_tokenizer import minilm_dir

# Where each objective keeps the encoder that the BERT folder initialises.
ENCODER = {"mlm": lambda o: o.model.bert, "taco": lambda o: o.model.bert, "coco_lm": lambda o: o.main,
           "electra": lambda o: o.discriminator.electra, "tacl": lambda o: o.student.bert}


@pytest.mark.parametrize("name", sorted(ENCODER))
def test_minilm_warm_starts_the_encoder(name):
    from safetensors.torch import load_file
    from transformers import BertConfig

    from model.objectives import ObjectiveConfig, build_objective

    config = BertConfig.from_pretrained(minilm_dir())
    objective = build_objective(ObjectiveConfig(name=name), config, str(minilm_dir()))
    start = load_file(str(minilm_dir() / "model.safetensors"))
    encoder = ENCODER[name](objective).state_dict()
    keys = [k for k in start if not k.startswith("pooler.") and not k.endswith("position_ids")]
    assert len(keys) > 90
    for key in keys:
        assert torch.equal(encoder[key], start[key]), key
    if name in ("mlm", "taco", "tacl"):  # the absent MLM head is created, its decoder tied to the embeddings
        model = objective.student if name == "tacl" else objective.model
        assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight
    if name == "electra":  # the generator shares the loaded embeddings
        assert objective.generator.electra.embeddings is objective.discriminator.electra.embeddings
