//! The HTTP servers the benchmark loads: one axum handler returning the
//! same JSON each time, bare or behind a rate limiter.

use std::net::SocketAddr;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{HeaderName, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use ratewatch::policy::{StoreKind, StoreSettings};
use ratewatch::telemetry::Telemetry;
use ratewatch::{Limit, Limiter, Policy, Tier};

/// The key every benchmark request carries (`x-api-key`).
pub const API_KEY: &str = "free_bench_key_0001";

/// One server under load.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    /// The handler alone.
    Bare,
    /// The handler with the same five headers ratewatch adds, precomputed,
    /// inserted by `map_response`: the cheapest layer that adds them.
    HeaderFloor,
    /// tower_governor keyed by `x-api-key` (its default: no headers).
    Governor,
    /// ratewatch, memory store, one token bucket.
    Memory1,
    /// ratewatch, memory store, one token bucket, fleet view off.
    Memory1NoTelemetry,
    /// ratewatch, memory store, a three-limit tier.
    Memory3,
    /// ratewatch, one Redis node, one token bucket.
    Redis1,
    /// ratewatch, one Redis node, a three-limit tier.
    Redis3,
    /// The floor of any Redis-backed limiter: the handler plus one
    /// `EVALSHA` of the minimal token-bucket script per request through
    /// the same client (redis-rs `ConnectionManager`) plus the same five
    /// static headers as [`Variant::HeaderFloor`].
    RedisFloor,
    /// ratewatch, a 3-master Redis Cluster, one token bucket.
    Cluster1,
    /// A tutorial-style Redis limiter: INCR (+EXPIRE) per limit, three
    /// limits, one round trip each.
    Naive3,
    /// [`Variant::Redis3`] with Redis behind an emulated network round trip
    /// (the delay proxy of `netem.rs`).
    Redis3Net,
    /// [`Variant::Naive3`] behind the same emulated network.
    Naive3Net,
    /// ratewatch, memory store, a three-unit tier: `rpm` (requests),
    /// `tpm` (tokens, the cost read from the request's [`TOKENS_HEADER`])
    /// and `streams` (a concurrency limit, a slot held until the response
    /// ends).
    MemoryUnits,
    /// [`Variant::MemoryUnits`] on one Redis node.
    RedisUnits,
}

/// The request header the three-unit tier's route reads its token cost
/// from; wrk sends it (with [`TOKENS_PER_REQUEST`]) to every variant of
/// [`Variant::sends_tokens`].
pub const TOKENS_HEADER: &str = "x-tokens";
/// The tokens one benchmark request says it costs.
pub const TOKENS_PER_REQUEST: u64 = 100;

