#!/usr/bin/env bash
# Regenerate constraints/lock.txt from this environment's versions of what '.[dev]' installs.
#   fresh venv:  python3 -m pip install -e '.[dev]'   (plus anything newly added to pyproject)
#   then:        bash .ci/lock.sh            (PYTHON=... to use another interpreter)
# and commit constraints/lock.txt. CI and the README's set-up command install with it.
set -euo pipefail
cd "$(dirname "$0")/.."
"${PYTHON:-python3}" .ci/lock.py "$@"
