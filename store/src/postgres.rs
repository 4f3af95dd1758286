//! The PostgreSQL adapter (C18.3): many controllers on many hosts sharing
//! workers. Real transactions (READ COMMITTED) with row locks:
//!
//! - operations on partition-wide totals (accept and its pending count,
//!   reserve and worker capacity, worker leases, machine names and ports,
//!   the command slot) lock the partition row first, so they serialize per
//!   partition;
//! - single-record writes (guarded patch, claim, cancel, release) are a
//!   compare-and-swap: read the row, apply the pure rule, then `UPDATE ...
//!   WHERE version = <read version>` (and, when the record is assigned,
//!   only while the worker lease still has the generation the guard was
//!   checked against); a lost race reruns the operation, which then sees
//!   the new version and fails `stale_version` or `stale_claim` as the
//!   rules say. They only shrink partition totals, so they need not wait
//!   for the partition lock.
//!
//! Payloads are sealed; projected columns are checked against the
//! decrypted payload on every read. A lost connection is a `store` error
//! (never absence) and the next call reconnects. [`PostgresStore::drop_schema`]
//! (the down migration) refuses to drop non-empty history.

use smolbox_core::Evidence;
use smolbox_core::Reason;
use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};

use postgres::error::SqlState;
use postgres::types::ToSql;
use postgres::{Client, Row, Statement, Transaction};
use smolbox_core::managed::record::Resources;
use smolbox_core::managed::{ExecutionRecord, Lease, MachineRecord, RecordKey, RecordKind};
use smolbox_core::{Error, Operation};

use crate::engine::{Backend, Handle, Lock, Tx, assigned_parts, prepare_partition};
use crate::pg_connect::{Connector, PostgresOptions, pg_error};
use crate::row::{Projection, assigned_of, int, lease_of};
use crate::seal::{KEY_ID, SEALED_V2};
use crate::{Assigned, DueCursor, Sealer, impl_store};

/// Schema version of the PostgreSQL layout: 2 adds the partitions'
/// key-check values and the current sealed format (version-bound, with a
/// key id).
const LAYOUT_VERSION: i64 = 2;
/// Attempts of one operation after deadlock or serialization failures.
const MAX_ATTEMPTS: usize = 10;
/// Longest pause between two attempts (the pause doubles from 2 ms), so
/// controllers that collide (several opening one partition at once) spread
/// out instead of colliding again; ~0.4 s in all before giving up.
const MAX_BACKOFF: std::time::Duration = std::time::Duration::from_millis(64);
/// FNV-1a of `SCHEMA_SQL`, stored beside the layout: a store whose
/// fingerprint matches skips the DDL on open.
const SCHEMA_FINGERPRINT: i64 = fnv1a(SCHEMA_SQL.as_bytes());

const fn fnv1a(bytes: &[u8]) -> i64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut i = 0;
    while i < bytes.len() {
        h ^= bytes[i] as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
        i += 1;
    }
    i64::from_ne_bytes(h.to_ne_bytes())
}
/// Advisory lock key serializing migrations across controllers.
const MIGRATION_LOCK: i64 = 0x0073_6d6f_6c62_6f78;

const SCHEMA_SQL: &str = "
CREATE TABLE IF NOT EXISTS smolbox_meta (key TEXT PRIMARY KEY, value BIGINT NOT NULL);
CREATE TABLE IF NOT EXISTS partitions (name VARCHAR(10) PRIMARY KEY);
CREATE TABLE IF NOT EXISTS worker_leases (
    partition VARCHAR(10) NOT NULL REFERENCES partitions (name), worker_id VARCHAR(64) NOT NULL,
    owner TEXT NOT NULL, generation BIGINT NOT NULL CHECK (generation > 0),
    until_ms BIGINT NOT NULL CHECK (until_ms >= 0), PRIMARY KEY (partition, worker_id));
CREATE TABLE IF NOT EXISTS executions (
    partition VARCHAR(10) NOT NULL REFERENCES partitions (name), scope TEXT NOT NULL, id TEXT NOT NULL,
    payload BYTEA NOT NULL, fingerprint CHAR(64) NOT NULL, state VARCHAR(32) NOT NULL,
    version BIGINT NOT NULL CHECK (version > 0), next_due_ms BIGINT, pending BOOLEAN NOT NULL,
    worker_id VARCHAR(64), machine_name VARCHAR(31),
    slots BIGINT NOT NULL CHECK (slots >= 0), cpus BIGINT NOT NULL CHECK (cpus >= 0),
    memory_mb BIGINT NOT NULL CHECK (memory_mb >= 0), disk_gb BIGINT NOT NULL CHECK (disk_gb >= 0),
    managed_machine TEXT, PRIMARY KEY (partition, scope, id));
CREATE INDEX IF NOT EXISTS executions_due ON executions (partition, next_due_ms, scope, id)
    WHERE next_due_ms IS NOT NULL;
CREATE INDEX IF NOT EXISTS executions_state ON executions (partition, state);
CREATE INDEX IF NOT EXISTS executions_pending ON executions (partition) WHERE pending;
CREATE INDEX IF NOT EXISTS executions_worker ON executions (partition, worker_id)
    WHERE worker_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS executions_machine_commands ON executions (partition, managed_machine)
    WHERE managed_machine IS NOT NULL;
