//! The embedded default adapter: one SQLite file in WAL mode (bundled
//! SQLite). Every mutation runs in `BEGIN IMMEDIATE`, which takes SQLite's
//! write lock up front, so several processes on one host serialize their
//! writes through the file lock (with a busy timeout) and a read-modify-write
//! never races. Payloads are sealed ([`Sealer`]); projected columns are
//! checked against the decrypted payload on every read.
//!
//! Durability: `synchronous = FULL` by default (every commit reaches the
//! disk); [`SqliteOptions::synchronous_normal`] trades the last commits
//! before an OS crash or power loss for speed (WAL keeps the file
//! consistent either way). A store opened that way reports
//! `durable: false` in [`StoreInfo`], so a durable runtime refuses it
//! unless its ephemeral mode is explicit.
//!
//! Cost per write (session 11, docs/decisions/store.md "Store: SQLite cost
//! per command"): `BEGIN` / `COMMIT` are cached statements ([`Open`]); the
//! record tables are rowid tables (a sealed record overflowed a `WITHOUT
//! ROWID` cell); an update names an indexed column only when it changes
//! (`columns`); a handle answers reads of the records it committed last
//! while the file's data version says no other connection committed since
//! (`written`).

use smolbox_core::Evidence;
use smolbox_core::Reason;
use std::path::Path;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use rusqlite::config::DbConfig;
use rusqlite::{
    Connection, OpenFlags, OptionalExtension, Row, Transaction, TransactionBehavior, params,
};
use smolbox_core::managed::record::Resources;
use smolbox_core::managed::{ExecutionRecord, Lease, MachineRecord, RecordKey, RecordKind};
use smolbox_core::{Error, Operation};

use crate::engine::{Backend, Handle, Lock, Tx, assigned_parts, prepare_partition};
use crate::row::{Projection, assigned_of, int, lease_of};
use crate::seal::KEY_ID;
use crate::{Assigned, DueCursor, Sealer, impl_store};

mod columns;
mod written;
use columns::{Indexed, Table};
use written::{Pending, Written};

/// Schema version of the SQLite layout: 2 adds the partitions' key-check
/// values and the current sealed format (version-bound, with a key id).
const LAYOUT_VERSION: i64 = 2;
/// Compiled statements kept per connection.
const STATEMENT_CACHE: usize = 64;
/// How long a writer waits for another process's write lock.
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

const SCHEMA_SQL: &str = "
CREATE TABLE IF NOT EXISTS smolbox_meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS worker_leases (
    partition TEXT NOT NULL, worker_id TEXT NOT NULL, owner TEXT NOT NULL,
    generation INTEGER NOT NULL CHECK (generation > 0), until_ms INTEGER NOT NULL CHECK (until_ms >= 0),
    PRIMARY KEY (partition, worker_id));
CREATE TABLE IF NOT EXISTS executions (
    partition TEXT NOT NULL, scope TEXT NOT NULL, id TEXT NOT NULL, payload BLOB NOT NULL,
    fingerprint TEXT NOT NULL CHECK (length(fingerprint) = 64), state TEXT NOT NULL,
    version INTEGER NOT NULL CHECK (version > 0), next_due_ms INTEGER, pending INTEGER NOT NULL,
    worker_id TEXT, machine_name TEXT,
    slots INTEGER NOT NULL CHECK (slots >= 0), cpus INTEGER NOT NULL CHECK (cpus >= 0),
    memory_mb INTEGER NOT NULL CHECK (memory_mb >= 0), disk_gb INTEGER NOT NULL CHECK (disk_gb >= 0),
    managed_machine TEXT,
    PRIMARY KEY (partition, scope, id));
CREATE INDEX IF NOT EXISTS executions_due ON executions (partition, next_due_ms, scope, id)
    WHERE next_due_ms IS NOT NULL;
CREATE INDEX IF NOT EXISTS executions_pending ON executions (partition) WHERE pending = 1;
CREATE INDEX IF NOT EXISTS executions_worker ON executions (partition, worker_id)
    WHERE worker_id IS NOT NULL;
CREATE TABLE IF NOT EXISTS machines (
    partition TEXT NOT NULL, scope TEXT NOT NULL, id TEXT NOT NULL, payload BLOB NOT NULL,
    fingerprint TEXT NOT NULL CHECK (length(fingerprint) = 64), state TEXT NOT NULL,
    version INTEGER NOT NULL CHECK (version > 0), next_due_ms INTEGER, pending INTEGER NOT NULL,
    worker_id TEXT, machine_name TEXT,
    slots INTEGER NOT NULL CHECK (slots >= 0), cpus INTEGER NOT NULL CHECK (cpus >= 0),
    memory_mb INTEGER NOT NULL CHECK (memory_mb >= 0), disk_gb INTEGER NOT NULL CHECK (disk_gb >= 0),
    managed_machine TEXT,
    PRIMARY KEY (partition, scope, id));
CREATE INDEX IF NOT EXISTS machines_worker ON machines (partition, worker_id)
    WHERE worker_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS machines_due ON machines (partition, next_due_ms, scope, id)
    WHERE next_due_ms IS NOT NULL;
CREATE TABLE IF NOT EXISTS machine_identities (
    partition TEXT NOT NULL, worker_id TEXT NOT NULL, machine_name TEXT NOT NULL,
    kind TEXT NOT NULL, scope TEXT NOT NULL, id TEXT NOT NULL,
    PRIMARY KEY (partition, worker_id, machine_name), UNIQUE (partition, kind, scope, id));
