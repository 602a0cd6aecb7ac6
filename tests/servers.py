"""Real ``redis-server`` and ``etcd`` processes for tests, a TCP proxy that can cut or
blackhole traffic, and a throwaway TLS certificate authority.

Every server runs on free 127.0.0.1 ports in its own temporary directory and is stopped
by :meth:`stop` (the pytest fixtures in ``conftest.py`` always call it). A missing server
binary raises :class:`ServerMissing` (an error, never a skip): CI installs the Debian
packages ``redis-server`` and ``etcd-server``.

Bounds: a server must answer within ``START_WITHIN_S`` of starting and exit within
``STOP_WITHIN_S`` of SIGTERM (then it is killed). The proxy's thread polls its sockets
every ``PROXY_TICK_S`` and is joined by :meth:`TcpProxy.stop`.
"""

from __future__ import annotations

import base64
import contextlib
import json
import selectors
import shutil
import signal
import socket
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

START_WITHIN_S = 20.0
"""How long a server gets to start answering."""
STOP_WITHIN_S = 10.0
"""How long a server gets to exit after SIGTERM before SIGKILL."""
POLL_S = 0.02
"""Between two readiness probes of a starting server."""
PROXY_TICK_S = 0.05
"""The proxy thread's select timeout (how fast it notices stop and mode changes)."""
OPENSSL_WITHIN_S = 30.0
"""Bound on one openssl command."""


class ServerMissing(RuntimeError):
    """A server binary is not installed."""


