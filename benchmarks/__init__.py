"""Measurement and reproduction scripts: run each from the repository root as `python -m benchmarks.NAME`.

Figures go to benchmarks/results/ and BENCHMARKS.md / RESULTS.md. The project's packages are imported as
installed (`make` installs them in editable mode); scripts import one another as `benchmarks.NAME`.
"""
