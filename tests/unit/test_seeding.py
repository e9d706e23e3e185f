"""The run's one seed formula, by value: a change to it changes every run's dropout and initial weights."""
import ast

import numpy as np
import torch
from conftest import REPO

from core.seeding import seed_all, seed_for


def test_the_formula_by_value():
    assert seed_for(42) == 42  # initial weights: every rank alike
    assert [seed_for(42, rank) for rank in range(3)] == [42000, 42001, 42002]  # dropout: one stream per rank
    assert seed_for(42, 3, step=10) == 121193  # 42003 + 7919 * 10: a resume on another world size moves on


def test_seed_all_seeds_torch_and_numpy():
    seed_all(7)
    a = (torch.rand(3), np.random.rand(3))
    seed_all(7)
    b = (torch.rand(3), np.random.rand(3))
    assert torch.equal(a[0], b[0]) and np.array_equal(a[1], b[1])


def test_the_training_library_seeds_through_it_only():
    """No other module of pretrain/ seeds a global generator: a second formula would drift from this one."""
    offenders = []
    for path in sorted((REPO / "pretrain").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("manual_seed", "seed"):
                target = ast.unparse(node.func.value)
                if target in ("torch", "np.random", "numpy.random", "random"):
                    offenders.append(f"{path.relative_to(REPO)}:{node.lineno} {ast.unparse(node)}")
    assert not offenders, offenders


def test_run_rng_restores_its_rank_streams_or_reseeds_on_another_world_size():
    """A checkpoint keeps each rank's streams: the same world size continues them; another one starts rank 1 at
    seed_for(42, 1, step 5) = 42 * 1000 + 1 + 7919 * 5 = 81596."""
    import torch

    from core.seeding import RunRng

    rng = RunRng(42, rank=1, world=2)
    torch.manual_seed(123)
    saved = [RunRng(42, 0, 2).state_dict(), rng.state_dict()]  # rank 1's is this process's now
    expected = torch.rand(3)
    torch.manual_seed(999)
    rng.load_state_dict(saved, step=5)
    assert torch.equal(torch.rand(3), expected)
    rng.load_state_dict(saved[:1], step=5)  # saved on one rank: resumed on two
    assert torch.equal(torch.rand(3), torch.rand(3, generator=torch.Generator().manual_seed(81596)))
