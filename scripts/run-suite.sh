#!/usr/bin/env bash
# `make test`'s pytest run: the whole suite on xdist workers, then, when a few tests failed, each
# of those again, one at a time, on a host no longer loaded by the others.
#
# Why: on a 2-core CI host with four workers, a test that waits on a container, an agent's boot
# or a kubelet sometimes misses its limit because of the rest of the suite (each CI run of
# November 2026 failed 4 or 5 such tests out of 865, a different few each time, none a defect).
# Each such failure is fixed in the test when seen (docs/development.md lists them); this step
# keeps one from blocking a landing meanwhile. It cannot hide a real defect: a failure that
# comes again alone fails the run, more than MAX_RERUN failures are taken as a break and not
# re-run, and the first run's failures stay in the log, named FLAKY when the re-run passes.
#
# Usage: scripts/run-suite.sh <venv bin dir> <pytest arguments…>
set -uo pipefail
cd "$(dirname "$0")/.."
bin=$1
shift
MAX_RERUN=${MAX_RERUN:-8}

# pytest's cache keeps failures of earlier runs; this run's alone are wanted.
rm -f .pytest_cache/v/cache/lastfailed
"$bin/pytest" "$@"
status=$?
# 0: passed; 2 and above: interrupted, an internal or usage error, no tests: never re-run.
[ "$status" -eq 1 ] || exit "$status"

mapfile -t failed < <("$bin/python" - <<'EOF'
import json
import re
from pathlib import Path

# pytest-xdist's loadgroup adds "@group" to a grouped test's id; the test itself is without it.
cache = Path(".pytest_cache/v/cache/lastfailed")
for node_id in json.loads(cache.read_text()) if cache.exists() else {}:
    print(re.sub(r"@[\w-]+$", "", node_id))
EOF
)
if [ "${#failed[@]}" -eq 0 ] || [ "${#failed[@]}" -gt "$MAX_RERUN" ]; then
    echo "run-suite: ${#failed[@]} tests failed (re-run only when 1 to $MAX_RERUN): failed" >&2
    exit "$status"
fi
echo "run-suite: ${#failed[@]} tests failed in the parallel run; they run again, one at a time:"
printf '  %s\n' "${failed[@]}"
"$bin/pytest" -n 0 "${failed[@]}"
status=$?
if [ "$status" -eq 0 ]; then
    printf 'run-suite: FLAKY (failed loaded, passed alone): %s\n' "${failed[@]}"
fi
exit "$status"
