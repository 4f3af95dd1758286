//! One of the racing controller processes of the 8-process slot race
//! (`tests/tests/slot_race.rs`, issue 14 item 6): on the store `STORE` — a
//! SQLite path (keys next to it) or `postgres:PARTITION:KEYPATH` (the
//! server at `SMOLBOX_PG_URL`, keys next to `KEYPATH`) — the retained
//! machine `race/m1`. For each line `try R` on
//! stdin it submits its own command `race/rR-pINDEX` into the machine's
//! slot (`Store::submit`: acceptance and the slot in one transaction) and
//! answers `won R` or `lost R <category>`; for `release R` (the winner
//! only) it ends that command (`cancelled`) and finishes its hold on the
//! slot, then answers `released R`. The test decides when each phase
//! starts, so no process sleeps.
//!
//! Usage: `slot-racer STORE INDEX`.

use std::io::{BufRead, Write};
use std::time::{SystemTime, UNIX_EPOCH};

use smolbox_core::Category;
use smolbox_core::managed::testkit::{accepted, entry_patch, managed_exec_spec};
use smolbox_core::managed::{ExecState, Guard, RecordKey};
use smolbox_store::keys::load_or_create_keys;
use smolbox_store::{PostgresStore, Sealer, SqliteStore, Store};

const TTL_MS: u64 = 60_000;

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn main() -> Result<(), smolbox_core::Error> {
    let args: Vec<String> = std::env::args().collect();
    let [_, store, index] = args.as_slice() else {
        eprintln!("usage: slot-racer STORE INDEX");
        std::process::exit(2);
    };
    let store: Box<dyn Store> = match store.strip_prefix("postgres:") {
        Some(rest) => {
            let Some((partition, keys)) = rest.split_once(':') else {
                eprintln!("usage: STORE is a SQLite path or postgres:PARTITION:KEYPATH");
                std::process::exit(2);
            };
            let url = std::env::var("SMOLBOX_PG_URL").unwrap_or_default();
            let (_, seal) = load_or_create_keys(std::path::Path::new(keys))?;
            Box::new(PostgresStore::connect(
                &url,
                Sealer::new(&seal, partition)?,
            )?)
        }
        None => {
            let path = std::path::Path::new(store);
            let (_, seal) = load_or_create_keys(path)?;
            Box::new(SqliteStore::open(path, Sealer::new(&seal, "managed")?)?)
        }
    };
    let machine = RecordKey::new("race", "m1")?;
    let owner = format!("racer-{index}");
    let mut out = std::io::stdout().lock();
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        let mut words = line.split_whitespace();
        let (Some(verb), Some(round)) = (words.next(), words.next()) else {
            continue;
        };
        let key = RecordKey::new("race", &format!("r{round}-p{index}"))?;
        let reply = match verb {
            "try" => {
                let rec = accepted(key, managed_exec_spec("race", &machine), now_ms());
                match store.submit(&rec, 10_000) {
                    Ok(_) => format!("won {round}"),
                    Err(e) => format!("lost {round} {}", e.category().as_str()),
                }
            }
            "release" => {
                // End the command (never dispatched), then finish its hold.
                let t = now_ms();
                let rec = store.claim(&key, &owner, t, TTL_MS)?;
                let rec = store.write(
                    &key,
                    &Guard::for_exec(&rec, &owner),
                    &entry_patch(&rec, ExecState::Cancelled),
                    t,
                )?;
                // The previous winner's 1 ms machine claim may still be
                // live (another process): retry until the clock passes it.
                let mut tries = 0u32;
                let m = loop {
                    let seen = store.fetch_machine(&machine)?;
                    let t = now_ms().max(seen.updated_at_ms).max(rec.updated_at_ms);
                    match store.claim_machine(&machine, &owner, t, 1) {
                        Ok(m) => break m,
                        Err(e) if e.category() == Category::StaleClaim && tries < 100_000 => {
                            tries += 1;
                            std::thread::yield_now();
                        }
                        Err(e) => return Err(e),
                    }
                };
                let (_, _, finish) = store.finish_command(
                    &machine,
                    &Guard::for_machine(&m, &owner),
                    &key,
                    m.updated_at_ms,
                )?;
                format!("released {round} {finish:?}")
            }
            _ => continue,
        };
        if writeln!(out, "{reply}").and_then(|()| out.flush()).is_err() {
            break;
        }
    }
    Ok(())
}
