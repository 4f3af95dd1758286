//! The one store conformance suite (C13–C15, C18), included once per
//! adapter (`memory.rs`, `sqlite.rs`, `postgres.rs`). Each adapter supplies
//! a [`Harness`]; [`conformance_tests!`] expands every test below for it.

use smolbox_core::Reason;
use std::sync::{Arc, Barrier};

use proptest::prelude::*;
use smolbox_core::managed::record::{CreationEvidence, Resources};
use smolbox_core::managed::slot::{Disposition, Finish};
use smolbox_core::managed::spec::ReservedPort;
use smolbox_core::managed::state::{
    Cleanup, Collection, ExecState, MachineOperation, MachinePhase, MachineRecordState,
    RecordEvidence,
};
use smolbox_core::managed::testkit::{
    self, EXIT, accepted, accepted_machine, entry_patch, exec_spec, key, machine_spec,
    managed_exec_spec,
};
use smolbox_core::managed::{ExecPatch, ExecutionRecord, Guard, MachinePatch, RecordKey};
use smolbox_core::{Category, Error};
use smolbox_store::{
    Accepted, Assigned, DEFAULT_LIST_PAGE, MAX_DUE_PAGE, MAX_LIST_PAGE, Reserve, Store, Submitted,
};

mod intent;
mod ops;
mod release;
// The TLS harness (postgres_tls.rs) expands the main suite only.
#[allow(dead_code)]
mod rollback;
pub(crate) use intent::*;
pub(crate) use ops::*;
pub(crate) use release::*;
#[allow(unused_imports)]
pub(crate) use rollback::*;

/// Wall-clock start of every test's timeline.
pub(crate) const T0: u64 = 1_700_000_000_000;
/// Claim and lease TTL used by the suite.
pub(crate) const TTL: u64 = 60_000;

/// One store under test, and more controllers on the same store.
pub(crate) trait Harness {
    /// The first controller's handle.
    fn store(&self) -> Arc<dyn Store>;
    /// Another controller's handle on the same store (its own connection).
    fn another(&self) -> Arc<dyn Store>;
}

