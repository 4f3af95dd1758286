//! A due-scan row of a live run's key goes to that run (session 10, issue
//! 12; fuzz finding 5's case for terminals): the controller reports it
//! (`ControllerEvent::TerminalDue`), `LiveSet::due_row` keeps it for the
//! run of its key and `LiveSet::feed_rows` hands it over before the run's
//! next input. A row of another history read while the run's own intent
//! write is out means the run never opens.

use super::*;
use crate::managed::live::{DueRow, LiveSet, MAX_KEPT_ROWS};

/// A run of `id` opened through `set` (it drives the key), driven with
/// every store op performed until its intent write, which is performed
/// (committed) and returned unanswered with its reply and the record as
/// stored just before it (`ready`, claimed by the run).
fn up_to_the_intent(
    sim: &mut Sim,
    set: &mut LiveSet<u32>,
    id: &str,
) -> (TerminalRun, OpId, TermStoreResult, ExecutionRecord) {
    let (mut run, drives) = set
        .open_run(
            cfg(),
            fingerprint_key(),
            key("s", id),
            sim.machine.clone(),
            ManagedTerminalSpec::default(),
        )
        .unwrap();
    assert!(drives);
    while let Some(o) = run.poll_output() {
        match o {
            TermOutput::Store(op_id, op) => {
                let intent = matches!(&*op, TermStoreOp::Write { patch, .. }
                    if patch.state == Some(ExecState::Dispatching));
                let before = sim.fake.execs.get(&key("s", id)).cloned();
                let r = sim.fake.apply(&op);
                if intent {
                    return (run, op_id, r, before.unwrap());
                }
                run.handle_stored(sim.now, sim.now_ms, op_id, r);
            }
            TermOutput::Inspect { .. } => {
                run.handle_inspected(sim.now, sim.now_ms, sim.inspect);
            }
            other => sim.seen.push(other),
        }
    }
    panic!("no intent write");
}

/// `rec` (at `ready`, before this run's intent) as another run leaves it:
/// claimed by `ctl-other` once this run's claim lapsed, then its intent.
fn intent_of_another(rec: &ExecutionRecord) -> ExecutionRecord {
    let lapsed = rec.claim.as_ref().unwrap().until_ms;
    let mut row = claim::claim_exec(rec, "ctl-other", lapsed, TTL).unwrap();
    let patch = crate::managed::testkit::entry_patch(&row, ExecState::Dispatching);
    row = apply_exec(&row, &patch, lapsed).unwrap();
    row
}

/// Finding 5's case for terminals: while this run's intent write is out,
/// the due scan reads the record showing another run's intent (a store
/// that then went back to this run's history). The row reached no run
/// (the driver only started a recovery, which found the key driven here),
/// so the run opened. It now goes to the run, which never opens: the
/// record is marked `unknown` and the slot kept.
#[test]
fn a_due_row_of_another_intent_while_the_intent_is_out_never_opens() {
    let mut sim = Sim::new();
    let mut set = LiveSet::<u32>::new(4).unwrap();
    let (mut run, id, r, ready) = up_to_the_intent(&mut sim, &mut set, "t1");
    assert_eq!(ready.state, ExecState::Ready);
    let row = intent_of_another(&ready);
    assert_eq!(set.due_row(row), DueRow::Kept, "a live run's row is its");
    set.feed_rows(&mut run);
    run.handle_stored(sim.now, sim.now_ms, id, r);
    sim.settle(&mut run);
    assert_eq!(sim.opens(), 0, "opened after another intent was read");
    assert_eq!(sim.exec("t1").state, ExecState::Unknown);
    assert!(run.is_done());
    assert_eq!(
        sim.machine().active_execution.as_ref(),
        Some(&key("s", "t1")),
        "the slot is kept"
    );
}

/// The race the rule must not mistake for another intent: the due scan
/// reads this run's own intent after it committed and before the write's
/// answer arrived. The terminal opens, once.
#[test]
fn a_due_row_of_its_own_intent_before_the_answer_still_opens_once() {
    let mut sim = Sim::new();
    let mut set = LiveSet::<u32>::new(4).unwrap();
    let (mut run, id, r, _) = up_to_the_intent(&mut sim, &mut set, "t1");
    let committed = sim.exec("t1").clone();
    assert_eq!(committed.state, ExecState::Dispatching);
    assert_eq!(set.due_row(committed), DueRow::Kept);
    set.feed_rows(&mut run);
    run.handle_stored(sim.now, sim.now_ms, id, r);
    sim.settle(&mut run);
    assert_eq!(sim.opens(), 1);
}

/// Fuzz finding 19's case for terminals: the due scan's row matches the
/// intent write's outcome in state, version, generation and claim but is
/// another record (another spec and fingerprint under this key). It was
/// taken for the early read of the run's own intent and the terminal
/// opened; only a row of the same record is that read: never opened.
#[test]
fn a_due_row_of_another_record_at_the_intents_version_never_opens() {
    let mut sim = Sim::new();
    let mut set = LiveSet::<u32>::new(4).unwrap();
    let (mut run, id, r, _) = up_to_the_intent(&mut sim, &mut set, "t1");
    let mut foreign = sim.exec("t1").clone();
    assert_eq!(foreign.state, ExecState::Dispatching);
    foreign.fingerprint = "f".repeat(64);
    foreign.spec.queue_budget_ms += 1;
    assert_eq!(set.due_row(foreign), DueRow::Kept);
    set.feed_rows(&mut run);
    run.handle_stored(sim.now, sim.now_ms, id, r);
    sim.settle(&mut run);
    assert_eq!(sim.opens(), 0, "opened after another record's row");
    assert_eq!(sim.exec("t1").state, ExecState::Unknown);
}

