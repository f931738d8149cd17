"""Kerberos: SPNEGO from a ticket cache or a keytab, the run's delegation token, the check
that fails a job before Spark starts; end to end on an HDFS secured by MiniKdc
(``scripts/hdfs.sh start --kerberos``)."""

from __future__ import annotations

import io
import json
import logging
import os
import sys
import threading
import time

import pytest

from sparktf.ports import free_port
from sparktf.security import gss, hadoop_conf, kerberos, redact
from sparktf.security.spnego import NegotiateAuth
from sparktf.storage import delegation
from sparktf.storage import hdfs as storage_hdfs
from tests import helpers

pytestmark = pytest.mark.unit  # tests of another tier carry their own mark

ROOT = helpers.REPO
KRB_ENV = (
    "SPARKTF_HDFS_PRINCIPAL",
    "SPARKTF_HDFS_KEYTAB",
    "SPARKTF_HDFS_DELEGATION_TOKEN",
    "KRB5CCNAME",
    "KRB5_CONFIG",
    "HADOOP_CONF_DIR",
    "SPARKTF_HDFS_USER",
    "HADOOP_USER_NAME",
)


def _hadoop_conf(path, kerberized: bool):
    path.mkdir(parents=True, exist_ok=True)
    auth = "kerberos" if kerberized else "simple"
    (path / "core-site.xml").write_text(
        "<configuration><property><name>hadoop.security.authentication</name>"
        f"<value>{auth}</value></property></configuration>"
    )
    (path / "hdfs-site.xml").write_text("<configuration></configuration>")
    return path


@pytest.fixture
def krb_env(monkeypatch, tmp_path):
    """No Kerberos settings of the machine's: an empty ticket cache, a krb5.conf of realm
    EXAMPLE.TEST, the HDFS user alice, and a Kerberized Hadoop configuration."""
    for name in KRB_ENV:
        monkeypatch.delenv(name, raising=False)
    krb5 = tmp_path / "krb5.conf"
    krb5.write_text("[libdefaults]\n default_realm = EXAMPLE.TEST\n")
    monkeypatch.setenv("KRB5_CONFIG", str(krb5))
    monkeypatch.setenv("KRB5CCNAME", f"FILE:{tmp_path / 'no-such-ccache'}")
    monkeypatch.setenv("SPARKTF_HDFS_USER", "alice")
    monkeypatch.setenv("HADOOP_CONF_DIR", str(_hadoop_conf(tmp_path / "conf", True)))
    return tmp_path


# ----------------------------------------------------------------------------- unit


def test_kerberos_is_on_from_core_site_or_the_principal(krb_env, monkeypatch):
    assert kerberos.enabled()
    monkeypatch.setenv("HADOOP_CONF_DIR", str(_hadoop_conf(krb_env / "simple", False)))
    assert not kerberos.enabled()
    assert hadoop_conf.site_properties("core-site.xml")["hadoop.security.authentication"]
    monkeypatch.setenv("SPARKTF_HDFS_PRINCIPAL", "bob@EXAMPLE.TEST")
    assert kerberos.enabled()


def test_login_order_env_keytab_then_spark_then_ticket_cache(krb_env, monkeypatch):
    spark = {"spark.kerberos.principal": "s@R", "spark.kerberos.keytab": "/s.keytab"}
    who = kerberos.login(spark)
    assert (who.principal, who.keytab) == ("s@R", "/s.keytab")
    krb5 = f"-Djava.security.krb5.conf={os.environ['KRB5_CONFIG']}"
    java = {"spark.driver.extraJavaOptions": "-Da=1", "spark.executor.extraJavaOptions": krb5}
    assert kerberos.spark_settings(java) == {"spark.driver.extraJavaOptions": f"-Da=1 {krb5}"}
    monkeypatch.delenv("KRB5_CONFIG")
    assert kerberos.spark_settings({}) == {}  # the ticket cache: Spark reads it itself
    monkeypatch.setenv("SPARKTF_HDFS_PRINCIPAL", "e@R")
    monkeypatch.setenv("SPARKTF_HDFS_KEYTAB", "/e.keytab")
    who = kerberos.login(spark)
    assert (who.principal, who.keytab, who.source) == (
        "e@R",
        "/e.keytab",
        "SPARKTF_HDFS_PRINCIPAL/SPARKTF_HDFS_KEYTAB",
    )
    assert kerberos.spark_settings({}) == {
        "spark.kerberos.principal": "e@R",
        "spark.kerberos.keytab": "/e.keytab",
    }
    assert kerberos.spark_settings(spark) == {}  # the user's own settings win
    monkeypatch.delenv("SPARKTF_HDFS_KEYTAB")
    who = kerberos.login(spark)
    assert (who.principal, who.keytab) == ("e@R", None)  # a principal alone: its ticket


def test_no_ticket_and_no_keytab_names_the_principal_and_kinit(krb_env):
    assert gss.default_realm() == "EXAMPLE.TEST"
    with pytest.raises(kerberos.NoCredentialsError) as err:
        kerberos.preflight()
    message = str(err.value)
    assert "alice@EXAMPLE.TEST" in message
    assert "kinit alice@EXAMPLE.TEST" in message
    assert "SPARKTF_HDFS_PRINCIPAL" in message and "SPARKTF_HDFS_KEYTAB" in message
    assert isinstance(err.value, PermissionError)
    from sparktf.errors import SparktfError

    assert isinstance(err.value, SparktfError)


