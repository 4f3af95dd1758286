#!/usr/bin/env bash
# Record what a real smolvm 1.9.2 answers to the whole catalogue into
# tools/diffworker/fixtures/smolvm-1.9.2.json (side A), compared live with the
# devworker impersonating 1.9.2 (side B), then stop both.
#   record.sh /path/to/smolvm /path/to/smolbox-devworker [SEED]
# Must run as root (start_real.sh drops the real server to nobody). Binds only
# 127.0.0.1. The comparison's output goes to stdout; the exit status is diff.py's.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
SMOLVM="${1:?usage: record.sh SMOLVM_BIN DEVWORKER_BIN [SEED]}"
DEVWORKER="${2:?usage: record.sh SMOLVM_BIN DEVWORKER_BIN [SEED]}"
SEED="${3:-17}"
read -r URL_REAL PID_REAL DIR_REAL < <("$HERE/start_real.sh" "$SMOLVM")
D=$(mktemp -d /tmp/diffworker-dev.XXXXXX)
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$DEVWORKER" --listen "127.0.0.1:$PORT" --state-dir "$D/state" --impersonate 1.9.2 --no-token \
    >"$D/devworker.log" 2>&1 </dev/null &
PID_DEV=$!
cleanup() {
    kill "$PID_DEV" 2>/dev/null || true
    kill "$PID_REAL" 2>/dev/null || true
    for _ in $(seq 1 100); do kill -0 "$PID_REAL" 2>/dev/null || break; sleep 0.1; done
    rm -rf "$D" "$DIR_REAL"
}
trap cleanup EXIT
for _ in $(seq 1 100); do grep -q "listening on" "$D/devworker.log" && break; sleep 0.1; done
rc=0
python3 "$HERE/diff.py" "$URL_REAL" "http://127.0.0.1:$PORT" --seed "$SEED" \
    --plant-a "smolvm:$DIR_REAL" --plant-b "path:$D/state/machines/{name}/agent-console.log" \
    --record-a "$HERE/fixtures/smolvm-1.9.2.json" || rc=$?
exit "$rc"
