"""``sparktf submit``: spark-submit with sparktf's configuration.

    sparktf submit [--profile P] [--ship-env] [--dry-run] [SPARK-SUBMIT-OPTIONS] JOB [ARGS]

JOB is a job name (``train_resnet``, ``convert_mnist``, ``predict`` ...; ``sparktf --help``
lists them) or a Python file (``jobs/train_resnet.py``). What it adds to spark-submit:

- the profile's settings (``spark/P.conf`` of the conf directories; ``--profile`` defaults to
  ``$SPARKTF_PROFILE`` or ``local``); any spark-submit option before JOB overrides them;
- the master: ``--master``, else ``$SPARKTF_SPARK_MASTER``, else for ``--profile standalone``
  the cluster ``scripts/spark-cluster.sh start`` runs (its ``master.env``), else the profile's;
- this Python for the driver and the executors, worker reuse, the HDFS settings;
- a training job gets one executor (one task slot) per TensorFlow process: the count comes
  from the job's flags (``local-cluster[N,1,1024]``, ``spark.cores.max`` on standalone,
  ``spark.executor.instances`` on YARN and Kubernetes);
- executors sized to the cluster: on a standalone master or YARN whose resources can be
  read, executors the profile sizes too large for it are shrunk to fit (cores to what a node
  has, memory and overhead in the profile's proportion); sizes given on the command line are
  kept, and a run whose executors cannot all be placed fails at once, with the numbers;
- off the local profile, the library travels with the job (``--py-files``), and with
  ``--ship-env`` (or ``spark.sparktf.shipEnv true`` in the profile) the whole Python
  environment too: packed once per set of installed packages under sparktf's home and passed
  as ``--archives ENV#environment``, ``spark.pyspark.python=./environment/bin/python``;
  with ``spark.sparktf.shipEnv.dir DIR`` (``hdfs://``, ``s3://``) ENV is its copy there,
  named and checked by its sha256, as on YARN, where DIR defaults to the user's HDFS home;
- Spark's transport protected on standalone, YARN and Kubernetes masters:
  ``spark.authenticate``, ``spark.network.crypto.enabled`` and ``spark.io.encryption.enabled``
  turned on unless the profile or a ``--conf`` sets them (``false`` turns one off); a
  standalone master's shared secret comes from ``$SPARKTF_SPARK_SECRET_FILE`` or the
  ``scripts/spark-cluster.sh`` cluster's ``secret.conf``, and reaches spark-submit in a
  private file (``--extra-properties-file``; on Spark 4.0 ``--properties-file`` with the
  defaults copied in), never on its command line;
- the driver's console shows warnings and sparktf's progress (``log4j2.properties``);
  ``--log-level DEBUG`` brings Spark's INFO lines back;
- with Kerberos on (``SPARKTF_HDFS_PRINCIPAL`` or the Hadoop configuration), the Kerberos
  configuration ``KRB5_CONFIG`` names passed to the driver and executor JVMs
  (``-Djava.security.krb5.conf``), which do not read that variable.

``--dry-run`` prints the spark-submit command instead of running it. The exit code is the
job's (128 + N when a signal N ended spark-submit). SIGTERM and SIGHUP are passed on to
spark-submit, and its scratch files (the private file with the shared secret among them) are
removed when it ends; those of a ``sparktf submit`` killed outright (SIGKILL) are removed by the
next one once neither it nor its spark-submit is running (``sparktf.scratch``).
"""

from __future__ import annotations

import logging
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sparktf import cli, paths, placement, scratch, spark
from sparktf.jobs.catalog import JOBS
from sparktf.security import kerberos

__all__ = [
    "Command",
    "FLAGS",
    "SHIP_ENV_CONF",
    "SHIP_ENV_DIR_CONF",
    "build",
    "job_name",
    "main",
    "parse",
]

log = logging.getLogger("sparktf.submit")

# spark-submit options that take no value.
FLAGS = ("--verbose", "-v", "--supervise")
SHIP_ENV_CONF = "spark.sparktf.shipEnv"
SHIP_ENV_DIR_CONF = "spark.sparktf.shipEnv.dir"
INTERRUPT_S = 30.0  # how long spark-submit gets to stop its application after Ctrl-C
SCRATCH_PREFIX = "sparktf-submit-"  # its scratch directories, under $SPARKTF_HOME/submit


