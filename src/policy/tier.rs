//! Tiers: a named set of limits that apply together to a caller.

use super::Limit;

/// A tier (free, pro, enterprise, anonymous ...).
#[derive(Debug, Clone, PartialEq)]
pub struct Tier {
    /// Name, unique in the policy (a metric label).
    pub name: String,
    /// API keys or tokens starting with this prefix belong to the tier.
    pub match_prefix: Option<String>,
    /// Limits decided together, all or nothing.
    pub limits: Vec<Limit>,
    /// Split each identity over this many sub-identities (each with 1/N of
    /// every quota) to spread a hot client over N cluster slots; 1 = off.
    pub split: u32,
    /// Declares the tier's callers unlimited (route limits still apply).
    /// A tier in a policy file must have limits or say `unlimited = true`,
    /// so a file cut short after a tier's name is an error, not a lifted
    /// limit; an unlimited tier may not have limits.
    pub unlimited: bool,
}

impl Tier {
    /// An empty tier.
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            match_prefix: None,
            limits: Vec::new(),
            split: 1,
            unlimited: false,
        }
    }

    /// Declares the tier unlimited on purpose (its callers pass; route
    /// limits still apply), as `unlimited = true` does in a file.
    pub fn unlimited(mut self) -> Self {
        self.unlimited = true;
        self
    }

    /// Keys starting with `prefix` belong to this tier.
    pub fn match_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.match_prefix = Some(prefix.into());
        self
    }

    /// Adds a limit.
    pub fn limit(mut self, limit: Limit) -> Self {
        self.limits.push(limit);
        self
    }

    /// Splits every identity of the tier over `n` sub-identities.
    pub fn split(mut self, n: u32) -> Self {
        self.split = n.max(1);
        self
    }
}
