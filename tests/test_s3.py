"""S3 in sparktf.storage: ``s3://``/``s3a://`` URIs, credentials resolved as AWS's tools do
and kept out of logs (unit), and a real object store (SeaweedFS, the ``s3`` fixture:
scripts/s3.sh) for the namespace, streams, multipart uploads and their aborts, conditional
writes, publishing with a commit marker, and errors that name the endpoint and bucket."""

from __future__ import annotations

import json
import logging
import os
import time

import pytest

from sparktf import storage
from sparktf.security import redact
from sparktf.storage import publishing, uri
from sparktf.storage import s3 as backend

pytestmark = pytest.mark.unit  # tests of another tier carry their own mark


# ----------------------------------------------------------------------------- URIs


@pytest.mark.parametrize(
    "text, bucket, path",
    [
        ("s3://bkt/a/b", "bkt", "/a/b"),
        ("s3a://bkt/a//b/", "bkt", "/a/b"),
        ("S3A://my.bucket-1/x", "my.bucket-1", "/x"),
        ("s3://bkt", "bkt", "/"),
    ],
)
def test_s3_and_s3a_uris_name_the_same_object(text, bucket, path):
    loc = uri.parse(text)
    assert (loc.scheme, loc.netloc, loc.path) == ("s3", bucket, path)
    assert uri.is_s3(text) and uri.is_remote(text) and not uri.is_hdfs(text)
    assert loc.uri == f"s3://{bucket}{path}"
    assert uri.spark_uri(text) == f"s3a://{bucket}{path}"  # Hadoop's S3A connector


def test_s3_uri_joins_siblings_and_temporaries_stay_in_the_bucket():
    assert uri.join("s3://bkt/data", "train", "x.parquet") == "s3://bkt/data/train/x.parquet"
    tmp = uri.temp_sibling("s3://bkt/models/run1")
    assert tmp.startswith("s3://bkt/models/.run1.tmp-")
    assert uri.parse("s3://bkt/a/b").parent().uri == "s3://bkt/a"


@pytest.mark.parametrize("text", ["s3:///key", "s3://UPPER/key", "s3://ab/key", "s3://a_b/k"])
def test_s3_uri_without_a_valid_bucket_is_refused(text):
    with pytest.raises(storage.UnknownSchemeError, match="bucket"):
        uri.parse(text)


def test_an_unknown_scheme_names_the_ones_that_work():
    with pytest.raises(storage.UnknownSchemeError, match="s3://bucket/key"):
        uri.parse("gs://bkt/key")


# ----------------------------------------------------------------------------- credentials