/// The rows kept for a run are bounded: at `MAX_KEPT_ROWS` rows (here all
/// the run's own intent) the run still opens; one more is dropped, and a
/// dropped row may have shown anything, so the run never opens.
#[test]
fn kept_rows_are_bounded_and_a_dropped_row_forbids_the_open() {
    for (n, opens) in [(MAX_KEPT_ROWS, 1), (MAX_KEPT_ROWS + 1, 0)] {
        let mut sim = Sim::new();
        let mut set = LiveSet::<u32>::new(4).unwrap();
        let (mut run, id, r, _) = up_to_the_intent(&mut sim, &mut set, "t1");
        let committed = sim.exec("t1").clone();
        for _ in 0..n {
            assert_eq!(set.due_row(committed.clone()), DueRow::Kept);
        }
        set.feed_rows(&mut run);
        run.handle_stored(sim.now, sim.now_ms, id, r);
        sim.settle(&mut run);
        assert_eq!(sim.opens(), opens, "{n} rows");
    }
}

/// Only the run that drives the key takes its rows; a key driven by no run
/// here is recovered; the rows go with the run's end.
#[test]
fn due_rows_go_to_the_driving_run_else_the_key_is_recovered() {
    let mut sim = Sim::new();
    let mut set = LiveSet::<u32>::new(4).unwrap();
    let (mut run, id, r, ready) = up_to_the_intent(&mut sim, &mut set, "t1");
    let other_key = key("s", "t9");
    let mut elsewhere = sim.exec("t1").clone();
    elsewhere.key = other_key.clone();
    assert_eq!(set.due_row(elsewhere), DueRow::Recover(other_key));
    // An identity check of the same key (not driving) takes nothing.
    let (mut check, drives) = set
        .open_run(
            cfg(),
            fingerprint_key(),
            key("s", "t1"),
            sim.machine.clone(),
            ManagedTerminalSpec::default(),
        )
        .unwrap();
    assert!(!drives);
    assert_eq!(set.due_row(intent_of_another(&ready)), DueRow::Kept);
    set.feed_rows(&mut check);
    // Still there for the driving run, which then never opens.
    set.feed_rows(&mut run);
    run.handle_stored(sim.now, sim.now_ms, id, r);
    sim.settle(&mut run);
    assert_eq!(sim.opens(), 0);
    // After its end, a row of the key is recovered again.
    set.end_run(&key("s", "t1"));
    let row = sim.exec("t1").clone();
    assert_eq!(set.due_row(row), DueRow::Recover(key("s", "t1")));
}

/// `ready` of `id`, stored by a run of `set` that then ended here (its
/// intent write was never performed): the store as it is after it went
/// back from another run's intent. Returns that record.
fn ready_left_behind(sim: &mut Sim, set: &mut LiveSet<u32>, id: &str) -> ExecutionRecord {
    let (run, _, _, ready) = up_to_the_intent(sim, set, id);
    assert_eq!(ready.state, ExecState::Ready);
    drop(run);
    set.end_run(&key("s", id));
    sim.fake.execs.insert(key("s", id), ready.clone());
    ready
}

/// The race left open in session 10 (runtime.md): a due row showing
/// another run's intent is answered `Recover` (no run of the key here),
/// and an `open` of the same key begins its run before the recovery does;
/// the recovery then finds the key driven and returns. The row now goes
/// to the open's run at its first input: the store went back (the record
/// reads `ready` again), so the run never opens and writes nothing.
#[test]
fn a_recovered_row_goes_to_an_open_that_raced_the_recovery() {
    let mut sim = Sim::new();
    let mut set = LiveSet::<u32>::new(4).unwrap();
    let ready = ready_left_behind(&mut sim, &mut set, "t1");
    let k = key("s", "t1");
    assert_eq!(
        set.due_row(intent_of_another(&ready)),
        DueRow::Recover(k.clone())
    );
    let (mut run, drives) = set
        .open_run(
            cfg(),
            fingerprint_key(),
            k.clone(),
            sim.machine.clone(),
            ManagedTerminalSpec::default(),
        )
        .unwrap();
    assert!(drives);
    assert!(!set.begin_run(&k), "the recovery finds the key driven");
    set.feed_rows(&mut run);
    sim.settle(&mut run);
    assert_eq!(sim.opens(), 0, "opened after another intent was read");
    assert_eq!(sim.exec("t1"), &ready, "written after the row");
    assert!(run.is_done());
}

/// Rows of keys driven by no run here are kept for at most
/// `MAX_UNDRIVEN_KEYS` keys: a row of one more such key is not kept (the
/// key is still recovered), and a key already holding rows keeps taking
/// them.
#[test]
fn rows_of_undriven_keys_are_bounded() {
    use crate::managed::live::MAX_UNDRIVEN_KEYS;
    let mut sim = Sim::new();
    let mut set = LiveSet::<u32>::new(4).unwrap();
    let ready = ready_left_behind(&mut sim, &mut set, "t1");
    let row = intent_of_another(&ready);
    let of = |i: usize| {
        let mut r = row.clone();
        r.key = key("s", &format!("u{i}"));
        r
    };
    for i in 0..MAX_UNDRIVEN_KEYS {
        assert_eq!(set.due_row(of(i)), DueRow::Recover(of(i).key));
        assert_eq!(set.rows_kept(&of(i).key), 1, "key {i}");
    }
    let extra = of(MAX_UNDRIVEN_KEYS);
    assert_eq!(
        set.due_row(extra.clone()),
        DueRow::Recover(extra.key.clone())
    );
    assert_eq!(set.rows_kept(&extra.key), 0, "one key too many");
    assert_eq!(set.due_row(of(0)), DueRow::Recover(of(0).key));
    assert_eq!(set.rows_kept(&of(0).key), 2);
}
