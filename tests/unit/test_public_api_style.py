"""Public functions carry type hints and a one-line docstring (DEVELOPERS.md's style rule), checked with `ast`.

Public: a module-level function or a method of a class (overrides included) whose name, and whose classes' names,
have no leading underscore. Exempt: dunders (`__init__`, `__call__`, ...), functions defined inside a function (and
the classes there), and the first parameter `self` / `cls` of a method.
"""
from __future__ import annotations

import ast
from pathlib import Path

from conftest import REPO

PACKAGES = ("core", "data_pipeline", "model", "pretrain", "evaluation", "benchmarks")

FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)


def _is_staticmethod(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Whether the function is decorated with @staticmethod."""
    return any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in fn.decorator_list)


def function_gaps(fn: ast.FunctionDef | ast.AsyncFunctionDef, is_method: bool) -> list[str]:
    """What the function lacks: 'docstring', 'return annotation', 'annotation of <param>' (one entry each)."""
    missing = []
    if not ast.get_docstring(fn):
        missing.append("docstring")
    args = fn.args
    params = [*args.posonlyargs, *args.args, *args.kwonlyargs]
    if is_method and params and params[0].arg in ("self", "cls") and not _is_staticmethod(fn):
        params = params[1:]
    names = [(p.arg, p) for p in params]
    names += [(f"{stars}{p.arg}", p) for stars, p in (("*", args.vararg), ("**", args.kwarg)) if p is not None]
    missing += [f"annotation of {name}" for name, p in names if p.annotation is None]
    if fn.returns is None:
        missing.append("return annotation")
    return missing


def _statements(body: list[ast.stmt]) -> list[ast.stmt]:
    """The statements of a module or class body, with those inside its if/try/with blocks (never a function's)."""
    out = []
    for node in body:
        out.append(node)
        if isinstance(node, ast.If):
            out += _statements(node.body) + _statements(node.orelse)
        elif isinstance(node, ast.Try) or type(node).__name__ == "TryStar":
            out += _statements(node.body) + _statements(node.orelse) + _statements(node.finalbody)
            for handler in node.handlers:
                out += _statements(handler.body)
        elif isinstance(node, (ast.With, ast.AsyncWith)):
            out += _statements(node.body)
    return out


def source_gaps(source: str, where: str) -> list[str]:
    """'where:line qualified.name lacks ...' for every public function or method of this source that breaks the rule."""
    found = []

    def visit(body: list[ast.stmt], prefix: str, in_class: bool) -> None:
        """Check the functions of one module or public class body, and descend into its public classes."""
        for node in _statements(body):
            if node.__class__ in FUNCTIONS and not node.name.startswith("_"):
                missing = function_gaps(node, in_class)
                if missing:
                    found.append(f"{where}:{node.lineno} {prefix}{node.name} lacks {', '.join(missing)}")
            elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                visit(node.body, f"{prefix}{node.name}.", True)

    visit(ast.parse(source, where).body, "", False)
    return found


def library_files() -> list[Path]:
    """Every Python file of the library packages and the benchmarks."""
    return [path for package in PACKAGES for path in sorted((REPO / package).rglob("*.py"))]


def test_public_functions_have_type_hints_and_a_docstring():
    """Every public function and method has a docstring, a return annotation and annotated parameters (*args and
    **kwargs included)."""
    gaps = []
    for path in library_files():
        gaps += source_gaps(path.read_text(encoding="utf-8"), path.relative_to(REPO).as_posix())
    assert not gaps, f"{len(gaps)} public function(s) break the style rule:\n" + "\n".join(gaps)


def test_the_checker_sees_each_kind_of_gap():
    """Missing docstrings and annotations are named; nested, private and dunder functions and self/cls are not."""
    source = '''
def documented(a: int, *rest: str, key: bool = False, **more: int) -> None:
    """Fine."""

def bare(a, *rest, key=False, **more):
    def nested(x):  # exempt: inside a function
        pass

def _private(x):
    pass

class Public:
    """A class."""

    def __init__(self, x):
        pass

    def method(self, x: int):
        pass

    @classmethod
    def build(cls) -> "Public":
        """Fine: cls needs no annotation."""

    @staticmethod
    def static(self) -> None:
        """A static method's first parameter is a parameter like any other."""

    class Inner:
        def deep(self) -> None:
            pass

class _Hidden:
    def method(self, x):
        pass

if True:
    def conditional(x) -> None:
        """Defined at module level all the same."""
'''
    assert source_gaps(source, "m.py") == [
        "m.py:5 bare lacks docstring, annotation of a, annotation of key, annotation of *rest, annotation of **more, "
        "return annotation",
        "m.py:18 Public.method lacks docstring, return annotation",
        "m.py:26 Public.static lacks annotation of self",
        "m.py:30 Public.Inner.deep lacks docstring",
        "m.py:38 conditional lacks annotation of x",
    ]
