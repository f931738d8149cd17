"""The tf.data readers of converted datasets (sparktf.datasets.readers), local and on HDFS.

One tiny CIFAR-10 and one tiny PTB dataset are converted once (shared Spark session) and
copied to HDFS; every reader variant must give back exactly the records written.
"""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import pytest
import tensorflow as tf

from sparktf import storage
from sparktf.datasets import conversion as convert
from sparktf.datasets import formats, readers
from sparktf.datasets.synthetic import write_cifar10, write_ptb

pytestmark = pytest.mark.integration  # tests of another tier carry their own mark

READERS = {"tfrecord": readers.tfrecord_dataset, "parquet": readers.parquet_dataset}
SEQ_LEN = 6


@pytest.fixture(scope="module")
def cifar(spark, hdfs, tmp_path_factory):
    base = tmp_path_factory.mktemp("readers-cifar")
    data = write_cifar10(base / "raw", n_train=48, n_test=12, seed=3)
    local = str(base / "cifar")
    convert.convert("cifar10", str(base / "raw"), local, shards=4, spark=spark)
    remote = hdfs.fresh("readers") + "/cifar"
    storage.copy_tree(local, remote)  # a dataset directory is relocatable
    return SimpleNamespace(data=data, local=local, hdfs=remote)


@pytest.fixture(scope="module")
def ptb(spark, hdfs, tmp_path_factory):
    base = tmp_path_factory.mktemp("readers-ptb")
    data = write_ptb(base / "raw", lines=(50, 12, 12), seq_len=SEQ_LEN, seed=4)
    local = str(base / "ptb")
    convert.convert("ptb", str(base / "raw"), local, shards=2, seq_len=SEQ_LEN, spark=spark)
    remote = hdfs.fresh("readers") + "/ptb"
    storage.copy_tree(local, remote)
    return SimpleNamespace(data=data, local=local, hdfs=remote)


def collect(dataset: tf.data.Dataset, limit: int | None = None) -> dict[str, np.ndarray]:
    batches = list(dataset.take(limit) if limit else dataset)
    return {k: np.concatenate([b[k].numpy() for b in batches]) for k in batches[0]}


