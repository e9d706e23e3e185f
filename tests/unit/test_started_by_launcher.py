"""A rank ends with its launcher only where torchrun or deepspeed's launch.py started it, not where a stray LOCAL_RANK
(a shell profile, an image) would end a plain run whose shell exits."""
from core.process_life import started_by_launcher


def test_what_the_launchers_set_and_what_they_do_not():
    assert started_by_launcher({"TORCHELASTIC_RUN_ID": "none", "LOCAL_RANK": "0"})  # torchrun
    assert started_by_launcher({"CROSS_RANK": "0", "CROSS_SIZE": "1", "LOCAL_SIZE": "2", "LOCAL_RANK": "1"})  # deepspeed
    assert not started_by_launcher({"LOCAL_RANK": "0"})
    assert not started_by_launcher({"SLURM_PROCID": "0", "SLURM_LOCALID": "0"})  # srun: slurmstepd ends the step
    assert not started_by_launcher({})
