//! The settings sections: `[store]`, `[resilience]`, `[identity]`,
//! `[telemetry]` and `[dashboard]`. A missing key keeps its default.

use std::net::IpAddr;

use super::reader::{Result, Table};
use crate::policy::{
    AnonymousMode, DashboardSettings, FailurePolicy, HashSecret, IdentitySettings, IpNet,
    KeyDisplay, LeaseSettings, ResilienceSettings, StoreKind, StoreSettings, TelemetrySettings,
    UnknownTier, UnmatchedKeys,
};

pub(super) const FAILURE_POLICIES: [(&str, FailurePolicy); 3] = [
    ("open", FailurePolicy::Open),
    ("closed", FailurePolicy::Closed),
    ("local", FailurePolicy::Local),
];

pub(super) fn store(t: Option<Table<'_>>) -> Result<StoreSettings> {
    let mut s = StoreSettings::default();
    let Some(t) = t else { return Ok(s) };
    t.only(
        &[
            "kind",
            "url",
            "nodes",
            "master_name",
            "sentinels",
            "username",
            "password",
            "tls_ca_file",
            "tls_cert_file",
            "tls_key_file",
            "timeout_ms",
            "key_prefix",
            "max_entries",
        ],
        "[store]",
    )?;
    let kinds = [
        ("memory", StoreKind::Memory),
        ("redis", StoreKind::Redis),
        ("redis-cluster", StoreKind::RedisCluster),
        ("redis-sentinel", StoreKind::RedisSentinel),
    ];
    if let Some(kind) = t.choice("kind", &kinds)? {
        s.kind = kind;
    }
    s.url = t.str("url")?.map(str::to_owned);
    if let Some(url) = &s.url {
        check_scheme(&t, "url", url)?;
    }
    s.nodes = urls(&t, "nodes")?;
    s.sentinels = urls(&t, "sentinels")?;
    s.master_name = t.str("master_name")?.map(str::to_owned);
    s.username = t.str("username")?.map(str::to_owned);
    s.password = t.str("password")?.map(str::to_owned);
    if s.kind == StoreKind::RedisSentinel {
        if s.sentinels.is_empty() {
            return Err(t.error_at(
                "sentinels",
                "is required: a redis-sentinel store needs at least one sentinel URL, \
                 such as [\"redis://127.0.0.1:26379\"]",
            ));
        }
        match s.master_name.as_deref() {
            None => {
                return Err(t.missing(
                    "master_name",
                    "is required: the name the sentinels monitor the master under",
                ));
            }
            Some("") => return Err(t.error_at("master_name", "must not be empty")),
            Some(_) => {}
        }
    }
    s.tls.ca_file = t.str("tls_ca_file")?.map(Into::into);
    s.tls.cert_file = t.str("tls_cert_file")?.map(Into::into);
    s.tls.key_file = t.str("tls_key_file")?.map(Into::into);
    if s.tls.cert_file.is_some() != s.tls.key_file.is_some() {
        let key = if s.tls.cert_file.is_some() {
            "tls_cert_file"
        } else {
            "tls_key_file"
        };
        return Err(t.error_at(
            key,
            "needs its pair: mutual TLS takes both tls_cert_file and tls_key_file",
        ));
    }
    if let Some(timeout) = t.millis("timeout_ms", 1)? {
        s.timeout = timeout;
    }
    if let Some(prefix) = t.str("key_prefix")? {
        s.key_prefix = prefix.to_owned();
    }
    let (min, max) = crate::policy::settings::MAX_ENTRIES_BOUNDS;
    if let Some(max) = t.uint("max_entries", min, max)? {
        s.max_entries = max as usize;
    }
    Ok(s)
}

/// An array of Redis URLs, each checked for a scheme this build speaks.
fn urls(t: &Table<'_>, key: &str) -> Result<Vec<String>> {
    t.items(key, "an array of Redis URLs")?
        .iter()
        .map(|v| {
            let url = v.as_str()?;
            if url.starts_with("rediss://") && !cfg!(feature = "tls") {
                return Err(v.error(NO_TLS));
            }
            Ok(url.to_owned())
        })
        .collect()
}

const NO_TLS: &str = "is a rediss:// (TLS) URL, but this build of ratewatch has no TLS: \
                      build it with the cargo feature `tls`";

