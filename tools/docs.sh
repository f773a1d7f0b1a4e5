#!/usr/bin/env bash
# The documentation site (docs/, mkdocs.yml): MkDocs + Material, from the `dev` extra.
#   bash tools/docs.sh                      # serve at http://127.0.0.1:8000 with live reload
#   bash tools/docs.sh serve -a 0.0.0.0:8000   # mkdocs serve's own options
#   bash tools/docs.sh build [-d DIR]       # the strict build tests/project/test_docs.py runs (site/ by default)
# Nothing is fetched: no remote fonts, no plugin that downloads.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
py=.venv/bin/python
if ! "$py" -c "import mkdocs, material, mkdocstrings_handlers.python" >/dev/null 2>&1; then
  echo "[docs] installing the dev extra (mkdocs, mkdocs-material, mkdocstrings-python) via tools/setup.sh"
  bash tools/setup.sh
fi
export NO_MKDOCS_2_WARNING=1
cmd="${1:-serve}"
[ "$#" -gt 0 ] && shift
case "$cmd" in
  serve) exec "$py" -m mkdocs serve --strict "$@" ;;
  build) exec "$py" -m mkdocs build --strict "$@" ;;
  *) echo "usage: bash tools/docs.sh [serve|build] [mkdocs options]" >&2; exit 2 ;;
esac
