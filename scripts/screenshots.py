"""Build the documentation site and take a headless Chromium screenshot of every page.

    python3 scripts/screenshots.py [OUT_DIR]        (default: site-screenshots/)
    python3 scripts/screenshots.py --width 390 OUT   (a phone-sized window)

Builds the site with ``scripts/docs.sh`` into a temporary folder, serves it on
127.0.0.1 (an ephemeral port, this process only), and for every page's ``index.html``
has Chromium (Debian's ``chromium``: installed with apt-get when missing and running as
root) render it at ``--width`` CSS pixels and save the whole page as PNG tiles of at most
``--tile-height`` pixels: ``<page>-01.png``, ``<page>-02.png``, ... Then look at them (an
image viewer, or your editor) and fix what a reader cannot read.

Chromium runs headless with a fresh profile, as this machine needs it (no sandbox as
root, no GPU, and none of its background network traffic); it is driven over the DevTools
protocol on a pipe-free local websocket, with the standard library only. Every wait is
bounded (``PAGE_TIMEOUT_S``), and the browser and the server are stopped on every path.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import functools
import http.server
import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = "chromium"
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--remote-debugging-port=0",
)
"""Chromium's flags: headless, as root, with no traffic of its own (the machine's network
is closed: without these it keeps trying to reach its vendor's hosts)."""
PAGE_TIMEOUT_S = 60.0
"""Bound on starting the browser, loading one page, and any one DevTools reply."""
MAX_TILES = 100
"""Most tiles per page (a page taller than that many tiles is cut, and says so)."""


def ensure_chromium() -> str:
    """The Chromium binary, installed from Debian's packages when missing (as root)."""
    found = shutil.which(CHROMIUM)
    if found:
        return found
    if os.geteuid() != 0:
        raise SystemExit(
            "screenshots: chromium is missing; install it with: sudo apt-get install -y chromium"
        )
    print("== apt-get install chromium", flush=True)
    subprocess.run(["apt-get", "update", "-qq"], check=True, timeout=600)
    subprocess.run(
        ["apt-get", "install", "-y", "-qq", "--no-install-recommends", "chromium"],
        check=True,
        timeout=1800,
        env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
    )
    found = shutil.which(CHROMIUM)
    if not found:
        raise SystemExit("screenshots: apt-get installed chromium, but it is not on PATH")
    return found


def build_site(out: Path) -> None:
    subprocess.run(["bash", str(ROOT / "scripts" / "docs.sh"), str(out)], check=True, timeout=900)


def pages(site: Path) -> list[str]:
    """Every page of the built site, as a URL path ("" for the home page)."""
    found = []
    for index in sorted(site.rglob("index.html")):
        rel = index.parent.relative_to(site).as_posix()
        if rel.startswith(("assets", "search")):
            continue
        found.append("" if rel == "." else rel + "/")
    return found


@contextlib.contextmanager
def serve(site: Path) -> Iterator[str]:
    """Serve ``site`` on 127.0.0.1 until the block ends; yields the base URL."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

    handler = functools.partial(Quiet, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, name="site server", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(PAGE_TIMEOUT_S)


class DevTools:
    """A minimal client of Chromium's DevTools protocol over its websocket (RFC 6455:
    masked text frames out, unmasked frames in), enough for navigate and screenshot."""

    def __init__(self, url: str) -> None:
        m = re.fullmatch(r"ws://([^:/]+):(\d+)(/.*)", url)
        if not m:
            raise ValueError(f"unexpected DevTools URL {url!r}")
        self.sock = socket.create_connection((m[1], int(m[2])), timeout=PAGE_TIMEOUT_S)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall(
            (
                f"GET {m[3]} HTTP/1.1\r\nHost: {m[1]}:{m[2]}\r\nUpgrade: websocket\r\n"
                f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                "Sec-WebSocket-Version: 13\r\n\r\n"
            ).encode()
        )
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise ConnectionError("DevTools closed the connection during the handshake")
            head += chunk
        if b" 101 " not in head.split(b"\r\n", 1)[0]:
            raise ConnectionError(f"DevTools refused the websocket: {head[:200]!r}")
        self.buffer = head.split(b"\r\n\r\n", 1)[1]
        self.next_id = 0
        self.session: str | None = None

    def close(self) -> None:
        self.sock.close()

    def _read(self, n: int) -> bytes:
        while len(self.buffer) < n:
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise ConnectionError("DevTools closed the connection")
            self.buffer += chunk
        data, self.buffer = self.buffer[:n], self.buffer[n:]
        return data

    def _frame(self) -> bytes:
        message = b""
        while True:
            first, second = self._read(2)
            length = second & 0x7F
            if length == 126:
                length = struct.unpack(">H", self._read(2))[0]
            elif length == 127:
                length = struct.unpack(">Q", self._read(8))[0]
            payload = self._read(length)
            message += payload
            if first & 0x80:  # the final fragment
                return message

    def _send(self, text: str) -> None:
        data = text.encode()
        mask = os.urandom(4)
        n = len(data)
        if n < 126:
            header = struct.pack(">BB", 0x81, 0x80 | n)
        elif n < 1 << 16:
            header = struct.pack(">BBH", 0x81, 0x80 | 126, n)
        else:
            header = struct.pack(">BBQ", 0x81, 0x80 | 127, n)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(data))
        self.sock.sendall(header + mask + masked)

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        """Send one command and wait (bounded) for its reply; events are skipped."""
        self.next_id += 1
        message: dict[str, Any] = {"id": self.next_id, "method": method, "params": params}
        if self.session is not None:
            message["sessionId"] = self.session
        self._send(json.dumps(message))
        deadline = time.monotonic() + PAGE_TIMEOUT_S
        while time.monotonic() < deadline:
            reply = json.loads(self._frame())
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                result: dict[str, Any] = reply.get("result", {})
                return result
        raise TimeoutError(f"no reply to {method} within {PAGE_TIMEOUT_S} s")

    def wait_until_loaded(self) -> None:
        deadline = time.monotonic() + PAGE_TIMEOUT_S
        while time.monotonic() < deadline:
            state = self.call("Runtime.evaluate", expression="document.readyState")
            images = self.call(
                "Runtime.evaluate",
                expression="Array.from(document.images).every(i => i.complete)",
            )
            if state["result"].get("value") == "complete" and images["result"].get("value"):
                return
            time.sleep(0.1)
        raise TimeoutError(f"page not loaded within {PAGE_TIMEOUT_S} s")


@contextlib.contextmanager
def browser(binary: str) -> Iterator[DevTools]:
    """Chromium with a fresh profile, and a DevTools session attached to one blank tab."""
    # Chromium is a tree of processes: it runs in its own session, so that stopping it
    # stops all of them before its profile folder is removed.
    with tempfile.TemporaryDirectory(
        prefix="rdzv-chromium-", ignore_cleanup_errors=True
    ) as profile:
        proc = subprocess.Popen(
            [binary, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            url = _devtools_url(proc)
            tools = DevTools(url)
            try:
                targets = tools.call("Target.getTargets")["targetInfos"]
                page = next(t for t in targets if t["type"] == "page")
                attached = tools.call(
                    "Target.attachToTarget", targetId=page["targetId"], flatten=True
                )
                tools.session = attached["sessionId"]
                tools.call("Page.enable")
                tools.call("Runtime.enable")
                yield tools
            finally:
                tools.close()
        finally:
            _stop_group(proc)


def _stop_group(proc: subprocess.Popen[str]) -> None:
    """SIGTERM to Chromium's whole process group, then SIGKILL if it is still there."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(PAGE_TIMEOUT_S)
            break
        except subprocess.TimeoutExpired:
            continue
    deadline = time.monotonic() + PAGE_TIMEOUT_S
    while time.monotonic() < deadline:  # its children leave the group as they exit
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)


