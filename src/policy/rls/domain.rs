//! A domain's descriptor tree and envoyproxy/ratelimit's matching rules.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::{DescriptorRule, RlsUnit};
use crate::policy::Limit;

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

    /// How many domains there are.
    pub fn len(&self) -> usize {
        self.domains.len()
    }

    /// The domains, by name.
    pub fn iter(&self) -> impl Iterator<Item = &Domain> {
        self.domains.values()
    }

    /// Adds a domain; gives it back if one of its name is already present
    /// (domains are never merged: a second file of one domain is a mistake
    /// envoyproxy/ratelimit refuses too).
    pub fn insert(&mut self, domain: Domain) -> Result<(), Domain> {
        if self.domains.contains_key(&domain.name) {
            return Err(domain);
        }
        self.domains.insert(domain.name.clone(), domain);
        Ok(())
    }
}

/// One domain: a tree of descriptor entries.
#[derive(Debug, Clone, PartialEq)]
pub struct Domain {
    /// The domain's name (a request's `domain`).
    pub name: Arc<str>,
    root: Vec<Node>,
}

/// One configured descriptor entry: `key`, optional `value` (a pattern
/// when it holds `*`), its rule and the entries nested under it.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Node {
    pub(super) key: Arc<str>,
    pub(super) value: Option<Arc<str>>,
    pub(super) rule: Option<DescriptorRule>,
    pub(super) children: Vec<Node>,
}

impl Node {
    /// A node without rule nor children.
    pub(super) fn new(key: &str, value: Option<&str>) -> Self {
        Self {
            key: key.into(),
            value: value.map(Into::into),
            rule: None,
            children: Vec::new(),
        }
    }

    fn is_wildcard(&self) -> bool {
        self.value.as_deref().is_some_and(|v| v.contains('*'))
    }

    /// The label segment: `key`, or `key_value` as envoyproxy/ratelimit
    /// writes the composite key.
    pub(super) fn segment(&self) -> String {
        match &self.value {
            Some(v) => format!("{}_{v}", self.key),
            None => self.key.to_string(),
        }
    }
}

impl Domain {
    /// An empty domain.
    pub fn new(name: &str) -> Self {
        Self {
            name: name.into(),
            root: Vec::new(),
        }
    }

    pub(super) fn with_nodes(name: &str, root: Vec<Node>) -> Self {
        Self {
            name: name.into(),
            root,
        }
    }

    /// Adds `rule` at the path of `(key, value)` entries, creating the
    /// entries above it. Fails, giving back the rule, if the path already
    /// holds a rule (one rule per path, as in envoyproxy/ratelimit's
    /// duplicate composite key check).
    pub fn insert(
        &mut self,
        path: &[(&str, Option<&str>)],
        rule: DescriptorRule,
    ) -> Result<(), DescriptorRule> {
        let mut level = &mut self.root;
        let Some((last, above)) = path.split_last() else {
            return Err(rule);
        };
        for &(key, value) in above {
            let i = match level
                .iter()
                .position(|n| *n.key == *key && n.value.as_deref() == value)
            {
                Some(i) => i,
                None => {
                    level.push(Node::new(key, value));
                    level.len() - 1
                }
            };
            level = &mut level[i].children;
        }
        let (key, value) = *last;
        match level
            .iter_mut()
            .find(|n| *n.key == *key && n.value.as_deref() == value)
        {
            Some(node) if node.rule.is_some() => Err(rule),
            Some(node) => {
                node.rule = Some(rule);
                Ok(())
            }
            None => {
                let mut node = Node::new(key, value);
                node.rule = Some(rule);
                level.push(node);
                Ok(())
            }
        }
    }