/// Expands every conformance test for `$make: fn() -> Option<impl Harness>`
/// (`None` skips, loudly, where the adapter is unavailable outside CI).
#[macro_export]
macro_rules! conformance_tests {
    ($make:path) => {
        $crate::conformance_tests!(@each $make;
            info_reports_schema_one_and_atomic,
            accept_is_idempotent_and_conflicts_on_a_changed_spec,
            duplicates_resolve_even_when_pending_is_full,
            pending_limit_at_n_and_n_plus_one,
            absence_is_not_found_only_when_positive,
            every_allowed_and_forbidden_transition,
            stale_version_and_stale_claim_change_nothing,
            worker_generation_fences_writes,
            ac_15_1_two_controllers_race_for_the_last_slot,
            ac_15_1_one_owner_two_threads_race_for_the_last_slot,
            reserve_checks_deadline_name_and_totals,
            a_catalog_reservation_counts_the_host_overhead_at_n_and_n_plus_one,
            release_only_after_cleanup_and_absence,
            cancel_is_idempotent_and_makes_the_record_due,
            due_pages_are_keyset_ordered,
            due_page_size_at_n_and_n_plus_one,
            ac_13_1_and_13_2_hold_through_the_store,
            machine_accept_slot_and_lifecycle,
            slot_race_has_one_winner,
            ports_are_reserved_and_freed,
            list_pages_hold_every_state_at_n_and_n_plus_one,
            machine_list_includes_deleted_and_pages,
            machine_due_pages_are_keyset_ordered,
            claim_version_claims_only_at_that_version,
            claim_version_refences_an_assigned_record,
            submit_accepts_and_takes_the_slot_in_one_transaction,
            submit_race_has_one_winner,
            finish_command_sets_cleanup_with_the_slot,
            finish_command_keeps_the_slot_of_every_unconfirmed_holder,
            machine_pending_limit_at_n_and_n_plus_one,
            resolve_stopped_clears_the_slot_and_keeps_unknown,
            resolve_deleted_releases_capacity_and_ports,
            machine_claims_leave_the_version,
            claim_machine_version_refences_an_assigned_machine,
            accept_dispatching_commits_the_claim_and_intent_in_one_transaction,
            accept_dispatching_refuses_without_a_live_claim_and_stores_nothing,
            accept_dispatching_pending_limit_at_n_and_n_plus_one,
            submit_dispatching_takes_the_slot_and_commits_the_intent,
            write_steps_applies_each_patch_by_the_rules_in_one_commit,
            commits_count_write_transactions_only,
            release_claim_hands_an_execution_to_the_next_owner_at_once,
            release_claim_of_a_machine_keeps_its_slot_reservation_and_version,
            release_claim_of_a_worker_lease_hands_it_over_with_generation_plus_one,
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

fn owner_guard(rec: &ExecutionRecord, owner: &str) -> Guard {
    Guard::for_exec(rec, owner)
}

fn cat<T: std::fmt::Debug>(r: Result<T, Error>) -> Category {
    r.expect_err("expected an error").category()
}

/// Accepts and claims a fresh disposable record.
fn claimed(s: &dyn Store, k: RecordKey, owner: &str, now: u64) -> ExecutionRecord {
    s.accept(&accepted(k.clone(), exec_spec("c"), now), 10_000)
        .unwrap();
    s.claim(&k, owner, now, TTL).unwrap()
}

/// Accepts, claims and drives a managed-command record into `state`.
fn driven(s: &dyn Store, k: RecordKey, state: ExecState, now: u64) -> ExecutionRecord {
    let machine = key(&k.scope, "machine-1");
    s.accept(
        &accepted(k.clone(), managed_exec_spec("d", &machine), now),
        10_000,
    )
    .unwrap();
    let mut rec = s.claim(&k, "ctl-a", now, TTL).unwrap();
    for (i, st) in testkit::path_to(state).iter().enumerate() {
        let g = owner_guard(&rec, "ctl-a");
        rec = s
            .write(&k, &g, &entry_patch(&rec, *st), now + 1 + i as u64)
            .unwrap();
    }
    rec
}

pub(crate) fn info_reports_schema_one_and_atomic(h: &impl Harness) {
    let info = h.store().info();
    assert_eq!(info.schema, 1);
    assert!(info.atomic);
}

pub(crate) fn accept_is_idempotent_and_conflicts_on_a_changed_spec(h: &impl Harness) {
    let s = h.store();
    let rec = accepted(key("s", "a1"), exec_spec("x"), T0);
    assert_eq!(s.accept(&rec, 10).unwrap(), Accepted::Inserted(rec.clone()));
    // AC-12.5.1: the same spec again returns the stored record, from any controller.
    assert_eq!(
        h.another().accept(&rec, 10).unwrap(),
        Accepted::Existing(rec.clone())
    );
    let changed = accepted(key("s", "a1"), exec_spec("y"), T0 + 5);
    assert_eq!(cat(s.accept(&changed, 10)), Category::IdentityConflict);
    assert_eq!(s.fetch(&rec.key).unwrap(), rec);
    // AC-12.5.2: a completed record still resolves a duplicate.
    let k = key("s", "a2");
    let done = driven(&*s, k.clone(), ExecState::Completed, T0);
    let again = accepted(k, managed_exec_spec("d", &key("s", "machine-1")), T0);
    assert_eq!(s.accept(&again, 10).unwrap(), Accepted::Existing(done));
}

pub(crate) fn duplicates_resolve_even_when_pending_is_full(h: &impl Harness) {
    let s = h.store();
    let first = accepted(key("s", "p1"), exec_spec("x"), T0);
    s.accept(&first, 1).unwrap();
    let second = accepted(key("s", "p2"), exec_spec("x"), T0);
    assert_eq!(cat(s.accept(&second, 1)), Category::AdmissionExhausted);
    assert!(matches!(
        s.accept(&first, 1).unwrap(),
        Accepted::Existing(_)
    ));
}

pub(crate) fn pending_limit_at_n_and_n_plus_one(h: &impl Harness) {
    let s = h.store();
    for i in 0..3 {
        s.accept(&accepted(key("s", &format!("n{i}")), exec_spec("x"), T0), 3)
            .unwrap();
    }
    let e = s
        .accept(&accepted(key("s", "n3"), exec_spec("x"), T0), 3)
        .unwrap_err();
    assert_eq!(e.category(), Category::AdmissionExhausted);
    assert_eq!(e.limit().map(|l| (l.actual, l.max)), Some((4, 3)));
    // A terminal record no longer counts.
    let rec = s.claim(&key("s", "n0"), "ctl-a", T0, TTL).unwrap();
    let p = ExecPatch {
        state: Some(ExecState::Cancelled),
        ..ExecPatch::default()
    };
    s.write(&rec.key, &owner_guard(&rec, "ctl-a"), &p, T0 + 1)
        .unwrap();
    s.accept(&accepted(key("s", "n3"), exec_spec("x"), T0), 3)
        .unwrap();
    for bad in [0, 10_001] {
        assert_eq!(
            cat(s.accept(&accepted(key("s", "n9"), exec_spec("x"), T0), bad)),
            Category::Validation
        );
    }
}

pub(crate) fn absence_is_not_found_only_when_positive(h: &impl Harness) {
    let s = h.store();
    assert_eq!(cat(s.fetch(&key("s", "missing"))), Category::NotFound);
    assert_eq!(
        cat(s.fetch_machine(&key("s", "missing"))),
        Category::NotFound
    );
    assert_eq!(cat(s.find_machine("w1", "nope")), Category::NotFound);
    assert_eq!(cat(s.cancel(&key("s", "missing"), T0)), Category::NotFound);
}

pub(crate) fn every_allowed_and_forbidden_transition(h: &impl Harness) {
    let s = h.store();
    let mut n = 0;
    for from in ExecState::ALL {
        let k = key("t", &format!("r{n}"));
        n += 1;
        let rec = driven(&*s, k.clone(), from, T0);
        assert_eq!(rec.state, from);
        for to in ExecState::ALL
            .into_iter()
            .filter(|to| *to != from && !from.can_move_to(*to))
        {
            let g = owner_guard(&rec, "ctl-a");
            let e = s
                .write(&k, &g, &entry_patch(&rec, to), T0 + 100)
                .unwrap_err();
            assert_eq!(
                (e.category(), e.reason()),
                (Category::Validation, Reason::ForbiddenTransition),
                "{from:?} -> {to:?}"
            );
        }
        assert_eq!(s.fetch(&k).unwrap(), rec, "a refused write changes nothing");
        for to in from.next() {
            let k = key("t", &format!("r{n}"));
            n += 1;
            let rec = driven(&*s, k.clone(), from, T0);
            let g = owner_guard(&rec, "ctl-a");
            let next = s.write(&k, &g, &entry_patch(&rec, *to), T0 + 100).unwrap();
            assert_eq!(
                (next.state, next.version),
                (*to, rec.version + 1),
                "{from:?} -> {to:?}"
            );
            assert_eq!(s.fetch(&k).unwrap(), next);
        }
    }
}

pub(crate) fn stale_version_and_stale_claim_change_nothing(h: &impl Harness) {
    let s = h.store();
    let k = key("s", "sv");
    let rec = claimed(&*s, k.clone(), "ctl-a", T0);
    let p = entry_patch(&rec, ExecState::Preparing);
    let next = s
        .write(&k, &owner_guard(&rec, "ctl-a"), &p, T0 + 1)
        .unwrap();
    // The old version is stale.
    assert_eq!(
        cat(s.write(&k, &owner_guard(&rec, "ctl-a"), &p, T0 + 2)),
        Category::StaleVersion
    );
    // Another controller cannot claim a live claim...
    assert_eq!(
        cat(h.another().claim(&k, "ctl-b", T0 + 2, TTL)),
        Category::StaleClaim
    );
    // ...nor write with a guard it does not hold.
    assert_eq!(
        cat(h
            .another()
            .write(&k, &owner_guard(&next, "ctl-b"), &p, T0 + 2)),
        Category::StaleClaim
    );
    // An expired claim moves to a new owner with generation + 1; the old guard is stale.
    let taken = h.another().claim(&k, "ctl-b", T0 + TTL + 1, TTL).unwrap();
    assert_eq!(taken.generation, next.generation + 1);
    let old = Guard {
        version: taken.version,
        ..owner_guard(&next, "ctl-a")
    };
    let ready = entry_patch(&taken, ExecState::Ready);
    assert_eq!(
        cat(s.write(&k, &old, &ready, T0 + TTL + 2)),
        Category::StaleClaim
    );
    // An expired claim of its own owner is stale too.
    let g = owner_guard(&taken, "ctl-b");
    assert_eq!(
        cat(s.write(&k, &g, &ready, T0 + 2 * TTL + 2)),
        Category::StaleClaim
    );
    assert_eq!(s.fetch(&k).unwrap(), taken);
}

fn reserve_req(worker: &str, name: &str, slots: u64) -> Reserve {
    Reserve {
        worker_id: worker.into(),
        machine_name: name.into(),
        capacity: Resources {
            slots: 1,
            cpus: 1,
            memory_mb: 512,
            disk_gb: 2,
        },
        limit: Resources {
            slots,
            cpus: 64,
            memory_mb: 1 << 20,
            disk_gb: 1 << 20,
        },
    }
}

pub(crate) fn worker_generation_fences_writes(h: &impl Harness) {
    let s = h.store();
    let k = key("s", "wg");
    let rec = claimed(&*s, k.clone(), "ctl-a", T0);
    let lease = s.claim_worker("w1", "ctl-a", T0, 1_000).unwrap();
    assert_eq!(lease.generation, 1);
    let rec = s
        .reserve(
            &k,
            &owner_guard(&rec, "ctl-a"),
            &reserve_req("w1", "m-wg", 4),
            T0 + 1,
        )
        .unwrap();
    assert_eq!(rec.assignment.as_ref().unwrap().worker_generation, 1);
    // Renewing does not change the generation; writes pass.
    s.claim_worker("w1", "ctl-a", T0 + 500, 1_000).unwrap();
    let rec = s
        .write(
            &k,
            &owner_guard(&rec, "ctl-a"),
            &entry_patch(&rec, ExecState::Preparing),
            T0 + 600,
        )
        .unwrap();
    // The lease expires and another controller takes the worker: generation 2.
    let other = h
        .another()
        .claim_worker("w1", "ctl-b", T0 + 2_000, 1_000)
        .unwrap();
    assert_eq!(other.generation, 2);
    let e = s
        .write(
            &k,
            &owner_guard(&rec, "ctl-a"),
            &entry_patch(&rec, ExecState::Ready),
            T0 + 2_001,
        )
        .unwrap_err();
    assert_eq!(
        (e.category(), e.reason()),
        (Category::StaleClaim, Reason::WorkerGeneration)
    );
    // Renewing a worker lease does not revive the record claim of the old generation.
    assert_eq!(
        cat(s.claim_worker("w1", "ctl-a", T0 + 2_002, 1_000)),
        Category::StaleClaim
    );
    assert_eq!(s.fetch(&k).unwrap(), rec);
}

pub(crate) fn ac_15_1_two_controllers_race_for_the_last_slot(h: &impl Harness) {
    for round in 0..8 {
        let worker = format!("race{round}");
        let stores = [h.store(), h.another()];
        let owners = ["ctl-a", "ctl-b"];
        let recs: Vec<_> = (0..2)
            .map(|i| {
                claimed(
                    &*stores[i],
                    key("r", &format!("race{round}-{i}")),
                    owners[i],
                    T0,
                )
            })
            .collect();
        let barrier = Barrier::new(2);
        let results: Vec<Result<ExecutionRecord, Error>> = std::thread::scope(|sc| {
            let handles: Vec<_> = (0..2)
                .map(|i| {
                    let (s, rec, barrier, worker) = (&stores[i], &recs[i], &barrier, &worker);
                    sc.spawn(move || {
                        barrier.wait();
                        s.claim_worker(worker, owners[i], T0 + 1, TTL)?;
                        s.reserve(
                            &rec.key,
                            &owner_guard(rec, owners[i]),
                            &reserve_req(worker, &format!("m{i}"), 1),
                            T0 + 2,
                        )
                    })
                })
                .collect();
            handles.into_iter().map(|j| j.join().unwrap()).collect()
        });
        let wins = results.iter().filter(|r| r.is_ok()).count();
        assert_eq!(wins, 1, "round {round}: {results:?}");
        for r in results.iter().filter_map(|r| r.as_ref().err()) {
            assert!(
                matches!(
                    r.category(),
                    Category::AdmissionExhausted | Category::StaleClaim
                ),
                "{r:?}"
            );
        }
        assert_eq!(h.store().usage(&worker).unwrap().slots, 1);
    }
}

pub(crate) fn ac_15_1_one_owner_two_threads_race_for_the_last_slot(h: &impl Harness) {
    for round in 0..8 {
        let worker = format!("same{round}");
        let stores = [h.store(), h.another()];
        stores[0].claim_worker(&worker, "ctl-a", T0, TTL).unwrap();
        let recs: Vec<_> = (0..2)
            .map(|i| {
                claimed(
                    &*stores[i],
                    key("q", &format!("same{round}-{i}")),
                    "ctl-a",
                    T0,
                )
            })
            .collect();
        let barrier = Barrier::new(2);
        let results: Vec<Result<ExecutionRecord, Error>> = std::thread::scope(|sc| {
            let handles: Vec<_> = (0..2)
                .map(|i| {
                    let (s, rec, barrier, worker) = (&stores[i], &recs[i], &barrier, &worker);
                    sc.spawn(move || {
                        barrier.wait();
                        s.reserve(
                            &rec.key,
                            &owner_guard(rec, "ctl-a"),
                            &reserve_req(worker, &format!("m{i}"), 1),
                            T0 + 2,
                        )
                    })
                })
                .collect();
            handles.into_iter().map(|j| j.join().unwrap()).collect()
        });
        assert_eq!(
            results.iter().filter(|r| r.is_ok()).count(),
            1,
            "{results:?}"
        );
        let loser = results.iter().find_map(|r| r.as_ref().err()).unwrap();
        assert_eq!(loser.category(), Category::AdmissionExhausted);
        assert_eq!(h.store().usage(&worker).unwrap().slots, 1);
    }
}

/// C12.4: a disposable reservation from a catalog revision is `{1, cpus,
/// memory + host overhead, storage + overlay}`; the store's totals admit
/// N of them in a capacity of exactly N and refuse the N + 1st, and a
/// capacity of N × guest memory alone (no overhead) admits only N − 1.
pub(crate) fn a_catalog_reservation_counts_the_host_overhead_at_n_and_n_plus_one(h: &impl Harness) {
    use smolbox_core::managed::catalog::{Floor, ProfileRevision};
    let mut rev = ProfileRevision::new("sized");
    rev.cpus = 2;
    rev.memory_mb = 1_000;
    rev.host_overhead_mb = 200;
    rev.storage_gb = 3;
    rev.overlay_gb = 2;
    let floor = Floor {
        storage_gb: 1,
        overlay_gb: 1,
        host_overhead_mb: 128,
    };
    let r = floor.reservation(&rev);
    assert_eq!((r.slots, r.cpus, r.memory_mb, r.disk_gb), (1, 2, 1_200, 5));
    let n = 2;
    for (worker, memory_mb, fits) in [("wc1", n * r.memory_mb, n), ("wc2", n * 1_000, n - 1)] {
        let s = h.store();
        s.claim_worker(worker, "ctl-a", T0, 10 * TTL).unwrap();
        let limit = Resources {
            slots: 64,
            cpus: 64,
            memory_mb,
            disk_gb: 1 << 20,
        };
        for i in 0..=n {
            let rec = claimed(&*s, key(worker, &format!("c{i}")), "ctl-a", T0);
            let req = Reserve {
                worker_id: worker.into(),
                machine_name: format!("m{i}"),
                capacity: r,
                limit,
            };
            let got = s.reserve(&rec.key, &owner_guard(&rec, "ctl-a"), &req, T0 + 1);
            if i < fits {
                got.unwrap();
            } else {
                assert_eq!(cat(got), Category::AdmissionExhausted, "{worker} #{i}");
            }
        }
        assert_eq!(s.usage(worker).unwrap().memory_mb, fits * r.memory_mb);
    }
}

pub(crate) fn reserve_checks_deadline_name_and_totals(h: &impl Harness) {
    let s = h.store();
    s.claim_worker("w2", "ctl-a", T0, 10 * TTL).unwrap();
    let mut recs = Vec::new();
    for i in 0..4 {
        recs.push(claimed(&*s, key("v", &format!("v{i}")), "ctl-a", T0));
    }
    // Totals: 2 slots fit (N), the third is refused (N + 1).
    let r0 = s
        .reserve(
            &recs[0].key,
            &owner_guard(&recs[0], "ctl-a"),
            &reserve_req("w2", "m0", 2),
            T0 + 1,
        )
        .unwrap();
    // The same name is taken.
    assert_eq!(
        cat(s.reserve(
            &recs[1].key,
            &owner_guard(&recs[1], "ctl-a"),
            &reserve_req("w2", "m0", 2),
            T0 + 1
        )),
        Category::IdentityConflict
    );
    s.reserve(
        &recs[1].key,
        &owner_guard(&recs[1], "ctl-a"),
        &reserve_req("w2", "m1", 2),
        T0 + 1,
    )
    .unwrap();
    assert_eq!(
        cat(s.reserve(
            &recs[2].key,
            &owner_guard(&recs[2], "ctl-a"),
            &reserve_req("w2", "m2", 2),
            T0 + 1
        )),
        Category::AdmissionExhausted
    );
    let used = s.usage("w2").unwrap();
    assert_eq!(
        (used.slots, used.cpus, used.memory_mb, used.disk_gb),
        (2, 2, 1024, 4)
    );
    assert_eq!(s.usage("nobody").unwrap(), Resources::default());
    // Past the queue deadline.
    let late = T0 + recs[3].spec.queue_budget_ms + 1;
    s.claim_worker("w2", "ctl-a", late, TTL).unwrap();
    let r3 = s.claim(&recs[3].key, "ctl-a", late, TTL).unwrap();
    assert_eq!(
        cat(s.reserve(
            &r3.key,
            &owner_guard(&r3, "ctl-a"),
            &reserve_req("w2", "m3", 9),
            late
        )),
        Category::Expired
    );
    // Without the worker lease.
    assert_eq!(
        cat(h.another().reserve(
            &r3.key,
            &owner_guard(&r3, "ctl-b"),
            &reserve_req("w2", "m3", 9),
            late
        )),
        Category::StaleClaim
    );
    // The assignment index finds the machine by (worker, name).
    assert_eq!(
        s.find_machine("w2", "m0").unwrap(),
        Assigned::Execution(r0.key.clone())
    );
}

pub(crate) fn release_only_after_cleanup_and_absence(h: &impl Harness) {
    let s = h.store();
    s.claim_worker("w3", "ctl-a", T0, 10 * TTL).unwrap();
    let k = key("s", "rel");
    let rec = claimed(&*s, k.clone(), "ctl-a", T0);
    let rec = s
        .reserve(
            &k,
            &owner_guard(&rec, "ctl-a"),
            &reserve_req("w3", "m-rel", 4),
            T0 + 1,
        )
        .unwrap();
    let g = |r: &ExecutionRecord| owner_guard(r, "ctl-a");
    assert_eq!(cat(s.release(&k, &g(&rec), T0 + 2)), Category::Validation);
    let mut rec = rec;
    for (i, st) in [ExecState::Preparing, ExecState::Failed]
        .into_iter()
        .enumerate()
    {
        rec = s
            .write(&k, &g(&rec), &entry_patch(&rec, st), T0 + 3 + i as u64)
            .unwrap();
    }
    // Cleanup complete needs recorded absence for an assigned disposable record.
    let complete = ExecPatch {
        cleanup: Some(Cleanup::Complete),
        ..ExecPatch::default()
    };
    assert_eq!(
        cat(s.write(&k, &g(&rec), &complete, T0 + 10)),
        Category::Validation
    );
    let absent = ExecPatch {
        absence_at_ms: Some(T0 + 10),
        cleanup: Some(Cleanup::Complete),
        ..ExecPatch::default()
    };
    let rec = s.write(&k, &g(&rec), &absent, T0 + 10).unwrap();
    assert_eq!(s.usage("w3").unwrap().slots, 1);
    let rec = s.release(&k, &g(&rec), T0 + 11).unwrap();
    assert!(rec.reservation.is_none());
    assert_eq!(s.usage("w3").unwrap(), Resources::default());
    // The assignment index is kept after cleanup.
    assert_eq!(
        s.find_machine("w3", "m-rel").unwrap(),
        Assigned::Execution(k)
    );
}

pub(crate) fn cancel_is_idempotent_and_makes_the_record_due(h: &impl Harness) {
    let s = h.store();
    let k = key("s", "cx");
    let rec = claimed(&*s, k.clone(), "ctl-a", T0);
    let rec = s
        .write(
            &k,
            &owner_guard(&rec, "ctl-a"),
            &ExecPatch {
                next_due_at_ms: Some(None),
                ..ExecPatch::default()
            },
            T0 + 1,
        )
        .unwrap();
    assert!(
        s.due(T0 + 100, None, 100)
            .unwrap()
            .records
            .iter()
            .all(|r| r.key != k)
    );
    let c1 = s.cancel(&k, T0 + 5).unwrap();
    assert_eq!(
        (c1.cancel_requested_at_ms, c1.next_due_at_ms, c1.state),
        (Some(T0 + 5), Some(T0 + 5), rec.state)
    );
    let c2 = h.another().cancel(&k, T0 + 9).unwrap();
    assert_eq!(
        c2.cancel_requested_at_ms,
        Some(T0 + 5),
        "the first cancel time is kept"
    );
    assert!(
        s.due(T0 + 100, None, 100)
            .unwrap()
            .records
            .iter()
            .any(|r| r.key == k)
    );
    // A terminal record is left as it is.
    let done = driven(&*s, key("s", "cy"), ExecState::Completed, T0);
    assert_eq!(s.cancel(&done.key, T0 + 50).unwrap(), done);
}

pub(crate) fn due_pages_are_keyset_ordered(h: &impl Harness) {
    let s = h.store();
    let mut expected = Vec::new();
    for i in 0..23u64 {
        // Several records share a due time, so ties are ordered by (scope, id).
        let now = T0 + (i % 5) * 10;
        let k = key(if i % 2 == 0 { "da" } else { "db" }, &format!("d{i:02}"));
        s.accept(&accepted(k.clone(), exec_spec("x"), now), 10_000)
            .unwrap();
        expected.push((now, k));
    }
    s.accept(
        &accepted(key("da", "later"), exec_spec("x"), T0 + 1_000),
        10_000,
    )
    .unwrap();
    expected.sort();
    let mut seen = Vec::new();
    let mut cursor = None;
    loop {
        let page = h.another().due(T0 + 999, cursor.as_ref(), 10).unwrap();
        assert!(page.records.len() <= 10);
        seen.extend(
            page.records
                .iter()
                .map(|r| (r.next_due_at_ms.unwrap(), r.key.clone())),
        );
        match page.next {
            Some(c) => cursor = Some(c),
            None => break,
        }
    }
    assert_eq!(seen, expected);
    let empty = s.due(T0 - 1, None, 100).unwrap();
    assert!(empty.records.is_empty() && empty.next.is_none());
    assert_eq!(cat(s.due(T0, None, 0)), Category::Validation);
    assert_eq!(cat(s.due(T0, None, 101)), Category::Validation);
    assert_eq!(s.due(T0, None, 100).unwrap().records.len(), 5);
}

fn any_patch() -> impl Strategy<Value = ExecPatch> {
    let state = prop::option::of(prop::sample::select(ExecState::ALL.to_vec()));
    let evidence = prop::option::of(prop::sample::select(RecordEvidence::ALL.to_vec()));
    let collection = prop::option::of(prop::sample::select(vec![
        Collection::Pending,
        Collection::Complete,
        Collection::Failed,
    ]));
    (state, evidence, collection, any::<bool>()).prop_map(|(state, evidence, collection, res)| {
        ExecPatch {
            state,
            evidence,
            collection,
            result: res.then_some(EXIT),
            ..ExecPatch::default()
        }
    })
}

/// AC-13.1 and AC-13.2 through the store's real transactions.
pub(crate) fn ac_13_1_and_13_2_hold_through_the_store(h: &impl Harness) {
    let s = h.store();
    let mut runner = proptest::test_runner::TestRunner::new(proptest::test_runner::Config {
        cases: 12,
        failure_persistence: None,
        ..proptest::test_runner::Config::default()
    });
    let counter = std::sync::atomic::AtomicU64::new(0);
    runner
        .run(
            &(prop::collection::vec(any_patch(), 1..12), any::<bool>()),
            |(patches, confirmed)| {
                let n = counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let k = key("prop", &format!("u{n}"));
                let mut rec = driven(&*s, k.clone(), ExecState::Unknown, T0);
                if confirmed {
                    let p = ExecPatch {
                        evidence: Some(RecordEvidence::TerminationConfirmed),
                        ..ExecPatch::default()
                    };
                    rec = s
                        .write(&k, &owner_guard(&rec, "ctl-a"), &p, T0 + 20)
                        .unwrap();
                }
                let deadline = rec.deadlines.execution_ms;
                for (i, mut p) in patches.into_iter().enumerate() {
                    if confirmed {
                        p.result = None;
                    }
                    match s.write(&k, &owner_guard(&rec, "ctl-a"), &p, T0 + 100 + i as u64) {
                        Ok(next) => {
                            prop_assert_eq!(next.version, rec.version + 1);
                            rec = next;
                        }
                        Err(e) => {
                            prop_assert_eq!(e.category(), Category::Validation);
                            prop_assert_eq!(&s.fetch(&k).unwrap(), &rec);
                        }
                    }
                    prop_assert!(
                        !rec.state.is_before_dispatch() && rec.state != ExecState::Dispatching
                    );
                    prop_assert_eq!(rec.deadlines.execution_ms, deadline);
                    if confirmed {
                        prop_assert!(!matches!(
                            rec.state,
                            ExecState::Completed | ExecState::Cancelled
                        ));
                    }
                }
                Ok(())
            },
        )
        .unwrap();
}

/// A machine accepted, claimed, assigned on `worker` and observed running.
fn running_machine(
    s: &dyn Store,
    k: RecordKey,
    worker: &str,
    ports: Vec<ReservedPort>,
) -> Result<smolbox_core::managed::MachineRecord, Error> {
    let mut spec = machine_spec();
    spec.ports = ports;
    s.accept_machine(&accepted_machine(k.clone(), spec, T0), 100)?;
    let m = s.claim_machine(&k, "ctl-a", T0, 10 * TTL)?;
    s.claim_worker(worker, "ctl-a", T0, 10 * TTL)?;
    let name = format!("n-{}", k.id);
    let m = s.reserve_machine(
        &k,
        &Guard::for_machine(&m, "ctl-a"),
        &reserve_req(worker, &name, 16),
        T0 + 1,
    )?;
    let p = MachinePatch {
        state: Some(MachineRecordState::Creating),
        operation: Some((MachineOperation::Create, MachinePhase::Dispatching)),
        ..MachinePatch::default()
    };
    let m = s.write_machine(&k, &Guard::for_machine(&m, "ctl-a"), &p, T0 + 2)?;
    let p = MachinePatch {
        state: Some(MachineRecordState::Running),
        operation: Some((MachineOperation::None, MachinePhase::None)),
        creation: Some(CreationEvidence {
            created_at_ms: T0 + 2,
            incarnation: "inc-1".into(),
        }),
        ..MachinePatch::default()
    };
    s.write_machine(&k, &Guard::for_machine(&m, "ctl-a"), &p, T0 + 3)
}

pub(crate) fn machine_accept_slot_and_lifecycle(h: &impl Harness) {
    let s = h.store();
    let mk = key("s", "machine-1");
    let m = running_machine(&*s, mk.clone(), "wm", Vec::new()).unwrap();
    assert!(matches!(
        s.accept_machine(&accepted_machine(mk.clone(), machine_spec(), T0), 100)
            .unwrap(),
        Accepted::Existing(_)
    ));
    let mut other = machine_spec();
    other.checkpointable = true;
    assert_eq!(
        cat(s.accept_machine(&accepted_machine(mk.clone(), other, T0), 100)),
        Category::IdentityConflict
    );
    assert_eq!(
        s.find_machine("wm", "n-machine-1").unwrap(),
        Assigned::Machine(mk.clone())
    );
    // Two commands: one slot.
    let e1 = driven(&*s, key("s", "cmd1"), ExecState::Accepted, T0);
    let e2 = driven(&*s, key("s", "cmd2"), ExecState::Accepted, T0);
    let m = s
        .acquire_slot(&mk, &Guard::for_machine(&m, "ctl-a"), &e1.key, T0 + 10)
        .unwrap();
    assert_eq!(m.active_execution.as_ref(), Some(&e1.key));
    assert_eq!(
        cat(s.acquire_slot(&mk, &Guard::for_machine(&m, "ctl-a"), &e2.key, T0 + 11)),
        Category::AdmissionExhausted
    );
    // AC-14.3.1: stop while a command is active is refused.
    assert_eq!(
        cat(s.request_machine(&mk, MachineOperation::Stop, m.version, T0 + 12)),
        Category::AdmissionExhausted
    );
    // AC-14.3.2: the outcome is visible before the slot is released.
    let mut e = e1;
    for st in testkit::path_to(ExecState::Completed) {
        e = s
            .write(
                &e.key,
                &owner_guard(&e, "ctl-a"),
                &entry_patch(&e, *st),
                T0 + 20,
            )
            .unwrap();
    }
    assert_eq!(
        s.fetch_machine(&mk).unwrap().active_execution.as_ref(),
        Some(&e.key)
    );
    let (m, fin) = s
        .finish_slot(&mk, &Guard::for_machine(&m, "ctl-a"), &e.key, T0 + 30)
        .unwrap();
    assert_eq!(fin, Finish::Released);
    assert!(m.active_execution.is_none());
    // Versioned lifecycle: stop, repeat, stale.
    let stopped = s
        .request_machine(&mk, MachineOperation::Stop, m.version, T0 + 31)
        .unwrap();
    assert_eq!(stopped.operation, MachineOperation::Stop);
    assert_eq!(
        s.request_machine(&mk, MachineOperation::Stop, m.version, T0 + 32)
            .unwrap(),
        stopped
    );
    assert_eq!(
        cat(s.request_machine(&mk, MachineOperation::Delete, m.version, T0 + 33)),
        Category::StaleVersion
    );
    // A deleted machine keeps its identity (tombstone) and frees its reservation.
    let g = Guard::for_machine(&stopped, "ctl-a");
    let p = MachinePatch {
        state: Some(MachineRecordState::Deleted),
        operation: Some((MachineOperation::None, MachinePhase::None)),
        ..MachinePatch::default()
    };
    assert_eq!(
        cat(s.write_machine(&mk, &g, &p, T0 + 40)),
        Category::Validation,
        "deleting needs recorded absence"
    );
    let to_deleting = MachinePatch {
        state: Some(MachineRecordState::Deleting),
        operation: Some((MachineOperation::Delete, MachinePhase::Dispatching)),
        ..MachinePatch::default()
    };
    let d = s.write_machine(&mk, &g, &to_deleting, T0 + 40).unwrap();
    let gone = MachinePatch {
        absence_at_ms: Some(T0 + 41),
        ..p
    };
    let d = s
        .write_machine(&mk, &Guard::for_machine(&d, "ctl-a"), &gone, T0 + 41)
        .unwrap();
    assert_eq!(d.state, MachineRecordState::Deleted);
    assert_eq!(s.usage("wm").unwrap(), Resources::default());
    assert!(matches!(
        s.accept_machine(&accepted_machine(mk, machine_spec(), T0), 100)
            .unwrap(),
        Accepted::Existing(_)
    ));
}

pub(crate) fn slot_race_has_one_winner(h: &impl Harness) {
    let mk = key("z", "machine-1");
    let m = running_machine(&*h.store(), mk.clone(), "wz", Vec::new()).unwrap();
    let stores = [h.store(), h.another()];
    let e: Vec<_> = (0..2)
        .map(|i| {
            driven(
                &*stores[i],
                key("z", &format!("z{i}")),
                ExecState::Accepted,
                T0,
            )
        })
        .collect();
    let barrier = Barrier::new(2);
    let results: Vec<_> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..2)
            .map(|i| {
                let (s, e, m, mk, barrier) = (&stores[i], &e[i], &m, &mk, &barrier);
                sc.spawn(move || {
                    barrier.wait();
                    s.acquire_slot(mk, &Guard::for_machine(m, "ctl-a"), &e.key, T0 + 10)
                })
            })
            .collect();
        hs.into_iter().map(|j| j.join().unwrap()).collect()
    });
    assert_eq!(
        results.iter().filter(|r| r.is_ok()).count(),
        1,
        "{results:?}"
    );
    let loser = results.iter().find_map(|r| r.as_ref().err()).unwrap();
    assert!(
        matches!(
            loser.category(),
            Category::AdmissionExhausted | Category::StaleVersion
        ),
        "{loser:?}"
    );
}

