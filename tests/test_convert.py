"""Conversion of CIFAR-10, MNIST and PTB to TFRecord and Parquet (sparktf.datasets.conversion).

Tiny inputs in exactly the raw formats (sparktf.datasets.synthetic), converted through the shared
local-cluster Spark session to local disk and to the real HDFS, then read back with plain
``tf.data.TFRecordDataset`` and the documented feature spec, and with plain pyarrow and
``np.load`` (petastorm's readers: tests/test_petastorm.py).
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import json
import os
import shutil
import struct
import subprocess
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import pytest

from sparktf import storage
from sparktf.datasets import conversion as convert
from sparktf.datasets import conversion_plan as plan
from sparktf.datasets import formats, tasks, tfrecord
from sparktf.datasets.sources import SourceError
from sparktf.datasets.synthetic import write_cifar10, write_mnist, write_ptb
from tests import helpers

pytestmark = pytest.mark.integration  # tests of another tier carry their own mark

ROOT = Path(__file__).resolve().parent.parent


# ----------------------------------------------------------------------------- helpers


def read_tfrecords(dataset_dir: str, split: str) -> dict[str, np.ndarray]:
    """All records of a split through plain tf.data.TFRecordDataset + the feature spec."""
    import tensorflow as tf

    with storage.local_copy(dataset_dir) as local:
        manifest = formats.load_manifest(local)
        files = formats.split_files(manifest, local, split, formats.TFRECORD)
        if manifest["kind"] == "image":
            spec = formats.feature_spec("image")
        else:
            spec = formats.feature_spec("text", seq_len=manifest["schema"]["tokens"]["shape"][0])
        out: dict[str, list] = {}
        ds = tf.data.TFRecordDataset(files).batch(1000).map(lambda s: tf.io.parse_example(s, spec))
        for batch in ds:
            for key, value in batch.items():
                out.setdefault(key, []).append(value.numpy())
    got = {k: np.concatenate(v) for k, v in out.items()}
    if "image" in got:
        h, w, c = manifest["schema"]["image"]["shape"]
        got["image"] = np.stack([np.frombuffer(b, np.uint8) for b in got["image"]]).reshape(
            -1, h, w, c
        )
    return got


def read_parquet(dataset_dir: str, split: str) -> dict[str, np.ndarray]:
    """All rows of a split through plain pyarrow, each ndarray value with ``np.load`` (the
    documented contract: ``numpy.save`` bytes), by id; every file and ``_common_metadata``
    must carry the manifest's columns as sparktf's JSON schema."""
    import io

    import pyarrow.parquet as pq

    with storage.local_copy(dataset_dir) as local:
        manifest = formats.load_manifest(local)
        fields = formats.manifest_fields(manifest)
        common = pq.read_schema(f"{local}/{split}/parquet/_common_metadata").metadata
        assert json.loads(common[b"sparktf.schema"]) == {
            "schema_version": 1,
            "fields": [
                {"name": f.name, "dtype": f.dtype, "shape": f.shape and list(f.shape)}
                for f in fields
            ],
        }
        files = formats.split_files(manifest, local, split, formats.PARQUET)
        rows: list[dict] = []
        for file in files:
            assert pq.read_schema(file).metadata[b"sparktf.schema"] == common[b"sparktf.schema"]
            for row in pq.read_table(file).to_pylist():
                rows.append(
                    {
                        f.name: np.load(io.BytesIO(row[f.name])) if f.shape else row[f.name]
                        for f in fields
                    }
                )
        row_groups = {os.path.basename(f): pq.ParquetFile(f).metadata.num_row_groups for f in files}
        # under the key petastorm's readers take them from
        assert json.loads(common[b"dataset-toolkit.num_row_groups_per_file.v1"]) == row_groups
    return helpers.columns_by_id(rows)


def sha256(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def leftovers(output: str) -> list[str]:
    """Temporary siblings that a failed or finished conversion left beside ``output``."""
    loc = storage.parse(output)
    parent = storage.Location(loc.scheme, loc.netloc, os.path.dirname(loc.path)).uri
    if not storage.exists(parent):
        return []
    name = os.path.basename(loc.path)
    return [p for p in storage.listdir(parent) if os.path.basename(p).startswith(f".{name}.")]


def assert_failed_cleanly(output: str) -> None:
    assert not storage.exists(output)
    assert leftovers(output) == []


# ----------------------------------------------------------------------------- CIFAR-10


def test_cifar10_local(spark, tmp_path):
    data = write_cifar10(tmp_path / "raw", n_train=50, n_test=20)
    out = str(tmp_path / "out")
    manifest = convert.convert("cifar10", str(tmp_path / "raw"), out, shards=2, spark=spark)

    assert formats.load_manifest(out) == manifest
    assert manifest["format_version"] == formats.FORMAT_VERSION
    assert [s["name"] for s in manifest["sources"]] == [
        "data_batch_1.bin",
        "data_batch_2.bin",
        "data_batch_3.bin",
        "data_batch_4.bin",
        "data_batch_5.bin",
        "test_batch.bin",
    ]
    for source, path in zip(manifest["sources"], data["files"]):
        assert source["sha256"] == sha256(path)
        assert source["size"] == os.path.getsize(path)
    assert manifest["splits"]["train"]["records"] == 50
    assert manifest["splits"]["test"]["records"] == 20
    assert manifest["splits"]["train"]["shards"] == 2
    assert sum(manifest["splits"]["train"]["label_counts"]) == 50
    assert manifest["schema"]["image"] == {"dtype": "uint8", "shape": [32, 32, 3], "order": "HWC"}
    assert sorted(os.listdir(out)) == ["manifest.json", "test", "train"]
    assert sorted(os.listdir(f"{out}/train/tfrecord")) == [
        "part-00000.tfrecord",
        "part-00001.tfrecord",
    ]

    for split in ("train", "test"):
        got = read_tfrecords(out, split)  # file order is record order
        helpers.assert_images(got, data[split])
        assert set(got["height"]) == {32} and set(got["width"]) == {32}
        assert set(got["channels"]) == {3}
        helpers.assert_images(read_parquet(out, split), data[split])

    # The Parquet files are plain Parquet to Spark SQL: image is the numpy.save bytes.
    frame = spark.read.parquet(storage.spark_uri(f"{out}/train/parquet"))
    assert dict(frame.dtypes) == {"image": "binary", "label": "bigint", "id": "bigint"}
    row = frame.orderBy("id").first()
    assert np.array_equal(
        formats.decode_ndarray_column([row.image], "uint8", (32, 32, 3))[0],
        data["train"]["images"][0],
    )
    assert leftovers(out) == []


def test_cifar10_archive_on_hdfs(spark, hdfs, tmp_path):
    data = write_cifar10(tmp_path / "raw", n_train=30, n_test=12, train_files=3, archive=True)
    archive = data["files"][0]
    base = hdfs.fresh("cifar")
    storage.copy_file(archive, f"{base}/in/cifar-10-binary.tar.gz")
    out = f"{base}/out"
    manifest = convert.convert(
        "cifar10", f"{base}/in/cifar-10-binary.tar.gz", out, shards=3, spark=spark
    )

    assert manifest["containers"] == [
        {
            "path": f"{base}/in/cifar-10-binary.tar.gz",
            "size": os.path.getsize(archive),
            "sha256": sha256(archive),
        }
    ]
    assert [s["member"] for s in manifest["sources"]] == [
        "cifar-10-batches-bin/data_batch_1.bin",
        "cifar-10-batches-bin/data_batch_2.bin",
        "cifar-10-batches-bin/data_batch_3.bin",
        "cifar-10-batches-bin/test_batch.bin",
    ]
    assert sorted(storage.listdir(out)) == [
        f"{out}/manifest.json",
        f"{out}/test",
        f"{out}/train",
    ]  # no _staging left
    for split in ("train", "test"):
        helpers.assert_images(read_tfrecords(out, split), data[split])
        helpers.assert_images(read_parquet(out, split), data[split])
    assert leftovers(out) == []


# ----------------------------------------------------------------------------- MNIST


def test_mnist_gzip_local(spark, tmp_path):
    data = write_mnist(tmp_path / "raw", n_train=30, n_test=10, gzip=True)
    out = str(tmp_path / "out")
    manifest = convert.convert(
        "mnist", str(tmp_path / "raw"), out, shards=2, spark=spark, output_formats=["tfrecord"]
    )
    assert manifest["schema"]["image"]["shape"] == [28, 28, 1]
    assert [s["name"] for s in manifest["sources"]] == [
        "t10k-images-idx3-ubyte",
        "t10k-labels-idx1-ubyte",
        "train-images-idx3-ubyte",
        "train-labels-idx1-ubyte",
    ]
    raw = {Path(p).name: p for p in data["files"]}
    for source in manifest["sources"]:
        gz = raw[source["name"] + ".gz"]
        assert (
            source["sha256"] == hashlib.sha256(gzip.decompress(Path(gz).read_bytes())).hexdigest()
        )
    assert {c["path"]: c["sha256"] for c in manifest["containers"]} == {
        p: sha256(p) for p in data["files"]
    }
    for split in ("train", "test"):
        helpers.assert_images(read_tfrecords(out, split), data[split])


def test_mnist_plain_hdfs_to_hdfs_parquet_only(spark, hdfs, tmp_path):
    data = write_mnist(tmp_path / "raw", n_train=25, n_test=9, gzip=False)
    base = hdfs.fresh("mnist")
    storage.copy_tree(str(tmp_path / "raw"), f"{base}/in")
    manifest = convert.convert(
        "mnist", f"{base}/in", f"{base}/out", output_formats=["parquet"], shards=3, spark=spark
    )
    assert manifest["formats"] == ["parquet"]
    assert manifest["splits"]["train"]["parquet"]["records"] == [8, 8, 9]
    assert not storage.exists(f"{base}/out/train/tfrecord")
    for split in ("train", "test"):
        helpers.assert_images(read_parquet(f"{base}/out", split), data[split])


# ----------------------------------------------------------------------------- PTB


def test_ptb_local(spark, tmp_path):
    seq_len = 5
    data = write_ptb(tmp_path / "raw", lines=(60, 15, 15), seq_len=seq_len)
    out = str(tmp_path / "out")
    # Small byte ranges: the token counting runs as several line-aligned ranges per file.
    manifest = convert.convert(
        "ptb", str(tmp_path / "raw"), out, shards=3, seq_len=seq_len, spark=spark, range_bytes=97
    )
    assert formats.load_vocab(out) == data["vocab"]
    assert manifest["text"]["vocab_size"] == len(data["vocab"])
    assert manifest["text"]["seq_len"] == seq_len
    for split in ("train", "valid", "test"):
        tokens = len(data["ids"][split])
        entry = manifest["splits"][split]
        assert entry["tokens"] == tokens
        assert entry["records"] == tokens // seq_len
        assert entry["dropped_tokens"] == tokens % seq_len
        got = read_tfrecords(out, split)
        assert got["tokens"].tolist() == data["chunks"][split].tolist()
        assert got["id"].tolist() == data["chunk_ids"][split].tolist()
        parquet = read_parquet(out, split)
        assert parquet["tokens"].dtype == np.int64
        assert parquet["tokens"].tolist() == data["chunks"][split].tolist()
        assert parquet["id"].tolist() == data["chunk_ids"][split].tolist()


def test_ptb_unk_on_hdfs(spark, hdfs, tmp_path):
    data = write_ptb(tmp_path / "raw", oov_word="zebra")
    base = hdfs.fresh("ptb")
    storage.copy_tree(str(tmp_path / "raw"), f"{base}/in")
    manifest = convert.convert(
        "ptb",
        f"{base}/in",
        f"{base}/out",
        unk="<unk>",
        shards=2,
        output_formats=["tfrecord"],
        spark=spark,
    )
    valid = manifest["splits"]["valid"]
    assert valid["unk_mapped"] == 1
    vocab = formats.load_vocab(f"{base}/out")
    words = data["texts"]["valid"].replace("\n", "<eos>").split()
    expected = [vocab.index("<unk>") if w == "zebra" else vocab.index(w) for w in words]
    seq_len = manifest["text"]["seq_len"]
    kept = len(expected) // seq_len * seq_len  # whole records; the rest is dropped
    assert words.index("zebra") < kept  # the mapped word is in a written record
    got = read_tfrecords(f"{base}/out", "valid")["tokens"]
    assert got.shape == (valid["records"], seq_len) and valid["records"] == kept // seq_len
    assert got.ravel().tolist() == expected[:kept]
    assert valid["dropped_tokens"] == len(expected) - kept
    assert storage.exists(f"{base}/out/vocab.txt")


# ----------------------------------------------------------------------------- bad input


def _cifar_raw(tmp_path, **kwargs) -> Path:
    raw = tmp_path / "raw"
    write_cifar10(raw, n_train=20, n_test=6, train_files=2, **kwargs)
    return raw


def _expect_error(spark, dataset, raw, out, *needles, **kwargs):
    with pytest.raises(SourceError) as info:
        convert.convert(dataset, str(raw), str(out), spark=spark, **kwargs)
    message = str(info.value)
    for needle in needles:
        assert needle in message, message
    assert_failed_cleanly(str(out))
    return message


@pytest.mark.unit
def test_cifar10_wrong_record_length(tmp_path):
    raw = _cifar_raw(tmp_path)
    (raw / "data_batch_2.bin").write_bytes(b"\x01" * (3074 * 3))  # CIFAR-100-sized records
    _expect_error(
        None,
        "cifar10",
        raw,
        tmp_path / "out",
        "data_batch_2.bin",
        "not a multiple of the 3073-byte record",
        "record 3",
        "byte offset 9219",
    )


@pytest.mark.unit
def test_cifar10_truncated(tmp_path):
    raw = _cifar_raw(tmp_path)
    path = raw / "test_batch.bin"
    path.write_bytes(path.read_bytes()[:-100])
    _expect_error(
        None,
        "cifar10",
        raw,
        tmp_path / "out",
        "test_batch.bin",
        "truncated",
        "record 5",
        f"byte offset {5 * 3073}",
    )


def test_cifar10_label_out_of_range(spark, tmp_path):
    raw = _cifar_raw(tmp_path)
    path = raw / "data_batch_2.bin"
    blob = bytearray(path.read_bytes())
    blob[7 * 3073] = 12
    path.write_bytes(bytes(blob))
    _expect_error(
        spark,
        "cifar10",
        raw,
        tmp_path / "out",
        "data_batch_2.bin",
        "label 12 is out of range 0..9",
        "record 7",
        f"byte offset {7 * 3073}",
    )


@pytest.mark.unit
def test_empty_inputs(tmp_path):
    raw = _cifar_raw(tmp_path)
    (raw / "test_batch.bin").write_bytes(b"")
    _expect_error(None, "cifar10", raw, tmp_path / "out", "test_batch.bin", "empty")
    (tmp_path / "nothing").mkdir()
    _expect_error(None, "cifar10", tmp_path / "nothing", tmp_path / "out", "no CIFAR-10")
    _expect_error(None, "mnist", tmp_path / "nothing", tmp_path / "out", "missing MNIST files")


def test_corrupt_archives(spark, tmp_path):
    data = write_cifar10(tmp_path / "raw", n_train=20, n_test=5, archive=True)
    archive = Path(data["files"][0])
    blob = archive.read_bytes()
    archive.write_bytes(blob[: len(blob) // 2])  # truncated
    message = _expect_error(
        spark,
        "cifar10",
        archive,
        tmp_path / "out",
        "cifar-10-binary.tar.gz",
        "corrupt archive",
        "compressed byte offset",
    )
    archive.write_bytes(b"this is not a gzip file" * 10)  # garbage
    _expect_error(
        spark, "cifar10", archive, tmp_path / "out", "cifar-10-binary.tar.gz", "corrupt archive"
    )
    mnist = tmp_path / "mnist"
    write_mnist(mnist, n_train=5, n_test=3, gzip=True)
    gz = mnist / "train-labels-idx1-ubyte.gz"
    gz.write_bytes(gz.read_bytes()[:-6])  # cut into the trailer
    _expect_error(
        spark, "mnist", mnist, tmp_path / "out", "train-labels-idx1-ubyte.gz", "corrupt gzip file"
    )
    assert "detected by compressed byte offset" in message


def _mnist_plain(tmp_path) -> Path:
    raw = tmp_path / "mnist"
    write_mnist(raw, n_train=8, n_test=4, gzip=False)
    return raw


def _rewrite(path: Path, offset: int, data: bytes) -> None:
    blob = bytearray(path.read_bytes())
    blob[offset : offset + len(data)] = data
    path.write_bytes(bytes(blob))


@pytest.mark.unit
def test_mnist_bad_headers(tmp_path):
    out = tmp_path / "out"
    raw = _mnist_plain(tmp_path)
    _rewrite(raw / "train-images-idx3-ubyte", 0, struct.pack(">I", 2049))
    _expect_error(
        None,
        "mnist",
        raw,
        out,
        "train-images-idx3-ubyte",
        "bad IDX magic 2049",
        "expected 2051",
        "byte offset 0",
    )

    shutil.rmtree(raw)
    raw = _mnist_plain(tmp_path)
    _rewrite(raw / "t10k-images-idx3-ubyte", 8, struct.pack(">I", 0))
    _expect_error(None, "mnist", raw, out, "t10k-images-idx3-ubyte", "bad IDX dimensions 0x28")

    shutil.rmtree(raw)
    raw = _mnist_plain(tmp_path)
    path = raw / "train-images-idx3-ubyte"
    path.write_bytes(path.read_bytes()[:-10])
    _expect_error(
        None,
        "mnist",
        raw,
        out,
        "train-images-idx3-ubyte",
        "truncated file",
        "record 7",
        f"byte offset {16 + 7 * 784}",
    )

    shutil.rmtree(raw)
    raw = _mnist_plain(tmp_path)
    (raw / "train-labels-idx1-ubyte").write_bytes(struct.pack(">II", 2049, 7) + bytes(7))
    _expect_error(
        None,
        "mnist",
        raw,
        out,
        "train-labels-idx1-ubyte",
        "label count 7 does not match the image count 8",
        "train-images-idx3-ubyte",
    )


def test_mnist_label_out_of_range(spark, tmp_path):
    raw = _mnist_plain(tmp_path)
    _rewrite(raw / "t10k-labels-idx1-ubyte", 8 + 2, b"\x0a")
    _expect_error(
        spark,
        "mnist",
        raw,
        tmp_path / "out",
        "t10k-labels-idx1-ubyte",
        "label 10 is out of range 0..9",
        "record 2",
        "byte offset 10",
    )


def test_ptb_unknown_word(spark, tmp_path):
    data = write_ptb(tmp_path / "raw", oov_word="zebra")
    text = data["texts"]["valid"]
    message = _expect_error(
        spark,
        "ptb",
        tmp_path / "raw",
        tmp_path / "out",
        "ptb.valid.txt",
        "'zebra' is not in the vocabulary",
        "convert(unk=...)",
    )
    # The message names the file by its path and the byte offset of the word in that file.
    valid = tmp_path / "raw" / "ptb.valid.txt"
    assert message.startswith(f"{valid}: word 'zebra' is not in the vocabulary"), message
    offset = text.index("zebra")
    assert message.endswith(f"(at byte offset {offset})"), message
    assert valid.read_bytes()[offset : offset + 6] == b"zebra "
    with pytest.raises(convert.OptionError, match="not a word of ptb.train.txt"):
        convert.convert(
            "ptb", str(tmp_path / "raw"), str(tmp_path / "out"), unk="<nope>", spark=spark
        )
    assert_failed_cleanly(str(tmp_path / "out"))


def test_existing_output_is_refused_then_replaced(spark, tmp_path):
    raw = _mnist_plain(tmp_path)
    out = tmp_path / "out"
    first = convert.convert(
        "mnist", str(raw), str(out), shards=1, spark=spark, output_formats=["tfrecord"]
    )
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*")}
    with pytest.raises(storage.PathExistsError, match="already exists"):
        convert.convert("mnist", str(raw), str(out), shards=2, spark=spark)
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*")} == before
    second = convert.convert(
        "mnist",
        str(raw),
        str(out),
        shards=2,
        spark=spark,
        output_formats=["tfrecord"],
        overwrite=True,
    )
    assert first["splits"]["train"]["shards"] == 1 and second["splits"]["train"]["shards"] == 2
    assert formats.load_manifest(str(out))["splits"]["train"]["shards"] == 2
    assert leftovers(str(out)) == []


# ----------------------------------------------------------------------------- pieces


@pytest.mark.unit
def test_tfrecord_framing_matches_tensorflow(tmp_path):
    import tensorflow as tf

    rng = np.random.default_rng(1)
    images = rng.integers(0, 256, (40, 5, 4, 3), dtype=np.uint8)
    labels = rng.integers(0, 300, 40)
    ids = formats.make_id(0, np.arange(0, 40 * 100, 100))  # varints of several lengths
    records = tfrecord.image_examples(images, labels, ids)
    path = tmp_path / "tf.tfrecord"
    with tf.io.TFRecordWriter(str(path)) as writer:
        for record in records:
            writer.write(record)
    assert tfrecord.frame_images(images, labels, ids) == path.read_bytes()
    assert tfrecord.crc32c(b"123456789") == 0xE3069283
    example = tf.train.Example.FromString(records[3])
    assert example.features.feature["id"].int64_list.value == [300]
    mine = tmp_path / "mine.tfrecord"
    mine.write_bytes(
        tfrecord.frame(tfrecord.token_examples(np.arange(12).reshape(3, 4), np.arange(3)))
    )
    assert tfrecord.read_records(str(mine)) == [
        bytes(r.numpy()) for r in tf.data.TFRecordDataset(str(mine))
    ]
    corrupt = bytearray(mine.read_bytes())
    corrupt[20] ^= 0xFF
    mine.write_bytes(bytes(corrupt))
    with pytest.raises(tfrecord.TFRecordError, match="checksum mismatch"):
        tfrecord.read_records(str(mine))


@pytest.mark.unit
def test_default_shards():
    assert plan.shard_count(None, 150 << 20, 50_000) == 12
    assert plan.shard_count(None, 30 << 20, 10_000) == 4
    assert plan.shard_count(None, 3000, 2) == 2
    assert plan.shard_count(7, 3000, 5) == 5


@pytest.mark.unit
def test_hash_plan(tmp_path):
    sizes = {"a": 50, "b": 30, "c": 30, "d": 10, "e": 5}
    for name, size in sizes.items():
        (tmp_path / name).write_bytes(bytes(range(size)))
    plain = [{"path": str(tmp_path / n), "size": s} for n, s in sizes.items()]
    hashing = plan.plan_hashing(plain, parallelism=2)
    assert [t.paths for t in hashing.tasks] == [
        (str(tmp_path / "a"), str(tmp_path / "d"), str(tmp_path / "e")),
        (str(tmp_path / "b"), str(tmp_path / "c")),
    ]
    digests = hashing.check(tasks.hash_or_run(abs, t) for t in hashing.tasks)
    assert digests == {
        str(tmp_path / n): {"size": s, "sha256": sha256(tmp_path / n)} for n, s in sizes.items()
    }
    assert plan.plan_hashing(plain[:1], parallelism=8).tasks == (
        tasks.HashTask((str(tmp_path / "a"),)),
    )
    assert plan.plan_hashing([], parallelism=8).tasks == ()
    (tmp_path / "c").write_bytes(b"longer now" * 4)
    with pytest.raises(SourceError, match=r"c: file changed during the conversion: 30 bytes"):
        hashing.check(tasks.hash_files(t) for t in hashing.tasks)


@pytest.mark.unit
def test_tasks_pickle_by_reference():
    """What Spark ships to executors names the task functions (pickled by reference) and
    carries only its settings."""
    from pyspark import cloudpickle

    fields = formats.parquet_fields("image", image_shape=(32, 32, 3))
    fn = functools.partial(
        tasks.hash_or_run,
        functools.partial(
            tasks.write_image_shard,
            dataset="cifar10",
            block=1024,
            out="/tmp/out",
            fields=fields,
            num_classes=10,
        ),
    )
    blob = cloudpickle.dumps(fn)
    assert b"sparktf.datasets.tasks" in blob and len(blob) < 2000, len(blob)
    assert cloudpickle.loads(blob).args[0].keywords["num_classes"] == 10


# ----------------------------------------------------------------------------- the jobs


def _job(name: str, *args: str, hdfs=None) -> subprocess.CompletedProcess:
    return helpers.run_job(f"convert_{name}.py", *args, hdfs=hdfs)


@pytest.mark.e2e
def test_jobs_help():
    for name in ("cifar10", "mnist", "ptb"):
        result = _job(name, "--help")
        assert result.returncode == 0, result.stderr
        for flag in ("--input", "--output", "--format", "--shards", "--overwrite"):
            assert flag in result.stdout
        assert ("--seq-len" in result.stdout) == (name == "ptb")
        assert ("--unk" in result.stdout) == (name == "ptb")


@pytest.mark.e2e
def test_job_bad_input_exit_code(tmp_path):
    raw = _cifar_raw(tmp_path)
    path = raw / "data_batch_1.bin"
    path.write_bytes(path.read_bytes()[:-1])
    result = _job("cifar10", "--input", str(raw), "--output", str(tmp_path / "out"))
    assert result.returncode == 2, result.stderr[-3000:]
    # 10 records of 3073 bytes, one byte short: the last record is the truncated one.
    errors = [line for line in result.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1, result.stderr[-3000:]
    assert f"{path}: truncated" in errors[0]
    assert errors[0].endswith(f"(at record 9, byte offset {9 * 3073})"), errors[0]
    assert_failed_cleanly(str(tmp_path / "out"))


def test_job_end_to_end(spark, hdfs, tmp_path, caplog):
    """The job's logic on the session onto HDFS, then a rerun that must refuse (the job as its
    own process: test_job_bad_input_exit_code here, and tests/test_readme.py)."""
    from sparktf import cli
    from sparktf.jobs import convert as job

    caplog.set_level("INFO", logger="sparktf")
    raw = _mnist_plain(tmp_path)
    out = hdfs.fresh("job") + "/mnist"
    argv = ["--input", str(raw), "--output", out]
    assert job.main("mnist", [*argv, "--shards", "2", "--format", "tfrecord"], spark=spark) == 0
    assert "tasks done" in caplog.text and "published" in caplog.text
    manifest = json.loads(storage.read_text(f"{out}/manifest.json"))
    assert manifest["splits"]["train"]["records"] == 8
    with pytest.raises(cli.UsageError, match="already exists"):
        job.main("mnist", argv, spark=spark)
    assert json.loads(storage.read_text(f"{out}/manifest.json")) == manifest


@pytest.mark.unit
def test_errors_name_the_parameter_and_the_jobs_their_flag():
    message = "convert(unk=...) 'x' is not a word; see convert(output_formats=...)"
    assert convert.for_command_line(message) == "--unk 'x' is not a word; see --format"
    assert convert.for_command_line("convert(seq_len=...)") == "--seq-len"