CREATE TABLE IF NOT EXISTS machines (
    partition VARCHAR(10) NOT NULL REFERENCES partitions (name), scope TEXT NOT NULL, id TEXT NOT NULL,
    payload BYTEA NOT NULL, fingerprint CHAR(64) NOT NULL, state VARCHAR(32) NOT NULL,
    version BIGINT NOT NULL CHECK (version > 0), next_due_ms BIGINT, pending BOOLEAN NOT NULL,
    worker_id VARCHAR(64), machine_name VARCHAR(31),
    slots BIGINT NOT NULL CHECK (slots >= 0), cpus BIGINT NOT NULL CHECK (cpus >= 0),
    memory_mb BIGINT NOT NULL CHECK (memory_mb >= 0), disk_gb BIGINT NOT NULL CHECK (disk_gb >= 0),
    managed_machine TEXT, PRIMARY KEY (partition, scope, id));
CREATE INDEX IF NOT EXISTS machines_worker ON machines (partition, worker_id)
    WHERE worker_id IS NOT NULL;
CREATE UNIQUE INDEX IF NOT EXISTS machines_name ON machines (partition, worker_id, machine_name)
    WHERE worker_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS machines_due ON machines (partition, next_due_ms, scope, id)
    WHERE next_due_ms IS NOT NULL;
CREATE TABLE IF NOT EXISTS machine_identities (
    partition VARCHAR(10) NOT NULL REFERENCES partitions (name), worker_id VARCHAR(64) NOT NULL,
    machine_name VARCHAR(31) NOT NULL, kind VARCHAR(16) NOT NULL, scope TEXT NOT NULL, id TEXT NOT NULL,
    PRIMARY KEY (partition, worker_id, machine_name), UNIQUE (partition, kind, scope, id));
CREATE TABLE IF NOT EXISTS partition_keys (
    partition VARCHAR(10) PRIMARY KEY REFERENCES partitions (name), key_id BIGINT NOT NULL,
    check_value BYTEA NOT NULL);
CREATE TABLE IF NOT EXISTS port_owners (
    partition VARCHAR(10) NOT NULL, worker_id VARCHAR(64) NOT NULL,
    host_port INTEGER NOT NULL CHECK (host_port BETWEEN 1 AND 65535),
    scope TEXT NOT NULL, id TEXT NOT NULL, PRIMARY KEY (partition, worker_id, host_port),
    FOREIGN KEY (partition, scope, id) REFERENCES machines (partition, scope, id));
";

const COLS: &str = "payload, fingerprint, state, version, next_due_ms, pending, worker_id, \
                    machine_name, slots, cpus, memory_mb, disk_gb, managed_machine";

struct Conn {
    client: Client,
    statements: BTreeMap<String, Statement>,
}

/// The PostgreSQL store of one partition.
pub struct PostgresStore {
    connector: Connector,
    conn: Mutex<Option<Conn>>,
    sealer: Sealer,
    /// Durability, rollback marks and commit count.
    handle: Handle,
}

impl core::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        // The URL may hold a password; it is never printed.
        f.debug_struct("PostgresStore")
            .field("sealer", &self.sealer)
            .finish_non_exhaustive()
    }
}

impl PostgresStore {
    /// Connects (libpq key=value or URL string) in plain text to a server
    /// on this host, migrates, and registers the sealer's partition.
    ///
    /// # Errors
    /// `validation` (`postgres_plaintext_remote`) when a host of `url` is
    /// not this machine (use [`PostgresStore::connect_with`] and TLS);
    /// `store` when the server is unreachable or holds a newer layout.
    pub fn connect(url: &str, sealer: Sealer) -> Result<Self, Error> {
        Self::connect_with(url, sealer, &PostgresOptions::new())
    }

    /// [`PostgresStore::connect`] with explicit transport options: TLS
    /// with a caller-supplied CA, or plain text to another host when the
    /// caller allows it.
    ///
    /// # Errors
    /// `validation` for a malformed `url` (`postgres_url`) or a transport
    /// the options refuse; `store` (`postgres_tls` when the TLS layer
    /// refused the server) when the server is unreachable or holds a newer
    /// layout.
    pub fn connect_with(
        url: &str,
        sealer: Sealer,
        options: &PostgresOptions,
    ) -> Result<Self, Error> {
        let store = Self {
            connector: Connector::new(url, options)?,
            conn: Mutex::new(None),
            sealer,
            handle: Handle::new(true),
        };
        store.migrate()?;
        Ok(store)
    }

    fn migrate(&self) -> Result<(), Error> {
        let op = Operation::StoreMigrate;
        let mut attempt = 0;
        let layout = loop {
            attempt += 1;
            match self.migrate_once(op) {
                Err(e) if e.reason() == Reason::PostgresContention && attempt < MAX_ATTEMPTS => {
                    let pause = std::time::Duration::from_millis(1 << attempt.min(6));
                    std::thread::sleep(pause.min(MAX_BACKOFF));
                }
                other => break other?,
            }
        };
        if layout != LAYOUT_VERSION {
            return Err(Error::store(
                op,
                Evidence::Unknown,
                Reason::UnknownLayoutVersion,
            ));
        }
        self.prepare()
    }

