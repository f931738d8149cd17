"""House rules of the source, checked on its text: rooms small enough to change (no module of
``sparktf/`` over 800 lines, no class over 250, no function over 100 besides its docstring),
one root for sparktf's exceptions, an ``__all__`` on every public module, and a tier
declared by every test module (tests/tiers.py).

The sizes are read with ``ast``; nothing here imports TensorFlow or starts a JVM.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
from pathlib import Path

import pytest

from tests.tiers import TIERS

pytestmark = pytest.mark.unit

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


# ----------------------------------------------------------------------------- rooms

# sparktf.train's public face; everything else lives in the sub-package of its process.
TRAIN_FACE = {"__init__", "config", "plan", "result", "artifacts"}
TRAIN_ROOMS = {"driver", "process", "feed", "wire"}
# Basenames several packages may hold with one role each: a package's own errors.
SHARED_BASENAMES = {"__init__", "errors"}


def _contracts() -> dict[str, dict]:
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return {c["id"]: c for c in config["tool"]["importlinter"]["contracts"]}


def test_every_train_module_sits_in_the_room_of_its_process():
    train = ROOT / "sparktf" / "train"
    loose = sorted(p.stem for p in train.glob("*.py") if p.stem not in TRAIN_FACE)
    assert not loose, f"move into {sorted(TRAIN_ROOMS)}: {loose}"
    rooms = {p.name for p in train.iterdir() if (p / "__init__.py").exists()}
    assert rooms == TRAIN_ROOMS
    for room in rooms:
        assert not [p for p in (train / room).iterdir() if p.is_dir() and p.name != "__pycache__"]


def test_the_import_contracts_hold_the_train_rooms():
    contracts = _contracts()
    layers = contracts["train-rooms"]["layers"]
    named = {name.strip() for layer in layers for name in layer.split("|")}
    assert named == TRAIN_ROOMS | TRAIN_FACE - {"__init__"}, named
    assert layers.index("driver") < layers.index("process") < layers.index("feed")
    assert layers[-1] == "wire" and contracts["train-rooms"]["exhaustive"] is True
    forbidden = contracts["train-process-not-driver"]
    assert forbidden["source_modules"] == ["sparktf.train.process"]
    assert {"sparktf.train.driver", "sparktf.spark"} <= set(forbidden["forbidden_modules"])


def repeated_basenames(files: list[Path], root: Path = ROOT) -> dict[str, list[str]]:
    """Basenames held by more than one module (besides SHARED_BASENAMES), with their paths."""
    seen: dict[str, list[str]] = {}
    for path in files:
        seen.setdefault(path.stem, []).append(str(path.relative_to(root)))
    return {k: v for k, v in seen.items() if len(v) > 1 and k not in SHARED_BASENAMES}


def test_repeated_basenames_are_found(tmp_path):
    for rel in ("a/plan.py", "b/plan.py", "a/errors.py", "b/errors.py", "b/other.py"):
        (tmp_path / rel).parent.mkdir(exist_ok=True)
        (tmp_path / rel).write_text("")
    files = sorted(tmp_path.rglob("*.py"))
    assert repeated_basenames(files, tmp_path) == {"plan": ["a/plan.py", "b/plan.py"]}


def test_no_two_modules_share_a_name():
    found = repeated_basenames(SOURCES)
    assert not found, f"one name, one meaning: rename one of each {found}"


def patches(path: Path, root: Path = ROOT) -> list[str]:
    """Run-time patches of another package in one file: an assignment to ``sys.modules[...]``
    or to an attribute of a name imported from ``tensorflowonspark``, as 'file:line'."""
    tree = ast.parse(path.read_text())
    tfos = {
        alias.asname or alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
        if (getattr(node, "module", None) or alias.name).startswith("tensorflowonspark")
    }
    found = []
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else []
        if isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        for target in targets:
            for part in ast.walk(target):
                if (
                    isinstance(part, ast.Subscript)
                    and ast.unparse(part.value) == "sys.modules"
                    or isinstance(part, ast.Attribute)
                    and isinstance(part.value, ast.Name)
                    and part.value.id in tfos
                ):
                    found.append(f"{path.relative_to(root)}:{node.lineno}")
    return found


def test_patches_finds_a_module_swap_and_a_class_swap(tmp_path):
    src = tmp_path / "patch.py"
    src.write_text(
        "import sys\n"
        "from tensorflowonspark import reservation as r, TFManager\n"
        "r.Client, x = 1, 2\n"
        "sys.modules['tensorflowonspark.compat'] = None\n"
        "TFManager.TFManager = object\n"
        "y = r.Client\n"
    )
    assert patches(src, tmp_path) == ["patch.py:3", "patch.py:4", "patch.py:5"]


def test_nothing_of_tensorflowonspark_is_patched_at_run_time():
    found = [line for path in SOURCES for line in patches(path)]
    assert not found, "use TensorFlowOnSpark's public API, or sparktf's own code:\n" + "\n".join(
        found
    )


# ----------------------------------------------------------------------------- tests


def module_tiers(path: Path) -> list[str]:
    """The tiers a test module declares for all its tests: those among its top-level
    ``pytestmark = pytest.mark.TIER`` (or a list or tuple of marks)."""
    found = []
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and "pytestmark" in [ast.unparse(t) for t in node.targets]:
            marks = (
                node.value.elts if isinstance(node.value, ast.List | ast.Tuple) else [node.value]
            )
            names = [ast.unparse(mark).removeprefix("pytest.mark.") for mark in marks]
            found += [name for name in names if name in TIERS]
    return found


def test_module_tiers_reads_the_module_mark(tmp_path):
    src = tmp_path / "test_x.py"
    src.write_text("import pytest\npytestmark = pytest.mark.e2e\n")
    assert module_tiers(src) == ["e2e"]
    src.write_text("import pytest\npytestmark = [pytest.mark.petastorm, pytest.mark.unit]\n")
    assert module_tiers(src) == ["unit"]
    src.write_text("import pytest\n\n@pytest.mark.unit\ndef test_a():\n    pass\n")
    assert module_tiers(src) == [], "a test's own mark is not the module's"
    src.write_text("import pytest\npytestmark = (pytest.mark.unit, pytest.mark.e2e)\n")
    assert module_tiers(src) == ["unit", "e2e"]


def test_every_test_module_declares_one_tier():
    """The default of its tests (tests/conftest.py also stops on any test without a tier)."""
    found = {path.name: module_tiers(path) for path in sorted((ROOT / "tests").glob("test_*.py"))}
    wrong = {name: tiers for name, tiers in found.items() if len(tiers) != 1}
    assert not wrong, (
        "declare one tier at the top of each of these, after the imports: "
        f"pytestmark = pytest.mark.unit (or integration, e2e): {wrong}"
    )
