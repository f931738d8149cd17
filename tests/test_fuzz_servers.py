"""The driver's two listening servers under random and truncated input (Hypothesis).

Each server is a real one on loopback, reused across the examples: the reservation server
(``AuthServer``: sealed frames, ``sparktf.train.wire.frames``) and the control server
(``ControlServer``: HTTP, ``sparktf.train.wire.control``). Every input goes on a connection
of its own (the inputs of one example together), which is half-closed and read until the
server closes it: the server answers or closes, never crashes (its thread lives and still
answers a real client afterwards), grants nothing to a peer without credentials, and never
holds more than its limits (connections, the bytes of incomplete messages, what it keeps of
each process). Before authentication the inputs are random bytes, frames and HTTP requests
built from random parts, real messages cut short or with a bit flipped, a replay; after it,
sealed frames of random messages and of bodies that are no message, and requests with a
real token and random keys, events and data. Then up to 60 peers hold part of a message at
once.

10,000 inputs per server, and 150 rounds of held connections (``EXAMPLES``), derandomized so
that CI runs the same ones, each test within a time bound. Integration tier: no Spark, but
some 20,000 connections.
"""

from __future__ import annotations

import json
import re
import secrets
import socket
import struct
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.configuration import set_hypothesis_home_dir

from sparktf.train.wire import reservation
from sparktf.train.wire.control import MAX_KEPT, ControlClient, ControlServer
from sparktf.train.wire.frames import ANSWER, MAX_FRAME_BYTES, NONCE_BYTES, REQUEST, Codec
from sparktf.train.wire.limits import ConnectionLimits

pytestmark = pytest.mark.integration