def test_a_missing_keytab_names_the_principal(krb_env, monkeypatch):
    monkeypatch.setenv("SPARKTF_HDFS_PRINCIPAL", "svc/host@EXAMPLE.TEST")
    monkeypatch.setenv("SPARKTF_HDFS_KEYTAB", str(krb_env / "missing.keytab"))
    with pytest.raises(kerberos.NoCredentialsError, match="kinit svc/host@EXAMPLE.TEST"):
        kerberos.credential()


def test_preflight_is_quiet_without_kerberos_or_with_a_token(krb_env, monkeypatch):
    monkeypatch.setenv("SPARKTF_HDFS_DELEGATION_TOKEN", "abc")
    assert kerberos.preflight() is None
    monkeypatch.delenv("SPARKTF_HDFS_DELEGATION_TOKEN")
    monkeypatch.setenv("HADOOP_CONF_DIR", str(_hadoop_conf(krb_env / "simple", False)))
    assert kerberos.preflight() is None


def test_the_client_follows_the_credentials(krb_env, monkeypatch):
    import hdfs

    monkeypatch.setenv("SPARKTF_HDFS_DELEGATION_TOKEN", "tok-123")
    client = storage_hdfs.webhdfs_client("http://nn:9870", "alice")
    assert isinstance(client, hdfs.TokenClient)
    assert client._session.params["delegation"] == "tok-123"
    monkeypatch.delenv("SPARKTF_HDFS_DELEGATION_TOKEN")
    client = storage_hdfs.webhdfs_client("http://nn:9870", "alice")
    assert isinstance(client._session.auth, NegotiateAuth)
    assert "user.name" not in (client._session.params or {})
    monkeypatch.setenv("HADOOP_CONF_DIR", str(_hadoop_conf(krb_env / "simple", False)))
    client = storage_hdfs.webhdfs_client("http://nn:9870", "alice")
    assert isinstance(client, hdfs.InsecureClient)


def test_negotiate_header_only_where_needed(monkeypatch):
    import types

    import requests

    auth = NegotiateAuth(lambda: None)
    context = types.SimpleNamespace(token=b"\0\0\0", host="nn", close=lambda: None)
    monkeypatch.setattr(NegotiateAuth, "context", lambda self, url: context)
    plain = requests.Request("GET", "http://nn:9870/webhdfs/v1/a?op=GETFILESTATUS").prepare()
    assert auth(plain).headers["Authorization"] == "Negotiate AAAA"
    redirect = requests.Request("GET", "http://dn:9864/webhdfs/v1/a?op=OPEN&delegation=x")
    assert "Authorization" not in auth(redirect.prepare()).headers
    cookie = requests.Request(
        "GET", "http://nn:9870/webhdfs/v1/a", headers={"Cookie": "hadoop.auth=u=alice"}
    )
    assert "Authorization" not in auth(cookie.prepare()).headers


class _FakeGss:
    """libgssapi_krb5 as SpnegoContext calls it: each gss_init_sec_context answers the next of
    ``steps`` (status, output token, returned flags)."""

    def __init__(self, steps):
        self.steps = list(steps)
        self._kept = []  # output buffers, alive while the test runs

    def gss_import_name(self, minor, buf, oid, name):
        name.value = 1
        return 0

    def gss_release_name(self, minor, name):
        return 0

    def gss_release_buffer(self, minor, buf):
        return 0

    def gss_delete_sec_context(self, minor, context, out):
        return 0

    def gss_init_sec_context(self, minor, cred, context, target, mech, wanted, time_req,
                             bindings, given, actual_mech, out, ret_flags, time_rec):  # fmt: skip
        import ctypes

        major, token, flags = self.steps.pop(0)
        context.value = 0xC0FFEE
        raw = ctypes.create_string_buffer(token, len(token))
        self._kept.append(raw)
        out._obj.length, out._obj.value = len(token), ctypes.cast(raw, ctypes.c_void_p).value
        if ret_flags is not None:
            ret_flags._obj.value = flags
        return major


def test_a_spnego_context_completed_without_the_mutual_flag_is_refused(monkeypatch):
    """The service's reply completes the context only if GSS-API says, in the flags it
    returns, that the service authenticated itself (GSS_C_MUTUAL_FLAG); a context the library
    completes without it (a mechanism or a reply that skipped the service's proof) is refused
    instead of trusted."""
    mutual, sequence, continue_needed = 2, 8, 1
    for flags, trusted in ((mutual | sequence, True), (sequence, False)):
        fake = _FakeGss([(continue_needed, b"first", sequence), (0, b"", flags)])
        monkeypatch.setattr(gss, "_lib", lambda fake=fake: fake)
        with gss.SpnegoContext("nn.example.test") as context:
            assert context.token == b"first" and not context.complete
            if trusted:
                context.verify(b"reply")
                assert context.complete
            else:
                with pytest.raises(gss.GssError, match="without mutual authentication"):
                    context.verify(b"reply")
                assert not context.complete
    fake = _FakeGss([(0, b"at once", sequence)])  # complete at the first step: no proof
    monkeypatch.setattr(gss, "_lib", lambda: fake)
    with pytest.raises(gss.GssError, match="HTTP@nn.example.test did not prove itself"):
        gss.SpnegoContext("nn.example.test")