@dataclass
class Command:
    """A parsed ``sparktf submit`` command line."""

    profile: str
    ship_env: bool = False
    dry_run: bool = False
    before: list[str] = field(default_factory=list)  # spark-submit options
    job: str = ""
    job_args: list[str] = field(default_factory=list)

    def option(self, flag: str, key: str) -> str | None:
        """The value of spark-submit option ``flag`` (as spark-submit, it wins), else of
        ``--conf key=...``, if given."""
        found = None
        for i, arg in enumerate(self.before):
            if arg == flag and i + 1 < len(self.before):
                found = self.before[i + 1]
            elif arg.startswith(flag + "="):
                found = arg.split("=", 1)[1]
        return found if found is not None else self.confs().get(key)

    def confs(self) -> dict[str, str]:
        """The ``--conf key=value`` settings given (the last of a key wins)."""
        found = {}
        for i, arg in enumerate(self.before):
            pair = self.before[i + 1] if arg == "--conf" and i + 1 < len(self.before) else None
            if arg.startswith("--conf="):
                pair = arg[len("--conf=") :]
            if pair and "=" in pair:
                key, value = pair.split("=", 1)
                found[key] = value
        return found

    def gives(self, flag: str, key: str) -> bool:
        return self.option(flag, key) is not None


def parse(argv: Sequence[str]) -> Command:
    """Splits ``argv`` into sparktf's options, spark-submit's options, the job and its args."""
    args = list(argv)
    command = Command(profile=os.environ.get("SPARKTF_PROFILE", "local"))
    i = 0
    while i < len(args):
        arg = args[i]
        if command.job:
            command.job_args.append(arg)
        elif arg == "--profile" or arg.startswith("--profile="):
            if "=" in arg:
                command.profile = arg.split("=", 1)[1]
            elif i + 1 < len(args):
                i += 1
                command.profile = args[i]
            else:
                raise cli.UsageError("--profile needs a value")
        elif arg == "--ship-env":
            command.ship_env = True
        elif arg == "--dry-run":
            command.dry_run = True
        elif arg in FLAGS or "=" in arg and arg.startswith("--"):
            command.before.append(arg)
        elif arg.startswith("-"):
            command.before.append(arg)
            if i + 1 < len(args):  # an option without '=' takes the next word as its value
                i += 1
                command.before.append(args[i])
        else:
            command.job = arg
        i += 1
    return command


def job_name(job: str) -> str:
    """The job's name: ``jobs/train_resnet.py`` and ``train_resnet`` are ``train_resnet``."""
    return Path(job).name.removesuffix(".py").replace("-", "_")


def _launcher(name: str, scratch: Path) -> Path:
    """A file spark-submit can run for the job ``name`` (a name is not a file)."""
    path = scratch / f"sparktf_{name}.py"
    path.write_text(f"from sparktf.console import run_job\n\nrun_job({name!r})\n")
    return path


def _executors_needed(name: str, job_args: Sequence[str]) -> int | None:
    if not name.startswith("train"):
        return None
    from sparktf.jobs.train import executors_needed

    return executors_needed(name, list(job_args))


def _library_zip(scratch: Path) -> Path:
    """sparktf as a zip for ``--py-files`` (executors that do not have it installed)."""
    import sparktf

    package = Path(sparktf.__file__).resolve().parent
    archive = shutil.make_archive(
        str(scratch / "sparktf"), "zip", str(package.parent), package.name
    )
    return Path(archive)


