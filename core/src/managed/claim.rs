//! Leases, claims and fencing guards (C15).
//!
//! A worker lease (per worker id) and a record claim (per record) follow the
//! same rule, [`take`]: the same owner renews (`until = max(old, now + ttl)`),
//! an expired or absent lease goes to the new owner with generation + 1, and
//! a live lease of another owner is `stale_claim`. Every mutating write
//! carries a [`Guard`] checked by [`check_guard`].
//!
//! Fencing protects store writes only: a lease, claim or generation never
//! proves that an HTTP request already sent cannot still take effect.

use crate::Reason;
use serde::{Deserialize, Serialize};

use super::record::{Assignment, Claim, ExecutionRecord, MachineRecord};
use super::{MAX_COUNTER, check_identifier};
use crate::{Error, Evidence, Operation};

/// Shortest lease or claim TTL in milliseconds (C15).
pub const MIN_TTL_MS: u64 = 1;
/// Longest lease or claim TTL in milliseconds (C15).
pub const MAX_TTL_MS: u64 = 900_000;

/// A worker lease `{owner, generation, until}` (C15).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Lease {
    /// Controller identifier.
    pub owner: String,
    /// Generation, > 0; +1 on every change of owner.
    pub generation: u64,
    /// Expiry, wall-clock milliseconds.
    pub until_ms: u64,
}

/// The fencing token every mutating write carries (C15).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Guard {
    /// The claiming controller.
    pub owner: String,
    /// The claim generation it holds.
    pub generation: u64,
    /// The record version it read.
    pub version: u64,
}

impl Guard {
    /// The guard for the current claim and version of `rec`, for `owner`.
    pub fn for_exec(rec: &ExecutionRecord, owner: &str) -> Self {
        Self {
            owner: owner.to_owned(),
            generation: rec.generation,
            version: rec.version,
        }
    }

    /// The guard for the current claim and version of a machine record.
    pub fn for_machine(rec: &MachineRecord, owner: &str) -> Self {
        Self {
            owner: owner.to_owned(),
            generation: rec.generation,
            version: rec.version,
        }
    }
}

/// Takes or renews a lease for `owner` at `now_ms` (C15).
///
/// # Errors
/// `validation` for a bad owner or TTL; `stale_claim` when another owner
/// holds a live lease.
pub fn take(
    current: Option<&Lease>,
    owner: &str,
    now_ms: u64,
    ttl_ms: u64,
) -> Result<Lease, Error> {
    check_identifier(owner).map_err(|e| e.with_operation(Operation::StoreClaim))?;
    if !(MIN_TTL_MS..=MAX_TTL_MS).contains(&ttl_ms) {
        return Err(
            Error::validation(Operation::StoreClaim, Reason::Ttl).with_limit(ttl_ms, MAX_TTL_MS)
        );
    }
    let until = now_ms.saturating_add(ttl_ms);
    match current {
        Some(l) if l.owner == owner => Ok(Lease {
            owner: owner.to_owned(),
            generation: l.generation,
            until_ms: l.until_ms.max(until),
        }),
        Some(l) if l.until_ms > now_ms => Err(Error::stale_claim(
            Operation::StoreClaim,
            Evidence::NotDispatched,
            Reason::HeldByOther,
        )),
        Some(l) if l.generation >= MAX_COUNTER => Err(Error::validation(
            Operation::StoreClaim,
            Reason::GenerationExhausted,
        )),
        other => Ok(Lease {
            owner: owner.to_owned(),
            generation: other.map_or(1, |l| l.generation + 1),
            until_ms: until,
        }),
    }
}

/// Claims (or renews the claim on) an execution record: the claim rule of
/// [`take`], then version + 1 (a claim is a write). The result is
/// validated.
///
/// # Errors
/// As [`take`]; `validation` when `now_ms < updated_at` or the result
/// breaks an invariant (a version or generation at its limit).
pub fn claim_exec(
    rec: &ExecutionRecord,
    owner: &str,
    now_ms: u64,
    ttl_ms: u64,
) -> Result<ExecutionRecord, Error> {
    let lease = take(
        record_lease(rec.claim.as_ref(), rec.generation).as_ref(),
        owner,
        now_ms,
        ttl_ms,
    )?;
    if now_ms < rec.updated_at_ms {
        return Err(Error::validation(
            Operation::StoreClaim,
            Reason::ClockBeforeUpdatedAt,
        ));
    }
    let mut next = rec.clone();
    next.generation = lease.generation;
    next.claim = Some(Claim {
        owner: lease.owner,
        until_ms: lease.until_ms,
    });
    next.version += 1;
    next.updated_at_ms = now_ms;
    next.validate()
        .map_err(|e| e.with_operation(Operation::StoreClaim))?;
    Ok(next)
}

