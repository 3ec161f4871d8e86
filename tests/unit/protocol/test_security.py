"""CURVE on the sockets (security.curve): with the keys empo2-keys wrote, a protocol client gets
its answer; a client without CURVE, with a key the servers do not list, or expecting another
server key gets nothing through, and the server counts each refused handshake."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest
import zmq

from common.metrics import RoleMetrics
from protocol import Client, recv_request, send_reply
from protocol.messages import Ping, Pong
from protocol.security import Curve, generate_keys, stop_authenticator, use_curve, watch_handshakes
from protocol.transport import bind_router
from tests.helpers import ping_answered, wait_for


@pytest.fixture(scope="module")
def keys_dir(tmp_path_factory) -> Path:
    keys = tmp_path_factory.mktemp("keys")
    out = subprocess.run([sys.executable, "-m", "protocol.security", str(keys)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return keys


@pytest.fixture
def server(keys_dir):
    """A ROUTER served by a thread, CURVE on (the process-wide setting, as role_config makes it)."""
    use_curve(Curve(keys_dir, "env_actor"))
    ctx = zmq.Context()
    sock = bind_router(ctx, "tcp://127.0.0.1:*")
    metrics = RoleMetrics("curve_test")
    watch_handshakes(sock, metrics.handshake_failures)
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            if sock.poll(50):
                request = recv_request(sock)  # the answer names the sender's role, as the server saw it
                send_reply(sock, request.identity, Pong(role=str(request.sender), policy_version=0, ready=True))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield sock.last_endpoint.decode(), metrics
    stop.set()
    thread.join()
    use_curve(None)
    stop_authenticator(ctx)
    sock.close(linger=0)
    ctx.term()


def failures(metrics, reason: str | None = None) -> float:
    """Refused handshakes counted for `reason`, or for every reason."""
    reasons = [reason] if reason else ["protocol", "auth", "other"]
    sample = metrics.registry.get_sample_value
    return sum(sample("empo2_curve_test_handshake_failures_total", {"reason": r}) or 0 for r in reasons)


def test_the_key_command_writes_server_client_and_authorized_keys(keys_dir):
    assert (keys_dir / "server.key").is_file() and (keys_dir / "server.key_secret").is_file()
    for name in ("learner", "env_actor", "memory_service", "evaluation"):
        assert (keys_dir / "clients" / f"{name}.key_secret").is_file()
        assert (keys_dir / "authorized" / f"{name}.key").is_file()
    assert not list((keys_dir / "authorized").glob("*secret*"))
    assert generate_keys(keys_dir) == []  # a second run keeps the keys


def test_with_keys_every_request_is_answered_and_the_server_knows_the_senders_role(server, keys_dir):
    endpoint, metrics = server
    for role in ("env_actor", "learner"):
        use_curve(Curve(keys_dir, role))  # this process's client key (the server keeps the server pair)
        client = Client(zmq.Context.instance(), endpoint, timeout_s=5.0)
        try:
            pong = client.call(Ping(sender="actor"))
        finally:
            client.close()
        assert isinstance(pong, Pong) and pong.role == role  # the key's name in authorized/, from ZAP
    assert failures(metrics) == 0


def test_a_client_without_curve_gets_nothing_through_and_is_counted(server):
    endpoint, metrics = server
    assert not ping_answered(endpoint, {})
    assert wait_for(lambda: failures(metrics) >= 1)


def test_a_client_with_an_unlisted_key_gets_nothing_through_and_is_counted(server, keys_dir):
    endpoint, metrics = server
    public, secret = zmq.curve_keypair()
    server_key = zmq.auth.load_certificate(str(keys_dir / "server.key"))[0]
    options = {zmq.CURVE_SERVERKEY: server_key, zmq.CURVE_PUBLICKEY: public, zmq.CURVE_SECRETKEY: secret}
    assert not ping_answered(endpoint, options)
    assert wait_for(lambda: failures(metrics, "auth") >= 1)


def test_a_client_expecting_another_server_key_gets_nothing_through(server, keys_dir):
    endpoint, metrics = server
    public, secret = zmq.auth.load_certificate(str(keys_dir / "clients" / "learner.key_secret"))
    options = {zmq.CURVE_SERVERKEY: zmq.curve_keypair()[0], zmq.CURVE_PUBLICKEY: public, zmq.CURVE_SECRETKEY: secret}
    assert not ping_answered(endpoint, options)
    assert wait_for(lambda: failures(metrics) >= 1)


def test_a_role_refuses_to_start_without_its_keys(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipeline",
            "empo2-replay-buffer",
            f"run_dir={tmp_path}",
            "security.curve=true",
            f"security.keys_dir={tmp_path / 'nokeys'}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2 and "empo2-keys" in out.stderr
