"""Spark's transport protected by default (``sparktf.spark``'s transport settings, ``sparktf
submit``), the warning when a run's secrets travel in clear, and TensorFlowOnSpark's log
lines without secrets (``sparktf.security.redact``). No JVM: configurations, command lines
and log records."""

from __future__ import annotations

import logging
import os
import shlex
import stat

import pytest

from sparktf import cli, spark
from sparktf.console import submit
from sparktf.security import redact
from tests.helpers import ConfSession

pytestmark = pytest.mark.unit

PROTECTED = {key: "true" for key in spark.TRANSPORT_SETTINGS}


def secret_file(tmp_path, secret: str = "0123456789abcdef" * 4):
    return spark.write_private_conf(tmp_path / "cluster-secret.conf", {spark.SECRET_CONF: secret})


# ----------------------------------------------------------------------------- settings


def test_defaults_protect_remote_masters_and_the_user_setting_wins():
    for master in ("yarn", "k8s://https://k:443", "spark://h:7077"):
        assert spark.transport_defaults(master, {}) == PROTECTED
    for master in ("local", "local[4]", "local-cluster[2,1,1024]", ""):
        assert spark.transport_defaults(master, {}) == {"spark.authenticate": "true"}
        assert spark.transport_defaults(master, {"spark.authenticate": "false"}) == {}
    given = {"spark.authenticate": "false", "spark.io.encryption.enabled": "true"}
    assert spark.transport_defaults("yarn", given) == {"spark.network.crypto.enabled": "true"}


def test_profiles_turn_the_transport_on_and_overrides_turn_it_off(clean_env):
    for profile in ("standalone", "yarn", "k8s"):
        conf = spark.profile_conf(profile)
        assert {key: conf[key] for key in PROTECTED} == PROTECTED, profile
    assert spark.session_conf("local")["spark.authenticate"] == "true"  # another user: no
    off = spark.session_conf("yarn", {"spark.network.crypto.enabled": "false"})
    assert off["spark.network.crypto.enabled"] == "false" and off["spark.authenticate"] == "true"


def test_a_profile_without_them_gets_them_unless_the_user_turns_one_off(clean_env, tmp_path):
    bare = tmp_path / "bare.conf"
    bare.write_text("spark.master  yarn\nspark.executor.instances 1\n")
    conf = spark.session_conf(str(bare))
    assert {key: conf[key] for key in PROTECTED} == PROTECTED
    argv = command_line(tmp_path, str(bare), "predict", "--export", "m")
    assert all(f"{key}=true" in argv for key in PROTECTED)
    off = ("--conf", "spark.authenticate=false")
    argv = command_line(tmp_path, str(bare), *off, "predict", "--export", "m")
    assert "spark.authenticate=true" not in argv and "spark.authenticate=false" in argv
    assert "spark.network.crypto.enabled=true" in argv
    # YARN makes its secret itself: the profile is the one properties file
    assert "--extra-properties-file" not in argv and argv.count("--properties-file") == 1
    assert argv[argv.index("--properties-file") + 1] == str(bare)


# How spark-submit is given a private properties file: --extra-properties-file from Spark 4.1,
# --properties-file (the defaults copied in) on 4.0 (the petastorm stack).
PROPERTIES_FLAGS = ("--extra-properties-file", "--properties-file")


def properties_file(argv: list[str]) -> str:
    """The private properties file spark-submit's ``argv`` names (on 4.0 the one
    --properties-file, which holds the profile's lines too)."""
    flag = next(f for f in PROPERTIES_FLAGS if f in argv)
    return argv[argv.index(flag) + 1]


def command_line(tmp_path, profile: str, *argv: str) -> list[str]:
    """The spark-submit command ``sparktf submit --profile PROFILE ARGV`` runs."""
    scratch = tmp_path / f"scratch-{len(list(tmp_path.glob('scratch-*')))}"
    scratch.mkdir(mode=0o700)
    return submit.build(submit.parse(["--profile", profile, *argv]), scratch)[0]


