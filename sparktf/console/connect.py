"""``sparktf connect``: Spark's own Connect server on this machine, for Spark Connect clients.

    sparktf connect start  [--dir DIR] [--master MASTER] [--port N] [--conf K=V ...] [--timeout S]
    sparktf connect stop   [--dir DIR]
    sparktf connect status [--dir DIR]

``start`` runs ``SparkConnectServer`` (the ``spark-connect`` jar of the installed pyspark,
through its ``spark-submit``) over ``--master``: ``local-cluster[2,1,1024]`` (the local
profile's) by default, or a standalone master such as the one ``scripts/spark-cluster.sh``
starts. Its Spark settings are the local profile's as a sparktf session gets them
(``sparktf.spark.session_conf``: driver on 127.0.0.1, this Python for the executors, worker
reuse, the HDFS environment, a quiet driver log), the barrier scheduler's slot check made to
fail a stage that cannot get its slots within seconds, then the ``--conf`` overrides.

What it trusts:

- the gRPC server listens on 127.0.0.1 only (``spark.connect.grpc.binding.address``), on a
  free port unless ``--port``;
- every client must present a token: a new random one per start, given to the server in its
  environment (``SPARK_CONNECT_AUTHENTICATE_TOKEN``), never on a command line, and kept in
  ``DIR/token``. A client connects with ``sc://localhost:PORT/;token=TOKEN``: for the host
  ``localhost`` pyspark sends the token over gRPC local credentials (a loopback connection,
  no TLS); with any other host name it would insist on TLS;
- DIR (``$SPARKTF_HOME/state/connect`` by default) is private (0700) and its files 0600:
  the pid, port, master, token, the server's Spark settings (``spark.conf``, which holds a
  standalone master's shared secret where Spark authentication is on) and its log.

``start`` returns once a client holding the token has run a barrier stage over every task
slot the master offers (so the executors are registered), and prints
``export SPARK_REMOTE='sc://localhost:PORT/;token=TOKEN'`` on stdout: ``eval "$(sparktf
connect start)"`` sets it. It fails with the end of the server's log, the server stopped,
when that does not happen within ``--timeout``. ``stop`` ends the server and every process it
started (its session: executors, Python workers), and is safe when nothing runs. ``status``
exits 0 when the server runs, 1 when it does not.

From Python: ``start(directory, master=..., port=None, conf=None, timeout_s=...)`` returns a
``ConnectServer`` whose ``remote`` is the URL for ``SparkSession.builder.remote``;
``stop(directory)`` and ``status(directory)``. None of them starts Spark in the calling
process.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import secrets
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sparktf import cli, paths, placement, spark
from sparktf.errors import SparktfError
from sparktf.ports import free_port, port_free

__all__ = [
    "BARRIER_CHECK",
    "DEFAULT_TIMEOUT_S",
    "SERVER_CLASS",
    "TOKEN_ENV",
    "ConnectError",
    "ConnectServer",
    "default_dir",
    "expected_slots",
    "main",
    "parse",
    "server_conf",
    "session_processes",
    "start",
    "status",
    "stop",
]

log = logging.getLogger("sparktf.connect")

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
TOKEN_ENV = "SPARK_CONNECT_AUTHENTICATE_TOKEN"
DEFAULT_TIMEOUT_S = 180.0
# Spark's barrier scheduler checks that a barrier stage can get all its slots at once; by
# default it retries for about ten minutes before failing the job. A client asking for more
# TensorFlow processes than the cluster has slots should hear it within seconds.
BARRIER_CHECK = {
    "spark.scheduler.barrier.maxConcurrentTasksCheck.interval": "1s",
    "spark.scheduler.barrier.maxConcurrentTasksCheck.maxFailures": "5",
}
# Settings of session_conf that only a Python driver reads: the server's driver is the JVM.
_PYTHON_DRIVER_ONLY = ("spark.pyspark.driver.python",)
# Environment a Connect server must not inherit from a Python driver or client around it.
_CLIENT_ENV = (
    "PYSPARK_GATEWAY_PORT",
    "PYSPARK_GATEWAY_SECRET",
    "PYSPARK_SUBMIT_ARGS",
    "SPARK_CONNECT_MODE_ENABLED",
    "SPARK_REMOTE",
    TOKEN_ENV,
)
_TAG = "-Dio.sparktf.connect.dir="  # on the java command lines (no -Dspark*: Spark refuses)
_STOP_GRACE_S = 30.0
_FILES = ("pid", "port", "master", "token", "spark.conf")


class ConnectError(SparktfError, RuntimeError):
    """The Connect server could not be started, reached or stopped."""


@dataclass(frozen=True)
class ConnectServer:
    """A running Connect server: ``remote`` is the URL a client connects with."""

    dir: Path
    pid: int
    port: int
    master: str
    token: str = field(repr=False)

    @property
    def remote(self) -> str:
        """``sc://localhost:PORT/;token=TOKEN`` (for ``SparkSession.builder.remote`` or
        ``$SPARK_REMOTE``)."""
        return f"sc://localhost:{self.port}/;token={self.token}"

    @property
    def log_file(self) -> Path:
        return self.dir / "server.log"


def default_dir() -> Path:
    """Where the server's state lives unless told: ``state/connect`` under sparktf's home."""
    return paths.home() / "state" / "connect"


# ----------------------------------------------------------------------------- configuration


def server_conf(
    master: str | None = None, port: int = 15002, overrides: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The Spark settings of a server on ``port`` over ``master`` (the local profile's when
    None): the local profile's session settings for that master, without what only a Python
    driver reads, with the loopback gRPC binding and the quick barrier slot check, then
    ``overrides``. A master that needs a shared secret gets it as ``spark.authenticate.secret``
    (``sparktf.spark.transport_secret``): keep the result in a private file."""
    given = dict(overrides or {})
    if master:
        given["spark.master"] = master
    conf = spark.session_conf("local", given)
    for key in _PYTHON_DRIVER_ONLY:
        conf.pop(key, None)
    python = conf.get("spark.pyspark.python", sys.executable)
    if os.sep in python and not os.path.isabs(python):
        conf["spark.pyspark.python"] = os.path.abspath(python)  # executors start elsewhere
    conf.setdefault("spark.app.name", "sparktf-connect")
    for key, value in BARRIER_CHECK.items():
        conf.setdefault(key, value)
    conf.update(given)
    # loopback only, on the port this module records (``--port``)
    conf["spark.connect.grpc.binding.address"] = "127.0.0.1"
    conf["spark.connect.grpc.binding.port"] = str(port)
    secret = conf.get(spark.SECRET_CONF) or spark.transport_secret(conf["spark.master"], conf)
    if secret:
        conf[spark.SECRET_CONF] = secret
    return conf


