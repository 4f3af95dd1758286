//! The managed suite on the blocking shell's `Runtime` (devworker + SQLite).

smolbox_tests::managed_suite!(smolbox_tests::managed::BlockingManaged);
