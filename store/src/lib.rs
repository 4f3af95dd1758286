//! smolbox-store: durable execution and machine records behind one `Store`
//! trait, with memory, SQLite (the embedded default) and PostgreSQL adapters.