def find_binary(name: str, package: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise ServerMissing(
            f"{name} is not installed, so the tests that need a real server cannot run; "
            f"install it with: apt-get install -y {package} (.ci/run does this)"
        )
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_until(probe: Any, what: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + START_WITHIN_S
    while time.monotonic() < deadline:  # bounded by START_WITHIN_S
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}: {_tail(log)}")
        if probe():
            return
        time.sleep(POLL_S)
    raise RuntimeError(f"{what} did not answer within {START_WITHIN_S} s: {_tail(log)}")


def _tail(log: Path) -> str:
    try:
        return log.read_text(errors="replace")[-2000:]
    except OSError:
        return "(no log)"


def _stop(proc: subprocess.Popen[bytes] | None, sig: int = signal.SIGTERM) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(sig)
    try:
        proc.wait(STOP_WITHIN_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(STOP_WITHIN_S)


# -- TLS -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Certs:
    """A CA, a server certificate for 127.0.0.1, and a client certificate (PEM files)."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def _openssl(*args: str, cwd: Path) -> None:
    binary = find_binary("openssl", "openssl")
    subprocess.run(
        [binary, *args],
        cwd=cwd,
        check=True,
        capture_output=True,
        timeout=OPENSSL_WITHIN_S,
    )


def make_certs(folder: Path) -> Certs:
    """Generate a throwaway CA and certificates with openssl (EC keys: fast)."""
    folder.mkdir(parents=True, exist_ok=True)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
             "-subj", "/CN=rdzv test CA", cwd=folder)  # fmt: skip
    (folder / "server.ext").write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n"
    )
    (folder / "client.ext").write_text("extendedKeyUsage=clientAuth\n")
    for name, cn in (("server", "127.0.0.1"), ("client", "root")):
        _openssl("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr",
                 "-subj", f"/CN={cn}", cwd=folder)  # fmt: skip
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                 "-CAcreateserial", "-out", f"{name}.pem", "-days", "2",
                 "-extfile", f"{name}.ext", cwd=folder)  # fmt: skip
    return Certs(
        ca=folder / "ca.pem",
        server_cert=folder / "server.pem",
        server_key=folder / "server.key",
        client_cert=folder / "client.pem",
        client_key=folder / "client.key",
    )


# -- redis -----------------------------------------------------------------------------


class RedisServer:
    """A ``redis-server`` on a free port under ``folder``.

    ``persistent`` turns on the append-only file with an fsync per write, so a restart
    (even after SIGKILL) keeps every acknowledged write; without it the server keeps
    nothing across restarts.
    """

    def __init__(
        self,
        folder: Path,
        *,
        persistent: bool = False,
        password: str | None = None,
        certs: Certs | None = None,
    ) -> None:
        self.binary = find_binary("redis-server", "redis-server")
        self.folder = folder
        self.folder.mkdir(parents=True, exist_ok=True)
        self.persistent = persistent
        self.password = password
        self.certs = certs
        self.port = free_port()
        self.log = folder / "redis.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        if self.certs is None:
            return f"redis://{auth}127.0.0.1:{self.port}/0"
        c = self.certs
        return (
            f"rediss://{auth}127.0.0.1:{self.port}/0?ca={c.ca}&cert={c.client_cert}"
            f"&key={c.client_key}"
        )

    def start(self) -> RedisServer:
        args = [
            self.binary,
            "--bind", "127.0.0.1",
            "--dir", str(self.folder),
            "--logfile", str(self.log),
            "--daemonize", "no",
            "--save", "",
            "--appendonly", "yes" if self.persistent else "no",
            "--appendfsync", "always",
            "--protected-mode", "no",
        ]  # fmt: skip
        if self.certs is None:
            args += ["--port", str(self.port)]
        else:
            c = self.certs
            args += [
                "--port", "0",
                "--tls-port", str(self.port),
                "--tls-cert-file", str(c.server_cert),
                "--tls-key-file", str(c.server_key),
                "--tls-ca-cert-file", str(c.ca),
                "--tls-auth-clients", "yes",
            ]  # fmt: skip
        if self.password:
            args += ["--requirepass", self.password]
        self.proc = subprocess.Popen(
            args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT
        )
        _wait_until(self._ready, f"redis-server on port {self.port}", self.proc, self.log)
        return self

    def _ready(self) -> bool:
        if self.certs is not None:
            return "Ready to accept connections" in _tail(self.log)
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                s.sendall(b"PING\r\n")
                reply = s.recv(64)
        except OSError:
            return False
        # -NOAUTH means up (with requirepass); -LOADING means still reading the AOF.
        return reply.startswith(b"+PONG") or reply.startswith(b"-NOAUTH")

    def command(self, *args: str | bytes) -> Any:
        """Run one command with a direct client (test-side checks)."""
        import redis

        kwargs: dict[str, Any] = {}
        if self.certs is not None:
            kwargs = {
                "ssl": True,
                "ssl_ca_certs": str(self.certs.ca),
                "ssl_certfile": str(self.certs.client_cert),
                "ssl_keyfile": str(self.certs.client_key),
            }
        client: Any = redis.Redis(
            host="127.0.0.1", port=self.port, password=self.password, socket_timeout=5, **kwargs
        )
        try:
            return client.execute_command(*args)
        finally:
            client.close()

    def stop(self, sig: int = signal.SIGTERM) -> None:
        _stop(self.proc, sig)

    def restart(self, sig: int = signal.SIGKILL) -> None:
        """Stop (SIGKILL by default: a crash) and start again on the same port."""
        self.stop(sig)
        self.start()


# -- etcd ------------------------------------------------------------------------------


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


class EtcdServer:
    """A single-member ``etcd`` on free ports under ``folder`` (etcd always persists:
    :meth:`restart` keeps the data directory, :meth:`restart_empty` wipes it)."""

    def __init__(self, folder: Path, *, certs: Certs | None = None) -> None:
        self.binary = find_binary("etcd", "etcd-server")
        self.folder = folder
        self.folder.mkdir(parents=True, exist_ok=True)
        self.certs = certs
        self.port = free_port()
        self.peer_port = free_port()
        self.log = folder / "etcd.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.data_dirs = 0
        self.user: str | None = None
        self.password: str | None = None

    @property
    def scheme(self) -> str:
        return "https" if self.certs else "http"

    @property
    def client_url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        auth = f"{self.user}:{self.password}@" if self.user else ""
        if self.certs is None:
            return f"etcd://{auth}127.0.0.1:{self.port}"
        c = self.certs
        return (
            f"etcds://{auth}127.0.0.1:{self.port}?ca={c.ca}&cert={c.client_cert}&key={c.client_key}"
        )

    def start(self) -> EtcdServer:
        data = self.folder / f"data{self.data_dirs}"
        peer = f"http://127.0.0.1:{self.peer_port}"
        args = [
            self.binary,
            "--name", "rdzv-test",
            "--data-dir", str(data),
            "--listen-client-urls", self.client_url,
            "--advertise-client-urls", self.client_url,
            "--listen-peer-urls", peer,
            "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"rdzv-test={peer}",
            "--log-level", "warn",
            "--logger", "zap",
        ]  # fmt: skip
        if self.certs is not None:
            c = self.certs
            args += [
                "--cert-file", str(c.server_cert),
                "--key-file", str(c.server_key),
                "--trusted-ca-file", str(c.ca),
                "--client-cert-auth",
            ]  # fmt: skip
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                args, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
            )
        _wait_until(self._ready, f"etcd on port {self.port}", self.proc, self.log)
        return self

    def _context(self) -> ssl.SSLContext | None:
        if self.certs is None:
            return None
        ctx = ssl.create_default_context(cafile=str(self.certs.ca))
        ctx.load_cert_chain(str(self.certs.client_cert), str(self.certs.client_key))
        return ctx

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(
                f"{self.client_url}/health", timeout=1, context=self._context()
            ) as reply:
                return bool(json.loads(reply.read()).get("health") == "true")
        except (OSError, ValueError):
            return False

    def post(self, path: str, body: dict[str, Any], token: str | None = None) -> Any:
        """POST to the v3 JSON gateway (test-side setup and checks)."""
        request = urllib.request.Request(
            f"{self.client_url}{path}",
            data=json.dumps(body).encode(),
            headers={
                "Content-Type": "application/json",
                **({"Authorization": token} if token else {}),
            },
        )
        with urllib.request.urlopen(request, timeout=10, context=self._context()) as reply:
            return json.loads(reply.read())

    def token(self) -> str | None:
        if self.user is None or self.password is None:
            return None
        reply = self.post("/v3/auth/authenticate", {"name": self.user, "password": self.password})
        return str(reply["token"])

    def enable_auth(self, user: str = "root", password: str = "etcd-secret") -> None:
        """Create user ``root`` with the root role and turn authentication on."""
        self.post("/v3/auth/user/add", {"name": user, "password": password})
        self.post("/v3/auth/role/add", {"name": "root"})
        self.post("/v3/auth/user/grant", {"user": user, "role": "root"})
        self.post("/v3/auth/enable", {})
        self.user, self.password = user, password

    def put(self, key: str, value: bytes) -> None:
        body = {"key": _b64(key), "value": base64.b64encode(value).decode()}
        self.post("/v3/kv/put", body, self.token())

    def revision(self) -> int:
        reply = self.post("/v3/kv/range", {"key": _b64("\0")}, self.token())
        return int(reply["header"]["revision"])

    def stop(self, sig: int = signal.SIGTERM) -> None:
        _stop(self.proc, sig)

    def restart(self, sig: int = signal.SIGKILL) -> None:
        self.stop(sig)
        self.start()

    def restart_empty(self) -> None:
        """Restart on the same ports with a new, empty data directory (data loss)."""
        self.stop(signal.SIGKILL)
        self.data_dirs += 1
        self.user = self.password = None
        self.start()


# -- a TCP proxy that tests can make misbehave -------------------------------------------


class TcpProxy:
    """Forwards 127.0.0.1:``port`` to ``target_port``, in one thread.

    - :meth:`blackhole` stops moving bytes in both directions (connections stay open,
      new ones are accepted but not served), like a network partition; :meth:`resume`
      moves them again, like a healed network delivering what TCP retransmits.
    - :meth:`lose_reply_to` forwards the next request containing ``marker`` but drops the
      server's reply to it and closes that connection: the client cannot know whether
      its write happened.
    """

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(128)
        self._listener.setblocking(False)
        self.port = int(self._listener.getsockname()[1])
        self._blocked = threading.Event()
        self._marker: bytes | None = None
        self._doomed: set[socket.socket] = set()
        self.replies_lost = 0
        self._stop = threading.Event()
        self._pairs: dict[socket.socket, tuple[socket.socket, bool]] = {}
        self._thread = threading.Thread(target=self._run, name="tcp-proxy", daemon=True)

    def start(self) -> TcpProxy:
        self._thread.start()
        return self

    def blackhole(self) -> None:
        self._blocked.set()

    def resume(self) -> None:
        self._blocked.clear()

    def lose_reply_to(self, marker: bytes) -> None:
        self._marker = marker

    def _close_pair(self, sock: socket.socket) -> None:
        other, _ = self._pairs.pop(sock, (None, False))
        if other is not None:
            self._pairs.pop(other, None)
            other.close()
        sock.close()

    def _run(self) -> None:
        sel = selectors.DefaultSelector()
        sel.register(self._listener, selectors.EVENT_READ)
        registered: set[socket.socket] = set()
        try:
            while not self._stop.is_set():  # bounded by stop(); each pass waits PROXY_TICK_S
                blocked = self._blocked.is_set()
                # Register exactly the sockets we may read from now.
                for sock in list(registered):
                    if blocked or sock not in self._pairs:
                        sel.unregister(sock)
                        registered.discard(sock)
                if not blocked:
                    for sock in self._pairs:
                        if sock not in registered:
                            sel.register(sock, selectors.EVENT_READ)
                            registered.add(sock)
                for key, _ in sel.select(PROXY_TICK_S):
                    ready = key.fileobj
                    if not isinstance(ready, socket.socket):
                        continue
                    if ready is self._listener:
                        self._accept()
                    elif ready in self._pairs:
                        self._forward(ready)
        finally:
            sel.close()

    def _accept(self) -> None:
        try:
            client, _ = self._listener.accept()
        except BlockingIOError:
            return
        try:
            upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
        except OSError:
            client.close()
            return
        client.settimeout(STOP_WITHIN_S)  # a peer that stops reading cannot wedge us
        upstream.settimeout(STOP_WITHIN_S)
        self._pairs[client] = (upstream, True)  # True: client -> server
        self._pairs[upstream] = (client, False)

    def _forward(self, sock: socket.socket) -> None:
        other, to_server = self._pairs[sock]
        try:
            data = sock.recv(65536)
        except OSError:
            data = b""
        if not data:
            self._close_pair(sock)
            return
        marker = self._marker
        if to_server and marker is not None and marker in data:
            self._marker = None
            self._doomed.add(other)  # the server's next bytes on this connection
        if not to_server and sock in self._doomed:
            self._doomed.discard(sock)
            self.replies_lost += 1
            self._close_pair(sock)  # the reply is dropped, the client sees a closed socket
            return
        try:
            other.sendall(data)
        except OSError:
            self._close_pair(sock)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(STOP_WITHIN_S)
        for sock in list(self._pairs):
            with contextlib.suppress(OSError):
                sock.close()
        self._pairs.clear()
        self._listener.close()