impl Variant {
    pub const ALL: [Variant; 15] = [
        Variant::Bare,
        Variant::HeaderFloor,
        Variant::Governor,
        Variant::Memory1,
        Variant::Memory1NoTelemetry,
        Variant::Memory3,
        Variant::Redis1,
        Variant::Redis3,
        Variant::RedisFloor,
        Variant::Cluster1,
        Variant::Naive3,
        Variant::Redis3Net,
        Variant::Naive3Net,
        Variant::MemoryUnits,
        Variant::RedisUnits,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Variant::Bare => "bare",
            Variant::HeaderFloor => "header-floor",
            Variant::Governor => "tower-governor",
            Variant::Memory1 => "rw-memory-1",
            Variant::Memory1NoTelemetry => "rw-memory-1-telemetry-off",
            Variant::Memory3 => "rw-memory-3",
            Variant::Redis1 => "rw-redis-1",
            Variant::Redis3 => "rw-redis-3",
            Variant::RedisFloor => "redis-floor",
            Variant::Cluster1 => "rw-cluster-1",
            Variant::Naive3 => "naive-redis-3",
            Variant::Redis3Net => "rw-redis-3-net",
            Variant::Naive3Net => "naive-redis-3-net",
            Variant::MemoryUnits => "rw-memory-units",
            Variant::RedisUnits => "rw-redis-units",
        }
    }

    pub fn describe(self) -> &'static str {
        match self {
            Variant::Bare => "bare axum handler",
            Variant::HeaderFloor => "header floor: 5 precomputed headers by `map_response`",
            Variant::Governor => "tower_governor keyed by `x-api-key` (no headers, its default)",
            Variant::Memory1 => "ratewatch, memory, 1 limit",
            Variant::Memory1NoTelemetry => "ratewatch, memory, 1 limit, fleet view off",
            Variant::Memory3 => "ratewatch, memory, 3-limit tier",
            Variant::Redis1 => "ratewatch, Redis, 1 limit",
            Variant::Redis3 => "ratewatch, Redis, 3-limit tier",
            Variant::RedisFloor => {
                "Redis floor: 1 `EVALSHA` of the minimal script + the 5 static headers"
            }
            Variant::Cluster1 => "ratewatch, 3-master Redis Cluster, 1 limit",
            Variant::Naive3 => "naive Redis limiter, 3 limits, 3 round trips",
            Variant::Redis3Net => "ratewatch, Redis, 3-limit tier, emulated network",
            Variant::Naive3Net => "naive Redis limiter, 3 limits, 3 round trips, emulated network",
            Variant::MemoryUnits => {
                "ratewatch, memory, three-unit tier (rpm, tpm from a header, concurrency)"
            }
            Variant::RedisUnits => {
                "ratewatch, Redis, three-unit tier (rpm, tpm from a header, concurrency)"
            }
        }
    }

    pub fn from_name(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|v| v.name() == s)
    }

    pub fn needs_redis(self) -> bool {
        matches!(
            self,
            Variant::Redis1
                | Variant::Redis3
                | Variant::RedisFloor
                | Variant::Naive3
                | Variant::Redis3Net
                | Variant::Naive3Net
                | Variant::RedisUnits
        )
    }

    /// Whether wrk sends [`TOKENS_HEADER`] (the three-unit tier's cost).
    pub fn sends_tokens(self) -> bool {
        matches!(self, Variant::MemoryUnits | Variant::RedisUnits)
    }

    /// The headers wrk adds for this variant (beyond `x-api-key`).
    pub fn wrk_headers(self) -> Vec<String> {
        if self.sends_tokens() {
            vec![format!("{TOKENS_HEADER}: {TOKENS_PER_REQUEST}")]
        } else {
            Vec::new()
        }
    }

    /// Whether the server reaches Redis through the delay proxy.
    pub fn behind_network(self) -> bool {
        matches!(self, Variant::Redis3Net | Variant::Naive3Net)
    }

    pub fn needs_cluster(self) -> bool {
        self == Variant::Cluster1
    }

    /// Whether the server exposes ratewatch's `/metrics`.
    pub fn is_ratewatch(self) -> bool {
        matches!(
            self,
            Variant::Memory1
                | Variant::Memory1NoTelemetry
                | Variant::Memory3
                | Variant::Redis1
                | Variant::Redis3
                | Variant::Redis3Net
                | Variant::Cluster1
                | Variant::MemoryUnits
                | Variant::RedisUnits
        )
    }
}

async fn handler() -> Json<serde_json::Value> {
    Json(serde_json::json!({"ok": true, "items": [1, 2, 3], "name": "ratewatch bench"}))
}

fn app() -> Router {
    Router::new().route("/api/data", get(handler))
}

/// Limits that never block: the benchmark measures the cost of deciding.
pub fn tier(limits: usize) -> Tier {
    let big = 1_000_000_000;
    let mut t = Tier::new("free")
        .match_prefix("free_")
        .limit(Limit::token_bucket("burst", big, 1_000_000.0));
    if limits >= 3 {
        t = t
            .limit(Limit::sliding_window(
                "minute",
                big,
                Duration::from_secs(60),
            ))
            .limit(Limit::fixed_window("day", big, Duration::from_secs(86_400)));
    }
    t
}

/// The deployment secret of every benchmark policy: identities built
/// beforehand with [`bench_key`] are already hashed with the limiter's
/// key, so an in-process check does not hash them again (as it would an
/// identity hashed under another key, such as the memory store's random
/// one).
pub const HASH_SECRET: &str = "a benchmark deployment secret";

/// The identity key of [`HASH_SECRET`].
pub fn bench_key() -> ratewatch::store::keys::IdentityKey {
    ratewatch::store::keys::IdentityKey::new(HASH_SECRET.as_bytes())
}

pub fn policy(limits: usize, store: StoreSettings) -> Policy {
    policy_with(tier(limits), None, store)
}

