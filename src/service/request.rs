//! The decision service's own request and answer: what the gRPC and JSON
//! front ends convert from and to. Nothing here knows a wire format.

use std::time::Duration;

use super::proto::Unit;

/// A rate limit service request: a domain and its descriptors.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RlsRequest {
    /// The domain (a configured one, or any other: then every descriptor
    /// is OK).
    pub domain: String,
    /// The descriptors, decided together.
    pub descriptors: Vec<RlsDescriptor>,
    /// Units each descriptor is charged unless it names its own; 0 means 1.
    pub hits_addend: u32,
}

/// Most descriptors one request may carry. A proxy sends one per rate
/// limit action of a route (a handful); each becomes one group of a single
/// store script, so a bound keeps one request from holding the store.
pub(crate) const MAX_DESCRIPTORS: usize = 128;

/// Most entries one descriptor may carry.
pub(crate) const MAX_ENTRIES: usize = 64;

impl RlsRequest {
    /// `Err` with the reason (for a 400 or INVALID_ARGUMENT) when the
    /// request carries more than [`MAX_DESCRIPTORS`] descriptors or a
    /// descriptor more than [`MAX_ENTRIES`] entries.
    pub(crate) fn check_size(&self) -> Result<(), String> {
        if self.descriptors.len() > MAX_DESCRIPTORS {
            return Err(format!(
                "{} descriptors, at most {MAX_DESCRIPTORS} are accepted",
                self.descriptors.len()
            ));
        }
        if let Some(d) = self
            .descriptors
            .iter()
            .find(|d| d.entries.len() > MAX_ENTRIES)
        {
            return Err(format!(
                "a descriptor with {} entries, at most {MAX_ENTRIES} are accepted",
                d.entries.len()
            ));
        }
        Ok(())
    }
}

impl RlsRequest {
    /// `Err` with envoyproxy/ratelimit's message when the domain is empty
    /// or there is no descriptor: it answers such a request with an error
    /// (gRPC UNKNOWN, `/json` 400), never with a status list.
    pub(crate) fn check_required(&self) -> Result<(), &'static str> {
        if self.domain.is_empty() {
            Err("rate limit domain must not be empty")
        } else if self.descriptors.is_empty() {
            Err("rate limit descriptor list must not be empty")
        } else {
            Ok(())
        }
    }
}

/// One descriptor of a request.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RlsDescriptor {
    /// `(key, value)` entries, outermost first.
    pub entries: Vec<(String, String)>,
    /// A limit sent by the proxy, used instead of the configured one.
    pub limit: Option<LimitOverride>,
    /// Units this descriptor is charged; `Some(0)` checks it without
    /// charging; `None` uses the request's.
    pub hits_addend: Option<u64>,
}

impl RlsDescriptor {
    /// The entries as borrowed pairs, as `Domain`'s lookups take them.
    pub(crate) fn entry_refs(&self) -> Vec<(&str, &str)> {
        self.entries
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect()
    }
}

/// A limit sent with a descriptor: `requests_per_unit` per `unit`, a
/// fixed window aligned to the epoch like configured ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitOverride {
    /// Requests per unit.
    pub requests_per_unit: u32,
    /// The unit.
    pub unit: Unit,
}

/// The answer: overall and per descriptor.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RlsAnswer {
    /// Whether any enforced descriptor is over its limit.
    pub over_limit: bool,
    /// One per request descriptor, in request order.
    pub statuses: Vec<RlsStatus>,
    /// Headers for the client's response (`RateLimit`, `RateLimit-Policy`).
    pub response_headers: Vec<(String, String)>,
    /// `dynamic_metadata` for the proxy, a JSON object (with `[rls]
    /// response_dynamic_metadata`): the request's `domain`, its
    /// `descriptors` (`entries` as `key=value`, an override's `limit`, a
    /// `hitsAddend`), the request's `hitsAddend` when not 0, and under
    /// `metadata` the YAML `metadata` of every rule whose descriptor
    /// passed, merged (the first value of a key wins, objects merge).
    pub dynamic_metadata: Option<serde_json::Value>,
}

/// One descriptor's status.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RlsStatus {
    /// Over its limit (never for a shadow or unlimited rule).
    pub over_limit: bool,
    /// The limit that applied; `None` when no rule matched or it is
    /// unlimited.
    pub current_limit: Option<CurrentLimit>,
    /// Requests left (rounded down).
    pub limit_remaining: u32,
    /// Until the quota is back (rounded up to whole seconds is left to
    /// the proxy).
    pub duration_until_reset: Duration,
}

/// The limit reported in a status.
#[derive(Debug, Clone, PartialEq)]
pub struct CurrentLimit {
    /// Requests per unit.
    pub requests_per_unit: u32,
    /// The unit.
    pub unit: Unit,
    /// The rule's name, if any.
    pub name: String,
}
