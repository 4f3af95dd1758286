//! Outbound network allowlists (features C9.1) and port mappings (C9.2).

use crate::Reason;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::error::{Error, Operation};

/// Most hostnames in a policy.
pub const MAX_HOSTNAMES: usize = 32;
/// Most CIDRs in a policy.
pub const MAX_CIDRS: usize = 32;
/// Longest hostname in bytes.
pub const MAX_HOSTNAME_LEN: usize = 253;
/// Longest CIDR text in bytes.
pub const MAX_CIDR_LEN: usize = 49;
/// Most port mappings per machine.
pub const MAX_PORTS: usize = 32;

/// A lowercase DNS hostname with ≥2 labels, ≤253 bytes, labels
/// `[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?`; no IP literal, wildcard, URL or
/// trailing dot. It also admits its subdomains (advisory, C9.1).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Hostname(Box<str>);

impl Hostname {
    /// Validates a hostname.
    ///
    /// # Errors
    /// `validation`, operation `machine_spec`, reason `invalid_hostname`.
    pub fn new(name: &str) -> Result<Self, Error> {
        let labels: Vec<&str> = name.split('.').collect();
        let ok = name.len() <= MAX_HOSTNAME_LEN
            && labels.len() >= 2
            && labels.iter().all(|l| is_label(l))
            && name.parse::<Ipv4Addr>().is_err()
            && !labels
                .last()
                .is_some_and(|l| l.bytes().all(|b| b.is_ascii_digit()));
        if ok {
            Ok(Self(name.into()))
        } else {
            Err(Error::validation(
                Operation::MachineSpec,
                Reason::InvalidHostname,
            ))
        }
    }

    /// The hostname text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

fn is_label(l: &str) -> bool {
    let b = l.as_bytes();
    let edge = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    !b.is_empty()
        && b.len() <= 63
        && b.first().is_some_and(edge)
        && b.last().is_some_and(edge)
        && b.iter().all(|c| edge(c) || *c == b'-')
}

/// A network-aligned CIDR in canonical text (`203.0.113.0/24`,
/// `2001:db8::/32`): prefix ≥1, no host bits, ≤49 bytes.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Cidr(Box<str>);

impl Cidr {
    /// Validates canonical CIDR text.
    ///
    /// # Errors
    /// `validation`, operation `machine_spec`, reason `invalid_cidr`.
    pub fn new(text: &str) -> Result<Self, Error> {
        Self::parse(text)
            .ok_or_else(|| Error::validation(Operation::MachineSpec, Reason::InvalidCidr))
    }

    fn parse(text: &str) -> Option<Self> {
        if text.len() > MAX_CIDR_LEN {
            return None;
        }
        let (addr, prefix) = text.split_once('/')?;
        if prefix.is_empty() || prefix.len() > 3 || !prefix.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        if prefix.len() > 1 && prefix.starts_with('0') {
            return None;
        }
        let prefix: u32 = prefix.parse().ok()?;
        let ip: IpAddr = addr.parse().ok()?;
        let (aligned, in_range) = match ip {
            IpAddr::V4(v4) => (
                prefix >= 32 || u32::from(v4) & (u32::MAX >> prefix) == 0,
                (1..=32).contains(&prefix),
            ),
            IpAddr::V6(v6) => (
                prefix >= 128 || u128::from(v6) & (u128::MAX >> prefix) == 0,
                (1..=128).contains(&prefix),
            ),
        };
        let canonical = match ip {
            IpAddr::V4(v4) => v4.to_string() == addr,
            IpAddr::V6(v6) => Ipv6Addr::to_string(&v6) == addr,
        };
        (aligned && in_range && canonical).then(|| Self(text.into()))
    }

    /// The CIDR text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The outbound network policy of a machine (C9.1).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub enum NetworkPolicy {
    /// No outbound network (the default).
    #[default]
    Offline,
    /// Outbound only to these hosts and CIDRs (sorted, unique, not both empty).
    Allowlist {
        /// Allowed hostnames (and their subdomains).
        hosts: Vec<Hostname>,
        /// Allowed CIDRs.
        cidrs: Vec<Cidr>,
    },
}

impl NetworkPolicy {
    /// Builds an allowlist: sorted, duplicates rejected, non-empty, ≤32 of each.
    ///
    /// # Errors
    /// `validation`, operation `machine_spec`.
    pub fn allowlist(mut hosts: Vec<Hostname>, mut cidrs: Vec<Cidr>) -> Result<Self, Error> {
        if hosts.is_empty() && cidrs.is_empty() {
            return Err(Error::validation(
                Operation::MachineSpec,
                Reason::EmptyNetworkPolicy,
            ));
        }
        if hosts.len() > MAX_HOSTNAMES {
            return Err(
                Error::validation(Operation::MachineSpec, Reason::TooManyHostnames)
                    .with_limit(hosts.len() as u64, MAX_HOSTNAMES as u64),
            );
        }
        if cidrs.len() > MAX_CIDRS {
            return Err(
                Error::validation(Operation::MachineSpec, Reason::TooManyCidrs)
                    .with_limit(cidrs.len() as u64, MAX_CIDRS as u64),
            );
        }
        hosts.sort();
        cidrs.sort();
        if hosts.windows(2).any(|w| w[0] == w[1]) || cidrs.windows(2).any(|w| w[0] == w[1]) {
            return Err(Error::validation(
                Operation::MachineSpec,
                Reason::DuplicateNetworkEntry,
            ));
        }
        Ok(Self::Allowlist { hosts, cidrs })
    }

    /// True when outbound network is enabled.
    pub const fn is_enabled(&self) -> bool {
        matches!(self, Self::Allowlist { .. })
    }
}

/// A TCP port mapping `{host, guest}`, both 1–65,535 (C9.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PortMapping {
    host: u16,
    guest: u16,
}

impl PortMapping {
    /// Validates a mapping.
    ///
    /// # Errors
    /// `validation`, operation `machine_spec`, reason `invalid_port`.
    pub fn new(host: u16, guest: u16) -> Result<Self, Error> {
        if host == 0 || guest == 0 {
            return Err(Error::validation(
                Operation::MachineSpec,
                Reason::InvalidPort,
            ));
        }
        Ok(Self { host, guest })
    }

    /// The host port.
    pub const fn host(&self) -> u16 {
        self.host
    }

    /// The guest port.
    pub const fn guest(&self) -> u16 {
        self.guest
    }
}

/// Sorts mappings by host port and checks ≤32 and unique host ports.
///
/// # Errors
/// `validation`, operation `machine_spec`.
pub fn canonical_ports(mut ports: Vec<PortMapping>) -> Result<Vec<PortMapping>, Error> {
    if ports.len() > MAX_PORTS {
        return Err(
            Error::validation(Operation::MachineSpec, Reason::TooManyPorts)
                .with_limit(ports.len() as u64, MAX_PORTS as u64),
        );
    }
    ports.sort();
    if ports.windows(2).any(|w| w[0].host == w[1].host) {
        return Err(Error::validation(
            Operation::MachineSpec,
            Reason::DuplicateHostPort,
        ));
    }
    Ok(ports)
}
