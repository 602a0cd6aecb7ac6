#!/usr/bin/env bash
# Install everything the test suite needs, then run all of it.
# This is the README's test command; .ci/run calls it unchanged.
set -euo pipefail
cd "$(dirname "$0")/.."

python3 -m pip install --quiet --disable-pip-version-check -e '.[test]'

set +e
python3 -m pytest "$@"
status=$?
set -e
# pytest's 5 means "no tests collected": that is a failure here, never a pass.
exit "$status"
