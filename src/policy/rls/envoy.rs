//! envoyproxy/ratelimit's YAML configuration, read as that service reads
//! it, with errors that name the file, the line and the field.

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;

use super::domain::Node as Entry;
use super::yaml::{self, Node};
use super::{DescriptorRule, Domain, RlsUnit};
use crate::policy::ConfigError;

/// Keys of the file's top level.
const ROOT_KEYS: [&str; 2] = ["domain", "descriptors"];
/// Keys of one descriptor.
const DESCRIPTOR_KEYS: [&str; 10] = [
    "key",
    "value",
    "rate_limit",
    "descriptors",
    "shadow_mode",
    "detailed_metric",
    "value_to_metric",
    "metadata",
    "quota_mode",
    "share_threshold",
];
/// The deepest nesting of a descriptor's `metadata`.
const MAX_METADATA_DEPTH: usize = 32;
/// Keys of a `rate_limit`.
const RATE_LIMIT_KEYS: [&str; 5] = ["unit", "requests_per_unit", "unlimited", "name", "replaces"];

impl Domain {
    /// Reads an envoyproxy/ratelimit YAML file (one domain), as the policy
    /// file is read: a regular file of at most
    /// [`MAX_RULE_FILE_BYTES`](crate::policy::MAX_RULE_FILE_BYTES), never
    /// waited on.
    pub fn from_envoy_yaml_file(path: impl AsRef<Path>) -> Result<Domain, ConfigError> {
        let path = path.as_ref();
        let (text, _) = crate::policy::read_text_file(path, crate::policy::FileKind::RULES)
            .map_err(|e| e.error)?;
        Self::from_envoy_yaml(&text, Some(&path.display().to_string()))
    }

    /// Parses an envoyproxy/ratelimit YAML configuration (one domain);
    /// `file` names it in errors.
    ///
    /// What that service refuses is refused here too, as a
    /// [`ConfigError::Invalid`] with the line and the field's path
    /// (`descriptors[0].rate_limit.unit`): a missing or empty `domain`, a
    /// descriptor without `key`, two descriptors of one key and value at
    /// one level, an unknown `unit`, `unlimited` with a `unit`, an empty or
    /// self-naming `replaces` entry, unknown fields, lists of non-mappings.
    /// Stricter than it: fields are checked per level (a `unit` beside
    /// `key` is a mistake, not ignored), a key repeated in one mapping and
    /// a missing `requests_per_unit` are refused, and `quota_mode` is
    /// only accepted as `false`, which ratewatch does not implement;
    /// `share_threshold` only on a wildcard value. A `requests_per_unit` of 0 is its deny-list
    /// idiom: the rule refuses every charge ([`DescriptorRule::deny`]).
    ///
    /// ```
    /// use ratewatch::policy::rls::Domain;
    /// let yaml = "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit:\n      unit: minute\n      requests_per_unit: 60\n";
    /// let domain = Domain::from_envoy_yaml(yaml, Some("edge.yaml")).unwrap();
    /// let rule = domain.find(&[("remote_address", "10.0.0.1")]).unwrap();
    /// assert_eq!(&*rule.label, "remote_address");
    ///
    /// let err = Domain::from_envoy_yaml(&yaml.replace("minute", "fortnight"), Some("edge.yaml"))
    ///     .unwrap_err();
    /// assert_eq!(err.line(), Some(5));
    /// assert_eq!(err.field(), Some("descriptors[0].rate_limit.unit"));
    /// ```
    pub fn from_envoy_yaml(text: &str, file: Option<&str>) -> Result<Domain, ConfigError> {
        let cx = Cx { file };
        let root = yaml::parse(text)
            .map_err(|e| cx.error(e.line, "", format!("YAML syntax error: {}", e.message)))?;
        let Some(root) = root.filter(|r| !r.is_null()) else {
            return Err(cx.error(1, "domain", "is required: the file is empty"));
        };
        let map = cx.map(&root, "", &ROOT_KEYS, "the top level of a ratelimit config")?;
        let domain = match map.get("domain") {
            None => {
                return Err(cx.error(
                    root.line(),
                    "domain",
                    "is required: the domain requests name, like \"edge\"",
                ));
            }
            Some(v) => cx.string(v, "domain")?,
        };
        if domain.is_empty() {
            let line = map.line_of("domain").unwrap_or(root.line());
            return Err(cx.error(line, "domain", "must not be empty"));
        }
        let nodes = match map.get("descriptors") {
            Some(d) => cx.descriptors(d, "descriptors", "")?,
            None => Vec::new(),
        };
        Ok(Domain::with_nodes(&domain, nodes))
    }
}

