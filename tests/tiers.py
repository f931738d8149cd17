"""The suite's three tiers: declared by every test module, kept honest at run time.

- **unit**: no JVM, no job subprocess, no Spark or HDFS: pure functions, servers on
  loopback, local storage, decoders, models, configs.
- **integration**: the session's Spark ``local-cluster`` and HDFS (the ``spark`` and ``hdfs``
  fixtures), in-process training on them.
- **e2e**: separate applications and clusters: jobs and scripts as subprocesses (README
  commands, ``--help``), a standalone cluster, YARN, an HDFS of the test's own, kill/stop runs.

Every test module says its tier at the top, after the imports::

    pytestmark = pytest.mark.unit

That is the default of its tests. A test (or class) of another tier says so itself,
``@pytest.mark.e2e``, and so may one parameter, ``pytest.param("hdfs",
marks=pytest.mark.integration)``: the closest declaration wins (the test or its parameter,
then its class, then its module). ``tests/conftest.py`` stops the collection, naming the
tests, when a test has no tier, has two at the same place, or is below integration while it
asks for the ``spark``, ``hdfs`` or ``s3`` fixture; then every test carries exactly its own tier's
marker, so ``--tier unit`` and ``-m unit`` select the same tests.

At run time every process a test starts is checked against its tier: while each of its
phases (setup, call, teardown) runs, ``subprocess.Popen`` (which all of ``subprocess`` goes
through), ``os.system`` and ``os.posix_spawn``/``posix_spawnp`` are wrapped with
``pytest.MonkeyPatch`` and put back after the phase. A Java process (``java``,
``spark-submit``) needs integration; a script of ``scripts/`` or ``bench/`` or a job of
``jobs/`` or ``examples/`` needs e2e. A test that starts more than its tier allows, or asks
for ``spark``, ``hdfs`` or ``s3`` by name (``request.getfixturevalue``) below integration, fails and
says what it used.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import subprocess
import threading
from collections.abc import Iterable
from pathlib import Path

import pytest

TIERS = ("unit", "integration", "e2e")
ROOT = Path(__file__).resolve().parent.parent

# Session fixtures that bring up the suite's shared services.
FIXTURE_TIERS = {"spark": "integration", "hdfs": "integration", "s3": "integration"}

HOW_TO_DECLARE = (
    "declare it at the top of the module (pytestmark = pytest.mark.unit, integration or e2e), "
    "or on the test, its class or its parameter (@pytest.mark.e2e): see tests/tiers.py"
)


def above(tier: str, than: str) -> bool:
    """Whether ``tier`` needs more than ``than`` allows."""
    return TIERS.index(tier) > TIERS.index(than)


# ----------------------------------------------------------------------------- declared


class TierError(Exception):
    """A test whose tier is missing, ambiguous or too low for the fixtures it asks for."""


def declared(item: pytest.Item) -> str:
    """The tier ``item`` declares: the closest node (the test with its parameters, its class,
    its module) with a tier marker."""
    for node in reversed(item.listchain()):
        found = sorted({m.name for m in node.own_markers if m.name in TIERS}, key=TIERS.index)
        if len(found) > 1:
            where = "the test" if node is item else node.nodeid
            raise TierError(f"{item.nodeid}: more than one tier on {where}: {', '.join(found)}")
        if found:
            return found[0]
    raise TierError(f"{item.nodeid}: no tier; {HOW_TO_DECLARE}")


def check_fixtures(item: pytest.Item, tier: str) -> None:
    """A test below integration must not ask for the shared services (``item.fixturenames``:
    all it asks for, however indirectly, except by name at run time)."""
    for name in fixture_violations(tier, getattr(item, "fixturenames", ())):
        raise TierError(f"{item.nodeid}: declared {tier} but uses the {name}")


def keep_only(item: pytest.Item, tier: str) -> None:
    """Leaves ``tier`` as the one tier marker of ``item``: its module's or class's default,
    overridden, would otherwise still match ``-m``. ``own_markers`` is the nodes' public
    list of markers; once the tiers of all items are known, each item gets its own tier
    marker here and its module and class none."""
    for node in item.listchain():
        node.own_markers[:] = [m for m in node.own_markers if m.name not in TIERS]
    item.add_marker(tier)


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


def _argv(args) -> list:
    """A command as a list: a shell command line split, a single program in a list."""
    if isinstance(args, str):
        try:
            return shlex.split(args)
        except ValueError:
            return [args]
    if isinstance(args, bytes | os.PathLike):
        return [args]
    return list(args)


class SpawnWatch:
    """Records the processes started while a test phase runs (``watching``), through wrappers
    of the functions that start them, installed for the phase and removed after it."""

    def __init__(self):
        self._lock = threading.Lock()
        self._local = threading.local()  # per thread: exempt, inside Popen

    def _record(self, started: list, args) -> None:
        if getattr(self._local, "exempt", False) or getattr(self._local, "in_popen", False):
            return
        try:
            argv = [str(a) for a in _argv(args)]
            tier = spawn_tier(argv)
        except Exception:  # never fail a process start over its description
            return
        if tier != "unit":
            with self._lock:
                started.append((tier, argv))

    @contextlib.contextmanager
    def watching(self):
        """Yields the list of (tier, argv) of the processes above unit started meanwhile."""
        started: list[tuple[str, list[str]]] = []
        popen_init, system = subprocess.Popen.__init__, os.system
        local = self._local

        def watched_popen_init(popen, args, *rest, **kwargs):
            self._record(started, args)
            local.in_popen = True  # Popen may use os.posix_spawn: one record
            try:
                return popen_init(popen, args, *rest, **kwargs)
            finally:
                local.in_popen = False

        def watched_system(command):
            self._record(started, command)
            return system(command)

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(subprocess.Popen, "__init__", watched_popen_init)
            patch.setattr(os, "system", watched_system)
            for name in ("posix_spawn", "posix_spawnp"):
                if hasattr(os, name):
                    patch.setattr(os, name, self._spawn_wrapper(started, getattr(os, name)))
            yield started

    def _spawn_wrapper(self, started: list, spawn):
        def watched_spawn(path, argv, *rest, **kwargs):
            self._record(started, argv)
            return spawn(path, argv, *rest, **kwargs)

        return watched_spawn

    @contextlib.contextmanager
    def exempt(self):
        """The suite's own shared services (the session HDFS and Spark) start here."""
        self._local.exempt = True
        try:
            yield
        finally:
            self._local.exempt = False


def fixture_violations(tier: str, fixtures: Iterable[str]) -> list[str]:
    """The shared services among ``fixtures`` that a test of ``tier`` may not use."""
    used = set(fixtures)
    return [
        f"{FIXTURE_TIERS[name]} fixture {name!r}"
        for name in FIXTURE_TIERS
        if name in used and above(FIXTURE_TIERS[name], tier)
    ]


def violations(tier: str, started, fixtures=()) -> list[str]:
    """What a test of ``tier`` used beyond it: the processes it started (tier, argv) and the
    shared services among the ``fixtures`` it asked for (also by name, at run time)."""
    found = [
        f"{needed} process: {' '.join(argv)[:300]}"
        for needed, argv in started
        if above(needed, tier)
    ]
    return found + fixture_violations(tier, fixtures)


def explain(item: pytest.Item, tier: str, found: list[str]) -> str:
    return (
        f"{item.nodeid} is declared {tier} but used:\n  "
        + "\n  ".join(found)
        + "\nDeclare the tier that runs such things on the test (@pytest.mark.e2e), its "
        "parameter or its module (pytestmark): see tests/tiers.py."
    )
