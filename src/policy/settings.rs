//! The settings sections of the config: store, resilience, identity,
//! telemetry, dashboard. Defaults are those of the embedded memory store.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

/// Which store decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StoreKind {
    /// In-process (the embedded default): one instance is the fleet.
    #[default]
    Memory,
    /// One Redis node.
    Redis,
    /// A Redis Cluster.
    RedisCluster,
    /// The master of a Redis Sentinel deployment, found through the
    /// sentinels and followed across failovers.
    RedisSentinel,
}

impl StoreKind {
    /// The config spelling, also what `Store::kind` answers.
    pub fn as_str(self) -> &'static str {
        match self {
            StoreKind::Memory => "memory",
            StoreKind::Redis => "redis",
            StoreKind::RedisCluster => "redis-cluster",
            StoreKind::RedisSentinel => "redis-sentinel",
        }
    }
}

/// The Redis a `redis` store without `url` connects to.
pub const DEFAULT_REDIS_URL: &str = "redis://127.0.0.1:6379";

/// Default `[store] max_entries`: the memory store's cap on live entries.
/// A hash-table slot takes 65 bytes and, under the churn of evictions, a
/// table keeps at least half its slots free, so each of the 64 shards'
/// 27,343 entries sits in a table of 65,536 slots: about 270 MB at the cap
/// whatever identities clients invent (see docs/redis-memory.md and docs/stores.md).
pub const DEFAULT_MAX_ENTRIES: usize = 1_750_000;

/// Bounds of `[store] max_entries`: below a thousand entries the cap would
/// evict live counters of an ordinary load; past a billion it bounds
/// nothing a machine holds.
pub(crate) const MAX_ENTRIES_BOUNDS: (u64, u64) = (1_000, 1_000_000_000);

/// `[store]`. Its `Debug` output hides the password.
#[derive(Clone, PartialEq)]
pub struct StoreSettings {
    /// Which store.
    pub kind: StoreKind,
    /// Redis URL (`redis` kind).
    pub url: Option<String>,
    /// Cluster seed nodes (`redis-cluster` kind).
    pub nodes: Vec<String>,
    /// The monitored master's name (`redis-sentinel` kind).
    pub master_name: Option<String>,
    /// Sentinel URLs (`redis-sentinel` kind). Credentials in a URL are the
    /// sentinel's own; `rediss://` sentinels mean a TLS master too.
    pub sentinels: Vec<String>,
    /// ACL user for the master a sentinel names (`redis-sentinel` kind;
    /// the other kinds carry credentials in their URLs).
    pub username: Option<String>,
    /// Password for the master a sentinel names (`redis-sentinel` kind).
    pub password: Option<String>,
    /// TLS files for `rediss://` URLs (feature `tls`).
    pub tls: TlsFiles,
    /// Budget of one decision; past it the failure policy answers.
    pub timeout: Duration,
    /// Prefix of every Redis key.
    pub key_prefix: String,
    /// Most live entries the memory store (and each local fallback store)
    /// holds; past it, the entries closest to expiry are evicted.
    pub max_entries: usize,
}

impl std::fmt::Debug for StoreSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreSettings")
            .field("kind", &self.kind)
            .field("url", &self.url)
            .field("nodes", &self.nodes)
            .field("master_name", &self.master_name)
            .field("sentinels", &self.sentinels)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("tls", &self.tls)
            .field("timeout", &self.timeout)
            .field("key_prefix", &self.key_prefix)
            .field("max_entries", &self.max_entries)
            .finish()
    }
}

/// `[store] tls_ca_file`, `tls_cert_file`, `tls_key_file`: what a
/// `rediss://` connection trusts and, for mutual TLS, presents. Without a
/// CA file the system's roots are trusted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsFiles {
    /// PEM file of the CA certificates to trust instead of the system roots.
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate chain (mutual TLS); needs `key_file`.
    pub cert_file: Option<PathBuf>,
    /// PEM private key of `cert_file`.
    pub key_file: Option<PathBuf>,
}

impl TlsFiles {
    /// Whether any file is set.
    pub fn is_set(&self) -> bool {
        self.ca_file.is_some() || self.cert_file.is_some() || self.key_file.is_some()
    }
}

impl Default for StoreSettings {
    fn default() -> Self {
        Self {
            kind: StoreKind::Memory,
            url: None,
            nodes: Vec::new(),
            master_name: None,
            sentinels: Vec::new(),
            username: None,
            password: None,
            tls: TlsFiles::default(),
            timeout: Duration::from_millis(50),
            key_prefix: "rw".into(),
            max_entries: DEFAULT_MAX_ENTRIES,
        }
    }
}

