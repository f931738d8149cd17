"""sparktf.console.shipenv: packing the driver's venv for the executors (``--ship-env``).

Real virtual environments (``python -m venv --without-pip`` in tmp_path, a fake distribution
dropped into site-packages), real archives unpacked with the system ``tar`` (as YARN and
Spark do) and the unpacked interpreter run; no Spark, no Java.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from sparktf.console import shipenv
from sparktf.console.shipenv import ShipEnvError

pytestmark = pytest.mark.unit

BASE_PYTHON = getattr(sys, "_base_executable", None) or sys.executable
PY = f"python{sys.version_info.major}.{sys.version_info.minor}"


def site_packages(prefix: Path) -> Path:
    return prefix / "lib" / PY / "site-packages"


def set_foo(prefix: Path, version: str) -> None:
    """Installs (or replaces) the fake distribution ``foo`` at ``version``."""
    site = site_packages(prefix)
    for old in site.glob("foo-*.dist-info"):
        for f in old.iterdir():
            f.unlink()
        old.rmdir()
    info = site / f"foo-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: foo\nVersion: {version}\n")
    (site / "foo").mkdir(exist_ok=True)
    (site / "foo" / "__init__.py").write_text(f"VERSION = {version!r}\n")


@pytest.fixture
def venv(tmp_path) -> Path:
    prefix = tmp_path / "venv"
    subprocess.run([BASE_PYTHON, "-m", "venv", "--without-pip", str(prefix)], check=True)
    set_foo(prefix, "1.0")
    return prefix


def env_without_python() -> dict[str, str]:
    """This environment without the variables that would point a Python at this one's."""
    drop = {"PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP"}
    return {k: v for k, v in os.environ.items() if k not in drop}


def test_key_follows_installed_versions(venv):
    key = shipenv.environment_key(venv)
    assert len(key) == 16 and int(key, 16) >= 0
    assert shipenv.environment_key(venv) == key
    set_foo(venv, "1.1")
    assert shipenv.environment_key(venv) != key
    set_foo(venv, "1.0")
    assert shipenv.environment_key(str(venv)) == key


def test_key_counts_every_distribution(venv):
    key = shipenv.environment_key(venv)
    info = site_packages(venv) / "bar-2.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: bar\nVersion: 2.0\n")
    assert shipenv.environment_key(venv) != key


def test_pack_once_per_key(venv, tmp_path, monkeypatch):
    cache = tmp_path / "cache" / "envs"
    archive = shipenv.pack(cache, venv, fmt="tar")
    assert archive == cache / f"env-{shipenv.environment_key(venv)}.tar"
    assert archive.is_file()
    assert stat.S_IMODE(os.stat(cache).st_mode) == 0o700
    mtime = archive.stat().st_mtime_ns

    def no_rebuild(*args):
        raise AssertionError("packed again")

    with monkeypatch.context() as m:
        m.setattr(shipenv, "_write", no_rebuild)
        assert shipenv.pack(cache, venv, fmt="tar") == archive
    assert archive.stat().st_mtime_ns == mtime

    set_foo(venv, "1.1")  # another package set: another archive beside the first
    other = shipenv.pack(cache, venv, fmt="tar")
    assert other != archive and other.is_file() and archive.is_file()


