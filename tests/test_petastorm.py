"""petastorm's readers over sparktf datasets, and datasets crossing between the two stacks.

These run on the petastorm stack (``scripts/test.sh --stack petastorm``; petastorm does not
import on the default one, where the module is skipped). A split is converted once through the
session's Spark to the real HDFS, then read with ``make_reader``, ``make_batch_reader`` and
``make_spark_converter``. The cross-stack tests run the default stack's ``.venv`` as a separate
process: a dataset it writes opens here, and one written here opens there.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("petastorm", reason="petastorm is on the second stack (--stack petastorm)")

import sparktf
from sparktf import storage
from sparktf.datasets import conversion as convert
from sparktf.datasets import formats, petastorm_io
from sparktf.datasets.synthetic import write_mnist
from tests import helpers

# The default tier here; tests of another tier carry their own mark.
pytestmark = [pytest.mark.petastorm, pytest.mark.integration]

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_PYTHON = ROOT / ".venv" / "bin" / "python"


def make_reader_rows(split_dir: str) -> dict:
    with petastorm_io.make_reader(
        split_dir, num_epochs=1, shuffle_row_groups=False, reader_pool_type="dummy"
    ) as reader:
        return helpers.columns_by_id([row._asdict() for row in reader])


@pytest.fixture(scope="module")
def converted(spark, hdfs, tmp_path_factory):
    """An MNIST split converted on this stack to HDFS (Parquet, 3 files), with its raw data."""
    raw = tmp_path_factory.mktemp("raw")
    data = write_mnist(raw, n_train=30, n_test=9, gzip=False, seed=5)
    out = f"{hdfs.fresh('petastorm')}/mnist"
    convert.convert("mnist", str(raw), out, output_formats=["parquet"], shards=3, spark=spark)
    return {"out": out, "raw": str(raw), "data": data}


def test_make_reader_decodes_a_converted_split_on_hdfs(converted):
    for split in ("train", "test"):
        got = make_reader_rows(storage.join(converted["out"], split, "parquet"))
        helpers.assert_images(got, converted["data"][split])


def test_make_batch_reader_reads_the_columns(converted):
    files = formats.split_files(
        formats.load_manifest(converted["out"]), converted["out"], "train", formats.PARQUET
    )
    batches = []
    with petastorm_io.make_batch_reader(
        files, num_epochs=1, shuffle_row_groups=False, reader_pool_type="dummy"
    ) as reader:
        for batch in reader:
            batches.append(
                {
                    "id": np.asarray(batch.id),
                    "label": np.asarray(batch.label),
                    "image": formats.decode_ndarray_column(batch.image, "uint8", (28, 28, 1)),
                }
            )
    got = {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}
    order = np.argsort(got["id"])
    helpers.assert_images({k: v[order] for k, v in got.items()}, converted["data"]["train"])


def test_twenty_reads_in_a_row_each_read_every_row(converted, tmp_path):
    """petastorm's thread pool can end a read before it starts (0 rows, no error: about 1
    read in 6 with petastorm alone); through sparktf every read of the split, with the
    default pool and 10 threads, gives every row, 20 times in a row, on HDFS and on a local
    copy (faster reads, a wider race window)."""
    split = storage.join(converted["out"], "train", "parquet")
    local = tmp_path / "split"
    local.mkdir()
    for path in storage.listdir(split):
        if path.endswith(".parquet"):
            storage.copy_file(path, str(local / path.rsplit("/", 1)[1]))
    for where in (split, local.as_uri()):
        counts = []
        for _ in range(20):
            with petastorm_io.make_batch_reader(where, num_epochs=1) as reader:
                counts.append(sum(len(batch.id) for batch in reader))
        assert counts == [30] * 20, (where, counts)


def test_make_spark_converter_feeds_tf_data(spark, converted, tmp_path):
    from petastorm.spark import SparkDatasetConverter, make_spark_converter

    split = storage.join(converted["out"], "train", "parquet")
    df = spark.read.parquet(storage.spark_uri(split))
    spark.conf.set(SparkDatasetConverter.PARENT_CACHE_DIR_URL_CONF, tmp_path.as_uri())
    converter = make_spark_converter(df)
    try:
        assert len(converter) == 30
        ids, labels, images = [], [], []
        with converter.make_tf_dataset(batch_size=8, num_epochs=1, workers_count=1) as dataset:
            for batch in dataset:
                ids += batch.id.numpy().tolist()
                labels += batch.label.numpy().tolist()
                images += list(batch.image.numpy())
    finally:
        converter.delete()
    got = helpers.columns_by_id(
        [
            {"id": i, "label": label, "image": np.load(io.BytesIO(image))}
            for i, label, image in zip(ids, labels, images)
        ]
    )
    helpers.assert_images(got, converted["data"]["train"])


def other_stack(code: str, *args: str) -> subprocess.CompletedProcess:
    """``code`` run by the default stack's Python (a separate process)."""
    if not DEFAULT_PYTHON.exists():
        pytest.skip("the default stack's .venv is not set up (scripts/setup.sh)")
    env = {**os.environ, "PYSPARK_PYTHON": str(DEFAULT_PYTHON)}  # its executors too
    return helpers.run_command(
        [str(DEFAULT_PYTHON), "-c", textwrap.dedent(code), *args], timeout=300, cwd=ROOT, env=env
    )