CREATE TABLE IF NOT EXISTS partition_keys (
    partition TEXT PRIMARY KEY, key_id INTEGER NOT NULL, check_value BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS port_owners (
    partition TEXT NOT NULL, worker_id TEXT NOT NULL,
    host_port INTEGER NOT NULL CHECK (host_port BETWEEN 1 AND 65535),
    scope TEXT NOT NULL, id TEXT NOT NULL,
    PRIMARY KEY (partition, worker_id, host_port));
";

const COLS: &str = "payload, fingerprint, state, version, next_due_ms, pending, worker_id, \
                    machine_name, slots, cpus, memory_mb, disk_gb, managed_machine";

/// How the file is opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SqliteMode {
    /// Create or migrate the schema; reads and writes.
    ReadWrite,
    /// Open an existing store for reads only (every write is a `store` error).
    ReadOnly,
}

/// Options of [`SqliteStore::open_with`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SqliteOptions {
    /// Read-write (default) or read-only.
    pub mode: SqliteMode,
    /// `synchronous = NORMAL` instead of `FULL` (see the module docs); the
    /// store then reports itself non-durable.
    pub synchronous_normal: bool,
}

impl Default for SqliteOptions {
    fn default() -> Self {
        Self {
            mode: SqliteMode::ReadWrite,
            synchronous_normal: false,
        }
    }
}

/// The embedded SQLite store.
#[derive(Debug)]
pub struct SqliteStore {
    conn: Mutex<Connection>,
    sealer: Sealer,
    /// The records this handle committed last ([`written`]).
    written: Mutex<Written>,
    /// Durability (false under `synchronous = NORMAL`: a committed write
    /// may be lost to an OS crash or power loss), rollback marks and
    /// commit count.
    handle: Handle,
}

impl SqliteStore {
    /// Opens (creating and migrating when needed) the store file at `path`.
    ///
    /// # Errors
    /// `store` when the file cannot be opened or holds a newer layout.
    pub fn open(path: &Path, sealer: Sealer) -> Result<Self, Error> {
        Self::open_with(path, sealer, SqliteOptions::default())
    }

    /// Opens with explicit options.
    ///
    /// # Errors
    /// As [`SqliteStore::open`]; a read-only open of a file without the
    /// schema is a `store` error.
    pub fn open_with(path: &Path, sealer: Sealer, options: SqliteOptions) -> Result<Self, Error> {
        let op = Operation::StoreMigrate;
        let flags = match options.mode {
            SqliteMode::ReadWrite => {
                OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE
            }
            SqliteMode::ReadOnly => OpenFlags::SQLITE_OPEN_READ_ONLY,
        } | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        if options.mode == SqliteMode::ReadWrite {
            create_private(path)?;
        }
        let mut conn = Connection::open_with_flags(path, flags).map_err(|e| sql_error(op, &e))?;
        conn.busy_timeout(BUSY_TIMEOUT)
            .map_err(|e| sql_error(op, &e))?;
        // Room for every statement of this module (the updates have up to
        // eight forms per table, `columns`): a statement pushed out of the
        // cache is compiled again at its next use.
        conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
        // Query planner stability (QPSG): without it a statement whose plan
        // might depend on a bound value (the due scan's `LIMIT ?`) is
        // compiled again at every execution (issue 16: that re-prepare was
        // a fifth of the store thread's work per command). Plans here never
        // depend on values: every query has a fixed index.
        conn.set_db_config(DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)
            .map_err(|e| sql_error(op, &e))?;
        let sync = if options.synchronous_normal {
            "NORMAL"
        } else {
            "FULL"
        };
        if options.mode == SqliteMode::ReadWrite {
            set_wal(&conn).map_err(|e| sql_error(op, &e))?;
            conn.execute_batch(&format!("PRAGMA synchronous = {sync};"))
                .map_err(|e| sql_error(op, &e))?;
            // IMMEDIATE: a deferred transaction that reads the schema and
            // then writes gets SQLITE_BUSY at once (no busy wait) when
            // another process migrates the same file concurrently.
            let tx = conn
                .transaction_with_behavior(TransactionBehavior::Immediate)
                .map_err(|e| sql_error(op, &e))?;
            let moved = move_aside_without_rowid(&tx).map_err(|e| sql_error(op, &e))?;
            tx.execute_batch(SCHEMA_SQL)
                .map_err(|e| sql_error(op, &e))?;
            copy_back(&tx, &moved).map_err(|e| sql_error(op, &e))?;
            match read_layout(&tx)? {
                None => {
                    tx.execute(
                        "INSERT INTO smolbox_meta (key, value) VALUES ('layout', ?1)",
                        [LAYOUT_VERSION],
                    )
                    .map_err(|e| sql_error(op, &e))?;
                }
                // Layout 1 → 2: the schema above added the key-check table;
                // each partition's rows are re-sealed when it is prepared.
                Some(1) => {
                    tx.execute(
                        "UPDATE smolbox_meta SET value = ?1 WHERE key = 'layout'",
                        [LAYOUT_VERSION],
                    )
                    .map_err(|e| sql_error(op, &e))?;
                }
                Some(LAYOUT_VERSION) => {}
                Some(_) => {
                    return Err(Error::store(
                        op,
                        Evidence::Unknown,
                        Reason::UnknownLayoutVersion,
                    ));
                }
            }
            let legacy = sealer.with_legacy();
            prepare_partition(
                &mut SqliteTx {
                    tx: &tx,
                    sealer: &legacy,
                    op,
                    written: None,
                    pending: Pending::default(),
                    indexed: Vec::new(),
                },
                &legacy,
            )?;
            tx.commit().map_err(|e| sql_error(op, &e))?;
            // SQLite gives the WAL and the shared-memory file the database
            // file's mode; tighten any left from an older, looser file.
            for suffix in ["-wal", "-shm"] {
                let mut name = path.as_os_str().to_os_string();
                name.push(suffix);
                tighten(Path::new(&name))?;
            }
        } else {
            let tx = conn.transaction().map_err(|e| sql_error(op, &e))?;
            match read_layout(&tx)? {
                Some(LAYOUT_VERSION) => {}
                Some(1) => {
                    return Err(Error::store(
                        op,
                        Evidence::Unknown,
                        Reason::LayoutNeedsMigration,
                    ));
                }
                Some(_) => {
                    return Err(Error::store(
                        op,
                        Evidence::Unknown,
                        Reason::UnknownLayoutVersion,
                    ));
                }
                None => return Err(Error::store(op, Evidence::Unknown, Reason::SchemaMissing)),
            }
            let check: Option<Vec<u8>> = tx
                .query_row(
                    "SELECT check_value FROM partition_keys WHERE partition = ?1",
                    [sealer.partition()],
                    |r| r.get(0),
                )
                .optional()
                .map_err(|e| sql_error(op, &e))?;
            if let Some(c) = check {
                sealer.verify_key_check(&c)?;
            }
        }
        Ok(Self {
            conn: Mutex::new(conn),
            sealer,
            written: Mutex::default(),
            handle: Handle::new(!options.synchronous_normal),
        })
    }
}

