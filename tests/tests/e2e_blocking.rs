//! The end-to-end suite on the blocking shell, over TCP, mutual TLS and a
//! Unix socket: the same cases as `e2e_tokio.rs`, instantiated for
//! `smolbox_blocking::Client`.

smolbox_tests::e2e_suite!(smolbox_tests::blocking_shell::BlockingShell);

/// Not per transport (the flooding peer is plain TCP).
#[test]
fn terminal_fast_consumer_of_a_flood_ends_cleanly() {
    smolbox_tests::cases::terminal_fast_consumer_of_a_flood_ends_cleanly::<
        smolbox_tests::blocking_shell::BlockingShell,
    >();
}