    /// One attempt at bringing the schema to this build's layout and
    /// registering the partition; returns the stored layout.
    ///
    /// When the stored layout and schema fingerprint already match this
    /// build, no DDL runs: `CREATE INDEX IF NOT EXISTS` takes a share lock
    /// on its table even when the index exists, and a controller opening
    /// the store while others write would deadlock against them.
    fn migrate_once(&self, op: Operation) -> Result<i64, Error> {
        let partition = self.sealer.partition().to_owned();
        self.with_conn(op, |conn| {
            let mut tx = conn.client.transaction()?;
            let current: Option<(i64, i64)> = tx
                .query_one(
                    "SELECT to_regclass('smolbox_meta') IS NOT NULL",
                    &[],
                )?
                .get::<_, bool>(0)
                .then(|| {
                    tx.query_one(
                        "SELECT (SELECT value FROM smolbox_meta WHERE key = 'layout'), \
                                (SELECT value FROM smolbox_meta WHERE key = 'schema')",
                        &[],
                    )
                })
                .transpose()?
                .and_then(|row| {
                    Some((row.get::<_, Option<i64>>(0)?, row.get::<_, Option<i64>>(1)?))
                });
            if current != Some((LAYOUT_VERSION, SCHEMA_FINGERPRINT)) {
                tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])?;
                tx.batch_execute(SCHEMA_SQL)?;
                tx.execute(
                    "INSERT INTO smolbox_meta (key, value) VALUES ('layout', $1) ON CONFLICT DO NOTHING",
                    &[&LAYOUT_VERSION],
                )?;
                // Layout 1 → 2: the schema above added the key-check table;
                // each partition's rows are re-sealed when it is prepared.
                tx.execute(
                    "UPDATE smolbox_meta SET value = $1 WHERE key = 'layout' AND value = 1",
                    &[&LAYOUT_VERSION],
                )?;
                tx.execute(
                    "INSERT INTO smolbox_meta (key, value) VALUES ('schema', $1) \
                     ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value",
                    &[&SCHEMA_FINGERPRINT],
                )?;
            }
            let layout: i64 = tx
                .query_one("SELECT value FROM smolbox_meta WHERE key = 'layout'", &[])?
                .get(0);
            tx.execute(
                "INSERT INTO partitions (name) VALUES ($1) ON CONFLICT DO NOTHING",
                &[&partition],
            )?;
            tx.commit()?;
            Ok(layout)
        })
    }

    /// Checks this partition's key and re-seals its first-format rows, in
    /// one transaction holding the partition lock (see `prepare_partition`).
    fn prepare(&self) -> Result<(), Error> {
        let op = Operation::StoreMigrate;
        let legacy = self.sealer.with_legacy();
        self.run(&legacy, op, Lock::Partition, &mut |tx| {
            prepare_partition(tx, &legacy)
        })
    }

    /// The down migration: drops every smolbox table, refusing while any
    /// partition still holds execution or machine history.
    ///
    /// # Errors
    /// `store` with reason `history_not_empty` when records exist.
    pub fn drop_schema(&self) -> Result<(), Error> {
        let op = Operation::StoreMigrate;
        let dropped = self.with_conn(op, |conn| {
            let mut tx = conn.client.transaction()?;
            tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])?;
            let n: i64 = tx
                .query_one(
                    "SELECT (SELECT COUNT(*) FROM executions) + (SELECT COUNT(*) FROM machines)",
                    &[],
                )?
                .get(0);
            if n > 0 {
                return Ok(false);
            }
            tx.batch_execute(
                "DROP TABLE port_owners, machine_identities, machines, executions, worker_leases, \
                 partition_keys, partitions, smolbox_meta",
            )?;
            tx.commit()?;
            Ok(true)
        })?;
        if dropped {
            Ok(())
        } else {
            Err(Error::store(op, Evidence::Unknown, Reason::HistoryNotEmpty))
        }
    }

    /// Inserts many records in one transaction (an import, for example
    /// from another store), sending them in batches of 10,000 rows.
    /// Existing identities fail the import.
    ///
    /// # Errors
    /// `validation` for an invalid record; `store` on failure (nothing is
    /// inserted).
    pub fn import(&self, records: &[ExecutionRecord]) -> Result<(), Error> {
        let op = Operation::StoreAccept;
        let mut batches = Vec::new();
        for chunk in records.chunks(10_000) {
            let mut b = Batch::default();
            for r in chunk {
                r.validate().map_err(|e| e.with_operation(op))?;
                let p = Projection::of_exec(r);
                b.scope.push(r.key.scope.clone());
                b.id.push(r.key.id.clone());
                b.payload.push(self.sealer.seal_exec(r)?);
                b.fingerprint.push(p.fingerprint);
                b.state.push(p.state);
                b.version.push(p.version);
                b.next_due_ms.push(p.next_due_ms);
                b.pending.push(p.pending);
                b.worker_id.push(p.worker_id);
                b.machine_name.push(p.machine_name);
                b.slots.push(p.slots);
                b.cpus.push(p.cpus);
                b.memory_mb.push(p.memory_mb);
                b.disk_gb.push(p.disk_gb);
                b.managed_machine.push(p.managed_machine);
            }
            batches.push(b);
        }
        let partition = self.sealer.partition().to_owned();
        self.with_conn(op, |conn| {
            let mut tx = conn.client.transaction()?;
            for b in &batches {
                tx.execute(
                    &format!(
                        "INSERT INTO executions (partition, scope, id, {COLS}) SELECT $1, * FROM UNNEST(\
                         $2::text[], $3::text[], $4::bytea[], $5::text[], $6::text[], $7::bigint[], \
                         $8::bigint[], $9::bool[], $10::text[], $11::text[], $12::bigint[], $13::bigint[], \
                         $14::bigint[], $15::bigint[], $16::text[])"
                    ),
                    &[
                        &partition,
                        &b.scope,
                        &b.id,
                        &b.payload,
                        &b.fingerprint,
                        &b.state,
                        &b.version,
                        &b.next_due_ms,
                        &b.pending,
                        &b.worker_id,
                        &b.machine_name,
                        &b.slots,
                        &b.cpus,
                        &b.memory_mb,
                        &b.disk_gb,
                        &b.managed_machine,
                    ],
                )?;
            }
            tx.commit()
        })
    }

    /// Runs `f` on a live connection, reconnecting when the last one died.
    fn with_conn<R>(
        &self,
        op: Operation,
        mut f: impl FnMut(&mut Conn) -> Result<R, postgres::Error>,
    ) -> Result<R, Error> {
        let mut slot = self.conn.lock().unwrap_or_else(PoisonError::into_inner);
        if slot.as_ref().is_none_or(|c| c.client.is_closed()) {
            let client = self.connector.connect(op)?;
            *slot = Some(Conn {
                client,
                statements: BTreeMap::new(),
            });
        }
        let Some(conn) = slot.as_mut() else {
            return Err(Error::store(
                op,
                Evidence::Unknown,
                Reason::PostgresUnavailable,
            ));
        };
        let out = f(conn);
        if conn.client.is_closed() {
            *slot = None;
        }
        out.map_err(|e| pg_error(op, &e))
    }
}