def test_no_delegation_token_in_any_log_record():
    redact.install()
    redact.add_secret("Zm9vYmFyc2VjcmV0")
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(name)s %(message)s"))
    logger = logging.getLogger("urllib3.connectionpool")
    logger.addHandler(handler)
    old = logger.level
    logger.setLevel(logging.DEBUG)
    try:
        logger.debug(
            '%s://%s:%s "%s %s %s" %s',
            "http",
            "dn",
            9864,
            "GET",
            "/webhdfs/v1/f?op=OPEN&delegation=SECRETTOKEN&offset=0",
            "HTTP/1.1",
            200,
        )
        try:
            raise ConnectionError("Max retries exceeded with url: /a?token=OTHERSECRET&op=X")
        except ConnectionError:
            logger.exception("failed")
        logging.getLogger("sparktf.x").warning("env SPARKTF=Zm9vYmFyc2VjcmV0")
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old)
    text = stream.getvalue()
    assert "SECRETTOKEN" not in text and "OTHERSECRET" not in text
    assert "delegation=<redacted>&offset=0" in text and "token=<redacted>" in text
    assert redact.redact("x Zm9vYmFyc2VjcmV0 y") == "x <redacted> y"


def test_renewer_renews_before_expiry_and_retries(monkeypatch):
    monkeypatch.setattr(delegation, "MIN_WAIT_S", 0.01)
    monkeypatch.setattr(delegation, "RETRY_S", 0.05)
    renewer = delegation.TokenRenewer(lambda: 0.0, expires=1000.0)
    assert renewer.next_wait(now=600.0) == pytest.approx(300.0)
    assert renewer.next_wait(now=2000.0) == 0.01
    calls = []

    def renew():
        calls.append(time.time())
        if len(calls) == 2:
            raise OSError("NameNode busy")
        return time.time() + 0.2

    renewer = delegation.TokenRenewer(renew, expires=time.time() + 0.2).start()
    time.sleep(1.0)
    renewer.stop()
    assert len(calls) >= 3 and renewer.renewals >= 2
    count = len(calls)
    time.sleep(0.3)
    assert len(calls) == count  # stopped


def test_token_errors_never_carry_the_token(monkeypatch):
    class Answer:
        status_code, reason, content = 403, "Forbidden", b"x"

        def json(self):
            return {"RemoteException": {"exception": "InvalidToken", "message": "token=S3CR3T"}}

    class Session:
        auth = None

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def request(self, *args, **kwargs):
            return Answer()

    monkeypatch.setattr(delegation, "_session", Session)
    with pytest.raises(delegation.DelegationTokenError) as err:
        delegation.renew_delegation_token("http://nn:9870", "S3CR3T")
    assert "S3CR3T" not in str(err.value) and "RENEWDELEGATIONTOKEN" in str(err.value)


def test_no_token_without_kerberos(krb_env, monkeypatch):
    monkeypatch.setenv("HADOOP_CONF_DIR", str(_hadoop_conf(krb_env / "simple", False)))
    with delegation.job_credentials() as token:
        assert token is None
    assert "SPARKTF_HDFS_DELEGATION_TOKEN" not in os.environ


def test_the_token_reaches_executors_without_a_command_line_on_this_machine(krb_env, monkeypatch):
    monkeypatch.setenv("SPARKTF_HDFS_DELEGATION_TOKEN", "tok-1")
    monkeypatch.setenv("SPARKTF_HDFS_TOKEN_FILE", "/private/tokens")
    monkeypatch.delenv("KRB5_CONFIG")
    local = kerberos.spark_settings({"spark.master": "local-cluster[2,1,1024]"})
    assert local == {"spark.executorEnv.HADOOP_TOKEN_FILE_LOCATION": "/private/tokens"}
    remote = kerberos.spark_settings({"spark.master": "spark://cluster:7077"})
    assert remote == {"spark.executorEnv.SPARKTF_HDFS_DELEGATION_TOKEN": "tok-1"}
    monkeypatch.setenv("SPARKTF_HDFS_RPC_TOKENS", "rpc-1,rpc-2")  # their JVMs: $HADOOP_TOKEN
    remote = kerberos.spark_settings({"spark.master": "spark://cluster:7077"})
    assert remote["spark.executorEnv.HADOOP_TOKEN"] == "rpc-1,rpc-2"


def test_yarns_application_master_reads_the_kerberos_configuration_too(krb_env):
    """Java does not read KRB5_CONFIG: every JVM of the application gets it as a system
    property, on YARN the application master too (client mode: it starts with the session,
    and without it fails at once with "Cannot locate default realm")."""
    flag = f"-Djava.security.krb5.conf={krb_env / 'krb5.conf'}"
    on_yarn = kerberos.spark_settings({"spark.master": "yarn"})
    for key in ("driver", "executor", "yarn.am"):
        assert flag in on_yarn[f"spark.{key}.extraJavaOptions"], on_yarn
    standalone = kerberos.spark_settings({"spark.master": "spark://m:7077"})
    assert "spark.yarn.am.extraJavaOptions" not in standalone