def expected_slots(master: str, conf: Mapping[str, str]) -> int | None:
    """How many tasks ``master`` runs at once for an application of ``conf``: a
    ``local-cluster``'s executors times their task slots; a standalone master's ALIVE
    workers as the application's executors fill them (``spark.cores.max`` respected); None
    where that cannot be known (other masters, a master that does not answer)."""
    cpus = placement.task_cpus(conf)
    if master.strip().startswith("local-cluster["):
        declared = placement.declared_slots({**conf, "spark.master": master.strip()})
        return None if declared is None else declared[0]
    if not master.startswith("spark://"):
        return None
    cluster = spark.cluster_resources(master, conf)
    if cluster is None:
        return None
    cores_each = int(conf["spark.executor.cores"]) if "spark.executor.cores" in conf else None
    memory = placement.parse_mb(conf.get("spark.executor.memory", "1g"))
    cores_left = int(conf["spark.cores.max"]) if "spark.cores.max" in conf else None
    slots = 0
    for node in cluster.nodes:
        per_executor = cores_each or node.cores
        executors = min(node.cores // max(1, per_executor), node.memory_mb // max(1, memory))
        cores = executors * per_executor
        if cores_left is not None:
            cores = min(cores, cores_left - cores_left % per_executor)
            cores_left -= cores
        slots += placement.task_slots(cores // per_executor, per_executor, cpus)
    return slots


def _spark_home() -> Path:
    """The Spark of the installed pyspark (``$SPARKTF_SPARK_HOME`` overrides)."""
    if os.environ.get("SPARKTF_SPARK_HOME"):
        return Path(os.environ["SPARKTF_SPARK_HOME"])
    found = importlib.util.find_spec("pyspark")  # found, not imported: no JVM here
    if found is None or not found.submodule_search_locations:
        raise ConnectError(f"pyspark is not installed for {sys.executable}: run scripts/setup.sh")
    home = Path(next(iter(found.submodule_search_locations)))
    if not (home / "bin" / "spark-submit").is_file():
        raise ConnectError(f"no bin/spark-submit in {home} (set SPARKTF_SPARK_HOME)")
    if not list((home / "jars").glob("spark-connect_*.jar")):
        raise ConnectError(f"{home}/jars has no spark-connect jar: pyspark 4 ships it")
    return home


def _server_env(conf: Mapping[str, str], token: str, home: Path) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key not in _CLIENT_ENV}
    env.update(SPARK_HOME=str(home), PYSPARK_PYTHON=conf["spark.pyspark.python"])
    env[TOKEN_ENV] = token
    master = conf["spark.master"]
    if master.startswith("local") or master.startswith("spark://127.0.0.1:"):
        env["SPARK_LOCAL_IP"] = "127.0.0.1"  # every executor on loopback too
    return env


# ----------------------------------------------------------------------------- state


def _private_dir(directory: str | os.PathLike) -> Path:
    path = Path(directory).expanduser().absolute()
    if any(c.isspace() for c in str(path)):
        raise ConnectError(f"the Connect server's directory must not contain spaces: {path}")
    problem = paths.private_dir_problem(path)
    if problem:
        raise ConnectError(f"the Connect server's directory {path} {problem}")
    path.chmod(0o700)
    return path


def _write_private(path: Path, text: str) -> None:
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _tagged(pid: int, directory: Path) -> bool:
    """Whether ``pid`` is this directory's server (its tag on the command line, or the
    spark-submit launcher that becomes it)."""
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    words = [a.decode(errors="replace") for a in args]
    if f"{_TAG}{directory}" in words:
        return True
    launcher = any(w.endswith(("spark-submit", "spark-class")) for w in words[:3])
    return launcher and str(directory / "spark.conf") in words


def session_processes(leader: int) -> list[int]:
    """The live processes (this user's) of the session that ``leader`` started, even after
    it exited: a server's JVM, its executors and their Python workers."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            uid = entry.stat().st_uid
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[3]) == leader and uid == os.geteuid() and fields[0] != "Z":
            found.append(int(entry.name))
    return found


def status(directory: str | os.PathLike | None = None) -> ConnectServer | None:
    """The server running from ``directory``, or None."""
    path = Path(directory or default_dir()).expanduser().absolute()
    pid, port, token = (_read(path / name) for name in ("pid", "port", "token"))
    if not (pid and pid.isdigit() and port and port.isdigit() and token):
        return None
    if not _tagged(int(pid), path):
        return None
    return ConnectServer(path, int(pid), int(port), _read(path / "master") or "?", token)


# ----------------------------------------------------------------------------- start


def _log_tail(path: Path) -> str:
    """The end of the server's log without the JVM's stack frames."""
    return spark.spark_error_text(_read(path) or "(empty)") or "(only stack frames)"


def start(
    directory: str | os.PathLike | None = None,
    *,
    master: str | None = None,
    port: int | None = None,
    conf: Mapping[str, str] | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> ConnectServer:
    """Starts a Connect server (see the module docstring) and returns it once a client
    holding its token has run a barrier stage over every task slot of ``master``.

    A server already running from ``directory`` over the same master is returned as it is.

    Raises:
        ConnectError: it did not come up within ``timeout_s`` (the server is stopped and the
            end of its log is in the message), another master runs from ``directory``, or
            the port is taken.
        sparktf.spark.TransportError: a standalone master whose shared secret is not known.
    """
    path = _private_dir(directory or default_dir())
    running = status(path)
    if running is not None:
        if master is None or running.master == master:
            log.info("the Connect server of %s already runs (pid %d)", path, running.pid)
            return running
        raise ConnectError(
            f"a Connect server over {running.master} already runs from {path} (pid "
            f"{running.pid}); stop it first (sparktf connect stop --dir {path})"
        )
    stop(path)  # what a server that died left behind
    port = port or free_port()
    if not port_free(port):
        raise ConnectError(f"port {port} of 127.0.0.1 is taken: choose another --port")
    settings = server_conf(master, port, conf)
    tag = f"{_TAG}{path}"
    for key in ("spark.driver.extraJavaOptions", "spark.executor.extraJavaOptions"):
        settings[key] = f"{settings.get(key, '')} {tag}".strip()
    home = _spark_home()
    token = secrets.token_urlsafe(32)
    server = ConnectServer(path, 0, port, settings["spark.master"], token)
    _write_private(path / "token", token + "\n")
    _write_private(path / "port", f"{port}\n")
    _write_private(path / "master", server.master + "\n")
    _write_private(path / "spark.conf", "".join(f"{k} {v}\n" for k, v in settings.items()))
    _write_private(server.log_file, "")
    command = [str(home / "bin" / "spark-submit"), "--class", SERVER_CLASS]
    command += ["--properties-file", str(path / "spark.conf"), "spark-internal"]
    started = time.monotonic()
    with open(server.log_file, "ab") as out:
        process = subprocess.Popen(
            command,
            env=_server_env(settings, token, home),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=path,
            start_new_session=True,  # stop ends the whole session: executors, Python workers
        )
    _write_private(path / "pid", f"{process.pid}\n")
    server = ConnectServer(path, process.pid, port, server.master, token)
    log.info(
        "starting Spark's Connect server on 127.0.0.1:%d over %s (pid %d, log %s)",
        port,
        server.master,
        process.pid,
        server.log_file,
    )
    try:
        _wait_ready(server, process, expected_slots(server.master, settings), started + timeout_s)
    except BaseException:
        stop(path)
        raise
    log.info("the Connect server is ready in %.1f s", time.monotonic() - started)
    return server


def _wait_ready(server: ConnectServer, process: subprocess.Popen, slots, deadline: float) -> None:
    """Waits for the port, then runs ``_CHECK`` in a client process until it passes."""
    while not _listening(server.port):
        if process.poll() is not None:
            raise ConnectError(
                f"the Connect server exited with code {process.returncode} before listening; "
                f"the end of {server.log_file}:\n{_log_tail(server.log_file)}"
            )
        if time.monotonic() > deadline:
            raise ConnectError(_late(server, "did not listen"))
        time.sleep(0.25)
    if slots is None:
        log.info("the task slots of %s cannot be read: checking one query only", server.master)
    env = {k: v for k, v in os.environ.items() if k not in _CLIENT_ENV}
    env["SPARKTF_CONNECT_CHECK_REMOTE"] = server.remote  # in the environment, off ps
    left = max(1.0, deadline - time.monotonic())
    try:
        check = subprocess.run(
            [sys.executable, "-c", _CHECK, str(slots or 0), str(left)],
            env=env,
            capture_output=True,
            text=True,
            timeout=left + 15,
        )
    except subprocess.TimeoutExpired:
        raise ConnectError(_late(server, "ran no query")) from None
    if check.returncode != 0:
        said = spark.spark_error_text(check.stdout + check.stderr, limit=1500)
        raise ConnectError(
            f"a client could not run a query on the Connect server of {server.master} "
            f"({slots or 'its'} task slots, barrier stage) within the timeout:\n{said}\n"
            f"the end of {server.log_file}:\n{_log_tail(server.log_file)}"
        )


def _listening(port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(1.0)
        return probe.connect_ex(("127.0.0.1", port)) == 0


def _late(server: ConnectServer, what: str) -> str:
    return (
        f"the Connect server over {server.master} {what} within the timeout; the end of "
        f"{server.log_file}:\n{_log_tail(server.log_file)}"
    )


# A client of the new server: connects with the token and runs a barrier stage over every
# task slot (a plain query where their number is unknown), again until it passes: a barrier
# stage fails while executors are still registering.
_CHECK = """
import os, sys, time
from pyspark.sql import SparkSession
slots, deadline = int(sys.argv[1]), time.monotonic() + float(sys.argv[2])
spark = SparkSession.builder.remote(os.environ.pop("SPARKTF_CONNECT_CHECK_REMOTE")).getOrCreate()
while True:
    try:
        frame = spark.range(max(slots, 1), numPartitions=max(slots, 1))
        if slots:
            frame = frame.mapInArrow(lambda batches: batches, frame.schema, barrier=True)
        assert len(frame.collect()) == max(slots, 1)
        break
    except Exception as exc:
        if time.monotonic() > deadline:
            raise
        print(type(exc).__name__, str(exc).splitlines()[0][:300], file=sys.stderr)
        time.sleep(1)
spark.stop()
"""


# ----------------------------------------------------------------------------- stop


def stop(directory: str | os.PathLike | None = None) -> bool:
    """Stops the server of ``directory`` and every process it started, and removes its
    state (the log stays); True when something was running. Safe when nothing is.

    Raises:
        ConnectError: processes of the server still alive after being killed.
    """
    path = Path(directory or default_dir()).expanduser().absolute()
    pid = _read(path / "pid")
    leader = int(pid) if pid and pid.isdigit() else None
    port = _read(path / "port")
    stopped = False
    if leader is not None and _tagged(leader, path):
        stopped = True
        log.info("stopping the Connect server of %s (pid %d)", path, leader)
        # the server alone first: its shutdown stops its executors without relaunching them
        _kill(leader, signal.SIGTERM)
        deadline = time.monotonic() + _STOP_GRACE_S
        while _tagged(leader, path) and time.monotonic() < deadline:
            _reap(leader)
            time.sleep(0.2)
    # The rest of its session (executors, Python workers) -- only of a session that is this
    # server's: the server was found, or its pid is gone. Linux reuses no pid that still
    # names a session with a live member, so a live leader without the tag is another's.
    if leader is not None and (stopped or not Path(f"/proc/{leader}").exists()):
        _reap(leader)
        for _ in range(50):
            left = session_processes(leader)
            if not left:
                break
            for other in left:
                _kill(other, signal.SIGKILL)
            time.sleep(0.1)
        else:
            raise ConnectError(f"processes of the Connect server of {path} survive: {left}")
    if port and port.isdigit():
        for _ in range(50):
            if port_free(int(port)):
                break
            time.sleep(0.1)
    for name in _FILES:
        (path / name).unlink(missing_ok=True)
    return stopped


def _reap(pid: int) -> None:
    """Collects the exit status of ``pid`` when it is this process's child (it started the
    server): no zombie is left behind."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except OSError:
        pass


