//! A domain's descriptor tree and envoyproxy/ratelimit's matching rules.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::{DescriptorRule, RlsUnit};

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

    /// Every rule of every domain, with its domain's name, for checks and
    /// for scaling quotas (`partition`).
    pub(crate) fn rules_mut(&mut self) -> Vec<(Arc<str>, &mut DescriptorRule)> {
        fn walk<'a>(
            name: &Arc<str>,
            nodes: &'a mut [Node],
            out: &mut Vec<(Arc<str>, &'a mut DescriptorRule)>,
        ) {
            for n in nodes {
                if let Some(rule) = n.rule.as_mut() {
                    out.push((name.clone(), rule));
                }
                walk(name, &mut n.children, out);
            }
        }
        let mut out = Vec::new();
        for d in self.domains.values_mut() {
            walk(&d.name, &mut d.root, &mut out);
        }
        out
    }

    /// The domain named `name`, to change it while loading.
    pub(crate) fn domain_mut(&mut self, name: &str) -> Option<&mut Domain> {
        self.domains.get_mut(name)
    }

    /// Adds a domain; gives it back if one of its name is already present
    /// (a second file of one domain is a mistake envoyproxy/ratelimit
    /// refuses too, unless `[rls] merge_domains` merges them on loading).
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
    /// envoyproxy/ratelimit's `value_to_metric`: the request's value,
    /// not the configured one (or none), names this level in per-value
    /// statistics ([`Domain::value_path`]).
    pub(super) value_to_metric: bool,
    /// envoyproxy/ratelimit's `share_threshold` on a wildcard entry: every
    /// value the pattern matches counts on one counter, named by the
    /// pattern ([`Domain::shared_patterns`]).
    pub(super) share_threshold: bool,
}

/// How one level of a request descriptor matched its configured entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Matched {
    /// The entry's value is the request's.
    Exact,
    /// The entry's value is a `*` pattern the request's value matches.
    Wildcard,
    /// The entry has no value: any value of the key.
    KeyOnly,
}

