//! `[rls]`: the decision service's settings, its envoyproxy/ratelimit YAML
//! files and its native `[[rls.domains]]`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use toml::Spanned;
use toml::de::DeTable;

use super::ConfigError;
use super::reader::{Result, Source, Table};
use super::rule_files;
use super::rules::limits;
use super::{FileKind, read_text_file};
use crate::algorithm::Algorithm;
use crate::policy::rls::{
    DescriptorRule, Domain, DomainSet, RlsFailure, RlsHeaders, RlsSettings, RlsUnit,
};
use crate::policy::{FailurePolicy, LeaseMode, Limit, Scope};

/// Keys of `[rls]`.
const RLS_KEYS: [&str; 9] = [
    "detailed_metric_top_k",
    "response_dynamic_metadata",
    "envoy_configs",
    "merge_domains",
    "on_store_failure",
    "token",
    "domains",
    "response_headers",
    "near_limit_ratio",
];

/// The most bytes of YAML all `envoy_configs` of a policy may load
/// together: 64 MiB.
const MAX_RULE_BYTES_TOTAL: u64 = 64 * 1024 * 1024;
/// Keys of one `[[rls.domains]]`.
const DOMAIN_KEYS: [&str; 2] = ["name", "rules"];
/// Keys of one `[[rls.domains.rules]]`.
const RULE_KEYS: [&str; 12] = [
    "apply_on_stream_done",
    "descriptor",
    "name",
    "limits",
    "tier_from",
    "cost",
    "on_store_failure",
    "mode",
    "shadow",
    "unlimited",
    "replaces",
    "detailed_metric",
];

/// What the section needs from the rest of the policy.
pub(super) struct Context<'a> {
    pub(super) src: Source<'a>,
    pub(super) doc: &'a Spanned<DeTable<'a>>,
    /// The policy file, to resolve `envoy_configs` against its directory.
    pub(super) file: Option<&'a str>,
    /// `[resilience] on_store_failure`, the default.
    pub(super) on_store_failure: FailurePolicy,
    /// Whether the policy has `[[tiers]]` (`tier_from` resolves to them).
    pub(super) has_tiers: bool,
}

/// Reads `[rls]`, loading every YAML file it names.
pub(super) fn rls(t: Option<Table<'_>>, cx: &Context<'_>) -> Result<RlsSettings> {
    let mut out = RlsSettings {
        on_store_failure: RlsFailure::from_policy(cx.on_store_failure),
        ..RlsSettings::default()
    };
    let Some(t) = t else { return Ok(out) };
    t.only(&RLS_KEYS, "[rls]")?;
    if let Some(f) = t.choice("on_store_failure", &RlsFailure::CHOICES)? {
        out.on_store_failure = f;
    }
    if let Some(h) = t.choice("response_headers", &RlsHeaders::CHOICES)? {
        out.response_headers = h;
    }
    if let Some(r) = t.number("near_limit_ratio")? {
        if !(r > 0.0 && r <= 1.0) {
            return Err(t.error_at(
                "near_limit_ratio",
                format!(
                    "must be a share of the limit above 0 and at most 1 (such as 0.8), got {r}"
                ),
            ));
        }
        out.near_limit_ratio = r;
    }
    let max_top_k = RlsSettings::MAX_DETAILED_METRIC_TOP_K as u64;
    if let Some(k) = t.uint("detailed_metric_top_k", 1, max_top_k)? {
        out.detailed_metric_top_k = k as usize;
    }
    if let Some(on) = t.bool("response_dynamic_metadata")? {
        out.response_dynamic_metadata = on;
    }
    if let Some(token) = t.str("token")? {
        if token.len() < 16 {
            return Err(t.error_at(
                "token",
                "must be at least 16 characters: it is the only thing between the network and the decision endpoints",
            ));
        }
        out.token = Some(token.to_owned());
    }
    let base = cx
        .file
        .map(Path::new)
        .and_then(Path::parent)
        .map(Path::to_path_buf)
        .unwrap_or_default();
    let merge = t.bool("merge_domains")?.unwrap_or(false);
    let mut domains = DomainSet::default();
    let mut origin: HashMap<Arc<str>, PathBuf> = HashMap::new();
    let mut total: u64 = 0;
    for item in t.items(
        "envoy_configs",
        "a list of YAML files, directories or globs",
    )? {
        let rel = item.as_str()?;
        if rel.is_empty() {
            return Err(item.error(
                "must be a path to an envoyproxy/ratelimit YAML file, a directory of them or a glob",
            ));
        }
        let entry: PathBuf = base.join(rel);
        let files = rule_files::expand(&entry)
            .map_err(|m| item.error(format!("names {}, which {m}", entry.display())))?;
        out.envoy_config_entries.push(entry);
        for path in files {
            if out.envoy_configs.contains(&path) {
                continue;
            }
            if out.envoy_configs.len() >= rule_files::MAX_RULE_FILES {
                return Err(item.error(format!(
                    "brings the files loaded past {}, the most a policy may load",
                    rule_files::MAX_RULE_FILES
                )));
            }
            let (text, _) = read_text_file(&path, FileKind::RULES).map_err(|e| {
                let why = match e.error {
                    ConfigError::Io { source, .. } => format!("cannot be read: {source}"),
                    ConfigError::Invalid { message, .. } => message,
                };
                item.error(format!("names {}, which {why}", path.display()))
            })?;
            total += text.len() as u64;
            if total > MAX_RULE_BYTES_TOTAL {
                return Err(item.error(format!(
                    "brings the YAML loaded past {MAX_RULE_BYTES_TOTAL} bytes, the most a policy may load"
                )));
            }
            let file = path.display().to_string();
            let domain = Domain::from_envoy_yaml(&text, Some(&file))?;
            let name = domain.name.clone();
            match (domains.domain_mut(&name), origin.get(&name)) {
                (Some(first), Some(from)) if merge => first.absorb(domain).map_err(|key| {
                    item.error(format!(
                        "merges domain \"{name}\" of {file} into that of {}, but both define \
                         the top-level descriptor `{key}`",
                        from.display()
                    ))
                })?,
                (Some(_), from) => {
                    let from =
                        from.map_or_else(String::new, |f| format!(" (first from {})", f.display()));
                    return Err(item.error(format!(
                        "loads domain \"{name}\" from {file} a second time{from}; each domain \
                         must come from one file, unless `merge_domains = true` merges them"
                    )));
                }
                (None, _) => {
                    origin.insert(name, path.clone());
                    // A fresh name: cannot clash.
                    let _ = domains.insert(domain);
                }
            }
            out.envoy_configs.push(path);
        }
    }
    for d in t.tables("domains")? {
        let domain = native_domain(&d, cx)?;
        if let Err(dup) = domains.insert(domain) {
            return Err(d.error_at(
                "name",
                format!(
                    "repeats domain \"{}\", already defined (here or in an envoy_configs file)",
                    dup.name
                ),
            ));
        }
    }
    out.domains = domains;
    Ok(out)
}

