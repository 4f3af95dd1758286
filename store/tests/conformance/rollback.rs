//! Whole-row rollback within one store handle's life (issue 17 item 4;
//! `smolbox_store`'s `watch`): a record read back below a version the
//! handle already saw is `store` / `record_went_back`, never acted on, and
//! a rolled-back record that is still due is not picked up by the due
//! scan. Each adapter supplies [`Rollback::snapshot`], a copy of one stored
//! row (or its absence) that it can put back behind the store's back.

use smolbox_core::Reason;
use smolbox_core::managed::testkit::{accepted, accepted_machine, exec_spec, key, machine_spec};
use smolbox_core::managed::{Guard, RecordKey, RecordKind};
use smolbox_core::{Category, Error};

use super::{Harness, T0, TTL, reserve_req};

/// An adapter whose stored rows a test can copy and put back.
pub(crate) trait Rollback: Harness {
    /// Copies the stored row of `key` (or records that there is none);
    /// calling `restore` on the result puts exactly that back.
    fn snapshot(&self, kind: RecordKind, key: &RecordKey) -> Box<dyn Restore + '_>;
}

/// A row copy to put back.
pub(crate) trait Restore {
    /// Puts the copied row back (deleting the current one), bypassing the
    /// store.
    fn restore(&self);
}

/// Expands every rollback test for `$make: fn() -> Option<impl Rollback>`.
#[macro_export]
macro_rules! rollback_conformance_tests {
    ($make:path) => {
        $crate::rollback_conformance_tests!(@each $make;
            a_record_read_back_below_a_seen_version_is_record_went_back,
            a_record_gone_after_it_was_seen_is_record_went_back_not_absent,
            a_rolled_back_record_still_due_is_not_picked_up_by_the_due_scan,
            a_rolled_back_machine_is_refused_and_left_out_of_the_machine_scan,
            a_rolled_back_machine_claim_renewal_is_record_went_back,
        );
    };
    (@each $make:path; $($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                match $make() {
                    Some(h) => conformance::$name(&h),
                    None => eprintln!("SKIPPED {}: adapter unavailable", stringify!($name)),
                }
            }
        )*
    };
}

fn went_back<T: std::fmt::Debug>(r: Result<T, Error>) -> (Category, Reason) {
    let e = r.expect_err("a rolled-back record must be refused");
    (e.category(), e.reason())
}

const WENT_BACK: (Category, Reason) = (Category::Store, Reason::RecordWentBack);

pub(crate) fn a_record_read_back_below_a_seen_version_is_record_went_back(h: &impl Rollback) {
    let s = h.store();
    let k = key("rb", "exec");
    s.accept(&accepted(k.clone(), exec_spec("x"), T0), 100)
        .unwrap();
    let v1 = h.snapshot(RecordKind::Execution, &k);
    let claimed = s.claim(&k, "ctl-a", T0, TTL).unwrap();
    assert_eq!(claimed.version, 2);
    let v2 = h.snapshot(RecordKind::Execution, &k);
    // The whole row (version column and its own sealed payload) swapped
    // back: self-consistent, but older than what this handle saw.
    v1.restore();
    assert_eq!(went_back(s.fetch(&k)), WENT_BACK);
    // A mutation reading it is refused and writes nothing.
    assert_eq!(went_back(s.claim(&k, "ctl-b", T0 + 1, TTL)), WENT_BACK);
    assert_eq!(went_back(s.cancel(&k, T0 + 1)), WENT_BACK);
    match h.another().fetch(&k) {
        // A handle that never saw version 2 reads the row as it is: the
        // refused operations above changed nothing.
        Ok(r) => assert_eq!(r.version, 1),
        // The memory adapter's "another" is the same handle.
        Err(e) => assert_eq!((e.category(), e.reason()), WENT_BACK),
    }
    // Put forward again, the record reads as before.
    v2.restore();
    assert_eq!(s.fetch(&k).unwrap(), claimed);
}

pub(crate) fn a_record_gone_after_it_was_seen_is_record_went_back_not_absent(h: &impl Rollback) {
    let s = h.store();
    let k = key("rb", "gone");
    let absent = h.snapshot(RecordKind::Execution, &k);
    assert_eq!(s.fetch(&k).unwrap_err().category(), Category::NotFound);
    let rec = accepted(k.clone(), exec_spec("x"), T0);
    s.accept(&rec, 100).unwrap();
    absent.restore();
    // Records are never deleted: absence after the record was seen is a
    // rollback, not "not found", and acceptance does not insert it anew.
    assert_eq!(went_back(s.fetch(&k)), WENT_BACK);
    assert_eq!(went_back(s.accept(&rec, 100)), WENT_BACK);
}

