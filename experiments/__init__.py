"""Experiments behind RESULTS.md: what the objectives learn, at small scale, against the papers' claims and
each other (benchmarks/ holds the performance tools)."""