pub(crate) fn ports_are_reserved_and_freed(h: &impl Harness) {
    let s = h.store();
    let p = vec![ReservedPort {
        host: 8080,
        guest: 80,
    }];
    let a = running_machine(&*s, key("s", "pa"), "wp", p.clone()).unwrap();
    assert_eq!(a.reserved_ports, vec![8080]);
    let e = running_machine(&*s, key("s", "pb"), "wp", p.clone()).unwrap_err();
    assert_eq!(e.category(), Category::PortConflict);
    // Another worker has its own ports.
    running_machine(&*s, key("s", "pc"), "wq", p).unwrap();
}

/// Seals `plain` in the first sealed format (`0x01 nonce tag ciphertext`,
/// associated data without key id or version), written here independently
/// of the store so the migration is tested against the format as it was.
#[allow(dead_code)] // the durable adapters' tests use it; the memory store seals nothing
pub(crate) fn legacy_seal(
    key_bytes: [u8; 32],
    partition: &str,
    kind: smolbox_core::managed::RecordKind,
    key: &RecordKey,
    plain: &[u8],
) -> Vec<u8> {
    use aes_gcm::aead::{AeadInPlace, KeyInit};
    let cipher = aes_gcm::Aes256Gcm::new(&key_bytes.into());
    let nonce = [0x5a_u8; 12];
    let mut ad = b"smolbox.record.v1\0".to_vec();
    ad.push(kind.tag());
    for part in [partition, key.scope.as_str(), key.id.as_str()] {
        ad.extend_from_slice(&(part.len() as u32).to_be_bytes());
        ad.extend_from_slice(part.as_bytes());
    }
    let mut buf = plain.to_vec();
    let tag = cipher
        .encrypt_in_place_detached(aes_gcm::Nonce::from_slice(&nonce), &ad, &mut buf)
        .unwrap();
    let mut out = vec![0x01];
    out.extend_from_slice(&nonce);
    out.extend_from_slice(&tag);
    out.extend_from_slice(&buf);
    out
}