@pytest.mark.parametrize("fmt", ["tar", "tar.gz"])
def test_archive_runs_where_unpacked(venv, tmp_path, fmt):
    pyspark = site_packages(venv) / "pyspark"
    (pyspark / "jars").mkdir(parents=True)
    (pyspark / "__init__.py").write_text("")
    (pyspark / "jars" / "spark-core.jar").write_bytes(b"jar")
    tensorflow = site_packages(venv) / "tensorflow"
    (tensorflow / "include" / "tensorflow").mkdir(parents=True)
    (tensorflow / "__init__.py").write_text("")
    (tensorflow / "include" / "tensorflow" / "op.h").write_text("// header")
    (venv / "bin" / "weed").write_bytes(b"\x7fELF")  # the test extra's object store
    archive = shipenv.pack(tmp_path / "cache", venv, fmt=fmt)
    assert archive.name.endswith(f".{fmt}")
    with tarfile.open(archive) as tar:
        names = set(tar.getnames())
    assert f"lib/{PY}/site-packages/foo/__init__.py" in names
    assert f"lib/{PY}/site-packages/pyspark/__init__.py" in names
    assert not any("pyspark/jars" in n for n in names), "Spark's jars are executor-side"
    assert f"lib/{PY}/site-packages/tensorflow/__init__.py" in names
    assert not any("tensorflow/include" in n for n in names), "headers build ops, never run"
    assert "bin/weed" not in names, "the test extra's SeaweedFS server is not shipped"

    # As on an executor: unpacked under ./environment, the original venv gone.
    work = tmp_path / "container"
    (work / "environment").mkdir(parents=True)
    subprocess.run(["tar", "xf", str(archive), "-C", str(work / "environment")], check=True)
    shutil.rmtree(venv)

    code = "import sys, foo; print(sys.prefix); print(foo.VERSION)"
    out = subprocess.run(
        ["./environment/bin/python", "-c", code],
        cwd=work,
        env=env_without_python(),
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\n")
    prefix = Path(out[0]).resolve()
    assert prefix == (work / "environment").resolve(), out
    assert out[1] == "1.0"
    assert shipenv.submit_args(archive)[1] == f"{archive}#environment"


def test_not_a_venv(tmp_path):
    plain = tmp_path / "plain-python"
    (plain / "lib" / PY / "site-packages").mkdir(parents=True)
    with pytest.raises(ShipEnvError, match="not a virtual environment") as exc:
        shipenv.pack(tmp_path / "cache", plain)
    assert str(plain) in str(exc.value) and "--archives" in str(exc.value)
    with pytest.raises(ShipEnvError, match=str(plain)):
        shipenv.environment_key(plain)
    assert not (tmp_path / "cache").exists()


def test_stale_temp_removed(venv, tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    stale = cache / ".env-0123456789abcdef.tar.1a2b3c4d.tmp"
    stale.write_bytes(b"half an archive")
    mine = cache / "notes.txt"  # not ours: kept
    mine.write_text("x")
    archive = shipenv.pack(cache, venv)
    assert not stale.exists()
    assert mine.exists() and archive.is_file()
    assert archive.name.endswith(".tar.gz")  # the default: every cluster manager unpacks it


def test_failed_pack_leaves_nothing(venv, tmp_path, monkeypatch):
    from venv_pack.core import Packer

    calls = []

    def killed(self, file):
        calls.append(file)
        if len(calls) == 3:
            raise KeyboardInterrupt  # as a Ctrl-C mid-pack

    monkeypatch.setattr(Packer, "add", killed)
    cache = tmp_path / "cache"
    with pytest.raises(KeyboardInterrupt):
        shipenv.pack(cache, venv, fmt="tar")
    assert sorted(p.name for p in cache.iterdir()) == [".lock"]


def test_unsafe_cache_dir(venv, tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(ShipEnvError, match="writable by other users"):
        shipenv.pack(shared, venv)
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "cache-elsewhere")
    (tmp_path / "cache-elsewhere").mkdir(mode=0o700)
    with pytest.raises(ShipEnvError, match="symbolic link"):
        shipenv.pack(link, venv)


def test_unknown_format(venv, tmp_path):
    with pytest.raises(ValueError, match="zip"):
        shipenv.pack(tmp_path / "cache", venv, fmt="zip")


def test_submit_args():
    assert shipenv.submit_args(Path("/c/env-0123456789abcdef.tar")) == [
        "--archives",
        "/c/env-0123456789abcdef.tar#environment",
        "--conf",
        "spark.pyspark.python=./environment/bin/python",
    ]


@pytest.mark.integration
def test_the_shared_copy_is_named_and_checked_by_content(hdfs, tmp_path, monkeypatch):
    """On the cluster's HDFS the environment is named by its sha256, a copy that does not
    hash the same is replaced rather than trusted by its name, and two first submits racing
    end with one checked copy."""
    import threading

    from sparktf import storage

    archive = tmp_path / "env-0123456789abcdef.tar.gz"
    archive.write_bytes(os.urandom(300_000))
    digest = shipenv.content_digest(archive)
    assert (tmp_path / (archive.name + ".sha256")).read_text().startswith(digest)
    envs = hdfs.path("shipenv-test", "envs")
    storage.delete(envs)

    first = shipenv.shared_copy(archive, envs)
    assert first == f"{envs}/env-{digest[:32]}.tar.gz"
    assert storage.size(first) == archive.stat().st_size
    # the same name, other bytes (cut short, or put there by someone else): not used
    with storage.open_file(first, "wb") as f:
        f.write(b"not the environment")
    assert shipenv.shared_copy(archive, envs) == first
    assert b"".join(storage.iter_blocks(first)) == archive.read_bytes()

    storage.delete(envs)  # two first submits at once
    results, failures = [], []

    def submit():
        try:
            results.append(shipenv.shared_copy(archive, envs))
        except Exception as exc:  # reported below
            failures.append(exc)

    threads = [threading.Thread(target=submit) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == [] and results == [first, first]
    assert storage.listdir(envs) == [first]  # no temporary copy left
    assert b"".join(storage.iter_blocks(first)) == archive.read_bytes()
    storage.delete(hdfs.path("shipenv-test"))
