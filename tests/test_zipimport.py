"""sparktf._zipimport: zip archives on sys.path are re-read only when they changed."""

from __future__ import annotations

import sys
import zipfile
import zipimport

import pytest

from sparktf import _zipimport

pytestmark = pytest.mark.unit


@pytest.fixture
def restore_zipimport(monkeypatch):
    # monkeypatch puts Python's own method back after the test
    monkeypatch.setattr(
        zipimport.zipimporter, "invalidate_caches", zipimport.zipimporter.invalidate_caches
    )


def write_zip(path, modules):
    with zipfile.ZipFile(path, "w") as z:
        for name in modules:
            z.writestr(f"{name}.py", f"NAME = {name!r}\n")


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="Python 3.12 reads lazily itself")
def test_unchanged_archive_is_not_reread_and_a_changed_one_is(tmp_path, restore_zipimport):
    archive = tmp_path / "mods.zip"
    write_zip(archive, ["first"])
    importer = zipimport.zipimporter(str(archive))
    other = zipimport.zipimporter(str(archive))  # a second importer of the same archive
    before = importer._files
    importer.invalidate_caches()
    assert importer._files is not before  # Python 3.11's own: re-read on every call

    assert _zipimport.install() is True
    assert _zipimport.install() is False  # once
    importer.invalidate_caches()  # first call: reads and remembers the file
    other.invalidate_caches()
    read = importer._files
    importer.invalidate_caches()
    assert importer._files is read
    assert importer.find_spec("second") is None

    write_zip(archive, ["first", "second"])
    for each in (importer, other):
        each.invalidate_caches()
        assert each.find_spec("second") is not None
        assert each.find_spec("first") is not None


def test_only_pyspark_workers_are_patched(monkeypatch, restore_zipimport):
    monkeypatch.delitem(sys.modules, "pyspark.worker", raising=False)
    original = zipimport.zipimporter.invalidate_caches
    assert _zipimport.install_in_spark_worker() is False
    assert zipimport.zipimporter.invalidate_caches is original
