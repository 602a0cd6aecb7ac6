#!/usr/bin/env bash
# Install everything the test suite needs, then run all of it.
# This is the README's test command; .ci/run calls it unchanged.
#
# - Debian packages: redis-server and etcd-server (the store tests start real servers on
#   127.0.0.1 themselves), openssl (TLS certificates for those tests).
# - Python: the package with its test, torch (CPU build, for the torchrun tests), redis,
#   etcd and bench (matplotlib: the benchmark plots' freshness test) extras.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
command -v etcd >/dev/null 2>&1 || need+=(etcd-server)
command -v openssl >/dev/null 2>&1 || need+=(openssl)
command -v gcc >/dev/null 2>&1 || need+=(gcc)
if [ "${#need[@]}" -gt 0 ]; then
    if [ "$(id -u)" != 0 ]; then
        echo "scripts/test.sh: missing ${need[*]}; install them with: sudo apt-get install -y ${need[*]}" >&2
        exit 1
    fi
    echo "== apt-get install ${need[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
# The Debian packages start their own services; the tests use their own servers only.
for svc in redis-server etcd; do
    if command -v systemctl >/dev/null 2>&1; then systemctl stop "$svc" >/dev/null 2>&1 || true; fi
done

# torch first, pinned to the CPU build the tests run on: the extra's range alone would let
# pip pick the newest release it allows, a CUDA build of several GB.
python3 -m pip install --quiet --disable-pip-version-check 'torch==2.13.0'
python3 -m pip install --quiet --disable-pip-version-check -e '.[test,torch,redis,etcd,bench]'
# The compiled checker (--native; model_check/native.py), built once here, not by
# several test processes at once (a build takes a few minutes; an unchanged tree reuses it).
echo "== the compiled checker (--native)"
python3 -m model_check --native --nodes 2 --protocol hardened --quiet >/dev/null

# Given test paths or node ids (anything that is not an option), run just those, one at a
# time. Otherwise the whole suite in two parts: first the tests that only compute (marked
# "cpu" by tests/conftest.py: the checker, the prover, spec, docs) on every core at once
# (pytest-xdist), then the others, one at a time, as they wait on real processes and
# servers. Both parts always run; the script fails if either does.
# pytest's exit status 5 ("no tests collected") fails this script like any other failure.
for arg in "$@"; do
    case "$arg" in
        -*) ;;
        *) exec python3 -m pytest "$@" ;;
    esac
done
workers="$(python3 -c 'import os; print(max(1, len(os.sched_getaffinity(0))))')"
status=0
echo "== tests that only compute, on $workers cores"
python3 -m pytest -m cpu -n "$workers" --dist worksteal "$@" || status=$?
echo "== tests of real processes, servers and threads, one at a time"
python3 -m pytest -m "not cpu" "$@" || status=$?
exit "$status"