def test_the_rpc_token_is_the_webhdfs_token_for_each_name_of_the_namenode():
    """What Hadoop's ``Token.decodeFromUrlString`` reads from ``$HADOOP_TOKEN``: the WebHDFS
    token's identifier and password, kind HDFS_DELEGATION_TOKEN, one copy per service (the
    address as written and as the IP address Hadoop looks tokens up by)."""
    import base64

    def field(value: bytes) -> bytes:
        return bytes([len(value)]) + value

    webhdfs = field(b"ident") + field(b"pass") + field(b"WEBHDFS delegation") + field(b"nn:1")
    token = base64.urlsafe_b64encode(webhdfs).rstrip(b"=").decode()
    assert delegation.rpc_services("127.0.0.1:8020") == ["127.0.0.1:8020"]
    assert delegation.rpc_services("localhost:8020") == ["localhost:8020", "127.0.0.1:8020"]
    services = ["localhost:8020", "127.0.0.1:8020"]
    decoded = [
        base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))
        for part in delegation.rpc_tokens(token, services).split(",")
    ]
    assert decoded == [
        field(b"ident") + field(b"pass") + field(b"HDFS_DELEGATION_TOKEN") + field(s.encode())
        for s in services
    ]


def _token_and_services() -> tuple[str, list[str]]:
    """A WebHDFS delegation token's URL string (identifier, password, kind, service) and the
    NameNode RPC services it is re-encoded for."""
    import base64

    def field(value: bytes) -> bytes:
        return bytes([len(value)]) + value

    raw = field(b"identifier-of-the-token") + field(b"password-of-the-token-20")
    raw += field(b"WEBHDFS delegation") + field(b"nn.example.test:9870")
    token = base64.urlsafe_b64encode(raw).rstrip(b"=").decode()
    return token, ["nn.example.test:8020", "10.0.0.9:8020"]


_PLAIN_DRIVER = """
import json, sys
from sparktf.spark import session

class Started(Exception):
    pass

def new_jvm(builder, private):  # where PySpark would start spark-submit
    print(json.dumps({"options": dict(builder._options), "private": dict(private)}))
    raise Started

session.private_for_new_jvm = new_jvm
try:
    session.get_session("plain-python", profile="local", overrides=json.loads(sys.argv[1]))
except Started:
    sys.exit(0)
sys.exit("no spark-submit would have started")
"""


