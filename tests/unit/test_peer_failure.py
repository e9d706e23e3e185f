"""Which errors mean another rank died or hung (the survivor exits 76 and the job is requeued) and which are this
rank's own (a bug keeps its traceback). The texts are the ones gloo and torch's NCCL watchdog write."""
import pytest
import torch

from core import distributed
from core.distributed import is_peer_failure

NCCL_TIMEOUT = ("[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=12, OpType=ALLREDUCE, NumelIn=1, "
                "NumelOut=1, Timeout(ms)=120000) ran for 120004 milliseconds before timing out.")
NCCL_ABORTED = "NCCL communicator was aborted on rank 1.  Original reason for failure was: " + NCCL_TIMEOUT
GLOO_CLOSED = "[gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.1.0.7]:14052"
GLOO_TIMEOUT = "[gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 10000ms for recv operation to complete"


def _raised_inside(outer: Exception, inner: Exception) -> Exception:
    """`outer` raised while handling `inner` (as DeepSpeed and the loader re-raise), caught."""
    try:
        try:
            raise inner
        except Exception:
            raise outer
    except Exception as exc:
        return exc


def _ranks(monkeypatch, n: int) -> None:
    """A launch of `n` ranks (another test of this process may have started a one-rank group, which would win)."""
    monkeypatch.setattr(distributed, "launched_world_size", lambda: n)


@pytest.mark.parametrize("text", [NCCL_TIMEOUT, NCCL_ABORTED, GLOO_CLOSED, GLOO_TIMEOUT])
def test_a_peer_that_died_or_hung_is_recognised_directly_wrapped_or_as_a_backend_error(text, monkeypatch):
    _ranks(monkeypatch, 2)
    assert is_peer_failure(RuntimeError(text))
    assert is_peer_failure(_raised_inside(ValueError("the step failed"), RuntimeError(text)))
    assert is_peer_failure(torch.distributed.DistBackendError(text))


def test_this_ranks_own_errors_and_a_single_rank_are_not_peer_failures(monkeypatch):
    _ranks(monkeypatch, 2)
    assert not is_peer_failure(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert not is_peer_failure(ValueError(GLOO_CLOSED))  # the texts count in the runtime errors collectives raise
    assert not is_peer_failure(_raised_inside(RuntimeError("shape mismatch"), KeyError("x")))
    looped = RuntimeError("a")
    looped.__context__ = RuntimeError("b")
    looped.__context__.__context__ = looped  # a cycle of causes ends the walk
    assert not is_peer_failure(looped)
    _ranks(monkeypatch, 1)  # alone, nothing is a peer's fault
    assert not is_peer_failure(RuntimeError(NCCL_ABORTED))
    assert not is_peer_failure(torch.distributed.DistBackendError(NCCL_TIMEOUT))
