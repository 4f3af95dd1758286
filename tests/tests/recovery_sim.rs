//! The recovery simulation (issue 14): 1,000 seeds of the real
//! `Controller` by default, one line of summary, and on a violation the
//! seed, the step, a trace and the command that replays it.
//! `SMOLBOX_SIM_SEED=<seed>` replays one seed; `SMOLBOX_SIM_SEEDS=<n>` runs
//! a longer soak.

use std::time::Instant;

use smolbox_tests::sim::worker::Mutation;
use smolbox_tests::sim::{self, Bug, DEFAULT_SEEDS, Options, SEED_VAR};

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

fn seeds() -> Vec<u64> {
    sim::seeds_with(&[])
}

#[allow(clippy::print_stdout)] // the report is what the test prints
fn report(summary: &sim::Summary, started: Instant) {
    println!("{}", summary.line());
    eprintln!(
        "({} ms; {} steps; {} seeds settled early; crash points by kind: {:?})",
        started.elapsed().as_millis(),
        summary.steps,
        summary.ended_early,
        summary.crashes
    );
    if !summary.probes.is_empty() {
        eprintln!("probes and file counts: {:?}", summary.probes);
    }
    for r in summary.failed.iter().take(3) {
        println!("{}", sim::describe(r));
    }
    if !summary.failed.is_empty() {
        println!("failing seeds by first broken rule:");
        for (rule, n, seed) in sim::histogram(&summary.failed) {
            println!("{n:>5} x {rule}   (e.g. seed {seed})");
        }
    }
}

/// Every violation of `summary`, one line each (seed, step, what).
fn violations(summary: &sim::Summary) -> Vec<String> {
    summary
        .failed
        .iter()
        .flat_map(|r| {
            r.violations
                .iter()
                .map(move |v| format!("seed {} step {}: {}", r.seed, v.step, v.what))
        })
        .collect()
}

#[test]
fn recovery_simulation() {
    let started = Instant::now();
    let summary = sim::run_seeds(seeds(), Options::DEFAULT, usize::MAX);
    report(&summary, started);
    let new = violations(&summary);
    // No known-findings filter: any violation fails.
    assert!(
        new.is_empty(),
        "violations: {:#?}",
        &new[..new.len().min(10)]
    );
}

/// Replays seeds with one planted bug: `SMOLBOX_SIM_BUG=<name>` (e.g.
/// `DropClaimRenewal`) with `SMOLBOX_SIM_SEED` / `SMOLBOX_SIM_SEEDS`.
#[test]
fn replay_with_a_planted_bug() {
    let Ok(name) = std::env::var("SMOLBOX_SIM_BUG") else {
        return;
    };
    let bug = Bug::CONTROLLER
        .into_iter()
        .chain([Bug::ReleaseAfter404WithoutCreation])
        .chain(Bug::RETAINED)
        .chain(Bug::FILES)
        .chain(Bug::LAUNCH)
        .chain(Bug::STORE)
        .chain(Bug::REFUSED_CREATE)
        .chain(Bug::IMAGE)
        .find(|b| format!("{b:?}") == name);
    assert!(bug.is_some(), "unknown bug {name}");
    if let Some(bug) = bug {
        let started = Instant::now();
        let opts = Options {
            disposable: bug == Bug::ReleaseAfter404WithoutCreation
                || Bug::REFUSED_CREATE.contains(&bug),
            retained: Bug::RETAINED.contains(&bug)
                || Bug::LAUNCH.contains(&bug)
                || Bug::STORE.contains(&bug)
                || Bug::IMAGE.contains(&bug),
            ..Options::DEFAULT
        };
        let summary = sim::run_seeds(seeds(), opts.with_bug(bug), usize::MAX);
        report(&summary, started);
    }
}

