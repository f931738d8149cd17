"""The suite's three tiers, found from what each test uses, and kept honest at run time.

- **unit**: no JVM, no job subprocess, no Spark or HDFS: pure functions, servers on
  loopback, local storage, decoders, models, configs.
- **integration**: the session's Spark ``local-cluster`` and HDFS (the ``spark`` and ``hdfs``
  fixtures), in-process training on them.
- **e2e**: separate applications and clusters: jobs and scripts as subprocesses (README
  commands, ``--help``), a standalone cluster, YARN, an HDFS of the test's own, kill/stop runs.

A test's tier is the highest of what its own code, the fixtures it uses (all of them, however
indirectly) and the tests' helpers they call need: the ``spark`` and ``hdfs`` fixtures need
integration; a helper marked ``@needs("e2e")`` (``helpers.run_job``, ``helpers.run_command``,
...) needs e2e. Nobody writes a tier marker by hand, so none can be forgotten.

At run time every process a test starts is checked against its tier (an audit hook sees
each ``subprocess``/``os.exec*``/``posix_spawn``): a Java process needs integration, a
script of ``scripts/`` or ``bench/`` or a job of ``jobs/`` or ``examples/`` needs e2e. A test
that starts more than its tier allows fails and says what it started, so a helper that
launches something new without ``@needs`` is found the first time it runs.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import sys
import threading
import types
from pathlib import Path

TIERS = ("unit", "integration", "e2e")
ROOT = Path(__file__).resolve().parent.parent

# Session fixtures that bring up the suite's shared services.
FIXTURE_TIERS = {"spark": "integration", "hdfs": "integration"}


def above(tier: str, than: str) -> bool:
    """Whether ``tier`` needs more than ``than`` allows."""
    return TIERS.index(tier) > TIERS.index(than)


def needs(tier: str):
    """Marks a helper (or fixture function) as needing ``tier``: every test that calls it,
    directly or through other helpers and fixtures, is of that tier at least."""
    if tier not in TIERS:
        raise ValueError(f"unknown tier {tier!r}; one of {TIERS}")

    def mark(fn):
        fn.__sparktf_tier__ = tier
        return fn

    return mark


# ----------------------------------------------------------------------------- static


def _code_objects(code: types.CodeType):
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _code_objects(const)


def _is_ours(obj) -> bool:
    """Defined in the tests package (a module of it, or a function of such a module)."""
    module = obj.__name__ if isinstance(obj, types.ModuleType) else obj.__module__ or ""
    return module == "tests" or module.startswith("tests.") or module == "conftest"


def _unwrap(fn):
    fn = getattr(fn, "__wrapped__", fn)
    return getattr(fn, "__func__", fn)


def code_tier(fn, _seen: set | None = None) -> tuple[str, str]:
    """The tier a function's code needs, and why: the highest ``@needs`` among the
    functions of the tests package it references, followed recursively (attributes of
    referenced test modules too, as in ``helpers.run_job``)."""
    seen = set() if _seen is None else _seen
    fn = _unwrap(fn)
    if id(fn) in seen or not isinstance(fn, types.FunctionType):
        return "unit", ""
    seen.add(id(fn))
    best, why = getattr(fn, "__sparktf_tier__", "unit"), fn.__qualname__
    if best != "unit":
        return best, why
    scope = fn.__globals__
    modules = [v for v in scope.values() if isinstance(v, types.ModuleType) and _is_ours(v)]
    for code in _code_objects(fn.__code__):
        for name in code.co_names:
            candidates = [scope.get(name)] + [getattr(m, name, None) for m in modules]
            for obj in candidates:
                obj = _unwrap(obj)
                if not isinstance(obj, types.FunctionType) or not _is_ours(obj):
                    continue
                tier, reason = code_tier(obj, seen)
                if above(tier, best):
                    best, why = tier, f"{fn.__qualname__} -> {reason}"
    return best, why


def _requested_by_name(fn, item) -> set[str]:
    """Fixtures that ``fn`` asks for with ``request.getfixturevalue("NAME")``: for a test
    parametrized over locations (``["local", "hdfs"]``), only where its parameter is NAME."""
    fn = _unwrap(fn)
    if not isinstance(fn, types.FunctionType):
        return set()
    params = {str(v) for v in getattr(getattr(item, "callspec", None), "params", {}).values()}
    found = set()
    for code in _code_objects(fn.__code__):
        if "getfixturevalue" in code.co_names:
            names = {c for c in code.co_consts if isinstance(c, str) and c in FIXTURE_TIERS}
            found |= {n for n in names if not params or n in params}
    return found


def item_tier(item) -> tuple[str, str]:
    """An item's tier and the reason: its fixtures (the whole closure, and those asked for
    by name) and its code; the highest of them."""
    info = getattr(item, "_fixtureinfo", None)
    names = getattr(item, "fixturenames", ())
    defs = [d for n in names for d in (info.name2fixturedefs.get(n, ()) if info else ())]
    function = getattr(item, "function", None)
    found = [("unit", "no Spark, HDFS, job or cluster")]
    found += [(FIXTURE_TIERS[n], f"fixture {n!r}") for n in names if n in FIXTURE_TIERS]
    for fixturedef in defs:
        if fixturedef.argname not in FIXTURE_TIERS:  # the shared services' start is exempt
            tier, reason = code_tier(fixturedef.func)
            found.append((tier, f"fixture {fixturedef.argname!r}: {reason}"))
    for fn in filter(None, [function, *(d.func for d in defs)]):
        found += [
            (FIXTURE_TIERS[n], f"fixture {n!r} (by name)") for n in _requested_by_name(fn, item)
        ]
    if function is not None:
        found.append(code_tier(function))
    return max(found, key=lambda pair: TIERS.index(pair[0]))


# ----------------------------------------------------------------------------- run time

_JOB_DIRS = tuple(str(ROOT / d) + os.sep for d in ("jobs", "examples", "scripts", "bench"))
_JOB_RELATIVE = ("jobs/", "examples/", "scripts/", "bench/", "./scripts/", "./jobs/")
_JVM_PROGRAMS = ("java", "spark-submit", "spark-class")


def spawn_tier(argv) -> str:
    """The tier a started process needs, from its command line: a job or script of the
    repository needs e2e, a JVM (``java``, ``spark-submit``) integration."""
    args = [a if isinstance(a, str) else os.fsdecode(a) for a in map(os.fspath, argv)]
    if any(arg.startswith(_JOB_DIRS + _JOB_RELATIVE) for arg in args):
        return "e2e"
    if any(os.path.basename(arg) in _JVM_PROGRAMS for arg in args[:2]):
        return "integration"
    return "unit"


class SpawnWatch:
    """Records the processes started while a test phase runs (a ``sys.addaudithook``, which
    cannot be removed: it stays installed and idle outside a phase)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._started: list[tuple[str, list[str]]] | None = None
        self._exempt = threading.local()
        sys.addaudithook(self._hook)

    def _hook(self, event: str, args) -> None:
        if self._started is None or getattr(self._exempt, "on", False):
            return
        try:  # an audit hook that raises would fail the process start itself
            self._record(event, args)
        except Exception:
            pass

    def _record(self, event: str, args) -> None:
        if event == "subprocess.Popen":
            argv = args[1] if args[1] is not None else [args[0]]
        elif event in ("os.exec", "os.posix_spawn"):
            argv = args[1]
        elif event == "os.system":
            argv = [args[0]]
        else:
            return
        if isinstance(argv, (bytes, os.PathLike)):
            argv = [argv]
        elif isinstance(argv, str):  # a shell command line
            argv = shlex.split(argv)
        tier = spawn_tier(list(argv))
        if tier != "unit":
            with self._lock:
                if self._started is not None:
                    self._started.append((tier, [str(a) for a in argv]))

    @contextlib.contextmanager
    def watching(self):
        self._started = []
        try:
            yield self._started
        finally:
            self._started = None

    @contextlib.contextmanager
    def exempt(self):
        """The suite's own shared services (the session HDFS and Spark) start here."""
        self._exempt.on = True
        try:
            yield
        finally:
            self._exempt.on = False


def violations(tier: str, started, fixtures=()) -> list[str]:
    """What a test of ``tier`` used beyond it: the processes it started (tier, argv) and the
    shared services among the ``fixtures`` it asked for (also by name, at run time)."""
    found = [
        f"{needed} process: {' '.join(argv)[:300]}"
        for needed, argv in started
        if above(needed, tier)
    ]
    return found + [
        f"{FIXTURE_TIERS[name]} fixture {name!r}"
        for name in FIXTURE_TIERS
        if name in fixtures and above(FIXTURE_TIERS[name], tier)
    ]


def explain(item, tier: str, why: str, found: list[str]) -> str:
    return (
        f"{item.nodeid} is in the {tier} tier ({why}) but started:\n  "
        + "\n  ".join(found)
        + "\nStart such processes through a helper marked with tests.tiers.needs(...) "
        "(e.g. helpers.run_job, helpers.run_command), so the test lands in the tier that "
        "runs them."
    )
