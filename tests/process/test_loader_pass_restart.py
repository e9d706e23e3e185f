"""benchmarks/loader_throughput.py's pass-restart probe on a real loader with its worker processes."""


def test_the_pass_restart_probe_times_each_new_pass_of_a_real_loader(prepared):
    """loader_throughput --pass-restarts: one wait per new pass, and as many batches a pass as the split holds."""
    from benchmarks.loader_throughput import pass_restart
    from data_pipeline.shards import read_manifest

    sequences = read_manifest(prepared)["splits"]["train"]["sequences"]
    got = pass_restart(str(prepared), 4, workers=1, passes=2, step_s=0.0)
    assert got["batches_per_pass"] == sequences // 4 and len(got["restart_ms"]) == 2
