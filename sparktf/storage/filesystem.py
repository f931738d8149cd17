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

    For S3, pyarrow's S3 file system behind fsspec's ``ArrowFSWrapper`` (paths
    ``bucket/key``), with the endpoint, region and credentials of sparktf's own S3 client
    (:func:`sparktf.security.aws.s3_settings`): s3fs, what fsspec would use, pins a botocore
    that boto3 cannot share. For HDFS, fsspec's WebHDFS file system (authenticated as
    :func:`webhdfs_client` is: delegation token, SPNEGO or user name) whose files fetch each
    range with one streamed read of the response (fsspec's own reads it 10 KiB at a time)
    and read ahead ``READ_BLOCK`` bytes.
    """
    import fsspec

    loc = parse(path)
    if loc.scheme == "file":
        return fsspec.filesystem("file")
    if loc.scheme == "s3":
        return _s3_filesystem()
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


def _s3_filesystem():
    from pyarrow import fs as pafs

    from sparktf.security.aws import s3_settings
    from sparktf.storage.s3 import S3_DATA_TIMEOUT_S, S3_TIMEOUT_S

    settings = s3_settings()
    options = {
        "region": settings.region or "us-east-1",
        "access_key": settings.access_key,
        "secret_key": settings.secret_key,
        "session_token": settings.token,
        "connect_timeout": S3_TIMEOUT_S,
        "request_timeout": S3_DATA_TIMEOUT_S,
    }
    if settings.endpoint:  # addressed path-style, as pyarrow does with an endpoint given
        endpoint = urlparse(settings.endpoint)
        options.update(endpoint_override=endpoint.netloc, scheme=endpoint.scheme or "https")
    return _s3_wrapper_class()(pafs.S3FileSystem(**{k: v for k, v in options.items() if v}))


@lru_cache(maxsize=1)
def _s3_wrapper_class():
    from fsspec.implementations.arrow import ArrowFSWrapper

    class _S3Paths(ArrowFSWrapper):
        """``bucket/key`` paths, also written ``/bucket/key``: petastorm hands its file system
        the path of a ``file://`` URL, the one scheme it strips without s3fs."""

        @classmethod
        def _strip_protocol(cls, path):
            return super()._strip_protocol(path).lstrip("/")

    return _S3Paths


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
