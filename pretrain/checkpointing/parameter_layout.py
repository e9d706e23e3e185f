"""A checkpoint's parameters against the model this launch built, compared before DeepSpeed loads anything.

An option that changes the parameters without changing the backbone's shape (ELECTRA's two stages, a pair head, a
generator's size) passes the checks on the run files (resume_checks.py). DeepSpeed's load would then stop with a
state-dict error, or, on another number of ranks, with a missing file deep inside its universal load, after
converting the checkpoint. Compared here, it is one line naming what differs.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import torch
from torch import nn

from pretrain.checkpointing.checkpoint import rank0_module_states
from pretrain.engine.optim import param_group_names

SHOWN = 3

# (trained parameter -> shape, or None where the checkpoint does not list them; state-dict entry -> shape, or None
# where ZeRO-3 kept only an empty placeholder)
Layout = tuple[Optional[dict[str, tuple[int, ...]]], dict[str, Optional[tuple[int, ...]]]]


def saved_layout(tag_dir: Path) -> Layout:
    """What a saved tag holds, from its module-states file (memory-mapped: the tensors' bytes stay unread)."""
    path = rank0_module_states(tag_dir)
    if path is None:
        raise FileNotFoundError(f"checkpoint {tag_dir} has no module-states file")
    # With pickle, as DeepSpeed's own load of the same file: a resume checks the tag first (checkpoint_data).
    states = torch.load(path, map_location="cpu", weights_only=False, mmap=True)
    groups = states.get("param_shapes")  # ZeRO 1-3 list what their optimizer trains; stage 0 does not
    trained = None if groups is None else {n: tuple(s) for group in groups for n, s in group.items()}
    entries = {n: tuple(t.shape) if t.numel() else None for n, t in states["module"].items()}
    entries.update({n: tuple(s) for n, s in (states.get("frozen_param_shapes") or {}).items()})
    return trained, entries


def built_layout(module: nn.Module) -> Layout:
    """The same for a built model (ZeRO-3's full shapes, not its slices)."""
    def shape(t: torch.Tensor) -> tuple[int, ...]:
        return tuple(getattr(t, "ds_shape", t.shape))

    # DeepSpeed leaves a parameter without elements out of its optimizer and lists it with the frozen ones.
    trained = {n: shape(p) for n, p in module.named_parameters()
               if p.requires_grad and getattr(p, "ds_numel", p.numel())}
    return trained, {n: shape(t) for n, t in module.state_dict(keep_vars=True).items()}


def saved_groups(tag_dir: Path) -> Optional[list]:
    """The checkpoint's optimizer groups, in order: each group's parameter names where ZeRO 1-3 lists them (ZeRO-3:
    its sub-groups), else each group's size (a plain optimizer's own state); None where neither is saved (DeepSpeed's
    bf16 and fp16 optimizers at stage 0)."""
    path = rank0_module_states(tag_dir)
    states = torch.load(path, map_location="cpu", weights_only=False, mmap=True) if path is not None else {}
    if states.get("param_shapes") is not None:
        return [set(group) for group in states["param_shapes"]]
    optimizer = states.get("optimizer")
    if isinstance(optimizer, dict) and isinstance(optimizer.get("param_groups"), list):
        return [len(group["params"]) for group in optimizer["param_groups"]]
    return None


def built_groups(module: nn.Module) -> list[list[str]]:
    """The optimizer groups this launch builds, by name (`param_group_names`)."""
    return param_group_names(module)


def group_differences(saved: Optional[list], built: list[list[str]]) -> list[str]:
    """Parameters the checkpoint's optimizer state holds in another group than this launch puts them (which
    parameters decay changed): DeepSpeed would load one group's moments into the other's, or stop on their sizes."""
    if saved is None:
        return []
    if saved and isinstance(saved[0], int):
        sizes = [len(group) for group in built]
        return [] if sizes == saved else [f"optimizer groups of {saved} parameters in the checkpoint but {sizes} here"]
    # ZeRO-3 saves its sub-groups (a group split every sub_group_size elements, an empty one left out): each saved
    # group must lie within one built group, the one that holds most of it; the rest of it moved.
    home = {name: index for index, group in enumerate(built) for name in group}
    moved: set[str] = set()
    for group in saved:
        indices = [home[name] for name in group if name in home]
        if indices:
            main = max(set(indices), key=indices.count)
            moved |= {name for name in group if home.get(name, main) != main}
    return _names("in another optimizer group (weight decay) than in the checkpoint", moved)


def _names(what: str, names: set[str]) -> list[str]:
    shown = ", ".join(sorted(names)[:SHOWN]) + (", ..." if len(names) > SHOWN else "")
    return [f"{len(names)} {what} ({shown})"] if names else []


def layout_differences(saved: Layout, built: Layout) -> list[str]:
    """What differs between a checkpoint and a built model, one phrase per kind; empty when they match."""
    (saved_trained, saved_entries), (built_trained, built_entries) = saved, built
    out = _names("built here but not in the checkpoint", built_entries.keys() - saved_entries.keys())
    out += _names("in the checkpoint but not built here", saved_entries.keys() - built_entries.keys())
    if saved_trained is not None:
        out += _names("trained here but frozen in the checkpoint", (built_trained.keys() - saved_trained.keys())
                      & saved_entries.keys())
        out += _names("frozen here but trained in the checkpoint", (saved_trained.keys() - built_trained.keys())
                      & built_entries.keys())
        saved_entries = {**saved_entries, **saved_trained}
    reshaped = sorted(n for n in saved_entries.keys() & built_entries.keys()
                      if saved_entries[n] is not None and saved_entries[n] != built_entries[n])
    out += [f"{len(reshaped)} of another shape (" + ", ".join(
        f"{n} {list(saved_entries[n])} -> {list(built_entries[n])}" for n in reshaped[:SHOWN]) + ")"] if reshaped else []
    return out


def layout_refusal(tag_dir: Path, differences: list[str], changes: str) -> str:
    """The one line that refuses a resume from `tag_dir`: what differs, and the config changes that may explain it
    (' (KEY OLD -> NEW, ...)', or '' when the config is the one it was saved with: then the code changed)."""
    cause = (f"An option that shapes the model differs from the one it was saved with{changes}: resume with that "
             "config" if changes else "The config is the one it was saved with, so the code that builds the model or "
             "its optimizer differs (another version of this project or of transformers): resume with the code that "
             "saved it")
    return (f"checkpoint {tag_dir} holds other parameters than this launch builds: {'; '.join(differences)}. {cause}, "
            "or start a new run from its export (model.init_from)")
