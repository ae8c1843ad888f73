//! Refusals (a claim the node will not allocate) and policy errors (a config or
//! record the node cannot accept).

use std::fmt;

use crate::ClaimUid;

/// Why a claim was refused. Every refusal leaves the node unchanged.
///
/// `Display` is one sentence naming the claim, the device (when there is one)
/// and the reason; `docs/refusals.md` lists every sentence and what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The refused claim.
    pub claim: ClaimUid,
    /// The device concerned, when there is one (device id or published name). A `Box<str>`
    /// rather than a `String`: a refusal travels in every `Result` of the allocator, and it is
    /// kept within 128 bytes.
    pub device: Option<Box<str>>,
    /// Why.
    pub reason: RefusalReason,
    /// For a device held by another claim: what the device's pool has free now, so that the
    /// sentence says where the caller can go instead ([`Refusal::with_pool_free`]). Boxed, as a
    /// refusal travels in every `Result` of the allocator.
    pub pool_free: Option<Box<PoolFree>>,
}

/// What a pool has free when one of its devices was refused as held: the devices with at least
/// one free unit, each with its free units when it has more than one.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PoolFree {
    /// The pool.
    pub pool: String,
    /// `gpu2` for a free whole device, `gpu1 (1 of 2 units)` for a device partly held; empty
    /// when nothing is free.
    pub free: Vec<String>,
}

/// What the node has now that explains a refusal, appended to its sentence: short clauses such
/// as `gpu0 is held by claim c1 (ns/n)` and `no matching device is free`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RefusalContext(pub Vec<String>);

/// The reason of a [`Refusal`]. New reasons may be added in a minor release (hence
/// `non_exhaustive`); a policy constructs the ones that fit.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RefusalReason {
    /// The named device is not published (or not in the inventory).
    UnknownDevice,
    /// The device (or the unit asked) is held by another claim.
    HeldByOther {
        /// The claim holding it.
        holder: ClaimUid,
    },
    /// The claim would hold devices of more than one vendor.
    MixedVendors {
        /// The vendors involved, sorted.
        vendors: Vec<String>,
    },
    /// The request asks more units than the pool's devices have.
    TooManyUnits {
        /// The pool asked.
        pool: String,
        /// Units asked.
        asked: u32,
        /// Most units the pool could ever give for this request.
        most: u32,
    },
    /// The profile is not defined in the pool.
    UnknownProfile {
        /// The profile asked.
        profile: String,
        /// The pool asked.
        pool: String,
    },
    /// The pool is of another family than the request asks.
    WrongFamily {
        /// The pool.
        pool: String,
        /// The pool's family.
        family: String,
        /// What the request asked for.
        asked: String,
    },
    /// No allowed start position of the profile is free on any candidate device.
    NoPlacement {
        /// The profile asked.
        profile: String,
    },
    /// The count request cannot be met with what is free now.
    NoCapacity {
        /// The request name.
        request: String,
        /// Each matching device and who holds it, and what is free, when the node adds it
        /// ([`Refusal::with_context`]); boxed, as a refusal travels in every `Result` of the
        /// allocator.
        context: Option<Box<RefusalContext>>,
    },
    /// The named pool does not exist.
    NoPool {
        /// The pool named.
        pool: String,
    },
    /// Pools have devices matching the request's selector, but none of them is of the family
    /// the request asks for.
    NoPoolOfFamily {
        /// The request name.
        request: String,
        /// The family asked.
        family: String,
    },
    /// No pool has devices matching the request's selector and family.
    NoMatchingPool {
        /// The request name.
        request: String,
    },
    /// Not enough accelerator-local CPUs are left in the shared CPU pool.
    NotEnoughCpus {
        /// CPUs needed.
        asked: u32,
        /// Local CPUs still free (one CPU always stays in the shared pool).
        free: u32,
    },
    /// The request itself is malformed.
    InvalidRequest {
        /// What is wrong.
        why: String,
    },
    /// The node cannot hand the device out now, though a policy chose it: what it needs
    /// besides the device is missing (a shared pool's MPS pipe directory). Found by the node
    /// agent, not by a policy; the claim can be retried once it is there.
    Unavailable {
        /// What is missing and what to do, one sentence.
        why: String,
    },
}

impl RefusalReason {
    /// A short, stable name of the reason (`no_capacity`, `held_by_other`, ...), for counting
    /// refusals by reason (the daemon's `nri_accel_refusals_total`): a closed set, unlike the
    /// sentence.
    pub fn label(&self) -> &'static str {
        match self {
            RefusalReason::UnknownDevice => "unknown_device",
            RefusalReason::HeldByOther { .. } => "held_by_other",
            RefusalReason::MixedVendors { .. } => "mixed_vendors",
            RefusalReason::TooManyUnits { .. } => "too_many_units",
            RefusalReason::UnknownProfile { .. } => "unknown_profile",
            RefusalReason::WrongFamily { .. } => "wrong_family",
            RefusalReason::NoPlacement { .. } => "no_placement",
            RefusalReason::NoCapacity { .. } => "no_capacity",
            RefusalReason::NoPool { .. } => "no_pool",
            RefusalReason::NoPoolOfFamily { .. } => "no_pool_of_family",
            RefusalReason::NoMatchingPool { .. } => "no_matching_pool",
            RefusalReason::NotEnoughCpus { .. } => "not_enough_cpus",
            RefusalReason::InvalidRequest { .. } => "invalid_request",
            RefusalReason::Unavailable { .. } => "device_unavailable",
        }
    }
}