def by_id(got: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    order = np.argsort(got["id"], kind="stable")
    return {k: v[order] for k, v in got.items()}


def where(fixture, location: str) -> str:
    return fixture.local if location == "local" else fixture.hdfs


@pytest.mark.parametrize("location", ["local", "hdfs"])
@pytest.mark.parametrize("fmt", ["tfrecord", "parquet"])
def test_reads_every_image(cifar, fmt, location):
    ds = READERS[fmt](f"{where(cifar, location)}/train", batch_size=10)
    spec = ds.element_spec
    assert spec["image"].dtype == tf.uint8 and spec["image"].shape.as_list() == [None, 32, 32, 3]
    assert spec["label"].dtype == tf.int64 and spec["id"].dtype == tf.int64
    batches = list(ds)
    assert [len(b["id"]) for b in batches] == [10, 10, 10, 10, 8]
    got = by_id(collect(ds))
    expected = cifar.data["train"]
    assert got["id"].tolist() == expected["ids"].tolist()
    assert got["label"].tolist() == expected["labels"].tolist()
    assert got["image"].tobytes() == expected["images"].tobytes()


@pytest.mark.parametrize("location", ["local", "hdfs"])
@pytest.mark.parametrize("fmt", ["tfrecord", "parquet"])
def test_reads_every_chunk(ptb, fmt, location):
    for split in ("train", "valid", "test"):
        ds = READERS[fmt](where(ptb, location), split=split, batch_size=4)
        assert ds.element_spec["tokens"].shape.as_list() == [None, SEQ_LEN]
        got = by_id(collect(ds))
        assert got["tokens"].tolist() == ptb.data["chunks"][split].tolist()
        assert got["id"].tolist() == ptb.data["chunk_ids"][split].tolist()


@pytest.mark.parametrize("fmt", ["tfrecord", "parquet"])
@pytest.mark.parametrize("num_shards,location", [(2, "local"), (4, "hdfs"), (3, "local")])
def test_shards_are_disjoint_and_complete(cifar, fmt, num_shards, location):
    # 4 part files: 2 and 4 workers split the files, 3 workers split the records.
    shards = [
        collect(
            READERS[fmt](
                f"{where(cifar, location)}/train",
                batch_size=8,
                num_shards=num_shards,
                shard_index=k,
                shuffle=True,
                seed=k,
            )
        )["id"]
        for k in range(num_shards)
    ]
    all_ids = np.concatenate(shards)
    assert sorted(all_ids.tolist()) == sorted(cifar.data["train"]["ids"].tolist())
    sizes = [len(s) for s in shards]
    assert max(sizes) - min(sizes) <= (0 if num_shards != 3 else 4), sizes


@pytest.mark.parametrize("fmt", ["tfrecord", "parquet"])
def test_shuffle_repeat_and_static_batches(cifar, fmt):
    read = READERS[fmt]
    plain = collect(read(f"{cifar.local}/train", batch_size=8))["id"]
    first = collect(read(f"{cifar.local}/train", batch_size=8, shuffle=True, seed=7))["id"]
    again = collect(read(f"{cifar.local}/train", batch_size=8, shuffle=True, seed=7))["id"]
    assert first.tolist() == again.tolist()  # a seed makes the order repeatable
    assert first.tolist() != plain.tolist()
    assert sorted(first.tolist()) == sorted(plain.tolist())

    ds = read(
        f"{cifar.local}/train",
        batch_size=20,
        shuffle=True,
        seed=1,  # unseeded, a record could linger in the buffer past 240: a flaky count
        repeat=True,
        drop_remainder=True,
        shuffle_buffer=16,
    )
    assert ds.element_spec["image"].shape.as_list() == [20, 32, 32, 3]
    assert ds.element_spec["id"].shape.as_list() == [20]
    ids = collect(ds, limit=12)["id"]  # 240 records: five epochs of 48
    counts = np.unique(ids, return_counts=True)[1]
    assert len(counts) == 48 and counts.min() >= 4


def test_paths_info_and_argument_errors(cifar, tmp_path):
    info = readers.dataset_info(cifar.local)
    assert info["dataset"] == "cifar10" and info["splits"]["test"]["records"] == 12
    expected = sorted(cifar.data["test"]["ids"].tolist())
    for path, split in (
        (cifar.local, "test"),
        (f"{cifar.local}/test", None),
        (f"{cifar.local}/test/tfrecord", None),
    ):
        ds = readers.tfrecord_dataset(path, split=split, batch_size=5)
        assert sorted(collect(ds)["id"].tolist()) == expected
    with pytest.raises(ValueError, match="pass split="):
        readers.tfrecord_dataset(cifar.local, batch_size=5)
    with pytest.raises(ValueError, match="shard_index"):
        readers.parquet_dataset(f"{cifar.local}/train", batch_size=5, num_shards=2, shard_index=2)
    with pytest.raises(formats.ManifestError, match="no split 'valid'"):
        readers.tfrecord_dataset(cifar.local, split="valid", batch_size=5)
    with pytest.raises(formats.ManifestError, match="no dataset manifest"):
        readers.tfrecord_dataset(str(tmp_path / "train"), batch_size=5)


@pytest.mark.parametrize("location", ["local", "hdfs"])
@pytest.mark.parametrize("fmt", ["tfrecord", "parquet"])
def test_training_input_repeats_a_shard_and_names_an_empty_one(cifar, fmt, location):
    from sparktf.train.errors import ConfigError
    from sparktf.train.plan import describe_data
    from sparktf.train.process import inputs

    data = describe_data(where(cifar, location), "test", ("image", "label"))  # 12 records
    # 13 shards of 12 records: TFRecord shards by position (shard 12 gets none), Parquet by
    # id % 13 (12 ids leave at least one remainder without a record)
    held = {int(i) % 13 for i in cifar.data["test"]["ids"]} if fmt == "parquet" else set(range(12))
    empty = min(set(range(13)) - held)
    # unshuffled: a shuffle buffer larger than the shard fills from thousands of passes first
    one_row = inputs.file_batches(data, fmt, 4, 13, min(held), seed=None)
    batch = next(one_row)  # the epochs repeat into whole batches
    assert batch["image"].shape[0] == 4
    # shuffled: the buffer (4096) empties with each pass, so the one-record shard does not
    # read thousands of passes first (over HDFS: minutes), and an epoch holds every record
    # once before the next begins
    assert next(inputs.file_batches(data, fmt, 4, 13, min(held), seed=3))["image"].shape[0] == 4
    two_epochs = READERS[fmt](
        f"{where(cifar, location)}/test", batch_size=4, shuffle=True, seed=3, repeat=True
    )
    ids = collect(two_epochs, limit=6)["id"].tolist()  # 24 records
    assert sorted(ids[:12]) == sorted(ids[12:]) == sorted(cifar.data["test"]["ids"].tolist())
    assert ids[:12] != ids[12:]  # each epoch in a new order
    with pytest.raises(ConfigError, match=rf"shard {empty} of 13 of the 'test' split has no rows"):
        next(inputs.file_batches(data, fmt, 4, 13, empty, seed=1))


@pytest.mark.parametrize("fmt", ["tfrecord", "parquet"])
@pytest.mark.parametrize("num_shards,location", [(1, "hdfs"), (2, "local"), (3, "hdfs")])
def test_a_stream_goes_on_from_any_record_as_it_would_have(cifar, fmt, num_shards, location):
    # 4 files of 12 records: 1 and 2 shards by file, 3 by record. A training process that
    # resumes at record `start` of its shard's endless stream gets what followed it.
    path = f"{where(cifar, location)}/train"
    shard = num_shards - 1
    size = readers.shard_records(path, fmt, num_shards=num_shards, shard_index=shard)
    one_pass = collect(READERS[fmt](path, batch_size=5, num_shards=num_shards, shard_index=shard))
    assert size == len(one_pass["id"])  # what a pass of the shard holds
    options = dict(batch_size=5, num_shards=num_shards, shard_index=shard, shuffle=True,
                   seed=11, repeat=True, drop_remainder=True, shuffle_buffer=8)  # fmt: skip
    full = collect(READERS[fmt](path, **options), limit=-(-3 * size // 5))["id"][: 3 * size]
    passes = full.reshape(3, size)
    assert all(sorted(p) == sorted(set(passes[0])) for p in passes)  # each record once a pass
    assert passes[0].tolist() != passes[1].tolist()  # in a new order each pass
    for start in (7, size + 3):  # in the first pass, and in the second
        got = collect(READERS[fmt](path, start=start, **options), limit=-(-(3 * size) // 5))
        assert got["id"][: 3 * size - start].tolist() == full[start:].tolist(), start
    plain = collect(READERS[fmt](path, batch_size=5, repeat=True), limit=12)["id"]
    later = collect(READERS[fmt](path, batch_size=5, repeat=True, start=9), limit=10)["id"]
    assert later.tolist() == plain[9:59].tolist()  # unshuffled: the records before skipped
    with pytest.raises(ValueError, match="needs a seed"):
        READERS[fmt](path, batch_size=5, shuffle=True, repeat=True, start=3)
    with pytest.raises(ValueError, match="needs repeat=True"):
        READERS[fmt](path, batch_size=5, start=3)


def test_hdfs_tfrecord_checksums_and_truncation(cifar, hdfs):
    remote = hdfs.fresh("readers-bad") + "/cifar"
    for part in ("manifest.json", "test/tfrecord"):  # what this reader needs
        storage.copy_tree(f"{cifar.local}/{part}", f"{remote}/{part}")
    ds = readers.tfrecord_dataset(f"{remote}/test", batch_size=6, verify_checksums=True)
    assert len(collect(ds)["id"]) == 12
    manifest = formats.load_manifest(remote)
    part = formats.split_files(manifest, remote, "test", formats.TFRECORD)[0]
    blob = storage.read_bytes(part)
    storage.write_bytes(part, blob[:-7])
    with pytest.raises(tf.errors.OpError, match="truncated TFRecord file"):
        collect(readers.tfrecord_dataset(f"{remote}/test", batch_size=6))


@pytest.mark.parametrize(
    "fmt,options",
    [
        ("tfrecord", {}),
        ("tfrecord", {"num_shards": 3, "shard_index": 1}),  # by records
        ("tfrecord", {"num_parallel_reads": 3}),  # 4 files through 3 concurrent streams
        ("parquet", {}),
        ("parquet", {"num_shards": 3, "shard_index": 2}),
    ],
)
def test_hdfs_gives_the_local_order(cifar, fmt, options):
    # Unshuffled reads are deterministic: HDFS (concurrent streams) and local disk give the
    # same records in the same order and the same batches.
    def batches(where):
        ds = READERS[fmt](f"{where}/train", batch_size=7, **options)
        return [b["id"].numpy().tolist() for b in ds]

    local, remote = batches(cifar.local), batches(cifar.hdfs)
    assert remote == local
    if "num_shards" not in options:
        assert sorted(sum(remote, [])) == sorted(cifar.data["train"]["ids"].tolist())


@pytest.mark.parametrize("fmt", ["tfrecord", "parquet"])
def test_hdfs_shuffle_repeat_and_static_batches(cifar, fmt):
    read = READERS[fmt]
    first = collect(read(f"{cifar.hdfs}/train", batch_size=8, shuffle=True, seed=7))["id"]
    again = collect(read(f"{cifar.hdfs}/train", batch_size=8, shuffle=True, seed=7))["id"]
    assert first.tolist() == again.tolist()
    assert sorted(first.tolist()) == sorted(cifar.data["train"]["ids"].tolist())
    ds = read(f"{cifar.hdfs}/train", batch_size=20, repeat=True, drop_remainder=True)
    assert ds.element_spec["image"].shape.as_list() == [20, 32, 32, 3]
    ids = collect(ds, limit=12)["id"]  # 240 records: five epochs of 48
    assert np.unique(ids, return_counts=True)[1].tolist() == [5] * 48


@pytest.mark.parametrize("fmt", ["tfrecord", "parquet"])
def test_hdfs_reader_stopped_early_leaves_no_threads(cifar, fmt):
    import gc
    import threading
    import time

    def readers_threads():
        return [
            t.name
            for t in threading.enumerate()
            if t.name.startswith(("tfrecord hdfs://", "parquet-read"))
        ]

    it = iter(READERS[fmt](f"{cifar.hdfs}/train", batch_size=4, repeat=True))
    assert len(next(it)["id"]) == 4
    del it
    gc.collect()
    deadline = time.monotonic() + 15
    while readers_threads() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert readers_threads() == []


@pytest.mark.unit
def test_parquet_files_carry_sparktf_schema_and_a_disagreeing_one_is_named(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    fields = formats.parquet_fields("image", image_shape=(2, 2, 1))
    meta = formats.schema_metadata(fields)
    assert formats.schema_fields(meta, "x") == fields  # plain JSON, read back as written
    assert json.loads(meta[formats.SCHEMA_KEY])["fields"][0] == {
        "name": "image",
        "dtype": "uint8",
        "shape": [2, 2, 1],
    }

    def dataset(name: str, written: list[formats.Field]) -> str:
        """A one-file MNIST-like dataset whose file was written with the schema ``written``."""
        root = tmp_path / name
        (root / "train" / "parquet").mkdir(parents=True)
        images = np.arange(12, dtype=np.uint8).reshape(3, 2, 2, 1)
        table = pa.Table.from_arrays(
            [formats.encode_ndarray_column(images), pa.array([0, 1, 0]), pa.array([7, 8, 9])],
            schema=formats.arrow_schema(written),
        )
        pq.write_table(table, root / "train" / "parquet" / "part-00000.parquet")
        formats.write_common_metadata(
            str(root / "train" / "parquet"), written, {"part-00000.parquet": 1}
        )
        parquet = {"files": ["train/parquet/part-00000.parquet"], "records": [3]}
        manifest = {
            "format_version": formats.FORMAT_VERSION,
            "dataset": "mnist",
            "kind": "image",
            "formats": ["parquet"],
            "sources": [],
            "schema": {"image": {"dtype": "uint8", "shape": [2, 2, 1], "order": "HWC"}},
            "splits": {"train": {"records": 3, "shards": 1, "parquet": parquet}},
        }
        (root / "manifest.json").write_text(json.dumps(manifest))
        return str(root / "train")

    good = collect(readers.parquet_dataset(dataset("good", fields), batch_size=3))
    assert good["id"].tolist() == [7, 8, 9] and good["image"].shape == (3, 2, 2, 1)
    common = formats.read_common_metadata(f"{tmp_path}/good/train/parquet")
    assert formats.schema_fields(common, "common") == fields
    assert json.loads(common[formats.ROW_GROUPS_KEY]) == {"part-00000.parquet": 1}

    # A file whose own schema says (4, 1, 1): not the manifest's (2, 2, 1). The error reaches
    # the caller through tf.data, which keeps its text.
    other = formats.parquet_fields("image", image_shape=(4, 1, 1))
    with pytest.raises(
        tf.errors.OpError,
        match=r"ParquetSchemaError: .*part-00000.parquet: column 'image' is uint8 \(4, 1, 1\) "
        r"in the file's sparktf schema; its dataset expects uint8 \(2, 2, 1\)",
    ):
        collect(readers.parquet_dataset(dataset("bad", other), batch_size=3))
    with pytest.raises(formats.ParquetSchemaError, match="f.parquet: the sparktf schema"):
        formats.schema_fields({formats.SCHEMA_KEY: b"{not json"}, "f.parquet")