def _devtools_url(proc: subprocess.Popen[str]) -> str:
    """Read Chromium's stderr until it names its DevTools websocket (bounded)."""
    assert proc.stderr is not None
    found: list[str] = []

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            m = re.search(r"DevTools listening on (ws://\S+)", line)
            if m and not found:
                found.append(m[1])
        # keep draining until the browser exits, so it never blocks on a full pipe

    threading.Thread(target=read, name="chromium stderr", daemon=True).start()
    deadline = time.monotonic() + PAGE_TIMEOUT_S
    while not found and time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"screenshots: chromium exited with code {proc.returncode}")
        time.sleep(0.05)
    if not found:
        raise SystemExit(f"screenshots: chromium named no DevTools URL in {PAGE_TIMEOUT_S} s")
    return found[0]


def shoot(tools: DevTools, url: str, stem: Path, width: int, tile: int) -> list[Path]:
    """Load ``url`` at ``width`` CSS pixels and save it as PNG tiles ``stem-NN.png``."""
    tools.call(
        "Emulation.setDeviceMetricsOverride", width=width, height=tile, deviceScaleFactor=1,
        mobile=width < 600,
    )  # fmt: skip
    tools.call("Page.navigate", url=url)
    tools.wait_until_loaded()
    height = int(tools.call("Page.getLayoutMetrics")["cssContentSize"]["height"])
    written = []
    count = min(MAX_TILES, -(-height // tile))
    for k in range(count):
        top = k * tile
        clip = {"x": 0, "y": top, "width": width, "height": min(tile, height - top), "scale": 1}
        shot = tools.call(
            "Page.captureScreenshot", format="png", clip=clip, captureBeyondViewport=True
        )
        path = stem.with_name(f"{stem.name}-{k + 1:02d}.png")
        path.write_bytes(base64.b64decode(shot["data"]))
        written.append(path)
    if count < -(-height // tile):
        print(f"  {url}: {height} px tall, cut after {MAX_TILES} tiles", flush=True)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument(
        "out", nargs="?", default="site-screenshots", help="folder (default site-screenshots)"
    )
    parser.add_argument(
        "--width", type=int, default=1280, help="window width in CSS px (default 1280)"
    )
    parser.add_argument(
        "--tile-height", type=int, default=1600, help="tile height in px (default 1600)"
    )
    parser.add_argument(
        "--site", help="screenshot this built site instead of building one (default: build)"
    )
    parser.add_argument(
        "--page", action="append", help="only this page, e.g. diagrams/ (repeatable; default all)"
    )
    args = parser.parse_args(argv)
    if not 200 <= args.width <= 4000 or not 200 <= args.tile_height <= 8000:
        parser.error("--width must be in 200..4000 and --tile-height in 200..8000 px")
    binary = ensure_chromium()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="rdzv-site-") as tmp:
        site = Path(args.site) if args.site else Path(tmp) / "site"
        if not args.site:
            build_site(site)
        chosen = args.page or pages(site)
        with serve(site) as base, browser(binary) as tools:
            for page in chosen:
                name = page.strip("/").replace("/", "-") or "index"
                tiles = shoot(tools, base + page, out / name, args.width, args.tile_height)
                print(f"{base + page}: {len(tiles)} tile(s) -> {tiles[0].parent}/{name}-*.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
