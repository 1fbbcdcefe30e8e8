//! Recovery from a Redis outage, against real redis-server processes: the
//! breaker closes within one cooldown of Redis coming back, on a health
//! probe that spends no client's request, and no client (vanishing,
//! dropped, timed out) can hold the probe and keep the breaker half-open.

mod support;

use std::io::Write;
use std::time::{Duration, Instant};

use ratewatch::identity::{Identity, IdentityKind};
use ratewatch::policy::{
    BreakerSettings, FailurePolicy, Limit, Policy, ResilienceSettings, StoreKind, StoreSettings,
    Tier,
};
use ratewatch::resilience::BreakerState;
use ratewatch::{Decision, Limiter, Source};
use support::{Ratewatch, RedisServer};

const TIMEOUT: Duration = Duration::from_millis(50);
const OPEN: Duration = Duration::from_millis(1000);
/// What a loaded machine may add to a bound: scheduling, a fresh
/// connection, a script load.
const SLACK: Duration = Duration::from_millis(700);

fn policy(url: String, failures: u32) -> Policy {
    Policy::builder()
        .store(StoreSettings {
            kind: StoreKind::Redis,
            url: Some(url),
            timeout: TIMEOUT,
            ..Default::default()
        })
        .resilience(ResilienceSettings {
            on_store_failure: FailurePolicy::Open,
            breaker: BreakerSettings {
                failures,
                open: OPEN,
                ..Default::default()
            },
            ..Default::default()
        })
        .tier(
            Tier::new("free")
                .match_prefix("free_")
                .limit(Limit::token_bucket("burst", 10, 0.000001)),
        )
        .tier(Tier::new("anonymous").limit(Limit::token_bucket("burst", 10, 0.000001)))
        .build()
        .expect("valid policy")
}

fn caller(key: &str) -> Identity {
    Identity::new(IdentityKind::ApiKey, key)
}

fn exact(d: &Decision) -> bool {
    matches!(d.source, Source::Store { .. })
}

fn state(limiter: &Limiter) -> Option<BreakerState> {
    limiter.breaker_states().first().map(|(_, s)| *s)
}

