"""The bottom package: config loading, atomic files. Imported by all, imports none of the others."""
