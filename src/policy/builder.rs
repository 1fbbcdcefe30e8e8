//! Building a policy in code, and the validation every policy passes,
//! whether it came from a file or from the builder.

use std::collections::HashSet;

use super::{
    ConfigError, DashboardSettings, IdentitySettings, LeaseMode, LeaseSettings, Limit, Policy,
    ResilienceSettings, RouteRule, Scope, StoreSettings, TelemetrySettings, Tier, shares,
};

/// Builds a [`Policy`]; [`PolicyBuilder::build`] validates it.
#[derive(Debug, Clone, Default)]
pub struct PolicyBuilder {
    store: StoreSettings,
    resilience: ResilienceSettings,
    identity: IdentitySettings,
    telemetry: TelemetrySettings,
    dashboard: DashboardSettings,
    leases: LeaseSettings,
    tiers: Vec<Tier>,
    routes: Vec<RouteRule>,
    partition: Option<f64>,
    version: Option<String>,
    rls: crate::policy::rls::RlsSettings,
    server: crate::policy::ServerSettings,
}

impl PolicyBuilder {
    /// Adds a tier.
    pub fn tier(mut self, tier: Tier) -> Self {
        self.tiers.push(tier);
        self
    }

    /// Adds a route rule (first match wins).
    pub fn route(mut self, route: RouteRule) -> Self {
        self.routes.push(route);
        self
    }

    /// Sets the store settings.
    pub fn store(mut self, store: StoreSettings) -> Self {
        self.store = store;
        self
    }

    /// Sets the resilience settings.
    pub fn resilience(mut self, resilience: ResilienceSettings) -> Self {
        self.resilience = resilience;
        self
    }

    /// Sets the identity settings.
    pub fn identity(mut self, identity: IdentitySettings) -> Self {
        self.identity = identity;
        self
    }

    /// Sets the telemetry settings.
    pub fn telemetry(mut self, telemetry: TelemetrySettings) -> Self {
        self.telemetry = telemetry;
        self
    }

    /// Sets the `[server]` bounds of `ratewatch serve`'s listeners.
    pub fn server(mut self, server: crate::policy::ServerSettings) -> Self {
        self.server = server;
        self
    }

    /// Sets the dashboard settings.
    pub fn dashboard(mut self, dashboard: DashboardSettings) -> Self {
        self.dashboard = dashboard;
        self
    }

    /// Sets the lease settings.
    pub fn leases(mut self, leases: LeaseSettings) -> Self {
        self.leases = leases;
        self
    }

    /// Enforces only `fraction` of every quota (0 < fraction <= 1).
    pub fn partition(mut self, fraction: f64) -> Self {
        self.partition = Some(fraction);
        self
    }

    /// Sets the `[rls]` settings and descriptor domains.
    pub fn rls(mut self, rls: crate::policy::rls::RlsSettings) -> Self {
        self.rls = rls;
        self
    }

    /// Names the limiter (see [`TelemetrySettings::limiter_name`]); the
    /// name is checked by [`PolicyBuilder::build`].
    pub fn limiter_name(mut self, name: impl Into<String>) -> Self {
        self.telemetry.limiter_name = Some(name.into());
        self
    }

    /// Names this revision of the policy (`version = "..."` in a file).
    pub fn version(mut self, version: impl Into<String>) -> Self {
        self.version = Some(version.into());
        self
    }