async fn wait_for(what: &str, within: Duration, mut done: impl FnMut() -> bool) -> Duration {
    let started = Instant::now();
    while !done() {
        assert!(started.elapsed() < within, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    started.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_restarted_redis_decides_exactly_within_one_cooldown_and_no_request_is_spent_on_the_probe()
 {
    let mut redis = RedisServer::start();
    let limiter = Limiter::new(policy(redis.url(), 3)).await.unwrap();
    assert!(exact(
        &limiter.check(&caller("free_warm"), "free", None).await
    ));

    // A hung Redis trips the breaker; then it is restarted, as an operator
    // would. The old connection is dead, but nothing has told the client.
    redis.pause();
    for _ in 0..3 {
        assert!(!exact(
            &limiter.check(&caller("free_warm"), "free", None).await
        ));
    }
    assert_eq!(state(&limiter), Some(BreakerState::Open));

    tokio::time::sleep(Duration::from_millis(300)).await;
    tokio::task::block_in_place(|| redis.restart());

    // No request comes: the store reconnects and probes by itself.
    let took = wait_for("the breaker closes", OPEN + SLACK + SLACK, || {
        state(&limiter) == Some(BreakerState::Closed)
    })
    .await;
    assert!(
        took <= OPEN + SLACK,
        "closed {took:?} after Redis was back: more than one cooldown ({OPEN:?}) plus slack"
    );
    eprintln!("breaker closed {took:?} after Redis was back (open_ms {OPEN:?})");
    assert!(
        redis.command_calls("script|load") >= 1,
        "the probe reloaded the script the restart lost"
    );
    assert_eq!(
        redis.command_calls("evalsha"),
        2,
        "the probe's call, refused for want of its script, then run"
    );
    // The first request after the outage is exact: none is spent on a
    // dead socket to find out Redis is back.
    let fresh = caller("free_fresh");
    for n in 0..10 {
        let d = limiter.check(&fresh, "free", None).await;
        assert!(exact(&d) && d.allowed, "request {n} is admitted by Redis");
    }
    let d = limiter.check(&fresh, "free", None).await;
    assert!(exact(&d) && !d.allowed, "the 11th is blocked by Redis");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn request_futures_dropped_mid_flight_never_hold_the_breaker_half_open() {
    let redis = RedisServer::start();
    let limiter = Limiter::new(policy(redis.url(), 1)).await.unwrap();
    assert!(exact(
        &limiter.check(&caller("free_warm"), "free", None).await
    ));
    redis.pause();
    // One caller that waits its budget out opens the breaker.
    assert!(!exact(
        &limiter.check(&caller("free_trip"), "free", None).await
    ));
    assert_eq!(state(&limiter), Some(BreakerState::Open));
    // Callers that give up after 5 ms, long before the 50 ms budget: each
    // drops its decision's future while the call waits on frozen Redis.
    let started = Instant::now();
    let mut longest_half_open = Duration::ZERO;
    let mut half_open_since: Option<Instant> = None;
    let mut opened = false;
    while started.elapsed() < OPEN * 5 / 2 {
        let _ = tokio::time::timeout(
            Duration::from_millis(5),
            limiter.check(&caller("free_gone"), "free", None),
        )
        .await;
        match state(&limiter) {
            Some(BreakerState::HalfOpen) => {
                let since = *half_open_since.get_or_insert_with(Instant::now);
                longest_half_open = longest_half_open.max(since.elapsed());
            }
            Some(BreakerState::Open) => {
                opened = true;
                half_open_since = None;
            }
            _ => half_open_since = None,
        }
    }
    redis.resume();
    assert!(opened, "the frozen Redis opened the breaker");
    assert!(
        longest_half_open < OPEN * 7 / 10,
        "the breaker stayed half-open {longest_half_open:?}: a dropped request held the probe"
    );
    let back = Instant::now();
    let took = wait_for("exact decisions again", OPEN + SLACK + SLACK, || {
        state(&limiter) == Some(BreakerState::Closed)
    })
    .await;
    assert!(took <= OPEN + SLACK, "closed {took:?} after Redis was back");
    eprintln!("longest half-open {longest_half_open:?}; closed {took:?} after Redis was back");
    let d = limiter.check(&caller("free_after"), "free", None).await;
    assert!(
        exact(&d),
        "decided by Redis {:?} after it was back",
        back.elapsed()
    );
}

/// The breaker state of `shard` in a Prometheus exposition.
fn breaker_gauge(metrics: &str, shard: &str) -> Option<u8> {
    let prefix = format!("ratewatch_breaker_state{{shard=\"{shard}\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.trim().parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn clients_that_half_close_mid_request_never_hold_the_probe_of_a_real_server() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("ratewatch.toml");
    std::fs::write(
        &config,
        format!(
            r#"
[store]
kind = "redis"
url = "{}"
timeout_ms = 50

[resilience]
on_store_failure = "open"
breaker = {{ failures = 1, open_ms = {} }}

[[tiers]]
name = "free"
match_prefix = "free_"
limits = [{{ name = "burst", algorithm = "token_bucket", capacity = 1000, refill_per_second = 1 }}]

[[tiers]]
name = "anonymous"
limits = [{{ name = "burst", algorithm = "token_bucket", capacity = 1000, refill_per_second = 1 }}]
"#,
            redis.url(),
            OPEN.as_millis()
        ),
    )
    .unwrap();
    let server = Ratewatch::start("serve", Some(&config), &[]);
    let http = reqwest::Client::new();
    let get = |key: &'static str| {
        http.get(format!("{}/api/users", server.url()))
            .header("x-api-key", key)
            .send()
    };
    let warm = get("free_warm").await.unwrap();
    assert!(warm.headers().contains_key("ratelimit"), "decided by Redis");

    redis.pause();
    // One request that waits its budget out opens the breaker.
    let tripping = get("free_trip").await.unwrap();
    assert!(!tripping.headers().contains_key("ratelimit"), "a fallback");
    // Clients that send a request, half-close and vanish, every 10 ms,
    // across the cooldown and the half-open probe.
    let addr = server.addr();
    let vanishing = std::thread::spawn(move || {
        let started = Instant::now();
        while started.elapsed() < OPEN * 5 / 2 {
            if let Ok(mut s) = std::net::TcpStream::connect(&addr) {
                let _ = s.write_all(
                    b"GET /api/users HTTP/1.1\r\nhost: 127.0.0.1\r\nx-api-key: free_gone\r\n\r\n",
                );
                let _ = s.shutdown(std::net::Shutdown::Write);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    });
    let shard = redis.addr();
    let started = Instant::now();
    let mut longest_half_open = Duration::ZERO;
    let mut half_open_since: Option<Instant> = None;
    let mut opened = false;
    while started.elapsed() < OPEN * 5 / 2 {
        let metrics = http
            .get(format!("{}/metrics", server.url()))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        match breaker_gauge(&metrics, &shard) {
            Some(1) => {
                let since = *half_open_since.get_or_insert_with(Instant::now);
                longest_half_open = longest_half_open.max(since.elapsed());
            }
            Some(2) => {
                opened = true;
                half_open_since = None;
            }
            _ => half_open_since = None,
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    vanishing.join().unwrap();
    redis.resume();
    assert!(opened, "the frozen Redis opened the breaker");
    assert!(
        longest_half_open < OPEN * 7 / 10,
        "the breaker stayed half-open {longest_half_open:?}: a vanished client held the probe"
    );
    eprintln!(
        "real server: longest half-open {longest_half_open:?} with clients vanishing every 10 ms"
    );
    let back = Instant::now();
    loop {
        let res = get("free_after").await.unwrap();
        assert_eq!(res.status(), 200);
        if res.headers().contains_key("ratelimit") {
            break;
        }
        assert!(
            back.elapsed() < OPEN + SLACK,
            "no exact decision {:?} after Redis was back",
            back.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
