"""train.rotary_tables: ModernBERT's rotary cos/sin come from tables built once, and nothing a user sees changes: the
tables hold what transformers' own module computes (bit for bit), every objective on ModernBERT trains with the same
losses, metrics and gradients, the state dict keeps transformers' keys, and a compiled step loads the tables where
it evaluated cos and sin for every element of Q and K."""
import copy

import pytest
import torch
import torch._dynamo as dynamo
from test_backbones import MATRIX, _batch, _build

from data_pipeline.shards import read_manifest
from model.backbones import backbone_for
from model.rotary_tables import tabulate_rotary
from pretrain.config import TrainConfig

MODERN = [(b, o) for b, o in MATRIX if b == "modernbert"]


def _rotary(max_positions: int = 96):
    """transformers' ModernBERT rotary embedding, untouched (global and sliding kinds, each its own theta)."""
    from transformers import ModernBertConfig, ModernBertModel

    config = ModernBertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                              intermediate_size=64, max_position_embeddings=max_positions, pad_token_id=0,
                              bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2, reference_compile=False)
    return ModernBertModel(config).rotary_emb


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_the_tables_hold_what_transformers_computes(dtype):
    module = _rotary()
    tabled = copy.deepcopy(module)
    assert tabulate_rotary(tabled) == 1
    assert tabulate_rotary(tabled) == 0  # once: a second call finds nothing left to change
    assert set(module.layer_types) == {"full_attention", "sliding_attention"}
    x = torch.zeros(1, dtype=dtype)
    rows = torch.randint(0, 96, (3, 40), generator=torch.Generator().manual_seed(0))
    for positions in (torch.arange(96)[None], rows):
        for kind in module.layer_types:
            want, got = module(x, positions, kind), tabled(x, positions, kind)
            for w, g in zip(want, got):
                assert g.dtype == dtype and g.shape == w.shape
                assert torch.equal(g, w), (kind, positions.shape)
    # The two kinds' frequencies differ (160,000 and 10,000 as theta): a table per kind, not one shared.
    assert not torch.equal(tabled.full_attention_cos_table, tabled.sliding_attention_cos_table)


def test_the_tables_are_built_on_the_device_asked_for():
    # The trainer builds them on its GPU (a GPU's cos and sin may differ in the last bit from a CPU's); "meta" stands
    # in for a device other than the module's on this CPU.
    module = _rotary()
    assert tabulate_rotary(module, torch.device("meta")) == 1
    for kind in module.layer_types:
        assert getattr(module, f"{kind}_cos_table").device.type == "meta"
        assert getattr(module, f"{kind}_inv_freq").device.type == "cpu"
    default = _rotary()
    tabulate_rotary(default)
    assert default.full_attention_sin_table.device.type == "cpu"


def test_a_rotary_type_with_changing_frequencies_is_left_as_it_is():
    module = _rotary()
    module.rope_type["full_attention"] = "dynamic"  # its frequencies follow the input's length
    forward = module.forward
    assert tabulate_rotary(module) == 0 and module.forward == forward


def test_other_backbones_have_nothing_to_tabulate():
    from model.encoder import EncoderConfig, model_config

    tok = {"vocab_size": 60, "pad_id": 0, "cls_id": 2, "sep_id": 3, "mask_id": 4, "special_ids": [0, 1, 2, 3, 4]}
    config = model_config(EncoderConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64,
                                        max_position_embeddings=64), tok, 64)
    assert tabulate_rotary(backbone_for("bert").masked_lm(config)) == 0


