//! Benchmarks against named peers; see BENCHMARKS.md for figures and commands.