    /// Validates and scales the policy. The scaled policy is validated
    /// again, so what [`Policy::validate`] (and `ratewatch check-config`)
    /// accepts is exactly what a limiter runs.
    pub fn build(self) -> Result<Policy, ConfigError> {
        let partition = self.partition.unwrap_or(1.0);
        let mut policy = Policy {
            store: self.store,
            resilience: self.resilience,
            identity: self.identity,
            telemetry: self.telemetry,
            dashboard: self.dashboard,
            leases: self.leases,
            tiers: self.tiers,
            routes: self.routes,
            partition,
            version: self.version,
            rls: self.rls,
            server: self.server,
        };
        policy.validate()?;
        if partition < 1.0 {
            let invalid = |(field, message)| ConfigError::Invalid {
                file: None,
                line: None,
                field,
                message,
            };
            shares::check_partition(&policy, partition).map_err(invalid)?;
            let (num, den) = shares::partition_ratio(partition);
            let scale = |l: &mut Limit| l.algorithm = shares::divided(&l.algorithm, num, den);
            policy
                .tiers
                .iter_mut()
                .flat_map(|t| t.limits.iter_mut())
                .for_each(scale);
            policy
                .routes
                .iter_mut()
                .flat_map(|r| r.limits.iter_mut())
                .for_each(scale);
            // Descriptor rules are quotas of this deployment too.
            policy
                .rls
                .domains
                .rules_mut()
                .into_iter()
                .flat_map(|(_, r)| r.limits.iter_mut())
                .for_each(scale);
            validate(&policy).map_err(|(field, message)| {
                invalid((
                    field,
                    format!("{message} (once partition = {partition} is applied)"),
                ))
            })?;
        }
        Ok(policy)
    }
}

