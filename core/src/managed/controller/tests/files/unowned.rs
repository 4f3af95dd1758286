//! A controller without an artifact store (`artifacts` false: the CLI's
//! plain `run`, its managed-machine commands) never drives a record with
//! declared files that another controller accepted (session 11): it could
//! neither stage its inputs nor store its outputs, so driving it would
//! fail a command its submitter's next controller can run.

use super::*;

/// A disposable record with files, accepted by a controller with an
/// artifact store that stopped before driving it, is due: a controller
/// with the worker's profile and no artifact store leaves it as stored
/// (no worker op, no store write); one with an artifact store runs it.
#[test]
fn a_controller_without_artifacts_leaves_a_record_with_files_to_others() {
    let mut s = Sim::new(files_config());
    let key = RecordKey::new("s", "files-due").unwrap();
    let submit = Submit {
        key: key.clone(),
        spec: two_in_two_out(),
    };
    s.ctl.submit(s.now, s.now_ms, submit).unwrap();
    // Only the acceptance is performed (the submitter stops then).
    loop {
        let (_, op) = s.ctl.poll_store_op().expect("the acceptance");
        if op.name() == "accept" {
            s.store.apply(&op).unwrap();
            break;
        }
    }
    let stored = s.record(&key).clone();
    assert_eq!(stored.state, ExecState::Accepted);
    let mut cfg = disposable_config();
    cfg.owner = "ctl-plain".into();
    assert!(!cfg.artifacts);
    let mut t = Sim::new(cfg);
    t.store = std::mem::take(&mut s.store);
    t.now_ms = s.now_ms;
    t.advance(2_500);
    assert!(t.worker.is_empty(), "driven: {:?}", t.worker);
    assert_eq!(t.record(&key), &stored, "written: {:#?}", t.store_log);
    // The next controller with an artifact store runs it.
    let u = restart(&mut t, "ctl-files", 0);
    let kinds: Vec<&str> = u.worker.iter().map(|(_, op)| op.name()).collect();
    assert_eq!(kinds, ["create"]);
}
