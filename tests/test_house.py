"""House rules of the source, checked on its text: rooms small enough to change (no module of
``sparktf/`` over 800 lines, no class over 250, no function over 100 besides its docstring),
one root for sparktf's exceptions, an ``__all__`` on every public module, no run-time patch of
another package but those allowed with their reason (``ALLOWED_PATCHES``), and a tier
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
TRAIN_FACE = {"__init__", "config", "settings", "errors", "plan", "result", "artifacts"}
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
    wire = contracts["wire-only-messages"]  # the wire: messages and their servers only
    assert wire["source_modules"] == ["sparktf.train.wire"]
    assert {"sparktf.train.driver", "sparktf.spark", "pyspark"} <= set(wire["forbidden_modules"])


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


# ----------------------------------------------------------------------------- words

# One meaning per word. ``checkpoint`` is the config section, ``RunConfig.checkpoint`` (a
# CheckpointConfig, read from a run config: ``run.checkpoint``, ``plan.run.checkpoint``), and
# the keyword of ``report(metrics, checkpoint=...)``, Ray Train's name for what a training
# function reports; anything else says what it holds (``last_checkpoint``, ``restored_from``,
# ``tf_checkpoint``, ...).
CHECKPOINT_SECTION = "RunConfig"  # the one class with a field ``checkpoint``
CHECKPOINT_KEYWORD = "report"  # the functions with a parameter ``checkpoint``


def _parameters(node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> list[str]:
    args = node.args
    every = args.posonlyargs + args.args + args.kwonlyargs + [args.vararg, args.kwarg]
    return [a.arg for a in every if a is not None]


def checkpoint_words(path: Path, root: Path = ROOT) -> list[str]:
    """What one source file names ``checkpoint`` besides the config section and report's
    keyword, as 'file:line what': a field, class attribute or variable (anywhere but in
    ``RunConfig``'s body), a function or method, a parameter of any function but ``report``,
    an attribute set on anything, and an attribute read from anything but a run config
    (whose name ends in ``run``)."""
    tree = ast.parse(path.read_text())
    section = {
        id(statement.target)
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef) and node.name == CHECKPOINT_SECTION
        for statement in node.body
        if isinstance(statement, ast.AnnAssign)
    }
    found = []
    for node in ast.walk(tree):
        what = None
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == "checkpoint":
            what = "function checkpoint"
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            name = getattr(node, "name", "lambda")
            if name != CHECKPOINT_KEYWORD and "checkpoint" in _parameters(node):
                what = f"parameter checkpoint of {name}"
        elif isinstance(node, ast.Name) and node.id == "checkpoint":
            if isinstance(node.ctx, ast.Store) and id(node) not in section:
                what = "variable or field checkpoint"
        elif isinstance(node, ast.Attribute) and node.attr == "checkpoint":
            receiver = ast.unparse(node.value)
            if not isinstance(node.ctx, ast.Load):
                what = f"attribute {ast.unparse(node)} set"
            elif receiver != "run" and not receiver.endswith(".run"):
                what = f"attribute {ast.unparse(node)}"
        if what:
            found.append(f"{path.relative_to(root)}:{node.lineno} {what}")
    return sorted(found, key=lambda line: int(line.split(":")[1].split()[0]))


def test_checkpoint_words_finds_every_other_meaning(tmp_path):
    src = tmp_path / "words.py"
    src.write_text(
        "class RunConfig:\n"
        "    checkpoint: CheckpointConfig = None\n"  # the section: allowed
        "class Built:\n"
        "    checkpoint: str | None\n"  # 4: a field of another class
        "def report(metrics, checkpoint=None):\n"  # Ray's keyword: allowed
        "    return checkpoint\n"
        "def attach(checkpoint, keep):\n"  # 7
        "    checkpoint = tf.train.Checkpoint()\n"  # 8
        "    self.checkpoint = None\n"  # 9
        "    every = run.checkpoint.every_steps + plan.run.checkpoint.keep\n"  # the section
        "    return built.checkpoint\n"  # 11: read from what is no run config
        "def checkpoint():\n"  # 12
        "    pass\n"
    )
    assert checkpoint_words(src, tmp_path) == [
        "words.py:4 variable or field checkpoint",
        "words.py:7 parameter checkpoint of attach",
        "words.py:8 variable or field checkpoint",
        "words.py:9 attribute self.checkpoint set",
        "words.py:11 attribute built.checkpoint",
        "words.py:12 function checkpoint",
    ]


def test_checkpoint_means_the_config_section_only():
    found = [line for path in SOURCES for line in checkpoint_words(path)]
    assert not found, (
        "`checkpoint` is RunConfig.checkpoint (and report()'s keyword) only: name these for "
        "what they hold (last_checkpoint, restored_from, tf_checkpoint, ...):\n" + "\n".join(found)
    )


# In sparktf/inference/ the SavedModel is the export, as ``sparktf.predict(df, export)`` says:
# the module is saved_model.py, its names say export.
FORMER_EXPORT_NAMES = {
    "ModelInfo",
    "inspect_model",
    "model_fingerprint",
    "model_uri",
    "resolve_model",
}


def names_in(path: Path) -> list[tuple[int, str]]:
    """Every name one source file defines or uses, with its line: variables, attributes,
    parameters, keywords, functions, classes and imports."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Name):
            found.append((node.lineno, node.id))
        elif isinstance(node, ast.Attribute):
            found.append((node.lineno, node.attr))
        elif isinstance(node, ast.arg | ast.keyword) and node.arg:
            found.append((node.lineno, node.arg))
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            found.append((node.lineno, node.name))
        elif isinstance(node, ast.Import | ast.ImportFrom):
            for alias in node.names:
                found += [(node.lineno, n) for n in (alias.name, alias.asname) if n]
    return found


def test_names_in_finds_definitions_uses_and_imports(tmp_path):
    src = tmp_path / "names.py"
    src.write_text(
        "from x import ModelInfo as Info\n"
        "def resolve_model(model_uri):\n"
        "    return plan.model_uri, f(model_uri=1)\n"
    )
    found = set(names_in(src))
    assert {(1, "ModelInfo"), (1, "Info"), (2, "resolve_model"), (2, "model_uri")} <= found
    assert {(3, "plan"), (3, "model_uri"), (3, "f")} <= found


def test_inference_calls_the_saved_model_an_export():
    inference = ROOT / "sparktf" / "inference"
    assert not (inference / "model.py").exists(), "the module is inference/saved_model.py"
    found = [
        f"{path.relative_to(ROOT)}:{line} {name}"
        for path in sorted(inference.glob("*.py"))
        for line, name in names_in(path)
        if name in FORMER_EXPORT_NAMES
    ]
    assert not found, (
        "the SavedModel is the export (ExportInfo, resolve_export, inspect_export, "
        "export_fingerprint, export_uri):\n" + "\n".join(found)
    )


# Run-time patches of another package that sparktf keeps, each with its reason, as
# 'file target' (the line may move): a new one needs a reason as good; a patch that is gone
# must leave this list too.
ALLOWED_PATCHES = {
    "sparktf/train/process/keras_fit.py cls._maybe_symbolic_build": (
        "Keras 3 model.fit under MultiWorkerMirroredStrategy fails (keras-team/keras#20585); "
        "mended in the TensorFlow processes that run a user's function, for the Keras "
        "versions tests/test_keras_canary.py has seen fail only"
    ),
    "sparktf/train/process/keras_fit.py trainer.reduce_per_replica": (
        "the same mend: its second half, the metrics' reduction"
    ),
    "sparktf/_zipimport.py cls.invalidate_caches": (
        "Python 3.11's zipimport re-reads every archive on sys.path at each "
        "invalidate_caches (CPython gh-103200, fixed in 3.12, where it is not applied); "
        "PySpark workers only"
    ),
}


def _root_name(node: ast.AST) -> str | None:
    """The name an attribute or subscript chain starts from (``a`` of ``a.b[0].c``)."""
    while isinstance(node, ast.Attribute | ast.Subscript):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def patches(path: Path, root: Path = ROOT) -> list[str]:
    """Run-time patches of another package in one file, as 'file:line target': an
    assignment to ``sys.modules[...]``, and an assignment to (or deletion, ``setattr``,
    ``delattr`` of) an attribute of a module or class that is not sparktf's own.

    Those are the names the file binds by importing anything but sparktf (the standard
    library included), and the names it binds to them or to their attributes
    (``cls = mod.Class``, ``cls = getattr(mod, "Class")``), anywhere in the file. What a call
    returns is a new object, not the package's (``model = keras.Sequential()``; then
    ``model.trainable = False`` is no patch), and an item of a package's mapping is its data
    (``os.environ[...]``)."""
    tree = ast.parse(path.read_text())
    foreign: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            foreign |= {
                alias.asname or alias.name.split(".")[0]
                for alias in node.names
                if alias.name.split(".")[0] != "sparktf"
            }
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            if node.module.split(".")[0] != "sparktf":
                foreign |= {alias.asname or alias.name for alias in node.names}

    def reaches(expr: ast.AST) -> bool:
        """Whether ``expr`` is a foreign module or class, or an attribute of one."""
        if isinstance(expr, ast.Call) and ast.unparse(expr.func) == "getattr" and expr.args:
            return reaches(expr.args[0])
        return isinstance(expr, ast.Name | ast.Attribute) and _root_name(expr) in foreign

    aliases = [node for node in ast.walk(tree) if isinstance(node, ast.Assign)]
    while True:  # aliases of aliases, in any order
        more = {
            target.id
            for node in aliases
            if reaches(node.value)
            for target in node.targets
            if isinstance(target, ast.Name) and target.id not in foreign
        }
        if not more:
            break
        foreign |= more
    found = []
    for node in ast.walk(tree):
        storing = isinstance(getattr(node, "ctx", None), ast.Store | ast.Del)
        if (
            storing
            and isinstance(node, ast.Attribute)
            and _root_name(node) in foreign
            or storing
            and isinstance(node, ast.Subscript)
            and ast.unparse(node.value) == "sys.modules"
            or isinstance(node, ast.Call)
            and ast.unparse(node.func) in ("setattr", "delattr")
            and node.args
            and reaches(node.args[0])
        ):
            target = node if not isinstance(node, ast.Call) else node.args[0]
            name = ast.unparse(target)
            if isinstance(node, ast.Call) and len(node.args) > 1:
                name += f".<{ast.unparse(node.args[1])}>"
            found.append(f"{path.relative_to(root)}:{node.lineno} {name}")
    return sorted(found, key=lambda line: int(line.split(":")[1].split()[0]))


def test_patches_finds_assignments_onto_any_package_but_sparktf(tmp_path):
    src = tmp_path / "patch.py"
    src.write_text(
        "import os, sys, zipimport\n"
        "import numpy as np\n"
        "from keras.src.backend.tensorflow import trainer\n"
        "from tensorflowonspark import reservation as r, TFManager\n"
        "from sparktf import storage\n"
        "from . import sibling\n"
        "r.Client, x = 1, 2\n"  # 7: a module's attribute
        "sys.modules['tensorflowonspark.compat'] = None\n"  # 8
        "TFManager.TFManager = object\n"  # 9: a name from the package
        "def mend():\n"
        "    cls = getattr(trainer, 'TensorFlowTrainer')\n"
        "    same = cls\n"
        "    same._maybe_symbolic_build = None\n"  # 13: a class reached through aliases
        "    trainer.reduce_per_replica = None\n"  # 14
        "    setattr(np.linalg, 'norm', None)\n"  # 15
        "    del zipimport.zipimporter.invalidate_caches\n"  # 16: the standard library too
        "storage.CHUNK = 1\n"  # sparktf's own
        "sibling.x = 1\n"
        "os.environ['A'] = '1'\n"  # data, not code
        "y = r.Client\n"
        "model = np.zeros(3)\n"  # what a call returns is new
        "model.flags.writeable = False\n"
    )
    assert patches(src, tmp_path) == [
        "patch.py:7 r.Client",
        "patch.py:8 sys.modules['tensorflowonspark.compat']",
        "patch.py:9 TFManager.TFManager",
        "patch.py:13 same._maybe_symbolic_build",
        "patch.py:14 trainer.reduce_per_replica",
        "patch.py:15 np.linalg.<'norm'>",
        "patch.py:16 zipimport.zipimporter.invalidate_caches",
    ]


def test_nothing_of_another_package_is_patched_at_run_time_but_the_allowed():
    found = [line for path in SOURCES for line in patches(path)]
    where = {line.split(":")[0] + " " + line.split(" ", 1)[1]: line for line in found}
    unexplained = [line for key, line in where.items() if key not in ALLOWED_PATCHES]
    assert not unexplained, (
        "use the other package's public API, or sparktf's own code (a patch that cannot be "
        "helped goes into ALLOWED_PATCHES with its reason):\n" + "\n".join(unexplained)
    )
    gone = sorted(set(ALLOWED_PATCHES) - set(where))
    assert not gone, f"these patches are gone: take them out of ALLOWED_PATCHES: {gone}"


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


def test_module_seconds_adds_each_modules_phases_and_the_file_orders_the_longest_first():
    """tests/durations.py reads a ``--durations=0`` report; tests/durations.json (what
    tests/conftest.py orders the modules by) lists modules that exist, longest first."""
    from tests.durations import DURATIONS, load, module_seconds

    report = (
        "12.50s call     tests/test_a.py::test_x[p-1]\n"
        "3.00s setup    tests/test_a.py::test_y\n"
        "0.25s teardown tests/test_b.py::test_z\n"
        "1.00s call     tests/test_a.py::test_x[p-2]\n"
    )
    assert module_seconds(report) == {"tests.test_a": 16.5, "tests.test_b": 0.25}
    measured = load()
    assert measured, f"{DURATIONS.name} is missing or not JSON"
    assert list(measured.values()) == sorted(measured.values(), reverse=True)
    missing = [n for n in measured if not (ROOT / f"{n.replace('.', '/')}.py").is_file()]
    assert not missing, f"modules gone: drop them from {DURATIONS.name}: {missing}"
