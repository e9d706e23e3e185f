"""data.num_canonical_nodes against the job's nodes, checked before the first batch with streaming's own partition:
a count that does not fit is one line naming the key, not streaming's ValueError from inside a loader worker."""
import pytest

from core.errors import ConfigError
from data_pipeline.loader import check_partition


@pytest.mark.parametrize("canonical, world, per_node", [(1, 6, 2), (2, 4, 2), (4, 4, 2), (6, 6, 2), (1, 1, 1)])
def test_a_count_that_divides_or_is_divided_by_the_nodes_fits(canonical, world, per_node):
    check_partition(canonical, world, per_node, batch_size=4)


def test_a_count_that_neither_divides_nor_is_divided_is_named():
    with pytest.raises(ConfigError) as refused:
        check_partition(2, 6, 2, batch_size=4)  # 3 nodes
    assert str(refused.value).startswith("data.num_canonical_nodes=2 does not fit 3 node(s) of 2 rank(s): Either "
                                         "canonical or physical nodes must be evenly divisible by the other")
    assert str(refused.value).endswith("; give a multiple or a divisor of the node count (1, the default, fits every "
                                       "count)")


def test_a_resume_on_a_node_count_whose_batches_the_first_cannot_split_is_named():
    check_partition(2, 6, 2, batch_size=4, initial_physical_nodes=2)  # 3 nodes x 2 ranks x 4 = 24: 4 devices divide it
    with pytest.raises(ConfigError, match=r"^data.num_canonical_nodes=2 does not fit 3 node\(s\) of 2 rank\(s\) \(the "
                                          r"run started on 2\): A global batch size of 18 is not evenly divisible"):
        check_partition(2, 6, 2, batch_size=3, initial_physical_nodes=2)


def test_the_check_refuses_exactly_what_streamings_partition_refuses():
    """The conditions are checked without building a partition (at 2048 ranks one takes seconds and a GB per rank):
    over a grid of small jobs, the check refuses where streaming's own `relaxed` partition raises, and only there."""
    from streaming.base.partition import get_partitions

    for ncn in range(1, 7):
        for nodes in range(1, 5):
            for per_node in (1, 2):
                for batch in (1, 3):
                    for initial in (None, 1, 2, 3, 4):
                        world = nodes * per_node
                        try:
                            get_partitions("relaxed", 6 * 4 * 2 * 3 * 4, ncn, nodes, per_node, 1, batch, 0, initial)
                            theirs = False
                        except ValueError:
                            theirs = True
                        try:
                            check_partition(ncn, world, per_node, batch, initial)
                            ours = False
                        except ConfigError:
                            ours = True
                        assert ours == theirs, (ncn, nodes, per_node, batch, initial)