/// Each of `probes` ran (or its checked outcome was seen) in `summary`.
/// (`place`: where, for the message.)
fn assert_exercised<'a>(
    summary: &sim::Summary,
    probes: impl IntoIterator<Item = &'a str>,
    place: &str,
) {
    for probe in probes {
        assert!(
            summary.probes.get(probe).is_some_and(|n| *n > 0),
            "{probe} never exercised{place}: {:?}",
            summary.probes
        );
    }
}

/// The machine lifecycle and the exec: what the disposable and retained
/// runs must both have sent.
const MACHINE_MUTATIONS: [Mutation; 5] = [
    Mutation::Create,
    Mutation::Start,
    Mutation::Stop,
    Mutation::Delete,
    Mutation::Exec,
];

/// Each of `kinds` of worker mutation arrived in `summary`.
fn assert_mutated(summary: &sim::Summary, kinds: &[Mutation]) {
    for kind in kinds {
        assert!(
            summary.mutations.get(kind).is_some_and(|n| *n > 0),
            "{kind:?} never exercised"
        );
    }
}

/// Each bug is caught by its own symptom (not by a known finding) within
/// the default seed count.
fn assert_caught(opts: Options, bugs: &[Bug]) {
    for &bug in bugs {
        let mut caught = None;
        for seed in 0..DEFAULT_SEEDS {
            let r = sim::run_seed(seed, opts.with_bug(bug));
            if let Some(v) = r
                .violations
                .iter()
                .find(|v| bug.symptom().iter().any(|s| v.what.contains(s)))
            {
                caught = Some((seed, v.what.clone()));
                break;
            }
        }
        assert!(
            caught.is_some(),
            "{bug:?} was not caught in {DEFAULT_SEEDS} seeds (disposable: {})",
            opts.disposable
        );
        if let Some((seed, what)) = caught {
            eprintln!("{bug:?}: caught by seed {seed} ({what})");
        }
    }
}

/// Each bug planted in the Controller's driver is found within the
/// default seed count.
#[test]
fn every_planted_bug_is_caught_in_the_controller() {
    assert_caught(Options::DEFAULT, &Bug::CONTROLLER);
}

/// Planted in the disposable run: a machine without creation evidence
/// taken as absent after a 404 and its reservation released is caught
/// (absence recorded while the machine exists or its create may still
/// land, or a machine left with its reservation gone).
#[test]
fn a_release_after_a_404_without_creation_evidence_is_caught() {
    assert_caught(
        Options {
            disposable: true,
            ..Options::DEFAULT
        },
        &[Bug::ReleaseAfter404WithoutCreation],
    );
}

/// Planted in the retained run: a slot freed while its holder is unknown
/// without an operator's resolve, and a resolve whose inspection is
/// answered "stopped" without asking the worker, are each caught by their
/// own symptom.
#[test]
fn every_planted_slot_bug_is_caught() {
    assert_caught(Options::RETAINED, &Bug::RETAINED);
}

/// Planted in the retained run with background launches (on by default):
/// a launch acknowledgement handed to the controller as exit 0 — the
/// launch rule's bug (`launched` turned into an exit) — is caught by the
/// end-of-seed launch rule ("a background launch became an exit").
#[test]
fn a_launch_turned_into_an_exit_is_caught() {
    assert_caught(Options::RETAINED, &Bug::LAUNCH);
}

/// Planted in the simulated store (session 9): `finish_command` frees the
/// slot of a command whose collection failed (C14.3: `collection_failed`
/// keeps the slot and the machine becomes `unknown`). The rule lives in the
/// store, which the driver does not control; the slot model's rule for a
/// `Finish` commit ("slot released while its holder … is
/// collection_failed") catches it within the default seed count.
#[test]
fn a_slot_freed_after_a_failed_collection_is_caught() {
    assert_caught(Options::RETAINED, &Bug::STORE);
}

/// Planted in the core (session 10, its test-only switch): a create the
/// worker's create handler refused (400 `BAD_REQUEST` envelope, nothing
/// made) is taken for a passing failure and sent again. The simulated
/// worker refuses creates (its own random stream) and reports a create
/// that arrives again for a refused name, within the default seed count.
#[test]
fn a_refused_create_sent_again_is_caught() {
    assert_caught(
        Options {
            disposable: true,
            ..Options::DEFAULT
        },
        &Bug::REFUSED_CREATE,
    );
}