fn check_scheme(t: &Table<'_>, key: &str, url: &str) -> Result<()> {
    if url.starts_with("rediss://") && !cfg!(feature = "tls") {
        return Err(t.error_at(key, NO_TLS));
    }
    Ok(())
}

pub(super) fn resilience(t: Option<Table<'_>>) -> Result<ResilienceSettings> {
    let mut r = ResilienceSettings::default();
    let Some(t) = t else { return Ok(r) };
    t.only(
        &[
            "on_store_failure",
            "breaker",
            "expected_instances",
            "retry_after_jitter_ms",
        ],
        "[resilience]",
    )?;
    if let Some(p) = t.choice("on_store_failure", &FAILURE_POLICIES)? {
        r.on_store_failure = p;
    }
    if let Some(b) = t.table("breaker")? {
        b.only(
            &["failures", "open_ms", "failure_ratio", "window"],
            "the breaker",
        )?;
        let max = u64::from(u32::MAX);
        if let Some(n) = b.uint("failures", 1, max)? {
            r.breaker.failures = n as u32;
        }
        if let Some(open) = b.millis("open_ms", 1)? {
            r.breaker.open = open;
        }
        if let Some(ratio) = b.number("failure_ratio")? {
            r.breaker.failure_ratio = ratio;
        }
        if let Some(n) = b.uint("window", 1, max)? {
            r.breaker.window = n as u32;
        }
    }
    if let Some(n) = t.uint("expected_instances", 1, 10_000)? {
        r.expected_instances = n as u32;
    }
    if let Some(jitter) = t.millis("retry_after_jitter_ms", 0)? {
        r.retry_after_jitter = jitter;
    }
    Ok(r)
}

pub(super) fn identity(t: Option<Table<'_>>) -> Result<IdentitySettings> {
    let mut id = IdentitySettings::default();
    let Some(t) = t else { return Ok(id) };
    t.only(
        &[
            "api_key_header",
            "bearer",
            "anonymous",
            "anonymous_tier",
            "default_tier",
            "trusted_proxies",
            "max_key_len",
            "ipv6_prefix",
            "unmatched_keys",
            "unknown_tier",
            "hash_secret",
            "hash_secret_file",
        ],
        "[identity]",
    )?;
    if let Some(h) = t.str("api_key_header")? {
        id.api_key_header = h.to_ascii_lowercase();
    }
    if let Some(b) = t.bool("bearer")? {
        id.bearer = b;
    }
    let modes = [("ip", AnonymousMode::Ip), ("reject", AnonymousMode::Reject)];
    if let Some(m) = t.choice("anonymous", &modes)? {
        id.anonymous = m;
    }
    if let Some(tier) = t.str("anonymous_tier")? {
        id.anonymous_tier = tier.to_owned();
    }
    if let Some(tier) = t.str("default_tier")? {
        id.default_tier = tier.to_owned();
    }
    if t.get("trusted_proxies").is_some() {
        id.trusted_proxies = t
            .items("trusted_proxies", "an array of CIDRs or IP addresses")?
            .iter()
            .map(|v| {
                let s = v.as_str()?.trim();
                parse_net(s).map(crate::policy::settings_canonical_net).ok_or_else(|| {
                    v.error(format!(
                        "must be a CIDR such as \"10.0.0.0/8\" or \"fd00::/8\", or a bare IP such as \"127.0.0.1\", got \"{s}\""
                    ))
                })
            })
            .collect::<Result<_>>()?;
    }
    if let Some(n) = t.uint("max_key_len", 1, u64::from(u32::MAX))? {
        id.max_key_len = n as usize;
    }
    if let Some(n) = t.uint("ipv6_prefix", 1, 128)? {
        id.ipv6_prefix = n as u8;
    }
    let unmatched = [
        ("default_tier", UnmatchedKeys::DefaultTier),
        ("anonymous", UnmatchedKeys::Anonymous),
        ("reject", UnmatchedKeys::Reject),
    ];
    if let Some(u) = t.choice("unmatched_keys", &unmatched)? {
        id.unmatched_keys = u;
    }
    // "reject", or a tier name (checked against the tiers with the policy).
    if let Some(u) = t.str("unknown_tier")? {
        id.unknown_tier = match u {
            "reject" => UnknownTier::Reject,
            tier => UnknownTier::Tier(tier.to_owned()),
        };
    }
    if let Some(secret) = t.str("hash_secret")? {
        id.hash_secret = Some(HashSecret::new(secret).ok_or_else(|| {
            t.error_at(
                "hash_secret",
                format!(
                    "must be at least {} bytes; generate one with `openssl rand -hex 32`",
                    HashSecret::MIN_LEN
                ),
            )
        })?);
    }
    if let Some(file) = t.str("hash_secret_file")? {
        if id.hash_secret.is_some() {
            return Err(t.error_at(
                "hash_secret_file",
                "cannot be set beside hash_secret: give the secret one way",
            ));
        }
        if file.is_empty() {
            return Err(t.error_at("hash_secret_file", "must not be empty"));
        }
        id.hash_secret_file = Some(file.into());
    }
    Ok(id)
}

