//! Cross-crate suites: the end-to-end suite, written once for every shell.
//!
//! A [`Shell`] is the client API in synchronous form (the blocking shell is
//! that API; the tokio shell wraps each call in `block_on`). Each case in
//! [`cases`] is a generic function `fn case<S: Shell>(t: Transport)` run
//! against a fresh devworker over TCP, mutual TLS or a Unix socket; the
//! [`e2e_suite!`] macro instantiates every case for one shell and every
//! transport:
//!
//! ```ignore
//! // tests/tests/e2e_tokio.rs
//! smolbox_tests::e2e_suite!(smolbox_tests::tokio_shell::TokioShell);
//! ```
//!
//! The managed suite ([`managed_cases`]) is written the same way against
//! the shells' `Runtime` ([`managed::ManagedShell`]) and instantiated with
//! [`managed_suite!`].

pub mod blocking_shell;
pub mod cases;
pub mod fixture;
pub mod flood;
pub mod kill;
pub mod managed;
pub mod managed_cases;
pub mod managed_config_cases;
pub mod managed_file_cases;
pub mod managed_inspect_cases;
pub mod managed_machine_cases;
pub mod managed_stream_cases;
pub mod managed_terminal_cases;
pub mod shell;
pub mod sim;
pub mod tokio_shell;
pub mod trace_capture;

pub use fixture::{Fixture, Transport};
pub use shell::{ExecEvent, Shell, StreamHandle, TerminalEvent, TerminalHandle};

/// Instantiates every end-to-end case for `$shell` over each transport
/// (`mod tcp`, `mod tls`, `mod unix`), one `#[test]` per case.
#[macro_export]
macro_rules! e2e_suite {
    ($shell:ty) => {
        $crate::e2e_suite!(@transport $shell, tcp, $crate::Transport::Tcp);
        $crate::e2e_suite!(@transport $shell, tls, $crate::Transport::Tls);
        $crate::e2e_suite!(@transport $shell, unix, $crate::Transport::Unix);
    };
    (@transport $shell:ty, $m:ident, $t:expr) => {
        mod $m {
            $crate::e2e_suite!(@cases $shell, $t,
                node_operations,
                machine_lifecycle,
                buffered_exec,
                streamed_exec,
                streamed_exec_callback,
                callback_panic_is_detached,
                callback_blocked_is_cut_at_the_deadline,
                dropped_stream_detaches,
                fault_drop_after_bytes,
                fault_delay_past_the_operation_budget,
                fault_truncated_and_malformed_json,
                fault_gzip_and_redirect,
                fault_create_mismatch,
                fault_timeout_408,
                fault_stream_close_before_exit,
                fault_stream_stall_hits_idle_budget,
                fault_stream_exit_130,
                response_byte_cap_at_n_and_n_plus_1,
                request_byte_cap_at_n_and_n_plus_1,
                output_allowance_at_n_and_n_plus_1,
                connection_is_reused,
                a_failed_health_preflight_leaves_the_gated_call_unsent,
                sentinels_never_appear_in_errors,
                files_launch_and_logs,
                terminal_echo_and_exit_code,
                terminal_resize_seen_by_stty,
                terminal_next_timeout_keeps_the_session,
                terminal_exit_130_is_uncertain,
                terminal_close_before_exit_is_uncertain,
                terminal_stalled_consumer_hits_output_limit,
                terminal_bad_frames_are_protocol_errors,
                gated_features_are_refused_unsent_on_1_9_2,
                gated_features_run_on_1_22_0,
                unknown_version_is_refused_for_every_operation,
                image_preflight_refuses_imageless_machines,
                image_preflight_is_inside_the_operation_deadline,
            );
        }
    };
    (@cases $shell:ty, $t:expr, $($case:ident),* $(,)?) => {
        $(
            #[test]
            fn $case() {
                $crate::cases::$case::<$shell>($t);
            }
        )*
    };
}
