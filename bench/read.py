"""Rows/s of the training readers from local disk, ``hdfs://`` and (``--s3``) ``s3://``,
against a plain stream of the same bytes from the same store and plain
``tf.data.TFRecordDataset``, same run.

    .venv/bin/python bench/read.py [--records 20000] [--batch-size 256] [--shards 4] [--rounds 3]
                                   [--budget SECONDS] [--datanodes 2] [--s3]

Converts a CIFAR-format dataset once (Spark, both formats, local disk), copies it to a
throwaway HDFS with ``--datanodes`` DataNodes (bench/common.hdfs) and, with ``--s3``, to a
throwaway S3-compatible store (bench/common.s3: SeaweedFS through scripts/s3.sh, on the
same machine; ``sparktf.storage.copy_tree``, then an empty commit marker, without which
sparktf's readers refuse an S3 directory), then per round, round robin (bench/common.py),
reads one epoch with each reader, timed over the whole job: from creating the reader to its
last row. The HDFS readers' bulk reads go through WebHDFS, or
hdfs-native with SPARKTF_HDFS_CLIENT=native (sparktf.storage; the result names the client
used); the S3 readers' through sparktf's boto3 client (sparktf.storage.s3). ``--s3`` is off
by default (at bench/all.sh's 48,000 records the store's start and the copy add about 15 s
on 2 cores, and each round about 3 s); bench/all.sh passes it.

* ``raw_stream_{tfrecord,parquet}_hdfs``: the baseline for the HDFS readers -- the split's
  part files of that format streamed one after the other over plain WebHDFS
  (``op=OPEN``, 4 MiB reads, bytes dropped): the transport's bandwidth for the same bytes;
  with hdfs-native installed, ``raw_stream_{tfrecord,parquet}_native`` too (for scale);
* ``raw_stream_{tfrecord,parquet}_s3`` (``--s3``): the baseline for the S3 readers -- the
  same part files streamed one after the other from the S3 store with plain boto3 (one
  ``get_object`` each, its body read in 4 MiB blocks, bytes dropped; a client made once,
  path-style, from the endpoint, keys and region ``sparktf.security.aws.s3_settings``
  resolves: what ``AWS_*`` gives any AWS tool), the fastest plain Python client on this
  store (docs/running.md, "Why boto3"); ``raw_stream_{tfrecord,parquet}_s3_pyarrow``
  too, for scale: pyarrow's ``S3FileSystem.open_input_stream``, 4 MiB reads;
* ``baseline_tfrecorddataset_local``: ``tf.data.TFRecordDataset`` over the same local
  files with batched parsing (``batch`` then ``tf.io.parse_example`` and ``decode_raw``),
  how a tuned local pipeline reads;
* ``readers.tfrecord_dataset`` and ``readers.parquet_dataset``, local, HDFS and (``--s3``)
  S3 (and shuffled, local); petastorm's ``make_batch_reader`` from HDFS (undecoded column
  batches, through sparktf's file system, a worker thread per part file up to 4); for scale,
  petastorm's row-by-row ``make_reader`` on a slice, once.

Goals: each HDFS reader >= 0.8x the raw WebHDFS stream of its format, each S3 reader
>= 0.8x the raw S3 GET stream (boto3) of its format, in MB/s of the same bytes;
``read.hdfs_cpu_per_gb_over_local_{tfrecord,parquet}`` and (``--s3``)
``read.s3_cpu_per_gb_over_local_{tfrecord,parquet}`` <= 1.15: the reading process's own CPU
seconds per GB (``time.process_time``) with ``tfrecord_dataset`` / ``parquet_dataset``
reading from HDFS (S3) over the same reader's from local disk, same run, median of the
rounds (the store's server's CPU not counted). Peak memory is sampled while reading. CPU
seconds per GB (this process plus the store's server: the HDFS JVM, NameNode and DataNodes,
for the HDFS and local cases, SeaweedFS's ``weed`` for the S3 cases; ``cpu_s_per_gb_of``
splits them) and the cores kept busy are recorded for every case;
``ratio_ceiling_if_cpu_bound`` is raw stream CPU/GB over reader CPU/GB, the most a reader's
ratio can reach where the raw stream already keeps every core busy (as it does on 2 cores,
where the DataNodes or SeaweedFS share the reader's machine). Prints JSON and writes it to
bench/results/.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from sparktf import storage
from sparktf.datasets import conversion as convert
from sparktf.datasets import formats, petastorm_io
from sparktf.datasets.synthetic import write_cifar10


def one_pass(make) -> tuple[float, int]:
    """(seconds, rows) from creating the reader to its last row."""
    started = time.perf_counter()
    rows = sum(int(batch["id"].shape[0]) for batch in make())
    return time.perf_counter() - started, rows


def raw_stream(files: list[str], chunk: int = 4 << 20) -> tuple[float, int]:
    """(seconds, bytes) to stream ``files`` (hdfs:// URIs) over plain WebHDFS, in order."""
    import urllib.parse
    import urllib.request

    from sparktf import storage

    base = os.environ["SPARKTF_WEBHDFS_URL"].rstrip("/")
    user = urllib.parse.quote(storage.hdfs_user())
    started = time.perf_counter()
    total = 0
    for uri in files:
        path = urllib.parse.quote(storage.parse(uri).path)
        url = f"{base}/webhdfs/v1{path}?op=OPEN&user.name={user}"
        with urllib.request.urlopen(url, timeout=120) as response:
            while block := response.read(chunk):
                total += len(block)
    return time.perf_counter() - started, total


def raw_stream_native(files: list[str], chunk: int = 4 << 20) -> tuple[float, int]:
    """(seconds, bytes) to stream ``files`` with hdfs-native (RPC + DataNode protocol)."""
    import hdfs_native

    client = hdfs_native.Client("hdfs://" + storage.parse(files[0]).netloc)
    started = time.perf_counter()
    total = 0
    for uri in files:
        with client.read(storage.parse(uri).path) as f:
            for block in f.read_range_stream(0, f.size):
                total += len(block)
    return time.perf_counter() - started, total


def s3_boto3_client():
    """A plain boto3 S3 client of the store ``AWS_*`` names (as sparktf resolves it)."""
    import boto3
    from botocore.config import Config

    from sparktf.security.aws import s3_settings

    settings = s3_settings()
    return boto3.client(
        "s3",
        endpoint_url=settings.endpoint,
        region_name=settings.region or "us-east-1",
        aws_access_key_id=settings.access_key,
        aws_secret_access_key=settings.secret_key,
        aws_session_token=settings.token,
        config=Config(s3={"addressing_style": "path"}),
    )


def s3_arrow_filesystem():
    """A plain pyarrow ``S3FileSystem`` of the same store."""
    from urllib.parse import urlparse

    from pyarrow import fs as pafs

    from sparktf.security.aws import s3_settings

    settings = s3_settings()
    endpoint = urlparse(settings.endpoint or "")
    return pafs.S3FileSystem(
        access_key=settings.access_key,
        secret_key=settings.secret_key,
        session_token=settings.token,
        region=settings.region or "us-east-1",
        endpoint_override=endpoint.netloc or None,
        scheme=endpoint.scheme or "https",
    )


def raw_stream_s3(client, files: list[str], chunk: int = 4 << 20) -> tuple[float, int]:
    """(seconds, bytes) to stream ``files`` (s3:// URIs) with boto3, one GetObject each, in
    order."""
    started = time.perf_counter()
    total = 0
    for uri in files:
        loc = storage.parse(uri)
        body = client.get_object(Bucket=loc.netloc, Key=loc.path.lstrip("/"))["Body"]
        while block := body.read(chunk):
            total += len(block)
    return time.perf_counter() - started, total


def raw_stream_s3_pyarrow(fs, files: list[str], chunk: int = 4 << 20) -> tuple[float, int]:
    """(seconds, bytes) to stream ``files`` (s3:// URIs) with pyarrow's S3FileSystem."""
    started = time.perf_counter()
    total = 0
    for uri in files:
        loc = storage.parse(uri)
        with fs.open_input_stream(loc.netloc + loc.path) as f:
            while block := f.read(chunk):
                total += len(block)
    return time.perf_counter() - started, total


def native_available() -> bool:
    try:
        import hdfs_native  # noqa: F401
    except ImportError:
        return False
    return True


def petastorm_batches(path: list[str]):
    """petastorm's make_batch_reader over a split's Parquet files, as {"id": ...} batches;
    one worker thread per part file (up to 4): the shards stream concurrently."""
    with petastorm_io.make_batch_reader(
        path, num_epochs=1, shuffle_row_groups=False, workers_count=max(1, min(4, len(path)))
    ) as reader:
        for batch in reader:
            yield {"id": batch.id}


def baseline(files: list[str], batch_size: int):
    import tensorflow as tf

    spec = {k: v for k, v in formats.feature_spec("image").items() if k in ("image", "label", "id")}

    def parse(serialized):
        f = tf.io.parse_example(serialized, spec)
        image = tf.reshape(tf.io.decode_raw(f["image"], tf.uint8), [-1, 32, 32, 3])
        return {"image": image, "label": f["label"], "id": f["id"]}

    return (
        tf.data.TFRecordDataset(files, num_parallel_reads=4)
        .batch(batch_size)
        .map(parse, num_parallel_calls=tf.data.AUTOTUNE)
        .prefetch(tf.data.AUTOTUNE)
    )


def petastorm_rowwise(path: str, limit: int) -> float:
    with petastorm_io.make_reader(
        path, num_epochs=1, shuffle_row_groups=False, workers_count=2
    ) as reader:
        started = time.perf_counter()
        n = 0
        for _ in reader:
            n += 1
            if n >= limit:
                break
        return n / (time.perf_counter() - started)


def copy_to_s3(local: str, remote: str) -> None:
    """``storage.copy_tree`` of the local dataset to ``remote``, then its commit marker (an
    empty one, written last): sparktf's readers refuse an S3 directory without it."""
    storage.copy_tree(local, remote)
    storage.write_bytes(storage.join(remote, storage.COMMIT_MARKER), b"")


def store_of(name: str) -> str:
    """The remote store of a reader case: the last part of its name (``hdfs`` or ``s3``)."""
    return name.rsplit("_", 1)[1]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=20_000, help="training records")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--shards", type=int, default=4, help="part files of the dataset")
    common.add_rounds(parser)
    parser.add_argument(
        "--rowwise-limit",
        type=int,
        default=2_000,
        help="rows read by the row-by-row petastorm reader",
    )
    parser.add_argument(
        "--datanodes",
        type=common.positive_int,
        default=2,
        help="DataNodes of the throwaway HDFS (default 2: concurrent streams hit both)",
    )
    parser.add_argument(
        "--s3",
        action="store_true",
        help="also read from a throwaway S3 store (SeaweedFS, scripts/s3.sh) against a plain "
        "S3 GET stream (off by default: about 15 s more, and 3 s a round, at 48,000 records "
        "on 2 cores; bench/all.sh passes it)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    result: dict = {
        "benchmark": "read",
        "machine": common.machine(),
        "records": args.records,
        "batch_size": args.batch_size,
        "shards": args.shards,
        "datanodes": args.datanodes,
        "s3": common.s3_store_name() if args.s3 else "not measured (--s3)",
        "hdfs_client": storage.hdfs_client_kind(),
        "window": "reader created to last row; raw stream: first request to last byte",
        "startup_s": {},
    }
    with (
        tempfile.TemporaryDirectory(prefix="sparktf-bench-read-") as work,
        common.hdfs(datanodes=args.datanodes) as hdfs_uri,
        contextlib.ExitStack() as stack,
    ):
        from sparktf.spark import get_session

        write_cifar10(f"{work}/raw", n_train=args.records, n_test=10, seed=1)
        seconds, spark = common.timed(get_session, "sparktf-bench-read")
        result["startup_s"]["spark_session"] = round(seconds, 2)
        local = f"{work}/cifar"
        convert.convert("cifar10", f"{work}/raw", local, shards=args.shards, spark=spark)
        spark.stop()
        remote = f"{hdfs_uri}/bench/cifar"
        seconds, _ = common.timed(storage.copy_tree, local, remote)
        result["copy_to_hdfs_s"] = round(seconds, 2)
        s3_uri = None
        if args.s3:  # after Spark: its session would take the store's settings too
            seconds, s3_uri = common.timed(stack.enter_context, common.s3())
            result["startup_s"]["s3_store"] = round(seconds, 2)
            s3_remote = f"{s3_uri}/bench/cifar"
            seconds, _ = common.timed(copy_to_s3, local, s3_remote)
            result["copy_to_s3_s"] = round(seconds, 2)

        from sparktf.datasets import readers

        manifest = formats.load_manifest(local)

        def split_files(where: str, fmt: str) -> list[str]:
            return formats.split_files(manifest, where, "train", fmt)

        files = [storage.parse(f).path for f in split_files(local, formats.TFRECORD)]
        nbytes = {
            fmt: sum(os.path.getsize(storage.parse(f).path) for f in split_files(local, fmt))
            for fmt in (formats.TFRECORD, formats.PARQUET)
        }
        result["split_bytes"] = nbytes
        bs = args.batch_size
        cases = {
            "baseline_tfrecorddataset_local": lambda: baseline(files, bs),
            "tfrecord_local": lambda: readers.tfrecord_dataset(f"{local}/train", batch_size=bs),
            "tfrecord_hdfs": lambda: readers.tfrecord_dataset(f"{remote}/train", batch_size=bs),
            "parquet_local": lambda: readers.parquet_dataset(f"{local}/train", batch_size=bs),
            "parquet_hdfs": lambda: readers.parquet_dataset(f"{remote}/train", batch_size=bs),
            "petastorm_batch_reader_hdfs": lambda: petastorm_batches(
                split_files(remote, formats.PARQUET)
            ),
            "tfrecord_local_shuffled": lambda: readers.tfrecord_dataset(
                f"{local}/train", batch_size=bs, shuffle=True
            ),
            "parquet_local_shuffled": lambda: readers.parquet_dataset(
                f"{local}/train", batch_size=bs, shuffle=True
            ),
        }
        # the readers of a remote store: their format (the store: the name's last part)
        fmt_of = {
            "tfrecord_hdfs": formats.TFRECORD,
            "parquet_hdfs": formats.PARQUET,
            "petastorm_batch_reader_hdfs": formats.PARQUET,
        }
        stores = ["hdfs"]
        s3_streams = {}  # name suffix: stream of a split's files (s3:// URIs)
        if s3_uri is not None:
            stores.append("s3")
            cases["tfrecord_s3"] = lambda: readers.tfrecord_dataset(
                f"{s3_remote}/train", batch_size=bs
            )
            cases["parquet_s3"] = lambda: readers.parquet_dataset(
                f"{s3_remote}/train", batch_size=bs
            )
            fmt_of.update(tfrecord_s3=formats.TFRECORD, parquet_s3=formats.PARQUET)
            boto3_client, arrow_fs = s3_boto3_client(), s3_arrow_filesystem()  # made once
            s3_streams = {
                "s3": lambda files: raw_stream_s3(boto3_client, files),
                "s3_pyarrow": lambda files: raw_stream_s3_pyarrow(arrow_fs, files),
            }
        petastorm = petastorm_io.available()
        if not petastorm:  # the default stack: petastorm is on the second one
            result["petastorm"] = "not installed (scripts/setup.sh --stack petastorm has it)"
            del cases["petastorm_batch_reader_hdfs"], fmt_of["petastorm_batch_reader_hdfs"]
        rows_per_s, mb_per_s = common.Rounds(), common.Rounds()
        cpu_per_gb, own_per_gb, server_per_gb = common.Rounds(), common.Rounds(), common.Rounds()
        cores_busy = common.Rounds()

        def measured(name: str, fmt: str, run):
            """``run()`` timed, with the CPU of this process and of the store's server (the
            HDFS JVM; SeaweedFS for the S3 cases) per GB."""
            server = s3_uri.pid if name.endswith(("_s3", "_s3_pyarrow")) else hdfs_uri.pid
            with common.CpuTime(server) as cpu:
                own = time.process_time()  # this process, to the nanosecond (psutil: ticks)
                seconds, count = run()
                own = time.process_time() - own
            mb_per_s.add(name, nbytes[fmt] / seconds / 1e6)
            gb = nbytes[fmt] / 1e9
            cpu_per_gb.add(name, (own + cpu.others) / gb)
            own_per_gb.add(name, own / gb)
            server_per_gb.add(name, cpu.others / gb)
            cores_busy.add(name, (cpu.own + cpu.others) / seconds)
            return seconds, count

        native = native_available()
        with common.PeakMemory() as memory:
            rounds = common.RoundBudget.from_args(args)
            for _ in rounds:  # round robin: load drifts hit all alike
                for fmt in (formats.TFRECORD, formats.PARQUET):
                    streams = {f"raw_stream_{fmt}_hdfs": raw_stream}
                    if native:
                        streams[f"raw_stream_{fmt}_native"] = raw_stream_native
                    for suffix, stream in s3_streams.items():
                        streams[f"raw_stream_{fmt}_{suffix}"] = stream
                    for name, stream in streams.items():
                        where = s3_remote if "_s3" in name else remote
                        _, got = measured(
                            name, fmt, lambda s=stream, f=fmt, w=where: s(split_files(w, f))
                        )
                        assert got == nbytes[fmt], (name, got, nbytes[fmt])
                for name, make in cases.items():
                    fmt = fmt_of.get(name, formats.TFRECORD if "tfrecord" in name else "parquet")
                    seconds, rows = measured(name, fmt, lambda m=make: one_pass(m))
                    assert rows == args.records, (name, rows)
                    rows_per_s.add(name, rows / seconds)
            limit = min(args.rowwise_limit, args.records)
            if petastorm:
                result["petastorm_make_reader_rowwise_local_rows_per_s"] = round(
                    petastorm_rowwise(f"{local}/train/parquet", limit)
                )
        rounds.record(result)
        result["rows_per_s"] = rows_per_s.report(0)
        result["mb_per_s"] = mb_per_s.report(1)
        rates = rows_per_s.medians()
        base = rates["baseline_tfrecorddataset_local"]
        result["ratio_vs_tfrecorddataset_local"] = {k: round(v / base, 2) for k, v in rates.items()}
        mbs = mb_per_s.medians()
        stream_label = {"hdfs": "raw WebHDFS stream", "s3": "raw S3 GET stream"}
        result["goals"] = {
            f"{name} / {stream_label[store_of(name)]}": common.goal(
                common.ratio(mbs[name], mbs[f"raw_stream_{fmt}_{store_of(name)}"]), 0.8
            )
            for name, fmt in fmt_of.items()
        }
        # CPU (this process + the HDFS JVM) per GB read, and cores kept busy: on a machine
        # whose cores the raw stream already fills, a reader's ratio cannot pass the ratio of
        # the CPU each spends per byte (it parses too, on the same cores as the DataNodes).
        result["cpu_s_per_gb"] = cpu_per_gb.report(2)
        result["cpu_s_per_gb_of"] = {
            "reader": own_per_gb.report(2)["median"],
            "store_server": server_per_gb.report(2)["median"],
        }
        # The reading process's own CPU per GB, HDFS (S3) over local disk, same reader, same
        # run (the store's server's CPU not counted: on a cluster it runs elsewhere).
        own = own_per_gb.medians()
        for store in stores:
            result[f"{store}_cpu_per_gb_over_local"] = {}
            for fmt in (formats.TFRECORD, formats.PARQUET):
                over = common.ratio(own[f"{fmt}_{store}"], own[f"{fmt}_local"])
                rounded = None if over is None else round(over, 3)
                result[f"{store}_cpu_per_gb_over_local"][fmt] = rounded
                result["goals"][f"read.{store}_cpu_per_gb_over_local_{fmt}"] = common.goal(
                    over, 1.15, "<="
                )
        result["cores_busy"] = cores_busy.report(2)
        cpu = cpu_per_gb.medians()
        result["ratio_ceiling_if_cpu_bound"] = {
            name: round(cpu[f"raw_stream_{fmt}_{store_of(name)}"] / cpu[name], 3)
            for name, fmt in fmt_of.items()
        }
        result["peak_memory_while_reading"] = memory.report()
    result["finished_at"] = time.strftime("%Y-%m-%d %H:%M:%S")
    common.write_results("read", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
