//! A process-wide `tracing` subscriber that records every span and event of
//! every level and target as text, so a test can assert what reached the
//! tracing output (and what never did). Installed once per test binary.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};

/// Everything recorded so far.
static TEXT: Mutex<String> = Mutex::new(String::new());
static INSTALLED: OnceLock<bool> = OnceLock::new();

/// Installs the capturing subscriber as the global default (once; false if
/// another global subscriber was installed first).
pub fn install() -> bool {
    *INSTALLED.get_or_init(|| {
        tracing::subscriber::set_global_default(Capture {
            next: AtomicU64::new(1),
        })
        .is_ok()
    })
}

/// The text recorded so far.
pub fn text() -> String {
    TEXT.lock().unwrap_or_else(PoisonError::into_inner).clone()
}

struct Capture {
    next: AtomicU64,
}

struct Line<'a>(&'a mut String);

impl Visit for Line<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        let _ = write!(self.0, " {}={value:?}", field.name());
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        let _ = write!(self.0, " {}={value}", field.name());
    }
}

fn append(kind: &str, meta: &Metadata<'_>, visit: impl FnOnce(&mut Line<'_>)) {
    let mut s = format!("{kind} {} {} {}:", meta.level(), meta.target(), meta.name());
    visit(&mut Line(&mut s));
    s.push('\n');
    TEXT.lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push_str(&s);
}

impl Subscriber for Capture {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, span: &Attributes<'_>) -> Id {
        append("span", span.metadata(), |l| span.record(l));
        Id::from_u64(self.next.fetch_add(1, Ordering::Relaxed))
    }
    fn record(&self, _: &Id, values: &Record<'_>) {
        let mut s = String::from("record:");
        values.record(&mut Line(&mut s));
        s.push('\n');
        TEXT.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push_str(&s);
    }
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &Event<'_>) {
        append("event", event.metadata(), |l| event.record(l));
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}