@pytest.fixture
def aws_env(monkeypatch, tmp_path):
    """No AWS setting of the machine: every variable cleared, the shared files moved to
    ``tmp_path`` (empty), the instance metadata service off."""
    for key in list(os.environ):
        if key.startswith("AWS_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("HOME", str(tmp_path))
    return tmp_path


SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
TOKEN = "FwoGZXIvYXdzEXAMPLESESSIONTOKEN0123456789abcdef"


def test_credentials_from_the_environment_with_a_session_token(aws_env, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("AWS_SESSION_TOKEN", TOKEN)
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    settings = backend.s3_settings()
    assert (settings.access_key, settings.secret_key, settings.token) == (
        "AKIAEXAMPLE",
        SECRET,
        TOKEN,
    )
    assert settings.method == "env" and settings.region == "eu-west-1"
    assert settings.endpoint is None and not settings.path_style  # AWS's own
    # No secret in what sparktf prints about them, nor in their repr.
    for text in (settings.describe(), repr(settings)):
        assert SECRET not in text and TOKEN not in text
    assert "with a session token" in settings.describe()


def test_credentials_and_endpoint_from_a_profile_of_the_shared_files(aws_env, monkeypatch):
    (aws_env / "credentials").write_text(
        "[default]\naws_access_key_id = AKIADEFAULT\naws_secret_access_key = nope-nope-nope\n"
        f"[lab]\naws_access_key_id = AKIALAB\naws_secret_access_key = {SECRET}\n"
    )
    (aws_env / "config").write_text(
        "[profile lab]\nregion = us-west-2\nendpoint_url = http://store.lab:9000\n"
    )
    monkeypatch.setenv("AWS_PROFILE", "lab")
    settings = backend.s3_settings()
    assert (settings.access_key, settings.secret_key) == ("AKIALAB", SECRET)
    assert settings.method == "shared-credentials-file" and settings.profile == "lab"
    assert settings.region == "us-west-2"
    assert settings.endpoint == "http://store.lab:9000" and settings.path_style
    # the S3-specific variable wins over the general one, which wins over the profile
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://general:1")
    assert backend.s3_settings().endpoint == "http://general:1"
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "https://s3.eu-west-1.amazonaws.com")
    settings = backend.s3_settings()
    assert settings.endpoint == "https://s3.eu-west-1.amazonaws.com"
    assert not settings.path_style  # AWS itself: virtual-hosted addressing


def test_keys_in_the_config_file_count_too(aws_env, monkeypatch):
    (aws_env / "config").write_text(
        f"[default]\naws_access_key_id = AKIACONF\naws_secret_access_key = {SECRET}\n"
    )
    settings = backend.s3_settings()
    assert settings.access_key == "AKIACONF" and settings.method == "config-file"


def test_no_credentials_is_said_not_guessed(aws_env):
    settings = backend.s3_settings()
    assert settings.access_key is None and settings.method is None
    assert "no credentials found" in settings.describe()


def test_the_secret_key_and_token_are_redacted_once_read(aws_env, monkeypatch, caplog):
    secret, token = "Zq3" + "x7" * 18, "IQoJb3JpZ2luX2VjEXAMPLE" + "t0k" * 10
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAREDACT")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    monkeypatch.setenv("AWS_SESSION_TOKEN", token)
    backend.s3_settings()
    assert redact.holds_secret(f"signed with {secret}") and redact.holds_secret(token)
    with caplog.at_level(logging.INFO):
        logging.getLogger("sparktf.test").info("key %s token %s", secret, token)
    assert secret not in caplog.text and token not in caplog.text
    assert redact.REDACTED in caplog.text
    # Spark settings that carry them go to the private file, never on a command line.
    from sparktf.spark.transport import private_settings

    conf = {
        "spark.hadoop.fs.s3a.access.key": "AKIAREDACT",
        "spark.hadoop.fs.s3a.secret.key": secret,
        "spark.hadoop.fs.s3a.session.token": token,
        "spark.hadoop.fs.s3a.endpoint": "http://127.0.0.1:1",
    }
    private = private_settings(conf)
    assert set(private) == {
        "spark.hadoop.fs.s3a.access.key",
        "spark.hadoop.fs.s3a.secret.key",
        "spark.hadoop.fs.s3a.session.token",
    }
    assert conf == {"spark.hadoop.fs.s3a.endpoint": "http://127.0.0.1:1"}


# ----------------------------------------------------------------------------- a real store

store = pytest.mark.integration


@store
def test_files_directories_and_listings_on_a_real_store(s3):
    base = s3.fresh("ns")
    storage.write_text(f"{base}/a.txt", "hello")
    storage.write_bytes(f"{base}/sub/b.bin", b"\x00" * 10)
    storage.makedirs(f"{base}/empty")
    assert storage.exists(base) and storage.isdir(base) and not storage.isdir(f"{base}/a.txt")
    assert storage.size(f"{base}/a.txt") == 5
    assert storage.listdir(base) == [f"{base}/a.txt", f"{base}/empty", f"{base}/sub"]
    assert storage.listdir(f"{base}/empty") == [] and storage.isdir(f"{base}/empty")
    assert storage.walk_files(base) == [f"{base}/a.txt", f"{base}/sub/b.bin"]
    with pytest.raises(NotADirectoryError):
        storage.listdir(f"{base}/a.txt")
    with pytest.raises(IsADirectoryError):
        storage.read_bytes(f"{base}/sub")
    with pytest.raises(storage.PathNotFoundError, match="no such object"):
        storage.read_bytes(f"{base}/missing")
    with pytest.raises(storage.PathExistsError):
        storage.write_text(f"{base}/a.txt", "again", overwrite=False)
    storage.rename(f"{base}/a.txt", f"{base}/c.txt")
    assert storage.read_text(f"{base}/c.txt") == "hello" and not storage.exists(f"{base}/a.txt")
    with pytest.raises(storage.StorageError, match="non-empty"):
        storage.delete(base, recursive=False)
    storage.delete(base)
    assert not storage.exists(base)
    with pytest.raises(storage.PathNotFoundError):
        storage.delete(base, missing_ok=False)


@store
def test_large_files_stream_as_multipart_uploads_and_ranged_reads(s3):
    path = s3.fresh("big") + "/data.bin"
    data = os.urandom(3 * s3_part() + 12345)
    with storage.open_file(path, "wb") as f:
        for start in range(0, len(data), 1 << 20):
            f.write(data[start : start + (1 << 20)])
    etag = _client().head_object(Bucket=_bucket(path), Key=_key(path))["ETag"]
    assert etag.rstrip('"').rsplit("-", 1)[1].isdigit(), "a multipart upload's ETag"
    assert storage.read_bytes(path) == data
    assert storage.read_range(path, 5, 10) == data[5:15]
    assert storage.read_range(path, len(data) + 10, 10) == b""
    blocks = list(storage.iter_blocks(path, 1 << 20, first=1000))
    assert len(blocks[0]) == 1000 and b"".join(map(bytes, blocks)) == data
    with storage.open_file(path, "rb") as f:  # seeks, as a Parquet footer read does
        f.seek(-100, os.SEEK_END)
        assert f.read() == data[-100:]
        f.seek(7)
        assert f.read(3) == data[7:10]


@store
def test_a_write_that_fails_is_aborted_with_no_object_and_no_parts(s3):
    path = s3.fresh("abort") + "/export.bin"
    with pytest.raises(RuntimeError, match="disk gone"), storage.open_file(path, "wb") as f:
        f.write(os.urandom(3 * s3_part()))  # parts already uploaded
        raise RuntimeError("disk gone")
    assert not storage.exists(path)
    uploads = _client().list_multipart_uploads(Bucket=_bucket(path), Prefix=_key(path))
    assert not uploads.get("Uploads")
    with pytest.raises(ValueError), storage.open_file(path, "w") as f:  # text files too
        f.write("x" * 100)
        raise ValueError("bad record")
    assert not storage.exists(path)


@store
def test_exclusive_creates_are_conditional_writes(s3):
    from sparktf.storage.namespace import create_exclusive, mtime, touch

    path = s3.fresh("lock") + "/.target.publish-lock"
    create_exclusive(path, b"first")
    with pytest.raises(storage.PathExistsError):
        create_exclusive(path, b"second")
    assert storage.read_bytes(path) == b"first"
    before = mtime(path)
    time.sleep(1.1)
    touch(path)  # the publish lock's heartbeat
    assert mtime(path) > before and storage.read_bytes(path) == b"first"


@store
def test_publish_commits_a_directory_with_its_marker_last(s3):
    target = s3.fresh("pub") + "/dataset"
    with storage.publish(target) as tmp:
        storage.write_text(f"{tmp}/manifest.json", "{}")
        storage.write_bytes(f"{tmp}/train/part-0.parquet", b"rows")
        assert not storage.exists(target)
    storage.require_committed(target)
    marker = json.loads(storage.read_text(f"{target}/{storage.COMMIT_MARKER}"))
    assert marker["files"] == {"manifest.json": 2, "train/part-0.parquet": 4}
    with pytest.raises(storage.PathExistsError), storage.publish(target):
        pass
    with storage.publish(target, overwrite=True) as tmp:
        storage.write_text(f"{tmp}/manifest.json", '{"v": 2}')
    assert storage.walk_files(target) == [
        f"{target}/{storage.COMMIT_MARKER}",
        f"{target}/manifest.json",
    ]
    one = s3.fresh("pub") + "/metrics.json"
    with storage.publish(one) as tmp:
        storage.write_text(tmp, "{}")
    storage.require_committed(one)  # one object: visible whole, no marker
    assert storage.listdir(storage.parse(one).parent().uri) == [one]


@store
def test_a_commit_that_dies_is_refused_by_readers_and_cleaned_by_the_rerun(s3, monkeypatch):
    from sparktf.datasets.formats import ManifestError, load_manifest

    target = s3.fresh("killed") + "/dataset"

    def killed(path, copied):
        raise KeyboardInterrupt("kill -9")  # the process dies after the first object

    monkeypatch.setattr(publishing, "commit_hook", killed)
    with pytest.raises(KeyboardInterrupt), storage.publish(target) as tmp:
        storage.write_text(f"{tmp}/manifest.json", "{}")
        storage.write_bytes(f"{tmp}/part-1", b"x")
    assert storage.exists(target)  # some objects are there, the marker is not
    with pytest.raises(storage.NotCommittedError, match=storage.COMMIT_MARKER) as refused:
        load_manifest(target)
    assert f"{target}/{storage.COMMIT_MARKER}" in str(refused.value)
    assert not isinstance(refused.value, ManifestError)
    monkeypatch.setattr(publishing, "commit_hook", None)
    with storage.publish(target) as tmp:  # not an overwrite: the dead one is not a version
        storage.write_text(f"{tmp}/manifest.json", "{}")
    storage.require_committed(target)
    parent = storage.parse(target).parent().uri
    # (SeaweedFS lists an emptied prefix for a while: the objects are what counts)
    assert storage.walk_files(parent) == [
        f"{target}/{storage.COMMIT_MARKER}",
        f"{target}/manifest.json",
    ], "no temporary, no lock, nothing of the dead publish left"


@store
def test_an_export_version_that_died_before_its_graph_is_refused_not_skipped(s3, monkeypatch):
    """The newest version of MODEL_DIR/export dies in its commit before saved_model.pb is
    copied (the copies run in parallel, in any order): predict's resolver refuses it, naming
    the marker, rather than calling the model directory empty or taking an older version."""
    from sparktf.inference.saved_model import resolve_export

    model_dir = s3.fresh("export-died") + "/model"
    with storage.publish(f"{model_dir}/export/1") as tmp:
        storage.write_text(f"{tmp}/saved_model.pb", "graph")

    copy_to = backend.S3Object.copy_to

    def dies_at_the_graph(self, source, target, size):
        if target.endswith("/export/2/saved_model.pb"):  # put in place, not staged
            raise KeyboardInterrupt("kill -9")  # the process dies before this copy
        return copy_to(self, source, target, size)

    monkeypatch.setattr(backend.S3Object, "copy_to", dies_at_the_graph)
    monkeypatch.setattr(publishing, "_COPY_THREADS", 1)  # in key order: fingerprint.pb first
    with pytest.raises(KeyboardInterrupt), storage.publish(f"{model_dir}/export/2") as tmp:
        storage.write_text(f"{tmp}/fingerprint.pb", "print")
        storage.write_text(f"{tmp}/saved_model.pb", "graph")
    assert storage.exists(f"{model_dir}/export/2/fingerprint.pb")
    assert not storage.exists(f"{model_dir}/export/2/saved_model.pb")
    for given in (model_dir, f"{model_dir}/export"):
        with pytest.raises(storage.NotCommittedError, match=storage.COMMIT_MARKER):
            resolve_export(given)


@store
def test_a_killed_writer_leaves_parts_that_the_next_publish_aborts(s3):
    target = s3.fresh("orphan") + "/export"
    tmp = storage.temp_sibling(target)
    obj = s3_object(f"{tmp}/variables.data")
    upload = obj.client.create_multipart_upload(Bucket=obj.bucket, Key=obj.key)
    obj.client.upload_part(
        Bucket=obj.bucket,
        Key=obj.key,
        UploadId=upload["UploadId"],
        PartNumber=1,
        Body=os.urandom(s3_part()),
    )
    storage.write_text(f"{tmp}/saved_model.pb", "half")  # what the killed run had written
    with storage.publish(target) as fresh:
        storage.write_text(f"{fresh}/saved_model.pb", "whole")
    listed = obj.client.list_multipart_uploads(Bucket=obj.bucket, Prefix=obj.key)
    assert not listed.get("Uploads")
    assert not storage.exists(tmp)
    assert storage.read_text(f"{target}/saved_model.pb") == "whole"


@store
def test_errors_name_the_endpoint_bucket_and_credentials(s3, monkeypatch):
    base = s3.fresh("errors")
    with pytest.raises(storage.PathNotFoundError, match="no such bucket 'no-such-bucket'"):
        storage.listdir("s3://no-such-bucket/x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "W" * 40)
    started = time.monotonic()
    with pytest.raises(storage.StoragePermissionError) as refused:
        storage.write_text(f"{base}/x.txt", "never")
    assert time.monotonic() - started < 30
    message = str(refused.value)
    assert "SignatureDoesNotMatch" in message and s3.env["AWS_ENDPOINT_URL"] in message
    assert storage.parse(base).netloc in message and "credentials from env" in message
    assert "W" * 40 not in message
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3.env["AWS_SECRET_ACCESS_KEY"])
    assert not storage.exists(f"{base}/x.txt"), "nothing written"
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens there
    with pytest.raises(storage.ObjectStoreUnreachableError, match="127.0.0.1:9"):
        storage.exists(f"{base}/x.txt")


def s3_part() -> int:
    return backend.PART_BYTES


def s3_object(path: str) -> backend.S3Object:
    return backend.S3Object(storage.parse(path))


def _client():
    return backend.s3_client()


def _bucket(path: str) -> str:
    return storage.parse(path).netloc


def _key(path: str) -> str:
    return storage.parse(path).path.lstrip("/")


def test_spark_gets_the_s3a_connector_and_the_same_settings(aws_env, monkeypatch, tmp_path):
    from sparktf.spark import s3a

    jars = tmp_path / "s3a"
    jars.mkdir()
    for name in ("hadoop-aws-3.5.0.jar", "s3-2.35.4.jar"):
        (jars / name).write_bytes(b"PK")
    monkeypatch.setenv(s3a.S3A_JARS_ENV, str(jars))
    monkeypatch.delenv("AWS_CONFIG_FILE")
    monkeypatch.delenv("AWS_SHARED_CREDENTIALS_FILE")
    monkeypatch.delenv("AWS_EC2_METADATA_DISABLED")
    assert s3a.spark_settings({}) == {}, "no AWS setting at all: Spark as it was"
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9000")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIASPARK")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("AWS_SESSION_TOKEN", TOKEN)
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    settings = s3a.spark_settings({"spark.jars": "/opt/mine.jar"})
    assert settings["spark.jars"].split(",") == [
        "/opt/mine.jar",
        str(jars / "hadoop-aws-3.5.0.jar"),
        str(jars / "s3-2.35.4.jar"),
    ]
    assert settings["spark.hadoop.fs.s3a.endpoint"] == "http://127.0.0.1:9000"
    assert settings["spark.hadoop.fs.s3a.path.style.access"] == "true"
    assert settings["spark.hadoop.fs.s3a.connection.ssl.enabled"] == "false"
    assert settings["spark.hadoop.fs.s3a.secret.key"] == SECRET
    assert settings["spark.hadoop.fs.s3a.session.token"] == TOKEN
    assert settings["spark.hadoop.fs.s3a.aws.credentials.provider"].endswith(
        "TemporaryAWSCredentialsProvider"
    )
    assert settings["spark.executorEnv.AWS_SECRET_ACCESS_KEY"] == SECRET
    assert settings["spark.hadoop.fs.s3.impl"] == s3a.S3A_FS
    # Every setting that carries a key goes to the private file, none to a command line.
    from sparktf.spark.transport import private_settings

    public = dict(settings)
    private_settings(public)
    assert not [v for v in public.values() if SECRET in v or TOKEN in v]
    # What the session was given wins.
    given = {"spark.hadoop.fs.s3a.endpoint": "http://other:1"}
    assert "spark.hadoop.fs.s3a.endpoint" not in s3a.spark_settings(given)