def test_standalone_gets_the_cluster_secret_in_a_private_file_never_on_the_command_line(
    clean_env, tmp_path, capsys
):
    secret = "feedface" * 8
    clean_env.setenv("SPARKTF_SPARK_MASTER", "spark://127.0.0.1:7077")
    clean_env.setenv(spark.SECRET_FILE_ENV, str(secret_file(tmp_path, secret)))
    closed = "spark.sparktf.master.webui=http://127.0.0.1:9"  # nothing answers
    scratch = tmp_path / "scratch"
    scratch.mkdir(mode=0o700)
    argv, _ = submit.build(
        submit.parse(["--profile", "standalone", "--conf", closed, "predict", "--export", "m"]),
        scratch,
    )
    assert secret not in " ".join(argv)
    path = properties_file(argv)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert spark.read_conf_file(path)[spark.SECRET_CONF] == secret  # (4.0: the profile's too)
    assert argv.count("--properties-file") == 1
    # through main: the printed command has no secret either, and the scratch is gone
    assert submit.main(["--dry-run", "--profile", "standalone", "--conf", closed, "predict"]) == 0
    printed = shlex.split(capsys.readouterr().out)
    assert secret not in " ".join(printed)
    assert not os.path.exists(properties_file(printed))


def test_standalone_without_a_secret_fails_before_spark_unless_auth_is_off(clean_env):
    clean_env.setenv("SPARKTF_SPARK_MASTER", "spark://127.0.0.1:7077")
    closed = "spark.sparktf.master.webui=http://127.0.0.1:9"
    with pytest.raises(cli.UsageError, match=spark.SECRET_FILE_ENV) as refused:
        submit.main(["--dry-run", "--profile", "standalone", "--conf", closed, "predict"])
    assert "spark.authenticate=false" in str(refused.value)
    argv = ["--profile", "standalone", "--conf", closed, "--conf", "spark.authenticate=false"]
    assert submit.main(["--dry-run", *argv, "predict"]) == 0


def test_the_local_cluster_script_secret_is_found_by_its_master(clean_env, tmp_path):
    cluster = tmp_path / "no-cluster"
    cluster.mkdir()
    path = secret_file(tmp_path, "ab" * 32)
    (cluster / "master.env").write_text(
        f"SPARK_MASTER_URL=spark://127.0.0.1:4242\nSPARK_SECRET_FILE={path}\n"
    )
    on = {"spark.authenticate": "true"}
    assert spark.transport_secret("spark://127.0.0.1:4242", on) == "ab" * 32
    with pytest.raises(spark.TransportError):
        spark.transport_secret("spark://elsewhere:7077", on)
    assert spark.transport_secret("spark://elsewhere:7077", {**on, spark.SECRET_CONF: "x"}) is None
    assert spark.transport_secret("yarn", on) is None  # YARN makes one per application
    fresh = {spark.transport_secret("local-cluster[2,1,1024]", on) for _ in range(2)}
    assert len(fresh) == 2 and all(len(s) == 64 for s in fresh)  # one per application
    assert spark.transport_secret("spark://127.0.0.1:4242", {}) is None  # authentication off


def test_secret_files_hold_a_conf_line_or_the_secret_alone(tmp_path, caplog):
    alone = tmp_path / "alone"
    alone.write_text("# the cluster's\ns3cr3t-value\n")
    alone.chmod(0o644)
    with caplog.at_level(logging.WARNING, logger="sparktf.spark"):
        assert spark.read_secret(alone) == "s3cr3t-value"
    assert "readable by others" in caplog.text and "s3cr3t" not in caplog.text
    bad = tmp_path / "bad"
    bad.write_text("spark.authenticate true\nspark.other x\n")
    with pytest.raises(spark.TransportError, match="no 'spark.authenticate.secret VALUE' line"):
        spark.read_secret(bad)
    with pytest.raises(spark.TransportError, match="cannot read"):
        spark.read_secret(tmp_path / "missing")


# ----------------------------------------------------------------------------- the warning


def test_the_warning_names_what_to_change_and_only_when_secrets_travel_in_clear():
    clear = spark.transport_warning({"spark.master": "yarn", "spark.authenticate": "false"})
    assert clear == (
        "Spark's transport is not protected (spark.authenticate=false, "
        "spark.network.crypto.enabled unset): the run's secrets (reservation secret, control "
        "tokens, TensorFlowOnSpark's manager keys) travel in clear in Spark's task closures "
        "between the driver and the executors. Set spark.authenticate=true and "
        "spark.network.crypto.enabled=true (sparktf submit sets them on standalone, YARN and "
        "Kubernetes unless the configuration turns them off)"
    )
    half = spark.transport_warning({"spark.master": "spark://h:7077", "spark.authenticate": "true"})
    assert "(spark.network.crypto.enabled unset)" in half
    assert "Set spark.network.crypto.enabled=true; a standalone master also needs" in half
    assert "SPARKTF_SPARK_SECRET_FILE" in half
    assert "spark.authenticate" not in half.split("Set ")[1].split(";")[0]
    for quiet in (
        {"spark.master": "local[2]"},
        {"spark.master": "local-cluster[2,1,1024]"},
        {"spark.master": "yarn", **PROTECTED},
    ):
        assert spark.transport_warning(quiet) is None