impl Backend for PostgresStore {
    fn handle(&self) -> &Handle {
        &self.handle
    }

    fn run_transaction<R>(
        &self,
        op: Operation,
        lock: Lock,
        f: &mut dyn FnMut(&mut dyn Tx) -> Result<R, Error>,
    ) -> Result<R, Error> {
        self.run(&self.sealer, op, lock, f)
    }
}

impl PostgresStore {
    /// Runs `f` in one transaction with `sealer`, retrying after deadlock
    /// or serialization failures.
    fn run<R>(
        &self,
        sealer: &Sealer,
        op: Operation,
        lock: Lock,
        f: &mut dyn FnMut(&mut dyn Tx) -> Result<R, Error>,
    ) -> Result<R, Error> {
        let mut slot = self.conn.lock().unwrap_or_else(PoisonError::into_inner);
        let mut attempt = 0;
        loop {
            attempt += 1;
            if slot.as_ref().is_none_or(|c| c.client.is_closed()) {
                let client = self.connector.connect(op)?;
                *slot = Some(Conn {
                    client,
                    statements: BTreeMap::new(),
                });
            }
            let Some(conn) = slot.as_mut() else {
                return Err(Error::store(
                    op,
                    Evidence::Unknown,
                    Reason::PostgresUnavailable,
                ));
            };
            let result = run_once(conn, sealer, op, lock, f);
            if conn.client.is_closed() {
                *slot = None;
            }
            match result {
                Err(Failure::Retry) if attempt < MAX_ATTEMPTS => {
                    let pause = std::time::Duration::from_millis(1 << attempt.min(6));
                    std::thread::sleep(pause.min(MAX_BACKOFF));
                }
                Err(Failure::Retry) => {
                    return Err(Error::store(
                        op,
                        Evidence::Unknown,
                        Reason::PostgresContention,
                    ));
                }
                Err(Failure::Error(e)) => return Err(e),
                Ok(v) => return Ok(v),
            }
        }
    }
}

impl_store!(PostgresStore);

/// Column arrays of one import batch.
#[derive(Default)]
struct Batch {
    scope: Vec<String>,
    id: Vec<String>,
    payload: Vec<Vec<u8>>,
    fingerprint: Vec<String>,
    state: Vec<String>,
    version: Vec<i64>,
    next_due_ms: Vec<Option<i64>>,
    pending: Vec<bool>,
    worker_id: Vec<Option<String>>,
    machine_name: Vec<Option<String>>,
    slots: Vec<i64>,
    cpus: Vec<i64>,
    memory_mb: Vec<i64>,
    disk_gb: Vec<i64>,
    managed_machine: Vec<Option<String>>,
}

enum Failure {
    Retry,
    Error(Error),
}

