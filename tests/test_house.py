"""House rules of the source, checked on its text: rooms small enough to change (no module of
``sparktf/`` over 800 lines, no class over 250, no function over 100 besides its docstring),
one root for sparktf's exceptions, and an ``__all__`` on every public module.

The sizes are read with ``ast``; nothing here imports TensorFlow or starts a JVM.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted((ROOT / "sparktf").rglob("*.py"))
MAX_MODULE, MAX_CLASS, MAX_FUNCTION = 800, 250, 100


def _docstring_lines(node: ast.AST) -> int:
    body = getattr(node, "body", [])
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        if isinstance(body[0].value.value, str):
            return body[0].end_lineno - body[0].lineno + 1
    return 0


def oversized(path: Path, root: Path = ROOT) -> list[str]:
    """The rooms of one source file over their limit, as 'file:line name N lines'."""
    text = path.read_text()
    rel = path.relative_to(root)
    found = []
    lines = len(text.splitlines())
    if lines > MAX_MODULE:
        found.append(f"{rel}: module of {lines} lines (at most {MAX_MODULE})")
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ClassDef):
            limit, what = MAX_CLASS, "class"
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            limit, what = MAX_FUNCTION, "function"
        else:
            continue
        size = node.end_lineno - node.lineno + 1 - _docstring_lines(node)
        if size > limit:
            found.append(
                f"{rel}:{node.lineno} {what} {node.name} of {size} lines (at most {limit})"
            )
    return found


def test_oversized_finds_a_long_function(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION - 1))
    src = tmp_path / "long.py"
    src.write_text(f'def f():\n    """Doc."""\n{body}\n')
    assert oversized(src, tmp_path) == [], "a docstring does not count"
    src.write_text(f"def f():\n    y = 0\n{body}\n")
    (found,) = oversized(src, tmp_path)
    assert found == f"long.py:1 function f of {MAX_FUNCTION + 1} lines (at most {MAX_FUNCTION})"


def test_no_room_over_its_limit():
    found = [line for path in SOURCES for line in oversized(path)]
    assert not found, "split these rooms:\n" + "\n".join(found)


def _modules():
    import sparktf

    for info in pkgutil.walk_packages(sparktf.__path__, "sparktf."):
        if info.name.rsplit(".", 1)[-1].startswith("_") and not info.ispkg:
            continue
        yield info.name


@pytest.fixture(scope="module")
def modules():
    return {name: importlib.import_module(name) for name in _modules()}


def test_every_sparktf_exception_derives_from_sparktf_error(modules):
    from sparktf import SparktfError

    stray = sorted(
        f"{cls.__module__}.{cls.__qualname__}"
        for mod in modules.values()
        for cls in vars(mod).values()
        if inspect.isclass(cls)
        and issubclass(cls, BaseException)
        and cls.__module__.startswith("sparktf")
        and not issubclass(cls, SparktfError)
    )
    assert not stray, f"not under sparktf.SparktfError: {stray}"


def test_every_public_module_declares_all(modules):
    missing = sorted(name for name, mod in modules.items() if not hasattr(mod, "__all__"))
    assert not missing, f"no __all__: {missing}"
    for name, mod in modules.items():
        for public in mod.__all__:
            assert hasattr(mod, public), f"{name}.__all__ names {public!r}, which it lacks"


def _is_module(name: str) -> bool:
    path = ROOT / name.replace(".", "/")
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def private_uses(path: Path, root: Path = ROOT) -> list[str]:
    """Private names (``_x``) of a sparktf module that another file imports or reaches into,
    as 'file:line module._x'; a package may import its own private modules."""
    tree = ast.parse(path.read_text())
    rel = path.relative_to(root)
    modules: dict[str, str] = {}  # local name -> sparktf module it is bound to
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("sparktf") and alias.asname:
                    modules[alias.asname] = alias.name
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("sparktf"):
            for alias in node.names:
                qualified = f"{node.module}.{alias.name}"
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    if not _is_module(qualified):
                        found.append(f"{rel}:{node.lineno} {qualified}")
                elif _is_module(qualified):
                    modules[alias.asname or alias.name] = qualified
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in modules
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
        ):
            found.append(f"{rel}:{node.lineno} {modules[node.value.id]}.{node.attr}")
    return found


def test_private_uses_finds_an_import_and_an_attribute(tmp_path):
    src = tmp_path / "user.py"
    src.write_text(
        "from sparktf.storage import _hidden\n"
        "from sparktf import storage\n"
        "from sparktf import _zipimport\n"
        "storage._other()\n"
        "storage.public()\n"
    )
    found = private_uses(src, tmp_path)
    assert found == ["user.py:1 sparktf.storage._hidden", "user.py:4 sparktf.storage._other"]


def test_no_module_uses_another_modules_private_names():
    files = SOURCES + sorted((ROOT / "tests").glob("*.py")) + sorted((ROOT / "bench").glob("*.py"))
    found = [line for path in files for line in private_uses(path)]
    assert not found, "make these public or keep them inside their module:\n" + "\n".join(found)