/// The three-unit tier of `docs/units.md`, with limits that never block:
/// `rpm` (requests, sliding window), `tpm` (tokens, sliding window) and
/// `streams` (in flight). Its route reads the token cost from
/// [`TOKENS_HEADER`], so every request is metered: decided at 1 request
/// and [`TOKENS_PER_REQUEST`] tokens, in one store call, and holding a
/// `streams` slot until its response ends (a second store call on Redis,
/// the release).
pub fn units_policy(store: StoreSettings) -> Policy {
    let big = 1_000_000_000;
    let tier = Tier::new("free")
        .match_prefix("free_")
        .limit(Limit::sliding_window("rpm", big, Duration::from_secs(60)))
        .limit(Limit::sliding_window("tpm", big, Duration::from_secs(60)).unit("tokens"))
        .limit(Limit::concurrency("streams", big));
    let route = ratewatch::RouteRule::new("GET", "/api/data").with_estimate(
        ratewatch::policy::CostEstimate::header("tokens", TOKENS_HEADER),
    );
    policy_with(tier, Some(route), store)
}

fn policy_with(tier: Tier, route: Option<ratewatch::RouteRule>, store: StoreSettings) -> Policy {
    let mut b = Policy::builder();
    if let Some(route) = route {
        b = b.route(route);
    }
    b.identity(ratewatch::policy::IdentitySettings {
        hash_secret: ratewatch::policy::HashSecret::new(HASH_SECRET),
        ..Default::default()
    })
    .store(store)
    .tier(tier)
    .tier(Tier::new("anonymous").limit(Limit::per_second("burst", 10)))
    .build()
    .expect("a valid benchmark policy")
}

/// Redis settings with a budget that a loaded 2-core machine keeps, so a
/// slow answer is measured, not turned into a fallback.
pub fn redis_settings(kind: StoreKind, urls: &[String]) -> StoreSettings {
    StoreSettings {
        kind,
        url: (kind == StoreKind::Redis).then(|| urls[0].clone()),
        nodes: if kind == StoreKind::RedisCluster {
            urls.to_vec()
        } else {
            Vec::new()
        },
        timeout: Duration::from_millis(500),
        ..Default::default()
    }
}

async fn ratewatch_app(policy: Policy, telemetry: bool) -> Router {
    let mut b = Limiter::builder(policy);
    if !telemetry {
        b = b.with_telemetry(Telemetry::disabled());
    }
    let limiter = b.build().await.expect("limiter");
    app()
        .layer(limiter.layer())
        .route("/metrics", get(limiter.metrics_handler()))
}

fn floor_headers() -> [(HeaderName, HeaderValue); 5] {
    [
        (
            HeaderName::from_static("ratelimit-policy"),
            HeaderValue::from_static("\"burst\";q=1000000000;w=1"),
        ),
        (
            HeaderName::from_static("ratelimit"),
            HeaderValue::from_static("\"burst\";r=999999999;t=1"),
        ),
        (
            HeaderName::from_static("x-ratelimit-limit"),
            HeaderValue::from_static("1000000000"),
        ),
        (
            HeaderName::from_static("x-ratelimit-remaining"),
            HeaderValue::from_static("999999999"),
        ),
        (
            HeaderName::from_static("x-ratelimit-reset"),
            HeaderValue::from_static("1764547200"),
        ),
    ]
}

#[derive(Clone)]
struct Key;

impl tower_governor::key_extractor::KeyExtractor for Key {
    type Key = String;

    fn extract<T>(
        &self,
        req: &http::Request<T>,
    ) -> Result<Self::Key, tower_governor::GovernorError> {
        req.headers()
            .get("x-api-key")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
            .ok_or(tower_governor::GovernorError::UnableToExtractKey)
    }
}

fn governor_app() -> Router {
    let config = tower_governor::governor::GovernorConfigBuilder::default()
        .per_nanosecond(1)
        .burst_size(1_000_000_000)
        .key_extractor(Key)
        .finish()
        .expect("governor config");
    app().layer(tower_governor::GovernorLayer::new(config))
}