/// The tables holding sealed records, with their indexes. They are rowid
/// tables (session 11): a sealed record of a command is about 1.3 KB, over
/// the most a `WITHOUT ROWID` table keeps in its b-tree cell on a 4 KiB
/// page (about 1 KB), so every such row had an overflow page of its own,
/// and every update freed it and allocated another (the freelist trunk and
/// the header page written too): 5–8 WAL frames per commit instead of 2–3.
/// A rowid table keeps up to about 4 KB in the cell. Every statement of
/// this module is the same on both shapes; the layout version does not
/// change (a binary of layout 2 reads and writes either shape).
const RECORD_TABLES: [(&str, &[&str]); 2] = [
    (
        "executions",
        &["executions_due", "executions_pending", "executions_worker"],
    ),
    ("machines", &["machines_worker", "machines_due"]),
];

/// Renames each record table still made `WITHOUT ROWID` (a file created
/// before session 11) to `<table>_old` and drops its indexes, so the schema
/// creates the rowid table and its indexes; [`copy_back`] then moves the
/// rows, all in the open's one transaction. Returns the tables moved.
fn move_aside_without_rowid(tx: &Transaction<'_>) -> rusqlite::Result<Vec<&'static str>> {
    let mut moved = Vec::new();
    for (table, indexes) in RECORD_TABLES {
        let sql: Option<String> = tx
            .query_row(
                "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?1",
                [table],
                |r| r.get(0),
            )
            .optional()?;
        if sql.is_some_and(|s| s.to_ascii_uppercase().contains("WITHOUT ROWID")) {
            for index in indexes {
                tx.execute_batch(&format!("DROP INDEX IF EXISTS {index};"))?;
            }
            tx.execute_batch(&format!("ALTER TABLE {table} RENAME TO {table}_old;"))?;
            moved.push(table);
        }
    }
    Ok(moved)
}

/// Copies the rows of each table [`move_aside_without_rowid`] moved into
/// the new table of the same columns, and drops the old one.
fn copy_back(tx: &Transaction<'_>, moved: &[&str]) -> rusqlite::Result<()> {
    for table in moved {
        tx.execute_batch(&format!(
            "INSERT INTO {table} SELECT * FROM {table}_old; DROP TABLE {table}_old;"
        ))?;
    }
    Ok(())
}

fn read_layout(tx: &Transaction<'_>) -> Result<Option<i64>, Error> {
    let op = Operation::StoreMigrate;
    let exists: bool = tx
        .query_row(
            "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'smolbox_meta')",
            [],
            |r| r.get(0),
        )
        .map_err(|e| sql_error(op, &e))?;
    if !exists {
        return Ok(None);
    }
    tx.query_row(
        "SELECT value FROM smolbox_meta WHERE key = 'layout'",
        [],
        |r| r.get(0),
    )
    .optional()
    .map_err(|e| sql_error(op, &e))
}

/// Creates the database file with mode 0600 when it does not exist yet, and
/// tightens an existing one to 0600 (C18.4: records, even sealed, are the
/// owner's only).
fn create_private(path: &Path) -> Result<(), Error> {
    use std::os::unix::fs::OpenOptionsExt;
    let created = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path);
    match created {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => tighten(path),
        Err(_) => Err(Error::store(
            Operation::StoreMigrate,
            Evidence::Unknown,
            Reason::SqliteCannotOpen,
        )),
    }
}

/// Removes group and other permissions from `path` if it exists.
fn tighten(path: &Path) -> Result<(), Error> {
    use std::os::unix::fs::PermissionsExt;
    match std::fs::metadata(path) {
        Ok(m) if m.permissions().mode() & 0o077 != 0 => {
            let mode = m.permissions().mode() & 0o700;
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(|_| {
                Error::store(
                    Operation::StoreMigrate,
                    Evidence::Unknown,
                    Reason::SqlitePermissions,
                )
            })
        }
        _ => Ok(()),
    }
}

impl SqliteStore {
    /// Inserts many records in one transaction (an import, for example
    /// from another store). Existing identities fail the import.
    ///
    /// # Errors
    /// `validation` for an invalid record; `store` on failure (nothing is
    /// inserted).
    pub fn import(&self, records: &[ExecutionRecord]) -> Result<(), Error> {
        self.transact(Operation::StoreAccept, Lock::Partition, &mut |tx| {
            for r in records {
                r.validate()?;
                tx.put_exec(r, true)?;
            }
            Ok(())
        })
    }
}

impl Backend for SqliteStore {
    fn handle(&self) -> &Handle {
        &self.handle
    }

