//! The managed suite on the tokio shell's `Runtime` (devworker + SQLite).

smolbox_tests::managed_suite!(smolbox_tests::managed::TokioManaged);
smolbox_tests::managed_machine_suite!(smolbox_tests::managed::TokioManaged);
smolbox_tests::managed_stream_suite!(smolbox_tests::managed::TokioManaged);
smolbox_tests::managed_file_suite!(smolbox_tests::managed::TokioManaged);
smolbox_tests::managed_inspect_suite!(smolbox_tests::managed::TokioManaged);
smolbox_tests::managed_config_suite!(smolbox_tests::managed::TokioManaged);
