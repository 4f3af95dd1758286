//! Body of the `row_decode` fuzz target: the durable adapters' read path
//! (`row::open_exec_row` / `open_machine_row`: the clear columns of a row
//! and its sealed payload → a record), fed arbitrary bytes.
//!
//! Input: one flag byte (record kind, payload mode, legacy sealer), a
//! sample-state byte, a version-delta byte, then the mode's edits:
//! - mode 0: the rest is the sealed payload, as stored;
//! - mode 1: a sample record's envelope with byte edits, sealed by the
//!   harness at the row's version (so the decoder, the identity check and
//!   the projection check see arbitrary plaintext);
//! - mode 2: a sample record sealed correctly, then byte edits of the
//!   sealed bytes (header, key id, nonce, tag, ciphertext, length);
//! - mode 3: a sample record sealed correctly, clear columns edited.
//!
//! Oracles: no panic; every refusal is a typed `store` error with the
//! read's operation (never `not_found`); an accepted row decodes to a
//! record whose key is the row's, whose version is the version column and
//! whose projection equals the clear columns; sealed bytes that were
//! changed, and a version column that differs from the sealed version (an
//! older payload swapped in), are never accepted.
//!
//! Not covered: the SQL drivers' own column typing (a column of the wrong
//! SQL type is the driver's typed error before this path).

use smolbox_core::managed::envelope::{encode_exec, encode_machine};
use smolbox_core::managed::{ExecState, MachineRecordState, RecordKind, testkit};
use smolbox_core::{Category, Error, Operation};

use crate::row::{Projection, open_exec_row, open_machine_row};
use crate::{EncryptionKey, Sealer};

const T0: u64 = 1_700_000_000_000;
const OP: Operation = Operation::StoreFetch;

fn sealer(legacy: bool) -> Option<Sealer> {
    let key = EncryptionKey::new([7; 32], &testkit::fingerprint_key()).ok()?;
    let s = Sealer::new(&key, "fuzz").ok()?;
    Some(if legacy { s.with_legacy() } else { s })
}

/// Applies `(position, xor)` edits from `edits` to `bytes`; true when a
/// byte actually changed (or the length did).
fn edit(bytes: &mut Vec<u8>, edits: &[u8]) -> bool {
    let mut changed = false;
    for e in edits.chunks(3) {
        let [hi, lo, x] = [
            e.first().copied().unwrap_or(0),
            e.get(1).copied().unwrap_or(0),
            e.get(2).copied().unwrap_or(0),
        ];
        let pos = usize::from(u16::from_be_bytes([hi, lo]));
        if bytes.is_empty() {
            break;
        }
        if hi == 0xff && lo == 0xff {
            // Truncation by `x` bytes.
            let n = usize::from(x).min(bytes.len());
            changed |= n > 0;
            bytes.truncate(bytes.len() - n);
            continue;
        }
        let i = pos % bytes.len();
        changed |= x != 0;
        bytes[i] ^= x;
    }
    changed
}

/// Edits projected columns: `(field, value)` pairs.
fn edit_columns(p: &mut Projection, edits: &[u8]) -> bool {
    let before = p.clone();
    for e in edits.chunks(2) {
        let (f, v) = (
            e.first().copied().unwrap_or(0),
            e.get(1).copied().unwrap_or(0),
        );
        let n = i64::from(v) - 128;
        match f % 12 {
            0 => p.fingerprint.push(char::from(v)),
            1 => {
                p.state = ExecState::ALL[usize::from(v) % ExecState::ALL.len()]
                    .as_str()
                    .into()
            }
            2 => p.version = p.version.wrapping_add(n),
            3 => p.next_due_ms = (v & 1 == 0).then_some(n),
            4 => p.pending = v & 1 == 0,
            5 => p.worker_id = (v & 1 == 0).then(|| format!("w{v}")),
            6 => p.machine_name = (v & 1 == 0).then(|| format!("m{v}")),
            7 => p.slots = p.slots.wrapping_add(n),
            8 => p.cpus = p.cpus.wrapping_add(n),
            9 => p.memory_mb = p.memory_mb.wrapping_add(n),
            10 => p.disk_gb = p.disk_gb.wrapping_add(n),
            _ => p.managed_machine = (v & 1 == 0).then(|| format!("s/m{v}")),
        }
    }
    *p != before
}

