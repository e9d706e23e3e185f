"""`python tests/helpers/file_size_limit.py BYTES MODULE ARGS...`: `python -m MODULE ARGS` where no file may grow
past BYTES (RLIMIT_FSIZE, as a quota or a full file system refuses a write): a write beyond it fails with EFBIG
instead of the SIGXFSZ that would kill the process. Needs no privilege, unlike mounting a small file system."""
import os
import resource
import runpy
import signal
import sys

limit, module = int(sys.argv[1]), sys.argv[2]
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
sys.path[0] = os.getcwd()  # as `python -m` from the repository root
sys.argv = [module, *sys.argv[3:]]
runpy.run_module(module, run_name="__main__", alter_sys=True)