    fn run_transaction<R>(
        &self,
        op: Operation,
        lock: Lock,
        f: &mut dyn FnMut(&mut dyn Tx) -> Result<R, Error>,
    ) -> Result<R, Error> {
        // The connection has no state a panic could leave half-written
        // outside a transaction, which rolls back when dropped.
        let conn = self.conn.lock().unwrap_or_else(PoisonError::into_inner);
        let begin = match lock {
            Lock::Read => BEGIN_DEFERRED,
            Lock::Record | Lock::Partition => BEGIN_IMMEDIATE,
        };
        let tx = Open::begin(&conn, begin).map_err(|e| sql_error(op, &e))?;
        let data_version = data_version(&conn).map_err(|e| sql_error(op, &e))?;
        let trusted = self.written().begin(data_version);
        let mut stx = SqliteTx {
            tx: &conn,
            sealer: &self.sealer,
            op,
            written: trusted.then_some(&self.written),
            pending: Pending::default(),
            indexed: Vec::new(),
        };
        let out = f(&mut stx).and_then(|out| {
            tx.commit().map_err(|e| sql_error(op, &e))?;
            Ok(out)
        });
        let pending = stx.pending;
        match &out {
            Ok(_) if lock != Lock::Read => self.written().committed(data_version, pending),
            Ok(_) => {}
            Err(_) => self.written().forget(),
        }
        out
    }
}

impl_store!(SqliteStore);

impl SqliteStore {
    fn written(&self) -> std::sync::MutexGuard<'_, Written> {
        lock_written(&self.written)
    }
}

fn lock_written(w: &Mutex<Written>) -> std::sync::MutexGuard<'_, Written> {
    // Every update leaves the entries consistent (and a panic inside a
    // transaction never reaches `committed`).
    w.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The connection's `PRAGMA data_version` inside an open transaction
/// (the pragma reads it at the transaction's snapshot).
fn data_version(conn: &Connection) -> rusqlite::Result<i64> {
    conn.prepare_cached("PRAGMA data_version")?
        .query_row([], |r| r.get(0))
}

/// `BEGIN` of a read: its snapshot is taken at the first read.
const BEGIN_DEFERRED: &str = "BEGIN DEFERRED";
/// `BEGIN` of a write: takes SQLite's write lock up front (the module docs).
const BEGIN_IMMEDIATE: &str = "BEGIN IMMEDIATE";

/// One open transaction on the connection, begun and committed through the
/// connection's statement cache (session 11: rusqlite's `Transaction`
/// compiles `BEGIN` and `COMMIT` again at every transaction, about 15 k
/// instructions per buffered command). Dropped without [`Open::commit`]
/// (an error, a panic, a failed `COMMIT`) it rolls back, as rusqlite's does.
struct Open<'a> {
    conn: &'a Connection,
    committed: bool,
}

impl<'a> Open<'a> {
    fn begin(conn: &'a Connection, begin: &'static str) -> rusqlite::Result<Self> {
        conn.prepare_cached(begin)?.execute([])?;
        Ok(Self {
            conn,
            committed: false,
        })
    }

    fn commit(mut self) -> rusqlite::Result<()> {
        self.conn.prepare_cached("COMMIT")?.execute([])?;
        self.committed = true;
        Ok(())
    }
}

impl Drop for Open<'_> {
    fn drop(&mut self) {
        // SQLite may have rolled back already (some errors end the
        // transaction); a second ROLLBACK would only fail.
        if !self.committed && !self.conn.is_autocommit() {
            // Nothing to report to: the operation already failed. A failed
            // rollback leaves the transaction open, and the next BEGIN on
            // this connection then fails loudly (never a silent nest).
            let _ = self.conn.execute_batch("ROLLBACK");
        }
    }
}

struct SqliteTx<'a> {
    tx: &'a Connection,
    sealer: &'a Sealer,
    op: Operation,
    /// The handle's last written records, when this transaction's data
    /// version says they still hold ([`written`]).
    written: Option<&'a Mutex<Written>>,
    /// What this transaction wrote.
    pending: Pending,
    /// The indexed columns of each record row this transaction read or
    /// wrote, as the row holds them now ([`Indexed`]).
    indexed: Vec<(Table, RecordKey, Indexed)>,
}

fn read_row(row: &Row<'_>) -> rusqlite::Result<(Vec<u8>, Projection)> {
    Ok((
        row.get(0)?,
        Projection {
            fingerprint: row.get(1)?,
            state: row.get(2)?,
            version: row.get(3)?,
            next_due_ms: row.get(4)?,
            pending: row.get(5)?,
            worker_id: row.get(6)?,
            machine_name: row.get(7)?,
            slots: row.get(8)?,
            cpus: row.get(9)?,
            memory_mb: row.get(10)?,
            disk_gb: row.get(11)?,
            managed_machine: row.get(12)?,
        },
    ))
}