def test_a_plain_python_driver_puts_no_form_of_a_secret_on_spark_submits_command_line(
    krb_env, monkeypatch
):
    """From plain Python (no spark-submit), with Kerberos on and executors on other hosts,
    the settings PySpark puts on spark-submit's command line (the builder's options) hold no
    form of the run's token (its URL string, its RPC encoding as ``HADOOP_TOKEN``, either
    one's bytes in hex or base64) nor any other secret: every setting that holds one, by its
    name (an S3 secret key) or by its value (the token under an innocent name), goes to the
    private settings file instead."""
    token, services = _token_and_services()
    rpc = delegation.rpc_tokens(token, services)
    monkeypatch.setenv("SPARKTF_HDFS_DELEGATION_TOKEN", token)
    monkeypatch.setenv("SPARKTF_HDFS_RPC_TOKENS", rpc)
    monkeypatch.delenv("PYSPARK_GATEWAY_PORT", raising=False)
    monkeypatch.delenv("SPARK_REMOTE", raising=False)
    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)

    overrides = {
        "spark.master": "k8s://https://10.0.0.1:6443",  # executors elsewhere, no master secret
        "spark.hadoop.fs.s3a.secret.key": "an-s3-secret-key-value",
        "spark.executorEnv.JOB_INPUT": rpc.split(",")[1],  # a registered secret's value
    }
    # A plain Python process of its own: no Spark session, no JVM yet (a session of the
    # suite's, or a Kerberos login, in this pytest process would change what it does).
    done = helpers.run_command(
        [sys.executable, "-c", _PLAIN_DRIVER, json.dumps(overrides)], cwd=ROOT
    )
    assert done.returncode == 0, done.stderr[-4000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    command_line = "\n".join(f"--conf {k}={v}" for k, v in seen["options"].items())
    forms = set().union(*(redact.secret_forms(f) for f in delegation.token_forms(token, services)))
    assert not [form for form in forms if form in command_line], command_line
    assert "an-s3-secret-key-value" not in command_line
    assert seen["private"]["spark.executorEnv.HADOOP_TOKEN"] == rpc
    assert seen["private"]["spark.executorEnv.SPARKTF_HDFS_DELEGATION_TOKEN"] == token
    assert seen["private"]["spark.hadoop.fs.s3a.secret.key"] == "an-s3-secret-key-value"
    assert seen["private"]["spark.executorEnv.JOB_INPUT"] == rpc.split(",")[1]
    assert seen["options"]["spark.master"] == overrides["spark.master"]  # the rest stays


def test_every_form_of_the_token_is_redacted_in_logs(caplog):
    """``HADOOP_TOKEN=`` and the other token variables are redacted by name; the token's
    forms that :func:`delegation.token_forms` lists, by value, wherever they stand."""
    import base64

    token, services = _token_and_services()
    rpc = delegation.rpc_tokens(token, services)
    assert rpc not in redact.redact(f"export HADOOP_TOKEN={rpc}; SPARKTF_HDFS_RPC_TOKENS={rpc}")
    redact.add_secret(*delegation.token_forms(token, services))
    password = b"password-of-the-token-20"
    with caplog.at_level(logging.INFO):
        logging.getLogger("sparktf.test").info(
            "env %s, one service %s, password %s, hex %s, the URL string %s",
            {"HADOOP_TOKEN": rpc},
            rpc.split(",")[0],
            base64.b64encode(password).decode(),
            password.hex(),
            token,
        )
    text = caplog.text
    assert "env" in text and text.count("<redacted>") == 5, text
    assert password.decode() not in text and token not in text


# ----------------------------------------------------------------------------- end to end


class KrbHdfs:
    """A Kerberized HDFS of this module: its URIs, its Hadoop configuration directory and the
    environment of a client holding the user's keytab (no ticket cache of the machine's)."""

    def __init__(self, values: dict[str, str], conf_dir, base):
        self.printed = values
        self.uri, self.webhdfs_url = values["HDFS_URI"], values["WEBHDFS_URL"]
        self.principal = values["SPARKTF_HDFS_PRINCIPAL"]
        self.keytab = values["SPARKTF_HDFS_KEYTAB"]
        self.krb5_config = values["KRB5_CONFIG"]
        self.env = {
            "HADOOP_CONF_DIR": str(conf_dir),
            "SPARKTF_WEBHDFS_URL": self.webhdfs_url,
            "KRB5_CONFIG": self.krb5_config,
            "KRB5CCNAME": f"FILE:{base / 'no-ticket-cache'}",
            "SPARKTF_HDFS_PRINCIPAL": self.principal,
            "SPARKTF_HDFS_KEYTAB": self.keytab,
        }

    def path(self, *parts: str) -> str:
        return self.uri + "/" + "/".join(p.strip("/") for p in parts)

    def as_user(self, command, timeout: float = 540):
        """``command``, from the checkout, in this process's environment with the machine's
        Kerberos and Hadoop settings taken out and the lines ``hdfs.sh start`` printed
        exported, nothing else: what a user who followed the docs runs in (the venv's
        ``bin`` on ``PATH``, as ``source .venv/bin/activate`` puts it)."""
        machine = ("SPARKTF_HDFS", "SPARKTF_WEBHDFS", "SPARKTF_TEST_HDFS", "PYSPARK_")
        env = {k: v for k, v in os.environ.items() if k not in KRB_ENV}
        env = {k: v for k, v in env.items() if not k.startswith(machine)}
        env.update(self.printed)
        env["PATH"] = f"{os.path.dirname(sys.executable)}:{env['PATH']}"
        return helpers.run_command(command, env=env, cwd=ROOT, timeout=timeout)

    def job(self, script: str, *args: str, keytab: bool = True, timeout: float = 420):
        """``jobs/SCRIPT`` as its own application on this HDFS, with the keytab (or with no
        credentials at all)."""
        env = {**os.environ, **self.env, "PYSPARK_PYTHON": sys.executable}
        env["SPARKTF_LOG_LEVEL"] = "INFO"
        for name in ("SPARKTF_HDFS_DELEGATION_TOKEN", "SPARKTF_HDFS_USER", "HADOOP_USER_NAME"):
            env.pop(name, None)
        if not keytab:
            del env["SPARKTF_HDFS_PRINCIPAL"], env["SPARKTF_HDFS_KEYTAB"]
        command = [sys.executable, str(ROOT / "jobs" / script), *args]
        return helpers.run_command(command, env=env, cwd=ROOT, timeout=timeout)


@pytest.fixture(scope="module")
def krb_hdfs(tmp_path_factory):
    base = tmp_path_factory.mktemp("krb")
    args = ["--port", str(free_port()), "--http-port", str(free_port())]
    args += ["--dir", str(base / "hdfs"), "--conf-dir", str(base / "hadoop-conf")]
    script = ROOT / "scripts" / "hdfs.sh"
    out = helpers.run_command([script, "start", *args, "--kerberos"], timeout=300)
    try:
        assert out.returncode == 0, out.stdout + out.stderr
        values = dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)
        yield KrbHdfs(values, base / "hadoop-conf", base)
    finally:
        helpers.run_command([script, "stop", *args], timeout=120)


@pytest.fixture
def as_client(krb_hdfs, monkeypatch):
    """This test process as a client of ``krb_hdfs`` with the user's keytab."""
    for name in KRB_ENV:
        monkeypatch.delenv(name, raising=False)
    for name, value in krb_hdfs.env.items():
        monkeypatch.setenv(name, value)
    return krb_hdfs


def _no_token_in(text: str) -> None:
    import re

    assert not re.search(r"(?i)delegation=(?!<redacted>)[A-Za-z0-9_-]{8}", text), text[-2000:]


