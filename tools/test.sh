#!/usr/bin/env bash
# Set everything up (tools/setup.sh) and run the default test suite (not the `slow` tests).
#   bash tools/test.sh              # default suite
#   bash tools/test.sh -m slow      # the long runs only
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash tools/setup.sh
if [ "$#" -eq 0 ]; then
  set -- -m "not slow"
fi
# pytest exits 5 when it collected no test: that is a failure here, as is any other non-zero.
# --durations: the slowest tests, to keep the default run within its 20-minute budget.
exec .venv/bin/python -m pytest -q --durations=40 "$@"
