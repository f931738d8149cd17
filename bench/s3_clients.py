"""The Python S3 clients sparktf could use, on one object store: uploads and whole reads of one
object with each of pyarrow's ``S3FileSystem``, boto3, s3fs and obstore, interleaved over
rounds; wall MB/s and this process's CPU seconds per GB. A one-off measurement behind the
choice of sparktf's S3 client (docs/storage-s3.md), not part of ``bench/all.sh``: the clients
other than pyarrow are not in sparktf's stacks, so run it with a Python that has them::

    set -a; eval "$(scripts/s3.sh start --dir /tmp/s3-bench)"; set +a
    python bench/s3_clients.py --mb 100 --rounds 3    # the python of a venv with the clients
    scripts/s3.sh stop --dir /tmp/s3-bench

The endpoint, keys and region come from the environment that ``scripts/s3.sh start`` prints.
A client whose package is missing is skipped and said so.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import resource
import statistics
import sys
import time
from urllib.parse import urlparse

CHUNK = 8 << 20


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _env() -> dict[str, str]:
    return {
        "endpoint": os.environ["AWS_ENDPOINT_URL"],
        "key": os.environ["AWS_ACCESS_KEY_ID"],
        "secret": os.environ["AWS_SECRET_ACCESS_KEY"],
        "region": os.environ.get("AWS_REGION", "us-east-1"),
    }


def pyarrow_client(env, bucket):
    import pyarrow.fs as pafs

    url = urlparse(env["endpoint"])
    fs = pafs.S3FileSystem(
        access_key=env["key"],
        secret_key=env["secret"],
        region=env["region"],
        endpoint_override=url.netloc,
        scheme=url.scheme,
    )

    def upload(key, data):
        with fs.open_output_stream(f"{bucket}/{key}") as f:
            for start in range(0, len(data), CHUNK):
                f.write(data[start : start + CHUNK])

    def read(key):
        with fs.open_input_stream(f"{bucket}/{key}") as f:
            return sum(len(block) for block in iter(lambda: f.read(CHUNK), b""))

    return upload, read


def _boto3(env):
    """A boto3 S3 client of the store ``env`` names, and the transfer settings of both
    boto3 variants (parts of CHUNK bytes)."""
    import boto3
    from boto3.s3.transfer import TransferConfig

    s3 = boto3.client(
        "s3",
        endpoint_url=env["endpoint"],
        aws_access_key_id=env["key"],
        aws_secret_access_key=env["secret"],
        region_name=env["region"],
    )
    return s3, TransferConfig(multipart_chunksize=CHUNK, multipart_threshold=CHUNK)


def boto3_client(env, bucket):
    s3, config = _boto3(env)

    def upload(key, data):
        s3.upload_fileobj(io.BytesIO(data), bucket, key, Config=config)

    def read(key):
        body = s3.get_object(Bucket=bucket, Key=key)["Body"]
        return sum(len(block) for block in iter(lambda: body.read(CHUNK), b""))

    return upload, read


def boto3_download_client(env, bucket):
    """boto3's transfer manager on reads too: ranged GETs in parallel threads."""
    upload, _ = boto3_client(env, bucket)
    s3, config = _boto3(env)

    def read(key):
        out = io.BytesIO()
        s3.download_fileobj(bucket, key, out, Config=config)
        return len(out.getbuffer())

    return upload, read


def s3fs_client(env, bucket):
    import s3fs

    fs = s3fs.S3FileSystem(
        key=env["key"],
        secret=env["secret"],
        endpoint_url=env["endpoint"],
        client_kwargs={"region_name": env["region"]},
        use_listings_cache=False,
    )

    def upload(key, data):
        with fs.open(f"{bucket}/{key}", "wb", block_size=CHUNK) as f:
            for start in range(0, len(data), CHUNK):
                f.write(data[start : start + CHUNK])

    def read(key):
        with fs.open(f"{bucket}/{key}", "rb", block_size=CHUNK) as f:
            return len(f.read())

    return upload, read


def obstore_client(env, bucket):
    import obstore
    from obstore.store import S3Store

    store = S3Store(
        bucket,
        endpoint=env["endpoint"],
        access_key_id=env["key"],
        secret_access_key=env["secret"],
        region=env["region"],
        client_options={"allow_http": True},
    )

    def upload(key, data):
        chunks = (data[start : start + CHUNK] for start in range(0, len(data), CHUNK))
        obstore.put(store, key, chunks, chunk_size=CHUNK)

    def read(key):
        return len(obstore.get(store, key).bytes())

    return upload, read


CLIENTS = {
    "pyarrow": pyarrow_client,
    "boto3": boto3_client,
    "boto3-transfer": boto3_download_client,
    "s3fs": s3fs_client,
    "obstore": obstore_client,
}


def _versions() -> dict[str, str]:
    found = {}
    for name in ("pyarrow", "boto3", "botocore", "s3fs", "obstore"):
        try:
            found[name] = __import__(name).__version__
        except (ImportError, AttributeError):
            pass
    return found


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mb", type=int, default=100, help="object size in MB (default 100)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    p.add_argument("--bucket", default="sparktf", help="an existing bucket (default sparktf)")
    p.add_argument("--clients", default=",".join(CLIENTS), help="comma-separated subset")
    p.add_argument("--json", help="write the results here too")
    args = p.parse_args(argv)
    env = _env()
    data = os.urandom(args.mb << 20)
    clients = {}
    for name in args.clients.split(","):
        try:
            clients[name] = CLIENTS[name](env, args.bucket)
        except ImportError as exc:
            print(f"{name}: skipped ({exc})", file=sys.stderr)
    runs: dict[str, dict[str, list[tuple[float, float]]]] = {
        name: {"upload": [], "read": []} for name in clients
    }
    for round_ in range(args.rounds):
        for name, (upload, read) in clients.items():
            key = f"bench/{name}-{round_}"
            cpu, wall = _cpu(), time.perf_counter()
            upload(key, data)
            runs[name]["upload"].append((time.perf_counter() - wall, _cpu() - cpu))
            cpu, wall = _cpu(), time.perf_counter()
            got = read(key)
            runs[name]["read"].append((time.perf_counter() - wall, _cpu() - cpu))
            if got != len(data):
                raise SystemExit(f"{name}: read {got} bytes of {len(data)}")
    gb = len(data) / 1e9
    summary = {}
    print(f"{args.mb} MB object, {args.rounds} rounds, medians: MB/s (client CPU s per GB)")
    for name, ops in runs.items():
        summary[name] = {}
        cells = []
        for op, samples in ops.items():
            wall = statistics.median(s[0] for s in samples)
            cpu = statistics.median(s[1] for s in samples)
            summary[name][op] = {"mb_s": len(data) / 1e6 / wall, "cpu_s_per_gb": cpu / gb}
            cells.append(f"{op} {len(data) / 1e6 / wall:7.0f} MB/s ({cpu / gb:5.2f})")
        print(f"  {name:15s} " + "   ".join(cells))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"mb": args.mb, "rounds": args.rounds, "versions": _versions(), **summary}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