/// Checks a policy; on failure returns the field's path (as in the TOML:
/// `tiers[0].limits[1].capacity`) and what would be valid.
pub(crate) fn validate(p: &Policy) -> Result<(), (String, String)> {
    if !(p.partition > 0.0 && p.partition <= 1.0) {
        return Err((
            "partition".into(),
            format!("must be above 0 and at most 1, got {}", p.partition),
        ));
    }
    if let Some(v) = &p.version {
        let printable = v.chars().all(|c| c.is_ascii_graphic() || c == ' ');
        if v.is_empty() || v.len() > 64 || !printable {
            return Err((
                "version".into(),
                "must be 1 to 64 printable ASCII characters (it becomes a metric label)".into(),
            ));
        }
    }
    if let Some(name) = &p.telemetry.limiter_name {
        if !super::settings::valid_limiter_name(name) {
            return Err((
                "telemetry.limiter_name".into(),
                "must be 1 to 64 characters of A-Z, a-z, 0-9, `_`, `.` and `-` (it becomes a metric label)".into(),
            ));
        }
    }
    if p.store.timeout.is_zero() {
        return Err(("store.timeout_ms".into(), "must be at least 1".into()));
    }
    if p.store.key_prefix.is_empty() || p.store.key_prefix.contains(['{', '}', ' ']) {
        return Err((
            "store.key_prefix".into(),
            "must be non-empty, without braces or spaces".into(),
        ));
    }
    // A store address `serve` could never connect to is a config error
    // here, so `check-config` refuses what `serve` would fail to start on.
    let redis_url = |u: &str| {
        ["redis://", "rediss://", "redis+unix://", "unix://"]
            .iter()
            .any(|scheme| u.len() > scheme.len() && u.starts_with(scheme))
    };
    let url_hint = "must be a Redis URL such as \"redis://127.0.0.1:6379\" \
                    (schemes redis://, rediss://, redis+unix://, unix://)";
    if p.store.url.as_deref().is_some_and(|u| !redis_url(u)) {
        return Err(("store.url".into(), url_hint.into()));
    }
    if p.store.nodes.iter().any(|u| !redis_url(u)) {
        return Err(("store.nodes".into(), format!("each node {url_hint}")));
    }
    if p.store.sentinels.iter().any(|u| !redis_url(u)) {
        return Err((
            "store.sentinels".into(),
            format!("each sentinel {url_hint}"),
        ));
    }
    let (min, max) = super::settings::MAX_ENTRIES_BOUNDS;
    if !(min..=max).contains(&(p.store.max_entries as u64)) {
        return Err((
            "store.max_entries".into(),
            format!("must be from {min} to {max}, got {}", p.store.max_entries),
        ));
    }
    if !(1..=10_000).contains(&p.resilience.expected_instances) {
        return Err((
            "resilience.expected_instances".into(),
            "must be from 1 to 10000".into(),
        ));
    }
    if p.resilience.breaker.failures == 0 {
        return Err((
            "resilience.breaker.failures".into(),
            "must be at least 1".into(),
        ));
    }
    let ratio = p.resilience.breaker.failure_ratio;
    if !(ratio > 0.0 && ratio <= 1.0) {
        return Err((
            "resilience.breaker.failure_ratio".into(),
            format!("must be above 0 and at most 1, got {ratio}"),
        ));
    }
    if p.identity.api_key_header.is_empty()
        || http::HeaderName::from_bytes(p.identity.api_key_header.as_bytes()).is_err()
    {
        return Err((
            "identity.api_key_header".into(),
            "must be a valid HTTP header name such as \"x-api-key\"".into(),
        ));
    }
    if !(1..=128).contains(&p.identity.ipv6_prefix) {
        return Err((
            "identity.ipv6_prefix".into(),
            format!(
                "must be from 1 to 128 (bits of an IPv6 address that name one client), got {}",
                p.identity.ipv6_prefix
            ),
        ));
    }
    if p.telemetry.top_keys == 0 || p.telemetry.top_keys > 10_000 {
        return Err((
            "telemetry.top_keys".into(),
            "must be between 1 and 10000".into(),
        ));
    }
    if p.telemetry.flush_interval.as_millis() < 10 {
        return Err((
            "telemetry.flush_interval_ms".into(),
            "must be at least 10".into(),
        ));
    }
    if let Some((field, message)) = p.leases.check() {
        return Err((field.into(), message));
    }
    let mut names = HashSet::new();
    for (ti, tier) in p.tiers.iter().enumerate() {
        let at = format!("tiers[{ti}]");
        if tier.name.is_empty() || !tier.name.chars().all(label_char) {
            return Err((
                format!("{at}.name"),
                "must be non-empty letters, digits, '_' or '-'".into(),
            ));
        }
        if !names.insert(tier.name.as_str()) {
            return Err((
                format!("{at}.name"),
                format!(
                    "duplicate tier name \"{}\"; tier names must be unique",
                    tier.name
                ),
            ));
        }
        if tier.split == 0 || tier.split > 64 {
            return Err((format!("{at}.split"), "must be between 1 and 64".into()));
        }
        if tier.unlimited && !tier.limits.is_empty() {
            return Err((
                format!("{at}.unlimited"),
                "contradicts the tier's limits; remove `unlimited = true` or the limits".into(),
            ));
        }
        check_limits(&tier.limits, &format!("{at}.limits"), 1)?;
        if let Some(li) = tier.limits.iter().position(|l| l.tier.is_some()) {
            return Err((
                format!("{at}.limits[{li}].tier"),
                "is for a route rule's limits (a tier's own limits are that tier's already)".into(),
            ));
        }
    }
    // The anonymous tier is only ever asked for when anonymous callers are
    // limited by IP, or unmatched keys count as the anonymous caller: a
    // policy that rejects both needs none.
    let anonymous_used = p.identity.anonymous == crate::policy::AnonymousMode::Ip
        || p.identity.unmatched_keys == crate::policy::UnmatchedKeys::Anonymous;
    let required_tiers = [
        Some(&p.identity.default_tier),
        anonymous_used.then_some(&p.identity.anonymous_tier),
    ];
    for required in required_tiers.into_iter().flatten() {
        if !p.tiers.is_empty() && !names.contains(required.as_str()) {
            let field = if required == &p.identity.default_tier {
                "identity.default_tier"
            } else {
                "identity.anonymous_tier"
            };
            return Err((
                field.into(),
                format!(
                    "names tier \"{required}\", which is not defined; defined tiers: {}",
                    p.tiers
                        .iter()
                        .map(|t| t.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ));
        }
    }
    if let crate::policy::UnknownTier::Tier(t) = &p.identity.unknown_tier {
        if !p.tiers.is_empty() && !names.contains(t.as_str()) {
            return Err((
                "identity.unknown_tier".into(),
                format!(
                    "names tier \"{t}\", which is not defined; say \"reject\" or name a defined tier"
                ),
            ));
        }
    }
    for (ri, route) in p.routes.iter().enumerate() {
        let at = format!("routes[{ri}]");
        if let Some((field, message)) = route.check() {
            return Err((format!("{at}.{field}"), message));
        }
        if let Some(ei) = p.routes[..ri].iter().position(|e| route.is_shadowed_by(e)) {
            return Err((
                format!("{at}.path"),
                format!(
                    "is never matched: routes[{ei}] ({}) comes first and matches every request this rule ({}) would; move this rule above it or remove it",
                    p.routes[ei].describe(),
                    route.describe()
                ),
            ));
        }
        if route.cost == 0 {
            return Err((format!("{at}.cost"), "must be at least 1".into()));
        }
        for (ei, e) in route.estimates.iter().enumerate() {
            if let Some((field, message)) = e.check() {
                return Err((format!("{at}.costs[{ei}].{field}"), message));
            }
            if route.estimates[..ei].iter().any(|o| o.unit == e.unit) {
                return Err((
                    format!("{at}.costs[{ei}].unit"),
                    format!(
                        "estimates \"{}\" a second time; give each unit one source",
                        e.unit
                    ),
                ));
            }
        }
        check_limits(&route.limits, &format!("{at}.limits"), route.cost)?;
        for (li, l) in route.limits.iter().enumerate() {
            if let Some(t) = l.tier.as_deref().filter(|t| !names.contains(t)) {
                return Err((
                    format!("{at}.limits[{li}].tier"),
                    format!(
                        "names tier \"{t}\", which is not defined; defined tiers: {}",
                        p.tiers
                            .iter()
                            .map(|t| t.name.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                ));
            }
        }
        for (ti, tier) in p.tiers.iter().enumerate() {
            for (li, limit) in tier.limits.iter().enumerate() {
                if route.cost > limit.algorithm.max_cost()
                    && limit.counts_requests()
                    && !route.exempt
                    && !limit.shadow
                {
                    return Err((
                        format!("{at}.cost"),
                        format!(
                            "cost {} exceeds tiers[{ti}].limits[{li}] (\"{}\" of tier \"{}\", at most {} per request), so the request could never pass",
                            route.cost,
                            limit.name,
                            tier.name,
                            limit.algorithm.max_cost()
                        ),
                    ));
                }
            }
        }
    }
    check_shared_counters(p)?;
    check_rls(p)?;
    shares::check(p)
}

/// The limits of descriptor rules, checked as tiers' are (the TOML reader
/// checks native rules on their own lines first; this covers rules built
/// in code and quotas once `partition` is applied).
fn check_rls(p: &Policy) -> Result<(), (String, String)> {
    for domain in p.rls.domains.iter() {
        for rule in domain.rules() {
            let at = format!("rls.domains.{}.{}.limits", domain.name, rule.label);
            check_limits(&rule.limits, &at, rule.cost.unwrap_or(1))?;
        }
    }
    Ok(())
}

/// IP- and route-scoped limits of the same name in several tiers count on
/// one counter (an address, or a route, is counted once whatever tier its
/// callers claim). Each tier may set its own quota against that counter,
/// but the counter's shape must agree: another algorithm or window would
/// read it differently, and alternating tiers could reset it.
fn check_shared_counters(p: &Policy) -> Result<(), (String, String)> {
    let mut first: std::collections::HashMap<(Scope, &str), (usize, usize)> =
        std::collections::HashMap::new();
    for (ti, tier) in p.tiers.iter().enumerate() {
        for (li, limit) in tier.limits.iter().enumerate() {
            if limit.scope == Scope::Identity {
                continue;
            }
            let Some(&(fti, fli)) = first.get(&(limit.scope, limit.name.as_str())) else {
                first.insert((limit.scope, limit.name.as_str()), (ti, li));
                continue;
            };
            let other = &p.tiers[fti].limits[fli];
            let (field, what) = if other.algorithm.kind() != limit.algorithm.kind() {
                ("algorithm", format!("algorithm {}", other.algorithm.kind()))
            } else if window_of(&other.algorithm) != window_of(&limit.algorithm) {
                ("window", "window".to_owned())
            } else {
                continue;
            };
            return Err((
                format!("tiers[{ti}].limits[{li}].{field}"),
                format!(
                    "differs from tiers[{fti}].limits[{fli}] (\"{}\" of tier \"{}\"), which shares its {} counter; a {}-scoped limit of one name is one counter for every tier, so every tier must give it the same {what} (each may set its own quota)",
                    other.name,
                    p.tiers[fti].name,
                    limit.scope.as_str(),
                    limit.scope.as_str(),
                ),
            ));
        }
    }
    Ok(())
}

fn window_of(a: &crate::algorithm::Algorithm) -> Option<u64> {
    use crate::algorithm::Algorithm::*;
    match *a {
        SlidingWindow { window_us, .. }
        | SlidingLog { window_us, .. }
        | FixedWindow { window_us, .. } => Some(window_us),
        _ => None,
    }
}

pub(crate) fn check_limits(limits: &[Limit], at: &str, cost: u64) -> Result<(), (String, String)> {
    let mut names = HashSet::new();
    for (li, limit) in limits.iter().enumerate() {
        let at = format!("{at}[{li}]");
        if limit.name.is_empty() || !limit.name.chars().all(label_char) {
            return Err((
                format!("{at}.name"),
                "must be non-empty letters, digits, '_' or '-'".into(),
            ));
        }
        if !names.insert((limit.name.as_str(), limit.tier.as_deref())) {
            return Err((
                format!("{at}.name"),
                format!(
                    "duplicate limit name \"{}\"; limit names must be unique within a tier",
                    limit.name
                ),
            ));
        }
        limit.algorithm.validate().map_err(|m| {
            let field = m
                .split('`')
                .nth(1)
                .map_or_else(|| at.clone(), |f| format!("{at}.{f}"));
            (field, m)
        })?;
        if limit.mode.is_some_and(|m| m != LeaseMode::Exact) && !leasable(&limit.algorithm) {
            return Err((
                format!("{at}.mode"),
                format!(
                    "is \"{}\", but a {} limit can only be \"exact\": leases need an \
                     algorithm whose unspent units can be given back (token_bucket, \
                     fixed_window, sliding_window, gcra)",
                    limit.mode.unwrap_or_default().as_str(),
                    limit.algorithm.kind()
                ),
            ));
        }
        if let Some(message) = super::check_unit(&limit.unit) {
            return Err((format!("{at}.unit"), message));
        }
        if limit.algorithm.is_concurrency() && !limit.counts_requests() {
            return Err((
                format!("{at}.unit"),
                format!(
                    "is \"{}\", but an in-flight (concurrency) limit counts requests in \
                     flight, one slot each whatever their costs; remove `unit` (or write \
                     \"requests\")",
                    limit.unit
                ),
            ));
        }
        // The route's cost is in requests: a limit of another unit is
        // charged the request's cost in its own unit, known per request.
        if limit.counts_requests() && cost > limit.algorithm.max_cost() && !limit.shadow {
            return Err((
                format!("{at}.{}", shares::quota_field(&limit.algorithm)),
                format!(
                    "is {}, below the route's cost {cost}, so the request could never pass",
                    limit.algorithm.max_cost()
                ),
            ));
        }
    }
    Ok(())
}

/// Whether a lease of `n` units of `algorithm` can be charged at once and
/// its unspent part given back: not a sliding log (one member per unit) nor
/// a leaky bucket (a lease would be a queue position, not a quota).
pub(crate) fn leasable(algorithm: &crate::algorithm::Algorithm) -> bool {
    use crate::algorithm::Algorithm as A;
    matches!(
        algorithm,
        A::TokenBucket { .. } | A::FixedWindow { .. } | A::SlidingWindow { .. } | A::Gcra { .. }
    )
}

fn label_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == '-'
}