impl Node {
    /// A node without rule nor children.
    pub(super) fn new(key: &str, value: Option<&str>) -> Self {
        Self {
            key: key.into(),
            value: value.map(Into::into),
            rule: None,
            children: Vec::new(),
            value_to_metric: false,
            share_threshold: false,
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

    /// Adds `other`'s top-level entries after this domain's own, as
    /// envoyproxy/ratelimit merges two files of one domain when told to
    /// (`MERGE_DOMAIN_CONFIG`). Fails, naming it, on a top-level entry
    /// (`key` or `key_value`) both define; nothing is added then.
    pub(crate) fn absorb(&mut self, other: Domain) -> Result<(), String> {
        let mine: std::collections::HashSet<(&str, Option<&str>)> = self
            .root
            .iter()
            .map(|n| (&*n.key, n.value.as_deref()))
            .collect();
        if let Some(dup) = other
            .root
            .iter()
            .find(|n| mine.contains(&(&*n.key, n.value.as_deref())))
        {
            return Err(dup.segment());
        }
        self.root.extend(other.root);
        Ok(())
    }

    /// Adds `rule` at the path of `(key, value)` entries, creating the
    /// entries above it. Fails, giving back the rule, if the path already
    /// holds a rule (one rule per path, as in envoyproxy/ratelimit's
    /// duplicate composite key check).
    // The rule comes back whole so the caller can name it in its error;
    // this runs while a policy loads, never on a request.
    #[allow(clippy::result_large_err)]
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
        self.walk(entries)?.last()?.0.rule.as_ref()
    }

    /// The configured entry each level of `entries` matched, under the
    /// rules of [`Domain::find`]; `None` when a level matches nothing.
    fn walk(&self, entries: &[(&str, &str)]) -> Option<Vec<(&Node, Matched)>> {
        let mut level = &self.root;
        let mut out = Vec::with_capacity(entries.len());
        for &(key, value) in entries {
            let same_key = |n: &&Node| *n.key == *key;
            let (node, how) = level
                .iter()
                .filter(same_key)
                .find(|n| n.value.as_deref() == Some(value))
                .map(|n| (n, Matched::Exact))
                .or_else(|| {
                    level
                        .iter()
                        .filter(same_key)
                        .find(|n| {
                            n.is_wildcard()
                                && wildcard_match(n.value.as_deref().unwrap_or(""), value)
                        })
                        .map(|n| (n, Matched::Wildcard))
                })
                .or_else(|| {
                    level
                        .iter()
                        .filter(same_key)
                        .find(|n| n.value.is_none())
                        .map(|n| (n, Matched::KeyOnly))
                })?;
            out.push((node, how));
            level = &node.children;
        }
        Some(out)
    }

    /// For each entry of `entries`, the wildcard pattern its counter is
    /// named by instead of the request's value: `Some` where the entry
    /// matched a `*` pattern with `share_threshold` (so every value the
    /// pattern matches shares one counter, at that level and below), as
    /// envoyproxy/ratelimit keys it. Empty when no level shares, or
    /// nothing matched.
    pub fn shared_patterns(&self, entries: &[(&str, &str)]) -> Vec<Option<Arc<str>>> {
        let Some(walked) = self.walk(entries) else {
            return Vec::new();
        };
        if !walked
            .iter()
            .any(|(n, how)| n.share_threshold && *how == Matched::Wildcard)
        {
            return Vec::new();
        }
        walked
            .iter()
            .map(|(n, how)| {
                (n.share_threshold && *how == Matched::Wildcard)
                    .then(|| n.value.clone())
                    .flatten()
            })
            .collect()
    }

    /// The per-value name envoyproxy/ratelimit gives a descriptor's
    /// statistics when its configuration asks for request values in them,
    /// without the leading domain: with `detailed_metric` on the matched
    /// rule, every entry as `key_value` joined by `.`; else, when an entry
    /// matched on the way has `value_to_metric`, that level as
    /// `key_value` of the request (`key` alone for an empty value) and
    /// every other level as configured (`key_value`, `key_pattern*` or
    /// `key`).
    ///
    /// `None` when the configuration asked for neither, or nothing
    /// matched: request values then never name a statistic.
    pub fn value_path(&self, entries: &[(&str, &str)]) -> Option<String> {
        let walked = self.walk(entries)?;
        let rule = walked.last()?.0.rule.as_ref()?;
        let whole = |(k, v): (&str, &str)| format!("{k}_{v}");
        if rule.detailed_metric {
            return Some(
                entries
                    .iter()
                    .map(|&e| whole(e))
                    .collect::<Vec<_>>()
                    .join("."),
            );
        }
        if !walked.iter().any(|(n, _)| n.value_to_metric) {
            return None;
        }
        let parts: Vec<String> = walked
            .iter()
            .zip(entries)
            .map(|(&(node, how), &(k, v))| match how {
                Matched::Exact => whole((k, v)),
                // An empty value adds nothing, not a trailing `_`.
                _ if node.value_to_metric && v.is_empty() => k.to_owned(),
                _ if node.value_to_metric => whole((k, v)),
                Matched::Wildcard => node.segment(),
                Matched::KeyOnly => k.to_owned(),
            })
            .collect();
        Some(parts.join("."))
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
            deny: false,
            apply_on_stream_done: false,
            metadata: None,
        }
    }