impl SqliteTx<'_> {
    fn err(&self, e: &rusqlite::Error) -> Error {
        sql_error(self.op, e)
    }

    fn partition(&self) -> &str {
        self.sealer.partition()
    }

    fn get_row(
        &self,
        table: &str,
        key: &RecordKey,
    ) -> Result<Option<(Vec<u8>, Projection)>, Error> {
        let sql =
            format!("SELECT {COLS} FROM {table} WHERE partition = ?1 AND scope = ?2 AND id = ?3");
        let mut stmt = self.tx.prepare_cached(&sql).map_err(|e| self.err(&e))?;
        stmt.query_row(params![self.partition(), key.scope, key.id], read_row)
            .optional()
            .map_err(|e| self.err(&e))
    }

    fn put_row(
        &mut self,
        table: Table,
        key: &RecordKey,
        payload: &[u8],
        p: &Projection,
        new: bool,
    ) -> Result<(), Error> {
        let now = Indexed::of(p);
        let sql = if new {
            table.insert_sql()
        } else {
            let changed = match self
                .indexed
                .iter()
                .find(|(t, k, _)| *t == table && k == key)
            {
                Some((_, _, before)) => before.changed(&now),
                None => Indexed::ALL,
            };
            table.update_sql(changed)
        };
        let mut stmt = self.tx.prepare_cached(sql).map_err(|e| self.err(&e))?;
        let n = stmt
            .execute(params![
                self.partition(),
                key.scope,
                key.id,
                payload,
                p.fingerprint,
                p.state,
                p.version,
                p.next_due_ms,
                p.pending,
                p.worker_id,
                p.machine_name,
                p.slots,
                p.cpus,
                p.memory_mb,
                p.disk_gb,
                p.managed_machine
            ])
            .map_err(|e| self.err(&e))?;
        if n == 1 {
            self.know(table, key, now);
            Ok(())
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

    /// Notes the indexed columns a row of `table` holds now (as read, or
    /// as this transaction wrote them).
    fn know(&mut self, table: Table, key: &RecordKey, now: Indexed) {
        match self
            .indexed
            .iter_mut()
            .find(|(t, k, _)| *t == table && k == key)
        {
            Some((_, _, before)) => *before = now,
            None => self.indexed.push((table, key.clone(), now)),
        }
    }

    /// When the data version says this handle's last written records
    /// still hold ([`written`]): the execution record this transaction
    /// wrote last, else the one of the handle's last commit.
    fn written_exec(&self, key: &RecordKey) -> Option<ExecutionRecord> {
        let written = self.written?;
        if let Some(rec) = self.pending.execs.iter().rev().find(|r| &r.key == key) {
            return Some(ExecutionRecord::clone(rec));
        }
        lock_written(written).exec(key)
    }

    /// As [`SqliteTx::written_exec`] for a machine record.
    fn written_machine(&self, key: &RecordKey) -> Option<MachineRecord> {
        let written = self.written?;
        if let Some(rec) = self.pending.machines.iter().rev().find(|r| &r.key == key) {
            return Some(MachineRecord::clone(rec));
        }
        lock_written(written).machine(key)
    }
}

impl Tx for SqliteTx<'_> {
    fn exec(&mut self, key: &RecordKey) -> Result<Option<ExecutionRecord>, Error> {
        let rec = match self.written_exec(key) {
            Some(rec) => Some(rec),
            None => match self.get_row("executions", key)? {
                None => None,
                Some((payload, p)) => Some(self.open_exec(key, &payload, &p)?),
            },
        };
        if let Some(r) = &rec {
            self.know(Table::Executions, key, Indexed::of_exec(r));
        }
        Ok(rec)
    }

    fn put_exec(&mut self, rec: &ExecutionRecord, new: bool) -> Result<(), Error> {
        let (payload, shared) = self.sealer.seal_exec_shared(rec)?;
        self.put_row(
            Table::Executions,
            &rec.key,
            &payload,
            &Projection::of_exec(rec),
            new,
        )?;
        self.pending.execs.push(shared);
        Ok(())
    }

    fn pending_count(&mut self) -> Result<u64, Error> {
        let mut stmt = self
            .tx
            .prepare_cached("SELECT COUNT(*) FROM executions WHERE partition = ?1 AND pending = 1")
            .map_err(|e| self.err(&e))?;
        let n: i64 = stmt
            .query_row([self.partition()], |r| r.get(0))
            .map_err(|e| self.err(&e))?;
        Ok(u64::try_from(n).unwrap_or(0))
    }

    fn machine(&mut self, key: &RecordKey) -> Result<Option<MachineRecord>, Error> {
        let rec = match self.written_machine(key) {
            Some(rec) => Some(rec),
            None => match self.get_row("machines", key)? {
                None => None,
                Some((payload, p)) => Some(self.open_machine(key, &payload, &p)?),
            },
        };
        if let Some(r) = &rec {
            self.know(Table::Machines, key, Indexed::of_machine(r));
        }
        Ok(rec)
    }

    fn put_machine(&mut self, rec: &MachineRecord, new: bool) -> Result<(), Error> {
        let (payload, shared) = self.sealer.seal_machine_shared(rec)?;
        self.put_row(
            Table::Machines,
            &rec.key,
            &payload,
            &Projection::of_machine(rec),
            new,
        )?;
        self.pending.machines.push(shared);
        Ok(())
    }

    fn lease(&mut self, worker_id: &str) -> Result<Option<Lease>, Error> {
        let mut stmt = self
            .tx
            .prepare_cached(
                "SELECT owner, generation, until_ms FROM worker_leases WHERE partition = ?1 AND worker_id = ?2",
            )
            .map_err(|e| self.err(&e))?;
        let row: Option<(String, i64, i64)> = stmt
            .query_row(params![self.partition(), worker_id], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?))
            })
            .optional()
            .map_err(|e| self.err(&e))?;
        row.map(|(owner, generation, until)| lease_of(owner, generation, until, self.op))
            .transpose()
    }

    fn put_lease(&mut self, worker_id: &str, lease: &Lease, _new: bool) -> Result<(), Error> {
        let mut stmt = self
            .tx
            .prepare_cached(
                "INSERT INTO worker_leases (partition, worker_id, owner, generation, until_ms) \
                 VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT (partition, worker_id) DO UPDATE SET \
                 owner = excluded.owner, generation = excluded.generation, until_ms = excluded.until_ms",
            )
            .map_err(|e| self.err(&e))?;
        stmt.execute(params![
            self.partition(),
            worker_id,
            lease.owner,
            int(lease.generation),
            int(lease.until_ms)
        ])
        .map_err(|e| self.err(&e))?;
        Ok(())
    }

    fn assignment(&mut self, worker_id: &str, name: &str) -> Result<Option<Assigned>, Error> {
        let mut stmt = self
            .tx
            .prepare_cached(
                "SELECT kind, scope, id FROM machine_identities \
                 WHERE partition = ?1 AND worker_id = ?2 AND machine_name = ?3",
            )
            .map_err(|e| self.err(&e))?;
        let row: Option<(String, String, String)> = stmt
            .query_row(params![self.partition(), worker_id, name], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?))
            })
            .optional()
            .map_err(|e| self.err(&e))?;
        row.map(|(kind, scope, id)| assigned_of(&kind, scope, id, self.op))
            .transpose()
    }

    fn put_assignment(&mut self, worker_id: &str, name: &str, who: &Assigned) -> Result<(), Error> {
        let (kind, key) = assigned_parts(who);
        let mut stmt = self
            .tx
            .prepare_cached(
                "INSERT INTO machine_identities (partition, worker_id, machine_name, kind, scope, id) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            )
            .map_err(|e| self.err(&e))?;
        stmt.execute(params![
            self.partition(),
            worker_id,
            name,
            kind.as_str(),
            key.scope,
            key.id
        ])
        .map_err(|e| self.err(&e))?;
        Ok(())
    }

    fn port_owner(&mut self, worker_id: &str, port: u16) -> Result<Option<RecordKey>, Error> {
        let mut stmt = self
            .tx
            .prepare_cached(
                "SELECT scope, id FROM port_owners WHERE partition = ?1 AND worker_id = ?2 AND host_port = ?3",
            )
            .map_err(|e| self.err(&e))?;
        stmt.query_row(params![self.partition(), worker_id, port], |r| {
            Ok(RecordKey {
                scope: r.get(0)?,
                id: r.get(1)?,
            })
        })
        .optional()
        .map_err(|e| self.err(&e))
    }

    fn put_port(&mut self, worker_id: &str, port: u16, owner: &RecordKey) -> Result<(), Error> {
        let mut stmt = self
            .tx
            .prepare_cached(
                "INSERT INTO port_owners (partition, worker_id, host_port, scope, id) VALUES (?1, ?2, ?3, ?4, ?5)",
            )
            .map_err(|e| self.err(&e))?;
        stmt.execute(params![
            self.partition(),
            worker_id,
            port,
            owner.scope,
            owner.id
        ])
        .map_err(|e| self.err(&e))?;
        Ok(())
    }

    fn delete_ports(&mut self, owner: &RecordKey) -> Result<(), Error> {
        let mut stmt = self
            .tx
            .prepare_cached(
                "DELETE FROM port_owners WHERE partition = ?1 AND scope = ?2 AND id = ?3",
            )
            .map_err(|e| self.err(&e))?;
        stmt.execute(params![self.partition(), owner.scope, owner.id])
            .map_err(|e| self.err(&e))?;
        Ok(())
    }

    fn usage(&mut self, worker_id: &str) -> Result<Resources, Error> {
        let mut total = Resources::default();
        for table in ["executions", "machines"] {
            let sql = format!(
                "SELECT COALESCE(SUM(slots), 0), COALESCE(SUM(cpus), 0), COALESCE(SUM(memory_mb), 0), \
                 COALESCE(SUM(disk_gb), 0) FROM {table} WHERE partition = ?1 AND worker_id = ?2"
            );
            let mut stmt = self.tx.prepare_cached(&sql).map_err(|e| self.err(&e))?;
            let sums: [i64; 4] = stmt
                .query_row(params![self.partition(), worker_id], |r| {
                    Ok([r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?])
                })
                .map_err(|e| self.err(&e))?;
            let [slots, cpus, memory_mb, disk_gb] =
                sums.map(|v| u64::try_from(v).unwrap_or(u64::MAX));
            total = total.plus(Resources {
                slots,
                cpus,
                memory_mb,
                disk_gb,
            });
        }
        Ok(total)
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
        let mut stmt = self
            .tx
            .prepare_cached("SELECT COUNT(*) FROM machines WHERE partition = ?1 AND pending = 1")
            .map_err(|e| self.err(&e))?;
        let n: i64 = stmt
            .query_row([self.partition()], |r| r.get(0))
            .map_err(|e| self.err(&e))?;
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
        let mut stmt = self
            .tx
            .prepare_cached("SELECT check_value FROM partition_keys WHERE partition = ?1")
            .map_err(|e| self.err(&e))?;
        stmt.query_row([self.partition()], |r| r.get(0))
            .optional()
            .map_err(|e| self.err(&e))
    }

    fn put_key_check(&mut self, check: &[u8]) -> Result<(), Error> {
        let mut stmt = self
            .tx
            .prepare_cached(
                "INSERT INTO partition_keys (partition, key_id, check_value) VALUES (?1, ?2, ?3)",
            )
            .map_err(|e| self.err(&e))?;
        stmt.execute(params![self.partition(), KEY_ID, check])
            .map_err(|e| self.err(&e))?;
        Ok(())
    }

    fn row_formats(&mut self) -> Result<Vec<(RecordKind, RecordKey, bool)>, Error> {
        let mut out = Vec::new();
        for (table, kind) in [
            ("executions", RecordKind::Execution),
            ("machines", RecordKind::Machine),
        ] {
            let sql = format!(
                "SELECT scope, id, substr(payload, 1, 1) = ?2 FROM {table} WHERE partition = ?1"
            );
            let mut stmt = self.tx.prepare(&sql).map_err(|e| self.err(&e))?;
            let rows = stmt
                .query_map(params![self.partition(), CURRENT_SEALED], |r| {
                    Ok((
                        kind,
                        RecordKey {
                            scope: r.get(0)?,
                            id: r.get(1)?,
                        },
                        r.get::<_, bool>(2)?,
                    ))
                })
                .map_err(|e| self.err(&e))?;
            for row in rows {
                out.push(row.map_err(|e| self.err(&e))?);
            }
        }
        Ok(out)
    }
}

