#!/usr/bin/env bash
# Build the documentation site: installs graphviz (Debian) and the docs extra when missing,
# checks that the committed diagram sources match the tables, renders every source with
# graphviz's dot (a source dot rejects fails the build), then runs mkdocs --strict.
#
#   bash scripts/docs.sh [SITE_DIR]      (default: site/)
#
# To regenerate the committed diagrams after changing a table or an effect, run
# `python3 -m model_check.diagrams --render` and commit docs/diagrams/.
set -euo pipefail
cd "$(dirname "$0")/.."
site="${1:-site}"
export NO_MKDOCS_2_WARNING=1

if ! command -v dot >/dev/null 2>&1; then
    if [ "$(id -u)" != 0 ]; then
        echo "scripts/docs.sh: graphviz's dot is missing; install it with: sudo apt-get install -y graphviz" >&2
        exit 1
    fi
    echo "== apt-get install graphviz"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends graphviz >/dev/null
fi
python3 -m pip install --quiet --disable-pip-version-check -e '.[docs]'

echo "== diagrams: sources match the tables, and dot renders every one"
python3 -m model_check.diagrams --check
rendered="$(mktemp -d)"
trap 'rm -rf "$rendered"' EXIT
count=0
for src in docs/diagrams/*.dot; do
    dot -Tsvg "$src" -o "$rendered/$(basename "$src" .dot).svg"
    count=$((count + 1))
done
echo "rendered $count diagram sources with $(dot -V 2>&1)"

echo "== mkdocs build --strict -> $site"
python3 -m mkdocs build --strict --site-dir "$site" 2>&1 | tail -n 3

# The docstrings use Sphinx roles; scripts/griffe_sphinx_roles.py turns them into links or
# code. One left in the rendered reference means that rewrite missed a form.
if grep -oE ':(py:)?(class|func|meth|data|mod|attr|exc|obj|const):' "$site/reference/index.html" | head -n 3 | grep -q .; then
    echo "scripts/docs.sh: raw Sphinx roles in the API reference ($site/reference/index.html):" >&2
    grep -oE '.{0,40}:(py:)?(class|func|meth|data|mod|attr|exc|obj|const):.{0,40}' "$site/reference/index.html" | head -n 5 >&2
    exit 1
fi
echo "API reference: no raw Sphinx roles"