/// Claims an execution record only at `version`, and re-fences it (C15):
/// the claim rule of [`claim_exec`]; a record assigned to a worker moves
/// to the generation of that worker's live lease, which the claimer must
/// hold. From then on writers of the older worker-lease generation are
/// fenced (`stale_claim`), so a recovering controller that holds the
/// worker can move forward a record another controller assigned under an
/// older lease, having decided what to do from the record as it read it
/// (the version). Fencing protects store writes only: a request the older
/// controller already sent may still take effect.
///
/// # Errors
/// `stale_version` when the record moved on; `stale_claim` (reason
/// `worker_lease`) for an assigned record when `worker_lease` is not the
/// claimer's live lease; otherwise as [`claim_exec`].
pub fn claim_exec_version(
    rec: &ExecutionRecord,
    owner: &str,
    version: u64,
    worker_lease: Option<&Lease>,
    now_ms: u64,
    ttl_ms: u64,
) -> Result<ExecutionRecord, Error> {
    let generation = refence_generation(
        rec.version == version,
        rec.assignment.is_some(),
        owner,
        worker_lease,
        now_ms,
    )?;
    let mut next = claim_exec(rec, owner, now_ms, ttl_ms)?;
    if let (Some(a), Some(g)) = (next.assignment.as_mut(), generation) {
        a.worker_generation = g;
        next.validate()
            .map_err(|e| e.with_operation(Operation::StoreClaim))?;
    }
    Ok(next)
}

/// Claims a machine record: the claim rule of [`take`], then `claims` + 1
/// instead of version + 1. The version of a machine record is what
/// callers compare against (C14.2, C17.3), and a claim is no caller-visible
/// change: an operator's versioned request at the version read before a
/// controller renewed its claim still applies. Controller writes stay
/// fenced by the claim's owner and generation (a new owner moves the
/// generation) and by the version of every other write. The result is
/// validated.
///
/// # Errors
/// As [`claim_exec`].
pub fn claim_machine(
    rec: &MachineRecord,
    owner: &str,
    now_ms: u64,
    ttl_ms: u64,
) -> Result<MachineRecord, Error> {
    let lease = take(
        record_lease(rec.claim.as_ref(), rec.generation).as_ref(),
        owner,
        now_ms,
        ttl_ms,
    )?;
    if now_ms < rec.updated_at_ms {
        return Err(Error::validation(
            Operation::StoreClaim,
            Reason::ClockBeforeUpdatedAt,
        ));
    }
    let mut next = rec.clone();
    next.generation = lease.generation;
    next.claim = Some(Claim {
        owner: lease.owner,
        until_ms: lease.until_ms,
    });
    next.claims += 1;
    next.updated_at_ms = now_ms;
    next.validate()
        .map_err(|e| e.with_operation(Operation::StoreClaim))?;
    Ok(next)
}

/// Claims a machine record only at `version`, and re-fences it (C15), as
/// [`claim_exec_version`] does for executions: an assigned machine moves
/// to the generation of its worker's live lease, which the claimer must
/// hold, so writers under an older worker-lease generation are fenced from
/// then on and the claimer (the new lease holder) moves the machine
/// forward from the record as it read it (the version).
///
/// # Errors
/// `stale_version` when the record moved on; `stale_claim` (reason
/// `worker_lease`) for an assigned record when `worker_lease` is not the
/// claimer's live lease; otherwise as [`claim_machine`].
pub fn claim_machine_version(
    rec: &MachineRecord,
    owner: &str,
    version: u64,
    worker_lease: Option<&Lease>,
    now_ms: u64,
    ttl_ms: u64,
) -> Result<MachineRecord, Error> {
    let generation = refence_generation(
        rec.version == version,
        rec.assignment.is_some(),
        owner,
        worker_lease,
        now_ms,
    )?;
    let mut next = claim_machine(rec, owner, now_ms, ttl_ms)?;
    if let (Some(a), Some(g)) = (next.assignment.as_mut(), generation) {
        // Not caller-visible: the version stays; the old generation's
        // writers are fenced by the generation itself.
        a.worker_generation = g;
        next.validate()
            .map_err(|e| e.with_operation(Operation::StoreClaim))?;
    }
    Ok(next)
}