/// The first byte of a payload sealed in the current format.
const CURRENT_SEALED: &[u8] = &[crate::seal::SEALED_V2];

/// The due scan of `table` (`executions` or `machines`).
fn due_sql(table: &str) -> String {
    format!(
        "SELECT {COLS}, scope, id FROM {table} WHERE partition = ?1 AND next_due_ms IS NOT NULL \
         AND next_due_ms <= ?2 AND (next_due_ms, scope, id) > (?3, ?4, ?5) \
         ORDER BY next_due_ms, scope, id LIMIT ?6"
    )
}

/// A row of a scan: its key, sealed payload and projected columns.
type ScanRow = (RecordKey, Vec<u8>, Projection);

impl SqliteTx<'_> {
    fn open_machine(
        &self,
        key: &RecordKey,
        payload: &[u8],
        p: &Projection,
    ) -> Result<MachineRecord, Error> {
        crate::row::open_machine_row(self.sealer, key, payload, p, self.op)
    }

    fn scan(&self, sql: &str, params: &[&dyn rusqlite::ToSql]) -> Result<Vec<ScanRow>, Error> {
        let mut stmt = self.tx.prepare_cached(sql).map_err(|e| self.err(&e))?;
        let rows = stmt
            .query_map(params, |r| {
                let (payload, p) = read_row(r)?;
                let key = RecordKey {
                    scope: r.get(13)?,
                    id: r.get(14)?,
                };
                Ok((key, payload, p))
            })
            .map_err(|e| self.err(&e))?;
        rows.map(|r| r.map_err(|e| self.err(&e))).collect()
    }

    fn due_rows(
        &self,
        table: &str,
        now_ms: u64,
        after: Option<&DueCursor>,
        limit: u32,
    ) -> Result<Vec<ScanRow>, Error> {
        let (due, scope, id) = after.map_or((-1, "", ""), |c| {
            (int(c.due_at_ms), c.key.scope.as_str(), c.key.id.as_str())
        });
        self.scan(
            &due_sql(table),
            params![self.partition(), int(now_ms), due, scope, id, limit],
        )
    }

    fn list_rows(
        &self,
        table: &str,
        scope: &str,
        after: Option<&str>,
        limit: u32,
    ) -> Result<Vec<ScanRow>, Error> {
        // An empty string sorts before every identifier.
        let after = after.unwrap_or("");
        let sql = format!(
            "SELECT {COLS}, scope, id FROM {table} WHERE partition = ?1 AND scope = ?2 AND id > ?3 \
             ORDER BY id LIMIT ?4"
        );
        self.scan(&sql, params![self.partition(), scope, after, limit])
    }
}

