"""S3 and S3-compatible object stores through boto3: the client, its errors mapped onto
sparktf's, the namespace of a bucket and the streams that read and write an object without
holding it whole.

The client's settings (:mod:`sparktf.security.aws`) come the way AWS's own tools take them
(botocore's resolution, nothing of sparktf's own): the standard variables, the shared config
and credentials files and their profiles, session tokens, ``AWS_ENDPOINT_URL``. A store at
another endpoint than AWS's is addressed path-style (``http://host:port/bucket/key``), as
S3-compatible stores expect.

The secret key and the session token are registered with the redactor
(:func:`sparktf.security.redact.add_secret`) as soon as they are read, and never put on a
command line: Spark's JVMs get them as ``spark.hadoop.fs.s3a.*`` settings, which
:func:`sparktf.spark.transport.private_settings` moves into a private file.

S3 has no directories: a "directory" is a key prefix (``key/``), and :func:`makedirs`
writes an empty ``key/`` object as Hadoop's S3A connector does, so that an empty directory
exists. Nor has it renames: :func:`rename` copies on the server, then deletes; atomic for one
object, not for a prefix (:mod:`sparktf.storage.publishing` publishes without it).
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import queue
import threading
from collections.abc import Iterator
from functools import lru_cache

from sparktf.security import redact
from sparktf.security.aws import S3Settings, env_key, s3_settings, settings_for
from sparktf.storage.errors import (
    ObjectStoreUnreachableError,
    PathExistsError,
    PathNotFoundError,
    StorageError,
    StoragePermissionError,
)
from sparktf.storage.streams import ForwardScan, RangedReader, raw_into
from sparktf.storage.uri import Location

__all__ = [
    "PART_BYTES",
    "READ_BLOCK",
    "S3_DATA_TIMEOUT_S",
    "S3_TIMEOUT_S",
    "S3Object",
    "S3Reader",
    "S3Scan",
    "S3Settings",
    "S3Writer",
    "s3_client",
    "s3_settings",
]

log = logging.getLogger(__name__)

# Seconds to wait for the endpoint to accept a connection and to answer a metadata request.
S3_TIMEOUT_S = float(os.environ.get("SPARKTF_S3_TIMEOUT", "5"))
# Seconds to wait for data to flow on reads and writes.
S3_DATA_TIMEOUT_S = float(os.environ.get("SPARKTF_S3_DATA_TIMEOUT", "120"))
# Bytes of a multipart upload's part (S3's minimum is 5 MiB, its most parts 10,000: the part
# size grows by this much every 1,000 parts, so one object may reach 40 TB).
PART_BYTES = 8 << 20
READ_BLOCK = 4 << 20  # bytes a read asks a response for at once
_DELETE_BATCH = 1000  # keys per DeleteObjects request (S3's limit)

# botocore error codes, by what they mean to a caller
_MISSING = {"NoSuchKey", "404", "NotFound"}
_NO_BUCKET = {"NoSuchBucket"}
_REFUSED_KEY = {
    "SignatureDoesNotMatch",
    "InvalidAccessKeyId",
    "InvalidToken",
    "ExpiredToken",
    "TokenRefreshRequired",
    "InvalidClientTokenId",
}
_DENIED = {"AccessDenied", "403", "Forbidden", "AllAccessDisabled"}
_EXISTS = {"PreconditionFailed", "412", "ConditionalRequestConflict"}


def s3_client():
    """The boto3 S3 client (cached) of :func:`s3_settings`: path-style addressing for a
    store at another endpoint than AWS's, ``S3_TIMEOUT_S`` to connect,
    ``S3_DATA_TIMEOUT_S`` for data, botocore's standard retries."""
    return _client(env_key())


@lru_cache(maxsize=8)
def _client(env_key: tuple):
    import boto3
    from botocore.config import Config

    settings = settings_for(env_key)
    config = Config(
        connect_timeout=S3_TIMEOUT_S,
        read_timeout=S3_DATA_TIMEOUT_S,
        retries={"mode": "standard", "max_attempts": 3},
        max_pool_connections=16,
        s3={"addressing_style": "path"} if settings.path_style else None,
    )
    kwargs = {}
    if settings.access_key:
        kwargs = {
            "aws_access_key_id": settings.access_key,
            "aws_secret_access_key": settings.secret_key,
            "aws_session_token": settings.token,
        }
    redact.install()  # botocore logs requests at DEBUG
    return boto3.session.Session(profile_name=None).client(
        "s3",
        endpoint_url=settings.endpoint,
        region_name=settings.region or "us-east-1",
        config=config,
        **kwargs,
    )


def _code(exc) -> str:
    return str(getattr(exc, "response", {}).get("Error", {}).get("Code", ""))


