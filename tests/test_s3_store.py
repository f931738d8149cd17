"""scripts/s3.sh: a real S3-compatible store (SeaweedFS) with authentication on, keys made per
start, state in a private directory, nothing left running after ``stop``."""

from __future__ import annotations

import glob
import os
import stat
import time

import psutil
import pytest

from tests import helpers
from tests.conftest import ROOT

pytestmark = pytest.mark.e2e

S3_SH = ROOT / "scripts" / "s3.sh"


def _values(stdout: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in stdout.splitlines() if "=" in line)


def _client(values: dict[str, str], **credentials):
    import pyarrow.fs as pafs

    return pafs.S3FileSystem(
        endpoint_override=values["AWS_ENDPOINT_URL"].removeprefix("http://"),
        scheme="http",
        region=values["AWS_REGION"],
        connect_timeout=5,
        request_timeout=10,
        **credentials,
    )


def _refused(fs, path: str) -> str:
    with pytest.raises(OSError) as refused:
        fs.open_input_stream(path).read()
    return str(refused.value)


def _processes_of(directory) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        if any(str(directory) in part for part in proc.info["cmdline"] or ()):
            found.append(proc)
    return found


def test_s3_sh_start_authenticates_and_stop_leaves_nothing(tmp_path):
    state = tmp_path / "s3"
    args = ["--dir", state, "--bucket", "probe-bucket"]
    try:
        started = time.monotonic()
        out = helpers.run_command([S3_SH, "start", *args], timeout=120)
        assert out.returncode == 0, out.stderr
        took = time.monotonic() - started
        values = _values(out.stdout)
        assert set(values) == {
            "AWS_ENDPOINT_URL",
            "AWS_ACCESS_KEY_ID",
            "AWS_SECRET_ACCESS_KEY",
            "AWS_REGION",
            "S3_URI",
        }
        assert values["AWS_ENDPOINT_URL"].startswith("http://127.0.0.1:")
        assert values["S3_URI"] == "s3://probe-bucket"
        secret = values["AWS_SECRET_ACCESS_KEY"]
        assert len(secret) == 40 and len(values["AWS_ACCESS_KEY_ID"]) == 20
        # The keys are kept where only their owner reads them, and on no command line.
        assert stat.S_IMODE(state.stat().st_mode) == 0o700
        for name in ("identities.json", "ready.env"):
            assert stat.S_IMODE((state / name).stat().st_mode) == 0o600
        pid = int((state / "weed.pid").read_text())
        for proc in [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]:
            assert secret not in " ".join(proc.cmdline())
        # Every port it listens on is on loopback.
        assert {addr.ip for addr in helpers.listening(pid)} == {"127.0.0.1"}

        fs = _client(values, access_key=values["AWS_ACCESS_KEY_ID"], secret_key=secret)
        with fs.open_output_stream("probe-bucket/hello.txt") as f:
            f.write(b"hello")
        assert fs.open_input_stream("probe-bucket/hello.txt").read() == b"hello"
        anonymous = _refused(_client(values, anonymous=True), "probe-bucket/hello.txt")
        assert "ACCESS_DENIED" in anonymous
        wrong = _client(values, access_key=values["AWS_ACCESS_KEY_ID"], secret_key="x" * 40)
        assert "ACCESS_DENIED" in _refused(wrong, "probe-bucket/hello.txt")

        again = helpers.run_command([S3_SH, "start", *args], timeout=60)
        assert again.returncode == 0 and "already running" in again.stderr
        assert _values(again.stdout) == values
        status = helpers.run_command([S3_SH, "status", *args], timeout=60)
        assert status.returncode == 0 and f"running (pid {pid})" in status.stdout

        # A restart makes a new key; the objects stay, the old key no longer opens them.
        assert helpers.run_command([S3_SH, "stop", *args], timeout=60).returncode == 0
        out = helpers.run_command([S3_SH, "start", *args], timeout=120)
        assert out.returncode == 0, out.stderr
        renewed = _values(out.stdout)
        assert renewed["AWS_SECRET_ACCESS_KEY"] != secret
        fs = _client(
            renewed,
            access_key=renewed["AWS_ACCESS_KEY_ID"],
            secret_key=renewed["AWS_SECRET_ACCESS_KEY"],
        )
        assert fs.open_input_stream("probe-bucket/hello.txt").read() == b"hello"
        old = _client(renewed, access_key=values["AWS_ACCESS_KEY_ID"], secret_key=secret)
        assert "ACCESS_DENIED" in _refused(old, "probe-bucket/hello.txt")
        pid = int((state / "weed.pid").read_text())
        ports = (state / "ports").read_text().split()
    finally:
        stop = helpers.run_command([S3_SH, "stop", *args], timeout=60)
    assert stop.returncode == 0, stop.stderr
    assert not psutil.pid_exists(pid)
    assert _processes_of(state) == []
    assert not (state / "identities.json").exists() and not (state / "ready.env").exists()
    assert [s for p in ports for s in glob.glob(f"/tmp/seaweedfs-*-{p}.sock")] == []
    stopped = helpers.run_command([S3_SH, "stop", *args], timeout=60)
    assert stopped.returncode == 0 and "not running" in stopped.stdout
    status = helpers.run_command([S3_SH, "status", *args], timeout=60)
    assert status.returncode == 3 and "not running" in status.stdout
    assert took < 60


def test_s3_sh_refuses_a_dir_others_can_write(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    out = helpers.run_command([S3_SH, "start", "--dir", shared], timeout=60)
    assert out.returncode == 1
    assert "writable by others" in out.stderr
    assert not (shared / "identities.json").exists()
