"""Spark Connect from the client's side, without a server: the URL (``--remote``,
``SPARK_REMOTE``), which settings a Connect session takes, telling a Connect session apart,
and the jobs that need a classic session refusing at once (``sparktf.remote``,
``sparktf.spark``, ``sparktf.cli``, ``sparktf.jobs.convert``)."""

from __future__ import annotations

import sys
import types

import pytest

from sparktf import cli, remote, spark
from sparktf.errors import SparktfValueError
from sparktf.jobs import convert as convert_job
from sparktf.jobs import predict as predict_job
from sparktf.ports import free_port
from sparktf.security.redact import REDACTED, redact_url

pytestmark = pytest.mark.unit

TOKEN = "s3cret-token-value"


@pytest.fixture
def no_remote_env(monkeypatch):
    monkeypatch.delenv(remote.REMOTE_ENV, raising=False)
    monkeypatch.delenv("PYSPARK_GATEWAY_PORT", raising=False)  # not under spark-submit
    return monkeypatch


# ----------------------------------------------------------------------------- URLs


@pytest.mark.parametrize(
    "url",
    [
        "sc://localhost",
        "sc://localhost:15002",
        "sc://localhost:15002/",
        f"sc://localhost:15002/;token={TOKEN}",
        f"sc://spark.example.com:443/;use_ssl=true;token={TOKEN};user_id=me",
        "sc://[::1]:15002",
    ],
)
def test_connect_urls_are_accepted(url):
    assert remote.check_url(url) == url


@pytest.mark.parametrize(
    "url",
    [
        "localhost:15002",
        "http://localhost:15002",
        "spark://localhost:7077",
        "sc://",
        f"sc://localhost:15002;token={TOKEN}",  # parameters follow '/;'
        f"sc://localhost:15002/token={TOKEN}",
        f"sc://localhost:15002?token={TOKEN}",
        "sc://localhost:port",
        "",
    ],
)
def test_other_urls_are_refused_naming_the_form_without_the_token(url):
    with pytest.raises(SparktfValueError, match=r"sc://") as caught:
        remote.check_url(url)
    assert TOKEN not in str(caught.value)


def test_the_token_is_hidden_and_the_port_defaults_to_15002():
    url = f"sc://h:1/;user_id=me;token={TOKEN};use_ssl=true"
    assert redact_url(url) == f"sc://h:1/;user_id=me;token={REDACTED};use_ssl=true"
    assert redact_url(f"sc://h/;Token={TOKEN}") == f"sc://h/;Token={REDACTED}"
    assert remote.url_address("sc://spark.example.com") == ("spark.example.com", 15002)
    assert remote.url_address("sc://[::1]:15999/;token=x") == ("::1", 15999)


class _Builder:
    def __init__(self, host, port, secure):
        self.host, self._port, self.secure = host, port, secure


class _Client:
    def __init__(self, *args):
        self._builder = _Builder(*args)


class _ConnectSession:
    """What sparktf reads of a Connect session's channel (pyspark's ChannelBuilder)."""

    def __init__(self, *args):
        self.client = _Client(*args)


def test_a_connect_channel_in_clear_over_the_network_is_refused_unless_accepted_by_name(
    monkeypatch,
):
    """A run's functions and secrets cross a Connect channel: in clear to another host the
    run is refused, with a message naming how to protect it and the opt-in; TLS (or a token,
    which pyspark sends over TLS to any host but localhost) and loopback pass; with
    SPARKTF_CONNECT_ALLOW_CLEAR=1 it is only warned about."""
    monkeypatch.delenv(remote.ALLOW_CLEAR_ENV, raising=False)
    with pytest.raises(remote.InsecureChannelError) as refused:
        remote.channel_warning(_ConnectSession("10.1.2.3", 15002, False))
    message = str(refused.value)
    assert "10.1.2.3:15002 is not encrypted" in message and "refused" in message
    assert "use_ssl=true" in message and "SPARKTF_CONNECT_ALLOW_CLEAR=1" in message
    assert remote.channel_warning(_ConnectSession("10.1.2.3", 15002, True)) is None
    assert remote.channel_warning(_ConnectSession("localhost", 15002, False)) is None
    assert remote.channel_warning(_ConnectSession("127.0.0.1", 15002, False)) is None
    assert remote.is_loopback("::1") and not remote.is_loopback("10.1.2.3")
    monkeypatch.setenv(remote.ALLOW_CLEAR_ENV, "1")
    warning = remote.channel_warning(_ConnectSession("10.1.2.3", 15002, False))
    assert "10.1.2.3:15002 is not encrypted" in warning and remote.ALLOW_CLEAR_ENV in warning