/// Planted in the driver (session 10): the image preflight of a background
/// launch or a terminal takes every machine for a plain image machine, so
/// they are accepted on imageless machines and reach them; the simulated
/// worker reports it within the default seed count.
#[test]
fn a_launch_or_terminal_admitted_on_an_imageless_machine_is_caught() {
    assert_caught(Options::RETAINED, &Bug::IMAGE);
}

/// Retained machines, 1,000 seeds: create/start/stop/delete with versioned
/// requests, commands and terminals in the slot (a second submission while
/// it is held), cancels, crashes while a command or a terminal holds the
/// slot, and the operator's `stop_for_drain` + quiescent `resolve` after an
/// unknown: every execution-record rule, and the slot rules of
/// `slot_model` on every machine-record commit.
#[test]
fn retained_machines_keep_every_rule() {
    let started = Instant::now();
    // The default range, then the soak's findings beyond it (regressions).
    let summary = sim::run_seeds(
        sim::seeds_with(&sim::RETAINED_REGRESSIONS),
        Options::RETAINED,
        usize::MAX,
    );
    eprint!("retained: ");
    report(&summary, started);
    let bad = violations(&summary);
    assert!(bad.is_empty(), "{:#?}", &bad[..bad.len().min(10)]);
    eprintln!("retained: worker mutations {:?}", summary.mutations);
    eprintln!("retained: probes {:?}", summary.probes);
    if let Some(seed) = env_u64(SEED_VAR) {
        // One seed replayed: its trace, even when it passed.
        for line in sim::run_seed(seed, Options::RETAINED).trace {
            eprintln!("  {line}");
        }
        return;
    }
    assert_mutated(&summary, &MACHINE_MUTATIONS);
    assert_mutated(&summary, &[Mutation::Terminal]);
    // Reconcile, complete listings, a drain while a live holder has the
    // slot, and a careless operator's resolve refused as identity_conflict.
    assert_exercised(
        &summary,
        [
            "reconcile_ok",
            "list",
            "maintenance_drained",
            "careless_refused",
            "terminal_bytes_typed",
        ],
        "",
    );
    // Slot commands with files (issue 12): inputs staged, outputs
    // collected, a collection failed with its exit kept (inputs unless
    // SMOLBOX_SIM_INPUTS=0).
    assert_exercised(
        &summary,
        ["outputs_completed", "collection_failed"]
            .into_iter()
            .chain(sim::inputs_on().then_some("upload")),
        " in a slot",
    );
    // Crash points hit slot commands with files at their durable
    // boundaries (session 9): staging, the intent (the exec in flight),
    // collection, and ended before the slot's finish. (`ready` is hit
    // rarely, once in the default range; a buffered slot command stays
    // `dispatching` until its result. The kill tests cover each boundary
    // deterministically.)
    assert_exercised(
        &summary,
        [
            "crash_slot_files_preparing",
            "crash_slot_files_dispatching",
            "crash_slot_files_collecting",
            "crash_slot_files_before_finish",
        ],
        "",
    );
    // Background launches reached the worker and were stored `launched`
    // (on unless SMOLBOX_SIM_LAUNCHES=0); on imageless machines they were
    // refused at acceptance (session 10).
    if sim::controller::launches_on() {
        assert_exercised(&summary, ["launched", "imageless_refused_launch"], "");
    }
    // Session 10: a create the worker refused, its hearer's write of a
    // create that made nothing (`unknown`, absence recorded), the owner's
    // delete of such a machine (no worker call), and terminals refused on
    // imageless machines.
    assert_exercised(
        &summary,
        [
            "create_refused",
            "create_refused_absent",
            "owner_deletes_absent",
            "imageless_refused_terminal",
        ],
        "",
    );
}

