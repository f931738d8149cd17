"""The driver's Python environment as one archive for the executors (``sparktf submit --ship-env``).

:func:`pack` packs a virtual environment (``python -m venv`` or virtualenv) with ``venv-pack``
into ``CACHE_DIR/env-KEY.FMT``, once per set of installed packages (:func:`environment_key`);
:func:`submit_args` gives the spark-submit arguments that unpack it as ``./environment`` in
every executor's working directory (YARN, Kubernetes, standalone) and run the Python workers
with its interpreter::

    archive = shipenv.pack(Path("~/.cache/sparktf/envs").expanduser())
    cmd = ["spark-submit", *shipenv.submit_args(archive), "jobs/train_resnet.py", ...]

What is packed: every file of the prefix but the Spark jars of its ``pyspark``
(``site-packages/pyspark/jars``, hundreds of MB: executors run Spark's own JVM, with jars from the
cluster's Spark or ``spark.yarn.jars``, never the Python package's), TensorFlow's C++ headers
(``site-packages/tensorflow/include``: for building custom ops, never read by a running
TensorFlow), the test extra's SeaweedFS server (``bin/weed``) and venv-pack's own exclusions
(``activate`` scripts, replaced by relocatable ones). ``__pycache__`` stays: without it every
Python worker would compile the modules it imports (TensorFlow's thousands) again.

The archive is built under a temporary name in the cache directory and renamed into place
when complete, so a killed pack never leaves a partial archive under the final name; one pack
at a time per cache directory (a lock file), and the temporary files of killed packs are
removed by the next one. The cache directory is private (0700): an archive planted there would
run on every executor. Old archives are never removed; delete them by hand.

Limitation: a venv's ``bin/python`` is a symbolic link to its base interpreter (``home`` in
``pyvenv.cfg``), and the archive keeps that link, so every executor node needs the same Python
at the same absolute path (or ship a relocatable environment, e.g. conda-pack's, yourself).
Editable installs (``pip install -e``) keep pointing at the driver's source tree: ship that
code with ``--py-files`` as usual.

Formats (docs/performance.md has their sizes and times): ``tar.gz`` (the default; gzip
level 1) unpacks everywhere: YARN and Spark's own ``--archives`` (standalone, Kubernetes,
local) extract it with the system ``tar``. ``tar`` packs faster into an archive about three
times larger, but only YARN extracts it with the system ``tar``: Spark extracts ``.tar`` with
Hadoop's Java untar, which refuses ``bin/python3.11``, a link to an absolute path outside the
archive ("would create entry outside of ..."), so use it on YARN only, where it also saves
the executors the gunzip at the cost of moving more bytes on every submit.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.metadata
import logging
import os
import re
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from sparktf import paths
from sparktf.errors import SparktfError, SparktfValueError

__all__ = [
    "content_digest",
    "shared_copy",
    "COMPRESS_LEVEL",
    "DEFAULT_FORMAT",
    "ENV_DIR",
    "EXCLUDES",
    "FORMATS",
    "ShipEnvError",
    "environment_key",
    "pack",
    "submit_args",
]

log = logging.getLogger(__name__)

FORMATS = ("tar", "tar.gz")
# "tar.gz": the one format every cluster manager unpacks with its links (see above).
DEFAULT_FORMAT = "tar.gz"
# Paths (relative to the prefix, fnmatch patterns) that executors never use: Spark's jars (the
# executors' JVM has its own), TensorFlow's C++ headers (for compiling custom ops: 430 MB,
# 18,000 of the venv's 44,000 files, each one unpacked and chmod-ed on every node) and the
# test extra's SeaweedFS server (bin/weed, 150 MB: scripts/s3.sh's local object store).
EXCLUDES = (
    "lib/python*/site-packages/pyspark/jars/*",
    "lib/python*/site-packages/tensorflow/include/*",
    "bin/weed",
)
# gzip level of "tar.gz": 1 packs markedly faster than venv-pack's default 4 for an archive
# slightly larger (docs/performance.md).
COMPRESS_LEVEL = 1
ENV_DIR = "environment"  # the name of the unpacked archive in each executor's working directory

_TMP_SUFFIX = ".tmp"
_LOCK_NAME = ".lock"


class ShipEnvError(SparktfError, RuntimeError):
    """The environment cannot be packed (not a virtual environment, an unsafe cache directory,
    venv-pack missing or refusing it)."""


def _venv(prefix: str | Path) -> tuple[Path, dict[str, str]]:
    """The absolute prefix and its ``pyvenv.cfg``; ShipEnvError unless it is a virtual
    environment."""
    root = Path(prefix).absolute()
    cfg = root / "pyvenv.cfg"
    if not cfg.is_file():
        raise ShipEnvError(
            f"{root} is not a virtual environment (no pyvenv.cfg): --ship-env packs the "
            "driver's venv for the executors. Run from one (python -m venv .venv, install your "
            "packages, run with .venv/bin/python), or ship an environment yourself with "
            "--archives ENV.tar.gz#environment --conf spark.pyspark.python=./environment/bin/python"
        )
    values = {}
    for line in cfg.read_text(encoding="utf-8", errors="replace").splitlines():
        key, sep, value = line.partition("=")
        if sep:
            values[key.strip().lower()] = value.strip()
    return root, values


def _site_packages(root: Path) -> list[Path]:
    return sorted(p for p in root.glob("lib/python*/site-packages") if p.is_dir())


def environment_key(prefix: str | Path = sys.prefix) -> str:
    """A short hash (16 hex digits) of what is installed in the virtual environment at
    ``prefix``: the sorted ``name==version`` of every distribution in its site-packages, its
    Python version and base interpreter (``pyvenv.cfg``), and :data:`EXCLUDES`. The same
    packages give the same key; another version of any package, another key. Files changed in
    place (same version) do not change it."""
    root, cfg = _venv(prefix)
    site = _site_packages(root)
    dists = sorted(
        f"{_normalize(dist.metadata.get('Name') or '?')}=={dist.version}"
        for dist in importlib.metadata.distributions(path=[str(p) for p in site])
    )
    python = cfg.get("version") or cfg.get("version_info") or ",".join(p.parent.name for p in site)
    text = "\n".join(
        [f"python {python}", f"home {cfg.get('home', '')}", f"exclude {' '.join(EXCLUDES)}"] + dists
    )
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _normalize(name: str) -> str:
    """A distribution name as PEP 503 compares them (``Foo_Bar`` is ``foo-bar``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def pack(cache_dir: Path, prefix: str | Path = sys.prefix, *, fmt: str = DEFAULT_FORMAT) -> Path:
    """The archive of the virtual environment at ``prefix`` in ``cache_dir``
    (``env-KEY.FMT``, ``KEY`` from :func:`environment_key`), packed only when absent.

    ``fmt`` is ``"tar.gz"`` (every cluster manager) or ``"tar"`` (YARN only: faster to pack,
    three times larger; see the module's docstring). ``cache_dir`` is created 0700 if
    missing. ShipEnvError if it is a symbolic link, not owned by this user or writable by
    others, if ``prefix`` is not a virtual environment, or if venv-pack refuses it (e.g. an
    editable install listed in a ``.pth`` file as a path outside the environment)."""
    if fmt not in FORMATS:
        raise SparktfValueError(f"unknown archive format {fmt!r}; one of {', '.join(FORMATS)}")
    root, cfg = _venv(prefix)
    key = environment_key(root)
    cache = _private_dir(Path(cache_dir))
    final = cache / f"env-{key}.{fmt}"
    if final.is_file():  # the common case: no lock needed to read a complete archive
        log.debug("environment %s already packed: %s", root, final)
        return final
    with _locked(cache):
        if final.is_file():  # packed by another process while this one waited
            return final
        _remove_stale(cache)
        if cfg.get("include-system-site-packages", "").lower() == "true":
            log.warning(
                "%s includes the system site-packages (include-system-site-packages = true): "
                "they are not packed; executors see their own",
                root,
            )
        tmp = cache / f".{final.name}.{uuid.uuid4().hex[:8]}{_TMP_SUFFIX}"
        try:
            _write(root, tmp, fmt)
            os.replace(tmp, final)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
    return final


def submit_args(archive: str | Path) -> list[str]:
    """spark-submit arguments that unpack ``archive`` as ``./environment`` on every executor
    and run the PySpark workers with its interpreter."""
    return [
        "--archives",
        f"{archive}#{ENV_DIR}",
        "--conf",
        f"spark.pyspark.python=./{ENV_DIR}/bin/python",
    ]


def content_digest(archive: Path) -> str:
    """The sha256 of ``archive`` (hex), kept beside it in ``ARCHIVE.sha256`` with the size and
    modification time it was computed for, so that later submits do not read it again."""
    stat = archive.stat()
    side = archive.with_name(archive.name + ".sha256")
    stamp = f"{stat.st_size} {stat.st_mtime_ns}"
    with contextlib.suppress(OSError, ValueError):
        digest, recorded = side.read_text().split(" ", 1)
        if recorded.strip() == stamp and len(digest) == 64:
            return digest
    sha = hashlib.sha256()
    with open(archive, "rb") as f:
        while block := f.read(8 << 20):
            sha.update(block)
    tmp = side.with_name(f".{side.name}.{uuid.uuid4().hex[:8]}{_TMP_SUFFIX}")
    tmp.write_text(f"{sha.hexdigest()} {stamp}\n")
    os.replace(tmp, side)
    return sha.hexdigest()


def shared_copy(archive: Path, directory: str) -> str:
    """``archive`` in ``directory`` of a shared file system (HDFS, S3), named by its content
    (``env-SHA256.FMT``, the first 32 hex digits), copied there once and published whole.

    A copy found there is used only when its own bytes hash to the archive's sha256: one
    that does not (cut short, altered) is replaced. Two first submits may copy at once: the
    one that publishes second uses the first one's copy once it has checked it. Costs one
    read of the shared copy per submit (about 3 s for 0.9 GB over WebHDFS on loopback).
    Raises ShipEnvError when the copy cannot be published or checked."""
    from sparktf import storage

    want = content_digest(archive)
    fmt = next(f for f in sorted(FORMATS, key=len, reverse=True) if archive.name.endswith(f))
    target = f"{directory.rstrip('/')}/env-{want[:32]}.{fmt}"
    if storage.exists(target):
        if _digest_of(target) == want:
            log.info("environment on the cluster: %s (sha256 checked)", target)
            return target
        log.warning("%s does not hold the packed environment (sha256 differs): replaced", target)
        storage.delete(target)
    log.info("copying the environment to %s (once)", target)
    storage.makedirs(directory)
    tmp = storage.temp_sibling(target)
    try:
        storage.copy_file(str(archive), tmp)
        try:
            storage.rename(tmp, target)
        except storage.StorageError:  # another submit published it in the meantime?
            # (HDFS refuses a rename onto an existing file without saying why)
            if not storage.exists(target):
                raise
            if _digest_of(target) != want:
                raise ShipEnvError(
                    f"{target} appeared while this submit copied the environment, and its "
                    "sha256 is not the archive's: remove it and submit again"
                ) from None
    finally:
        storage.delete(tmp)  # nothing left when the copy failed or lost the race
    return target


def _digest_of(path: str) -> str:
    from sparktf import storage

    sha = hashlib.sha256()
    for block in storage.iter_blocks(path):
        sha.update(block)
    return sha.hexdigest()


def _write(root: Path, out: Path, fmt: str) -> None:
    """Packs ``root`` into the new file ``out`` with venv-pack (its ``Env`` and archive writer
    directly: ``venv_pack.pack`` writes a temporary file under ``$TMPDIR`` first, which a
    killed pack would leave behind and which costs a copy of gigabytes where ``$TMPDIR`` is on
    another file system)."""
    try:
        from venv_pack.core import Env, Packer, VenvPackException
        from venv_pack.formats import archive
    except ImportError as exc:
        raise ShipEnvError(
            "--ship-env needs venv-pack in the driver's environment: pip install venv-pack==0.2.0"
        ) from exc
    start = time.monotonic()
    try:
        env = Env(prefix=str(root))
        for pattern in EXCLUDES:
            env = env.exclude(pattern)
        log.info("packing %s (%d files) into %s", root, len(env.files), out.parent)
        fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as f:
            with archive(f, fmt, compress_level=COMPRESS_LEVEL) as arc:
                packer = Packer(env._context, arc, None)  # no python_prefix: links kept as is
                for file in env.files:
                    packer.add(file)
                packer.finish()
            f.flush()
            os.fsync(f.fileno())  # complete on disk before it gets the final name
    except VenvPackException as exc:
        raise ShipEnvError(f"venv-pack cannot pack {root}: {exc}") from exc
    log.info(
        "packed %s: %.0f MB in %.1f s", root, out.stat().st_size / 1e6, time.monotonic() - start
    )


def _private_dir(path: Path) -> Path:
    """``path``, created 0700 if missing; ShipEnvError unless it is a real directory owned by
    this user that no one else can write."""
    path = path.expanduser().absolute()
    problem = paths.private_dir_problem(path)
    if problem:
        raise ShipEnvError(
            f"environment cache directory {path} {problem}: refusing to use it, since an "
            "archive placed there would run on every executor. Remove it or use another one"
        )
    return path


@contextlib.contextmanager
def _locked(cache: Path) -> Iterator[None]:
    """Holds the cache directory's lock (released by the system if the process dies)."""
    fd = os.open(cache / _LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _remove_stale(cache: Path) -> None:
    """Removes the temporary archives of killed packs (called with the lock held, so no pack
    is writing one)."""
    for stale in cache.glob(f".env-*{_TMP_SUFFIX}"):
        log.info("removing %s, left by an interrupted pack", stale)
        with contextlib.suppress(FileNotFoundError):
            stale.unlink()