def build(command: Command, scratch: Path) -> tuple[list[str], dict[str, str]]:
    """The spark-submit command line and the environment to run it in."""
    profile_file = spark.profile_file(command.profile)
    profile = spark.read_conf_file(profile_file)
    if not os.environ.get("HADOOP_CONF_DIR"):
        # the Hadoop client configuration of the conf directories (scripts/hdfs.sh's): for
        # spark-submit, and for reading the YARN it names (sizing, loopback)
        local = next((d / "hadoop" for d in paths.conf_dirs() if (d / "hadoop").is_dir()), None)
        if local is not None and (local / "core-site.xml").is_file():
            os.environ["HADOOP_CONF_DIR"] = str(local)
    env = dict(os.environ)
    python = env.get("SPARKTF_PYTHON", sys.executable)
    submit = env.get("SPARKTF_SPARK_SUBMIT") or _spark_submit(python)
    env["PYSPARK_PYTHON"] = env["PYSPARK_DRIVER_PYTHON"] = python
    extra = _java_options(command, profile, env)

    master = command.option("--master", "spark.master")
    master_given = master is not None
    if not master:
        master = spark.cluster_master(command.profile)
        if master:
            extra += ["--master", master]
            master_given = True
            log.info(
                "master %s (%s)",
                master,
                "SPARKTF_SPARK_MASTER"
                if os.environ.get("SPARKTF_SPARK_MASTER")
                else "scripts/spark-cluster.sh",
            )
        else:
            master = profile.get("spark.master", "")
    if master == "yarn":
        extra += _yarn_here(command, profile, env)
    # a local-cluster's work directories under $SPARKTF_HOME, not site-packages/pyspark/work
    spark.use_local_spark_home(master, env)
    if master.startswith(("local", "spark://127.0.0.1:", "spark://localhost:")):
        env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        extra += ["--conf", "spark.driver.host=127.0.0.1"]
        extra += ["--conf", "spark.driver.bindAddress=127.0.0.1"]

    s3_options, s3_private = _s3a(command, profile)
    extra += s3_options
    transport, profile_file = _transport(
        command, profile, master, scratch, profile_file, s3_private
    )
    extra += transport

    name = job_name(command.job)
    n = _executors_needed(name, command.job_args)
    cores_given = command.option("--executor-cores", "spark.executor.cores")
    if cores_given and "spark.task.cpus" not in command.confs():
        extra += ["--conf", f"spark.task.cpus={cores_given}"]

    if n:
        extra += _training_executors(command, profile, master, master_given, n)
    else:  # other jobs run on what they get: executors that fit, as many as asked or one
        asked = command.option("--num-executors", "spark.executor.instances")
        wanted = int(asked or profile.get("spark.executor.instances", "1"))
        try:
            extra += _sized(command, profile, master, wanted)[0]
        except placement.PlacementError:
            extra += _sized(command, profile, master, 1)[0]

    ship_env = command.ship_env or profile.get(SHIP_ENV_CONF, "false").lower() == "true"
    if ship_env:
        from sparktf.console import shipenv

        archive = shipenv.pack(paths.state_dir("envs"), prefix=Path(python).parent.parent)
        shared_dir = command.confs().get(SHIP_ENV_DIR_CONF) or profile.get(SHIP_ENV_DIR_CONF)
        extra += shipenv.submit_args(_shared(archive, shared_dir, yarn=master == "yarn"))
    if ship_env or command.profile != "local" and not master.startswith("local"):
        py_files = str(_library_zip(scratch))
        user = command.option("--py-files", "spark.submit.pyFiles")
        if user:  # one --py-files for both
            py_files += "," + user
            command.before = _without_option(command.before, "--py-files")
        extra += ["--py-files", py_files]
    elif paths.source_checkout() is not None:
        extra += ["--conf", f"spark.executorEnv.PYTHONPATH={paths.source_checkout()}"]
    for var in spark.PROPAGATED_ENV:
        if env.get(var):
            extra += ["--conf", f"spark.executorEnv.{var}={env[var]}"]

    job_file = command.job if command.job.endswith(".py") else str(_launcher(name, scratch))
    argv = [
        submit,
        "--properties-file",
        str(profile_file),
        "--conf",
        f"spark.pyspark.python={python}",
        "--conf",
        f"spark.pyspark.driver.python={python}",
        "--conf",
        "spark.python.worker.reuse=true",
        *extra,
        *command.before,
        job_file,
        *command.job_args,
    ]
    return argv, env


def _java_options(command: Command, profile: dict, env: dict[str, str]) -> list[str]:
    """The JVM options sparktf adds, after those the profile or the command line give: the
    driver console's log4j configuration (unless ``--log-level DEBUG``), and with Kerberos
    on, the ``KRB5_CONFIG`` file as ``java.security.krb5.conf`` of the driver and executor
    JVMs (Java does not read that variable; the driver's JVM logs in before the job runs)."""
    added: dict[str, list[str]] = {"spark.driver.extraJavaOptions": []}
    if _log_level(command, env).upper() != "DEBUG":
        log4j = spark.log4j_conf().resolve().as_uri()
        added["spark.driver.extraJavaOptions"].append(f"-Dlog4j2.configurationFile={log4j}")
    if kerberos.enabled() and env.get("KRB5_CONFIG"):
        flag = f"-D{kerberos.KRB5_CONF_PROPERTY}={env['KRB5_CONFIG']}"
        added["spark.driver.extraJavaOptions"].append(flag)
        added["spark.executor.extraJavaOptions"] = [flag]
    options = []
    for key, flags in added.items():
        given = {**profile, **command.confs()}.get(key, "")
        flags = [flag for flag in flags if flag.split("=", 1)[0] not in given]
        if flags:  # one setting with both: the command line's own goes (it would win)
            command.before = _without_conf(command.before, key)
            options += ["--conf", f"{key}={' '.join([given, *flags]).strip()}"]
    return options