class S3Object:
    """An object (or a key prefix) of a bucket and the requests about it, with botocore's
    errors mapped onto sparktf.storage's, each naming the endpoint, the bucket and the key."""

    def __init__(self, loc: Location):
        self.loc = loc
        self.bucket = loc.netloc
        self.key = loc.path.lstrip("/")
        self.client = s3_client()

    @property
    def prefix(self) -> str:
        """The key prefix of the "directory" this key names."""
        return self.key + "/" if self.key else ""

    def uri(self, key: str | None = None) -> str:
        return f"s3://{self.bucket}/{self.key if key is None else key}"

    @contextlib.contextmanager
    def errors(self, what: str, key: str | None = None) -> Iterator[None]:
        """Raises botocore's errors in the block as ObjectStoreUnreachableError,
        PathNotFoundError, StoragePermissionError, PathExistsError or StorageError, naming
        ``what`` was done to which key of which bucket at which endpoint."""
        from botocore import exceptions as bx

        uri = self.uri(key)
        try:
            yield
        except (bx.EndpointConnectionError, bx.ConnectTimeoutError, bx.ReadTimeoutError) as exc:
            raise ObjectStoreUnreachableError(
                f"{what} {uri}: the S3 endpoint {_where()} did not answer: {type(exc).__name__}"
            ) from exc
        except bx.NoCredentialsError as exc:
            raise StoragePermissionError(
                f"{what} {uri}: no AWS credentials found (AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY, AWS_PROFILE or ~/.aws/credentials; docs/running.md)"
            ) from exc
        except bx.ClientError as exc:
            code = _code(exc)
            message = redact.redact(str(exc.response.get("Error", {}).get("Message", "")))
            if code in _NO_BUCKET:
                raise PathNotFoundError(
                    f"{what} {uri}: no such bucket {self.bucket!r} at {_where()}"
                ) from exc
            if code in _MISSING:
                raise PathNotFoundError(f"{what}: no such object {uri}") from exc
            if code in _REFUSED_KEY:
                raise StoragePermissionError(
                    f"{what} {uri}: the S3 endpoint refused the credentials ({code}): "
                    f"{s3_settings().describe()}"
                ) from exc
            if code in _DENIED:
                raise StoragePermissionError(
                    f"{what} {uri}: access denied on bucket {self.bucket!r} ({code}; "
                    f"{s3_settings().describe()})"
                ) from exc
            if code in _EXISTS:
                raise PathExistsError(f"{what}: {uri} already exists") from exc
            raise StorageError(f"S3 {what} {uri} failed at {_where()}: {code} {message}") from exc
        except bx.BotoCoreError as exc:
            raise StorageError(
                f"S3 {what} {uri} failed at {_where()}: {redact.redact(str(exc))}"
            ) from exc

    # -- metadata --------------------------------------------------------------------------

    def head(self, key: str | None = None) -> dict | None:
        """The object's metadata (HeadObject), None when there is no such object."""
        key = self.key if key is None else key
        if not key:
            return None
        from botocore.exceptions import ClientError

        with self.errors("stat", key):
            try:
                return self.client.head_object(Bucket=self.bucket, Key=key)
            except ClientError as exc:
                if _code(exc) in _MISSING:
                    return None
                raise

    def bucket_exists(self) -> bool:
        from botocore.exceptions import ClientError

        with self.errors("stat", ""):
            try:
                self.client.head_bucket(Bucket=self.bucket)
                return True
            except ClientError as exc:
                if _code(exc) in _MISSING | _NO_BUCKET:
                    return False
                raise

    def has_children(self) -> bool:
        """Whether any object's key starts with this "directory"'s prefix (its marker too)."""
        if not self.key:
            return self.bucket_exists()
        with self.errors("list", self.prefix):
            found = self.client.list_objects_v2(Bucket=self.bucket, Prefix=self.prefix, MaxKeys=1)
        return bool(found.get("KeyCount") or found.get("Contents"))

    def list(self, *, recursive: bool = False) -> tuple[list[dict], list[str], list[str]]:
        """The objects below this prefix (``Contents`` entries, markers left out), the names
        of the sub-"directories" (without ``recursive``) and the keys of the directory
        markers (``.../``: this one's, and with ``recursive`` those below it)."""
        paginator = self.client.get_paginator("list_objects_v2")
        kwargs = {"Bucket": self.bucket, "Prefix": self.prefix}
        if not recursive:
            kwargs["Delimiter"] = "/"
        objects, dirs, markers = [], [], []
        with self.errors("list", self.prefix):
            for page in paginator.paginate(**kwargs):
                for entry in page.get("Contents", ()):
                    if entry["Key"].endswith("/") or not entry["Key"]:
                        markers.append(entry["Key"])
                    else:
                        objects.append(entry)
                for common in page.get("CommonPrefixes", ()):
                    dirs.append(common["Prefix"][len(self.prefix) : -1])
        return objects, dirs, markers

    # -- changes ---------------------------------------------------------------------------

    def put(self, data: bytes, *, key: str | None = None, exclusive: bool = False) -> None:
        """Writes one object in one request; with ``exclusive`` only if there is none
        (``If-None-Match: *``), else PathExistsError."""
        key = self.key if key is None else key
        extra = {"IfNoneMatch": "*"} if exclusive else {}
        with self.errors("write", key):
            self.client.put_object(Bucket=self.bucket, Key=key, Body=data, **extra)

    def delete_keys(self, keys: list[str]) -> None:
        """Deletes ``keys`` of the bucket, a thousand per request."""
        for start in range(0, len(keys), _DELETE_BATCH):
            batch = [{"Key": key} for key in keys[start : start + _DELETE_BATCH]]
            with self.errors("delete", batch[0]["Key"]):
                answer = self.client.delete_objects(
                    Bucket=self.bucket, Delete={"Objects": batch, "Quiet": True}
                )
            failed = answer.get("Errors") or []
            if failed:
                first = failed[0]
                raise StorageError(
                    f"delete {self.uri(first.get('Key'))}: {first.get('Code')} "
                    f"{first.get('Message')} ({len(failed)} of {len(batch)} keys not deleted)"
                )

    def copy_to(self, src_key: str, dst_key: str, size: int | None = None) -> None:
        """Copies one object on the server (a multipart copy past 5 GB)."""
        from boto3.s3.transfer import TransferConfig

        source = {"Bucket": self.bucket, "Key": src_key}
        with self.errors("copy", src_key):
            if size is not None and size < (5 << 30):
                self.client.copy_object(Bucket=self.bucket, Key=dst_key, CopySource=source)
            else:
                config = TransferConfig(multipart_chunksize=256 << 20)
                self.client.copy(source, self.bucket, dst_key, Config=config)

    def touch(self) -> None:
        """Sets the object's modification time to now: a copy onto itself."""
        with self.errors("touch", self.key):
            head = self.client.head_object(Bucket=self.bucket, Key=self.key)
            self.client.copy_object(
                Bucket=self.bucket,
                Key=self.key,
                CopySource={"Bucket": self.bucket, "Key": self.key},
                Metadata=head.get("Metadata", {}),
                MetadataDirective="REPLACE",
            )

    def abort_uploads(self, prefix: str) -> int:
        """Aborts the multipart uploads under ``prefix`` (a writer that died left their parts
        stored); returns how many."""
        aborted = 0
        paginator = self.client.get_paginator("list_multipart_uploads")
        with self.errors("list uploads", prefix):
            for page in paginator.paginate(Bucket=self.bucket, Prefix=prefix):
                for upload in page.get("Uploads", ()):
                    self.client.abort_multipart_upload(
                        Bucket=self.bucket, Key=upload["Key"], UploadId=upload["UploadId"]
                    )
                    aborted += 1
        return aborted