/// One `[[rls.domains]]`.
fn native_domain(t: &Table<'_>, cx: &Context<'_>) -> Result<Domain> {
    t.only(&DOMAIN_KEYS, "an rls domain")?;
    let name = t.required_str("name", "the domain requests name, like \"api\"")?;
    if name.is_empty() {
        return Err(t.error_at("name", "must not be empty"));
    }
    let mut domain = Domain::new(name);
    for r in t.tables("rules")? {
        let (path, rule) = native_rule(&r, cx)?;
        let borrowed: Vec<(&str, Option<&str>)> = path
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_deref()))
            .collect();
        if domain.insert(&borrowed, rule).is_err() {
            return Err(r.error_at(
                "descriptor",
                "repeats the descriptor of an earlier rule of this domain; one rule per descriptor",
            ));
        }
    }
    Ok(domain)
}

/// One `[[rls.domains.rules]]`: the descriptor it matches and its rule.
#[allow(clippy::type_complexity)]
fn native_rule(
    t: &Table<'_>,
    cx: &Context<'_>,
) -> Result<(Vec<(String, Option<String>)>, DescriptorRule)> {
    t.only(&RULE_KEYS, "an rls rule")?;
    let entries = t.items("descriptor", "a list of \"key\" or \"key=value\" strings")?;
    if entries.is_empty() {
        return Err(t.missing(
            "descriptor",
            "is required: the entries the rule matches, like [\"remote_address\"] or [\"generic_key=export\", \"remote_address\"]",
        ));
    }
    let mut path = Vec::new();
    for e in &entries {
        let s = e.as_str()?;
        let (key, value) = match s.split_once('=') {
            Some((k, v)) => (k, Some(v.to_owned()).filter(|v| !v.is_empty())),
            None => (s, None),
        };
        if key.is_empty() {
            return Err(e.error(
                "needs a key before any `=`, like \"remote_address\" or \"generic_key=export\"",
            ));
        }
        path.push((key.to_owned(), value));
    }
    let label_path = path
        .iter()
        .map(|(k, v)| match v {
            Some(v) => format!("{k}_{v}"),
            None => k.clone(),
        })
        .collect::<Vec<_>>()
        .join(".");
    let name = t.str("name")?.filter(|n| !n.is_empty());
    let unlimited = t.bool("unlimited")?.unwrap_or(false);
    let limits: Vec<Limit> = limits(t)?;
    let tier = match t.str("tier_from")? {
        None => None,
        Some(k) if path.iter().any(|(key, _)| key == k) => {
            if !cx.has_tiers {
                return Err(t.error_at(
                    "tier_from",
                    "resolves a descriptor value to a tier, but the policy has no [[tiers]]",
                ));
            }
            Some(Arc::<str>::from(k))
        }
        Some(k) => {
            return Err(t.error_at(
                "tier_from",
                format!(
                    "names key \"{k}\", which is not in this rule's descriptor ({})",
                    path.iter()
                        .map(|(k, _)| k.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ));
        }
    };
    if unlimited && (!limits.is_empty() || tier.is_some()) {
        return Err(t.error_at(
            "unlimited",
            "is true, so the rule may have neither `limits` nor `tier_from`",
        ));
    }
    if !unlimited && limits.is_empty() && tier.is_none() {
        return Err(t.missing(
            "limits",
            "are required: give the rule limits, a `tier_from` key, or `unlimited = true`",
        ));
    }
    let cost = t.uint("cost", 1, u64::MAX)?;
    let mut replaces = Vec::new();
    for item in t.items("replaces", "a list of rule names")? {
        let n = item.as_str()?;
        if n.is_empty() {
            return Err(item.error("must name the rule this one replaces"));
        }
        if Some(n) == name {
            return Err(item.error(format!(
                "names this rule itself (\"{n}\"); a rule cannot replace itself"
            )));
        }
        replaces.push(Arc::<str>::from(n));
    }
    if let Some(i) = limits.iter().position(|l| l.scope != Scope::Identity) {
        let field = format!("{}[{i}].scope", t.field("limits"));
        return Err(cx.src.error(
            cx.src.locate(cx.doc, &field),
            field,
            "has no meaning in a descriptor rule: the request's descriptor values are what one counter counts; remove it",
        ));
    }
    let at = t.field("limits");
    crate::policy::builder::check_limits(&limits, &at, cost.unwrap_or(1)).map_err(
        |(field, message)| {
            let message = super::after_field(&field, &message);
            cx.src.error(cx.src.locate(cx.doc, &field), field, message)
        },
    )?;
    // An in-flight slot is held until the response ends, which a rate
    // limit service never hears of: such a limit could only take slots
    // and never give them back, or never refuse.
    if let Some(i) = limits
        .iter()
        .position(|l| matches!(l.algorithm, Algorithm::Concurrency { .. }))
    {
        let field = format!("{}[{i}].algorithm", t.field("limits"));
        return Err(cx.src.error(
            cx.src.locate(cx.doc, &field),
            field,
            "is \"concurrency\", which a descriptor rule cannot enforce: the decision service never hears when a request ends, so no slot could be given back; use a rate (token_bucket, gcra, ...) here and a concurrency limit in the middleware",
        ));
    }
    let apply_on_stream_done = t.bool("apply_on_stream_done")?.unwrap_or(false);
    if apply_on_stream_done && unlimited {
        return Err(t.error_at(
            "apply_on_stream_done",
            "is true, but the rule is unlimited: it has nothing to charge",
        ));
    }
    let unit = limits.first().and_then(|l| unit_of(&l.algorithm));
    let rule = DescriptorRule {
        label: name.unwrap_or(&label_path).into(),
        name: name.map(Into::into),
        limits,
        unlimited,
        shadow: t.bool("shadow")?.unwrap_or(false),
        replaces,
        unit,
        tier,
        cost,
        on_store_failure: t.choice("on_store_failure", &RlsFailure::CHOICES)?,
        mode: t.choice("mode", &LeaseMode::CHOICES)?,
        detailed_metric: t.bool("detailed_metric")?.unwrap_or(false),
        deny: false,
        apply_on_stream_done,
        metadata: None,
    };
    Ok((path, rule))
}

/// The Envoy unit a window limit counts per, when its window is exactly
/// one unit long.
fn unit_of(a: &Algorithm) -> Option<RlsUnit> {
    let window_us = match *a {
        Algorithm::FixedWindow { window_us, .. }
        | Algorithm::SlidingWindow { window_us, .. }
        | Algorithm::SlidingLog { window_us, .. } => window_us,
        _ => return None,
    };
    RlsUnit::CHOICES
        .iter()
        .map(|&(_, u)| u)
        .find(|u| u.seconds() * 1_000_000 == window_us)
}