def _without_conf(args: list[str], key: str) -> list[str]:
    """``args`` without its ``--conf key=...`` settings."""
    kept, i = [], 0
    while i < len(args):
        pair = args[i + 1] if args[i] == "--conf" and i + 1 < len(args) else None
        if pair is not None and pair.startswith(key + "="):
            i += 2
            continue
        if not args[i].startswith(f"--conf={key}="):
            kept.append(args[i])
        i += 1
    return kept


def _log_level(command: Command, env: dict[str, str]) -> str:
    """The job's ``--log-level``, else ``$SPARKTF_LOG_LEVEL``, else INFO."""
    level = env.get("SPARKTF_LOG_LEVEL", "INFO")
    for i, arg in enumerate(command.job_args):
        if arg == "--log-level" and i + 1 < len(command.job_args):
            level = command.job_args[i + 1]
        elif arg.startswith("--log-level="):
            level = arg.split("=", 1)[1]
    return level


def _s3a(command: Command, profile: dict) -> tuple[list[str], dict[str, str]]:
    """``s3a://`` with this process's AWS settings (``spark.s3a_settings``): the options that
    give the connector's jars (one ``--jars`` with the user's, and on the driver's and the
    executors' class paths, where spark-submit and an executor's start fetch an ``s3://``
    archive, file or job, from where the jars are here) and its settings,
    and the settings that hold keys, for the private properties file."""
    s3 = spark.s3a_settings({**profile, **command.confs()})
    private = spark.private_settings(s3)
    options = []
    jars = s3.pop("spark.jars", None)
    if jars:
        from sparktf.spark import s3a

        ours = s3a.s3a_jars()
        user = command.option("--jars", "spark.jars")
        if user:
            jars = ",".join(dict.fromkeys(user.split(",") + jars.split(",")))
            command.before = _without_option(command.before, "--jars")
        options += ["--jars", jars]
        key = "spark.driver.extraClassPath"
        path = command.option("--driver-class-path", key) or profile.get(key)
        command.before = _without_option(command.before, "--driver-class-path")
        options += ["--driver-class-path", _class_path(path, ours)]
        # an executor fetches --archives and --files before it loads --jars
        key = "spark.executor.extraClassPath"
        path = command.confs().get(key) or profile.get(key)
        options += ["--conf", f"{key}={_class_path(path, ours)}"]
    options += [arg for key, value in s3.items() for arg in ("--conf", f"{key}={value}")]
    return options, private


def _class_path(given: str | None, jars: list[str]) -> str:
    """A class path of the entries of ``given`` (``:``-separated), then ``jars``, once each."""
    return ":".join(dict.fromkeys((given.split(":") if given else []) + jars))


def _transport(
    command: Command,
    profile: dict,
    master: str,
    scratch: Path,
    profile_file: Path,
    private: dict[str, str] | None = None,
) -> tuple[list[str], Path]:
    """The options that protect Spark's transport on ``master`` (``spark.transport_defaults``:
    authentication, RPC and I/O encryption, unless the profile or the command line set them)
    and the shared secret the master needs, with the other ``private`` settings (S3 keys), in
    a private file under ``scratch`` (``spark.private_properties_args``), never on the command
    line; and the properties file to give spark-submit: ``profile_file``, or on Spark 4.0 that
    private file, which then holds the profile's lines too (4.0 has no
    ``--extra-properties-file``)."""
    user = {**profile, **command.confs()}
    added = spark.transport_defaults(master, user)
    options = [arg for key, value in added.items() for arg in ("--conf", f"{key}={value}")]
    secret = spark.transport_secret(master, {**user, **added})
    private = dict(private or {})
    if secret is not None:
        private[spark.SECRET_CONF] = secret
    if private:
        given = spark.private_properties_args(scratch / "secret.conf", private, base=profile_file)
        if given[0] == "--properties-file":  # in the profile's place
            return options, Path(given[1])
        options += given
    return options, profile_file