def test_sparktf_submit_gives_the_connector_and_keeps_the_keys_off_the_command_line(
    aws_env, monkeypatch, tmp_path
):
    import stat

    from sparktf.console import submit
    from sparktf.spark import s3a

    jars = tmp_path / "s3a"
    jars.mkdir()
    (jars / "hadoop-aws-3.5.0.jar").write_bytes(b"PK")
    monkeypatch.setenv(s3a.S3A_JARS_ENV, str(jars))
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9000")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIASUBMIT")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("AWS_SESSION_TOKEN", TOKEN)
    monkeypatch.delenv("SPARKTF_SPARK_MASTER", raising=False)
    scratch = tmp_path / "scratch"
    scratch.mkdir(mode=0o700)
    command = submit.parse(
        [
            "--jars",
            "/opt/mine.jar",
            "--driver-class-path",
            "/opt/d.jar",
            "predict",
            "--export",
            "s3://b/m",
        ]
    )
    argv, _ = submit.build(command, scratch)
    line = " ".join(argv)
    assert SECRET not in line and TOKEN not in line
    aws = jars / "hadoop-aws-3.5.0.jar"
    assert argv.count("--jars") == 1
    assert argv[argv.index("--jars") + 1] == f"/opt/mine.jar,{aws}"
    # spark-submit and an executor's start read s3:// archives and files before --jars load
    assert argv.count("--driver-class-path") == 1
    assert argv[argv.index("--driver-class-path") + 1] == f"/opt/d.jar:{aws}"
    assert f"spark.executor.extraClassPath={aws}" in argv
    assert "spark.hadoop.fs.s3a.endpoint=http://127.0.0.1:9000" in argv
    flag = next(f for f in ("--extra-properties-file", "--properties-file") if f in argv)
    private = argv[argv.index(flag) + 1]
    assert stat.S_IMODE(os.stat(private).st_mode) == 0o600
    text = open(private).read()
    assert f"spark.hadoop.fs.s3a.secret.key {SECRET}" in text
    assert f"spark.executorEnv.AWS_SESSION_TOKEN {TOKEN}" in text
