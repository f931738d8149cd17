"""Bytes on the wire per training step, against the least a step must send.

sparktf's training runs across hosts of their own (``scripts/netcluster.sh``: network
namespaces joined by a bridge, a Spark standalone master and one worker of one core on each
worker host, the driver on a host of its own; ``tests/multihost.py``), so every byte between
two processes of the run crosses a host's link and is counted. For each case (a model, a
strategy, a number of hosts) the same job runs twice, for a short and a long run of steps;
while each runs, every host's TCP sockets are read every ``--sample-s`` seconds (``ss -tinpe``
in its network namespace): the payload each one has sent, by what talks to what --

* ``tensorflow``: a TensorFlow process to another one (gRPC: the collectives under
  all-reduce, the variables and gradients under ps, the coordinator's calls; under ps also
  each step's batch, which the chief reads and sends to the worker that runs the step:
  counted apart as ``batches_from_chief``, from the bytes between each pair of processes,
  and left out of the model's traffic);
* ``sparktf``: a TensorFlow process and the driver (sparktf's control connection: its
  heartbeats, reports and progress);
* ``spark``: anything to or from a JVM (Spark's RPC, task launches, results, block transfers);
* ``feed``: Spark's Python workers to a TensorFlow process on another host (none when every
  process is fed on its own host, as sparktf places them);

and every host's ``eth0`` transmit counter (everything, with the Ethernet, IP and TCP
headers). The figures per step are the differences between the two runs over the difference
in steps: start-up, the first broadcast of the variables, the checkpoint at the end and the
shutdown are in both runs and cancel out.

The bound (goal: the model's bytes per step, ``tensorflow`` less ``batches_from_chief``, at
most 1.2 times it):

* all-reduce of N workers: a ring all-reduce sends 2 (N - 1) / N times the gradient bytes per
  worker per step, 2 (N - 1) G over the N workers (G: the trainable variables in float32);
* ps: the worker of a step pulls the variables and pushes their updates once, 2 V (V: every
  variable, the batch norms' moving statistics included).

The baseline is that arithmetic, not another program: the bound is the least any
implementation can send. Root only (network and mount namespaces); about 15 minutes on 2
cores for the default cases. Not in ``bench/all.sh``: run it alone.

    sudo .venv/bin/python bench/wire.py                      # mnist_mlp and resnet20, all cases
    .venv/bin/python bench/wire.py --models mnist_mlp --cases allreduce-2
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import subprocess
import sys
import threading
import time
from collections import defaultdict

import common

from tests import multihost  # the hosts of the multi-host tests (ROOT is on the path)

log = logging.getLogger("bench.wire")

# case -> (strategy, workers, parameter servers); ps runs its chief on a host of its own too
CASES = {
    "allreduce-2": ("allreduce", 2, 0),
    "allreduce-4": ("allreduce", 4, 0),
    "ps-2": ("ps", 2, 1),
}
JOBS = {"mnist_mlp": "jobs/train_mnist.py", "resnet20": "jobs/train_resnet.py"}
# steps of the short and the long run; the global batch
STEPS = {"mnist_mlp": (20, 120), "resnet20": (5, 35)}
BATCH = 64
GOAL = 1.2
TF_PROCESS = multihost.TF_PROCESS
_ENDPOINT = re.compile(r"^(.*):(\d+)$")
_PID = re.compile(r"pid=(\d+)")
_SENT = re.compile(r"bytes_sent:(\d+)")
_INODE = re.compile(r"ino:(\d+)")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Writes bench/results/wire-<time>.json. Needs root: network namespaces.",
    )
    parser.add_argument(
        "--models",
        default=",".join(JOBS),
        help=f"comma-separated models, of {', '.join(JOBS)} (default: all)",
    )
    parser.add_argument(
        "--cases",
        default=",".join(CASES),
        help=f"comma-separated cases, of {', '.join(CASES)} (default: all)",
    )
    parser.add_argument(
        "--sample-s",
        type=common.positive_float,
        default=0.25,
        help="seconds between two readings of the sockets (default 0.25)",
    )
    args = parser.parse_args(argv)
    for name, known in (("models", JOBS), ("cases", CASES)):
        chosen = [each for each in getattr(args, name).split(",") if each]
        unknown = [each for each in chosen if each not in known]
        if unknown or not chosen:
            parser.error(f"--{name}: unknown {unknown or chosen}; known: {', '.join(known)}")
        setattr(args, name, chosen)
    return args


# ---------------------------------------------------------------------- what the sockets sent


def kind_of(pid: int, cache: dict[int, str]) -> str:
    """What process ``pid`` is: ``tf`` (a TensorFlow process of the run), ``jvm``, ``worker``
    (Spark's Python workers), ``python`` (the driver's Python), ``other``."""
    if pid not in cache:
        line = multihost.command_line(pid)
        if TF_PROCESS in line:
            cache[pid] = "tf"
        elif "java" in line.split(" ", 1)[0]:
            cache[pid] = "jvm"
        elif "pyspark.daemon" in line or "pyspark.worker" in line:
            cache[pid] = "worker"
        elif "python" in line.split(" ", 1)[0]:
            cache[pid] = "python"
        else:
            cache[pid] = "other"
    return cache[pid]


def category(client: str, server: str) -> str:
    """The traffic class of a connection between a ``client`` and a ``server`` process
    (kinds of :func:`kind_of`; the server is the side that listens)."""
    ends = {client, server}
    if ends == {"tf"}:
        return "tensorflow"
    if "jvm" in ends:
        return "spark"
    if ends == {"tf", "python"}:
        return "sparktf"
    if ends == {"tf", "worker"}:
        return "feed"
    return "other"


class Sampler:
    """Reads every host's TCP sockets every ``interval`` seconds while it runs: the largest
    ``bytes_sent`` seen of each socket (a socket's count only grows), the process that owns
    it and what listens where (asked again only when a host has sockets not seen before:
    finding the owners walks every process), and each host's transmitted bytes at the start
    and the end."""

    def __init__(self, cluster, hosts: list[str], interval: float):
        self.cluster, self.hosts, self.interval = cluster, hosts, interval
        # (host, inode) -> [local endpoint, peer endpoint, bytes sent]
        self.sent: dict[tuple[str, str], list] = {}
        self.pids: dict[tuple[str, str], int] = {}  # (host, inode) -> owner
        self.listeners: dict[tuple[str, str], int] = {}  # (address, port) -> pid
        self.kinds: dict[int, str] = {}  # pid -> kind_of, read while the process lives
        self.tx_start = {host: self._tx(host) for host in hosts}
        self.tx_end: dict[str, int] = {}
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="wire-sampler", daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.tx_end = {host: self._tx(host) for host in self.hosts}

    def _netns(self, host: str, *command: str) -> str:
        namespace = f"/run/netns/{self.cluster.name}-{host}"
        out = subprocess.run(
            ["nsenter", f"--net={namespace}", *command], capture_output=True, text=True
        )
        return out.stdout

    def _tx(self, host: str) -> int:
        for line in self._netns(host, "cat", "/proc/net/dev").splitlines():
            name, _, counters = line.partition(":")
            if name.strip() == "eth0":
                return int(counters.split()[8])  # transmit bytes
        return 0

    def _loop(self) -> None:
        while not self._stop.is_set():
            for host in self.hosts:
                self.read(host)
            self.samples += 1
            self._stop.wait(self.interval)

    def read(self, host: str) -> None:
        unknown = False
        for line in self._netns(host, "ss", "-taniHeO").splitlines():
            fields, inode = line.split(), _INODE.search(line)
            if len(fields) < 5 or not inode:
                continue
            key = (host, inode.group(1))
            unknown |= key not in self.pids
            sent = _SENT.search(line)
            if fields[0] == "LISTEN" or not sent:
                continue
            seen = self.sent.setdefault(key, [fields[3], fields[4], 0])
            seen[2] = max(seen[2], int(sent.group(1)))
        if unknown:
            self.owners(host)

    def owners(self, host: str) -> None:
        """The owner of each of ``host``'s sockets, and its listeners."""
        for line in self._netns(host, "ss", "-tanpHeO").splitlines():
            fields, pid, inode = line.split(), _PID.search(line), _INODE.search(line)
            if len(fields) < 5 or not (pid and inode):
                continue
            owner = int(pid.group(1))
            self.pids[(host, inode.group(1))] = owner
            kind_of(owner, self.kinds)
            if fields[0] == "LISTEN":
                address, port = _endpoint(fields[3])
                if address in ("0.0.0.0", "::", "*"):  # every address: this host's own
                    address = self.cluster.hosts[host]
                self.listeners[(address, port)] = owner

    def by_category(self) -> dict[str, int]:
        """Payload bytes sent over links between hosts, by :func:`category` (``other``: a
        socket whose owner was gone before it was asked)."""
        kinds = self.kinds
        owners = {  # a connected socket's own end -> its owner, on every host
            _endpoint(local): self.pids.get(key) for key, (local, _, _) in self.sent.items()
        }
        totals: dict[str, int] = defaultdict(int)
        for key, (local, peer, value) in self.sent.items():
            here, there = _endpoint(local), _endpoint(peer)
            if _same_host(here[0], there[0]):
                continue  # loopback, or this host's own address: no link crossed
            pid = self.pids.get(key)
            mine = kind_of(pid, kinds) if pid else "other"
            if here in self.listeners:  # this end listens: the peer is the client
                client = owners.get(there)
                totals[category(kind_of(client, kinds) if client else "other", mine)] += value
            else:
                server = self.listeners.get(there)
                totals[category(mine, kind_of(server, kinds) if server else "other")] += value
        return dict(totals)

    def tensorflow_pairs(self, roles: dict[str, str]) -> dict[str, int]:
        """The ``tensorflow`` bytes by sender and receiver (``"worker:0 -> ps:0"``), the
        processes named by ``roles`` (address -> role names on that host)."""
        totals: dict[str, int] = defaultdict(int)
        for key, (local, peer, value) in self.sent.items():
            pid = self.pids.get(key)
            if not pid or self.kinds.get(pid) != "tf":
                continue
            here, there = _endpoint(local), _endpoint(peer)
            if _same_host(here[0], there[0]) or not value:
                continue
            ends = (roles.get(here[0], here[0]), roles.get(there[0], there[0]))
            totals[f"{ends[0]} -> {ends[1]}"] += value
        return dict(totals)

    def tx_bytes(self) -> int:
        return sum(self.tx_end[host] - self.tx_start[host] for host in self.hosts)


def _endpoint(text: str) -> tuple[str, str]:
    match = _ENDPOINT.match(text)
    if not match:
        return (text, "")
    address = match.group(1).strip("[]").split("%")[0]
    return (address.removeprefix("::ffff:"), match.group(2))


def _same_host(a: str, b: str) -> bool:
    return a == b or multihost.loopback(a) or multihost.loopback(b)


# ---------------------------------------------------------------------- the runs


def variable_bytes(model: str) -> tuple[int, int]:
    """The trainable and all variables' bytes of ``model`` (float32)."""
    from sparktf import models

    keras_model = models.get_model(model)
    trainable = sum(int(v.shape.num_elements()) for v in keras_model.trainable_variables)
    every = sum(int(v.shape.num_elements()) for v in keras_model.variables)
    return 4 * trainable, 4 * every


def bound(strategy: str, workers: int, trainable: int, every: int) -> int:
    """The least bytes a step sends between the run's TensorFlow processes."""
    if strategy == "allreduce":
        return 2 * (workers - 1) * trainable
    return 2 * every


def train(cluster, model: str, case: str, steps: int, home: str, interval: float) -> dict:
    strategy, workers, ps = CASES[case]
    shared = cluster.shared
    tag = f"{model}-{case}-{steps}"
    result_json = shared / f"result-{tag}.json"
    argv = [
        *multihost.STANDALONE, "--executor-cores", "1", "--executor-memory", "2g",
        JOBS[model], "--model", model, "--data", "demo", "--strategy", strategy,
        "--num-workers", str(workers), "--input-mode", "spark", "--steps", str(steps),
        "--epochs", "1000",  # the steps decide (a job's configuration may set an epoch)
        "--batch-size", str(BATCH), "--model-dir", str(shared / "models" / tag),
        "--checkpoint-every", str(10 * steps), "--no-export", "--result-json", str(result_json),
    ]  # fmt: skip
    if ps:
        argv += ["--num-ps", str(ps)]
    hosts = [host for host in cluster.hosts if host not in ("nn", "out")]
    env = {**cluster.driver_env(), "SPARKTF_HOME": home}
    started = time.monotonic()
    with Sampler(cluster, hosts, interval) as sampler:
        out = cluster.run("drv", *argv, env=env, timeout=1200)
    elapsed = time.monotonic() - started
    if out.returncode != 0:
        raise RuntimeError(f"{tag} failed:\n{(out.stdout + out.stderr)[-4000:]}")
    summary = json.loads(result_json.read_text())
    where = sorted({each["host"] for each in summary["processes"].values()})
    roles: dict[str, str] = {}  # a host's address -> the roles it ran
    for role, placed in sorted(summary["processes"].items()):
        host = placed["host"]
        address = next((a for h, a in cluster.hosts.items() if cluster.name_of(h) == host), host)
        roles[address] = f"{roles[address]}+{role}" if address in roles else role
    log.info(
        "%s: %d steps in %.0f s on %s, %d samples", tag, steps, elapsed, where, sampler.samples
    )
    return {
        "steps": summary["final_step"] - summary.get("start_step", 0),
        "wall_s": round(elapsed, 1),
        "samples": sampler.samples,
        "hosts": where,
        "processes": sorted(summary["processes"]),
        "sent": sampler.by_category(),
        "tensorflow_pairs": sampler.tensorflow_pairs(roles),
        "tx_bytes": sampler.tx_bytes(),
    }


def per_step(short: dict, long: dict) -> dict:
    steps = long["steps"] - short["steps"]
    kinds = set(short["sent"]) | set(long["sent"])
    sent = {k: (long["sent"].get(k, 0) - short["sent"].get(k, 0)) / steps for k in kinds}
    tx = (long["tx_bytes"] - short["tx_bytes"]) / steps
    pairs = set(short["tensorflow_pairs"]) | set(long["tensorflow_pairs"])
    between = {
        k: (long["tensorflow_pairs"].get(k, 0) - short["tensorflow_pairs"].get(k, 0)) / steps
        for k in pairs
    }
    return {
        "steps": steps,
        "sent": {k: round(v) for k, v in sorted(sent.items())},
        # under ps the chief reads the input and sends each step's batch to the worker that
        # runs it (TensorFlow's gRPC too, but the feed, not the model's traffic)
        "batches_from_chief": round(
            sum(v for k, v in between.items() if k.startswith("chief:0 -> worker:"))
        ),
        # everything on the links but the TensorFlow processes' traffic: Spark, sparktf's
        # control connections, the TCP/IP headers
        "other_tx_bytes": round(tx - sent.get("tensorflow", 0)),
        "tensorflow_pairs": {k: round(v) for k, v in sorted(between.items()) if round(v)},
        "tx_bytes": round(tx),
    }


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    why = multihost.namespaces_usable() or multihost.disk_short()
    if why:
        print(f"wire.py: multi-host runs {why}", file=sys.stderr)
        return 2
    hosts_needed = max(w + p + (s == "ps") for s, w, p in (CASES[c] for c in args.cases))
    sizes = {model: variable_bytes(model) for model in args.models}
    cases: dict[str, dict] = {}
    goals: dict[str, dict] = {}
    with multihost.started(workers=hosts_needed, hdfs=False, cores=1, memory="3g") as cluster:
        home = str(cluster.shared / "home")  # every host's sparktf home: the demo sets
        for model in args.models:
            trainable, every = sizes[model]
            for case in args.cases:
                strategy, workers, _ = CASES[case]
                short, long = (
                    train(cluster, model, case, steps, home, args.sample_s)
                    for steps in STEPS[model]
                )
                step = per_step(short, long)
                least = bound(strategy, workers, trainable, every)
                model_bytes = step["sent"].get("tensorflow", 0) - step["batches_from_chief"]
                ratio = model_bytes / least
                name = f"{model}/{case}"
                cases[name] = {
                    "bound_bytes": least,
                    "model_bytes": model_bytes,
                    "ratio": round(ratio, 3),
                    "per_step": step,
                    "runs": [short, long],
                }
                goals[f"{name}.bytes_vs_bound"] = common.goal(round(ratio, 3), GOAL, "<=")
                log.info("%s: %s per step, bound %d: %.3f", name, step, least, ratio)
    common.write_results(
        "wire",
        {
            "goals": goals,
            "machine": common.machine(),
            "variables": {m: {"trainable_bytes": t, "bytes": e} for m, (t, e) in sizes.items()},
            "batch_size": BATCH,
            "cases": cases,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