fn run_once<R>(
    conn: &mut Conn,
    sealer: &Sealer,
    op: Operation,
    lock: Lock,
    f: &mut dyn FnMut(&mut dyn Tx) -> Result<R, Error>,
) -> Result<R, Failure> {
    let classify = |e: postgres::Error| {
        if matches!(
            e.code(),
            Some(c) if *c == SqlState::T_R_DEADLOCK_DETECTED || *c == SqlState::T_R_SERIALIZATION_FAILURE
        ) {
            Failure::Retry
        } else {
            Failure::Error(pg_error(op, &e))
        }
    };
    // Reads and single-record writes run without an explicit transaction:
    // each statement is atomic, and a record write is a compare-and-swap on
    // its version (and on the worker-lease generation that fences it), so
    // the read-modify-write needs two round trips instead of four.
    let session = if lock == Lock::Partition {
        Session::Tx(conn.client.transaction().map_err(classify)?)
    } else {
        Session::Auto(&mut conn.client)
    };
    let mut pg = PgTx {
        session,
        statements: &mut conn.statements,
        sealer,
        op,
        lock,
        retry: false,
        fence: None,
    };
    if lock == Lock::Partition {
        let partition = sealer.partition().to_owned();
        let found = pg
            .query_opt(
                "SELECT name FROM partitions WHERE name = $1 FOR UPDATE",
                &[&partition],
            )
            .map_err(Failure::Error)?;
        if found.is_none() {
            return Err(Failure::Error(Error::store(
                op,
                Evidence::Unknown,
                Reason::PartitionMissing,
            )));
        }
    }
    match f(&mut pg) {
        Ok(v) => {
            if let Session::Tx(tx) = pg.session {
                tx.commit().map_err(classify)?;
            }
            Ok(v)
        }
        Err(_) if pg.retry => Err(Failure::Retry),
        Err(e) => Err(Failure::Error(e)),
    }
}

enum Session<'a> {
    /// A transaction holding the partition lock.
    Tx(Transaction<'a>),
    /// Autocommit statements (reads, compare-and-swap record writes).
    Auto(&'a mut Client),
}

struct PgTx<'a> {
    session: Session<'a>,
    statements: &'a mut BTreeMap<String, Statement>,
    sealer: &'a Sealer,
    op: Operation,
    lock: Lock,
    /// Set when a statement failed with a deadlock or serialization error,
    /// or a compare-and-swap found the row changed: the operation reruns.
    retry: bool,
    /// The worker-lease generation a compare-and-swap write is fenced by.
    fence: Option<(String, i64)>,
}

impl PgTx<'_> {
    fn statement(&mut self, sql: &str) -> Result<Statement, Error> {
        if let Some(s) = self.statements.get(sql) {
            return Ok(s.clone());
        }
        let prepared = match &mut self.session {
            Session::Tx(t) => t.prepare(sql),
            Session::Auto(c) => c.prepare(sql),
        };
        let s = prepared.map_err(|e| self.fail(&e))?;
        self.statements.insert(sql.to_owned(), s.clone());
        Ok(s)
    }

    fn fail(&mut self, e: &postgres::Error) -> Error {
        if matches!(
            e.code(),
            Some(c) if *c == SqlState::T_R_DEADLOCK_DETECTED || *c == SqlState::T_R_SERIALIZATION_FAILURE
        ) {
            self.retry = true;
        }
        pg_error(self.op, e)
    }

    fn query_opt(&mut self, sql: &str, p: &[&(dyn ToSql + Sync)]) -> Result<Option<Row>, Error> {
        let s = self.statement(sql)?;
        let r = match &mut self.session {
            Session::Tx(t) => t.query_opt(&s, p),
            Session::Auto(c) => c.query_opt(&s, p),
        };
        r.map_err(|e| self.fail(&e))
    }

    fn query(&mut self, sql: &str, p: &[&(dyn ToSql + Sync)]) -> Result<Vec<Row>, Error> {
        let s = self.statement(sql)?;
        let r = match &mut self.session {
            Session::Tx(t) => t.query(&s, p),
            Session::Auto(c) => c.query(&s, p),
        };
        r.map_err(|e| self.fail(&e))
    }

    fn execute(&mut self, sql: &str, p: &[&(dyn ToSql + Sync)]) -> Result<u64, Error> {
        let s = self.statement(sql)?;
        let r = match &mut self.session {
            Session::Tx(t) => t.execute(&s, p),
            Session::Auto(c) => c.execute(&s, p),
        };
        r.map_err(|e| self.fail(&e))
    }

    fn row_lock(&self) -> &'static str {
        if self.lock == Lock::Partition {
            " FOR UPDATE"
        } else {
            ""
        }
    }

    fn partition(&self) -> String {
        self.sealer.partition().to_owned()
    }

    fn get_row(
        &mut self,
        table: &str,
        key: &RecordKey,
    ) -> Result<Option<(Vec<u8>, Projection)>, Error> {
        let sql = format!(
            "SELECT {COLS} FROM {table} WHERE partition = $1 AND scope = $2 AND id = $3{}",
            self.row_lock()
        );
        let partition = self.partition();
        let row = self.query_opt(&sql, &[&partition, &key.scope, &key.id])?;
        row.map(|r| read_row(&r).map_err(|e| pg_error(self.op, &e)))
            .transpose()
    }

    fn put_row(
        &mut self,
        table: &str,
        key: &RecordKey,
        payload: &[u8],
        p: &Projection,
        new: bool,
    ) -> Result<(), Error> {
        // Every write moves the version by exactly one: outside the
        // partition lock the row must still hold the version this
        // operation read (compare-and-swap), and the worker lease the
        // generation its guard was checked against.
        let cas = if self.lock == Lock::Partition || new {
            ""
        } else if self.fence.is_some() {
            " AND version = $17 AND EXISTS (SELECT 1 FROM worker_leases l WHERE l.partition = $1 \
             AND l.worker_id = $18 AND l.generation = $19)"
        } else {
            " AND version = $17"
        };
        let sql = if new {
            format!(
                "INSERT INTO {table} (partition, scope, id, {COLS}) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16)"
            )
        } else {
            format!(
                "UPDATE {table} SET payload = $4, fingerprint = $5, state = $6, version = $7, \
                 next_due_ms = $8, pending = $9, worker_id = $10, machine_name = $11, slots = $12, \
                 cpus = $13, memory_mb = $14, disk_gb = $15, managed_machine = $16 \
                 WHERE partition = $1 AND scope = $2 AND id = $3{cas}"
            )
        };
        let partition = self.partition();
        let old_version = p.version - 1;
        let (fence_worker, fence_generation) = self.fence.clone().unwrap_or_default();
        let mut params: Vec<&(dyn ToSql + Sync)> = vec![
            &partition,
            &key.scope,
            &key.id,
            &payload,
            &p.fingerprint,
            &p.state,
            &p.version,
            &p.next_due_ms,
            &p.pending,
            &p.worker_id,
            &p.machine_name,
            &p.slots,
            &p.cpus,
            &p.memory_mb,
            &p.disk_gb,
            &p.managed_machine,
        ];
        if !cas.is_empty() {
            params.push(&old_version);
            if self.fence.is_some() {
                params.push(&fence_worker);
                params.push(&fence_generation);
            }
        }
        let n = self.execute(&sql, &params)?;
        if n == 1 {
            Ok(())
        } else if !cas.is_empty() {
            self.retry = true;
            Err(Error::store(
                self.op,
                Evidence::Unknown,
                Reason::PostgresContention,
            ))
        } else {
            Err(Error::store(
                self.op,
                Evidence::Unknown,
                Reason::RowVanished,
            ))
        }
    }

    fn open_exec(
        &self,
        key: &RecordKey,
        payload: &[u8],
        p: &Projection,
    ) -> Result<ExecutionRecord, Error> {
        crate::row::open_exec_row(self.sealer, key, payload, p, self.op)
    }
}