/// The rule both versioned claims share: the record must still be at the
/// version read (`stale_version`), and an assigned record moves to the
/// generation of its worker's lease, which the claimer must hold live
/// (`stale_claim`, reason `worker_lease`). `None` for an unassigned record.
fn refence_generation(
    at_version: bool,
    assigned: bool,
    owner: &str,
    worker_lease: Option<&Lease>,
    now_ms: u64,
) -> Result<Option<u64>, Error> {
    if !at_version {
        return Err(Error::stale_version(
            Operation::StoreClaim,
            Evidence::NotDispatched,
            Reason::VersionMismatch,
        ));
    }
    if !assigned {
        return Ok(None);
    }
    match worker_lease {
        Some(l) if l.owner == owner && l.until_ms > now_ms => Ok(Some(l.generation)),
        _ => Err(Error::stale_claim(
            Operation::StoreClaim,
            Evidence::NotDispatched,
            Reason::WorkerLease,
        )),
    }
}

/// The record's claim as a lease; a record never claimed has generation 0,
/// so its first claim gets generation 1.
fn record_lease(claim: Option<&Claim>, generation: u64) -> Option<Lease> {
    match claim {
        Some(c) => Some(Lease {
            owner: c.owner.clone(),
            generation,
            until_ms: c.until_ms,
        }),
        None if generation > 0 => Some(Lease {
            owner: String::new(),
            generation,
            until_ms: 0,
        }),
        None => None,
    }
}

/// The parts of a record a guard is checked against.
#[derive(Clone, Copy, Debug)]
pub struct Fence<'a> {
    /// Record version.
    pub version: u64,
    /// Record claim.
    pub claim: Option<&'a Claim>,
    /// Record claim generation.
    pub generation: u64,
    /// Record assignment (its worker generation is fenced too).
    pub assignment: Option<&'a Assignment>,
}

impl<'a> Fence<'a> {
    /// The fence of an execution record.
    pub fn of_exec(rec: &'a ExecutionRecord) -> Self {
        Self {
            version: rec.version,
            claim: rec.claim.as_ref(),
            generation: rec.generation,
            assignment: rec.assignment.as_ref(),
        }
    }

    /// The fence of a machine record.
    pub fn of_machine(rec: &'a MachineRecord) -> Self {
        Self {
            version: rec.version,
            claim: rec.claim.as_ref(),
            generation: rec.generation,
            assignment: rec.assignment.as_ref(),
        }
    }
}

/// Checks a write's guard (C15): version mismatch → `stale_version`;
/// owner or generation mismatch, expired claim, or the record's worker
/// generation ≠ the current worker lease generation → `stale_claim`.
///
/// # Errors
/// `stale_version` or `stale_claim` attributed to `op`.
pub fn check_guard(
    fence: Fence<'_>,
    guard: &Guard,
    worker_lease: Option<&Lease>,
    now_ms: u64,
    op: Operation,
) -> Result<(), Error> {
    if guard.version != fence.version {
        return Err(Error::stale_version(
            op,
            Evidence::NotDispatched,
            Reason::VersionMismatch,
        ));
    }
    let Some(claim) = fence.claim else {
        return Err(Error::stale_claim(
            op,
            Evidence::NotDispatched,
            Reason::NoClaim,
        ));
    };
    if claim.owner != guard.owner || fence.generation != guard.generation {
        return Err(Error::stale_claim(
            op,
            Evidence::NotDispatched,
            Reason::ClaimOwner,
        ));
    }
    if claim.until_ms <= now_ms {
        return Err(Error::stale_claim(
            op,
            Evidence::NotDispatched,
            Reason::ClaimExpired,
        ));
    }
    if let Some(a) = fence.assignment
        && worker_lease.map(|l| l.generation) != Some(a.worker_generation)
    {
        return Err(Error::stale_claim(
            op,
            Evidence::NotDispatched,
            Reason::WorkerGeneration,
        ));
    }
    Ok(())
}

/// What a claim release found (C15): the claim was ended by this call, or
/// there was nothing left to end (it had lapsed already, or the record was
/// never claimed): nothing is written then.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Release<T> {
    /// The claim ended now: the record or lease to store.
    Ended(T),
    /// Nothing to end; the record or lease as it is.
    Lapsed,
}