/// Where errors point.
struct Cx<'a> {
    file: Option<&'a str>,
}

/// A mapping whose keys were checked.
struct Map<'n> {
    entries: Vec<(&'n str, &'n Node, usize)>,
}

impl<'n> Map<'n> {
    fn get(&self, key: &str) -> Option<&'n Node> {
        self.entries
            .iter()
            .find(|(k, _, _)| *k == key)
            .map(|&(_, v, _)| v)
    }

    fn line_of(&self, key: &str) -> Option<usize> {
        self.entries
            .iter()
            .find(|(k, _, _)| *k == key)
            .map(|&(_, _, l)| l)
    }
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_owned()
    } else {
        format!("{path}.{key}")
    }
}

impl Cx<'_> {
    fn error(&self, line: usize, field: &str, message: impl Into<String>) -> ConfigError {
        ConfigError::Invalid {
            file: self.file.map(str::to_owned),
            line: Some(line),
            field: field.to_owned(),
            message: message.into(),
        }
    }

    /// `node` as a mapping with only `allowed` keys, each once.
    fn map<'n>(
        &self,
        node: &'n Node,
        path: &str,
        allowed: &[&str],
        what: &str,
    ) -> Result<Map<'n>, ConfigError> {
        let Node::Map { entries, .. } = node else {
            return Err(self.error(
                node.line(),
                path,
                format!("must be a mapping ({what}), got {}", node.kind()),
            ));
        };
        let mut out = Map {
            entries: Vec::new(),
        };
        for (k, v) in entries {
            let Node::Scalar { text, .. } = k else {
                return Err(self.error(
                    k.line(),
                    path,
                    format!("has a key that is {}, not a name", k.kind()),
                ));
            };
            let field = join(path, text);
            if !allowed.contains(&text.as_str()) {
                return Err(self.error(
                    k.line(),
                    &field,
                    format!(
                        "is not a field of {what}; expected one of {}",
                        allowed.join(", ")
                    ),
                ));
            }
            if out.get(text).is_some() {
                return Err(self.error(
                    k.line(),
                    &field,
                    "is set twice; a field may appear once per mapping",
                ));
            }
            out.entries.push((text.as_str(), v, k.line()));
        }
        Ok(out)
    }

    /// A scalar as text (a number or `true` is its text; null is empty).
    fn string(&self, node: &Node, field: &str) -> Result<String, ConfigError> {
        match node {
            _ if node.is_null() => Ok(String::new()),
            Node::Scalar { text, .. } => Ok(text.clone()),
            _ => Err(self.error(
                node.line(),
                field,
                format!("must be a string, got {}", node.kind()),
            )),
        }
    }

    /// A boolean as YAML 1.1 (what envoyproxy/ratelimit's parser reads)
    /// spells it; null is false.
    fn boolean(&self, node: Option<&Node>, field: &str) -> Result<bool, ConfigError> {
        let Some(node) = node else { return Ok(false) };
        if node.is_null() {
            return Ok(false);
        }
        if let Node::Scalar {
            text, plain: true, ..
        } = node
        {
            match text.as_str() {
                "true" | "True" | "TRUE" | "yes" | "Yes" | "YES" | "on" | "On" | "ON" => {
                    return Ok(true);
                }
                "false" | "False" | "FALSE" | "no" | "No" | "NO" | "off" | "Off" | "OFF" => {
                    return Ok(false);
                }
                _ => {}
            }
        }
        Err(self.error(node.line(), field, "must be true or false"))
    }

    /// The list under `descriptors`.
    fn descriptors(
        &self,
        node: &Node,
        path: &str,
        label_above: &str,
    ) -> Result<Vec<Entry>, ConfigError> {
        if node.is_null() {
            return Ok(Vec::new());
        }
        let Node::Seq { items, .. } = node else {
            return Err(self.error(
                node.line(),
                path,
                format!("must be a list of descriptors, got {}", node.kind()),
            ));
        };
        let mut out: Vec<Entry> = Vec::new();
        // A set, not a scan of `out`: a level of tens of thousands of
        // descriptors would otherwise take quadratic time to load.
        let mut seen: HashSet<(Arc<str>, Option<Arc<str>>)> = HashSet::new();
        for (i, item) in items.iter().enumerate() {
            let at = format!("{path}[{i}]");
            let entry = self.descriptor(item, &at, label_above)?;
            if !seen.insert((entry.key.clone(), entry.value.clone())) {
                return Err(self.error(
                    item.line(),
                    &at,
                    format!(
                        "repeats the descriptor `{}` of an earlier entry at this level; each key and value may appear once per level",
                        entry.segment()
                    ),
                ));
            }
            out.push(entry);
        }
        Ok(out)
    }

    /// One descriptor and everything nested under it.
    fn descriptor(&self, node: &Node, path: &str, label_above: &str) -> Result<Entry, ConfigError> {
        let map = self.map(node, path, &DESCRIPTOR_KEYS, "a descriptor")?;
        let key = match map.get("key") {
            Some(k) => self.string(k, &join(path, "key"))?,
            None => String::new(),
        };
        if key.is_empty() {
            let line = map.line_of("key").unwrap_or(node.line());
            return Err(self.error(
                line,
                &join(path, "key"),
                "is required: every descriptor needs a non-empty key",
            ));
        }
        let value = match map.get("value") {
            Some(v) => Some(self.string(v, &join(path, "value"))?).filter(|v| !v.is_empty()),
            None => None,
        };
        let mut entry = Entry::new(&key, value.as_deref());
        let label = match label_above {
            "" => entry.segment(),
            above => format!("{above}.{}", entry.segment()),
        };
        // envoyproxy/ratelimit's quota mode, and why ratewatch refuses it
        // rather than answer differently.
        let quota = join(path, "quota_mode");
        if self.boolean(map.get("quota_mode"), &quota)? {
            let line = map.line_of("quota_mode").unwrap_or(node.line());
            return Err(self.error(
                line,
                &quota,
                "asks for quota mode (an exhausted limit is reported in the answer's metadata \
                 while the request is answered OK), which ratewatch does not implement; remove \
                 it or set it to false (shadow_mode: true reports without enforcing)",
            ));
        }
        // Every value the wildcard matches shares one counter.
        let share = join(path, "share_threshold");
        entry.share_threshold = self.boolean(map.get("share_threshold"), &share)?;
        if entry.share_threshold && !value.as_deref().is_some_and(|v| v.contains('*')) {
            let line = map.line_of("share_threshold").unwrap_or(node.line());
            return Err(self.error(
                line,
                &share,
                "can only be used with a wildcard value (one containing `*`)",
            ));
        }
        // Request values in per-value statistics, which the operator asks
        // for here; `telemetry::detailed` bounds how many values get a
        // series of their own.
        let detailed_metric =
            self.boolean(map.get("detailed_metric"), &join(path, "detailed_metric"))?;
        entry.value_to_metric =
            self.boolean(map.get("value_to_metric"), &join(path, "value_to_metric"))?;
        let shadow = self.boolean(map.get("shadow_mode"), &join(path, "shadow_mode"))?;
        let metadata = match map.get("metadata").filter(|n| !n.is_null()) {
            Some(m) => {
                let field = join(path, "metadata");
                if !matches!(m, Node::Map { .. }) {
                    return Err(self.error(
                        m.line(),
                        &field,
                        format!("must be a mapping of names to values, got {}", m.kind()),
                    ));
                }
                Some(Arc::new(self.json(m, &field, 0)?))
            }
            None => None,
        };
        if let Some(rl) = map.get("rate_limit").filter(|n| !n.is_null()) {
            let mut rule = self.rate_limit(rl, &join(path, "rate_limit"), &label)?;
            rule.shadow = shadow;
            rule.detailed_metric = detailed_metric;
            rule.metadata = metadata;
            entry.rule = Some(rule);
        }
        if let Some(d) = map.get("descriptors") {
            entry.children = self.descriptors(d, &join(path, "descriptors"), &label)?;
        }
        Ok(entry)
    }

    /// A `rate_limit` mapping.
    fn rate_limit(
        &self,
        node: &Node,
        path: &str,
        label: &str,
    ) -> Result<DescriptorRule, ConfigError> {
        let map = self.map(node, path, &RATE_LIMIT_KEYS, "a rate_limit")?;
        let unlimited = self.boolean(map.get("unlimited"), &join(path, "unlimited"))?;
        let unit_field = join(path, "unit");
        let unit_text = match map.get("unit") {
            Some(u) => self.string(u, &unit_field)?,
            None => String::new(),
        };
        let unit_line = map.line_of("unit").unwrap_or(node.line());
        let unit = RlsUnit::CHOICES
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(&unit_text))
            .map(|&(_, u)| u);
        let units = RlsUnit::CHOICES
            .iter()
            .map(|(n, _)| *n)
            .collect::<Vec<_>>()
            .join(", ");
        if unlimited && unit.is_some() {
            return Err(self.error(
                unit_line,
                &unit_field,
                "must not be set when `unlimited` is true: an unlimited descriptor has no window",
            ));
        }
        if !unlimited && unit.is_none() {
            let message = if unit_text.is_empty() {
                format!("is required unless `unlimited: true`; one of {units}")
            } else {
                format!("must be one of {units}, got \"{unit_text}\"")
            };
            return Err(self.error(unit_line, &unit_field, message));
        }
        let rpu_field = join(path, "requests_per_unit");
        let rpu = match map.get("requests_per_unit") {
            Some(n) if !n.is_null() => Some(self.requests_per_unit(n, &rpu_field)?),
            _ => None,
        };
        if !unlimited && rpu.is_none() {
            let line = map.line_of("requests_per_unit").unwrap_or(node.line());
            return Err(self.error(
                line,
                &rpu_field,
                "is required: a whole number of requests per unit (0 refuses every request; write `unlimited: true` for none)",
            ));
        }
        // envoyproxy/ratelimit's deny-list idiom: 0 refuses every hit.
        let deny = !unlimited && rpu == Some(0);
        let name = match map.get("name") {
            Some(n) => Some(self.string(n, &join(path, "name"))?).filter(|n| !n.is_empty()),
            None => None,
        };
        let replaces = match map.get("replaces") {
            Some(r) => self.replaces(r, &join(path, "replaces"), name.as_deref())?,
            None => Vec::new(),
        };
        let limits = match (unlimited, unit, rpu) {
            (false, Some(unit), Some(n)) if n > 0 => vec![unit.limit(n)],
            _ => Vec::new(),
        };
        Ok(DescriptorRule {
            label: name.as_deref().unwrap_or(label).into(),
            name: name.map(Into::into),
            limits,
            unlimited,
            shadow: false,
            replaces,
            unit: if unlimited { None } else { unit },
            tier: None,
            cost: None,
            on_store_failure: None,
            mode: None,
            detailed_metric: false,
            deny,
            apply_on_stream_done: false,
            metadata: None,
        })
    }

    /// Free-form `metadata` as JSON, as the peer's YAML reader types it: a
    /// plain scalar is null, a boolean or a number when it reads as one,
    /// anything else (and every quoted scalar) a string.
    fn json(
        &self,
        node: &Node,
        field: &str,
        depth: usize,
    ) -> Result<serde_json::Value, ConfigError> {
        use serde_json::Value as J;
        if depth > MAX_METADATA_DEPTH {
            return Err(self.error(
                node.line(),
                field,
                format!("nests deeper than {MAX_METADATA_DEPTH} levels"),
            ));
        }
        Ok(match node {
            _ if node.is_null() => J::Null,
            Node::Scalar { text, plain, .. } => {
                let as_bool = if *plain {
                    self.boolean(Some(node), field).ok()
                } else {
                    None
                };
                match (as_bool, plain) {
                    (Some(b), _) => J::Bool(b),
                    (None, true) => {
                        if let Ok(n) = text.parse::<i64>() {
                            J::from(n)
                        } else if let Some(n) = text
                            .parse::<f64>()
                            .ok()
                            .and_then(serde_json::Number::from_f64)
                        {
                            J::Number(n)
                        } else {
                            J::String(text.clone())
                        }
                    }
                    (None, false) => J::String(text.clone()),
                }
            }
            Node::Seq { items, .. } => J::Array(
                items
                    .iter()
                    .enumerate()
                    .map(|(i, n)| self.json(n, &format!("{field}[{i}]"), depth + 1))
                    .collect::<Result<_, _>>()?,
            ),
            Node::Map { entries, .. } => {
                let mut out = serde_json::Map::new();
                for (k, v) in entries {
                    let Node::Scalar { text, .. } = k else {
                        return Err(self.error(
                            k.line(),
                            field,
                            format!("has a key that is {}, not a name", k.kind()),
                        ));
                    };
                    let value = self.json(v, &join(field, text), depth + 1)?;
                    out.insert(text.clone(), value);
                }
                J::Object(out)
            }
        })
    }

    /// A whole number as envoyproxy/ratelimit stores it (32 bits).
    fn requests_per_unit(&self, node: &Node, field: &str) -> Result<u64, ConfigError> {
        if let Node::Scalar {
            text, plain: true, ..
        } = node
        {
            if let Ok(n) = text.parse::<u32>() {
                return Ok(u64::from(n));
            }
        }
        Err(self.error(
            node.line(),
            field,
            format!(
                "must be a whole number from 0 to {}, got {}",
                u32::MAX,
                match node {
                    Node::Scalar { text, .. } => format!("\"{text}\""),
                    other => other.kind().to_owned(),
                }
            ),
        ))
    }

    /// `replaces: [{name: ...}, ...]`.
    fn replaces(
        &self,
        node: &Node,
        path: &str,
        own: Option<&str>,
    ) -> Result<Vec<Arc<str>>, ConfigError> {
        if node.is_null() {
            return Ok(Vec::new());
        }
        let Node::Seq { items, .. } = node else {
            return Err(self.error(
                node.line(),
                path,
                format!(
                    "must be a list of `- name: ...` entries, got {}",
                    node.kind()
                ),
            ));
        };
        let mut out = Vec::new();
        for (i, item) in items.iter().enumerate() {
            let at = format!("{path}[{i}]");
            let map = self.map(item, &at, &["name"], "a replaces entry")?;
            let field = join(&at, "name");
            let name = match map.get("name") {
                Some(n) => self.string(n, &field)?,
                None => String::new(),
            };
            let line = map.line_of("name").unwrap_or(item.line());
            if name.is_empty() {
                return Err(self.error(line, &field, "must name the rate_limit this one replaces"));
            }
            if Some(name.as_str()) == own {
                return Err(self.error(
                    line,
                    &field,
                    format!(
                        "names this rate_limit itself (\"{name}\"); a limit cannot replace itself"
                    ),
                ));
            }
            out.push(Arc::from(name));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The error's line and field for a config that must be refused.
    fn refused(yaml: &str) -> (usize, String, String) {
        match Domain::from_envoy_yaml(yaml, Some("edge.yaml")) {
            Ok(d) => panic!("accepted: {d:?}"),
            Err(e) => {
                let text = e.to_string();
                assert!(text.starts_with("edge.yaml:"), "names the file: {text}");
                (e.line().unwrap(), e.field().unwrap_or("").to_owned(), text)
            }
        }
    }

    #[test]
    fn a_file_needs_a_non_empty_domain() {
        assert_eq!(refused("").1, "domain");
        let (line, field, _) = refused("descriptors:\n  - key: a\n");
        assert_eq!((line, field.as_str()), (1, "domain"));
        let (line, field, _) = refused("# edge\ndomain: ''\ndescriptors:\n");
        assert_eq!((line, field.as_str()), (2, "domain"));
    }

    #[test]
    fn every_descriptor_needs_a_key() {
        let (line, field, _) = refused("domain: d\ndescriptors:\n  - key: a\n  - value: b\n");
        assert_eq!((line, field.as_str()), (4, "descriptors[1].key"));
    }

    #[test]
    fn one_key_and_value_appear_once_per_level() {
        let yaml =
            "domain: d\ndescriptors:\n  - key: a\n    value: b\n\n  - key: a\n    value: b\n";
        let (line, field, text) = refused(yaml);
        assert_eq!((line, field.as_str()), (6, "descriptors[1]"));
        assert!(text.contains("a_b"), "{text}");
        // The same key with another value, or without one, is fine, and so
        // is the same pair at another level.
        Domain::from_envoy_yaml(
            "domain: d\ndescriptors:\n  - key: a\n    value: b\n    descriptors:\n      - key: a\n        value: b\n  - key: a\n  - key: a\n    value: c\n",
            None,
        )
        .unwrap();
        let nested = "domain: d\ndescriptors:\n  - key: x\n    descriptors:\n      - key: a\n      - key: a\n";
        assert_eq!(refused(nested).1, "descriptors[0].descriptors[1]");
    }

    #[test]
    fn the_unit_must_be_one_envoy_knows() {
        let yaml = "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: fortnight\n      requests_per_unit: 5\n";
        let (line, field, text) = refused(yaml);
        assert_eq!(
            (line, field.as_str()),
            (5, "descriptors[0].rate_limit.unit")
        );
        assert!(
            text.contains("second, minute, hour, day, week, month, year"),
            "{text}"
        );
        let missing =
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      requests_per_unit: 5\n";
        assert_eq!(refused(missing).1, "descriptors[0].rate_limit.unit");
        // Case does not matter, as in envoyproxy/ratelimit.
        let d = Domain::from_envoy_yaml(&yaml.replace("fortnight", "Week"), None).unwrap();
        assert_eq!(d.find(&[("a", "1")]).unwrap().unit, Some(RlsUnit::Week));
    }

    #[test]
    fn unlimited_takes_no_unit() {
        let yaml = "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unlimited: true\n      unit: day\n      requests_per_unit: 25\n";
        let (line, field, _) = refused(yaml);
        assert_eq!(
            (line, field.as_str()),
            (6, "descriptors[0].rate_limit.unit")
        );
        // Without the unit the (ignored) requests_per_unit is accepted.
        let ok = yaml.replace("      unit: day\n", "");
        let d = Domain::from_envoy_yaml(&ok, None).unwrap();
        assert!(d.find(&[("a", "1")]).unwrap().unlimited);
    }

    #[test]
    fn requests_per_unit_is_a_32_bit_number_and_zero_denies() {
        let zero = "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: 0\n";
        let d = Domain::from_envoy_yaml(zero, None).unwrap();
        let rule = d.find(&[("a", "1")]).unwrap();
        assert!(rule.deny && rule.limits.is_empty() && rule.unit == Some(RlsUnit::Second));
        for bad in ["-1", "ten", "4294967296", "'5'", "[1]"] {
            let yaml = format!(
                "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: {bad}\n"
            );
            let (line, field, _) = refused(&yaml);
            assert_eq!(
                (line, field.as_str()),
                (6, "descriptors[0].rate_limit.requests_per_unit"),
                "{bad}"
            );
        }
        let missing = "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n";
        assert_eq!(
            refused(missing).1,
            "descriptors[0].rate_limit.requests_per_unit"
        );
    }

    #[test]
    fn a_limit_cannot_replace_itself_nor_nothing() {
        let own = "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      name: me\n      unit: second\n      requests_per_unit: 5\n      replaces:\n        - name: other\n        - name: me\n";
        let (line, field, _) = refused(own);
        assert_eq!(
            (line, field.as_str()),
            (10, "descriptors[0].rate_limit.replaces[1].name")
        );
        let empty = own.replace("- name: me", "- name:");
        assert_eq!(refused(&empty).0, 10);
        let ok = own.replace("        - name: me\n", "");
        let d = Domain::from_envoy_yaml(&ok, None).unwrap();
        let r = d.find(&[("a", "1")]).unwrap();
        assert_eq!(r.replaces, vec![Arc::<str>::from("other")]);
        assert_eq!(r.name.as_deref(), Some("me"));
    }

    #[test]
    fn unknown_fields_are_refused_where_they_stand() {
        let typo = "domain: d\ndescriptors:\n  - key: a\n    ratelimit:\n      unit: day\n      requests_per_unit: 5\n";
        let (line, field, text) = refused(typo);
        assert_eq!((line, field.as_str()), (4, "descriptors[0].ratelimit"));
        assert!(text.contains("rate_limit"), "lists what is valid: {text}");
        let inner = "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: day\n      requestsperunit: 5\n";
        assert_eq!(
            refused(inner).1,
            "descriptors[0].rate_limit.requestsperunit"
        );
        let root = "domain: d\nversion: 2\n";
        assert_eq!(refused(root).1, "version");
        // A field valid at another level is still a mistake here.
        let misplaced = "domain: d\ndescriptors:\n  - key: a\n    unit: day\n";
        assert_eq!(refused(misplaced).1, "descriptors[0].unit");
    }

    #[test]
    fn keys_must_be_names_and_lists_must_hold_mappings() {
        let number_key = "0.25: d\ndescriptors:\n";
        assert_eq!(refused(number_key).0, 1);
        let (line, field, _) = refused("domain: d\ndescriptors:\n  - a\n  - b\n");
        assert_eq!((line, field.as_str()), (3, "descriptors[0]"));
        let (line, _, _) = refused("domain: d\ndescriptors:\n  - {key: a}\n  - ? [x]\n    : y\n");
        assert_eq!(line, 4);
        assert_eq!(refused("- domain: d\n").1, "");
    }

    #[test]
    fn a_field_set_twice_in_one_mapping_is_refused() {
        let (line, field, _) = refused("domain: d\ndescriptors:\n  - key: a\n    key: b\n");
        assert_eq!((line, field.as_str()), (4, "descriptors[0].key"));
    }

    #[test]
    fn syntax_errors_name_their_line() {
        let (line, field, text) = refused("domain: d\ndescriptors:\n  - key: a\n    value: [b\n");
        assert!(line >= 4, "{text}");
        assert_eq!(field, "");
        assert!(text.contains("YAML syntax error"), "{text}");
        assert!(refused("'''").2.contains("YAML syntax error"));
    }

    #[test]
    fn quota_mode_is_refused_unless_false_and_share_threshold_is_read() {
        let on = "domain: d\ndescriptors:\n  - key: a\n    quota_mode: true\n    rate_limit: {unit: day, requests_per_unit: 1}\n";
        let (line, field, _) = refused(on);
        assert_eq!((line, field.as_str()), (4, "descriptors[0].quota_mode"));
        Domain::from_envoy_yaml(&on.replace("true", "false"), None).unwrap();
        let share = "domain: d\ndescriptors:\n  - key: a\n    value: x*\n    share_threshold: true\n    rate_limit: {unit: day, requests_per_unit: 1}\n";
        let d = Domain::from_envoy_yaml(share, None).unwrap();
        assert_eq!(
            d.shared_patterns(&[("a", "x1")]),
            vec![Some("x*".into())],
            "every value x* matches is counted as x*"
        );
        let not = Domain::from_envoy_yaml(&share.replace("true", "false"), None).unwrap();
        assert!(not.shared_patterns(&[("a", "x1")]).is_empty());
    }

    #[test]
    fn refused_modes_say_what_they_mean_and_share_threshold_needs_a_wildcard() {
        let quota = "domain: d\ndescriptors:\n  - key: a\n    quota_mode: true\n";
        assert!(
            refused(quota).2.contains("quota mode"),
            "{}",
            refused(quota).2
        );
        let exact =
            "domain: d\ndescriptors:\n  - key: a\n    value: x\n    share_threshold: true\n";
        let (line, field, text) = refused(exact);
        assert_eq!(
            (line, field.as_str()),
            (5, "descriptors[0].share_threshold")
        );
        assert!(text.contains("wildcard value"), "{text}");
    }

    #[test]
    fn envoy_fields_that_only_shape_metrics_are_accepted() {
        let yaml = "\
domain: d
descriptors:
  - key: a
    detailed_metric: true
    value_to_metric: true
    metadata:
      team: payments
      tags: [x, {y: 1}]
    rate_limit: {unit: minute, requests_per_unit: 70}
";
        let d = Domain::from_envoy_yaml(yaml, None).unwrap();
        let r = d.find(&[("a", "v1")]).unwrap();
        assert!(r.detailed_metric);
        assert_eq!(&*r.label, "a", "labels stay bounded with detailed_metric");
    }

    #[test]
    fn anchors_and_flow_style_read_as_block_style() {
        let yaml = "\
domain: d
descriptors:
  - key: a
    rate_limit: &per_min {unit: minute, requests_per_unit: 10}
  - {key: b, value: '1', rate_limit: *per_min}
";
        let d = Domain::from_envoy_yaml(yaml, None).unwrap();
        assert_eq!(d.find(&[("b", "1")]).unwrap().unit, Some(RlsUnit::Minute));
        assert!(d.find(&[("b", "2")]).is_none());
    }

    #[test]
    fn empty_descriptors_and_rate_limit_are_allowed() {
        let d = Domain::from_envoy_yaml("domain: d\ndescriptors:\n", None).unwrap();
        assert!(d.rules().is_empty());
        let d = Domain::from_envoy_yaml(
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n",
            None,
        )
        .unwrap();
        assert!(d.find(&[("a", "1")]).is_none());
    }
}