def _where() -> str:
    settings = s3_settings()
    return settings.endpoint or f"AWS S3 ({settings.region or 'default region'})"


# -- streams -------------------------------------------------------------------------------


class S3Reader(RangedReader):
    """A seekable, read-only object (:class:`~sparktf.storage.streams.RangedReader`): ranged
    GETs from the position reached."""

    def __init__(self, obj: S3Object, size: int):
        super().__init__(size)
        self._obj, self._name = obj, obj.uri()

    def _open_at(self, pos: int):
        answer = self._obj.client.get_object(
            Bucket=self._obj.bucket, Key=self._obj.key, Range=f"bytes={pos}-"
        )
        return answer["Body"]

    def _errors(self, what: str):
        return self._obj.errors(what)


class S3Scan(ForwardScan):
    """A forward-only read of an object (:class:`~sparktf.storage.streams.ForwardScan`): one
    ranged GET, no HEAD first."""

    def __init__(self, obj: S3Object, offset: int = 0, length: int | None = None):
        super().__init__(offset, length)
        self._obj, self._name = obj, obj.uri()

    def _open(self) -> tuple:
        if self._end is not None and self._end <= self._pos:
            return None, None, None  # nothing to ask for
        last = "" if self._end is None else str(self._end - 1)
        answer = self._obj.client.get_object(
            Bucket=self._obj.bucket, Key=self._obj.key, Range=f"bytes={self._pos}-{last}"
        )
        body = answer["Body"]
        raw = getattr(body, "_raw_stream", None)
        into = raw_into(raw) if raw is not None else body.readinto
        return body, into, self._pos + int(answer.get("ContentLength", 0) or 0)

    def _errors(self, what: str):
        return self._obj.errors(what)


