# shellcheck shell=bash
# Sourced by scripts/test.sh: make sure a PostgreSQL server binary exists
# (installing Debian's package when it does not), start a throwaway cluster on
# a private port for this run, export SMOLBOX_PG_URL, and stop it on exit.

pg_bin_dir() {
    local d
    for d in /usr/lib/postgresql/*/bin; do
        [ -x "$d/initdb" ] && { echo "$d"; return 0; }
    done
    return 1
}

if ! PGBIN=$(pg_bin_dir); then
    echo "test: PostgreSQL server not found; installing Debian's postgresql package"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq postgresql >/dev/null
    PGBIN=$(pg_bin_dir)
fi

PG_PORT=${SMOLBOX_PG_PORT:-55439}
PG_DIR=$(mktemp -d /tmp/smolbox-pg.XXXXXX)
PG_USER=$(id -un)
if [ "$(id -u)" = 0 ]; then
    # initdb and postgres refuse to run as root.
    id postgres >/dev/null 2>&1 || useradd --system --no-create-home postgres
    PG_USER=postgres
    chown "$PG_USER" "$PG_DIR"
fi
pg_as() { if [ "$(id -u)" = 0 ]; then runuser -u "$PG_USER" -- "$@"; else "$@"; fi; }

pg_as "$PGBIN/initdb" -D "$PG_DIR/data" -U smolbox --auth=trust -E UTF8 >"$PG_DIR/initdb.log" 2>&1 ||
    { cat "$PG_DIR/initdb.log"; exit 1; }
pg_as "$PGBIN/pg_ctl" -D "$PG_DIR/data" -l "$PG_DIR/server.log" -w -t 60 \
    -o "-p $PG_PORT -k $PG_DIR -c listen_addresses=127.0.0.1 -c fsync=off" start >/dev/null ||
    { cat "$PG_DIR/server.log"; exit 1; }

pg_stop() { pg_as "$PGBIN/pg_ctl" -D "$PG_DIR/data" -m immediate stop >/dev/null 2>&1 || true; rm -rf "$PG_DIR"; }
trap pg_stop EXIT

export SMOLBOX_PG_URL="host=127.0.0.1 port=$PG_PORT user=smolbox dbname=postgres"
export SMOLBOX_PG_BIN="$PGBIN" SMOLBOX_PG_DATA="$PG_DIR/data" SMOLBOX_PG_USER="$PG_USER" SMOLBOX_PG_PORT="$PG_PORT" SMOLBOX_PG_SOCKDIR="$PG_DIR"
echo "test: throwaway PostgreSQL on 127.0.0.1:$PG_PORT ($PG_DIR)"