/// What to do when the store cannot decide (timeout, error, breaker open).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FailurePolicy {
    /// Allow, recorded as `fallback_allowed`.
    #[default]
    Open,
    /// Answer 503 with `Retry-After`, recorded as `fallback_blocked`.
    Closed,
    /// Decide in process with every quota divided by `expected_instances`.
    Local,
}

impl FailurePolicy {
    /// The config spelling (also the `policy` label).
    pub fn as_str(self) -> &'static str {
        match self {
            FailurePolicy::Open => "open",
            FailurePolicy::Closed => "closed",
            FailurePolicy::Local => "local",
        }
    }
}

/// `[resilience].breaker`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BreakerSettings {
    /// Consecutive failures that open the breaker.
    pub failures: u32,
    /// Failure ratio over the last `window` calls that opens it (1.0 = off).
    pub failure_ratio: f64,
    /// Calls the ratio is computed over.
    pub window: u32,
    /// How long it stays open before a half-open probe.
    pub open: Duration,
}

impl Default for BreakerSettings {
    fn default() -> Self {
        Self {
            failures: 5,
            failure_ratio: 1.0,
            window: 20,
            open: Duration::from_millis(2000),
        }
    }
}

/// `[resilience]`.
#[derive(Debug, Clone, PartialEq)]
pub struct ResilienceSettings {
    /// Default failure policy of routes.
    pub on_store_failure: FailurePolicy,
    /// Circuit breaker per shard.
    pub breaker: BreakerSettings,
    /// Instances sharing the quota; the local fallback allows 1/N of it.
    pub expected_instances: u32,
    /// Up to this much random time is added to `Retry-After`, so blocked
    /// clients do not all come back in the same second (0 = off).
    pub retry_after_jitter: Duration,
}

impl Default for ResilienceSettings {
    fn default() -> Self {
        Self {
            on_store_failure: FailurePolicy::Open,
            breaker: BreakerSettings::default(),
            expected_instances: 3,
            retry_after_jitter: Duration::ZERO,
        }
    }
}

/// What happens to requests without a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AnonymousMode {
    /// Limited by client IP in the anonymous tier.
    #[default]
    Ip,
    /// Answered 401.
    Reject,
}

/// What a key or token that names no tier gets (`[identity]
/// unmatched_keys`): a credential nobody verified.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum UnmatchedKeys {
    /// Its own quota in `default_tier`: every invented key is a new caller,
    /// bounded only by IP-scoped limits.
    #[default]
    DefaultTier,
    /// Counted as the anonymous caller at its client address.
    Anonymous,
    /// Answered 401.
    Reject,
}

/// What a tier name the policy does not define gets when a resolver or a
/// verified caller names it (`[identity] unknown_tier`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum UnknownTier {
    /// Answered 403 (`unknown_tier`).
    #[default]
    Reject,
    /// Decided in this tier, which the policy must define.
    Tier(String),
}

/// A secret kept out of `Debug` output and policy hashes.
#[derive(Clone, PartialEq, Eq)]
pub struct HashSecret(String);

impl HashSecret {
    /// Shortest secret accepted, in bytes: a short one could be guessed
    /// along with the keys it protects.
    pub const MIN_LEN: usize = 16;

    /// The secret `s`, if at least [`HashSecret::MIN_LEN`] bytes long
    /// (surrounding whitespace, such as a file's last newline, removed).
    pub fn new(s: &str) -> Option<Self> {
        let s = s.trim();
        (s.len() >= Self::MIN_LEN).then(|| Self(s.to_owned()))
    }

    /// The secret's bytes.
    pub fn expose(&self) -> &[u8] {
        self.0.as_bytes()
    }
}

impl std::fmt::Debug for HashSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

/// `[identity]`.
#[derive(Debug, Clone, PartialEq)]
pub struct IdentitySettings {
    /// Header carrying the API key (lower case).
    pub api_key_header: String,
    /// Whether `Authorization: Bearer <token>` identifies a caller.
    pub bearer: bool,
    /// Requests without a key.
    pub anonymous: AnonymousMode,
    /// Tier of requests without a key.
    pub anonymous_tier: String,
    /// Tier of keys that match no prefix.
    pub default_tier: String,
    /// Peers whose `X-Forwarded-For` is believed.
    pub trusted_proxies: Vec<IpNet>,
    /// Longest key or token accepted; longer gets 400.
    pub max_key_len: usize,
    /// IPv6 clients are grouped by this many leading bits for anonymous and
    /// IP-scoped limits (one host usually holds a whole /64); 128 counts
    /// each address alone. IPv4 addresses are always counted alone.
    pub ipv6_prefix: u8,
    /// Keys and tokens that name no tier (header identities only).
    pub unmatched_keys: UnmatchedKeys,
    /// A tier name the policy does not define.
    pub unknown_tier: UnknownTier,
    /// The secret identity hashes are keyed with (`hash_secret`, or the
    /// `RATEWATCH_HASH_SECRET` environment variable).
    pub hash_secret: Option<HashSecret>,
    /// A file holding that secret, read once when the limiter starts.
    pub hash_secret_file: Option<PathBuf>,
}