    /// The rule for a request descriptor's entries under envoyproxy's
    /// rules: one entry per level, exact value, then `*`-suffixed wildcard
    /// value, then key-only; a rule applies only at the depth equal to
    /// `entries.len()`.
    ///
    /// At each level the first of these that exists is taken and never
    /// reconsidered: an exact entry without a rule (envoyproxy's way of
    /// exempting one value) hides the key-only rule beside it, and a match
    /// whose nested entries do not continue the descriptor matches nothing.
    /// Wildcards are tried in the order they were configured; each `*`
    /// stands for any run of characters, possibly empty.
    pub fn find(&self, entries: &[(&str, &str)]) -> Option<&DescriptorRule> {
        let mut level = &self.root;
        let last = entries.len().checked_sub(1)?;
        for (i, &(key, value)) in entries.iter().enumerate() {
            let same_key = |n: &&Node| *n.key == *key;
            let node = level
                .iter()
                .filter(same_key)
                .find(|n| n.value.as_deref() == Some(value))
                .or_else(|| {
                    level.iter().filter(same_key).find(|n| {
                        n.is_wildcard() && wildcard_match(n.value.as_deref().unwrap_or(""), value)
                    })
                })
                .or_else(|| level.iter().filter(same_key).find(|n| n.value.is_none()))?;
            if i == last {
                return node.rule.as_ref();
            }
            level = &node.children;
        }
        None
    }

    /// The rule of a descriptor that carries its own limit (Envoy's
    /// per-request override, `descriptor.limit`): a fixed window of
    /// `requests_per_unit` per `unit`, enforced (never shadow), whatever
    /// rule the entries would match, as envoyproxy/ratelimit does (it
    /// only requires the domain to exist).
    ///
    /// Its label is `override:` and the entries' keys joined by `.`:
    /// request values never become labels.
    pub fn override_rule(
        &self,
        entries: &[(&str, &str)],
        requests_per_unit: u64,
        unit: RlsUnit,
    ) -> DescriptorRule {
        let keys: Vec<&str> = entries.iter().map(|&(k, _)| k).collect();
        DescriptorRule {
            label: format!("override:{}", keys.join(".")).into(),
            name: None,
            limits: vec![unit.limit(requests_per_unit)],
            unlimited: false,
            shadow: false,
            replaces: Vec::new(),
            unit: Some(unit),
            tier: None,
            cost: None,
            on_store_failure: None,
            mode: None,
            detailed_metric: false,
        }
    }

    /// Every rule of the domain, depth first in configured order.
    pub fn rules(&self) -> Vec<&DescriptorRule> {
        fn walk<'a>(nodes: &'a [Node], out: &mut Vec<&'a DescriptorRule>) {
            for n in nodes {
                out.extend(n.rule.as_ref());
                walk(&n.children, out);
            }
        }
        let mut out = Vec::new();
        walk(&self.root, &mut out);
        out
    }
}

impl RlsUnit {
    /// The limit envoyproxy/ratelimit enforces for `requests_per_unit` per
    /// unit: a fixed window of one unit aligned to the epoch, named after
    /// the unit.
    pub fn limit(self, requests_per_unit: u64) -> Limit {
        Limit::fixed_window(
            self.as_str(),
            requests_per_unit,
            std::time::Duration::from_secs(self.seconds()),
        )
    }
}

/// Whether `value` matches `pattern`, where each `*` stands for any run of
/// characters (possibly empty) and the rest must appear in order: the
/// pattern's first part starts the value, its last part ends it.
pub(super) fn wildcard_match(pattern: &str, value: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    let (first, rest) = match parts.split_first() {
        Some(x) => x,
        None => return value.is_empty(),
    };
    let Some((last, middle)) = rest.split_last() else {
        return *first == value;
    };
    if parts.iter().map(|p| p.len()).sum::<usize>() > value.len()
        || !value.starts_with(first)
        || !value.ends_with(last)
    {
        return false;
    }
    let mut remaining = &value[first.len()..value.len() - last.len()];
    for part in middle {
        match remaining.find(part) {
            Some(i) => remaining = &remaining[i + part.len()..],
            None => return false,
        }
    }
    true
}
