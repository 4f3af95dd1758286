//! The worker leases one controller holds (C15), each bounded by the wall
//! clock and by a monotonic end (issue 12).

use std::collections::BTreeMap;
use std::time::Instant;

use crate::managed::claim::Lease;

/// The worker leases this controller holds (C15): taken when a disposable
/// execution needs its worker, renewed every third of the TTL while any
/// does. Every write on an assigned record is fenced by it.
#[derive(Debug, Default)]
pub(crate) struct Leases {
    pub(super) map: BTreeMap<String, LeaseState>,
    /// The latest monotonic time the controller was given (set before every
    /// pump), for [`Leases::held`], which callers without a `now` use.
    pub(super) now: Option<Instant>,
}

#[derive(Debug, Default)]
pub(super) struct LeaseState {
    pub(super) lease: Option<Lease>,
    /// When the lease was last confirmed (monotonic).
    pub(super) at: Option<Instant>,
    /// The lease's monotonic end: its TTL counted from when the request
    /// that took or renewed it was sent (C13.4's rule for budgets, applied
    /// to the lease, issue 12): a wall clock stepped back never extends it.
    pub(super) until: Option<Instant>,
    /// When the outstanding take or renewal was sent, and the wall-clock
    /// time it carried.
    pub(super) sent: Option<(Instant, u64)>,
    pub(super) inflight: bool,
    pub(super) retry_at: Option<Instant>,
}

impl Leases {
    /// True while this controller holds an unexpired lease on `worker`, by
    /// the last wall-clock reading and the latest monotonic time given.
    pub(crate) fn held(&self, worker: &str, now_ms: u64) -> bool {
        self.map.get(worker).is_some_and(|st| {
            st.lease.as_ref().is_some_and(|l| l.until_ms > now_ms)
                && st
                    .until
                    .is_some_and(|until| self.now.is_none_or(|now| now < until))
        })
    }

    /// The monotonic end of the lease on `worker` (see [`Leases::live`]).
    pub(crate) fn until(&self, worker: &str) -> Option<Instant> {
        self.map.get(worker)?.until
    }

    /// The generation of a live, fresh lease on `worker`: unexpired by the
    /// wall clock and by its monotonic bound, whichever ends first.
    pub(crate) fn live(&self, worker: &str, now: Instant, now_ms: u64) -> Option<u64> {
        let st = self.map.get(worker)?;
        let l = st.lease.as_ref()?;
        (l.until_ms > now_ms
            && st.at.is_some_and(|at| now >= at)
            && st.until.is_some_and(|until| now < until))
        .then_some(l.generation)
    }
}