impl Refusal {
    /// A refusal of `claim` about `device` (if any).
    pub fn new(claim: &str, device: Option<&str>, reason: RefusalReason) -> Self {
        Refusal {
            claim: claim.to_string(),
            device: device.map(Box::from),
            reason,
            pool_free: None,
        }
    }

    /// The same refusal with what the device's pool has free appended to its sentence (for a
    /// device held by another claim; other reasons name what they need already).
    pub fn with_pool_free(mut self, pool_free: PoolFree) -> Self {
        if matches!(self.reason, RefusalReason::HeldByOther { .. }) {
            self.pool_free = Some(Box::new(pool_free));
        }
        self
    }

    /// The same refusal with `context` appended to its sentence (for a count that cannot be
    /// met; other reasons name what they need already).
    pub fn with_context(mut self, clauses: Vec<String>) -> Self {
        if let RefusalReason::NoCapacity { context, .. } = &mut self.reason {
            *context = (!clauses.is_empty()).then(|| Box::new(RefusalContext(clauses)));
        }
        self
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.sentence(f)?;
        if let RefusalReason::NoCapacity {
            context: Some(context),
            ..
        } = &self.reason
        {
            write!(f, ": {}", context.0.join("; "))?;
        }
        if let Some(p) = &self.pool_free {
            if p.free.is_empty() {
                write!(f, "; pool {} has no free device now", p.pool)?;
            } else {
                write!(f, "; free in pool {}: {}", p.pool, p.free.join(", "))?;
            }
        }
        Ok(())
    }
}

impl Refusal {
    fn sentence(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.claim;
        let d = self.device.as_deref().unwrap_or("-");
        match &self.reason {
            RefusalReason::UnknownDevice => {
                write!(f, "claim {c} refused: device {d} is not known on this node")
            }
            RefusalReason::HeldByOther { holder } => write!(
                f,
                "claim {c} refused: device {d} is held by claim {holder} until that claim is unprepared"
            ),
            RefusalReason::MixedVendors { vendors } => write!(
                f,
                "claim {c} refused: device {d} would mix vendors {} in one claim",
                vendors.join(" and ")
            ),
            RefusalReason::TooManyUnits { pool, asked, most } => write!(
                f,
                "claim {c} refused: it asks {asked} units of pool {pool} but the pool's devices have at most {most}"
            ),
            RefusalReason::UnknownProfile { profile, pool } => write!(
                f,
                "claim {c} refused: profile {profile} is not defined in pool {pool}"
            ),
            RefusalReason::WrongFamily {
                pool,
                family,
                asked,
            } => write!(
                f,
                "claim {c} refused: pool {pool} is of family {family} but the request asks for {asked}"
            ),
            RefusalReason::NoPlacement { profile } => match &self.device {
                Some(d) => write!(
                    f,
                    "claim {c} refused: no placement is left for a slice of profile {profile} on device {d}"
                ),
                None => write!(
                    f,
                    "claim {c} refused: no placement is left for a slice of profile {profile} on any device"
                ),
            },
            RefusalReason::NoCapacity { request, .. } => write!(
                f,
                "claim {c} refused: request {request} cannot be met by the devices free now"
            ),
            RefusalReason::NoPool { pool } => {
                write!(f, "claim {c} refused: there is no pool named {pool}")
            }
            RefusalReason::NoPoolOfFamily { request, family } => write!(
                f,
                "claim {c} refused: no pool of family {family} has devices matching request {request}"
            ),
            RefusalReason::NoMatchingPool { request } => write!(
                f,
                "claim {c} refused: no pool has devices matching request {request}"
            ),
            RefusalReason::NotEnoughCpus { asked, free } => write!(
                f,
                "claim {c} refused: device {d} needs {asked} accelerator-local CPUs but only {free} are free"
            ),
            RefusalReason::InvalidRequest { why } => {
                write!(f, "claim {c} refused: the request is invalid: {why}")
            }
            RefusalReason::Unavailable { why } => {
                write!(
                    f,
                    "claim {c} refused: device {d} cannot be handed out now: {why}"
                )
            }
        }
    }
}

impl std::error::Error for Refusal {}

/// A pool config, registry lookup or record the node cannot accept. New kinds may be added in a
/// minor release (hence `non_exhaustive`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PolicyError {
    /// The pool names a family or policy nobody registered.
    #[error(
        "pool {pool}: no policy is registered under the name {policy}; this build registers {}: use one of those, or run a daemon built with {policy} (docs/policy-guide.md)",
        registered.join(", ")
    )]
    UnknownPolicy {
        /// The pool.
        pool: String,
        /// The policy name asked.
        policy: String,
        /// The names the registry has, sorted.
        registered: Vec<String>,
    },
    /// The pool's parameters are invalid.
    #[error("pool {pool}: {why}")]
    InvalidPool {
        /// The pool.
        pool: String,
        /// What is wrong and how to fix it.
        why: String,
    },
    /// Two pools share a name.
    #[error("pool {pool} is defined twice; pool names must be unique")]
    DuplicatePool {
        /// The pool.
        pool: String,
    },
    /// Two devices share an id.
    #[error("device {device} appears twice in the inventory; device ids must be unique")]
    DuplicateDevice {
        /// The device id.
        device: String,
    },
    /// Two units would be published under the same name.
    #[error("published device name {name} is produced twice; rename a pool or profile")]
    DuplicatePublished {
        /// The colliding name.
        name: String,
    },
    /// A record cannot be restored.
    #[error("record of claim {claim} cannot be restored: device {device}: {why}")]
    Restore {
        /// The claim of the record.
        claim: ClaimUid,
        /// The device (or pool) the record names.
        device: String,
        /// Why.
        why: String,
    },
}
