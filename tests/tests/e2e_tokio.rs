//! The end-to-end suite on the tokio shell, over TCP, mutual TLS and a Unix
//! socket (the blocking shell's `e2e_blocking.rs` is the same line).

smolbox_tests::e2e_suite!(smolbox_tests::tokio_shell::TokioShell);

/// Not per transport (the flooding peer is plain TCP).
#[test]
fn terminal_fast_consumer_of_a_flood_ends_cleanly() {
    smolbox_tests::cases::terminal_fast_consumer_of_a_flood_ends_cleanly::<
        smolbox_tests::tokio_shell::TokioShell,
    >();
}
