"""`python tests/helpers/shadowed.py FOLDER MODULE ARGS...`: `python -m MODULE ARGS` with FOLDER first on sys.path, so
a package there shadows an installed one (as PYTHONPATH would, which would cost the tests a fresh interpreter)."""
import os
import runpy
import sys

folder, module = sys.argv[1], sys.argv[2]
sys.path[0] = os.getcwd()  # as `python -m` from the repository root (a script would have its own folder there)
sys.path.insert(0, folder)
sys.argv = [module, *sys.argv[3:]]
runpy.run_module(module, run_name="__main__", alter_sys=True)
