"""`python tests/helpers/shadowed.py FOLDER MODULE ARGS...`: `python -m MODULE ARGS` with FOLDER first on sys.path, so
a package there shadows an installed one (as PYTHONPATH would, which would cost the tests a fresh interpreter)."""
import runpy
import sys

folder, module = sys.argv[1], sys.argv[2]
sys.path.insert(0, folder)
sys.argv = [module, *sys.argv[3:]]
runpy.run_module(module, run_name="__main__", alter_sys=True)