@pytest.mark.e2e
def test_spnego_and_the_token_lifecycle(as_client, monkeypatch):
    """Storage through SPNEGO with the keytab; then through a delegation token alone, which
    stops working once cancelled."""
    from sparktf import storage

    base = as_client.path("tests", "spnego")
    storage.write_text(f"{base}/a.txt", "kerberized\n")
    assert storage.read_text(f"{base}/a.txt") == "kerberized\n"
    url = as_client.webhdfs_url
    with delegation.run_delegation(url) as token:
        assert token and os.environ["SPARKTF_HDFS_DELEGATION_TOKEN"] == token
        token_file = os.environ["SPARKTF_HDFS_TOKEN_FILE"]
        assert os.stat(token_file).st_mode & 0o077 == 0
        assert open(token_file, "rb").read(5) == b"HDTS\x00"
        assert delegation.renew_delegation_token(url, token) > time.time()
        with monkeypatch.context() as only_the_token:
            only_the_token.delenv("SPARKTF_HDFS_PRINCIPAL")
            only_the_token.delenv("SPARKTF_HDFS_KEYTAB")
            assert storage.read_text(f"{base}/a.txt") == "kerberized\n"
            storage.write_text(f"{base}/b.txt", "with a token\n")
    assert "SPARKTF_HDFS_DELEGATION_TOKEN" not in os.environ
    assert not os.path.exists(token_file)
    monkeypatch.setenv("SPARKTF_HDFS_DELEGATION_TOKEN", token)
    with pytest.raises(storage.StoragePermissionError) as err:
        storage.read_text(f"{base}/b.txt")
    assert token not in str(err.value)
    monkeypatch.delenv("SPARKTF_HDFS_DELEGATION_TOKEN")
    monkeypatch.delenv("SPARKTF_HDFS_KEYTAB")  # no ticket either: no new SPNEGO login
    with pytest.raises(kerberos.NoCredentialsError, match="kinit"):
        kerberos.credential()


