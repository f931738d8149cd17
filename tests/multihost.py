"""A multi-host cluster on this machine for the tests (``tests/test_multihost.py``): hosts
from ``scripts/netcluster.sh``, HDFS (``scripts/hdfs.sh --host``) on one, a Spark standalone
master on another, a worker on each of two more, and the driver's host; an outsider host
that the run never uses.

Every host has a private ``/tmp``: what must be shared (the Hadoop client configuration, the
standalone cluster's secret) is written to the cluster's state directory, as a site would
put it on every node.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import time
from pathlib import Path

from tests import helpers
from tests.conftest import ROOT

SCRIPT = ROOT / "scripts" / "netcluster.sh"
HOSTS = ("nn", "master", "w1", "w2", "drv", "out")


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


def new_name() -> str:
    return "t" + "".join(secrets.choice("abcdefghijkmnpqrstuvwxyz") for _ in range(5))


class MultiHost:
    """The hosts of one ``netcluster.sh`` cluster and what runs on them."""

    def __init__(self, name: str, state: Path, hosts: dict[str, str]):
        self.name, self.state, self.hosts = name, state, hosts
        self.shared = state / name / "shared"
        self.shared.mkdir(mode=0o700)
        self.daemons: list[subprocess.Popen] = []
        self.env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("SPARKTF_", "SPARK_", "HADOOP_", "PYSPARK_", "TMPDIR"))
        }
        self.env["SPARKTF_NETCLUSTER_DIR"] = str(state)

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

    def start_hdfs(self) -> str:
        nn = self.hosts["nn"]
        out = self.run(
            "nn", ROOT / "scripts" / "hdfs.sh", "start", "--host", nn,
            "--dir", "/tmp/hdfs", "--conf-dir", self.shared / "hadoop", timeout=240,
        )  # fmt: skip
        assert out.returncode == 0, out.stdout + out.stderr
        self.hdfs = dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)
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
        for worker in ("w1", "w2"):
            address = self.hosts[worker]
            self.spawn(
                worker, home / "bin" / "spark-class", "org.apache.spark.deploy.worker.Worker",
                "--host", address, "--cores", str(cores), "--memory", memory,
                "--work-dir", "/tmp/work", self.master_url,
                env={**daemon_env, "SPARK_LOCAL_IP": address, "PYSPARK_PYTHON": sys.executable},
                log=f"{worker}.log",
            )  # fmt: skip
        self._await_workers(2)
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

    def driver_env(self) -> dict[str, str]:
        """What a user on the driver's host has: the master, the cluster's secret file, the
        Hadoop configuration, the driver's own address."""
        return {
            "SPARKTF_SPARK_MASTER": self.master_url,
            "SPARKTF_SPARK_SECRET_FILE": str(self.shared / "secret.conf"),
            "HADOOP_CONF_DIR": str(self.shared / "hadoop"),
            "SPARK_LOCAL_IP": self.hosts["drv"],
            "SPARKTF_HOME": "/tmp/sparktf-home",
            "PYSPARK_PYTHON": sys.executable,
        }

    def stop(self) -> None:
        for proc in self.daemons:
            proc.kill()
        helpers.run_command([SCRIPT, "stop", self.name], env=self.env, timeout=120)
        for proc in self.daemons:
            proc.wait(10)