def _step(objective, batch: dict) -> tuple[torch.Tensor, dict, dict]:
    """One forward and backward from a fixed seed: loss, metrics and gradients by name."""
    objective.zero_grad(set_to_none=True)
    torch.manual_seed(0)  # the generators' sampling and TACO's negatives draw from it
    loss, metrics = objective(batch)
    loss.backward()
    return loss.detach(), metrics, {n: p.grad.clone() for n, p in objective.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("backbone,name", MODERN, ids=[o for _, o in MODERN])
def test_every_objective_on_modernbert_trains_the_same_with_the_tables(backbone, name, prepared, tmp_path):
    tok = read_manifest(prepared)["tokenizer"]
    plain = _build(backbone, name, tok, tmp_path).train()
    tabled = copy.deepcopy(plain)
    keys = list(plain.state_dict())
    # COCO-LM's generator is narrower than its main model, so it has a rotary embedding of its own.
    assert tabulate_rotary(tabled) == sum(type(m).__name__ == "ModernBertRotaryEmbedding" for m in plain.modules()) >= 1
    assert list(tabled.state_dict()) == keys  # checkpoints and exports keep transformers' keys
    batch = _batch(tok, name)
    want_loss, want_metrics, want_grads = _step(plain, batch)
    got_loss, got_metrics, got_grads = _step(tabled, batch)
    assert torch.equal(got_loss, want_loss)
    assert got_metrics.keys() == want_metrics.keys()
    for key, value in want_metrics.items():
        assert torch.equal(torch.as_tensor(got_metrics[key]), torch.as_tensor(value)), key
    assert got_grads.keys() == want_grads.keys()
    for key, grad in want_grads.items():
        assert torch.equal(got_grads[key], grad), key


def _trig_calls(objective, batch: dict) -> tuple[int, list[str]]:
    """Trace `objective(batch)` with dynamo: how many graphs, and the cos/sin calls in them."""
    graphs = []

    def capture(gm, inputs):
        graphs.append(gm)
        return gm.forward

    dynamo.reset()
    torch.compile(objective, backend=capture, dynamic=False)(batch)
    calls = [str(node.target) for gm in graphs for node in gm.graph.nodes
             if node.op in ("call_function", "call_method") and getattr(node.target, "__name__", str(node.target)) in ("cos", "sin")]
    return len(graphs), calls


@pytest.mark.parametrize("name", [o for _, o in MODERN])
def test_the_compiled_step_reads_tables_instead_of_evaluating_cos_and_sin(name, prepared, tmp_path):
    """Every objective on ModernBERT: `train.compile: auto` compiles its whole step there."""
    tok = read_manifest(prepared)["tokenizer"]
    objective = _build("modernbert", name, tok, tmp_path).train()
    batch = _batch(tok, name)
    objective(batch)  # TACO's first call installs transformers' hidden-state hooks, which break a graph (test_one_graph)
    if name == "mlm":  # the capture sees cos and sin where they are (test_one_graph traces every untabled step whole)
        graphs, calls = _trig_calls(objective, batch)
        assert graphs == 1 and len(calls) >= 4, calls  # transformers' forward: cos and sin per attention kind
    tabulate_rotary(objective)
    graphs, calls = _trig_calls(objective, batch)
    assert graphs == 1 and calls == []


def test_the_setting_is_on_by_default_and_takes_a_bool():
    assert TrainConfig().rotary_tables is True
    from core.config_io import load_config
    from core.errors import ConfigError
    from pretrain.config import RunConfig

    with pytest.raises(ConfigError, match="rotary_tables"):
        load_config(RunConfig, None, ["train.rotary_tables=sometimes"])


@pytest.mark.parametrize("tabulable", [True, False])
def test_compile_auto_compiles_modernbert_whole_only_where_its_tables_went_in(tabulable, prepared, tmp_path, monkeypatch):
    """Where the tables cannot go in (a rope type whose frequencies change, or a transformers without per-kind
    rotary modules), ModernBERT under `train.compile: auto` compiles its layers: the whole step computing cos and
    sin measured slowest. The whole step keeps the mask on unpadded batches (train.unpadded_mask=auto)."""
    from core.config_io import load_config
    from model import rotary_tables
    from pretrain.config import RunConfig
    from pretrain.engine.setup import apply_model_levers

    if not tabulable:
        monkeypatch.setattr(rotary_tables, "_tabulable", lambda module: False)
    objective = _build("modernbert", "mlm", read_manifest(prepared)["tokenizer"], tmp_path)
    cfg = load_config(RunConfig, None, ["train.compile=auto", "model.architecture=modernbert"])
    mode, notes = apply_model_levers(cfg, objective)
    if tabulable:
        assert mode == "step" and not objective.drop_unpadded_mask
        assert notes == ["rotary cos/sin read from tables in 1 ModernBERT encoder(s) (train.rotary_tables)",
                         "train.compile=auto: step (what modernbert measured fastest in on a GPU)",
                         "unpadded batches keep their attention mask (train.unpadded_mask=auto, train.compile=step)"]
    else:
        assert mode == "layers" and objective.drop_unpadded_mask
        assert notes == ["train.compile=auto: layers (what modernbert measured fastest in on a GPU)"]