@pytest.mark.e2e
def test_a_failure_after_the_token_is_obtained_cancels_it_and_stops_its_renewer(
    as_client, monkeypatch
):
    """Between obtaining the run's token and handing it out (writing its credentials file),
    a failure leaves no token live or renewed, and no token directory."""
    import threading

    from sparktf import scratch

    url = as_client.webhdfs_url
    obtained = []
    real_get = delegation.get_delegation_token

    def get(at):
        obtained.append(real_get(at))
        return obtained[-1]

    def no_room(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(delegation, "get_delegation_token", get)
    monkeypatch.setattr(delegation, "token_file", no_room)
    before = {d for base in scratch.scratch_bases() for d in os.listdir(base)}
    with pytest.raises(OSError, match="No space left"):
        with delegation.run_delegation(url):
            pass  # not reached
    assert len(obtained) == 1
    with pytest.raises(delegation.DelegationTokenError):  # cancelled
        delegation.renew_delegation_token(url, obtained[0])
    assert not [t for t in threading.enumerate() if t.name == "sparktf-token-renewer"]
    after = {d for base in scratch.scratch_bases() for d in os.listdir(base)}
    assert not [d for d in after - before if d.startswith("sparktf-token-")]
    assert "SPARKTF_HDFS_DELEGATION_TOKEN" not in os.environ


@pytest.mark.e2e
def test_a_server_that_cannot_prove_it_is_the_namenode_is_not_believed(as_client):
    """SPNEGO asks for mutual authentication, and the answer must prove it: an impostor on
    the NameNode's host name that answers 200 without the service's reply token gets the
    client's ticket, but its answer raises instead of being used."""
    import http.server
    import threading
    from urllib.parse import urlparse

    import requests

    seen = []

    class Impostor(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            seen.append(self.headers.get("Authorization", ""))
            body = b'{"FileStatus": {"type": "FILE", "length": 1}}'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    host = urlparse(as_client.webhdfs_url).hostname
    server = http.server.HTTPServer(("127.0.0.1", 0), Impostor)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        session = requests.Session()
        session.auth = NegotiateAuth(kerberos.credential)
        url = f"http://{host}:{server.server_port}/webhdfs/v1/x?op=GETFILESTATUS"
        with pytest.raises(kerberos.KerberosError, match="answered without authenticating itself"):
            session.get(url, timeout=10)
        assert seen and seen[0].startswith("Negotiate "), seen  # it was asked, it could not
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@pytest.mark.e2e
def test_a_job_without_ticket_or_keytab_fails_before_spark(krb_hdfs, tmp_path):
    started = time.monotonic()
    out = krb_hdfs.job(
        "predict.py",
        "--export",
        krb_hdfs.path("nowhere/export"),
        "--input",
        krb_hdfs.path("nowhere/in"),
        "--output",
        krb_hdfs.path("nowhere/out"),
        keytab=False,
    )
    assert out.returncode == 1, out.stderr[-3000:]
    user = krb_hdfs.principal.split("@")[0]
    assert f"kinit {user}@EXAMPLE.COM" in out.stderr, out.stderr[-3000:]
    assert "SPARKTF_HDFS_KEYTAB" in out.stderr
    assert "starting Spark" not in out.stderr and "SparkContext" not in out.stderr
    assert time.monotonic() - started < 60


@pytest.mark.e2e
def test_the_documented_commands_with_only_what_hdfs_sh_prints(krb_hdfs, tmp_path):
    """What a user does (docs/reliability.md "Running on a Kerberized cluster"): export the
    lines `hdfs.sh start --kerberos` printed, nothing else, then `scripts/submit.sh`
    converts; plain `spark-submit jobs/train_resnet.py --steps 5` trains (ps, the workers
    reading their files from the Kerberized HDFS, checkpoints and export there; its default
    master, local[*], becomes a local-cluster sized to the run); `scripts/submit.sh` predicts
    with the export, and `python jobs/evaluate.py`, a job started without spark-submit,
    evaluates it. The executors have no keytab, so what they do on HDFS goes by the run's
    token; each job cancels its token and none logs it, and no process's command line holds
    a token or a secret at any time. (One training: all-reduce from files trains on HDFS in
    test_train and the README's chain; the token is no business of the strategy's.)"""
    from sparktf.datasets.synthetic import write_cifar10

    write_cifar10(tmp_path / "raw", n_train=48, n_test=16, train_files=2)
    data = krb_hdfs.path("e2e", "cifar")
    profile = tmp_path / "no-keytab-on-executors.conf"
    local = (ROOT / "conf" / "spark" / "local.conf").read_text()
    profile.write_text(local + "\nspark.executorEnv.SPARKTF_HDFS_KEYTAB /nonexistent.keytab\n")
    small = ["--model-config", '{"num_residual_units": [1, 1, 1]}', "--batch-size", "8"]
    submit = [ROOT / "scripts" / "submit.sh"]
    logs = []

    def run(*command):
        out = krb_hdfs.as_user(command)
        logs.append(out.stdout + out.stderr)
        assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
        assert "Can't get Kerberos realm" not in logs[-1]
        return out

    watch = _CommandLines()  # no process's command line holds a token or a secret
    watch.start()
    run(*submit, "jobs/convert_cifar10.py", "--input", tmp_path / "raw", "--output", data)
    result = tmp_path / "ps.json"
    no_keytab = "spark.executorEnv.SPARKTF_HDFS_KEYTAB=/nonexistent.keytab"
    out = run(
        "spark-submit", "--conf", no_keytab, "jobs/train_resnet.py", "--data", data,
        "--steps", "5", *small, "--strategy", "ps", "--num-ps", "1", "--input-mode", "files",
        "--model-dir", krb_hdfs.path("e2e", "model-ps"), "--result-json", result,
    )  # fmt: skip
    assert "master local[*] has no executors: using local-cluster" in out.stdout + out.stderr
    summary = json.loads(result.read_text())
    assert (summary["final_step"], summary["strategy"]) == (5, "ps")
    assert summary["export_dir"].startswith(krb_hdfs.uri), summary
    assert summary["last_checkpoint"].startswith(krb_hdfs.uri), summary
    assert "delegation token of the run cancelled" in out.stdout + out.stderr
    predictions = krb_hdfs.path("e2e", "predictions")
    run(
        *submit, "--profile", profile, "jobs/predict.py", "--export", summary["export_dir"],
        "--input", f"{data}/test/parquet", "--output", predictions,
    )  # fmt: skip
    # and a job started without spark-submit, its executors on the run's token alone
    metrics = krb_hdfs.path("e2e", "eval.json")
    run(
        sys.executable, "jobs/evaluate.py", "--profile", profile,
        "--export", summary["export_dir"], "--data", data, "--split", "test",
        "--output", metrics,
    )  # fmt: skip
    watch.stop()
    assert watch.seen > 100 and watch.found == [], watch.found[:3]
    from sparktf import storage

    with pytest.MonkeyPatch.context() as env:
        for name, value in krb_hdfs.env.items():
            env.setenv(name, value)
        assert storage.listdir(predictions)
        assert json.loads(storage.read_bytes(metrics))["examples"] == 16
    for text in logs:
        _no_token_in(text)


# A plain-Python driver (no spark-submit) on YARN with Kerberos on: it writes the run's token
# for the test as soon as it has it, then runs one task per executor that reads the two
# variables the token reaches the executors in (their digests only).
_DRIVER_ON_YARN = """
import hashlib, json, os, sys

import pyspark

from sparktf.security import kerberos
from sparktf.spark import get_session, stop_session
from sparktf.storage import delegation

secrets_file, result_file, staging = sys.argv[1:4]
jars = os.path.join(os.path.dirname(pyspark.__file__), "jars")
overrides = {
    "spark.executor.instances": "2", "spark.executor.cores": "1", "spark.task.cpus": "1",
    "spark.executor.memory": "1g", "spark.executor.memoryOverhead": "512m",
    "spark.yarn.am.memory": "512m", "spark.yarn.jars": f"local:{jars}/*",
    "spark.yarn.stagingDir": f"file://{staging}", "spark.ui.enabled": "false",
    "spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1",
    # this YARN (MiniYARNCluster) is not Kerberized: its clients may talk to it in simple auth
    "spark.hadoop.ipc.client.fallback-to-simple-auth-allowed": "true",
}


def private_json(path, value):
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
        json.dump(value, f)


def seen(_):
    import hashlib, os

    return [hashlib.sha256(os.environ.get(name, "").encode()).hexdigest()
            for name in ("HADOOP_TOKEN", "SPARKTF_HDFS_DELEGATION_TOKEN")]


with delegation.job_credentials() as token:
    rpc = os.environ[kerberos.RPC_TOKENS_ENV]
    private_json(secrets_file, {"token": token, "rpc": rpc})
    spark = get_session("kerberos-on-yarn", profile="yarn", overrides=overrides)
    try:
        executors = spark.sparkContext.parallelize(range(2), 2).map(seen).collect()
        wanted = [hashlib.sha256(value.encode()).hexdigest() for value in (rpc, token)]
        private_json(result_file, {"executors": executors, "wanted": wanted,
                                   "master": spark.sparkContext.master})
    finally:
        stop_session(spark)
"""


@pytest.fixture(scope="module")
def krb_yarn(krb_hdfs, tmp_path_factory):
    """A YARN (``scripts/yarn.sh``: MiniYARNCluster, not Kerberized) beside the Kerberized
    HDFS, its yarn-site.xml in a copy of that HDFS's client configuration; yields its
    directory (``hadoop-conf``: the configuration, ``yarn``: the cluster)."""
    import shutil

    base = tmp_path_factory.mktemp("krb-yarn")
    shutil.copytree(krb_hdfs.env["HADOOP_CONF_DIR"], base / "hadoop-conf")
    args = ["--dir", str(base / "yarn"), "--conf-dir", str(base / "hadoop-conf")]
    yarn_sh = ROOT / "scripts" / "yarn.sh"
    try:
        out = helpers.run_command([yarn_sh, "start", *args], timeout=240)
        assert out.returncode == 0, out.stdout + out.stderr
        yield base
    finally:
        helpers.run_command([yarn_sh, "stop", *args], timeout=180)


@pytest.mark.e2e
def test_a_plain_python_driver_on_yarn_shows_no_form_of_the_token_on_any_command_line(
    krb_hdfs, krb_yarn, tmp_path
):
    """The path where the token's RPC form reached a command line: a driver started with
    plain ``python`` (PySpark starts spark-submit with every builder setting as ``--conf``),
    Kerberos on, the master YARN (executors elsewhere, so the token goes to them as
    ``SPARKTF_HDFS_DELEGATION_TOKEN`` and, for their JVMs, ``HADOOP_TOKEN``). While it runs,
    every process's command line (``/proc/*/cmdline``: spark-submit's scripts and JVM, the
    ResourceManager, the application master, the executors and their Python workers) is
    read every 0.2 s; none holds any form of the run's token (its URL string, its RPC
    encoding for each service and both joined, their bytes and password in hex and base64)
    nor a token variable's name with a value. The executors did get both variables, so the
    settings took the private file's way; and neither the driver's output nor the
    containers' logs hold the token."""
    from urllib.parse import urlparse

    script = tmp_path / "driver.py"
    script.write_text(_DRIVER_ON_YARN)
    secrets_file, result_file = tmp_path / "secrets.json", tmp_path / "result.json"
    (tmp_path / "staging").mkdir()
    env = {**os.environ, **krb_hdfs.env, "PYSPARK_PYTHON": sys.executable}
    env.update(HADOOP_CONF_DIR=str(krb_yarn / "hadoop-conf"), SPARKTF_LOG_LEVEL="INFO")
    for name in ("SPARKTF_HDFS_DELEGATION_TOKEN", "SPARKTF_HDFS_USER", "HADOOP_USER_NAME"):
        env.pop(name, None)
    for name in ("PYSPARK_GATEWAY_PORT", "PYSPARK_SUBMIT_ARGS", "SPARK_REMOTE", "MASTER"):
        env.pop(name, None)
    command = [sys.executable, script, secrets_file, result_file, tmp_path / "staging"]
    watch = _CommandLines()
    watch.start()
    try:
        run = helpers.run_command(command, env=env, cwd=ROOT, timeout=420)
    finally:
        watch.stop()
    output = run.stdout + run.stderr
    given = json.loads(secrets_file.read_text())  # written before Spark started
    services = delegation.rpc_services(urlparse(krb_hdfs.uri).netloc)
    assert delegation.rpc_tokens(given["token"], services) == given["rpc"]
    forms = set().union(
        *(redact.secret_forms(f) for f in delegation.token_forms(given["token"], services))
    )
    leaked = sorted({form for line in watch.lines for form in forms if form in line})
    assert watch.found == [] and leaked == [], (watch.found[:3], leaked[:3])
    # what was scanned: spark-submit as PySpark started it, and the executors in YARN
    submits = [line for line in watch.lines if "org.apache.spark.deploy.SparkSubmit" in line]
    assert any("pyspark-shell" in line for line in submits), submits
    assert any("YarnCoarseGrainedExecutorBackend" in line for line in watch.lines)
    assert run.returncode == 0, output[-4000:]
    result = json.loads(result_file.read_text())
    assert result["master"] == "yarn"
    assert result["executors"] == [result["wanted"]] * 2  # both forms reached both executors
    logs = [output] + [
        path.read_text(errors="replace")
        for path in (krb_yarn / "yarn" / "cluster").rglob("container_*/std*")
        if path.is_file()
    ]
    assert len(logs) > 1
    assert not [form for text in logs for form in forms if form in text]
    _no_token_in(output)


class _CommandLines(threading.Thread):
    """Reads every process's command line (``/proc/*/cmdline``) every 0.2 s and keeps those
    that carry a delegation token or Spark's shared secret. (The path of the run's private
    token file, ``HADOOP_TOKEN_FILE_LOCATION``, may be there: it is not the token.)"""

    MARKS = (kerberos.TOKEN_ENV, "HADOOP_TOKEN=", "delegation=", "spark.authenticate.secret=")

    def __init__(self):
        super().__init__(daemon=True)
        self.found: list[str] = []
        self.seen = 0
        self.lines: set[str] = set()  # every command line seen, for secrets known only later
        self._stop_event = threading.Event()

    def run(self):
        while not self._stop_event.wait(0.2):
            for entry in os.listdir("/proc"):
                try:
                    with open(f"/proc/{entry}/cmdline", "rb") as f:
                        line = f.read().replace(b"\0", b" ").decode(errors="replace")
                except OSError:  # not a process, or gone
                    continue
                self.seen += 1
                self.lines.add(line)
                for mark in self.MARKS:
                    if mark in line:
                        at = line.index(mark)
                        self.found.append(line[max(0, at - 40) : at + 200])

    def stop(self):
        self._stop_event.set()
        self.join()
