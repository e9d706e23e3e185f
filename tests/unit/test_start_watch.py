"""The loader's StartWatch (data_pipeline/loader_worker.py) reads its pipe wherever the descriptor lands, and gives the
pipe back once no wait needs it."""
import os
import resource
import struct
import time

import pytest

from data_pipeline.loader_worker import StartWatch

NO_SUCH_PID = 2**30  # above any kernel's pid_max: a kill of it finds no process, whatever the test does wrong


def _closed(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return True
    return False


def test_a_watch_whose_pipe_lies_above_descriptor_1024_still_reads_it():
    """select() refuses descriptors from 1024 (FD_SETSIZE) on: a rank with many files open (shards, sockets, a GPU's
    handles) gets its pipe up there, and the watch's thread died of ValueError instead of watching."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1100:
        pytest.skip(f"this machine allows no process a descriptor above 1024 (RLIMIT_NOFILE hard limit {hard})")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200) if soft != resource.RLIM_INFINITY else soft, hard))
    filler = []
    try:
        while (fd := os.open(os.devnull, os.O_RDONLY)) < 1030:
            filler.append(fd)
        os.close(fd)
        watch = StartWatch(timeout_s=5)
        assert watch.read_fd > 1024
        os.write(watch.started_fd, struct.pack("<i", NO_SUCH_PID))  # what the worker writes once it runs
        t0 = time.monotonic()
        watch._wait({NO_SUCH_PID: None})  # the watch's thread body, here in the test's own thread
        assert time.monotonic() - t0 < 2  # read at once: it reported, nothing waited for the timeout
        watch.close()
    finally:
        for fd in filler:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_the_pipe_is_given_back_once_the_last_wait_on_it_ends():
    idle = StartWatch(timeout_s=5)
    idle.close()
    assert _closed(idle.read_fd) and _closed(idle.started_fd)
    busy = StartWatch(timeout_s=0.5)
    busy.watch([NO_SUCH_PID])  # never reports: its thread waits out the timeout on the pipe
    busy.close()  # the loader is gone meanwhile
    assert not _closed(busy.read_fd)  # still being waited on
    deadline = time.monotonic() + 10
    while not _closed(busy.read_fd) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _closed(busy.read_fd) and _closed(busy.started_fd)
