//! A PostgreSQL outage mid-test is an error, never absence (C0.4 rule 2,
//! C18.1), and the store reconnects once the server is back. This is its
//! own test binary because it stops the shared throwaway server.
//! Uses the `SMOLBOX_PG_*` variables exported by `scripts/pg.sh`.
#![allow(clippy::unwrap_used)] // tests: a panic is the failure report

use std::process::Command;

use smolbox_core::Category;
use smolbox_core::managed::testkit::{accepted, exec_spec, fingerprint_key, key};
use smolbox_store::{EncryptionKey, PostgresStore, Sealer, Store};

struct Server {
    bin: String,
    data: String,
    user: String,
    port: String,
    sockdir: String,
}

impl Server {
    fn from_env() -> Option<Self> {
        let var = |n: &str| std::env::var(n).ok().filter(|v| !v.is_empty());
        let s = Self {
            bin: var("SMOLBOX_PG_BIN")?,
            data: var("SMOLBOX_PG_DATA")?,
            user: var("SMOLBOX_PG_USER")?,
            port: var("SMOLBOX_PG_PORT")?,
            sockdir: var("SMOLBOX_PG_SOCKDIR")?,
        };
        Some(s)
    }

    fn pg_ctl(&self, args: &[&str]) {
        let pg_ctl = format!("{}/pg_ctl", self.bin);
        let is_root = Command::new("id")
            .arg("-u")
            .output()
            .is_ok_and(|o| o.stdout.starts_with(b"0"));
        let status = if is_root {
            Command::new("runuser")
                .args(["-u", &self.user, "--", &pg_ctl])
                .args(args)
                .status()
        } else {
            Command::new(&pg_ctl).args(args).status()
        };
        assert!(status.unwrap().success(), "pg_ctl {args:?} failed");
    }

    fn stop(&self) {
        self.pg_ctl(&["-D", &self.data, "-m", "fast", "-w", "stop"]);
    }

    fn start(&self) {
        let opts = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off",
            self.port, self.sockdir
        );
        let log = format!("{}/server.log", self.sockdir);
        self.pg_ctl(&[
            "-D", &self.data, "-l", &log, "-w", "-t", "60", "-o", &opts, "start",
        ]);
    }
}

/// Starts the server again even when an assertion fails mid-outage.
struct Restart<'a>(&'a Server);

impl Drop for Restart<'_> {
    fn drop(&mut self) {
        self.0.start();
    }
}

#[test]
fn stopped_server_is_an_error_never_absence() {
    let ci = std::env::var("CI").is_ok_and(|v| v == "true");
    let (Some(url), Some(server)) = (
        std::env::var("SMOLBOX_PG_URL")
            .ok()
            .filter(|u| !u.is_empty()),
        Server::from_env(),
    ) else {
        assert!(
            !ci,
            "SMOLBOX_PG_URL / SMOLBOX_PG_* are not set in CI: the outage test must run"
        );
        eprintln!("PostgreSQL outage test SKIPPED: run scripts/test.sh");
        return;
    };
    let k = EncryptionKey::new([9; 32], &fingerprint_key()).unwrap();
    let store = PostgresStore::connect(&url, Sealer::new(&k, "outage").unwrap()).unwrap();
    let rec = accepted(key("s", "kept"), exec_spec("x"), 1);
    store.accept(&rec, 100).unwrap();
    {
        server.stop();
        let _restart = Restart(&server);
        let results = [
            store.fetch(&rec.key).map(|_| ()),
            store.fetch(&key("s", "never-written")).map(|_| ()),
            store
                .accept(&accepted(key("s", "new"), exec_spec("x"), 1), 100)
                .map(|_| ()),
            store.claim(&rec.key, "ctl", 2, 1_000).map(|_| ()),
            store.cancel(&rec.key, 2).map(|_| ()),
            store.due(10, None, 10).map(|_| ()),
            store.usage("w").map(|_| ()),
            store.find_machine("w", "m").map(|_| ()),
        ];
        for r in results {
            let e = r.unwrap_err();
            assert_eq!(e.category(), Category::Store, "{e:?}");
        }
    }
    // Back up: the same handle reconnects and nothing was lost or invented.
    assert_eq!(store.fetch(&rec.key).unwrap(), rec);
    assert_eq!(
        store.fetch(&key("s", "new")).unwrap_err().category(),
        Category::NotFound
    );
}
