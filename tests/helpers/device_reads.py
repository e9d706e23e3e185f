"""A dispatch mode that records every op whose result the host must read from the device, whoever called it.

On a GPU each one makes the host wait for the device's queue: a tensor's value as a Python number or bool
(`_local_scalar_dense`, behind item(), float(), bool() and an `if` on a tensor), and the ops whose output size is
data (nonzero, masked_select, indexing by a boolean mask). On a CPU the same ops run, so a CPU test sees them.
Beside it, a function mode that records the tensors a factory builds on the host because no device was named: on a
CPU their later copy to the device is no op at all, so only the call shows them.
"""
from __future__ import annotations

import traceback
from collections import Counter
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

REPO = str(Path(__file__).resolve().parents[2]) + "/"
aten = torch.ops.aten
READS = {aten._local_scalar_dense.default, aten.is_nonzero.default, aten.nonzero.default, aten.masked_select.default}
INDEXING = {aten.index.Tensor, aten.index_put.default, aten.index_put_.default}


# The factories that build a tensor from sizes or ranges and take a device (torch.tensor(...) shows as lift_fresh).
FACTORIES = {torch.arange, torch.zeros, torch.ones, torch.full, torch.empty, torch.empty_strided, torch.eye,
             torch.linspace, torch.logspace, torch.rand, torch.randn, torch.randint, torch.randperm,
             torch.scalar_tensor, torch.tril_indices, torch.triu_indices}


def _caller() -> str:
    """The innermost frame outside torch and these helpers (their patched reads), as `path:line` relative to
    site-packages or the repository."""
    for frame in reversed(traceback.extract_stack()[:-1]):
        if "/torch/" not in frame.filename and "/tests/helpers/" not in frame.filename:
            return f"{frame.filename.split('site-packages/')[-1].removeprefix(REPO)}:{frame.lineno}"
    return "?"


class DeviceReads(TorchDispatchMode):
    """Counts the device -> host reads by op (`ops`) and lists where each was made (`where`); lists where a tensor
    was made from Python data (`made`: `torch.tensor(...)`, or indexing by a list)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter = Counter()
        self.where: list[str] = []
        self.made: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is aten.lift_fresh.default:
            self.made.append(_caller())
        by_mask = func in INDEXING and any(isinstance(i, torch.Tensor) and i.dtype == torch.bool
                                           for i in args[1] if i is not None)
        if func in READS or by_mask:
            self.ops[func._opname] += 1
            self.where.append(_caller())
        return func(*args, **(kwargs or {}))


class HostFactories(TorchFunctionMode):
    """Lists where a factory built a tensor on the host for want of a device (`where`): `torch.arange(n)` inside a
    step on a GPU is a tensor in pageable host memory, and its copy to the device waits for the device's queue."""

    def __init__(self) -> None:
        super().__init__()
        self.where: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in FACTORIES and kwargs.get("device") is None:
            self.where.append(_caller())
        return func(*args, **kwargs)
