"""The DeepSpeed config template (base.json), a package so that an installed wheel carries it."""
