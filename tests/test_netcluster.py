"""``scripts/netcluster.sh``: several hosts on this machine, from network and mount namespaces.

The multi-host tests build on it: each host has its own address on a bridge of its own and
a private ``/tmp`` and ``/dev/shm``, and ``stop`` leaves no namespace, link, mount or process.
Without root or namespaces (a CI machine in a container), the tests skip and say why.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import helpers
from tests.conftest import ROOT

pytestmark = pytest.mark.e2e

SCRIPT = ROOT / "scripts" / "netcluster.sh"


def _namespaces_usable() -> str | None:
    """Why namespaces cannot be made here, or None."""
    from tests.multihost import namespaces_usable

    return namespaces_usable()


@pytest.fixture
def cluster(tmp_path, monkeypatch):
    why = _namespaces_usable()
    if why:
        pytest.skip(f"multi-host tests {why}")
    monkeypatch.setenv("SPARKTF_NETCLUSTER_DIR", str(tmp_path / "state"))
    name = "t" + "".join(secrets.choice("abcdefghijkmnpqrstuvwxyz") for _ in range(5))
    out = helpers.run_command([SCRIPT, "start", "a", "b", "out", "--name", name], timeout=60)
    try:
        assert out.returncode == 0, out.stderr
        hosts = dict(line.split("=", 1) for line in out.stdout.split())
        yield name, hosts
    finally:
        helpers.run_command([SCRIPT, "stop", name], timeout=60)


def on(name: str, host: str, *command: str, **kwargs) -> subprocess.CompletedProcess:
    return helpers.run_command([SCRIPT, "exec", name, host, "--", *command], timeout=60, **kwargs)


def test_hosts_reach_each_other_and_keep_their_disks_to_themselves(cluster, tmp_path):
    name, hosts = cluster
    assert hosts == {"a": "10.231.0.11", "b": "10.231.0.12", "out": "10.231.0.13"}
    server = subprocess.Popen(
        [SCRIPT, "exec", name, "b", "--", sys.executable, "-c",
         "import socket\n"
         "s = socket.socket(); s.bind(('10.231.0.12', 5555)); s.listen()\n"
         "print('listening', flush=True)\n"
         "c, peer = s.accept(); print(peer[0], flush=True)\n"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert server.stdout.readline().strip() == "listening"
        connect = "import socket; socket.create_connection(('10.231.0.12', 5555), 5)"
        client = on(name, "a", sys.executable, "-c", connect)
        assert client.returncode == 0, client.stderr
        assert server.stdout.readline().strip() == "10.231.0.11"  # from a's own address
    finally:
        server.kill()
        server.wait()
    # each host's /tmp and /dev/shm are its own: written on a, seen neither on b nor here
    marker = f"netcluster-{secrets.token_hex(4)}"
    assert on(name, "a", "sh", "-c", f"touch /tmp/{marker} /dev/shm/{marker}").returncode == 0
    assert on(name, "a", "ls", f"/tmp/{marker}").returncode == 0
    assert on(name, "b", "ls", f"/tmp/{marker}", f"/dev/shm/{marker}").returncode != 0
    assert not os.path.exists(f"/tmp/{marker}") and not os.path.exists(f"/dev/shm/{marker}")
    # every host resolves the others by name; the machine's own /etc/hosts is left alone
    named = on(name, "a", "getent", "hosts", f"b.{name}.test").stdout.split()
    assert named[:2] == ["10.231.0.12", f"b.{name}.test"], named
    assert f"b.{name}.test" not in Path("/etc/hosts").read_text()
    # nothing of the machine's network inside: a host has its link and loopback, no route out
    routes = on(name, "a", "ip", "route").stdout
    assert routes.split() == ["10.231.0.0/24", "dev", "eth0", "proto", "kernel", "scope",
                              "link", "src", "10.231.0.11"], routes  # fmt: skip


def test_stop_leaves_no_namespace_link_mount_or_process(tmp_path, monkeypatch):
    why = _namespaces_usable()
    if why:
        pytest.skip(f"multi-host tests {why}")
    state = tmp_path / "state"
    monkeypatch.setenv("SPARKTF_NETCLUSTER_DIR", str(state))
    name = "t" + "".join(secrets.choice("abcdefghijkmnpqrstuvwxyz") for _ in range(5))
    assert helpers.run_command([SCRIPT, "start", "a", "b", "--name", name]).returncode == 0
    sleeper = subprocess.Popen([SCRIPT, "exec", name, "b", "--", "sleep", "600"])
    time.sleep(0.5)
    again = helpers.run_command([SCRIPT, "start", "a", "--name", name])
    assert again.returncode == 1 and "is running" in again.stderr  # one cluster per name
    assert helpers.run_command([SCRIPT, "stop", name]).returncode == 0
    assert sleeper.wait(10) == -9  # killed with its host
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert name not in namespaces
    assert f"v{name}" not in subprocess.run(["ip", "link"], capture_output=True, text=True).stdout
    assert str(state) not in open("/proc/self/mountinfo").read()
    assert not (state / name).exists()
    bad = helpers.run_command([SCRIPT, "start", "a", "--name", "Bad-Name"])
    assert bad.returncode == 2 and "--name" in bad.stderr


def test_every_subcommand_refuses_a_name_that_is_not_a_plain_word(tmp_path, monkeypatch):
    """NAME (and exec's HOST) become paths that ``stop`` unmounts and removes as root, and
    the prefix of the namespaces it deletes: every subcommand refuses anything but 1-8
    lowercase letters and digits (6 for a host), before it touches anything. ``stop
    ../victim`` used to remove the directory beside the state directory, and a NAME such as
    ``t.*`` was a regular expression over every namespace's name."""
    state, victim = tmp_path / "state", tmp_path / "victim"
    state.mkdir()
    victim.mkdir()
    (victim / "kept").write_text("not netcluster's\n")
    monkeypatch.setenv("SPARKTF_NETCLUSTER_DIR", str(state))
    for args in (
        ["stop", "../victim"],
        ["status", "../victim"],
        ["exec", "../victim", "a", "--", "true"],
        ["exec", "ok", "../../x", "--", "true"],
        ["stop", "t.*"],
        ["stop", "a b"],
        ["stop", ""],
    ):
        out = helpers.run_command([SCRIPT, *args], timeout=60)
        assert out.returncode == 2, (args, out.stdout, out.stderr)
        assert "lowercase letters and digits" in out.stderr, (args, out.stderr)
    assert (victim / "kept").read_text() == "not netcluster's\n"
    assert list(state.iterdir()) == []
