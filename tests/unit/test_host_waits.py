"""benchmarks/host_waits.py on an excerpt of a real H200 trace: the trainer's one stream sync a step, found before
c94c865 took it out (the metric window indexing its device vector by a Python list)."""
from pathlib import Path

from benchmarks.host_waits import main, read_events, summary, waits

EXCERPT = Path(__file__).parent / "data" / "h200_metric_sync_trace.json"
COPY = ["aten::to", "aten::_to_copy", "aten::copy_"]


def test_the_stream_sync_inside_a_copy_is_found_with_the_ops_before_it():
    found = waits(read_events(EXCERPT), context=6)
    assert [(w["call"], w["in"]) for w in found] == [("cudaStreamSynchronize", COPY),
                                                     ("cudaDeviceSynchronize", []), ("cudaDeviceSynchronize", [])]
    assert abs(found[0]["ms"] - 9.597681) < 1e-9
    # The metric window's stack of the step's values, their cast to float64, then torch.tensor's host tensor copied in.
    assert found[0]["before"] == ["aten::detach", "aten::reshape", "aten::stack", "aten::to", "aten::detach", "aten::empty"]


def test_the_summary_counts_only_the_waits_an_op_made():
    waited = summary(read_events(EXCERPT), steps=2)
    assert waited == {"per_step": 0.5, "ms_per_step": 9.597681 / 2, "pageable_copies_per_step": 0.5,
                      "in": [{"ops": " > ".join(COPY), "count": 1}]}


def test_the_command_prints_each_wait(capsys):
    assert main([str(EXCERPT), "--context", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[:3] == ["cudaStreamSynchronize 9.60 ms in aten::to > aten::_to_copy > aten::copy_",
                       "    after aten::detach", "    after aten::empty"]
    assert out[-1] == "3 wait(s), 1 made inside an op; 1 copies from or to pageable memory"