pub(crate) fn a_rolled_back_record_still_due_is_not_picked_up_by_the_due_scan(h: &impl Rollback) {
    let s = h.store();
    let keys: Vec<RecordKey> = (0..5).map(|i| key("rd", &format!("d{i}"))).collect();
    for k in &keys {
        s.accept(&accepted(k.clone(), exec_spec("x"), T0), 100)
            .unwrap();
    }
    let rolled = &keys[2];
    let v1 = h.snapshot(RecordKind::Execution, rolled);
    let due_keys = |limit: u32| {
        let mut seen = Vec::new();
        let mut cursor = None;
        loop {
            let page = s.due(T0 + 10, cursor.as_ref(), limit).unwrap();
            seen.extend(page.records.iter().map(|r| (r.key.clone(), r.version)));
            match page.next {
                Some(c) => cursor = Some(c),
                None => break seen,
            }
        }
    };
    // Before: every accepted record is due at version 1.
    assert_eq!(
        due_keys(100),
        keys.iter().map(|k| (k.clone(), 1)).collect::<Vec<_>>()
    );
    // Driven on (claimed: version 2), then the row swapped back to the
    // due, accepted version 1.
    s.claim(rolled, "ctl-a", T0, TTL).unwrap();
    v1.restore();
    let others: Vec<(RecordKey, u64)> = keys
        .iter()
        .filter(|k| *k != rolled)
        .map(|k| (k.clone(), 1))
        .collect();
    assert_eq!(due_keys(100), others);
    // The page that held it is shorter but still has its cursor: no later
    // record is skipped, at every page size.
    for limit in 1..=5 {
        assert_eq!(due_keys(limit), others, "page size {limit}");
    }
    let page = s.due(T0 + 10, None, 3).unwrap();
    assert_eq!(page.records.len(), 2);
    assert!(page.next.is_some());
    // Claiming it from the scan's point of view is refused too.
    assert_eq!(went_back(s.claim(rolled, "ctl-b", T0 + 11, TTL)), WENT_BACK);
}

pub(crate) fn a_rolled_back_machine_is_refused_and_left_out_of_the_machine_scan(h: &impl Rollback) {
    let s = h.store();
    let k = key("rm", "m-rolled");
    let other = key("rm", "m-other");
    for m in [&k, &other] {
        s.accept_machine(&accepted_machine(m.clone(), machine_spec(), T0), 100)
            .unwrap();
    }
    let v1 = h.snapshot(RecordKind::Machine, &k);
    let due = |s: &dyn smolbox_store::Store| -> Vec<RecordKey> {
        s.due_machines(T0 + 10, None, 100)
            .unwrap()
            .records
            .into_iter()
            .map(|r| r.key)
            .collect()
    };
    // Keyset order: "m-other" before "m-rolled".
    assert_eq!(due(&*s), vec![other.clone(), k.clone()]);
    let m = s.claim_machine(&k, "ctl-a", T0, 10 * TTL).unwrap();
    s.claim_worker("w-rb", "ctl-a", T0, 10 * TTL).unwrap();
    let reserved = s
        .reserve_machine(
            &k,
            &Guard::for_machine(&m, "ctl-a"),
            &reserve_req("w-rb", "n-rolled", 16),
            T0 + 1,
        )
        .unwrap();
    assert!(reserved.version > 1);
    v1.restore();
    assert_eq!(went_back(s.fetch_machine(&k)), WENT_BACK);
    assert_eq!(
        went_back(s.claim_machine(&k, "ctl-b", T0 + 2, TTL)),
        WENT_BACK
    );
    assert_eq!(due(&*s), vec![other]);
}

/// A claim renewal moves a machine record's revision (`claims`), not its
/// version: the mark is the revision, so a row put back to the write just
/// before the renewal (same version, one revision lower) is refused, and
/// the row at the renewal's own revision (the mark itself) is not.
pub(crate) fn a_rolled_back_machine_claim_renewal_is_record_went_back(h: &impl Rollback) {
    let s = h.store();
    let k = key("rr", "m-renewed");
    s.accept_machine(&accepted_machine(k.clone(), machine_spec(), T0), 100)
        .unwrap();
    let taken = s.claim_machine(&k, "ctl-a", T0, TTL).unwrap();
    let before_renewal = h.snapshot(RecordKind::Machine, &k);
    let renewed = s.claim_machine(&k, "ctl-a", T0 + 1, TTL).unwrap();
    // The renewal: same version and generation, revision N + 1.
    assert_eq!(renewed.version, taken.version);
    assert_eq!(renewed.generation, taken.generation);
    assert_eq!(renewed.revision(), taken.revision() + 1);
    let at_renewal = h.snapshot(RecordKind::Machine, &k);
    // At the mark (N + 1): read as it is.
    assert_eq!(s.fetch_machine(&k).unwrap(), renewed);
    // One below the mark (N, the renewal rolled back): refused, by reads,
    // by a mutation reading it, and left out of the machine scan.
    before_renewal.restore();
    assert_eq!(went_back(s.fetch_machine(&k)), WENT_BACK);
    assert_eq!(
        went_back(s.claim_machine(&k, "ctl-a", T0 + 2, TTL)),
        WENT_BACK
    );
    let due = s.due_machines(T0 + 10, None, 100).unwrap();
    assert!(due.records.iter().all(|r| r.key != k), "{:?}", due.records);
    match h.another().fetch_machine(&k) {
        // A handle that never saw the renewal reads the row as it is: the
        // refused renewal above wrote nothing.
        Ok(r) => assert_eq!(r, taken),
        // The memory adapter's "another" is the same handle.
        Err(e) => assert_eq!((e.category(), e.reason()), WENT_BACK),
    }
    // Put forward to the renewal again, it reads as before and renews.
    at_renewal.restore();
    assert_eq!(s.fetch_machine(&k).unwrap(), renewed);
    let again = s.claim_machine(&k, "ctl-a", T0 + 3, TTL).unwrap();
    assert_eq!(again.revision(), renewed.revision() + 1);
}