    /// Every rule of the domain with its configured path, depth first in
    /// configured order: the entries' `key` or `key_value` joined by `.`,
    /// as envoyproxy/ratelimit writes a rule's composite key.
    pub fn rules_by_path(&self) -> Vec<(String, &DescriptorRule)> {
        fn walk<'a>(nodes: &'a [Node], above: &str, out: &mut Vec<(String, &'a DescriptorRule)>) {
            for n in nodes {
                let path = if above.is_empty() {
                    n.segment()
                } else {
                    format!("{above}.{}", n.segment())
                };
                if let Some(rule) = &n.rule {
                    out.push((path.clone(), rule));
                }
                walk(&n.children, &path, out);
            }
        }
        let mut out = Vec::new();
        walk(&self.root, "", &mut out);
        out
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Limit;

    /// A shop's edge config: nested entries, key-only defaults beside
    /// specific values, an exempt value, a named and an unlimited rule.
    const SHOP: &str = "\
domain: shop
descriptors:
  - key: tenant
    value: acme
    descriptors:
      - key: path
        rate_limit: {unit: second, requests_per_unit: 3}
      - key: path
        value: /checkout
        rate_limit: {unit: second, requests_per_unit: 7}
  - key: client
    rate_limit: {unit: minute, requests_per_unit: 40}
  - key: client
    value: partner
    rate_limit: {unit: minute, requests_per_unit: 400}
  - key: client
    value: internal
  - key: region
    value: eu
    rate_limit: {unit: hour, requests_per_unit: 9}
    descriptors:
      - key: plan
        value: gold
        rate_limit: {unit: hour, requests_per_unit: 90}
  - key: bot
    rate_limit: {unlimited: true}
  - key: upload
    rate_limit: {name: uploads_daily, unit: day, requests_per_unit: 2}
  - key: search
    shadow_mode: true
    rate_limit: {unit: second, requests_per_unit: 1}
";

    fn shop() -> Domain {
        Domain::from_envoy_yaml(SHOP, None).unwrap()
    }

    /// The quota of the rule found, or `None` when nothing matched.
    fn quota(d: &Domain, entries: &[(&str, &str)]) -> Option<u64> {
        d.find(entries)
            .map(|r| r.limits.first().map_or(0, |l| l.algorithm.max_cost()))
    }

    #[test]
    fn nothing_matches_an_empty_descriptor_or_an_unknown_key() {
        let d = shop();
        assert!(d.find(&[]).is_none());
        assert!(d.find(&[("nobody", "x")]).is_none());
    }

    #[test]
    fn a_value_without_its_own_entry_and_no_key_only_entry_matches_nothing() {
        let d = shop();
        assert!(d.find(&[("tenant", "globex")]).is_none());
    }

    #[test]
    fn an_entry_without_rate_limit_limits_nothing_at_its_own_depth() {
        let d = shop();
        assert!(d.find(&[("tenant", "acme")]).is_none());
    }

    #[test]
    fn exact_value_comes_before_the_key_only_default() {
        let d = shop();
        assert_eq!(quota(&d, &[("client", "someone")]), Some(40));
        assert_eq!(quota(&d, &[("client", "partner")]), Some(400));
        assert_eq!(quota(&d, &[("tenant", "acme"), ("path", "/cart")]), Some(3));
        assert_eq!(
            quota(&d, &[("tenant", "acme"), ("path", "/checkout")]),
            Some(7)
        );
    }

    #[test]
    fn a_value_listed_without_rate_limit_is_exempt_from_the_key_only_default() {
        let d = shop();
        assert!(d.find(&[("client", "internal")]).is_none());
    }

    #[test]
    fn a_rule_applies_only_at_the_depth_of_the_request() {
        let d = shop();
        // Deeper than the config: the rule of the first entry does not apply.
        assert!(d.find(&[("client", "partner"), ("extra", "1")]).is_none());
        assert!(d.find(&[("region", "eu"), ("plan", "silver")]).is_none());
        // Shallower: the nested rule does not apply either.
        assert_eq!(quota(&d, &[("region", "eu")]), Some(9));
        assert_eq!(quota(&d, &[("region", "eu"), ("plan", "gold")]), Some(90));
        // Order matters: entries are levels, not a set.
        assert!(d.find(&[("path", "/cart"), ("tenant", "acme")]).is_none());
    }

    #[test]
    fn unlimited_rules_have_no_limit_and_no_unit() {
        let d = shop();
        let r = d.find(&[("bot", "crawler")]).unwrap();
        assert!(r.unlimited);
        assert!(r.limits.is_empty());
        assert_eq!(r.unit, None);
    }

    #[test]
    fn labels_are_names_or_config_paths_never_request_values() {
        let d = shop();
        let r = d.find(&[("upload", "u-123")]).unwrap();
        assert_eq!(&*r.label, "uploads_daily");
        assert_eq!(r.name.as_deref(), Some("uploads_daily"));
        let r = d.find(&[("tenant", "acme"), ("path", "/cart")]).unwrap();
        assert_eq!(&*r.label, "tenant_acme.path");
        assert_eq!(r.name, None);
        let r = d
            .find(&[("tenant", "acme"), ("path", "/checkout")])
            .unwrap();
        assert_eq!(&*r.label, "tenant_acme.path_/checkout");
        assert_eq!(&*d.find(&[("client", "x")]).unwrap().label, "client");
    }

    #[test]
    fn a_unit_is_one_fixed_window_of_that_length_named_after_it() {
        let d = shop();
        let r = d.find(&[("client", "x")]).unwrap();
        assert_eq!(r.unit, Some(RlsUnit::Minute));
        assert_eq!(
            r.limits,
            vec![Limit::fixed_window(
                "minute",
                40,
                std::time::Duration::from_secs(60)
            )]
        );
        assert_eq!(d.find(&[("upload", "u")]).unwrap().unit, Some(RlsUnit::Day));
    }

    #[test]
    fn shadow_mode_marks_only_its_own_rule() {
        let d = shop();
        assert!(d.find(&[("search", "q")]).unwrap().shadow);
        assert!(!d.find(&[("client", "x")]).unwrap().shadow);
    }

    const FILES: &str = "\
domain: files
descriptors:
  - key: object
    value: img/logo.png
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: object
    value: img/*
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: object
    value: img/big*
    rate_limit: {unit: second, requests_per_unit: 3}
  - key: object
    rate_limit: {unit: second, requests_per_unit: 4}
  - key: route
    value: /v1/*/items
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: route
    value: a*b*c
    rate_limit: {unit: second, requests_per_unit: 6}
  - key: plain
    value: tmp
    rate_limit: {unit: second, requests_per_unit: 7}
  - key: any
    value: '*'
    rate_limit: {unit: second, requests_per_unit: 8}
  - key: bucket
    value: public
    descriptors:
      - key: object
        value: doc*
        rate_limit: {unit: second, requests_per_unit: 9}
";

    #[test]
    fn exact_then_wildcard_then_key_only() {
        let d = Domain::from_envoy_yaml(FILES, None).unwrap();
        assert_eq!(quota(&d, &[("object", "img/logo.png")]), Some(1));
        assert_eq!(quota(&d, &[("object", "img/cat.png")]), Some(2));
        assert_eq!(quota(&d, &[("object", "video.mp4")]), Some(4));
        // The first configured wildcard that matches wins, not the longest.
        assert_eq!(quota(&d, &[("object", "img/big.png")]), Some(2));
        // A wildcard's label is its pattern, never the request's value.
        let r = d.find(&[("object", "img/cat.png")]).unwrap();
        assert_eq!(&*r.label, "object_img/*");
    }

    #[test]
    fn a_star_anywhere_stands_for_any_run_of_characters() {
        let d = Domain::from_envoy_yaml(FILES, None).unwrap();
        assert_eq!(quota(&d, &[("route", "/v1/users/items")]), Some(5));
        assert_eq!(quota(&d, &[("route", "/v1//items")]), Some(5));
        assert_eq!(quota(&d, &[("route", "/v1/users/item")]), None);
        assert_eq!(quota(&d, &[("route", "/v2/users/items")]), None);
        assert_eq!(quota(&d, &[("route", "abc")]), Some(6));
        assert_eq!(quota(&d, &[("route", "a-b-c")]), Some(6));
        assert_eq!(quota(&d, &[("route", "a-c")]), None);
        assert_eq!(quota(&d, &[("route", "xabc")]), None);
        assert_eq!(quota(&d, &[("any", "")]), Some(8));
        assert_eq!(quota(&d, &[("any", "whatever")]), Some(8));
    }

    #[test]
    fn a_value_without_star_is_matched_exactly_not_as_a_prefix() {
        let d = Domain::from_envoy_yaml(FILES, None).unwrap();
        assert_eq!(quota(&d, &[("plain", "tmp")]), Some(7));
        assert_eq!(quota(&d, &[("plain", "tmp2")]), None);
    }

    #[test]
    fn wildcards_work_below_the_first_level() {
        let d = Domain::from_envoy_yaml(FILES, None).unwrap();
        assert_eq!(
            quota(&d, &[("bucket", "public"), ("object", "doc-1")]),
            Some(9)
        );
        assert_eq!(
            quota(&d, &[("bucket", "public"), ("object", "img/x")]),
            None
        );
    }

    #[test]
    fn wildcard_match_needs_every_literal_part_in_order() {
        assert!(wildcard_match("ab*", "ab"));
        assert!(wildcard_match("*", ""));
        assert!(wildcard_match("a*a", "aa"));
        assert!(!wildcard_match("a*a", "a"), "parts may not overlap");
        assert!(wildcard_match("x*y*z", "x1y2z"));
        assert!(!wildcard_match("x*y*z", "x1z2y"));
        assert!(wildcard_match("**", "anything"));
        assert!(!wildcard_match("ab", "abc"));
    }

    const STATS: &str = "\
domain: stats
descriptors:
  - key: user
    detailed_metric: true
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: route
    value: /v1/*
    value_to_metric: true
    descriptors:
      - key: method
        rate_limit: {unit: second, requests_per_unit: 2}
  - key: route
    value: /v2/*
    descriptors:
      - key: method
        value_to_metric: true
        rate_limit: {unit: second, requests_per_unit: 3}
  - key: plain
    rate_limit: {unit: second, requests_per_unit: 4}
";

    #[test]
    fn value_paths_name_request_values_only_where_the_yaml_asks() {
        let d = Domain::from_envoy_yaml(STATS, None).unwrap();
        // detailed_metric: every entry with its value.
        assert_eq!(
            d.value_path(&[("user", "alice")]).as_deref(),
            Some("user_alice")
        );
        // value_to_metric on a wildcard level: the request's value there,
        // the key alone below it.
        assert_eq!(
            d.value_path(&[("route", "/v1/items"), ("method", "GET")])
                .as_deref(),
            Some("route_/v1/items.method")
        );
        // value_to_metric below a wildcard without it: the pattern above.
        assert_eq!(
            d.value_path(&[("route", "/v2/items"), ("method", "GET")])
                .as_deref(),
            Some("route_/v2/*.method_GET")
        );
        // Asked for by nobody, or nothing matched: no per-value name.
        assert_eq!(d.value_path(&[("plain", "secret")]), None);
        assert_eq!(d.value_path(&[("nobody", "x")]), None);
        assert_eq!(d.value_path(&[("route", "/v1/items")]), None);
    }

    #[test]
    fn an_override_is_a_fixed_window_of_its_own_labelled_by_keys() {
        let d = shop();
        let r = d.override_rule(&[("client", "partner"), ("user", "u-9")], 12, RlsUnit::Hour);
        assert_eq!(&*r.label, "override:client.user");
        assert!(!r.shadow && !r.unlimited);
        assert_eq!(r.unit, Some(RlsUnit::Hour));
        assert_eq!(
            r.limits,
            vec![Limit::fixed_window(
                "hour",
                12,
                std::time::Duration::from_secs(3600)
            )]
        );
    }

    #[test]
    fn units_round_trip_through_their_proto_numbers() {
        for (_, u) in RlsUnit::CHOICES {
            assert_eq!(RlsUnit::from_proto(u.to_proto()), Some(u));
        }
        assert_eq!(RlsUnit::from_proto(0), None);
        assert_eq!(RlsUnit::Week.seconds(), 604_800);
        assert_eq!(RlsUnit::Month.seconds(), 30 * 86_400);
        assert_eq!(RlsUnit::Year.seconds(), 365 * 86_400);
    }

    #[test]
    fn insert_builds_the_path_and_refuses_a_second_rule_on_it() {
        let mut d = Domain::new("api");
        let rule = shop().find(&[("client", "x")]).unwrap().clone();
        d.insert(&[("k", Some("v")), ("sub", None)], rule.clone())
            .unwrap();
        d.insert(&[("k", Some("v"))], rule.clone()).unwrap();
        assert!(
            d.insert(&[("k", Some("v")), ("sub", None)], rule.clone())
                .is_err()
        );
        assert!(d.find(&[("k", "v"), ("sub", "1")]).is_some());
        assert!(d.find(&[("k", "v")]).is_some());
        assert_eq!(d.rules().len(), 2);
    }
}
