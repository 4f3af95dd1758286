//! The managed suite on the blocking shell's `Runtime` (devworker + SQLite).

smolbox_tests::managed_suite!(smolbox_tests::managed::BlockingManaged);
smolbox_tests::managed_machine_suite!(smolbox_tests::managed::BlockingManaged);
smolbox_tests::managed_stream_suite!(smolbox_tests::managed::BlockingManaged);
smolbox_tests::managed_file_suite!(smolbox_tests::managed::BlockingManaged);
smolbox_tests::managed_inspect_suite!(smolbox_tests::managed::BlockingManaged);
smolbox_tests::managed_config_suite!(smolbox_tests::managed::BlockingManaged);
