"""fsspec file systems for sparktf paths, for the libraries that read through fsspec
(pyarrow, petastorm)."""

from __future__ import annotations

import os
from functools import lru_cache
from urllib.parse import urlparse

from sparktf.security import kerberos, redact
from sparktf.storage import hdfs
from sparktf.storage.errors import StorageError
from sparktf.storage.hdfs import (
    hdfs_user,
    webhdfs_url,
)
from sparktf.storage.uri import parse

__all__ = ["fsspec_filesystem"]


def fsspec_filesystem(path: str):
    """An fsspec file system for ``path``'s file system (for pyarrow and petastorm).

    For HDFS, fsspec's WebHDFS file system (authenticated as :func:`webhdfs_client` is:
    delegation token, SPNEGO or user name) whose files fetch each range with one streamed
    read of the response (fsspec's own reads it 10 KiB at a time) and read ahead
    ``READ_BLOCK`` bytes.
    """
    import fsspec

    loc = parse(path)
    if loc.scheme == "file":
        return fsspec.filesystem("file")
    url = urlparse(webhdfs_url(loc.netloc))
    token = os.environ.get(kerberos.TOKEN_ENV) or None  # as hdfs.webhdfs_client authenticates
    spnego = token is None and kerberos.enabled()
    if token:
        redact.add_secret(token)
    fs = _webhdfs_class()(
        host=url.hostname,
        port=url.port or 9870,
        user=None if token or spnego else hdfs_user(),
        token=token,
        use_listings_cache=False,
    )
    if spnego:
        from sparktf.security.spnego import NegotiateAuth

        redact.install()
        fs.session.auth = NegotiateAuth(kerberos.credential)
    return fs


@lru_cache(maxsize=1)
def _webhdfs_class():
    from fsspec.implementations.webhdfs import WebHDFile, WebHDFS

    class _WebHDFile(WebHDFile):
        def _fetch_range(self, start, end):
            start, end = max(start, 0), min(self.size, end)
            if start >= end:
                return b""
            out = self.fs._call(
                "OPEN", path=self.path, offset=start, length=end - start, redirect=False
            )
            if "Location" not in out.headers:
                return out.content
            location = self.fs._apply_proxy(out.headers["Location"])
            with self.fs.session.get(
                location, stream=True, timeout=(hdfs.HDFS_TIMEOUT_S, hdfs.HDFS_DATA_TIMEOUT_S)
            ) as response:
                response.raise_for_status()
                parts, want = [], end - start
                while want > 0 and (data := response.raw.read(want)):
                    parts.append(data)
                    want -= len(data)
            if want > 0:
                raise StorageError(
                    f"read {self.path} (WebHDFS): the DataNode sent {end - start - want} "
                    f"of {end - start} bytes from byte {start}"
                )
            return parts[0] if len(parts) == 1 else b"".join(parts)

    class _WebHDFS(WebHDFS):
        """fsspec's WebHDFS with streamed range reads (see ``fsspec_filesystem``)."""

        def _open(self, path, mode="rb", block_size=None, autocommit=True, **kwargs):
            if "r" not in mode:
                return super()._open(path, mode, block_size, autocommit, **kwargs)
            return _WebHDFile(
                self,
                path,
                mode=mode,
                block_size=block_size or hdfs.READ_BLOCK,
                tempdir=self.tempdir,
                autocommit=autocommit,
                **kwargs,
            )

    return _WebHDFS