/// The IPv6 prefix length anonymous and IP-scoped limits group addresses
/// by when no policy says otherwise (`[identity] ipv6_prefix`).
pub const DEFAULT_IPV6_PREFIX: u8 = 64;

impl Default for IdentitySettings {
    fn default() -> Self {
        Self {
            api_key_header: "x-api-key".into(),
            bearer: true,
            anonymous: AnonymousMode::Ip,
            anonymous_tier: "anonymous".into(),
            default_tier: "free".into(),
            trusted_proxies: Vec::new(),
            max_key_len: 256,
            ipv6_prefix: DEFAULT_IPV6_PREFIX,
            unmatched_keys: UnmatchedKeys::DefaultTier,
            unknown_tier: UnknownTier::Reject,
            hash_secret: None,
            hash_secret_file: None,
        }
    }
}

pub use ipnet::IpNet;

/// Whether `ip` lies in one of `nets`, comparing canonical forms: an
/// IPv4-mapped IPv6 address or network (`::ffff:10.0.0.0/104`) is its
/// IPv4 counterpart.
pub fn ip_in(nets: &[IpNet], ip: IpAddr) -> bool {
    let ip = ip.to_canonical();
    nets.iter().any(|n| canonical_net(*n).contains(&ip))
}

/// An IPv4-mapped IPv6 network as the IPv4 network it stands for.
pub fn canonical_net(net: IpNet) -> IpNet {
    match net {
        IpNet::V6(v6) if v6.prefix_len() >= 96 => match v6.network().to_ipv4_mapped() {
            Some(v4) => ipnet::Ipv4Net::new(v4, v6.prefix_len() - 96)
                .map(IpNet::V4)
                .unwrap_or(net),
            None => net,
        },
        other => other,
    }
}

/// How identities are shown on the dashboard and in the fleet view.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KeyDisplay {
    /// A short prefix and 8 hex digits of the hash: `free_tk…0c4e9f3a`.
    #[default]
    Masked,
    /// The identity hash only.
    Hashed,
    /// The raw key (only if you accept raw keys in Redis and on screen).
    Raw,
}

/// `[telemetry]`.
#[derive(Debug, Clone, PartialEq)]
pub struct TelemetrySettings {
    /// How often aggregated events are flushed to the fleet view.
    pub flush_interval: Duration,
    /// Size of the top blocked keys list.
    pub top_keys: usize,
    /// How identities are shown.
    pub key_display: KeyDisplay,
    /// This limiter's name where several share a process (`edge`,
    /// `internal`): a `limiter` label on its live-policy series (reload
    /// status, policy info) and in its dashboard's title. Unnamed, those
    /// series keep their labels. 1 to 64 characters of `A-Za-z0-9_.-`.
    pub limiter_name: Option<String>,
}

/// Longest [`TelemetrySettings::limiter_name`], in characters.
pub const MAX_LIMITER_NAME: usize = 64;

/// Whether `name` is a valid [`TelemetrySettings::limiter_name`].
pub(crate) fn valid_limiter_name(name: &str) -> bool {
    (1..=MAX_LIMITER_NAME).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

impl Default for TelemetrySettings {
    fn default() -> Self {
        Self {
            flush_interval: Duration::from_millis(1000),
            top_keys: 100,
            key_display: KeyDisplay::Masked,
            limiter_name: None,
        }
    }
}

/// `[dashboard]`.
#[derive(Debug, Clone, PartialEq)]
pub struct DashboardSettings {
    /// Whether `/dashboard` is served.
    pub enabled: bool,
    /// If set, the dashboard requires `Authorization: Bearer <token>`.
    pub token: Option<String>,
    /// Answer dashboard requests from non-loopback peers. Off by default:
    /// only loopback clients see the dashboard, whatever address the server
    /// listens on (a token, if set, is required as well).
    pub allow_remote: bool,
}

impl Default for DashboardSettings {
    fn default() -> Self {
        Self {
            enabled: true,
            token: None,
            allow_remote: false,
        }
    }
}
