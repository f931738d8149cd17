"""Paths and file systems: the one package through which sparktf reads and writes files.

A path is a local path, a ``file://`` URI, an ``hdfs://host:port/path`` URI or an
``s3://bucket/key`` URI (``s3a://`` is the same store). HDFS is reached from Python through
WebHDFS (the ``hdfs`` package), S3 through boto3; Spark reaches ``hdfs://`` natively through
its own Hadoop client and ``s3a://`` through Hadoop's S3A connector. Reads and writes stream:
files are read in ranges and written through a chunked or multipart upload, never buffered
whole. ``publish`` writes a file or a directory atomically (on S3: a commit marker written
last, which readers check with ``require_committed``).

Every public name is importable from here; each lives in one module:

- :mod:`~sparktf.storage.errors`: the exceptions, all :class:`~sparktf.errors.SparktfError`;
- :mod:`~sparktf.storage.uri`: parsing paths and URIs, names derived from them;
- :mod:`~sparktf.storage.hdfs`: the NameNode's WebHDFS address, the HDFS user, the clients;
- :mod:`~sparktf.storage.s3`: S3's settings and credentials, the client, objects and streams;
- :mod:`~sparktf.storage.streams`: the file objects that stream an HDFS file;
- :mod:`~sparktf.storage.native`: bulk reads through ``hdfs-native`` (``SPARKTF_HDFS_CLIENT``);
- :mod:`~sparktf.storage.files`: opening, reading and writing files;
- :mod:`~sparktf.storage.namespace`: existence, listings, directories, deletes, renames;
- :mod:`~sparktf.storage.copies`: copies between file systems;
- :mod:`~sparktf.storage.filesystem`: fsspec file systems for pyarrow and petastorm;
- :mod:`~sparktf.storage.lock` and :mod:`~sparktf.storage.publishing`: the atomic publish.

Settings (timeouts, block sizes, the publish lock's timing) are not re-exported: each lives in
its module (``storage.hdfs.HDFS_TIMEOUT_S``, ``storage.lock.LOCK_STALE_S``, ...), which reads
it when it is used, so that is where to change it.
"""

from __future__ import annotations

from sparktf.storage.copies import copy_file, copy_tree, local_copy
from sparktf.storage.errors import (
    NameNodeUnreachableError,
    NotCommittedError,
    ObjectStoreUnreachableError,
    PathExistsError,
    PathNotFoundError,
    PublishConflictError,
    StorageError,
    StoragePermissionError,
    UnknownSchemeError,
)
from sparktf.storage.files import (
    fill,
    iter_blocks,
    open_file,
    open_scan,
    read_bytes,
    read_range,
    read_text,
    write_bytes,
    write_text,
)
from sparktf.storage.filesystem import fsspec_filesystem
from sparktf.storage.hdfs import (
    default_fs,
    hdfs_user,
    webhdfs_client,
    webhdfs_url,
)
from sparktf.storage.lock import LOCK_TAG, lock_path
from sparktf.storage.namespace import (
    delete,
    exists,
    isdir,
    listdir,
    makedirs,
    rename,
    size,
    walk_files,
)
from sparktf.storage.native import HDFS_CLIENTS, hdfs_client_kind, native_client
from sparktf.storage.publishing import COMMIT_MARKER, publish, require_committed
from sparktf.storage.streams import SeekableReader
from sparktf.storage.uri import (
    SUPPORTED_SCHEMES,
    Location,
    is_hdfs,
    is_remote,
    is_s3,
    join,
    parse,
    spark_uri,
    temp_sibling,
)

__all__ = [
    "COMMIT_MARKER",
    "HDFS_CLIENTS",
    "LOCK_TAG",
    "SUPPORTED_SCHEMES",
    "Location",
    "NameNodeUnreachableError",
    "NotCommittedError",
    "ObjectStoreUnreachableError",
    "PathExistsError",
    "PathNotFoundError",
    "PublishConflictError",
    "SeekableReader",
    "StorageError",
    "StoragePermissionError",
    "UnknownSchemeError",
    "copy_file",
    "copy_tree",
    "default_fs",
    "delete",
    "exists",
    "fsspec_filesystem",
    "hdfs_client_kind",
    "hdfs_user",
    "is_hdfs",
    "is_remote",
    "is_s3",
    "isdir",
    "iter_blocks",
    "join",
    "listdir",
    "local_copy",
    "lock_path",
    "makedirs",
    "native_client",
    "open_file",
    "fill",
    "open_scan",
    "parse",
    "publish",
    "read_bytes",
    "read_range",
    "read_text",
    "rename",
    "require_committed",
    "size",
    "spark_uri",
    "temp_sibling",
    "walk_files",
    "webhdfs_client",
    "webhdfs_url",
    "write_bytes",
    "write_text",
]