/// Maps a SQLite failure to a `store` error (never `not_found`).
/// Switches a file to WAL. The switch needs an exclusive lock and SQLite
/// answers `SQLITE_BUSY` to it at once (the busy handler is not consulted)
/// while another process opens the same fresh file, so it is retried for up
/// to [`BUSY_TIMEOUT`]; once any process has switched, it is a no-op.
fn set_wal(conn: &Connection) -> rusqlite::Result<()> {
    let deadline = std::time::Instant::now() + BUSY_TIMEOUT;
    loop {
        match conn.execute_batch("PRAGMA journal_mode = WAL;") {
            Err(e)
                if matches!(
                    e.sqlite_error_code(),
                    Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
                ) && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(5));
            }
            other => return other,
        }
    }
}

fn sql_error(op: Operation, e: &rusqlite::Error) -> Error {
    use rusqlite::ErrorCode as C;
    let reason = match e.sqlite_error_code() {
        Some(C::DatabaseBusy | C::DatabaseLocked) => Reason::SqliteBusy,
        Some(C::ReadOnly) => Reason::SqliteReadOnly,
        Some(C::DatabaseCorrupt | C::NotADatabase) => Reason::SqliteCorrupt,
        Some(C::CannotOpen) => Reason::SqliteCannotOpen,
        Some(C::DiskFull) => Reason::SqliteDiskFull,
        Some(C::SystemIoFailure) => Reason::SqliteIo,
        Some(C::ConstraintViolation) => Reason::SqliteConstraint,
        _ => Reason::Sqlite,
    };
    Error::store(op, Evidence::Unknown, reason)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test code

    use rusqlite::StatementStatus;

    use super::*;
    use crate::Store;

    /// Issue 16: the due scan runs as one compiled statement; new bound
    /// values (the time, the cursor, the limit) never compile it again.
    #[test]
    fn the_due_scan_is_not_compiled_again_for_new_values() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("s.db");
        let fp = smolbox_core::managed::testkit::fingerprint_key();
        let key = crate::EncryptionKey::new([7; 32], &fp).unwrap();
        let store = SqliteStore::open(&db, Sealer::new(&key, "p").unwrap()).unwrap();
        for (now_ms, limit) in [(1_000, 10), (2_000, 10), (3_000, 20)] {
            store.due(now_ms, None, limit).unwrap();
        }
        let conn = store.conn.lock().unwrap();
        let stmt = conn.prepare_cached(&due_sql("executions")).unwrap();
        assert_eq!(stmt.get_status(StatementStatus::RePrepare), 0);
    }

    fn store_at(dir: &tempfile::TempDir) -> SqliteStore {
        let fp = smolbox_core::managed::testkit::fingerprint_key();
        let key = crate::EncryptionKey::new([7; 32], &fp).unwrap();
        SqliteStore::open(&dir.path().join("s.db"), Sealer::new(&key, "p").unwrap()).unwrap()
    }

    fn record(id: &str) -> ExecutionRecord {
        use smolbox_core::managed::testkit::{accepted, exec_spec, key};
        accepted(key("s", id), exec_spec("x"), 1_000)
    }

    /// Session 11: `BEGIN` and `COMMIT` run as the connection's cached
    /// statements, not compiled again per transaction.
    #[test]
    fn begin_and_commit_are_cached_statements() {
        let dir = tempfile::tempdir().unwrap();
        let store = store_at(&dir);
        store.accept(&record("a"), 10).unwrap();
        store.fetch(&record("a").key).unwrap();
        store.fetch(&record("a").key).unwrap();
        let conn = store.conn.lock().unwrap();
        let run = |sql: &str| {
            let stmt = conn.prepare_cached(sql).unwrap();
            stmt.get_status(StatementStatus::Run)
        };
        assert!(run(BEGIN_IMMEDIATE) >= 1);
        assert!(run(BEGIN_DEFERRED) >= 2);
        assert!(run("COMMIT") >= 3);
    }

    /// Session 11 (`written`): a write's guard read of a record this
    /// handle wrote last, with no other commit since, runs no select.
    #[test]
    fn a_handles_own_last_write_is_not_read_again() {
        let dir = tempfile::tempdir().unwrap();
        let store = store_at(&dir);
        let selects = || {
            let conn = store.conn.lock().unwrap();
            let sql = format!(
                "SELECT {COLS} FROM executions WHERE partition = ?1 AND scope = ?2 AND id = ?3"
            );
            conn.prepare_cached(&sql)
                .unwrap()
                .get_status(StatementStatus::Run)
        };
        let rec = store.accept(&record("a"), 10).unwrap().into_record();
        let after_accept = selects();
        let first = store.cancel(&rec.key, 2_000).unwrap();
        let second = store.cancel(&rec.key, 3_000).unwrap();
        assert_eq!((first.version, second.version), (2, 3));
        assert_eq!(store.fetch(&rec.key).unwrap(), second);
        assert_eq!(selects(), after_accept);
        assert!(store.written().len() >= 1);
    }

    /// Another handle's commit changes the data version: the next
    /// transaction reads the row (never the handle's older record, which
    /// would lose the other write).
    #[test]
    fn another_handles_write_is_read_from_the_row() {
        let dir = tempfile::tempdir().unwrap();
        let a = store_at(&dir);
        let b = store_at(&dir);
        let rec = a.accept(&record("a"), 10).unwrap().into_record();
        a.fetch(&rec.key).unwrap();
        let by_b = b.cancel(&rec.key, 2_000).unwrap();
        assert_eq!(by_b.version, 2);
        assert_eq!(a.fetch(&rec.key).unwrap(), by_b);
        let rec2 = a.accept(&record("b"), 10).unwrap().into_record();
        let by_b = b.cancel(&rec2.key, 2_000).unwrap();
        // A write (not only a read) after the other handle's commit.
        let e = a
            .claim_version(&rec2.key, "ctl", rec2.version, 2_500, 1_000)
            .unwrap_err();
        assert_eq!(e.category(), smolbox_core::Category::StaleVersion);
        assert_eq!(a.fetch(&rec2.key).unwrap(), by_b);
    }

    /// A transaction that wrote and then failed leaves no entry: the next
    /// read answers the committed record.
    #[test]
    fn a_failed_write_leaves_no_written_entry() {
        let dir = tempfile::tempdir().unwrap();
        let store = store_at(&dir);
        let rec = store.accept(&record("a"), 10).unwrap().into_record();
        let op = Operation::StoreWrite;
        let mut next = rec.clone();
        next.version = 2;
        next.updated_at_ms = 2_000;
        let failed: Result<(), Error> = store.run_transaction(op, Lock::Record, &mut |tx| {
            tx.put_exec(&next, false)?;
            Err(Error::store(op, Evidence::Unknown, Reason::Sqlite))
        });
        assert!(failed.is_err());
        assert_eq!(store.fetch(&rec.key).unwrap(), rec);
        assert_eq!(store.written().len(), 0);
    }

    /// Session 11 (`columns`): an update leaves the indexed columns it does
    /// not change unnamed (no index entry rewritten), and the indexes still
    /// answer as before.
    #[test]
    fn an_update_names_only_the_indexed_columns_it_changes() {
        let dir = tempfile::tempdir().unwrap();
        let store = store_at(&dir);
        let rec = store.accept(&record("a"), 10).unwrap().into_record();
        let op = Operation::StoreWrite;
        let next = store
            .run_transaction(op, Lock::Record, &mut |tx| {
                let mut next = tx.exec(&rec.key)?.unwrap();
                next.version += 1;
                next.updated_at_ms += 1;
                tx.put_exec(&next, false)?;
                Ok(next)
            })
            .unwrap();
        let runs = |sql: &str| {
            let conn = store.conn.lock().unwrap();
            conn.prepare_cached(sql)
                .unwrap()
                .get_status(StatementStatus::Run)
        };
        assert_eq!(runs(Table::Executions.update_sql(0)), 1);
        assert_eq!(runs(Table::Executions.update_sql(Indexed::ALL)), 0);
        // A change of the due time names it, and the due scan sees it.
        let cancelled = store.cancel(&rec.key, 5_000).unwrap();
        assert_ne!(cancelled.next_due_at_ms, next.next_due_at_ms);
        assert_eq!(runs(Table::Executions.update_sql(1)), 1);
        let due = store.due(5_000, None, 10).unwrap();
        assert_eq!(due.records, vec![cancelled]);
    }

    /// A closure that fails or panics leaves nothing written and the
    /// connection outside any transaction (the next one begins).
    #[test]
    fn a_failed_or_panicking_transaction_rolls_back() {
        let dir = tempfile::tempdir().unwrap();
        let store = store_at(&dir);
        let op = Operation::StoreAccept;
        let failed: Result<(), Error> = store.run_transaction(op, Lock::Record, &mut |tx| {
            tx.put_exec(&record("failed"), true)?;
            Err(Error::store(op, Evidence::Unknown, Reason::Sqlite))
        });
        assert_eq!(failed.unwrap_err().reason(), Reason::Sqlite);
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _: Result<(), Error> = store.run_transaction(op, Lock::Record, &mut |tx| {
                tx.put_exec(&record("panicked"), true)?;
                panic!("inside the transaction");
            });
        }));
        assert!(panicked.is_err());
        assert!(
            store
                .conn
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .is_autocommit()
        );
        for id in ["failed", "panicked"] {
            let e = store.fetch(&record(id).key).unwrap_err();
            assert_eq!(e.category(), smolbox_core::Category::NotFound);
        }
        store.accept(&record("after"), 10).unwrap();
    }
}