/// The same seed gives the same run (replay is exact).
#[test]
fn a_seed_replays_exactly() {
    let disposable = Options {
        disposable: true,
        ..Options::DEFAULT
    };
    for opts in [Options::DEFAULT, disposable, Options::RETAINED] {
        for seed in [1, 77, 4242] {
            let a = sim::run_seed(seed, opts);
            let b = sim::run_seed(seed, opts);
            assert_eq!(a.steps, b.steps);
            assert_eq!(a.crashes, b.crashes);
            assert_eq!(a.faults, b.faults);
            assert_eq!(a.trace, b.trace);
        }
    }
}

/// Disposable machines (the Controller creates, starts, uses, deletes and
/// verifies absent its own machine), 1,000 seeds: every rule, liveness
/// included — records left `accepted`/`preparing`/`dispatching`/`ready` by
/// a crashed or paused controller are re-fenced by the next one
/// (`claim_version`, C15) and moved forward, so every wait ends; no
/// create, start, stop, delete or exec is resent while uncertain.
#[test]
fn disposable_machines_keep_every_rule() {
    let started = Instant::now();
    let opts = Options {
        disposable: true,
        ..Options::DEFAULT
    };
    // The default range, then the soak's findings beyond it (regressions).
    let summary = sim::run_seeds(
        sim::seeds_with(&sim::DISPOSABLE_REGRESSIONS),
        opts,
        usize::MAX,
    );
    eprint!("disposable: ");
    report(&summary, started);
    let bad = violations(&summary);
    assert!(bad.is_empty(), "{:#?}", &bad[..bad.len().min(10)]);
    eprintln!("disposable: worker mutations {:?}", summary.mutations);
    eprintln!("disposable: commands by worker {:?}", summary.probes);
    // Two workers, each with its own lease and capacity.
    for w in ["on_w1", "on_w2"] {
        assert!(
            summary.probes.get(w).is_some_and(|n| *n > 0),
            "{w}: {:?}",
            summary.probes
        );
    }
    assert_mutated(&summary, &MACHINE_MUTATIONS);
    // Session 10: creates the worker refused, recorded by their hearer as
    // creates that made nothing, and their reservations released.
    assert_exercised(
        &summary,
        [
            "create_refused",
            "create_refused_failed",
            "create_refused_released",
        ],
        "",
    );
}

/// Finding 10 (session 6; fixed in session 7): a controller crashed
/// after sending an input's upload (its outcome uncertain) and the next
/// controller recovered the `preparing` record and uploaded the input
/// again, a mutation resent while an earlier one was uncertain (C6.1).
/// The core now fails such a record `not_dispatched`
/// (`staging_uncertain`), and inputs are on in the default runs, so
/// `recovery_simulation` is the regression. Here the old behaviour is
/// planted back (the core's test-only switch) and must be caught by the
/// worker's resend rule within the default seed count.
#[test]
fn an_upload_restaged_by_a_recovering_controller_is_caught() {
    assert_caught(Options::DEFAULT, &[Bug::RestageResumedPreparing]);
}

/// The file rules can fail: an input uploaded again after the dispatch
/// intent (while the command that read it runs) and an output digest
/// recorded other than the one downloaded are each caught by their own
/// symptom within the default seed count.
#[test]
fn every_planted_file_bug_is_caught() {
    assert_caught(
        Options::DEFAULT,
        &[Bug::UploadAfterIntent, Bug::WrongOutputDigest],
    );
}

/// The same file rules in retained machines' slots (issue 12): an input
/// uploaded again after the intent, an output digest recorded other than
/// the one downloaded, and a resumed `preparing` slot command staged again
/// are each caught within the default seed count.
#[test]
fn every_planted_file_bug_is_caught_in_the_retained_run() {
    assert_caught(
        Options::RETAINED,
        &[
            Bug::UploadAfterIntent,
            Bug::WrongOutputDigest,
            Bug::RestageResumedPreparing,
        ],
    );
}
