//! Managed terminals on the tokio shell (devworker with real PTYs + SQLite,
//! PostgreSQL when `SMOLBOX_PG_URL` is set).

smolbox_tests::managed_terminal_suite!(smolbox_tests::managed_terminal_cases::TokioTerm);