# ----------------------------------------------------------------------------- command


def parse(argv: Sequence[str]) -> argparse.Namespace:
    """``sparktf connect`` arguments; ``--conf K=V`` pairs become the dict ``args.conf``."""
    p = argparse.ArgumentParser(
        prog="sparktf connect",
        description="A local Spark Connect server (Spark's own), on 127.0.0.1, with a token.",
        epilog="start prints export SPARK_REMOTE='sc://localhost:PORT/;token=TOKEN': "
        'eval "$(sparktf connect start)" sets it. status exits 1 when nothing runs.',
    )
    p.add_argument("action", choices=("start", "stop", "status"))
    p.add_argument(
        "--dir", default=None, help=f"the server's private state (default {default_dir()})"
    )
    p.add_argument(
        "--master",
        default=None,
        help="Spark master: local-cluster[N,C,MB] (default: the local profile's) or a "
        "standalone spark://HOST:PORT (scripts/spark-cluster.sh)",
    )
    p.add_argument("--port", type=int, default=None, help="gRPC port on 127.0.0.1 (default: free)")
    p.add_argument(
        "--conf", action="append", default=[], metavar="K=V", help="a Spark setting (repeat)"
    )
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="start's limit, s")
    p.add_argument(
        "--log-level",
        default=os.environ.get("SPARKTF_LOG_LEVEL", "INFO"),
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
    )
    args = p.parse_args(list(argv))
    pairs = {}
    for item in args.conf:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise cli.UsageError(f"--conf takes KEY=VALUE, got {item!r}")
        pairs[key.strip()] = value
    args.conf = pairs
    if args.port is not None and not 0 < args.port < 65536:
        raise cli.UsageError(f"--port must be 1-65535, got {args.port}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """``sparktf connect start|stop|status``; returns the exit code."""
    args = parse(sys.argv[1:] if argv is None else argv)
    cli.setup_logging(args.log_level)
    directory = Path(args.dir) if args.dir else default_dir()
    if args.action == "start":
        server = start(
            directory, master=args.master, port=args.port, conf=args.conf, timeout_s=args.timeout
        )
        print(f"export SPARK_REMOTE={shlex.quote(server.remote)}", flush=True)
        return 0
    if args.action == "stop":
        print("stopped" if stop(directory) else "not running")
        return 0
    server = status(directory)
    if server is None:
        print(f"not running ({directory})")
        return 1
    print(
        f"running (pid {server.pid}, port {server.port} on 127.0.0.1, master {server.master}, "
        f"token in {server.dir / 'token'}, log {server.log_file})"
    )
    return 0
