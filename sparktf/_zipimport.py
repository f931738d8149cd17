"""Python 3.11's ``zipimport`` re-reads every zip archive on ``sys.path`` whenever
``importlib.invalidate_caches()`` runs (CPython gh-103200, fixed in 3.12 only). PySpark's
worker calls it before every task, and its workers have ``pyspark.zip`` and the
``spark-core`` jar on ``sys.path``, so every task pays for re-reading them, which is most
of a tiny task's cost (docs/performance.md has the figures).

:func:`install` makes ``zipimporter.invalidate_caches`` re-read an archive only when its
file changed (size, mtime or inode), which is what the cache exists for. ``import sparktf``
installs it in PySpark worker processes only (where ``pyspark.worker`` is loaded): the
driver and other programs keep Python's own behaviour.
"""

from __future__ import annotations

import os
import sys
import zipimport

_MARK = "_sparktf_stat_checked"
_STAMP = "_sparktf_stamp"  # on each zipimporter: the archive's stamp when it last read it


def _stamp(path: str) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


def install() -> bool:
    """Patches ``zipimport.zipimporter.invalidate_caches`` (Python < 3.12); True if it did."""
    cls = zipimport.zipimporter
    original = cls.invalidate_caches
    if sys.version_info >= (3, 12) or getattr(original, _MARK, False):
        return False

    def invalidate_caches(self) -> None:
        # per importer: several may hold the same archive, each with its own file list
        stamp = _stamp(self.archive)
        if stamp is not None and getattr(self, _STAMP, None) == stamp:
            return
        original(self)
        setattr(self, _STAMP, stamp)

    setattr(invalidate_caches, _MARK, True)
    invalidate_caches.__doc__ = original.__doc__
    cls.invalidate_caches = invalidate_caches
    return True


def install_in_spark_worker() -> bool:
    """:func:`install` if this process is a PySpark worker (forked by ``pyspark.daemon``,
    or ``python -m pyspark.worker`` when Spark runs without the daemon)."""
    main = getattr(sys.modules.get("__main__"), "__spec__", None)
    worker = "pyspark.worker" in sys.modules or getattr(main, "name", "") == "pyspark.worker"
    return worker and install()
