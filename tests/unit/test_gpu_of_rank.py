"""Each rank takes the GPU its LOCAL_RANK numbers (DeepSpeed assumes it too); a task that SLURM gave only its own GPU
(--gpus-per-task=1, --gpu-bind) sees one, numbered 0: one line that says how to launch, not CUDA's traceback."""
import pytest

from core.distributed import gpu_of_rank
from core.errors import SetupError, user_error


def test_a_rank_takes_the_gpu_its_local_rank_numbers():
    assert [gpu_of_rank(rank, 8, {}) for rank in range(8)] == list(range(8))
    assert gpu_of_rank(0, 1, {"CUDA_VISIBLE_DEVICES": "3"}) == 0  # one task per node, bound to one GPU: fine


def test_a_task_that_sees_only_its_own_gpu_is_told_how_to_launch():
    with pytest.raises(SetupError) as refused:
        gpu_of_rank(3, 1, {"CUDA_VISIBLE_DEVICES": "3"})
    said = str(refused.value)
    assert said.startswith("LOCAL_RANK=3, but this process sees 1 GPU(s) (CUDA_VISIBLE_DEVICES=3)")
    assert "--gpus-per-node=N" in said and "--gpus-per-task" in said and "\n" not in said
    assert user_error(refused.value) is refused.value  # a user's error: exit 2, one line, never requeued
    with pytest.raises(SetupError, match=r"^LOCAL_RANK=1, but this process sees 0 GPU\(s\): "):
        gpu_of_rank(1, 0, {})
