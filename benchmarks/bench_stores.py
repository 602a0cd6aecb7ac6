"""Rendezvous time and store traffic per node for N nodes, on every store side by side.

Stores: memory://, sqlite://, redis:// and etcd:// (a real redis-server and etcd are
started on loopback in a temporary directory and stopped afterwards; see
``tests/servers.py``). For each store and N, N handlers (threads of this process, each
with its own store connection) call ``next_rendezvous`` at one instant (the timing is
``bench_handler.rdzv_threads``), once per protocol (``hardened``, the handler's default,
and ``scale``, which joins through an announcement set); the table shows the time until
the last returned and, per node, the reads and compare-and-set attempts it made. A second
table times single store operations (one thread, loopback).

    python3 benchmarks/bench_stores.py                    # N = 8, 32, 128
    python3 benchmarks/bench_stores.py --sizes 8 --stores redis,etcd --protocols hardened
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for extra in (ROOT, ROOT / "tests", ROOT / "benchmarks"):
    if str(extra) not in sys.path:  # run from a checkout without installing
        sys.path.insert(0, str(extra))

from bench_handler import parse_sizes, rdzv_threads  # noqa: E402

SIZES = (8, 32, 128)
STORES = ("memory", "sqlite", "redis", "etcd")
PROTOCOLS = ("hardened", "scale")
OPS = 200
"""Single operations timed per kind and store."""


@contextmanager
def store_urls(stores: tuple[str, ...], folder: Path) -> Iterator[dict[str, str]]:
    """A URL per store; the servers run until the block ends."""
    from servers import EtcdServer, RedisServer

    urls: dict[str, str] = {}
    redis_server = etcd_server = None
    try:
        for store in stores:
            if store == "memory":
                urls[store] = "memory://bench"
            elif store == "sqlite":
                # 128 threads contend for SQLite's one write lock: let writers queue longer.
                urls[store] = f"sqlite://{folder / 'bench.db'}?busy_timeout_ms=60000"
            elif store == "redis":
                redis_server = RedisServer(folder / "redis").start()
                urls[store] = redis_server.url
            elif store == "etcd":
                etcd_server = EtcdServer(folder / "etcd").start()
                urls[store] = etcd_server.url
            else:
                raise SystemExit(f"unknown store {store!r}; choose from {', '.join(STORES)}")
        yield urls
    finally:
        if redis_server is not None:
            redis_server.stop()
        if etcd_server is not None:
            etcd_server.stop()


def time_ops(url: str) -> dict[str, float]:
    """Mean milliseconds of get, set, compare_set and add (one thread)."""
    from rdzv.stores import open_store

    store = open_store(url, timeout=timedelta(seconds=10))
    prefix = uuid.uuid4().hex
    key = f"{prefix}/k"
    store.set(key, b"0")
    results: dict[str, float] = {}
    calls: dict[str, Callable[[int], object]] = {
        "get": lambda i: store.get(key),
        "set": lambda i: store.set(key, str(i)),
        "compare_set": lambda i: store.compare_set(key, str(i), str(i + 1)),
        "add": lambda i: store.add(f"{prefix}/n", 1),
    }
    for name, call in calls.items():
        store.set(key, "0")
        start = time.perf_counter()
        for i in range(OPS):
            call(i)
        results[name] = (time.perf_counter() - start) / OPS * 1000
    close = getattr(store, "close", None)
    if callable(close):
        close()
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--sizes", help="comma-separated N values (default 8,32,128)")
    parser.add_argument("--stores", default=",".join(STORES))
    parser.add_argument(
        "--protocols", default=",".join(PROTOCOLS), help="variant names, comma-separated"
    )
    args = parser.parse_args(argv)
    sizes = parse_sizes(parser, args.sizes, SIZES)
    stores = tuple(args.stores.split(","))
    protocols = tuple(args.protocols.split(","))
    from spec import get_variant

    for protocol in protocols:
        try:
            get_variant(protocol)
        except ValueError as exc:
            parser.error(f"--protocols: {exc}")
    with tempfile.TemporaryDirectory() as tmp, store_urls(stores, Path(tmp)) as urls:
        print("rendezvous of N threads (each its own handler and connection)")
        print(
            f"{'store':<8} {'protocol':<9} {'N':>5} {'seconds':>9} {'reads/node':>11} "
            f"{'CAS/node':>9}"
        )
        for store in stores:
            for protocol in protocols:
                for n in sizes:
                    run_id = f"bench-{uuid.uuid4().hex[:8]}"
                    try:
                        result = rdzv_threads(urls[store], n, run_id, protocol)
                    except RuntimeError as exc:  # report the row, keep measuring the others
                        print(f"{store:<8} {protocol:<9} {n:>5} failed: {str(exc)[:300]}")
                        continue
                    print(
                        f"{store:<8} {protocol:<9} {n:>5} {result.seconds:>9.3f} "
                        f"{result.reads / n:>11.1f} {result.cas / n:>9.1f}",
                        flush=True,
                    )
        print()
        print(f"single operations, mean ms over {OPS} (one thread)")
        print(f"{'store':<8} {'get':>8} {'set':>8} {'CAS':>8} {'add':>8}")
        for store in stores:
            ms = time_ops(urls[store])
            print(
                f"{store:<8} {ms['get']:>8.3f} {ms['set']:>8.3f} {ms['compare_set']:>8.3f} "
                f"{ms['add']:>8.3f}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