fn check_refusal(e: &Error) {
    assert_eq!(
        e.category(),
        Category::Store,
        "a bad row is a store error: {e}"
    );
    assert_eq!(e.operation(), OP, "the read's operation is kept: {e}");
}

/// The fuzz body (see the module docs).
pub fn fuzz_row(data: &[u8]) {
    let [flags, state, delta, rest @ ..] = data else {
        return;
    };
    let machine = flags & 1 != 0;
    let mode = (flags >> 1) & 3;
    let Some(sealer) = sealer(flags & 8 != 0) else {
        return;
    };
    let key = testkit::key("s", if flags & 16 == 0 { "row-1" } else { "row-2" });
    let other = testkit::key("s", "row-1");
    let delta = i64::from(*delta as i8);
    if machine {
        let st = MachineRecordState::ALL[usize::from(*state) % MachineRecordState::ALL.len()];
        let Ok(rec) = testkit::machine_in(st, other.clone(), T0) else {
            return;
        };
        let sealed_at = rec.revision();
        let mut p = Projection::of_machine(&rec);
        p.version = p.version.wrapping_add(delta);
        let (payload, tampered) = match mode {
            0 => (rest.to_vec(), true),
            1 => {
                let Ok(mut plain) = encode_machine(&rec) else {
                    return;
                };
                edit(&mut plain, rest);
                let at = u64::try_from(p.version).unwrap_or(0);
                let Ok(s) = sealer.seal_bytes(RecordKind::Machine, &key, at, &plain) else {
                    return;
                };
                (s, false)
            }
            2 => {
                let Ok(mut s) = sealer.seal_machine(&rec) else {
                    return;
                };
                let changed = edit(&mut s, rest);
                (s, changed)
            }
            _ => {
                let Ok(s) = sealer.seal_machine(&rec) else {
                    return;
                };
                edit_columns(&mut p, rest);
                (s, false)
            }
        };
        match open_machine_row(&sealer, &key, &payload, &p, OP) {
            Err(e) => check_refusal(&e),
            Ok(got) => {
                assert!(!tampered, "changed sealed bytes were accepted");
                assert_eq!(got.key, key, "a row decodes to its own key");
                assert_eq!(Projection::of_machine(&got), p, "columns match the payload");
                if mode != 1 {
                    assert_eq!(got.revision(), sealed_at, "an older payload was accepted");
                }
            }
        }
    } else {
        let st = ExecState::ALL[usize::from(*state) % ExecState::ALL.len()];
        let Ok(rec) = testkit::exec_in(st, other.clone(), T0) else {
            return;
        };
        let sealed_at = rec.version;
        let mut p = Projection::of_exec(&rec);
        p.version = p.version.wrapping_add(delta);
        let (payload, tampered) = match mode {
            0 => (rest.to_vec(), true),
            1 => {
                let Ok(mut plain) = encode_exec(&rec) else {
                    return;
                };
                edit(&mut plain, rest);
                let at = u64::try_from(p.version).unwrap_or(0);
                let Ok(s) = sealer.seal_bytes(RecordKind::Execution, &key, at, &plain) else {
                    return;
                };
                (s, false)
            }
            2 => {
                let Ok(mut s) = sealer.seal_exec(&rec) else {
                    return;
                };
                let changed = edit(&mut s, rest);
                (s, changed)
            }
            _ => {
                let Ok(s) = sealer.seal_exec(&rec) else {
                    return;
                };
                edit_columns(&mut p, rest);
                (s, false)
            }
        };
        match open_exec_row(&sealer, &key, &payload, &p, OP) {
            Err(e) => check_refusal(&e),
            Ok(got) => {
                assert!(!tampered, "changed sealed bytes were accepted");
                assert_eq!(got.key, key, "a row decodes to its own key");
                assert_eq!(Projection::of_exec(&got), p, "columns match the payload");
                if mode != 1 {
                    assert_eq!(got.version, sealed_at, "an older payload was accepted");
                }
            }
        }
    }
    // The key-check value of a partition, fed the same bytes.
    if let Err(e) = sealer.verify_key_check(rest) {
        assert_eq!(e.category(), Category::Store, "{e}");
    }
}
