"""ZeroMQ CURVE on every socket (security.curve=true): keys, the servers' ZAP handler, socket options.

Keys (`empo2-keys DIR`, i.e. `python -m protocol.security DIR`):

    DIR/server.key, DIR/server.key_secret        the servers' key pair (policy servers, replay buffer,
                                                 memory service); clients need only server.key
    DIR/clients/<name>.key, <name>.key_secret    one key pair per client role (CLIENT_NAMES)
    DIR/authorized/<name>.key                    the public client keys the servers accept

A server socket is a CURVE server whose handshakes go to ZAP (pyzmq's ThreadAuthenticator, one
per process): a client whose public key is not in DIR/authorized is refused, and so is a client
without CURVE; nothing it sends reaches the application. A client socket uses its role's key pair
and verifies the server's public key. Refused handshakes are counted per server socket
(watch_handshakes: empo2_<role>_handshake_failures_total{reason}).

Roles: an accepted client is named by its key's file name in DIR/authorized (ZAP's User-Id, which
libzmq attaches to every message of the connection: sender_role), and SENDERS says which roles
may send which message: only the learner's key takes batches or pushes weights, only an env
actor's uploads trajectories. A message from another role is refused as `wrong_role` at the door
(common/server.py, dispatch), so a stolen env-actor key cannot train the policy.

The setting is process-wide, made once at start-up from the configuration (pipeline/cli.py,
role_config): every socket of protocol.transport (and the policy server's) then follows it.
To add a host, copy server.key and the client role's key pair to it; to refuse a client, delete
its key from DIR/authorized and restart the servers.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils import z85
from zmq.utils.monitor import recv_monitor_message

from protocol.codec import Message, ProtocolError

log = logging.getLogger(__name__)

SERVER_NAME = "server"
# The client roles: each has a key pair of its own (the key names the role in the servers' logs).
CLIENT_NAMES = ("learner", "env_actor", "memory_service", "evaluation")
ZAP_DOMAIN = "empo2"

# Under CURVE, the client roles that may send each message kind (by KIND); a kind not listed (Ping)
# may come from any accepted client. env_actor covers the episode logic wherever it runs: the env
# actors, and the evaluation commands (empo2-eval, empo2-memory-tta) that play with it.
_ACTORS = frozenset({"env_actor", "evaluation"})
SENDERS: dict[str, frozenset[str]] = {
    "generate_request": _ACTORS | {"memory_service"},  # memory_service: the policy writes reflections
    "weight_chunk": frozenset({"learner"}),
    "weight_file": frozenset({"learner"}),
    "nccl_transfer_init": frozenset({"learner"}),
    "nccl_transfer_update": frozenset({"learner"}),
    "assignment_request": frozenset({"env_actor"}),
    "assignment_return": frozenset({"env_actor"}),
    "lease_renewal": frozenset({"env_actor"}),
    "trajectory": frozenset({"env_actor"}),
    "batch_request": frozenset({"learner"}),
    "batch_confirm": frozenset({"learner"}),
    "memory_query": _ACTORS,
    "episode_report": _ACTORS,
    "strategy_query": _ACTORS,  # SGE's reflection for a group
}


@dataclass(frozen=True)
class Curve:
    """The keys this process uses: the servers' pair (servers), or its role's pair (clients)."""

    keys_dir: Path
    client_name: str | None  # None: a process that only serves (policy server, replay buffer)

    def server_keys(self) -> tuple[bytes, bytes]:
        return _load(self.keys_dir / f"{SERVER_NAME}.key_secret", secret=True)

    def server_public_key(self) -> bytes:
        return _load(self.keys_dir / f"{SERVER_NAME}.key", secret=False)[0]

    def client_keys(self) -> tuple[bytes, bytes]:
        if self.client_name is None:
            raise RuntimeError("this process has no client key (security.curve): it only serves")
        return _load(self.keys_dir / "clients" / f"{self.client_name}.key_secret", secret=True)

    @property
    def authorized_dir(self) -> Path:
        return self.keys_dir / "authorized"


def _load(path: Path, secret: bool) -> tuple[bytes, bytes]:
    if not path.is_file():
        raise RuntimeError(f"security.curve=true but {path} is missing: run `empo2-keys {path.parent}` first")
    public, secret_key = zmq.auth.load_certificate(str(path))
    if secret and secret_key is None:
        raise RuntimeError(f"{path} holds no secret key")
    return public, secret_key


_curve: Curve | None = None
_authenticators: dict[int, ThreadAuthenticator] = {}  # libzmq context address -> its ZAP handler
_lock = threading.Lock()


def use_curve(curve: Curve | None) -> None:
    """Make every socket this process opens from now on follow `curve` (None: plain sockets)."""
    global _curve
    if curve is not None:
        curve.server_public_key()  # fail at start-up, with the command to run, if the keys are not there
        if curve.client_name is not None:
            curve.client_keys()
    _curve = curve


def active() -> Curve | None:
    return _curve


def secure_server(sock: zmq.Socket) -> None:
    """A server socket (before bind): CURVE server, handshakes checked by this process's ZAP handler."""
    if _curve is None:
        return
    _start_authenticator(sock.context)
    public, secret = _curve.server_keys()
    sock.setsockopt(zmq.CURVE_SERVER, 1)
    sock.setsockopt(zmq.CURVE_PUBLICKEY, public)
    sock.setsockopt(zmq.CURVE_SECRETKEY, secret)
    sock.setsockopt(zmq.ZAP_DOMAIN, ZAP_DOMAIN.encode())