fn parse_net(s: &str) -> Option<IpNet> {
    if s.contains('/') {
        s.parse().ok()
    } else {
        s.parse::<IpAddr>().ok().map(IpNet::from)
    }
}

pub(super) fn telemetry(t: Option<Table<'_>>) -> Result<TelemetrySettings> {
    let mut tm = TelemetrySettings::default();
    let Some(t) = t else { return Ok(tm) };
    t.only(
        &[
            "flush_interval_ms",
            "top_keys",
            "key_display",
            "limiter_name",
        ],
        "[telemetry]",
    )?;
    if let Some(every) = t.millis("flush_interval_ms", 10)? {
        tm.flush_interval = every;
    }
    if let Some(n) = t.uint("top_keys", 1, 10_000)? {
        tm.top_keys = n as usize;
    }
    let displays = [
        ("masked", KeyDisplay::Masked),
        ("hashed", KeyDisplay::Hashed),
        ("raw", KeyDisplay::Raw),
    ];
    if let Some(d) = t.choice("key_display", &displays)? {
        tm.key_display = d;
    }
    if let Some(name) = t.str("limiter_name")? {
        if !crate::policy::settings::valid_limiter_name(name) {
            return Err(t.error_at(
                "limiter_name",
                "must be 1 to 64 characters of A-Z, a-z, 0-9, `_`, `.` and `-`, such as \"edge\"",
            ));
        }
        tm.limiter_name = Some(name.to_owned());
    }
    Ok(tm)
}

pub(super) fn leases(t: Option<Table<'_>>) -> Result<LeaseSettings> {
    let mut l = LeaseSettings::default();
    let Some(t) = t else { return Ok(l) };
    t.only(
        &[
            "enter_per_second",
            "exit_per_second",
            "renew_ms",
            "ttl_ms",
            "max_share",
            "max_keys",
        ],
        "[leases]",
    )?;
    if let Some(v) = t.number("enter_per_second")? {
        l.enter_per_second = v;
    }
    if let Some(v) = t.number("exit_per_second")? {
        l.exit_per_second = v;
    }
    if let Some(v) = t.millis("renew_ms", 1)? {
        l.renew = v;
    }
    if let Some(v) = t.millis("ttl_ms", 1)? {
        l.ttl = v;
    }
    if let Some(v) = t.number("max_share")? {
        l.max_share = v;
    }
    if let Some(n) = t.uint("max_keys", 1, 1_000_000)? {
        l.max_keys = n as usize;
    }
    Ok(l)
}

pub(super) fn dashboard(t: Option<Table<'_>>) -> Result<DashboardSettings> {
    let mut d = DashboardSettings::default();
    let Some(t) = t else { return Ok(d) };
    t.only(&["enabled", "token", "allow_remote"], "[dashboard]")?;
    if let Some(enabled) = t.bool("enabled")? {
        d.enabled = enabled;
    }
    if let Some(remote) = t.bool("allow_remote")? {
        d.allow_remote = remote;
    }
    if let Some(token) = t.str("token")? {
        if token.is_empty() {
            return Err(t.error_at(
                "token",
                "must not be empty; remove it to serve the dashboard without a token",
            ));
        }
        d.token = Some(token.to_owned());
    }
    Ok(d)
}
