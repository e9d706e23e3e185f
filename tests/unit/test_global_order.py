"""The global sample order on any layout of nodes, ranks and loader workers, as streaming partitions it for the
project's loader settings (LoaderConfig through build_dataset).

The process tests run 1 and 2 ranks on one machine; a multi-node job is a layout no CPU test starts (streaming sees
one node per machine: core/distributed.py counts local ranks per host). streaming builds every rank's share from
one plan of the epoch (`generate_work`, computed by each node's leader from the world it detects), so the plan for
another world is checked here directly: the README's "1, 2 or 4 ranks see the same global batches", on one node or
several, and a resume on another node count.
"""

import numpy as np
import pytest

from data_pipeline.loader import LoaderConfig, build_dataset, release_shared_memory

NUM_SAMPLES, GLOBAL_BATCH = 240, 16


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """240 short sequences in a dozen MDS shards, with a manifest."""
    from conftest import write_token_dataset

    rng = np.random.default_rng(0)
    return write_token_dataset(tmp_path_factory.mktemp("order") / "data",
                               [rng.integers(5, 100, size=rng.integers(8, 24)) for _ in range(NUM_SAMPLES)])


def _global_batches(dataset, nodes: int, ranks_per_node: int, workers: int,
                    resumed: tuple[int, int] | None = None) -> list[list[int]]:
    """Each training step's global batch (sorted sample ids) for this layout; with `resumed` (samples seen, nodes
    then), from the state a run on that many nodes saved after that many samples.

    A rank's DataLoader yields its workers' batches in turn (worker 0's first, worker 1's first, ...), and every rank
    takes its k-th batch at step k."""
    from streaming.base.batching import generate_work
    from streaming.base.world import World

    per_rank = GLOBAL_BATCH // (nodes * ranks_per_node)
    opened = build_dataset(LoaderConfig(path=str(dataset)), "train", batch_size=per_rank)
    try:
        assert opened.shuffle and opened.num_canonical_nodes == LoaderConfig.num_canonical_nodes
        if resumed is not None:
            seen, nodes_then = resumed
            opened.next_epoch = 1  # epoch 0 under way: its iteration counted it
            # What a run on `nodes_then` nodes saves: streaming records its node count as the partition's origin.
            opened.load_state_dict({**opened.state_dict(seen, from_beginning=True), "initial_physical_nodes": nodes_then})
        world = World(num_nodes=nodes, ranks_per_node=ranks_per_node, workers_per_rank=workers, worker=0)
        epoch, start = opened._resume(world, 0)  # as every worker does when its iteration starts
        plan = generate_work(opened.batching_method, opened, world, epoch, start)
    finally:
        release_shared_memory()
    assert plan.shape[:3] == (nodes, ranks_per_node, workers) and plan.shape[4] == per_rank, plan.shape
    streams = [[batch for b in range(plan.shape[3]) for w in range(workers) for batch in [plan[n, r, w, b]]]
               for n in range(nodes) for r in range(ranks_per_node)]
    steps = []
    for k in range(min(len(s) for s in streams)):
        ids = sorted(int(i) for s in streams for i in s[k] if i >= 0)  # -1: padding of a short last batch
        if ids:
            steps.append(ids)
    return steps


def test_every_layout_of_nodes_ranks_and_workers_sees_the_same_global_batches(dataset):
    one = _global_batches(dataset, 1, 1, 1)
    assert len(one) == NUM_SAMPLES // GLOBAL_BATCH and sorted(i for b in one for i in b) == list(range(NUM_SAMPLES))
    assert one[0] != list(range(GLOBAL_BATCH))  # shuffled: equal orders are not two unshuffled ones
    for layout in [(1, 2, 1), (1, 4, 1), (1, 2, 2), (2, 1, 1), (2, 2, 1), (4, 1, 1), (2, 4, 1), (4, 2, 2)]:
        assert _global_batches(dataset, *layout) == one, layout


def test_a_resume_on_another_node_count_goes_on_with_the_same_order(dataset):
    """Saved after 5 steps on 2 nodes of 2 ranks, resumed on 1 node of 4 ranks, or on 4 nodes of 1 rank."""
    one = _global_batches(dataset, 1, 1, 1)
    done = 5 * GLOBAL_BATCH
    for layout in [(1, 4, 1), (4, 1, 1), (1, 1, 2)]:
        assert _global_batches(dataset, *layout, resumed=(done, 2)) == one[5:], layout
