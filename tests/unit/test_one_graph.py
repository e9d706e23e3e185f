"""train.compile traces each objective's step as one graph: every objective on every backbone it runs on, with the
batch the loader's collate builds (a fixed count of predicted positions per batch), breaks nothing and reads nothing
back, in training and (on the first backbone each objective runs on) in evaluation. A break would split the step and
leave its pieces to the eager dispatcher."""
import pytest
import torch
import torch._dynamo as dynamo
from test_backbones import BACKBONES, MATRIX, _batch, _build

from data_pipeline.shards import read_manifest
from model.objectives import objective_class

# Objectives whose first call splits, and why; from the second call on their step is one graph too.
def traced(fn, *args) -> tuple[int, int, list[str]]:
    """Trace `fn(*args)` afresh with dynamo: (graphs, graph breaks, the first line of each break's reason)."""
    dynamo.reset()
    explained = dynamo.explain(fn)(*args)
    reasons = [str(r.reason).splitlines()[0] for r in explained.break_reasons]
    return explained.graph_count, explained.graph_break_count, reasons


FIRST_CALL_SPLITS = {"taco": "output_hidden_states: transformers 5 installs its capturing hooks at a model's first "
                             "call, under a threading lock dynamo cannot enter (a second call recompiles without it)"}


def layers_to_trace(backbone: str) -> int:
    """Encoder layers enough to meet every kind of layer: ModernBERT's first is global, its second local (sliding
    window) attention; every other backbone repeats one kind. Tracing costs seconds a layer on this CPU."""
    return 2 if BACKBONES[backbone]["architecture"] == "modernbert" else 1


# Evaluation runs the same compiled step with the model in eval mode. What differs from training is the objective's own
# code that reads `self.training` (TaCL's validation diagnostic) and dropout (0 here), so each objective's evaluation is
# traced on one backbone; each backbone's layers are traced in every training case. (A trace costs seconds here.)
EVALUATED = {next((b, o) for b, o in MATRIX if o == name) for name in dict.fromkeys(o for _, o in MATRIX)}


@pytest.mark.parametrize("backbone,name", MATRIX, ids=[f"{o}-{b}" for b, o in MATRIX])
def test_the_step_is_one_graph(backbone, name, prepared, tmp_path):
    tok = read_manifest(prepared)["tokenizer"]
    objective = _build(backbone, name, tok, tmp_path, layers_to_trace(backbone))
    batch = _batch(tok, name)
    if name in FIRST_CALL_SPLITS:
        with torch.no_grad():
            objective.eval()(batch)
    for training in (True, False) if (backbone, name) in EVALUATED else (True,):
        objective.train(training)
        graphs, breaks, reasons = traced(objective, batch)
        assert (graphs, breaks) == (1, 0), (training, reasons)


REGIONS = [(b, o) for b, o in MATRIX if objective_class(o).compile_regions]


def test_the_objectives_that_name_regions_include_the_mission_objectives():
    assert {"mlm", "tacl", "coco_lm"} <= {o for _, o in REGIONS}


@pytest.mark.parametrize("backbone,name", REGIONS, ids=[f"{o}-{b}" for b, o in REGIONS])
def test_each_compile_region_runs_in_the_step_and_traces_as_one_graph(backbone, name, prepared, tmp_path):
    """train.compile=layers compiles the regions an objective names (a head and its loss): each must be called by the
    training step, and each must trace as one graph with the arguments the step gives it."""
    tok = read_manifest(prepared)["tokenizer"]
    objective = _build(backbone, name, tok, tmp_path).train()
    calls = {}
    for region in objective.compile_regions:
        def record(*args, _region=region, _method=getattr(objective, region)):
            calls[_region] = args
            return _method(*args)
        setattr(objective, region, record)
    objective(_batch(tok, name))
    assert set(calls) == set(objective.compile_regions)
    for region, args in calls.items():
        delattr(objective, region)  # the class's method again
        graphs, breaks, reasons = traced(getattr(objective, region), *args)
        assert (graphs, breaks) == (1, 0), (region, reasons)