/// The three limits of a tutorial limiter: fixed windows of a second, a
/// minute and a day, one `INCR` each (and an `EXPIRE` on a window's first
/// request).
async fn naive_limit(
    State(conn): State<redis::aio::ConnectionManager>,
    req: Request,
    next: Next,
) -> Response {
    let Some(key) = req
        .headers()
        .get("x-api-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
    else {
        return StatusCode::UNAUTHORIZED.into_response();
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    for (name, window, limit) in [
        ("second", 1, 1_000_000_000u64),
        ("minute", 60, 1_000_000_000),
        ("day", 86_400, 1_000_000_000),
    ] {
        let k = format!("naive:{key}:{name}:{}", now / window);
        let mut c = conn.clone();
        let n: u64 = match redis::cmd("INCR").arg(&k).query_async(&mut c).await {
            Ok(n) => n,
            Err(_) => return StatusCode::SERVICE_UNAVAILABLE.into_response(),
        };
        if n == 1 {
            let _: Result<(), _> = redis::cmd("EXPIRE")
                .arg(&k)
                .arg(window)
                .query_async(&mut c)
                .await;
        }
        if n > limit {
            return StatusCode::TOO_MANY_REQUESTS.into_response();
        }
    }
    next.run(req).await
}

/// The Redis floor's per-request work: one `EVALSHA` of the minimal
/// token-bucket script (loaded at start) for the caller's key, through a
/// `ConnectionManager`, then the handler and the five static headers.
async fn floor_limit(
    State((conn, sha)): State<(redis::aio::ConnectionManager, std::sync::Arc<str>)>,
    req: Request,
    next: Next,
) -> Response {
    let Some(key) = req.headers().get("x-api-key").and_then(|v| v.to_str().ok()) else {
        return StatusCode::UNAUTHORIZED.into_response();
    };
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(&*sha)
        .arg(1)
        .arg(key)
        .arg(1_000_000_000u64)
        .arg(1_000_000_000u64)
        .arg(1);
    let mut c = conn.clone();
    let (allowed, _left): (i64, i64) = match cmd.query_async(&mut c).await {
        Ok(reply) => reply,
        Err(_) => return StatusCode::SERVICE_UNAVAILABLE.into_response(),
    };
    if allowed != 1 {
        return StatusCode::TOO_MANY_REQUESTS.into_response();
    }
    let mut res = next.run(req).await;
    let h = res.headers_mut();
    for (k, v) in floor_headers() {
        h.insert(k, v);
    }
    res
}

async fn redis_floor_app(url: &str) -> Router {
    let client = redis::Client::open(url).expect("redis url");
    let mut conn = redis::aio::ConnectionManager::new(client)
        .await
        .expect("redis connection");
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(crate::MINIMAL_LUA)
        .query_async(&mut conn)
        .await
        .expect("load the minimal script");
    app().layer(middleware::from_fn_with_state(
        (conn, std::sync::Arc::<str>::from(sha)),
        floor_limit,
    ))
}

async fn naive_app(url: &str) -> Router {
    let client = redis::Client::open(url).expect("redis url");
    let conn = redis::aio::ConnectionManager::new(client)
        .await
        .expect("redis connection");
    app().layer(middleware::from_fn_with_state(conn, naive_limit))
}

/// Serves `variant` on `port` until killed.
pub fn serve(variant: Variant, port: u16, urls: &[String]) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let app = match variant {
            Variant::Bare => app(),
            Variant::HeaderFloor => {
                let headers = floor_headers();
                app().layer(axum::middleware::map_response(move |mut res: Response| {
                    let headers = headers.clone();
                    async move {
                        let h = res.headers_mut();
                        for (k, v) in headers {
                            h.insert(k, v);
                        }
                        res
                    }
                }))
            }
            Variant::Governor => governor_app(),
            Variant::Memory1 => ratewatch_app(policy(1, StoreSettings::default()), true).await,
            Variant::Memory1NoTelemetry => {
                ratewatch_app(policy(1, StoreSettings::default()), false).await
            }
            Variant::Memory3 => ratewatch_app(policy(3, StoreSettings::default()), true).await,
            Variant::Redis1 => {
                ratewatch_app(policy(1, redis_settings(StoreKind::Redis, urls)), true).await
            }
            Variant::Redis3 | Variant::Redis3Net => {
                ratewatch_app(policy(3, redis_settings(StoreKind::Redis, urls)), true).await
            }
            Variant::Cluster1 => {
                ratewatch_app(
                    policy(1, redis_settings(StoreKind::RedisCluster, urls)),
                    true,
                )
                .await
            }
            Variant::RedisFloor => redis_floor_app(&urls[0]).await,
            Variant::Naive3 | Variant::Naive3Net => naive_app(&urls[0]).await,
            Variant::MemoryUnits => {
                ratewatch_app(units_policy(StoreSettings::default()), true).await
            }
            Variant::RedisUnits => {
                ratewatch_app(units_policy(redis_settings(StoreKind::Redis, urls)), true).await
            }
        };
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
            .await
            .expect("bind");
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .expect("serve");
    });
}
