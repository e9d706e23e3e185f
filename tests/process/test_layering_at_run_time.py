"""The layering at run time: every module of core and evaluation, imported in a fresh process, loads none of the
packages above it."""
import subprocess
import sys

import pytest
from conftest import REPO
from test_layering import FORBIDDEN


@pytest.mark.parametrize("package", ["core", "evaluation"])
def test_every_module_imports_without_the_packages_above_it(package):
    """Every module of core (and of evaluation) imported in a fresh process loads none of the packages it must not
    import: what the layering promises at run time, lazy imports at module level included."""
    modules = sorted(f"{package}.{p.stem}" if p.stem != "__init__" else package
                     for p in (REPO / package).glob("*.py"))
    assert len(modules) >= 8, modules
    code = (f"import importlib, sys\nfor name in {modules!r}:\n    importlib.import_module(name)\n"
            f"bad = sorted(m for m in sys.modules if m.split('.')[0] in {sorted(FORBIDDEN[package])!r})\n"
            "assert not bad, bad\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