fn read_row(r: &Row) -> Result<(Vec<u8>, Projection), postgres::Error> {
    Ok((
        r.try_get(0)?,
        Projection {
            fingerprint: r.try_get(1)?,
            state: r.try_get(2)?,
            version: r.try_get(3)?,
            next_due_ms: r.try_get(4)?,
            pending: r.try_get(5)?,
            worker_id: r.try_get(6)?,
            machine_name: r.try_get(7)?,
            slots: r.try_get(8)?,
            cpus: r.try_get(9)?,
            memory_mb: r.try_get(10)?,
            disk_gb: r.try_get(11)?,
            managed_machine: r.try_get(12)?,
        },
    ))
}

impl Tx for PgTx<'_> {
    fn exec(&mut self, key: &RecordKey) -> Result<Option<ExecutionRecord>, Error> {
        match self.get_row("executions", key)? {
            None => Ok(None),
            Some((payload, p)) => self.open_exec(key, &payload, &p).map(Some),
        }
    }

    fn put_exec(&mut self, rec: &ExecutionRecord, new: bool) -> Result<(), Error> {
        let payload = self.sealer.seal_exec_cached(rec)?;
        self.put_row(
            "executions",
            &rec.key,
            &payload,
            &Projection::of_exec(rec),
            new,
        )
    }

    fn pending_count(&mut self) -> Result<u64, Error> {
        let partition = self.partition();
        let rows = self.query(
            "SELECT COUNT(*) FROM executions WHERE partition = $1 AND pending",
            &[&partition],
        )?;
        let n: i64 = rows.first().map_or(0, |r| r.get(0));
        Ok(u64::try_from(n).unwrap_or(0))
    }

    fn machine(&mut self, key: &RecordKey) -> Result<Option<MachineRecord>, Error> {
        match self.get_row("machines", key)? {
            None => Ok(None),
            Some((payload, p)) => self.open_machine(key, &payload, &p).map(Some),
        }
    }

    fn put_machine(&mut self, rec: &MachineRecord, new: bool) -> Result<(), Error> {
        let payload = self.sealer.seal_machine_cached(rec)?;
        self.put_row(
            "machines",
            &rec.key,
            &payload,
            &Projection::of_machine(rec),
            new,
        )
    }

    fn lease(&mut self, worker_id: &str) -> Result<Option<Lease>, Error> {
        let sql = match self.lock {
            Lock::Read => {
                "SELECT owner, generation, until_ms FROM worker_leases WHERE partition = $1 AND worker_id = $2"
            }
            Lock::Record => {
                "SELECT owner, generation, until_ms FROM worker_leases WHERE partition = $1 AND worker_id = $2"
            }
            Lock::Partition => {
                "SELECT owner, generation, until_ms FROM worker_leases WHERE partition = $1 AND worker_id = $2 FOR UPDATE"
            }
        };
        let partition = self.partition();
        let row = self.query_opt(sql, &[&partition, &worker_id])?;
        let lease = row
            .map(|r| lease_of(r.get(0), r.get(1), r.get(2), self.op))
            .transpose()?;
        if self.lock == Lock::Record
            && let Some(l) = &lease
        {
            self.fence = Some((worker_id.to_owned(), int(l.generation)));
        }
        Ok(lease)
    }

    fn put_lease(&mut self, worker_id: &str, lease: &Lease, _new: bool) -> Result<(), Error> {
        let partition = self.partition();
        self.execute(
            "INSERT INTO worker_leases (partition, worker_id, owner, generation, until_ms) \
             VALUES ($1, $2, $3, $4, $5) ON CONFLICT (partition, worker_id) DO UPDATE SET \
             owner = EXCLUDED.owner, generation = EXCLUDED.generation, until_ms = EXCLUDED.until_ms",
            &[&partition, &worker_id, &lease.owner, &int(lease.generation), &int(lease.until_ms)],
        )?;
        Ok(())
    }

    fn assignment(&mut self, worker_id: &str, name: &str) -> Result<Option<Assigned>, Error> {
        let partition = self.partition();
        let row = self.query_opt(
            "SELECT kind, scope, id FROM machine_identities \
             WHERE partition = $1 AND worker_id = $2 AND machine_name = $3",
            &[&partition, &worker_id, &name],
        )?;
        row.map(|r| {
            let kind: String = r.get(0);
            assigned_of(&kind, r.get(1), r.get(2), self.op)
        })
        .transpose()
    }

    fn put_assignment(&mut self, worker_id: &str, name: &str, who: &Assigned) -> Result<(), Error> {
        let (kind, key) = assigned_parts(who);
        let partition = self.partition();
        self.execute(
            "INSERT INTO machine_identities (partition, worker_id, machine_name, kind, scope, id) \
             VALUES ($1, $2, $3, $4, $5, $6)",
            &[
                &partition,
                &worker_id,
                &name,
                &kind.as_str(),
                &key.scope,
                &key.id,
            ],
        )?;
        Ok(())
    }

    fn port_owner(&mut self, worker_id: &str, port: u16) -> Result<Option<RecordKey>, Error> {
        let partition = self.partition();
        let row = self.query_opt(
            "SELECT scope, id FROM port_owners WHERE partition = $1 AND worker_id = $2 AND host_port = $3",
            &[&partition, &worker_id, &i32::from(port)],
        )?;
        Ok(row.map(|r| RecordKey {
            scope: r.get(0),
            id: r.get(1),
        }))
    }

    fn put_port(&mut self, worker_id: &str, port: u16, owner: &RecordKey) -> Result<(), Error> {
        let partition = self.partition();
        self.execute(
            "INSERT INTO port_owners (partition, worker_id, host_port, scope, id) VALUES ($1, $2, $3, $4, $5)",
            &[&partition, &worker_id, &i32::from(port), &owner.scope, &owner.id],
        )?;
        Ok(())
    }

    fn delete_ports(&mut self, owner: &RecordKey) -> Result<(), Error> {
        let partition = self.partition();
        self.execute(
            "DELETE FROM port_owners WHERE partition = $1 AND scope = $2 AND id = $3",
            &[&partition, &owner.scope, &owner.id],
        )?;
        Ok(())
    }

    fn usage(&mut self, worker_id: &str) -> Result<Resources, Error> {
        let partition = self.partition();
        let rows = self.query(
            "SELECT COALESCE(SUM(slots), 0)::BIGINT, COALESCE(SUM(cpus), 0)::BIGINT, \
             COALESCE(SUM(memory_mb), 0)::BIGINT, COALESCE(SUM(disk_gb), 0)::BIGINT FROM ( \
             SELECT slots, cpus, memory_mb, disk_gb FROM executions WHERE partition = $1 AND worker_id = $2 \
             UNION ALL \
             SELECT slots, cpus, memory_mb, disk_gb FROM machines WHERE partition = $1 AND worker_id = $2) u",
            &[&partition, &worker_id],
        )?;
        let Some(r) = rows.first() else {
            return Err(Error::store(
                self.op,
                Evidence::Unknown,
                Reason::UsageMissing,
            ));
        };
        let v = |i: usize| u64::try_from(r.get::<_, i64>(i)).unwrap_or(u64::MAX);
        Ok(Resources {
            slots: v(0),
            cpus: v(1),
            memory_mb: v(2),
            disk_gb: v(3),
        })
    }

    fn due(
        &mut self,
        now_ms: u64,
        after: Option<&DueCursor>,
        limit: u32,
    ) -> Result<Vec<ExecutionRecord>, Error> {
        let rows = self.due_rows("executions", now_ms, after, limit)?;
        rows.into_iter()
            .map(|(key, payload, p)| self.open_exec(&key, &payload, &p))
            .collect()
    }

    fn pending_machines(&mut self) -> Result<u64, Error> {
        let partition = self.partition();
        let rows = self.query(
            "SELECT COUNT(*) FROM machines WHERE partition = $1 AND pending",
            &[&partition],
        )?;
        let n: i64 = rows.first().map_or(0, |r| r.get(0));
        Ok(u64::try_from(n).unwrap_or(0))
    }

    fn due_machines(
        &mut self,
        now_ms: u64,
        after: Option<&DueCursor>,
        limit: u32,
    ) -> Result<Vec<MachineRecord>, Error> {
        let rows = self.due_rows("machines", now_ms, after, limit)?;
        rows.into_iter()
            .map(|(key, payload, p)| self.open_machine(&key, &payload, &p))
            .collect()
    }

    fn list_execs(
        &mut self,
        scope: &str,
        after: Option<&str>,
        limit: u32,
    ) -> Result<Vec<ExecutionRecord>, Error> {
        let rows = self.list_rows("executions", scope, after, limit)?;
        rows.into_iter()
            .map(|(key, payload, p)| self.open_exec(&key, &payload, &p))
            .collect()
    }

    fn list_machines(
        &mut self,
        scope: &str,
        after: Option<&str>,
        limit: u32,
    ) -> Result<Vec<MachineRecord>, Error> {
        let rows = self.list_rows("machines", scope, after, limit)?;
        rows.into_iter()
            .map(|(key, payload, p)| self.open_machine(&key, &payload, &p))
            .collect()
    }

    fn key_check(&mut self) -> Result<Option<Vec<u8>>, Error> {
        let partition = self.partition();
        let row = self.query_opt(
            "SELECT check_value FROM partition_keys WHERE partition = $1",
            &[&partition],
        )?;
        row.map(|r| r.try_get(0).map_err(|e| pg_error(self.op, &e)))
            .transpose()
    }

    fn put_key_check(&mut self, check: &[u8]) -> Result<(), Error> {
        let partition = self.partition();
        self.execute(
            "INSERT INTO partition_keys (partition, key_id, check_value) VALUES ($1, $2, $3)",
            &[&partition, &i64::from(KEY_ID), &check],
        )?;
        Ok(())
    }

    fn row_formats(&mut self) -> Result<Vec<(RecordKind, RecordKey, bool)>, Error> {
        let partition = self.partition();
        let mut out = Vec::new();
        for (table, kind) in [
            ("executions", RecordKind::Execution),
            ("machines", RecordKind::Machine),
        ] {
            let sql = format!(
                "SELECT scope, id, get_byte(payload, 0) = $2 FROM {table} WHERE partition = $1"
            );
            for r in self.query(&sql, &[&partition, &i32::from(SEALED_V2)])? {
                let key = RecordKey {
                    scope: r.try_get(0).map_err(|e| pg_error(self.op, &e))?,
                    id: r.try_get(1).map_err(|e| pg_error(self.op, &e))?,
                };
                let current: bool = r.try_get(2).map_err(|e| pg_error(self.op, &e))?;
                out.push((kind, key, current));
            }
        }
        Ok(out)
    }
}

