//! Issue 14 item 6, the race: 8 controller processes (`slot-racer`) on one
//! PostgreSQL store (and on one SQLite file), 100 rounds; in each round all of them try to take the
//! command slot of one retained machine at once (`Store::submit`). Exactly
//! one wins each round, and the store's history shows no overlap: one
//! record per round, each holding the slot from its acceptance to its
//! finish, every hold ending before the next begins.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::io::{BufRead, BufReader, Write};
use std::process::{Command as Process, Stdio};
use std::time::{SystemTime, UNIX_EPOCH};

use smolbox_core::Category;
use smolbox_core::managed::record::{CreationEvidence, Resources};
use smolbox_core::managed::state::{
    Cleanup, ExecState, MachineOperation, MachinePhase, MachineRecordState,
};
use smolbox_core::managed::testkit::{accepted_machine, key, machine_spec};
use smolbox_core::managed::{Guard, MachinePatch};
use smolbox_store::keys::load_or_create_keys;
use smolbox_store::{PostgresStore, Reserve, Sealer, SqliteStore, Store};

const PROCESSES: usize = 8;
const ROUNDS: usize = 100;

fn pg_url() -> Option<String> {
    match std::env::var("SMOLBOX_PG_URL") {
        Ok(u) if !u.is_empty() => Some(u),
        _ if std::env::var("CI").is_ok_and(|v| v == "true") => {
            panic!("SMOLBOX_PG_URL is not set in CI: the slot race must run")
        }
        _ => {
            eprintln!("slot race SKIPPED: SMOLBOX_PG_URL is not set (run scripts/test.sh)");
            None
        }
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// The retained machine `race/m1`, running, its setup claim long expired.
fn running_machine(s: &dyn Store) {
    let t0 = now_ms() - 60_000;
    let mk = key("race", "m1");
    s.accept_machine(&accepted_machine(mk.clone(), machine_spec(), t0), 100)
        .unwrap();
    let m = s.claim_machine(&mk, "setup", t0, 1_000).unwrap();
    s.claim_worker("w1", "setup", t0, 1_000).unwrap();
    let m = s
        .reserve_machine(
            &mk,
            &Guard::for_machine(&m, "setup"),
            &Reserve {
                worker_id: "w1".into(),
                machine_name: "n-m1".into(),
                capacity: Resources {
                    slots: 1,
                    cpus: 1,
                    memory_mb: 512,
                    disk_gb: 2,
                },
                limit: Resources {
                    slots: 16,
                    cpus: 64,
                    memory_mb: 1 << 20,
                    disk_gb: 1 << 20,
                },
            },
            t0 + 1,
        )
        .unwrap();
    let p = MachinePatch {
        state: Some(MachineRecordState::Creating),
        operation: Some((MachineOperation::Create, MachinePhase::Dispatching)),
        ..MachinePatch::default()
    };
    let m = s
        .write_machine(&mk, &Guard::for_machine(&m, "setup"), &p, t0 + 2)
        .unwrap();
    let p = MachinePatch {
        state: Some(MachineRecordState::Running),
        operation: Some((MachineOperation::None, MachinePhase::None)),
        creation: Some(CreationEvidence {
            created_at_ms: t0 + 2,
            incarnation: "inc-1".into(),
        }),
        ..MachinePatch::default()
    };
    s.write_machine(&mk, &Guard::for_machine(&m, "setup"), &p, t0 + 3)
        .unwrap();
}

/// 8 `slot-racer` processes on `store` (their `STORE` argument `arg`),
/// `ROUNDS` rounds.
fn race(store: &dyn Store, arg: &str) {
    running_machine(store);
    let mut racers: Vec<_> = (0..PROCESSES)
        .map(|i| {
            let mut child = Process::new(env!("CARGO_BIN_EXE_slot-racer"))
                .args([arg, &i.to_string()])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .unwrap();
            let stdin = child.stdin.take().unwrap();
            let stdout = BufReader::new(child.stdout.take().unwrap());
            (child, stdin, stdout)
        })
        .collect();
    let mut line = String::new();
    let mut winners = Vec::new();
    for round in 0..ROUNDS {
        for (_, stdin, _) in &mut racers {
            writeln!(stdin, "try {round}").unwrap();
            stdin.flush().unwrap();
        }
        let mut won = Vec::new();
        for (i, (_, _, stdout)) in racers.iter_mut().enumerate() {
            line.clear();
            stdout.read_line(&mut line).unwrap();
            let words: Vec<&str> = line.split_whitespace().collect();
            assert_eq!(words.get(1), Some(&round.to_string().as_str()), "{line:?}");
            match words.first() {
                Some(&"won") => won.push(i),
                Some(&"lost") => assert!(
                    [
                        Category::AdmissionExhausted.as_str(),
                        Category::StaleVersion.as_str()
                    ]
                    .contains(&words[2]),
                    "round {round}: racer {i}: {line:?}"
                ),
                _ => panic!("round {round}: racer {i}: {line:?}"),
            }
        }
        assert_eq!(won.len(), 1, "round {round}: winners {won:?}");
        let w = won[0];
        writeln!(racers[w].1, "release {round}").unwrap();
        racers[w].1.flush().unwrap();
        line.clear();
        racers[w].2.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), format!("released {round} Released"));
        winners.push(w);
    }
    for (mut child, stdin, _) in racers {
        drop(stdin);
        assert!(child.wait().unwrap().success());
    }

    // The history: one record per round, holds in round order, no overlap.
    let mut records = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let page = store.list("race", after.as_deref(), 100).unwrap();
        records.extend(page.records);
        match page.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    assert_eq!(records.len(), ROUNDS, "one accepted record per round");
    let mut by_round: Vec<_> = records
        .iter()
        .map(|r| {
            let (round, racer) = r.key.id[1..].split_once("-p").unwrap();
            (
                round.parse::<usize>().unwrap(),
                racer.parse::<usize>().unwrap(),
                r,
            )
        })
        .collect();
    by_round.sort_by_key(|(round, _, _)| *round);
    for (i, (round, racer, r)) in by_round.iter().enumerate() {
        assert_eq!((*round, *racer), (i, winners[i]), "the winner's record");
        assert_eq!(r.state, ExecState::Cancelled);
        assert_eq!(r.cleanup, Cleanup::Complete, "the hold was finished");
        if let Some((_, _, next)) = by_round.get(i + 1) {
            assert!(
                r.updated_at_ms <= next.accepted_at_ms,
                "round {round}'s hold ({}..{}) overlaps round {}'s ({})",
                r.accepted_at_ms,
                r.updated_at_ms,
                round + 1,
                next.accepted_at_ms
            );
        }
    }
    let m = store.fetch_machine(&key("race", "m1")).unwrap();
    assert_eq!(m.active_execution, None);
    assert_eq!(m.state, MachineRecordState::Running);
}

#[test]
fn eight_controller_processes_race_for_one_slot_on_postgres() {
    let Some(url) = pg_url() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("pg");
    let partition = format!(
        "r{:08}",
        (now_ms() * 1_000 + u64::from(std::process::id())) % 100_000_000
    );
    let (_, seal) = load_or_create_keys(&keys).unwrap();
    let store = PostgresStore::connect(&url, Sealer::new(&seal, &partition).unwrap()).unwrap();
    race(&store, &format!("postgres:{partition}:{}", keys.display()));
}

#[test]
fn eight_controller_processes_race_for_one_slot_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("race.db");
    let (_, seal) = load_or_create_keys(&db).unwrap();
    let store = SqliteStore::open(&db, Sealer::new(&seal, "managed").unwrap()).unwrap();
    race(&store, db.to_str().unwrap());
}