def _yarn_here(command: Command, profile: dict, env: dict[str, str]) -> list[str]:
    """For a YARN on this machine (its ResourceManager on loopback, as ``scripts/yarn.sh``
    starts it): the driver on loopback too, and Spark's jars from this pyspark
    (``spark.yarn.jars=local:...``) instead of a 440 MB upload per submit, unless set."""
    host = spark.yarn_site().get("yarn.resourcemanager.address", "").rsplit(":", 1)[0]
    if host not in ("127.0.0.1", "localhost"):
        return []
    extra = []
    if "spark.driver.host" not in command.confs():
        extra += ["--conf", "spark.driver.host=127.0.0.1"]
        extra += ["--conf", "spark.driver.bindAddress=127.0.0.1"]
    jars = ("spark.yarn.jars", "spark.yarn.archive")
    if not any(key in command.confs() or profile.get(key) for key in jars):
        import pyspark

        local = Path(env.get("SPARK_HOME") or Path(pyspark.__file__).parent) / "jars"
        extra += ["--conf", f"spark.yarn.jars=local:{local}/*"]
        log.info("YARN on this machine: Spark's jars from %s", local)
    return extra


def _shared(archive: Path, directory: str | None, *, yarn: bool) -> str | Path:
    """Where the executors fetch the packed environment from: its copy in ``directory`` (the
    profile's or a ``--conf``'s ``spark.sparktf.shipEnv.dir``: ``hdfs://``, ``s3://``, any
    shared file system; ``shipenv.shared_copy``: named and checked by its sha256), else on
    YARN its copy under the user's HDFS home, else the local archive (which spark-submit
    uploads or serves per application). YARN localizes an archive it reads from a shared
    file system once per node and keeps it for later applications."""
    from sparktf import storage
    from sparktf.console import shipenv

    if directory:
        return shipenv.shared_copy(archive, directory)
    fs = storage.default_fs() if yarn else None
    if fs is None:
        return archive
    return shipenv.shared_copy(archive, f"{fs}/user/{storage.hdfs_user()}/.sparktf/envs")


def _spark_submit(python: str) -> str:
    beside = Path(python).parent / "spark-submit"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("spark-submit")
    if not found:
        raise cli.UsageError(
            "spark-submit not found: install pyspark into this environment or set "
            "SPARKTF_SPARK_SUBMIT"
        )
    return found


def _without_option(args: list[str], flag: str) -> list[str]:
    kept, skip = [], False
    for arg in args:
        if skip:
            skip = False
        elif arg == flag:
            skip = True
        elif not arg.startswith(flag + "="):
            kept.append(arg)
    return kept


