#!/usr/bin/env bash
# Dependencies point one way (cli -> io-* -> store/core). core has no runtime,
# no socket, no clock, no database; the blocking shell has no tokio.
set -euo pipefail
cd "$(dirname "$0")/.."
fail=0
check() { # package, forbidden-regex
    local tree
    tree=$(cargo tree -e normal -p "$1" --prefix none --format '{p}' 2>/dev/null | awk '{print $1}' | sort -u)
    local bad
    bad=$(grep -E "$2" <<<"$tree" || true)
    if [ -n "$bad" ]; then
        echo "check-deps: $1 must not depend on: $(echo $bad)"; fail=1
    fi
}
check smolbox-core '^(tokio|mio|socket2|libc|nix|rusqlite|postgres|tokio-postgres|axum|hyper|rustls)$|^smolbox-(tokio|blocking|store|cli|devworker)$'
check smolbox-blocking '^(tokio|tokio-rustls|tokio-util|hyper|axum)$'
check smolbox-store '^(smolbox-tokio|smolbox-blocking|smolbox-cli|smolbox-devworker)$'
check smolbox-tls '^(tokio|mio|socket2|rusqlite|postgres|tokio-postgres|axum|hyper)$|^smolbox-(tokio|blocking|store|cli|devworker)$'
check smolbox-devworker '^smolbox-(tokio|blocking|store|cli)$'
[ "$fail" = 0 ] && echo "check-deps: ok"
exit "$fail"