@pytest.mark.e2e
def test_a_dataset_written_here_reads_on_the_default_stack(converted):
    done = other_stack(
        """
        import json, sys
        import numpy as np, pyarrow
        from sparktf.datasets import readers
        ids, labels, images = [], [], []
        for batch in readers.parquet_dataset(sys.argv[1], batch_size=7).as_numpy_iterator():
            ids += batch["id"].tolist(); labels += batch["label"].tolist()
            images.append(batch["image"])
        print(json.dumps({"pyarrow": pyarrow.__version__, "numpy": np.__version__,
                          "ids": ids, "labels": labels,
                          "image_bytes": np.concatenate(images).tobytes().hex()}))
        """,
        storage.join(converted["out"], "train"),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert int(got["pyarrow"].split(".")[0]) >= 18 and got["numpy"].startswith("2.")
    order = np.argsort(got["ids"])
    expected = converted["data"]["train"]
    assert np.asarray(got["ids"])[order].tolist() == expected["ids"].tolist()
    assert np.asarray(got["labels"])[order].tolist() == expected["labels"].tolist()
    images = np.frombuffer(bytes.fromhex(got["image_bytes"]), np.uint8).reshape(-1, 28, 28, 1)
    assert images[order].tobytes() == expected["images"].tobytes()


@pytest.mark.e2e
def test_a_dataset_written_on_the_default_stack_reads_here(spark, converted, tmp_path):
    out = str(tmp_path / "from-default")
    done = other_stack(
        """
        import sys
        import pyspark
        from pyspark.sql import SparkSession
        from sparktf.datasets import conversion as convert
        spark = SparkSession.builder.master("local[1]").getOrCreate()
        try:
            convert.convert("mnist", sys.argv[1], sys.argv[2], output_formats=["parquet"],
                            shards=2, spark=spark)
        finally:
            spark.stop()
        print(pyspark.__version__)
        """,
        converted["raw"],
        out,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1].startswith("4.3")
    split = storage.join(out, "train", "parquet")
    # Written without petastorm: no Unischema, which petastorm's batch reader needs not (the
    # split's directory, as petastorm users open it: row groups from _common_metadata).
    with petastorm_io.make_batch_reader(
        split, num_epochs=1, shuffle_row_groups=False, reader_pool_type="dummy"
    ) as reader:
        ids = sorted(i for batch in reader for i in np.asarray(batch.id).tolist())
    assert ids == converted["data"]["train"]["ids"].tolist()
    with pytest.raises(formats.ParquetSchemaError, match="add_unischema"):
        petastorm_io.make_reader(split)
    petastorm_io.add_unischema(split)
    helpers.assert_images(make_reader_rows(split), converted["data"]["train"])
    # sparktf.predict on this stack over the same rows: the table it writes is plain Parquet.
    model = helpers.export("mnist_mlp", tmp_path / "export" / "1", seed=1, hidden_units=8)
    rows = sparktf.predict(
        spark.read.parquet(storage.spark_uri(split)), str(tmp_path / "export"), batch_size=8
    ).collect()
    direct = helpers.call(model, "predict_images", images=converted["data"]["train"]["images"])[
        "classes"
    ]
    assert [r["prediction"] for r in sorted(rows, key=lambda r: r["id"])] == direct.tolist()


@pytest.mark.e2e
def test_a_dataset_converted_onto_s3_reads_with_petastorms_readers(s3, tmp_path):
    """jobs/convert_mnist.py on this stack writes to the session's S3 store (this Spark's
    S3A connector, the keys from the environment). petastorm's make_reader and
    make_batch_reader read every row of it back through sparktf's S3 file system, and
    refuse the dataset once its commit marker is gone."""
    raw = tmp_path / "raw"
    data = write_mnist(raw, n_train=30, n_test=9, gzip=False, seed=7)
    out = f"{s3.fresh('petastorm')}/mnist"
    command = [sys.executable, "jobs/convert_mnist.py", "--input", raw, "--output", out]
    run = helpers.run_command([*command, "--shards", "2"], cwd=ROOT, timeout=400)
    assert run.returncode == 0, run.stderr[-3000:]
    split = storage.join(out, "train", "parquet")
    helpers.assert_images(make_reader_rows(split), data["train"])
    with petastorm_io.make_batch_reader(
        split, num_epochs=1, shuffle_row_groups=False, reader_pool_type="dummy"
    ) as reader:
        ids = sorted(int(i) for batch in reader for i in batch.id)
    assert ids == sorted(data["train"]["ids"].tolist())
    storage.delete(storage.join(out, storage.COMMIT_MARKER))
    with pytest.raises(storage.NotCommittedError, match="is not committed"):
        make_reader_rows(split)


@pytest.mark.unit
def test_sparktf_writes_the_row_groups_where_petastorm_reads_them():
    from petastorm.etl.dataset_metadata import ROW_GROUPS_PER_FILE_KEY

    assert formats.ROW_GROUPS_KEY == ROW_GROUPS_PER_FILE_KEY


@pytest.mark.unit
def test_this_is_the_second_stack():
    # The petastorm stack really is the second one: Spark 4.0, pyarrow 14, numpy 1.26.
    import pyarrow
    import pyspark

    assert pyspark.__version__.startswith("4.0.") and pyarrow.__version__.startswith("14.")
    assert np.__version__.startswith("1.26") and sys.version_info[:2] == (3, 11)