def secure_client(sock: zmq.Socket) -> None:
    """A client socket (before connect): its role's key pair, and the server key it must find."""
    if _curve is None:
        return
    public, secret = _curve.client_keys()
    sock.setsockopt(zmq.CURVE_SERVERKEY, _curve.server_public_key())
    sock.setsockopt(zmq.CURVE_PUBLICKEY, public)
    sock.setsockopt(zmq.CURVE_SECRETKEY, secret)


class _RoleAuthenticator(ThreadAuthenticator):
    """The ZAP handler: accepts the keys in authorized/ and names each accepted client by its key's
    file name there (its role), the User-Id libzmq then attaches to every message it sends."""

    def __init__(self, context: zmq.Context, authorized_dir: Path):
        super().__init__(context)
        self.roles = {zmq.auth.load_certificate(str(p))[0]: p.stem for p in sorted(authorized_dir.glob("*.key"))}

    def curve_user_id(self, client_public_key: bytes) -> str:
        return self.roles.get(z85.encode(client_public_key), "unknown")


def sender_role(frame: zmq.Frame) -> str | None:
    """The role of the client that sent `frame` (a frame received with copy=False on a server
    socket): its key's name in authorized/ under CURVE; None without CURVE (anyone may connect)."""
    if _curve is None:
        return None
    return frame.get("User-Id")


def check_sender(msg: Message, role: str | None) -> None:
    """Refuse (ProtocolError wrong_role) a message its sender's role may not send (SENDERS);
    nothing to check without CURVE (role None)."""
    allowed = SENDERS.get(msg.KIND)
    if role is not None and allowed is not None and role not in allowed:
        raise ProtocolError("wrong_role", f"{msg.KIND} is not accepted from the {role} key")


def _start_authenticator(ctx: zmq.Context) -> None:
    """One ZAP handler per libzmq context (the asyncio policy server shadows the process's context)."""
    with _lock:
        if ctx.underlying in _authenticators:
            return
        auth = _RoleAuthenticator(zmq.Context.shadow(ctx.underlying), _curve.authorized_dir)
        auth.start()
        auth.configure_curve(domain=ZAP_DOMAIN, location=str(_curve.authorized_dir))
        _authenticators[ctx.underlying] = auth


def stop_authenticator(ctx: zmq.Context) -> None:
    """Stop the ZAP handler of `ctx` (before the context is closed; a process's own ends with it)."""
    with _lock:
        auth = _authenticators.pop(ctx.underlying, None)
    if auth is not None:
        auth.stop()


# libzmq's handshake failure events: a key not in authorized/ is refused by ZAP (auth); a client
# without CURVE (other, measured) or expecting another server key (protocol or other) fails before.
_HANDSHAKE_EVENTS = {
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL: "other",
    zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL: "protocol",
    zmq.EVENT_HANDSHAKE_FAILED_AUTH: "auth",
}


def watch_handshakes(sock: zmq.Socket, counter: Any) -> None:
    """Count the server socket's failed handshakes in `counter` (a labelled prometheus Counter), from
    a daemon thread reading the socket's monitor. Nothing to do without CURVE."""
    if _curve is None:
        return
    endpoint = f"inproc://handshakes-{id(sock)}"
    events = 0
    for event in _HANDSHAKE_EVENTS:
        events |= event
    sock.monitor(endpoint, events)
    monitor = zmq.Context.shadow(sock.context.underlying).socket(zmq.PAIR)
    monitor.connect(endpoint)

    def watch() -> None:
        while True:
            try:
                event = recv_monitor_message(monitor)
            except zmq.ZMQError:  # the context is closing
                return
            reason = _HANDSHAKE_EVENTS.get(event["event"])
            if reason is not None:
                counter.labels(reason).inc()
                log.warning("refused a connection on %s: handshake failed (%s)", sock.last_endpoint, reason)

    threading.Thread(target=watch, name="handshakes", daemon=True).start()


def generate_keys(keys_dir: Path, clients: tuple[str, ...] = CLIENT_NAMES) -> list[Path]:
    """Write a server key pair and one key pair per client into `keys_dir` (existing ones are kept),
    and authorize every client's public key. Returns the files written."""
    written = []
    (keys_dir / "clients").mkdir(parents=True, exist_ok=True)
    (keys_dir / "authorized").mkdir(exist_ok=True)
    for name, folder in [(SERVER_NAME, keys_dir), *[(c, keys_dir / "clients") for c in clients]]:
        if not (folder / f"{name}.key_secret").exists():
            public, secret = zmq.auth.create_certificates(str(folder), name)
            Path(secret).chmod(0o600)
            written += [Path(public), Path(secret)]
        if folder != keys_dir:
            shutil.copy(folder / f"{name}.key", keys_dir / "authorized" / f"{name}.key")
    return written


def main(argv: list[str] | None = None) -> int:
    """empo2-keys DIR [--clients NAME ...]: generate CURVE keys for security.curve=true."""
    parser = argparse.ArgumentParser(prog="empo2-keys", description=__doc__.split("\n\n")[0])
    parser.add_argument("keys_dir", type=Path, help="where to write them (security.keys_dir)")
    parser.add_argument("--clients", nargs="+", default=list(CLIENT_NAMES), help="client key names")
    args = parser.parse_args(argv)
    written = generate_keys(args.keys_dir, tuple(args.clients))
    for path in written:
        print(path)
    print(
        f"{len(written)} key files written to {args.keys_dir}; run with security.curve=true "
        f"security.keys_dir={args.keys_dir}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