def test_the_driver_logs_the_warning_once_per_run(caplog):
    from sparktf.train.driver.bringup import warn_if_transport_in_clear

    with caplog.at_level(logging.WARNING, logger="sparktf.train.driver.bringup"):
        said = warn_if_transport_in_clear(ConfSession({"spark.master": "yarn"}))
        warn_if_transport_in_clear(ConfSession({"spark.master": "yarn", **PROTECTED}))
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and warnings[0].getMessage() == said


# ----------------------------------------------------------------------------- logs


@pytest.fixture
def tfos_loggers():
    """TensorFlowOnSpark's loggers restored after the test (levels and filters)."""
    loggers = [logging.getLogger(n) for n in redact.TFOS_LOGGERS] + [logging.root]
    saved = [(lg, lg.level, list(lg.filters)) for lg in loggers]
    yield
    for logger, level, filters in saved:
        logger.setLevel(level)
        logger.filters[:] = filters


def test_tensorflowonspark_node_lines_lose_their_authkeys_at_every_level(tfos_loggers, caplog):
    logging.getLogger("tensorflowonspark").setLevel(logging.DEBUG)  # set on purpose: kept
    run_secret = os.urandom(32)
    redact.protect_tensorflowonspark_logs(run_secret, None)
    authkey = b"\x8a'\x00\x17\"secret\\key\xff" + os.urandom(8)
    node = {"executor_id": 0, "addr": ("127.0.0.1", 4242), "authkey": authkey, "port": 1}
    cluster = logging.getLogger("tensorflowonspark.TFCluster")
    with caplog.at_level(logging.DEBUG):
        cluster.info(node)
        logging.getLogger("tensorflowonspark.TFSparkNode").debug("TFSparkNode.reserve: %s", node)
        logging.getLogger("tensorflowonspark.reservation").warning(
            "sent: token=%s secret: %s", run_secret.hex(), run_secret
        )
        try:
            raise ValueError(f"bad node {node}")
        except ValueError:
            cluster.exception("failed")
        logging.info("Cluster spec: %s", {"authkey": authkey.hex()})  # TFNode logs on root
    text = caplog.text + "".join(r.getMessage() for r in caplog.records)
    assert len(caplog.records) == 5
    for form in redact.secret_forms(authkey) | redact.secret_forms(run_secret):
        assert form not in text, form
    assert "'authkey': <redacted>" in text and "'executor_id': 0" in text
    assert logging.getLogger("tensorflowonspark").level == logging.DEBUG


def test_tensorflowonspark_goes_quiet_unless_sparktf_logs_at_debug(tfos_loggers):
    package = logging.getLogger("tensorflowonspark")
    package.setLevel(logging.NOTSET)
    sparktf_log = logging.getLogger("sparktf")
    level = sparktf_log.level
    try:
        sparktf_log.setLevel(logging.DEBUG)
        redact.protect_tensorflowonspark_logs()
        assert package.level == logging.NOTSET  # DEBUG: its lines stay, redacted
        sparktf_log.setLevel(logging.INFO)
        redact.protect_tensorflowonspark_logs()
        assert package.level == logging.WARNING
    finally:
        sparktf_log.setLevel(level)
    for name in redact.TFOS_LOGGERS:
        assert logging.getLogger(name).filters.count(redact.FILTER) == 1


def test_urls_named_in_logs_and_errors_lose_their_passwords_and_tokens():
    uri = "https://me:s3cr3t-pass@mlflow.example.com:5000/path?x=1"
    assert redact.redact_url(uri) == "https://me:<redacted>@mlflow.example.com:5000/path?x=1"
    assert redact.redact_url("http://mlflow:5000") == "http://mlflow:5000"
    assert redact.redact_url("https://h/x?token=abc&y=2") == "https://h/x?token=<redacted>&y=2"
    assert redact.redact_url("sc://[::1") == "sc://[::1"  # no URL: nothing to hide
    said = "cannot reach https://me:s3cr3t-pass@h: bad password s3cr3t-pass"
    hidden = "cannot reach https://me:<redacted>@h: bad password <redacted>"
    assert redact.scrub(said, uri) == hidden
    assert redact.scrub("no password here", "http://mlflow:5000") == "no password here"


# ----------------------------------------------------------------------------- running apps