def test_a_connect_session_in_clear_to_another_host_is_refused_before_anything_is_sent(
    monkeypatch,
):
    """``connect_session`` judges the URL before it connects: nothing (no socket) is opened
    to a host the channel would reach in clear."""
    monkeypatch.delenv(remote.ALLOW_CLEAR_ENV, raising=False)
    opened = []
    monkeypatch.setattr(remote.socket, "create_connection", lambda *a, **k: opened.append(a))
    for url in ("sc://10.1.2.3:15002", "sc://spark.example.com/;user_id=me;use_ssl=false"):
        with pytest.raises(remote.InsecureChannelError, match="SPARKTF_CONNECT_ALLOW_CLEAR=1"):
            remote.connect_session("app", url)
    assert opened == []
    assert remote.url_protected("sc://h:1/;use_ssl=true") and remote.url_protected(
        f"sc://h:1/;user_id=me;token={TOKEN}"
    )
    assert not remote.url_protected("sc://h:1") and not remote.url_protected("sc://h/;user_id=x")


def test_a_connect_clients_servers_never_listen_on_every_interface(monkeypatch):
    from sparktf.train.driver import bringup

    session = _ConnectSession("127.0.0.1", 15002, True)
    monkeypatch.delenv(bringup.DRIVER_HOST_ENV, raising=False)
    monkeypatch.delenv("SPARK_LOCAL_IP", raising=False)
    assert bringup.connect_driver_address(session).bind == "127.0.0.1"  # routes to the server
    monkeypatch.setenv(bringup.DRIVER_HOST_ENV, "0.0.0.0")
    with pytest.raises(SparktfValueError, match="every interface"):
        bringup.connect_driver_address(session)


def test_the_url_comes_from_the_flag_then_spark_remote_outside_spark_submit(no_remote_env):
    assert remote.remote_url(None, spark_submit=False) is None
    no_remote_env.setenv(remote.REMOTE_ENV, "sc://env:15002")
    assert remote.remote_url(None, spark_submit=False) == "sc://env:15002"
    assert remote.remote_url("sc://flag:1", spark_submit=False) == "sc://flag:1"
    assert remote.remote_url("", spark_submit=False) is None  # --remote '': classic
    assert remote.remote_url(None, spark_submit=True) is None  # spark-submit's session
    assert remote.remote_url("sc://flag:1", spark_submit=True) == "sc://flag:1"


# ----------------------------------------------------------------------------- settings


def test_only_runtime_settings_are_applied_the_others_are_named():
    modifiable = {"spark.sql.shuffle.partitions", "spark.sql.session.timeZone"}.__contains__
    overrides = {
        "spark.sql.shuffle.partitions": "3",
        "spark.executor.memory": "2g",
        "spark.master": "local-cluster[2,1,1024]",
        "spark.sql.session.timeZone": "UTC",
    }
    runtime, ignored = remote.split_runtime(overrides, modifiable)
    assert runtime == {"spark.sql.shuffle.partitions": "3", "spark.sql.session.timeZone": "UTC"}
    assert ignored == ["spark.executor.memory", "spark.master"]
    assert remote.split_runtime({}, modifiable) == ({}, [])


