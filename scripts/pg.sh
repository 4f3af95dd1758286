# shellcheck shell=bash
# Sourced by scripts/test.sh: make sure a PostgreSQL server binary exists
# (installing Debian's package when it does not), start a throwaway cluster on
# a private port for this run, export SMOLBOX_PG_URL, and stop it on exit.
# A second cluster on the next port requires TLS (SMOLBOX_PG_TLS_URL, its CA
# in SMOLBOX_PG_TLS_CA).

# Sourced again inside a run that already started its clusters (the variables
# below are exported and the server answers): use them, start nothing.
if [ -n "${SMOLBOX_PG_URL:-}" ] && [ -d "${SMOLBOX_PG_DATA:-/nonexistent}" ] &&
    (exec 3<>"/dev/tcp/127.0.0.1/${SMOLBOX_PG_PORT:-0}") 2>/dev/null; then
    echo "test: using this environment's PostgreSQL on 127.0.0.1:$SMOLBOX_PG_PORT"
    return 0
fi

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

# A free pair of ports (this cluster's and the TLS one's next to it): the
# default 55439 unless something already listens there (a cluster of another
# run on the same machine), then the next pairs. SMOLBOX_PG_PORT fixes it.
pg_port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
if [ -n "${SMOLBOX_PG_PORT:-}" ]; then
    PG_PORT=$SMOLBOX_PG_PORT
else
    PG_PORT=55439
    while pg_port_busy "$PG_PORT" || pg_port_busy $((PG_PORT + 1)); do
        PG_PORT=$((PG_PORT + 2))
        [ "$PG_PORT" -lt 55539 ] || { echo "test: no free port pair for PostgreSQL in 55439-55538"; exit 1; }
    done
fi
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

# A second cluster that requires TLS (C18.3): a generated CA and a server
# certificate for 127.0.0.1, `hostssl` only (a plain connection is rejected).
if ! command -v openssl >/dev/null 2>&1; then
    echo "test: installing openssl (certificates for the TLS PostgreSQL)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssl >/dev/null
fi
PG_TLS_PORT=$((PG_PORT + 1))
PG_TLS="$PG_DIR/tls"
mkdir -p "$PG_TLS"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -subj /CN=smolbox-test-ca \
    -keyout "$PG_TLS/ca.key" -out "$PG_TLS/ca.pem" >/dev/null 2>&1
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj /CN=127.0.0.1 \
    -keyout "$PG_TLS/server.key" -out "$PG_TLS/server.csr" >/dev/null 2>&1
printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\n' >"$PG_TLS/san.ext"
openssl x509 -req -in "$PG_TLS/server.csr" -CA "$PG_TLS/ca.pem" -CAkey "$PG_TLS/ca.key" -CAcreateserial \
    -days 2 -extfile "$PG_TLS/san.ext" -out "$PG_TLS/server.pem" >/dev/null 2>&1
chmod 600 "$PG_TLS/server.key"
[ "$PG_USER" = "$(id -un)" ] || chown -R "$PG_USER" "$PG_TLS"
pg_as "$PGBIN/initdb" -D "$PG_DIR/tlsdata" -U smolbox --auth=trust -E UTF8 >"$PG_DIR/initdb-tls.log" 2>&1 ||
    { cat "$PG_DIR/initdb-tls.log"; exit 1; }
printf 'local all all trust\nhostssl all all 127.0.0.1/32 trust\nhost all all 127.0.0.1/32 reject\n' >"$PG_DIR/tlsdata/pg_hba.conf"
pg_as "$PGBIN/pg_ctl" -D "$PG_DIR/tlsdata" -l "$PG_DIR/server-tls.log" -w -t 60 \
    -o "-p $PG_TLS_PORT -k $PG_DIR -c listen_addresses=127.0.0.1 -c fsync=off -c ssl=on -c ssl_cert_file=$PG_TLS/server.pem -c ssl_key_file=$PG_TLS/server.key" start >/dev/null ||
    { cat "$PG_DIR/server-tls.log"; exit 1; }

pg_stop() {
    pg_as "$PGBIN/pg_ctl" -D "$PG_DIR/data" -m immediate stop >/dev/null 2>&1 || true
    pg_as "$PGBIN/pg_ctl" -D "$PG_DIR/tlsdata" -m immediate stop >/dev/null 2>&1 || true
    rm -rf "$PG_DIR"
}
trap pg_stop EXIT

export SMOLBOX_PG_URL="host=127.0.0.1 port=$PG_PORT user=smolbox dbname=postgres"
export SMOLBOX_PG_BIN="$PGBIN" SMOLBOX_PG_DATA="$PG_DIR/data" SMOLBOX_PG_USER="$PG_USER" SMOLBOX_PG_PORT="$PG_PORT" SMOLBOX_PG_SOCKDIR="$PG_DIR"
export SMOLBOX_PG_TLS_URL="host=127.0.0.1 port=$PG_TLS_PORT user=smolbox dbname=postgres" SMOLBOX_PG_TLS_CA="$PG_TLS/ca.pem"
echo "test: throwaway PostgreSQL on 127.0.0.1:$PG_PORT, and with TLS required on 127.0.0.1:$PG_TLS_PORT ($PG_DIR)"