/// A row of a scan: its key, sealed payload and projected columns.
type ScanRow = (RecordKey, Vec<u8>, Projection);

impl PgTx<'_> {
    fn open_machine(
        &self,
        key: &RecordKey,
        payload: &[u8],
        p: &Projection,
    ) -> Result<MachineRecord, Error> {
        crate::row::open_machine_row(self.sealer, key, payload, p, self.op)
    }

    fn scan(&mut self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<Vec<ScanRow>, Error> {
        let rows = self.query(sql, params)?;
        let mut out = Vec::with_capacity(rows.len());
        for r in rows {
            let (payload, p) = read_row(&r).map_err(|e| pg_error(self.op, &e))?;
            let key = RecordKey {
                scope: r.try_get(13).map_err(|e| pg_error(self.op, &e))?,
                id: r.try_get(14).map_err(|e| pg_error(self.op, &e))?,
            };
            out.push((key, payload, p));
        }
        Ok(out)
    }

    fn due_rows(
        &mut self,
        table: &str,
        now_ms: u64,
        after: Option<&DueCursor>,
        limit: u32,
    ) -> Result<Vec<ScanRow>, Error> {
        let (due, scope, id) = after.map_or((-1, String::new(), String::new()), |c| {
            (int(c.due_at_ms), c.key.scope.clone(), c.key.id.clone())
        });
        let sql = format!(
            "SELECT {COLS}, scope, id FROM {table} WHERE partition = $1 AND next_due_ms IS NOT NULL \
             AND next_due_ms <= $2 AND (next_due_ms, scope, id) > ($3, $4, $5) \
             ORDER BY next_due_ms, scope, id LIMIT $6"
        );
        let partition = self.partition();
        self.scan(
            &sql,
            &[
                &partition,
                &int(now_ms),
                &due,
                &scope,
                &id,
                &i64::from(limit),
            ],
        )
    }

    fn list_rows(
        &mut self,
        table: &str,
        scope: &str,
        after: Option<&str>,
        limit: u32,
    ) -> Result<Vec<ScanRow>, Error> {
        // An empty string sorts before every identifier.
        let after = after.unwrap_or("");
        let sql = format!(
            "SELECT {COLS}, scope, id FROM {table} WHERE partition = $1 AND scope = $2 AND id > $3 \
             ORDER BY id LIMIT $4"
        );
        let partition = self.partition();
        self.scan(&sql, &[&partition, &scope, &after, &i64::from(limit)])
    }
}
