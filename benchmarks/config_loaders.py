"""The project's config loader (core/config_io.py) against OmegaConf structured configs, on the project's own schema.

    pip install --target /tmp/omega omegaconf
    PYTHONPATH=/tmp/omega python -m benchmarks.config_loaders

Issue 16 asked to adopt OmegaConf unless a measured reason says otherwise. This measures, for the
training config (RunConfig) and the shipped run YAMLs:
- whether OmegaConf can build the schema at all (Literal fields included: 2.4 can);
- the same YAML and overrides through both: equal values?
- the messages each gives for the config-error table's mistakes (unknown key, wrong type, bad choice);
- the time to import and to load one config.
Writes benchmarks/results/config_loaders.json.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import time
import typing
from pathlib import Path

from benchmarks.arguments import add_shared, results_file

REPO = Path(__file__).resolve().parents[1]

MISTAKES = [("unknown key", ["train.max_stepz=3"]), ("wrong type", ["train.max_steps=lots"]),
            ("not a choice", ["train.precision=fp8"]), ("nested unknown key", ["objective.coco_lm.copy_weigth=1"])]


def literal_fields(cls: type, prefix: str = "") -> list[str]:
    """Every field of the schema typed as a Literal (OmegaConf rejects these)."""
    out = []
    for f in dataclasses.fields(cls):
        tp = typing.get_type_hints(cls)[f.name]
        if dataclasses.is_dataclass(tp):
            out += literal_fields(tp, prefix + f.name + ".")
        elif typing.get_origin(tp) is typing.Literal or any(typing.get_origin(a) is typing.Literal for a in typing.get_args(tp)):
            out.append(prefix + f.name)
    return out


def import_seconds(statement: str) -> float:
    """Wall time of a fresh interpreter running the import, minus a bare interpreter's."""
    def run(code: str) -> float:
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)
        return time.perf_counter() - t
    bare = min(run("pass") for _ in range(3))
    return round(min(run(statement) for _ in range(3)) - bare, 3)


def main() -> None:
    """Print and write what each loader does with the project's schema."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_shared(parser, out=results_file("config_loaders"))
    args = parser.parse_args()
    from core.config_io import compose, load_config
    from core.errors import ConfigError
    from pretrain.config import RunConfig

    result: dict = {"literal_fields": literal_fields(RunConfig)}
    config = REPO / "pretrain" / "configs" / "demo_mlm.yaml"
    ours = {}
    for name, overrides in MISTAKES:
        try:
            load_config(RunConfig, config, overrides)
            ours[name] = "(accepted)"
        except ConfigError as exc:
            ours[name] = str(exc)
    result["ours"] = {"messages": ours, "import_s": import_seconds("import core.config_io")}
    t = time.perf_counter()
    load_config(RunConfig, config, ["train.max_steps=5"])
    result["ours"]["load_ms"] = round(1000 * (time.perf_counter() - t), 2)
    try:
        from omegaconf import OmegaConf
    except ImportError:
        result["omegaconf"] = "not installed (pip install --target /tmp/omega omegaconf; PYTHONPATH=/tmp/omega)"
    else:
        import omegaconf

        omega: dict = {"version": omegaconf.__version__, "import_s": import_seconds("import omegaconf")}
        try:
            schema = OmegaConf.structured(RunConfig)
            omega["schema"] = "built"
        except Exception as exc:  # what OmegaConf says about the schema is the measurement
            schema = None
            omega["schema"] = f"{type(exc).__name__}: {exc}"
        if schema is not None:
            # The valid config through both: the same values? (OmegaConf runs no validate() of ours.)
            from core.config_io import config_to_dict

            t = time.perf_counter()
            loaded = OmegaConf.to_object(OmegaConf.merge(schema, OmegaConf.create(compose(config)),
                                                          OmegaConf.from_dotlist(["train.max_steps=5"])))
            omega["load_ms"] = round(1000 * (time.perf_counter() - t), 2)
            omega["same_values_as_ours"] = config_to_dict(loaded) == config_to_dict(
                load_config(RunConfig, config, ["train.max_steps=5"]))
            with_schema = {}
            for name, overrides in MISTAKES:
                try:
                    OmegaConf.merge(schema, OmegaConf.create(compose(config)), OmegaConf.from_dotlist(overrides))
                    with_schema[name] = "(accepted)"
                except Exception as exc:
                    with_schema[name] = f"{type(exc).__name__}: {exc}"
            omega["messages_with_schema"] = with_schema
            # A value the type allows but our validate() refuses.
            try:
                OmegaConf.to_object(OmegaConf.merge(schema, OmegaConf.create(compose(config)),
                                                    OmegaConf.from_dotlist(["masking.mask_prob=1.5"])))
                omega["masking.mask_prob=1.5"] = "(accepted)"
            except Exception as exc:
                omega["masking.mask_prob=1.5"] = f"{type(exc).__name__}: {exc}"
        # The same YAML as a plain (untyped) OmegaConf config, to compare messages where a schema is not involved.
        data = compose(config)
        messages = {}
        for name, overrides in MISTAKES:
            try:
                merged = OmegaConf.merge(OmegaConf.create(data), OmegaConf.from_dotlist(overrides))
                messages[name] = f"(accepted without a schema: {OmegaConf.select(merged, overrides[0].split('=')[0])!r})"
            except Exception as exc:
                messages[name] = f"{type(exc).__name__}: {exc}"
        omega["messages_without_schema"] = messages
        # With a schema, on the loader's section: it had no Literal field when this was measured (issue 16); since
        # data.num_workers became `auto | int` (a Union with a Literal) OmegaConf refuses the schema itself.
        from data_pipeline.loader import LoaderConfig

        with_schema, ours_data = {}, {}
        for overrides in (["num_workers=lots"], ["shufle=true"]):
            try:
                OmegaConf.merge(OmegaConf.structured(LoaderConfig), OmegaConf.from_dotlist(overrides))
                with_schema[overrides[0]] = "(accepted)"
            except Exception as exc:
                with_schema[overrides[0]] = f"{type(exc).__name__}: {exc}"
            try:
                load_config(LoaderConfig, None, overrides)
                ours_data[overrides[0]] = "(accepted)"
            except ConfigError as exc:
                ours_data[overrides[0]] = str(exc)
        omega["messages_with_schema_LoaderConfig"] = with_schema
        result["ours"]["messages_LoaderConfig"] = ours_data
        result["omegaconf"] = omega
    print(json.dumps(result, indent=2))
    out = Path(args.out)
    out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