def _training_executors(
    command: Command, profile: dict, master: str, master_given: bool, n: int
) -> list[str]:
    """The options that size and count the executors of a training job of ``n`` processes:
    one process per executor, unless the executors given have several task slots."""
    per = 1
    cores_given = command.option("--executor-cores", "spark.executor.cores")
    if cores_given:
        given = {**profile, **command.confs(), "spark.executor.cores": cores_given}
        per = spark.executor_slots(
            {**given, "spark.task.cpus": given.get("spark.task.cpus") or cores_given}
        )
    executors = -(-n // per)
    if per > 1:
        log.info("%d task slots per executor: %d executors for %d processes", per, executors, n)
    sized, cores = _sized(command, profile, master, executors)
    return sized + _count(command, master, master_given, executors, cores, per)


def _count(
    command: Command, master: str, master_given: bool, n: int, cores: int, per: int = 1
) -> list[str]:
    """The options that give a training job ``n`` executors of ``cores`` (``per`` task slots
    each) on ``master``."""
    if master.startswith("local"):
        # the profile's local-cluster[2,...] fits only two; a given --master is left alone
        return [] if master_given else ["--master", f"local-cluster[{n},{per},1024]"]
    if master.startswith("spark://"):
        if command.gives("--total-executor-cores", "spark.cores.max"):
            return []
        log.info("%d executors for the TensorFlow processes: spark.cores.max=%d", n, n * cores)
        return ["--conf", f"spark.cores.max={n * cores}"]
    if master == "yarn" or master.startswith("k8s://"):
        if command.gives("--num-executors", "spark.executor.instances"):
            return []
        log.info("%d executors for the TensorFlow processes: spark.executor.instances=%d", n, n)
        return ["--conf", f"spark.executor.instances={n}"]
    return []


def _sized(command: Command, profile: dict, master: str, n: int) -> tuple[list[str], int]:
    """The options that size the executors to the cluster (none when the profile's or the
    command line's fit) and the executors' cores (``sparktf.spark.executor_sizing``; sizes
    given on the command line are kept, or fail with the numbers)."""
    keys = {
        "spark.executor.cores": "--executor-cores",
        "spark.executor.memory": "--executor-memory",
        "spark.executor.memoryOverhead": "",
        "spark.yarn.am.memory": "",
    }
    given = {}
    for key, flag in keys.items():
        value = command.option(flag or key, key)
        if value is not None:
            given[key] = value
    conf = {**profile, **command.confs(), **given}
    fixed = bool(given.keys() & {"spark.executor.cores", "spark.executor.memory"})
    sized = spark.executor_sizing(master, conf, n, fixed=fixed)
    cores = int(sized.get("spark.executor.cores", conf.get("spark.executor.cores", "1")))
    return [arg for k, v in sized.items() for arg in ("--conf", f"{k}={v}")], cores


def main(argv: Sequence[str]) -> int:
    """``sparktf submit ARGS``: runs spark-submit; returns its exit code."""
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if argv else 2
    if not logging.getLogger().handlers:
        cli.setup_logging()
    command = parse(argv)
    if not command.job:
        raise cli.UsageError("sparktf submit: no job given (a job name or a .py file)")
    if not command.job.endswith(".py"):
        if job_name(command.job) not in JOBS:
            raise cli.UsageError(
                f"unknown job {command.job!r}: one of {', '.join(JOBS)} or a .py file"
            )
    elif not os.path.isfile(command.job):
        raise cli.UsageError(f"no such job file: {command.job}")
    try:
        spark.profile_file(command.profile)
    except FileNotFoundError as exc:
        raise cli.UsageError(str(exc)) from None
    paths.home().mkdir(parents=True, exist_ok=True)
    state = str(paths.state_dir("submit"))
    scratch.sweep([state], prefixes=(SCRATCH_PREFIX,))  # of a submit killed outright
    tmp = scratch.make_dir(SCRATCH_PREFIX, dir=state)
    try:
        try:
            argv_, env = build(command, Path(tmp))
        except placement.PlacementError as exc:
            raise cli.UsageError(f"the run cannot be placed: {exc}") from None
        except spark.TransportError as exc:
            raise cli.UsageError(str(exc)) from None
        if command.dry_run:
            print(shlex.join(argv_))
            return 0
        return _run(argv_, env, scratch.owner_fd(tmp))
    finally:
        scratch.remove_dir(tmp)


def _run(argv: list[str], env: dict[str, str], owner_fd: int) -> int:
    """spark-submit as a child that SIGTERM and SIGHUP reach (Python's default for them ends
    this process at once, leaving the scratch behind); its exit code, 128 + N for signal N.
    The child shares the scratch directory's owner lock (``owner_fd``), so the directory is
    not swept while it runs, even when this process was killed."""
    child: subprocess.Popen | None = None
    pending: list[int] = []

    def forward(signum, _frame):
        if child is None:
            pending.append(signum)
        else:
            child.send_signal(signum)

    passed = (signal.SIGTERM, signal.SIGHUP)
    main_thread = threading.current_thread() is threading.main_thread()
    before = {signum: signal.signal(signum, forward) for signum in passed if main_thread}
    try:
        child = subprocess.Popen(argv, env=env, pass_fds=(owner_fd,))
        for signum in pending:
            child.send_signal(signum)
        code = child.wait()
    except BaseException as exc:
        if child is not None:
            _stop(child, interrupted=isinstance(exc, KeyboardInterrupt))
        raise
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)
    return 128 - code if code < 0 else code


def _stop(child: subprocess.Popen, interrupted: bool) -> None:
    """After Ctrl-C spark-submit gets INTERRUPT_S to stop its application (a terminal has
    signalled it too), unless a second Ctrl-C comes; otherwise, or then, it is killed."""
    try:
        if interrupted and child.poll() is None:
            child.send_signal(signal.SIGINT)
            child.wait(INTERRUPT_S)
    except (KeyboardInterrupt, subprocess.TimeoutExpired):
        pass
    finally:
        child.kill()
        child.wait()