LOOPBACK = "127.0.0.1"
LIMITS = ConnectionLimits(
    max_connections=48, max_per_peer=48, message_deadline_s=2.0, max_buffered_bytes=256 << 10
)
BATCH = 4  # inputs to an example, on connections open together
# per server: 7,000 inputs before authentication and 3,000 after, then 150 rounds held
EXAMPLES = {"before": 7000 // BATCH, "after": 3000 // BATCH, "held": 150}
NODES = 4  # the reservation server's run
WAIT_S = 5.0  # for the server to answer or close one input
FUZZ = settings(
    deadline=None,
    derandomize=True,  # the same inputs on every run: CI stays reproducible
    database=None,  # no example database
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True,
)


@pytest.fixture(scope="module", autouse=True)
def hypothesis_home(tmp_path_factory):
    """What Hypothesis keeps of the sources (``.hypothesis/``) goes to the test's temporary
    directory, not into the checkout."""
    set_hypothesis_home_dir(tmp_path_factory.mktemp("hypothesis"))
    yield
    set_hypothesis_home_dir(None)


def exchange(address, payloads: list[bytes], *, hello=None) -> list[bytes]:
    """Sends each of ``payloads`` on a connection of its own, all open together (after
    ``hello()``, a fresh authentic request, answered first: a client that authenticated),
    half-closes them and reads each until the server closes it (at most ``WAIT_S``); returns
    what came back on each after ``hello``'s answer. Fails when the server neither answers
    nor closes one."""
    socks = [socket.create_connection(address, timeout=WAIT_S) for _ in payloads]
    try:
        for sock, payload in zip(socks, payloads, strict=True):
            if hello is not None:
                sock.sendall(hello())
                _read_frame(sock)
            try:
                sock.sendall(payload)
                sock.shutdown(socket.SHUT_WR)
            except OSError:  # closed on us before we were done
                pass
        return [_until_closed(sock) for sock in socks]
    finally:
        for sock in socks:
            sock.close()


def _until_closed(sock: socket.socket) -> bytes:
    received = bytearray()
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return bytes(received)
        if not chunk:
            return bytes(received)
        received += chunk
    raise AssertionError(f"no answer and not closed within {WAIT_S} s")


def _read_frame(sock: socket.socket) -> bytes:
    """One whole answer frame (its length prefix included)."""
    data = b""
    while len(data) < 4 or len(data) < 4 + struct.unpack(">I", data[:4])[0]:
        chunk = sock.recv(65536)
        assert chunk, "the server closed an authenticated client's connection"
        data += chunk
    return data


def hold_then_check(address, payloads: list[bytes], server) -> None:
    """Opens a connection per payload and sends it, then, with all of them held, checks that
    the server holds no more than its limits; closes them."""
    socks = []
    try:
        for payload in payloads:
            sock = socket.create_connection(address, timeout=WAIT_S)
            socks.append(sock)
            try:
                sock.sendall(payload)
            except OSError:  # closed by the server already: a limit at work
                pass
        time.sleep(0.02)  # the server reads what was sent
        assert server.buffered_bytes() <= LIMITS.max_buffered_bytes
        assert len(server.table) <= LIMITS.max_connections
    finally:
        for sock in socks:
            sock.close()


def timed(what: str, count: int, started: float) -> None:
    print(f"{what}: {count} inputs in {time.monotonic() - started:.1f} s")


# ----------------------------------------------------------------------------- strategies

# Text from a small alphabet of what JSON and HTTP parsers trip on (quotes, escapes, "$" of
# the frames' tags, non-ASCII, NUL, line ends): drawing from all of Unicode costs most of a
# test's time. A framed message's keys never start with "$" (the raw bodies below do).
TEXT = st.text(alphabet="ab-_$.:/\\\"'{}[] \x00\r\n\té€😀", max_size=12)
KEYS = TEXT.filter(lambda key: not key.startswith("$"))
LEAVES = st.none() | st.booleans() | st.integers() | st.floats() | TEXT
JSON = (
    LEAVES
    | st.lists(LEAVES, max_size=4)
    | st.dictionaries(KEYS, LEAVES | st.lists(LEAVES, max_size=3), max_size=4)
)


@st.composite
def damaged(draw, whole: bytes) -> bytes:
    """``whole`` cut short, or with one bit flipped."""
    if draw(st.booleans()) or not whole:
        return whole[: draw(st.integers(0, max(0, len(whole) - 1)))]
    at = draw(st.integers(0, len(whole) - 1))
    return whole[:at] + bytes([whole[at] ^ (1 << draw(st.integers(0, 7)))]) + whole[at + 1 :]


@st.composite
def held_payloads(draw, partial) -> list[bytes]:
    """What 1 to 60 peers send and then hold, each connection open: ``partial`` messages
    (never complete) and random bytes, some of them large."""
    one = partial | st.binary(max_size=64).map(lambda b: b * draw(st.integers(1, 1024)))
    return draw(st.lists(one, min_size=1, max_size=60))


def batches(inputs):
    return st.lists(inputs, min_size=BATCH, max_size=BATCH)


# ----------------------------------------------------------------------------- reservation


@pytest.fixture(scope="module")
def reservations():
    """A reservation server for ``NODES`` nodes (tokens issued as the driver issues them), its
    address, the run's secret, and a real request it has already answered (a replay)."""
    secret = secrets.token_bytes(32)
    issued: set[str] = set()

    def issue_token(meta: dict) -> str:
        key = f"executor-{int(meta['executor_id'])}"
        if key in issued:
            raise ValueError(f"{key} already has a control token")
        issued.add(key)
        return secrets.token_hex(16)

    srv = reservation.AuthServer(
        NODES, secret=secret, bind_host=LOOPBACK, issue_token=issue_token, limits=LIMITS
    )
    address = srv.start()
    replay = Codec(secret).seal(REQUEST, {"msg": "QUERY"})[0]
    try:
        assert exchange(address, [replay]) != [b""]  # answered once
        yield srv, address, secret, replay
    finally:
        srv.stop()


@st.composite
def unauthenticated_frames(draw, codec: Codec, replay: bytes) -> bytes:
    """What a peer without the run's secret can send: random bytes, a length and random
    bytes (within the limit, over it, shorter than announced), a real request cut short or
    with a bit flipped, a request seen before (a replay), an answer reflected as a request."""
    kind = draw(st.sampled_from(["bytes", "framed", "real", "replayed", "reflected"]))
    if kind == "bytes":
        return draw(st.binary(max_size=2048))
    if kind == "framed":
        body = draw(st.binary(max_size=2048))
        announced = draw(
            st.sampled_from([len(body), len(body) + 1, MAX_FRAME_BYTES + 1, 0, 2**32 - 1])
            | st.integers(0, 1 << 16)
        )
        return struct.pack(">I", announced) + body
    if kind == "replayed":
        return replay
    if kind == "reflected":
        return codec.seal(ANSWER, {"re": "00", "msg": "OK"})[0]
    msg = draw(st.sampled_from(["QUERY", "QINFO", {"type": "QUERY"}, {"type": "REG"}]))
    return draw(damaged(codec.seal(REQUEST, {"msg": msg})[0]))


def messages():
    """Random messages of the reservation protocol (never STOP, which ends the server)."""
    keys = st.sampled_from(["executor_id", "host", "port"]) | KEYS
    data = JSON | st.dictionaries(keys, JSON | st.integers(-5, 10), max_size=4)
    kinds = st.sampled_from(["REG", "QUERY", "QINFO", "NOPE"]) | TEXT
    message = st.fixed_dictionaries(
        {"type": kinds, "data": data}, optional={"gathers": st.booleans()}
    )
    return (message | JSON).filter(lambda m: not (isinstance(m, dict) and m.get("type") == "STOP"))


# Bodies a node could seal that its encoding never makes: bytes, JSON that is no object, tags
# that do not decode, deep nesting, numbers out of range.
RAW_BODIES = (
    st.binary(max_size=256)
    | st.sampled_from(
        [
            b'{"msg": {"$bytes": 5}}',
            b'{"msg": {"$bytes": "not base64!"}}',
            b'{"msg": {"$tuple": "x"}}',
            b'{"msg": {"$what": 1}}',
            b"[1, 2, 3]",
            b'"msg"',
            b"[" * 5000 + b"]" * 5000,
            b'{"msg": 1e999999}',
            b'{"msg": {"type": "REG", "data": {"executor_id": 1e999999}}}',
        ]
    )
    | JSON.map(lambda value: json.dumps(value).encode())
)


def seal_raw(codec: Codec, body: bytes) -> bytes:
    """``body`` sealed as a request frame as it is (not through the message encoding)."""
    nonce = secrets.token_bytes(NONCE_BYTES)
    frame = nonce + codec._aead.encrypt(nonce, body, REQUEST)
    return struct.pack(">I", len(frame)) + frame


@st.composite
def node_frames(draw, codec: Codec) -> tuple[bytes, bytes, bool]:
    """What a node (holding the secret) may send after its first request: a sealed random
    message or a sealed body that is no message, whole or damaged; ``(what is sent, the
    whole frame, whether its body is a raw one)``."""
    raw = draw(st.none() | RAW_BODIES)
    msg = draw(messages()) if raw is None else None
    whole = codec.seal(REQUEST, {"msg": msg})[0] if raw is None else seal_raw(codec, raw)
    sent = draw(damaged(whole)) if draw(st.booleans()) else whole
    return sent, whole, raw is not None


def check_reservation_server(srv, address, secret: bytes) -> None:
    """Alive, within its limits, and answering a real node."""
    server = srv._server
    assert not srv.stopped and server._thread.is_alive()
    assert server.buffered_bytes() <= LIMITS.max_buffered_bytes
    assert len(server.table) <= LIMITS.max_connections
    assert len(srv.reservations.get()) <= NODES
    client = reservation.AuthClient(address, secret=secret)
    try:
        assert client.request("QUERY") in (True, False)
    finally:
        client.close()


@pytest.mark.timeout(90)
def test_the_reservation_server_answers_nothing_a_stranger_sends(reservations):
    """Before authentication: random or damaged frames, a replay, a reflected answer, each
    on a connection of its own: every one is closed unanswered."""
    srv, address, secret, replay = reservations
    codec, seen = Codec(secret), []

    @settings(FUZZ, max_examples=EXAMPLES["before"])
    @given(payloads=batches(unauthenticated_frames(codec, replay)))
    def one(payloads: list[bytes]) -> None:
        answers = exchange(address, payloads)
        for payload, answer in zip(payloads, answers, strict=True):
            assert answer == b"", payload[:64]
        seen.extend(payloads)

    started = time.monotonic()
    one()
    timed("reservation server, before authentication", len(seen), started)
    assert len(seen) >= 7000
    check_reservation_server(srv, address, secret)


@pytest.mark.timeout(90)
def test_the_reservation_server_answers_or_closes_whatever_a_node_sends(reservations):
    """After authentication (a connection whose first request was answered): a random
    message is answered with a sealed answer to it (``ERR`` for what the protocol does not
    know), a body that is no message or a damaged frame closes the connection unanswered;
    the book never holds more than its nodes."""
    srv, address, secret, _ = reservations
    codec, seen = Codec(secret), []

    def hello() -> bytes:
        return codec.seal(REQUEST, {"msg": "QUERY"})[0]

    @settings(FUZZ, max_examples=EXAMPLES["after"])
    @given(frames=batches(node_frames(codec)))
    def one(frames) -> None:
        answers = exchange(address, [sent for sent, _, _ in frames], hello=hello)
        for (sent, whole, raw), answer in zip(frames, answers, strict=True):
            if answer:  # only to a whole request, and sealed: the answer to that very one
                assert sent == whole, sent[:64]
                _, body = codec.verify(ANSWER, answer[4:])
                assert json.loads(body)["re"] == whole[4 : 4 + NONCE_BYTES].hex()
            else:  # only a damaged frame, or a body that is no message
                assert sent != whole or raw, whole[:64]
        seen.extend(frames)

    started = time.monotonic()
    one()
    timed("reservation server, after authentication", len(seen), started)
    assert len(seen) >= 3000
    check_reservation_server(srv, address, secret)


@pytest.mark.timeout(90)
def test_the_reservation_server_holds_no_more_than_its_limits(reservations):
    """Up to 60 peers at once, each holding part of a frame (announced at up to 1 MiB) or
    random bytes: the connections and the bytes it holds stay within its limits."""
    srv, address, secret, _ = reservations
    partial = st.integers(0, MAX_FRAME_BYTES).map(lambda n: struct.pack(">I", n) + b"x" * 8192)
    seen = []

    @settings(FUZZ, max_examples=EXAMPLES["held"])
    @given(payloads=held_payloads(partial))
    def one(payloads: list[bytes]) -> None:
        hold_then_check(address, payloads, srv._server)
        seen.extend(payloads)

    started = time.monotonic()
    one()
    timed("reservation server, held", len(seen), started)
    check_reservation_server(srv, address, secret)


# ----------------------------------------------------------------------------- control


@pytest.fixture(scope="module")
def control():
    """A control server with a chief and a worker, and their tokens."""
    srv = ControlServer(LOOPBACK, limits=LIMITS, threads=4)
    tokens = {key: srv.issue_token(key) for key in ("executor-0", "executor-1")}
    srv.publish_plans(
        {
            "executor-0": {"name": "chief:0", "role": "chief"},
            "executor-1": {"name": "worker:0", "role": "worker"},
        }
    )
    try:
        yield srv, tokens
    finally:
        srv.close()


METHODS = st.sampled_from(["POST", "GET", "PUT", "DELETE", "OPTIONS", "BREW"]) | TEXT


@st.composite
def http_requests(draw, body) -> bytes:
    """An HTTP request from random parts: a method, a path, a version, headers, a
    Content-Length right, wrong, missing, repeated, negative, not a number or over the limit,
    and ``body``."""
    content = draw(body)
    line = b"%s %s %s\r\n" % (
        draw(METHODS).encode(errors="replace"),
        draw(st.sampled_from([b"/", b"/control"]) | st.binary(max_size=40)),
        draw(st.sampled_from([b"HTTP/1.1", b"HTTP/1.0", b"HTTP/9.9"]) | st.binary(max_size=10)),
    )
    length = draw(
        st.sampled_from([str(len(content)), str(len(content) + 7), "-1", "x", "", str(2**21)])
        | st.integers(0, 1 << 20).map(str)
    )
    headers = [(b"Host", b"driver"), (b"Content-Type", b"application/json")]
    headers += [(b"Content-Length", length.encode())] * draw(st.integers(0, 2))
    headers += draw(st.lists(st.tuples(st.binary(max_size=12), st.binary(max_size=40)), max_size=3))
    head = b"".join(b"%s: %s\r\n" % header for header in headers)
    return line + head + b"\r\n" + content


def control_bodies(tokens: dict[str, str] | None):
    """JSON bodies of the control protocol: with a wrong token (``tokens`` None), else with
    one of the run's (the right key or another), a random event and random data."""
    token = st.sampled_from(list(tokens.values())) if tokens else TEXT | JSON
    key = st.sampled_from(["executor-0", "executor-1", "executor-9"]) | TEXT
    events = st.sampled_from(
        ["hello", "beat", "peek", "eval", "report", "error", "done", "finished", "bye", "nope"]
    )
    fields = {"token": token, "key": key, "event": events | TEXT, "data": JSON}
    return st.fixed_dictionaries({}, optional=fields).map(
        lambda value: json.dumps(value).encode()
    ) | st.binary(max_size=512)


def answered(answer: bytes) -> int | None:
    """The status of an HTTP answer (None: closed unanswered). A request line of one or two
    words is HTTP/0.9 to ``http.server``, whose answers have no status line: then an error
    page (its status read from the page) or the server's JSON error (a refusal, 400)."""
    if not answer:
        return None
    if answer.startswith(b"HTTP/1."):
        return int(answer.split(b" ", 2)[1])
    page = re.search(rb"<title>Error response</title>.*Error code: (\d{3})", answer, re.S)
    if page:
        return int(page.group(1))
    assert "error" in json.loads(answer), answer[:200]
    return 400


def check_control_server(srv, tokens) -> None:
    """Alive, within its limits, and answering a real process."""
    server = srv._httpd
    assert srv._thread.is_alive()
    assert server.buffered_bytes() <= LIMITS.max_buffered_bytes
    assert len(server.table) <= LIMITS.max_connections
    nodes = srv.snapshot()
    assert set(nodes) <= set(tokens)  # nothing kept of anyone else
    assert all(len(n.evals) <= MAX_KEPT and len(n.reports) <= MAX_KEPT for n in nodes.values())
    client = ControlClient(srv.url, tokens["executor-1"], "executor-1")
    assert client.post("beat", {"progress": {"step": 1}}, timeout=WAIT_S)["abort"] is None


@pytest.mark.timeout(90)
def test_the_control_server_grants_nothing_to_a_stranger(control):
    """Before authentication: random bytes, HTTP requests from random parts, JSON bodies
    with wrong tokens, whole or cut short: each is refused (4xx, 501 for a method HTTP does
    not know) or closed, never granted."""
    srv, tokens = control
    seen = []
    request = http_requests(control_bodies(None))
    inputs = st.binary(max_size=1024) | request | request.flatmap(damaged)

    @settings(FUZZ, max_examples=EXAMPLES["before"])
    @given(payloads=batches(inputs))
    def one(payloads: list[bytes]) -> None:
        for payload, answer in zip(payloads, exchange(srv.address, payloads), strict=True):
            status = answered(answer)
            assert status is None or status >= 400, (status, payload[:80])
        seen.extend(payloads)

    started = time.monotonic()
    one()
    timed("control server, before authentication", len(seen), started)
    assert len(seen) >= 7000
    check_control_server(srv, tokens)
    assert srv.abort is None and srv.pause is None


@pytest.mark.timeout(90)
def test_the_control_server_answers_whatever_a_process_sends(control):
    """After authentication: requests with a real token and random keys, events and data
    are answered (200, or 400 and 403 for what they may not do), and the server keeps no
    more of a process than its limits."""
    srv, tokens = control
    seen = []
    post = b"POST / HTTP/1.1\r\nHost: driver\r\nContent-Length: %d\r\n\r\n%s"

    @settings(FUZZ, max_examples=EXAMPLES["after"])
    @given(bodies=batches(control_bodies(tokens)))
    def one(bodies: list[bytes]) -> None:
        requests = [post % (len(body), body) for body in bodies]
        for body, answer in zip(bodies, exchange(srv.address, requests), strict=True):
            assert answered(answer) in (200, 400, 403), (answer[:80], body[:80])
        seen.extend(bodies)

    started = time.monotonic()
    one()
    timed("control server, after authentication", len(seen), started)
    assert len(seen) >= 3000
    check_control_server(srv, tokens)


@pytest.mark.timeout(90)
def test_the_control_server_holds_no_more_than_its_limits(control):
    """Up to 60 peers at once, each holding part of a request (a header, a body announced
    at up to 1 MiB) or random bytes: the connections and the bytes it holds stay within its
    limits."""
    srv, tokens = control
    head = b"POST / HTTP/1.1\r\nHost: driver\r\nContent-Length: %d\r\n\r\n"
    partial = st.integers(1, 1 << 20).map(lambda n: head % n + b"{" * min(n - 1, 8192))
    seen = []

    @settings(FUZZ, max_examples=EXAMPLES["held"])
    @given(payloads=held_payloads(partial | st.just(b"POST / HTTP/1.1\r\nHost: x\r\n")))
    def one(payloads: list[bytes]) -> None:
        hold_then_check(srv.address, payloads, srv._httpd)
        seen.extend(payloads)

    started = time.monotonic()
    one()
    timed("control server, held", len(seen), started)
    check_control_server(srv, tokens)
