"""A multi-host cluster on this machine for the tests (``tests/test_multihost.py``): hosts
from ``scripts/netcluster.sh``, HDFS (``scripts/hdfs.sh --host``) on one, a Spark standalone
master on another, a worker on each of two more, and the driver's host; an outsider host
that the run never uses.

Every host has a private ``/tmp``, on disk (:meth:`MultiHost.mount_disks`): what must be
shared (the Hadoop client configuration, the standalone cluster's secret) is written to the
cluster's state directory, as a site would put it on every node.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from tests import helpers

ROOT = Path(__file__).resolve().parent.parent  # not conftest's: bench/wire.py runs these hosts

SCRIPT = ROOT / "scripts" / "netcluster.sh"
HOSTS = ("nn", "master", "w1", "w2", "drv", "out")


def hosts_with(workers: int) -> tuple[str, ...]:
    """:data:`HOSTS` with ``workers`` worker hosts (w1, w2, ...) in place of two."""
    return ("nn", "master", *(f"w{i}" for i in range(1, workers + 1)), "drv", "out")


STANDALONE = [ROOT / "scripts" / "submit.sh", "--profile", "standalone"]
SUBMIT = [*STANDALONE, "--executor-cores", "1", "--executor-memory", "1g"]  # one slot each
# the jobs other than training: two such executors (one on each worker host), not the 12 of
# the profile's spark.cores.max (16) that fit, each a JVM to start for 64 rows
SUBMIT_TWO = [*SUBMIT, "--total-executor-cores", "2"]
WORKER_SPARK = "/tmp/spark"  # where the worker hosts have Spark (their own /tmp)


def namespaces_usable() -> str | None:
    """Why namespaces cannot be made here, or None."""
    if os.geteuid() != 0:
        return "needs root"
    for where in (ROOT, Path(sys.prefix)):
        if str(where.resolve()).startswith(("/tmp/", "/dev/shm/")):
            return f"cannot see {where} from its hosts: each has a private /tmp and /dev/shm"
    if not shutil.which("ip") or not shutil.which("nsenter"):
        return "needs iproute2 and util-linux"
    name = f"stfprobe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", name], capture_output=True)
    return None


DISKS = Path("/var/tmp")  # the hosts' /tmp lie here (MultiHost.mount_disks)
# A shipped environment is
# fetched and unpacked on each worker host: 0.8 GB packed and 2.2 GB unpacked (measured,
# default stack), twice, with a margin for the datasets, the models and the logs.
DISK_NEEDED_GIB = 7.0


def disk_short(where: Path = DISKS) -> str | None:
    """Why the hosts' disks would fill, or None. A full disk makes a standalone Worker fail
    every executor it launches ("Unable to create executor due to No space left on
    device"), and the master relaunches them for as long as the application lives: a CI
    run spent half an hour so once, and every other test's tmp_path failed beside it."""
    free = shutil.disk_usage(where).free / 2**30
    if free >= DISK_NEEDED_GIB:
        return None
    return f"need {DISK_NEEDED_GIB:.0f} GiB free under {where} for the hosts' disks: {free:.1f}"


def new_name() -> str:
    return "t" + "".join(secrets.choice("abcdefghijkmnpqrstuvwxyz") for _ in range(5))


@contextmanager
def started(
    *,
    kerberos: bool = False,
    cores: int = 1,
    memory: str = "2g",
    workers: int = 2,
    hdfs: bool = True,
) -> Iterator[MultiHost]:
    """A new cluster of :data:`HOSTS` (with ``workers`` worker hosts): HDFS (Kerberized with
    ``kerberos``; none without ``hdfs``) on nn, a Spark standalone master on master, a worker
    of ``cores`` and ``memory`` on each worker host; stopped and removed on exit. Skips the
    test where namespaces cannot be made (raises outside pytest)."""
    why = namespaces_usable() or disk_short()
    if why:
        if "pytest" not in sys.modules:
            raise RuntimeError(f"multi-host runs {why}")
        import pytest

        pytest.skip(f"multi-host tests {why}")
    name = new_name()
    # not under /tmp: each host has its own /tmp, and the shared files live here
    state = Path("/run") / f"sparktf-test-{name}"
    out = helpers.run_command(
        [SCRIPT, "start", *hosts_with(workers), "--name", name],
        env={**os.environ, "SPARKTF_NETCLUSTER_DIR": str(state)},
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    made = MultiHost(name, state, dict(line.split("=", 1) for line in out.stdout.split()))
    try:
        made.mount_disks()
        if hdfs:
            made.start_hdfs(kerberos=kerberos)
        made.start_spark(cores=cores, memory=memory)
        yield made
    finally:
        made.stop()
        shutil.rmtree(state, ignore_errors=True)


class MultiHost:
    """The hosts of one ``netcluster.sh`` cluster and what runs on them."""

    def __init__(self, name: str, state: Path, hosts: dict[str, str]):
        self.name, self.state, self.hosts = name, state, hosts
        self.workers = [host for host in hosts if re.fullmatch(r"w\d+", host)]
        self.hdfs: dict[str, str] = {}
        self.shared = state / name / "shared"
        self.shared.mkdir(mode=0o700)
        self.disks = DISKS / f"sparktf-test-{name}"  # the hosts' /tmp
        self.daemons: list[subprocess.Popen] = []
        self.env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("SPARKTF_", "SPARK_", "HADOOP_", "PYSPARK_", "TMPDIR"))
        }
        self.env["SPARKTF_NETCLUSTER_DIR"] = str(state)

    def mount_disks(self) -> None:
        """Gives every host a ``/tmp`` on disk, a directory of its own under :attr:`disks`
        (netcluster.sh gives it one in memory): a shipped environment is unpacked there, a
        few GB on each host, as on the disks of a real cluster's nodes."""
        self.disks.mkdir(mode=0o700)
        for host in self.hosts:
            disk = self.disks / host
            disk.mkdir()
            disk.chmod(0o1777)  # as /tmp (inside a directory of root's alone)
            out = self.run(host, "mount", "--bind", disk, "/tmp")
            assert out.returncode == 0, out.stderr

    def command(self, host: str, *command) -> list[str]:
        return [str(SCRIPT), "exec", self.name, host, "--", *map(str, command)]

    def run(self, host: str, *command, env=None, timeout: float = 300):
        return helpers.run_command(
            self.command(host, *command), env={**self.env, **(env or {})}, timeout=timeout
        )

    def spawn(self, host: str, *command, env=None, log: str) -> subprocess.Popen:
        out = open(self.shared / log, "w")
        proc = subprocess.Popen(
            self.command(host, *command),
            env={**self.env, **(env or {})},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        self.daemons.append(proc)
        return proc

    # ------------------------------------------------------------------ HDFS and Spark

    def name_of(self, host: str) -> str:
        """``host``'s name, as every host resolves it (``HOST.NAME.test``)."""
        return f"{host}.{self.name}.test"

    def known_as(self, host: str) -> set[str]:
        """What names ``host``: its address, its name."""
        return {self.hosts[host], self.name_of(host)}

    def start_hdfs(self, *, kerberos: bool = False) -> str:
        """HDFS on nn at its address; with ``kerberos`` at its name (the services'
        principals are ``hdfs/`` and ``HTTP/`` of it), its KDC's files in the shared
        directory (as a site puts krb5.conf on every host and the user's keytab on the
        driver's)."""
        args = ["--dir", "/tmp/hdfs"]
        if kerberos:
            args = ["--dir", self.shared / "hdfs", "--kerberos"]
        host = self.name_of("nn") if kerberos else self.hosts["nn"]
        out = self.run(
            "nn", ROOT / "scripts" / "hdfs.sh", "start", "--host", host, *args,
            "--conf-dir", self.shared / "hadoop", timeout=240,
        )  # fmt: skip
        assert out.returncode == 0, out.stdout + out.stderr
        self.hdfs = dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)
        self.hdfs_dir = self.shared / "hdfs" if kerberos else Path("/tmp/hdfs")
        return self.hdfs["HDFS_URI"]

    def start_spark(self, cores: int = 1, memory: str = "2g") -> str:
        import pyspark

        home = Path(pyspark.__file__).parent
        secret = secrets.token_hex(32)
        conf = self.shared / "spark-conf"
        conf.mkdir(mode=0o700)
        (conf / "spark-defaults.conf").write_text(
            f"spark.authenticate true\nspark.authenticate.secret {secret}\n"
            "spark.network.crypto.enabled true\n"
        )
        (self.shared / "secret.conf").write_text(f"spark.authenticate.secret {secret}\n")
        os.chmod(self.shared / "secret.conf", 0o600)
        master = self.hosts["master"]
        self.master_url = f"spark://{master}:7077"
        daemon_env = {"SPARK_HOME": str(home), "SPARK_CONF_DIR": str(conf)}
        self.spawn(
            "master", home / "bin" / "spark-class", "org.apache.spark.deploy.master.Master",
            "--host", master, "--port", "7077", "--webui-port", "8080",
            env={**daemon_env, "SPARK_LOCAL_IP": master}, log="master.log",
        )  # fmt: skip
        # Each worker host has Spark of its own (pyspark's directory bind-mounted on its
        # /tmp/spark), as a site installs Spark on every node: the driver's venv can then be
        # hidden from it (:meth:`hidden`).
        own = {**daemon_env, "SPARK_HOME": WORKER_SPARK}
        for worker in self.workers:
            address = self.hosts[worker]
            self.spawn(
                worker, "sh", "-c", 'mkdir "$1" && mount --bind "$0" "$1" && shift && exec "$@"',
                home, WORKER_SPARK, f"{WORKER_SPARK}/bin/spark-class",
                "org.apache.spark.deploy.worker.Worker",
                "--host", address, "--cores", str(cores), "--memory", memory,
                "--work-dir", "/tmp/work", self.master_url,
                env={**own, "SPARK_LOCAL_IP": address, "PYSPARK_PYTHON": sys.executable},
                log=f"{worker}.log",
            )  # fmt: skip
        self._await_workers(len(self.workers))
        return self.master_url

    def _await_workers(self, count: int, timeout_s: float = 120) -> None:
        probe = (
            "import json, urllib.request\n"
            f"url = 'http://{self.hosts['master']}:8080/json/'\n"
            "print(sum(w['state'] == 'ALIVE' for w in json.load(urllib.request.urlopen(url))"
            "['workers']))\n"
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            out = self.run("drv", sys.executable, "-c", probe, timeout=30)
            if out.returncode == 0 and out.stdout.strip() == str(count):
                return
            time.sleep(2)
        logs = "".join((self.shared / f).read_text()[-1500:] for f in ("master.log", "w1.log"))
        raise AssertionError(f"the workers did not register:\n{logs}")

    @contextmanager
    def hidden(self, path: str | Path, hosts=("w1", "w2")) -> Iterator[None]:
        """``path`` hidden on ``hosts`` (an empty read-only directory mounted over it in
        their mount namespaces) until the block ends."""
        covered = []
        try:
            for host in hosts:
                out = self.run(host, "mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", path)
                assert out.returncode == 0, out.stderr
                covered.append(host)
            yield
        finally:
            for host in covered:  # lazily: an executor may still be leaving
                self.run(host, "umount", "-l", path)

    def driver_env(self) -> dict[str, str]:
        """What a user on the driver's host has: the master, the cluster's secret file, the
        Hadoop configuration, the driver's own address."""
        return {
            "SPARKTF_SPARK_MASTER": self.master_url,
            "SPARKTF_SPARK_SECRET_FILE": str(self.shared / "secret.conf"),
            "SPARK_LOCAL_IP": self.hosts["drv"],
            "SPARKTF_HOME": "/tmp/sparktf-home",
            "PYSPARK_PYTHON": sys.executable,
            **{k: v for k, v in self.hdfs.items() if k.startswith(("KRB5_", "SPARKTF_HDFS_"))},
            **({"HADOOP_CONF_DIR": str(self.shared / "hadoop")} if self.hdfs else {}),
        }

    def stop(self) -> None:
        if getattr(self, "hdfs_dir", None) is not None:  # its JVM, its KDC and its files
            self.run("nn", ROOT / "scripts" / "hdfs.sh", "stop", "--dir", self.hdfs_dir, timeout=60)
        for proc in self.daemons:
            proc.kill()
        helpers.run_command([SCRIPT, "stop", self.name], env=self.env, timeout=120)
        for proc in self.daemons:
            proc.wait(10)
        shutil.rmtree(self.disks, ignore_errors=True)


# ---------------------------------------------------------------------- a user on the driver's host


def on_driver(cluster: MultiHost, *argv, timeout: float = 600, env=None):
    """``argv`` run on drv with what its user has (:meth:`MultiHost.driver_env`, updated with
    ``env``); must pass."""
    out = cluster.run("drv", *argv, env={**cluster.driver_env(), **(env or {})}, timeout=timeout)
    assert out.returncode == 0, (out.stdout + out.stderr)[-5000:]
    return out


def convert_mnist(cluster: MultiHost, submit: list) -> str:
    """A tiny MNIST (64 train, 16 test rows), its raw files put on HDFS from the driver's
    host and converted there by ``submit`` (``submit.sh ...``): the dataset's URI."""
    uri = cluster.hdfs["HDFS_URI"]
    raw, data = f"{uri}/raw/mnist", f"{uri}/datasets/mnist"
    upload = (
        "import os, sys\n"
        "from sparktf import storage\n"
        "from sparktf.datasets.synthetic import write_mnist\n"
        "write_mnist('/tmp/raw', n_train=64, n_test=16)\n"
        f"storage.makedirs({raw!r})\n"
        "for f in os.listdir('/tmp/raw'):\n"
        f"    storage.copy_file('/tmp/raw/' + f, {raw!r} + '/' + f)\n"
    )
    on_driver(cluster, sys.executable, "-c", upload)
    on_driver(cluster, *submit, "jobs/convert_mnist.py", "--input", raw, "--output", data)
    return data


def executor_pythons(cluster: MultiHost, host: str) -> list[str]:
    """The interpreter each TensorFlow process on ``host`` logged (``role ... (python P)``),
    from the stderr of every executor there."""
    logs = cluster.run(host, "sh", "-c", "cat /tmp/work/*/*/stderr").stdout
    return re.findall(r"role \S+ in .* \(python (\S+)\)", logs)


def count_rows(cluster: MultiHost, uri: str) -> int:
    """The rows of the Parquet table at ``uri``, read from the driver's host."""
    count = (
        "import pyarrow.parquet as pq\n"
        "from sparktf import storage\n"
        f"with storage.local_copy({uri!r}) as local:\n"
        "    print(pq.read_table(local).num_rows)\n"
    )
    return int(on_driver(cluster, sys.executable, "-c", count).stdout.split()[-1])


# ---------------------------------------------------------------------- what listens, who answers

TF_PROCESS = "sparktf.train.process.main"  # a TensorFlow process's command line
_LISTEN = re.compile(r"^LISTEN\s+\d+\s+\d+\s+(\S+):(\d+)\s+\S+\s*(.*)$")
_PID = re.compile(r"pid=(\d+)")


def listeners(cluster: MultiHost, host: str) -> list[dict]:
    """The TCP ports listening on ``host`` now: {"host", "address", "port", "pids",
    "commands"} (``ss -ltnp`` in the host's namespace)."""
    out = subprocess.run(
        ["ip", "netns", "exec", f"{cluster.name}-{host}", "ss", "-ltnpH"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    found = []
    for line in out.stdout.splitlines():
        match = _LISTEN.match(line.strip())
        if not match:
            continue
        pids = [int(pid) for pid in _PID.findall(match.group(3))]
        found.append(
            {
                "host": host,
                "address": match.group(1).strip("[]"),
                "port": int(match.group(2)),
                "pids": pids,
                "commands": [command_line(pid) for pid in pids],
            }
        )
    return found


def command_line(pid: int) -> str:
    """Process ``pid``'s command line, its arguments joined by spaces ("" once it is gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _is_daemon(listener: dict) -> bool:
    """A port of the cluster's own daemons (the standalone worker), not of the run."""
    return any("deploy.worker.Worker" in command for command in listener["commands"])


class Prober:
    """A probe on ``host`` (a process of its own there) that tries the ports it is given,
    each once, as a stranger would: it connects, sends an HTTP request, and reads what comes
    back. ``tests/probe.py`` is what runs there."""

    def __init__(self, cluster: MultiHost, host: str):
        script = Path(__file__).with_name("probe.py")
        self.proc = subprocess.Popen(
            cluster.command(host, sys.executable, script),
            env=cluster.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        self.targets: list[dict] = []

    def offer(self, target: dict, address: str) -> None:
        self.targets.append(target)
        self.proc.stdin.write(f"{address} {target['port']}\n")
        self.proc.stdin.flush()

    def answers(self) -> list[dict]:
        """Every target offered, with what the probe got (``outcome``, ``sample``)."""
        out, _ = self.proc.communicate(timeout=120)
        results = [json.loads(line) for line in out.splitlines() if line.strip()]
        assert len(results) == len(self.targets), (results, self.targets)
        return [  # the probe answers in the order it was asked
            {**target, "outcome": result["outcome"], "sample": result["sample"]}
            for target, result in zip(self.targets, results)
        ]


def loopback(address: str) -> bool:
    """Whether ``address`` is a loopback address (IPv4, IPv6 or IPv4-mapped)."""
    return address.startswith(("127.", "::1", "::ffff:127."))


def probe_run(
    cluster: MultiHost,
    job: subprocess.Popen,
    hosts=("drv", "w1", "w2"),
    on_new: Callable[[dict], None] = lambda listener: None,
) -> list[dict]:
    """While ``job`` runs, tries every port a process of the run listens on in ``hosts`` from
    the outsider host ``out`` (each new port as soon as it is seen, every 0.3 s; ``on_new``
    is called with it too); returns each listener with what the outsider got (``outcome``,
    ``sample``) once the job is over. Ports bound to loopback are listed with the outcome
    ``loopback``, not tried: the outsider has no route there."""
    prober = Prober(cluster, "out")
    seen: dict[tuple[str, str, int], dict] = {}
    try:
        while job.poll() is None:
            for host in hosts:
                for listener in listeners(cluster, host):
                    key = (host, listener["address"], listener["port"])
                    if key in seen:
                        if not any(seen[key]["commands"]):  # first seen without its owner
                            seen[key].update(pids=listener["pids"], commands=listener["commands"])
                        continue
                    if _is_daemon(listener):
                        continue
                    seen[key] = listener
                    on_new(listener)
                    if not loopback(listener["address"]):
                        prober.offer(listener, cluster.hosts[host])
            time.sleep(0.3)
    finally:
        got = {(a["host"], a["address"], a["port"]): a for a in prober.answers()}
    return [
        {**listener, **got.get(key, {"outcome": "loopback", "sample": ""})}
        for key, listener in seen.items()
    ]