# ----------------------------------------------------------------------------- sessions


class SparkSession:  # the name of a Connect session's class, not the class
    pass


@pytest.mark.parametrize("thing", [None, object(), "sc://localhost:15002", SparkSession()])
def test_is_connect_is_false_for_what_is_not_a_connect_session(thing):
    assert spark.is_connect(thing) is False
    assert remote.is_connect(thing) is False


def test_is_connect_is_asked_once_per_session(monkeypatch):
    """The answer is kept with the session: a later check is a lookup, and agrees."""
    connect = types.ModuleType("pyspark.sql.connect.session")
    connect.SparkSession = type("SparkSession", (), {})
    monkeypatch.setitem(sys.modules, connect.__name__, connect)
    session, classic = connect.SparkSession(), SparkSession()
    assert remote.is_connect(session) is True and remote.is_connect(classic) is False
    monkeypatch.delitem(sys.modules, connect.__name__)  # the check itself would now say no
    assert remote.is_connect(session) is True and spark.is_connect(session) is True
    assert remote.is_connect(classic) is False


def test_a_connect_session_with_nothing_listening_fails_at_once(no_remote_env):
    """No retries for minutes: the address is tried once, and the error names it (the
    token hidden). In a process that runs a classic session (the suite's, when it runs),
    the refusal to mix the two comes first."""
    from pyspark import SparkContext

    url = f"sc://127.0.0.1:{free_port()}/;token={TOKEN}"
    classic = SparkContext._active_spark_context is not None
    error = remote.ClassicSessionError if classic else remote.ConnectUnreachableError
    with pytest.raises(error) as caught:
        spark.get_session("sparktf-test", remote=url)
    text = str(caught.value)
    assert TOKEN not in text and f"token={REDACTED}" in text
    assert ("process of its own" if classic else "no Spark Connect server answers") in text


def test_connect_session_refuses_a_bad_url_before_anything():
    with pytest.raises(SparktfValueError, match="expected a Spark Connect URL"):
        spark.get_session("sparktf-test", remote="localhost:15002")


# ----------------------------------------------------------------------------- jobs


def test_every_job_has_the_remote_flag(no_remote_env):
    p = predict_job.parser()
    flag = next(a for a in p._actions if "--remote" in a.option_strings)
    assert flag.default is None  # the token of $SPARK_REMOTE never shows in --help
    assert "sc://localhost:15002/;token=" in flag.help and "Spark Connect URL" in flag.help
    args = cli.parse(p, ["--remote", "sc://h:1"], own_logging=False)
    assert args.remote == "sc://h:1"


@pytest.mark.parametrize("how", ["flag", "env"])
def test_convert_refuses_spark_connect_naming_what_to_use(no_remote_env, tmp_path, how):
    url = f"sc://127.0.0.1:1/;token={TOKEN}"
    argv = ["--input", str(tmp_path / "raw"), "--output", str(tmp_path / "out")]
    if how == "flag":
        argv += ["--remote", url]
    else:
        no_remote_env.setenv(remote.REMOTE_ENV, url)
    with pytest.raises(cli.UsageError) as caught:
        convert_job.main("mnist", argv)
    text = str(caught.value)
    assert "need a classic Spark session" in text and "RDD" in text
    assert "without --remote and with SPARK_REMOTE unset" in text
    assert ("--remote" if how == "flag" else "SPARK_REMOTE") in text
    assert TOKEN not in text
    assert not (tmp_path / "out").exists()


def test_convert_on_a_classic_session_is_not_refused(no_remote_env):
    convert_job.refuse_remote(None)
    convert_job.refuse_remote("")
    no_remote_env.setenv(remote.REMOTE_ENV, "sc://127.0.0.1:1")
    convert_job.refuse_remote("")  # --remote '' forces a classic session
    no_remote_env.setenv("PYSPARK_GATEWAY_PORT", "1")  # spark-submit's own session
    convert_job.refuse_remote(None)