class S3Writer(io.RawIOBase):
    """A write-only object. Up to one part (``PART_BYTES``) it is one PutObject at
    :meth:`close`; past that a multipart upload whose parts go up from a background thread
    while the next ones are written. :meth:`abort` (and any failure) aborts the upload, so no
    part stays stored and no object appears; the object appears whole at :meth:`close`.
    Without ``overwrite`` it is created only where there is none (``If-None-Match: *``)."""

    def __init__(self, obj: S3Object, *, overwrite: bool = True):
        self._obj, self._overwrite = obj, overwrite
        self._buffer = bytearray()
        self._parts: list[dict] = []
        self._upload_id: str | None = None
        self._queue: queue.Queue = queue.Queue(maxsize=2)
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def writable(self) -> bool:
        return True

    def _part_bytes(self) -> int:
        return PART_BYTES * (1 + len(self._parts) // 1000)

    def write(self, data) -> int:
        if self._error is not None:
            raise self._error
        self._buffer += data
        while len(self._buffer) >= self._part_bytes() + PART_BYTES:  # keep a part for close
            size = self._part_bytes()
            self._send(bytes(self._buffer[:size]))
            del self._buffer[:size]
        return len(data)

    def _send(self, part: bytes) -> None:
        if self._upload_id is None:
            with self._obj.errors("write"):
                answer = self._obj.client.create_multipart_upload(
                    Bucket=self._obj.bucket, Key=self._obj.key
                )
            self._upload_id = answer["UploadId"]
            self._thread = threading.Thread(
                target=self._upload, daemon=True, name=f"s3-write {self._obj.uri()}"
            )
            self._thread.start()
        number = len(self._parts) + 1
        self._parts.append({"PartNumber": number})
        self._queue.put((number, part))
        if self._error is not None:
            raise self._error

    def _upload(self) -> None:
        while (item := self._queue.get()) is not None:
            if self._error is not None:
                continue  # drain: the writing thread never blocks
            number, part = item
            try:
                with self._obj.errors("write"):
                    answer = self._obj.client.upload_part(
                        Bucket=self._obj.bucket,
                        Key=self._obj.key,
                        UploadId=self._upload_id,
                        PartNumber=number,
                        Body=part,
                    )
                self._parts[number - 1]["ETag"] = answer["ETag"]
            except BaseException as exc:  # raised in the writing thread
                self._error = exc

    def _join(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None

    def abort(self) -> None:
        """Drops what was written: the multipart upload (if any) is aborted, no object
        appears. The writer is closed."""
        if self.closed:
            return
        self._buffer.clear()
        self._join()
        self._abort_upload()
        super().close()

    def _abort_upload(self) -> None:
        if self._upload_id is None:
            return
        upload_id, self._upload_id = self._upload_id, None
        try:
            with self._obj.errors("abort upload"):
                self._obj.client.abort_multipart_upload(
                    Bucket=self._obj.bucket, Key=self._obj.key, UploadId=upload_id
                )
        except StorageError as exc:  # its parts stay until the next publish's clean-up
            log.warning("could not abort the upload of %s: %s", self._obj.uri(), exc)

    def close(self) -> None:
        if self.closed:
            return
        try:
            extra = {} if self._overwrite else {"IfNoneMatch": "*"}
            if self._upload_id is None:
                self._obj.put(bytes(self._buffer), exclusive=not self._overwrite)
            else:
                if self._buffer:
                    self._send(bytes(self._buffer))
                self._join()
                if self._error is not None:
                    raise self._error
                with self._obj.errors("write"):
                    self._obj.client.complete_multipart_upload(
                        Bucket=self._obj.bucket,
                        Key=self._obj.key,
                        UploadId=self._upload_id,
                        MultipartUpload={"Parts": self._parts},
                        **extra,
                    )
                self._upload_id = None
        except BaseException:
            self._buffer.clear()
            self._join()
            self._abort_upload()
            raise
        finally:
            self._buffer.clear()
            super().close()


class AbortingWriter(io.BufferedWriter):
    """A buffered :class:`S3Writer` that aborts the upload when its ``with`` block raises
    (a plain buffered writer would complete it, publishing a truncated object)."""

    def __exit__(self, kind, value, traceback):
        if kind is not None:
            with contextlib.suppress(Exception):
                self.raw.abort()
        return super().__exit__(kind, value, traceback)


class AbortingText(io.TextIOWrapper):
    """:class:`AbortingWriter`'s text form."""

    def __exit__(self, kind, value, traceback):
        if kind is not None:
            with contextlib.suppress(Exception):
                self.buffer.raw.abort()
        return super().__exit__(kind, value, traceback)