/// The rule every claim release shares: `owner` must be the claim's owner
/// at `generation` (the one it last held), else `stale_claim`: another
/// controller took it over, and nothing changes. `true` when the claim is
/// still live at `now_ms` (there is something to end).
fn check_release(
    claim: Option<(&str, u64)>,
    record_generation: u64,
    owner: &str,
    generation: u64,
    now_ms: u64,
) -> Result<bool, Error> {
    check_identifier(owner).map_err(|e| e.with_operation(Operation::StoreClaim))?;
    if record_generation != generation {
        return Err(Error::stale_claim(
            Operation::StoreClaim,
            Evidence::Unknown,
            Reason::ClaimOwner,
        ));
    }
    match claim {
        Some((o, _)) if o != owner => Err(Error::stale_claim(
            Operation::StoreClaim,
            Evidence::Unknown,
            Reason::ClaimOwner,
        )),
        Some((_, until)) => Ok(until > now_ms),
        None => Ok(false),
    }
}

/// Releases `owner`'s claim on an execution record (C15; a controller
/// ending, so the next one need not wait out the TTL): the claim is
/// ended in place (its `until_ms` becomes `now_ms`, the owner stays
/// visible), exactly as if its TTL had lapsed now, so every rule that
/// takes over a lapsed claim applies at once (the next owner gets
/// generation + 1). The version moves by one (a release is a write, as a
/// claim is); state, evidence, result, cleanup, slot and reservation never
/// change.
///
/// # Errors
/// `stale_claim` when the record's claim is not `owner`'s at `generation`;
/// `validation` for a bad owner or a version at its limit.
pub fn release_exec(
    rec: &ExecutionRecord,
    owner: &str,
    generation: u64,
    now_ms: u64,
) -> Result<Release<ExecutionRecord>, Error> {
    release(rec, owner, generation, now_ms, |next| next.version += 1)
}

/// Releases `owner`'s claim on a machine record, as [`release_exec`]
/// does, moving `claims` instead of the version (a claim change is not
/// caller-visible, [`claim_machine`]). State, operation, the command slot,
/// the reservation and the ports never change.
///
/// # Errors
/// As [`release_exec`].
pub fn release_machine(
    rec: &MachineRecord,
    owner: &str,
    generation: u64,
    now_ms: u64,
) -> Result<Release<MachineRecord>, Error> {
    release(rec, owner, generation, now_ms, |next| next.claims += 1)
}

/// A stored record with a claim that [`release`] ends in place.
trait Claimed: Clone {
    fn claim(&self) -> Option<&Claim>;
    fn claim_mut(&mut self) -> Option<&mut Claim>;
    fn generation(&self) -> u64;
    fn updated_at_ms(&mut self) -> &mut u64;
    fn check(&self) -> Result<(), Error>;
}

/// Both stored records keep their claim, generation and update time in
/// fields of the same names.
macro_rules! impl_claimed {
    ($($record:ty),*) => {$(
        impl Claimed for $record {
            fn claim(&self) -> Option<&Claim> {
                self.claim.as_ref()
            }
            fn claim_mut(&mut self) -> Option<&mut Claim> {
                self.claim.as_mut()
            }
            fn generation(&self) -> u64 {
                self.generation
            }
            fn updated_at_ms(&mut self) -> &mut u64 {
                &mut self.updated_at_ms
            }
            fn check(&self) -> Result<(), Error> {
                self.validate()
            }
        }
    )*};
}

impl_claimed!(ExecutionRecord, MachineRecord);

/// The one release of a record's claim: [`check_release`], then the claim
/// ends now, `count` moves the record's write counter, and the record is
/// validated.
fn release<R: Claimed>(
    rec: &R,
    owner: &str,
    generation: u64,
    now_ms: u64,
    count: impl FnOnce(&mut R),
) -> Result<Release<R>, Error> {
    let claim = rec.claim().map(|c| (c.owner.as_str(), c.until_ms));
    if !check_release(claim, rec.generation(), owner, generation, now_ms)? {
        return Ok(Release::Lapsed);
    }
    let mut next = rec.clone();
    if let Some(c) = next.claim_mut() {
        c.until_ms = now_ms;
    }
    count(&mut next);
    let updated = next.updated_at_ms();
    *updated = (*updated).max(now_ms);
    next.check()
        .map_err(|e| e.with_operation(Operation::StoreClaim))?;
    Ok(Release::Ended(next))
}