def event_log_conf(directory) -> list[str]:
    """spark-submit options that keep the application's event log in the local
    ``directory``."""
    settings = {
        "spark.eventLog.enabled": "true",
        "spark.eventLog.dir": f"file://{directory}",
        "spark.eventLog.compress": "false",  # plain JSON lines, one file
        "spark.eventLog.rolling.enabled": "false",
    }
    return [arg for key, value in settings.items() for arg in ("--conf", f"{key}={value}")]


def app_settings(directory) -> dict[str, str]:
    """The Spark properties the one application logged in ``directory`` ran with (its
    event log's environment update)."""
    import json
    from pathlib import Path

    logs = [p for p in Path(directory).rglob("*") if p.is_file()]
    assert len(logs) == 1, logs
    for line in logs[0].read_text().splitlines():
        event = json.loads(line)
        if event.get("Event") == "SparkListenerEnvironmentUpdate":
            props = event["Spark Properties"]
            return dict(props.items() if isinstance(props, dict) else props)
    raise AssertionError(f"no environment update in {logs[0]}")


def assert_transport_protected(settings: dict[str, str]) -> None:
    """The application ran with authentication, RPC and I/O encryption on."""
    assert {key: settings.get(key) for key in PROTECTED} == PROTECTED, settings


def test_private_settings_reach_a_new_jvm_in_a_private_file_not_its_command_line(monkeypatch):
    """The shared secret and a delegation token for remote executors: PySpark would put a
    builder setting on the driver JVM's command line (``/proc/*/cmdline``, readable by every
    local user); a JVM yet to start reads them from a 0600 file named in
    PYSPARK_SUBMIT_ARGS, removed afterwards."""
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    from sparktf.spark.transport import private_for_new_jvm

    monkeypatch.setattr(SparkContext, "_gateway", None)
    monkeypatch.delenv("PYSPARK_SUBMIT_ARGS", raising=False)
    private = {
        "spark.authenticate.secret": "s3cr3t-value",
        "spark.executorEnv.SPARKTF_HDFS_DELEGATION_TOKEN": "tok-9",
    }
    builder = SparkSession.Builder()
    with private_for_new_jvm(builder, private) as built:
        assert all(v not in str(built._options) for v in private.values())
        args = shlex.split(os.environ["PYSPARK_SUBMIT_ARGS"])
        path = properties_file(args)
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        text = open(path).read()
        assert all(f"{k} {v}" in text or f"{k}={v}" in text for k, v in private.items()), text
        assert args[-1] == "pyspark-shell"
    assert "PYSPARK_SUBMIT_ARGS" not in os.environ and not os.path.exists(path)


# ----------------------------------------------------------------------------- the driver's UI


@pytest.mark.parametrize(
    ("conf", "guarded"),
    [
        ({"spark.master": "spark://m:7077"}, True),
        ({"spark.master": "spark://m:7077", "spark.ui.enabled": "false"}, False),
        ({"spark.master": "spark://m:7077", "spark.ui.filters": "my.Filter"}, False),
        ({"spark.master": "spark://m:7077", "spark.sparktf.ui.protect": "false"}, False),
        ({"spark.master": "yarn"}, False),  # the ResourceManager's proxy and its filter
        ({"spark.master": "local-cluster[2,1,1024]"}, False),
    ],
)
def test_the_ui_of_a_standalone_driver_asks_for_a_token(conf, guarded):
    from sparktf.spark import ui

    public, private = ui.protect_settings(conf)
    assert bool(public) == bool(private) == guarded
    if guarded:
        assert public == {"spark.ui.filters": ui.JWS_FILTER}
        key = private[ui.KEY_CONF]
        assert len(key) == 43 and key != ui.protect_settings(conf)[1][ui.KEY_CONF]  # fresh


def test_the_ui_token_is_an_hs256_jws_of_the_key():
    import base64
    import hashlib
    import hmac
    import json

    from sparktf.spark import ui

    key = base64.urlsafe_b64encode(b"k" * 32).rstrip(b"=").decode()
    header, payload, signature = ui.bearer_token(key, "alice").split(".")
    pad = lambda text: text + "=" * (-len(text) % 4)  # noqa: E731
    assert json.loads(base64.urlsafe_b64decode(pad(header))) == {"alg": "HS256", "typ": "JWT"}
    assert json.loads(base64.urlsafe_b64decode(pad(payload))) == {"sub": "alice"}
    expected = hmac.new(b"k" * 32, f"{header}.{payload}".encode(), hashlib.sha256).digest()
    assert base64.urlsafe_b64decode(pad(signature)) == expected
