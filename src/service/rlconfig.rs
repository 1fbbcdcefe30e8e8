//! `GET /rlconfig`: the descriptor configuration as loaded, one line per
//! rule, as envoyproxy/ratelimit's debug `/rlconfig` prints it:
//!
//! ```text
//! edge.remote_address: unit=MINUTE requests_per_unit=10, shadow_mode: false
//! edge.client_bot: unlimited, shadow_mode: false
//! ```
//!
//! A line is the domain and the rule's configured path (each entry's `key`
//! or `key_value`, joined by `.`), then its limit. A native rule whose
//! limits are not one window of a whole unit lists them all:
//! `limits=burst=5/5s (token_bucket) day=100/86400s (fixed_window)`
//! (name, quota, window or refill time, algorithm). Only configuration is printed:
//! never a token, never a request's value. The route is guarded like
//! `POST /json`.

use std::fmt::Write as _;

use axum::response::{IntoResponse, Response};
use http::header;

use super::decide::RateLimitService;
use crate::policy::rls::{DescriptorRule, RlsSettings};

/// The dump of the policy the service decides with now, as `text/plain`.
pub(super) fn dump(service: &RateLimitService) -> Response {
    let policy = service.limiter().policy();
    (
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        render(&policy.rls),
    )
        .into_response()
}

/// One line per rule of every domain, domains by name, rules depth first
/// in configured order.
pub(super) fn render(settings: &RlsSettings) -> String {
    let mut out = String::new();
    for domain in settings.domains.iter() {
        for (path, rule) in domain.rules_by_path() {
            let _ = writeln!(
                out,
                "{}.{}: {}, shadow_mode: {}",
                domain.name,
                path,
                limit_of(rule),
                rule.shadow
            );
        }
    }
    out
}

fn limit_of(rule: &DescriptorRule) -> String {
    if rule.unlimited {
        return "unlimited".to_owned();
    }
    let whole_unit = rule.unit.filter(|_| rule.deny || rule.limits.len() == 1);
    if let Some(unit) = whole_unit {
        let quota = if rule.deny {
            0
        } else {
            rule.limits[0].algorithm.quota()
        };
        return format!(
            "unit={} requests_per_unit={quota}",
            unit.as_str().to_ascii_uppercase()
        );
    }
    let limits: Vec<String> = rule
        .limits
        .iter()
        .map(|l| {
            format!(
                "{}={}/{}s ({})",
                l.name,
                l.algorithm.quota(),
                l.algorithm.window_secs(),
                l.algorithm.kind()
            )
        })
        .collect();
    format!("limits={}", limits.join(" "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Policy;

    #[test]
    fn every_rule_is_one_line_with_its_path_and_limit() {
        let dir = std::env::temp_dir().join(format!("rlconfig-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("edge.yaml"),
            "domain: edge\n\
             descriptors:\n\
             \x20 - key: tenant\n\
             \x20   value: acme\n\
             \x20   descriptors:\n\
             \x20     - key: path\n\
             \x20       rate_limit: {unit: second, requests_per_unit: 3}\n\
             \x20 - key: bot\n\
             \x20   rate_limit: {unlimited: true}\n\
             \x20 - key: search\n\
             \x20   shadow_mode: true\n\
             \x20   rate_limit: {unit: minute, requests_per_unit: 0}\n",
        )
        .unwrap();
        let file = dir.join("policy.toml");
        let text = "[rls]\nenvoy_configs = [\"edge.yaml\"]\ntoken = \"a-token-long-enough-0123\"\n\n\
                    [[rls.domains]]\nname = \"api\"\n\n[[rls.domains.rules]]\n\
                    descriptor = [\"user\"]\nlimits = [\n\
                    { name = \"burst\", algorithm = \"token_bucket\", capacity = 5, refill_per_second = 1 },\n\
                    { name = \"day\", algorithm = \"fixed_window\", limit = 100, window = \"1d\" },\n]\n";
        std::fs::write(&file, text).unwrap();
        let policy = Policy::from_toml_str(text, Some(file.to_str().unwrap())).unwrap();
        let dump = render(&policy.rls);
        std::fs::remove_dir_all(&dir).ok();
        assert_eq!(
            dump,
            "api.user: limits=burst=5/5s (token_bucket) day=100/86400s (fixed_window), shadow_mode: false\n\
             edge.tenant_acme.path: unit=SECOND requests_per_unit=3, shadow_mode: false\n\
             edge.bot: unlimited, shadow_mode: false\n\
             edge.search: unit=MINUTE requests_per_unit=0, shadow_mode: true\n"
        );
        assert!(!dump.contains("a-token"), "{dump}");
    }
}