/// Releases `owner`'s worker lease at `generation`, as [`release_exec`]
/// does for a record: it ends now, the owner and generation stay, so the
/// next owner takes it with generation + 1 and records assigned under it
/// are re-fenced as after a lapse.
///
/// # Errors
/// As [`release_exec`].
pub fn release_lease(
    current: Option<&Lease>,
    owner: &str,
    generation: u64,
    now_ms: u64,
) -> Result<Release<Lease>, Error> {
    let Some(l) = current else {
        check_identifier(owner).map_err(|e| e.with_operation(Operation::StoreClaim))?;
        return Ok(Release::Lapsed);
    };
    let claim = Some((l.owner.as_str(), l.until_ms));
    if !check_release(claim, l.generation, owner, generation, now_ms)? {
        return Ok(Release::Lapsed);
    }
    Ok(Release::Ended(Lease {
        owner: l.owner.clone(),
        generation: l.generation,
        until_ms: now_ms,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Category;

    fn lease(owner: &str, generation: u64, until_ms: u64) -> Lease {
        Lease {
            owner: owner.into(),
            generation,
            until_ms,
        }
    }

    /// A store refusal says its own call sent nothing (`not_dispatched`);
    /// a controller that sent a request earlier corrects it
    /// (`with_known_evidence`).
    #[test]
    fn a_store_refusal_says_its_own_call_sent_nothing() {
        let refused = take(Some(&lease("a", 1, 10_000)), "b", 1_000, 5_000).unwrap_err();
        assert_eq!(
            (refused.category(), refused.evidence()),
            (Category::StaleClaim, Evidence::NotDispatched)
        );
    }

    #[test]
    fn same_owner_renews_without_shortening() {
        let l = take(Some(&lease("a", 3, 10_000)), "a", 1_000, 2_000).unwrap();
        assert_eq!((l.generation, l.until_ms), (3, 10_000));
        let l = take(Some(&lease("a", 3, 10_000)), "a", 9_000, 2_000).unwrap();
        assert_eq!(l.until_ms, 11_000);
    }

    #[test]
    fn expired_lease_moves_with_generation_plus_one() {
        let l = take(Some(&lease("a", 3, 1_000)), "b", 1_000, 500).unwrap();
        assert_eq!(
            (l.owner.as_str(), l.generation, l.until_ms),
            ("b", 4, 1_500)
        );
        assert_eq!(take(None, "b", 0, 1).unwrap().generation, 1);
    }

    #[test]
    fn live_lease_of_another_owner_is_stale_claim() {
        let e = take(Some(&lease("a", 3, 1_001)), "b", 1_000, 500).unwrap_err();
        assert_eq!(e.category(), Category::StaleClaim);
    }

    #[test]
    fn ttl_bounds_are_n_and_n_plus_one() {
        assert!(take(None, "a", 0, MAX_TTL_MS).is_ok());
        assert!(take(None, "a", 0, MAX_TTL_MS + 1).is_err());
        assert!(take(None, "a", 0, 0).is_err());
    }

    #[test]
    fn a_released_lease_goes_to_the_next_owner_at_once_with_generation_plus_one() {
        let held = lease("a", 3, 30_000);
        let Release::Ended(l) = release_lease(Some(&held), "a", 3, 1_000).unwrap() else {
            panic!("a live lease is ended");
        };
        assert_eq!(
            (l.owner.as_str(), l.generation, l.until_ms),
            ("a", 3, 1_000)
        );
        // Another owner at the same instant: no TTL to wait out.
        let next = take(Some(&l), "b", 1_000, 500).unwrap();
        assert_eq!((next.owner.as_str(), next.generation), ("b", 4));
        // Without the release the same take is refused.
        assert_eq!(
            take(Some(&held), "b", 1_000, 500).unwrap_err().category(),
            Category::StaleClaim
        );
        // The same owner renews its own released lease at its generation.
        assert_eq!(take(Some(&l), "a", 1_000, 500).unwrap().generation, 3);
    }

    #[test]
    fn a_release_is_guarded_by_owner_and_generation_and_idempotent() {
        let held = lease("a", 3, 30_000);
        for (owner, generation) in [("b", 3), ("a", 2), ("a", 4)] {
            let e = release_lease(Some(&held), owner, generation, 1_000).unwrap_err();
            assert_eq!(
                (e.category(), e.reason()),
                (Category::StaleClaim, Reason::ClaimOwner)
            );
        }
        // Lapsed already (or never taken): nothing to write.
        let lapsed = lease("a", 3, 1_000);
        assert_eq!(
            release_lease(Some(&lapsed), "a", 3, 1_000).unwrap(),
            Release::Lapsed
        );
        assert_eq!(release_lease(None, "a", 1, 1_000).unwrap(), Release::Lapsed);
        assert!(release_lease(None, "", 1, 1_000).is_err());
    }
}
