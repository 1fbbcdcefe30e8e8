//! A reload never hands out quota: a changed window, limit, capacity or
//! rate keeps what was already admitted, and windows stay aligned to the
//! epoch (a `1d` window ends at 00:00 UTC whatever windows it went
//! through), on the memory store (a manual clock) and on a real Redis (its
//! own clock), with and without leases.

mod support;

use std::sync::Arc;
use std::time::Duration;

use ratewatch::Limiter;
use ratewatch::clock::{Clock, ManualClock, SystemClock};
use ratewatch::identity::{Identity, IdentityKind};
use ratewatch::policy::Policy;
use support::RedisServer;

/// 2026-12-01 15:10:00 UTC.
const AFTERNOON_US: u64 = 1_796_137_800_000_000;
const DAY_US: u64 = 86_400_000_000;

fn policy(store: &str, limit: &str, extra: &str) -> Policy {
    let text = format!(
        r#"
{store}

[resilience]
expected_instances = 1
{extra}

[[tiers]]
name = "free"
match_prefix = "free_"
limits = [{limit}]

[[tiers]]
name = "anonymous"
limits = [{{ name = "burst", algorithm = "token_bucket", capacity = 5, refill_per_second = 1 }}]
"#
    );
    Policy::from_toml_str(&text, Some("reload_quota.toml")).expect("policy")
}

/// A fixed window `limit` per `window`, leased when `extra` turns leases
/// on (see [`LEASED`]).
fn window(limit: u64, window: &str, extra: &str) -> String {
    let mode = if extra == LEASED {
        r#", mode = "leased""#
    } else {
        ""
    };
    format!(
        r#"{{ name = "day", algorithm = "fixed_window", limit = {limit}, window = "{window}"{mode} }}"#
    )
}

/// Leases on: the limit is leased, renewed often.
const LEASED: &str = "[leases]\nrenew_ms = 50";

fn caller() -> Identity {
    Identity::new(IdentityKind::ApiKey, "free_reload_quota_key")
}

/// Where a test runs: the memory store on a manual clock, or a real Redis
/// on its own clock (this machine's).
enum Store {
    Memory(Arc<ManualClock>),
    Redis(RedisServer),
}

impl Store {
    fn memory() -> Self {
        Store::Memory(Arc::new(ManualClock::new(AFTERNOON_US)))
    }

    fn section(&self) -> String {
        match self {
            Store::Memory(_) => "[store]\nkind = \"memory\"".to_owned(),
            Store::Redis(r) => format!(
                "[store]\nkind = \"redis\"\nurl = \"{}\"\ntimeout_ms = 2000",
                r.url()
            ),
        }
    }

    fn now_us(&self) -> u64 {
        match self {
            Store::Memory(c) => c.now_us(),
            Store::Redis(_) => SystemClock.now_us(),
        }
    }

    async fn limiter(&self, limit: &str, extra: &str) -> Limiter {
        let p = policy(&self.section(), limit, extra);
        let b = Limiter::builder(p);
        let b = match self {
            Store::Memory(c) => b.with_clock(c.clone()),
            Store::Redis(_) => b,
        };
        b.build().await.expect("limiter")
    }

    /// Waits (on Redis) until `now` is at least `margin` away from the end
    /// of every window of `lens` µs, so a window that ends mid-test does
    /// not hand its quota out: a wait on the clock, not a fixed sleep.
    async fn away_from_boundaries(&self, lens: &[u64], margin: u64) {
        if let Store::Redis(_) = self {
            loop {
                let now = self.now_us();
                let close = lens.iter().any(|&w| w - now % w < margin);
                if !close {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

async fn admitted(l: &Limiter, n: usize) -> usize {
    let mut ok = 0;
    for _ in 0..n {
        ok += usize::from(l.check(&caller(), "free", None).await.allowed);
    }
    ok
}

fn reload(l: &Limiter, store: &Store, limit: &str, extra: &str) {
    let out = l
        .replace_policy(policy(&store.section(), limit, extra))
        .expect("a valid policy applies");
    assert!(out.changed);
}

const HOUR_US: u64 = 3_600_000_000;

/// 5 per hour, all spent, reloaded to 5 per minute: the minute that holds
/// those 5 admits nothing more; the next minute has its 5.
async fn an_hour_shortened_to_a_minute(store: Store, extra: &str) {
    store.away_from_boundaries(&[HOUR_US], 10_000_000).await;
    let l = store.limiter(&window(5, "1h", extra), extra).await;
    assert_eq!(admitted(&l, 8).await, 5);
    reload(&l, &store, &window(5, "60s", extra), extra);
    assert_eq!(
        admitted(&l, 5).await,
        0,
        "a minute window handed out fresh quota after the reload"
    );
    let d = l.check(&caller(), "free", None).await;
    let reset = d.limits[0].reset_after.as_micros() as u64;
    let now = store.now_us();
    // The minute it counts in is the epoch-aligned one holding now.
    let end = now - now % 60_000_000 + 60_000_000;
    assert!(
        reset <= end - now + 1_000_000 && reset + 1_000_000 >= end - now,
        "reset in {reset} µs, the minute ends in {} µs",
        end - now
    );
    if let Store::Memory(c) = &store {
        c.advance(Duration::from_secs(60));
        assert_eq!(admitted(&l, 8).await, 5, "the next minute has its quota");
    }
    l.shutdown().await;
}

/// 5 a day, spent, reloaded 1d -> 12h -> 1h -> 1d within seconds: nothing
/// more is admitted, and the day window still ends at 00:00 UTC.
async fn a_day_through_12h_and_1h(store: Store, extra: &str) {
    store
        .away_from_boundaries(&[HOUR_US, 12 * HOUR_US], 20_000_000)
        .await;
    let l = store.limiter(&window(5, "1d", extra), extra).await;
    assert_eq!(admitted(&l, 6).await, 5);
    let mut more = 0;
    for w in ["12h", "1h", "1d"] {
        reload(&l, &store, &window(5, w, extra), extra);
        more += admitted(&l, 5).await;
    }
    assert_eq!(more, 0, "reloads 1d -> 12h -> 1h -> 1d handed out quota");
    let d = l.check(&caller(), "free", None).await;
    let now = store.now_us();
    let midnight = now - now % DAY_US + DAY_US;
    let reset = d.limits[0].reset_after.as_micros() as u64;
    assert!(
        reset + 2_000_000 >= midnight - now && reset <= midnight - now + 1_000_000,
        "the day ends in {reset} µs, midnight UTC is {} µs away",
        midnight - now
    );
    l.shutdown().await;
}

#[tokio::test]
async fn an_hour_window_shortened_to_a_minute_hands_out_nothing_on_memory() {
    an_hour_shortened_to_a_minute(Store::memory(), "").await;
}

#[tokio::test]
async fn an_hour_window_shortened_to_a_minute_hands_out_nothing_on_redis() {
    an_hour_shortened_to_a_minute(Store::Redis(RedisServer::start()), "").await;
}

#[tokio::test]
async fn an_hour_window_shortened_to_a_minute_hands_out_nothing_on_leases() {
    an_hour_shortened_to_a_minute(Store::Redis(RedisServer::start()), LEASED).await;
}

#[tokio::test]
async fn a_daily_limit_reloaded_through_12h_and_1h_admits_nothing_and_ends_at_midnight_on_memory() {
    a_day_through_12h_and_1h(Store::memory(), "").await;
}

#[tokio::test]
async fn a_daily_limit_reloaded_through_12h_and_1h_admits_nothing_and_ends_at_midnight_on_redis() {
    a_day_through_12h_and_1h(Store::Redis(RedisServer::start()), "").await;
}

#[tokio::test]
async fn a_daily_limit_reloaded_through_12h_and_1h_admits_nothing_on_leases() {
    a_day_through_12h_and_1h(Store::Redis(RedisServer::start()), LEASED).await;
}

/// Lowered mid-window, each algorithm counts what was admitted against the
/// new value: 4 of 10 admitted, lowered to 5, admits 1 more.
async fn lowered_mid_window(store: Store) {
    store.away_from_boundaries(&[HOUR_US], 10_000_000).await;
    let cases = [
        (
            r#"{ name = "day", algorithm = "fixed_window", limit = LIMIT, window = "1h" }"#,
            "fixed window",
        ),
        (
            r#"{ name = "day", algorithm = "sliding_window", limit = LIMIT, window = "1h" }"#,
            "sliding window",
        ),
        (
            r#"{ name = "day", algorithm = "sliding_log", limit = LIMIT, window = "1h" }"#,
            "sliding log",
        ),
        (
            r#"{ name = "day", algorithm = "token_bucket", capacity = LIMIT, refill_per_second = 0.001 }"#,
            "token bucket",
        ),
        (
            r#"{ name = "day", algorithm = "gcra", burst = LIMIT, rate_per_second = 0.001 }"#,
            "gcra",
        ),
    ];
    for (i, (limit, what)) in cases.iter().enumerate() {
        let id = Identity::new(IdentityKind::ApiKey, format!("free_lowered_{i}"));
        let l = store.limiter(&limit.replace("LIMIT", "10"), "").await;
        for _ in 0..4 {
            assert!(l.check(&id, "free", None).await.allowed, "{what}");
        }
        reload(&l, &store, &limit.replace("LIMIT", "5"), "");
        let mut ok = 0;
        for _ in 0..5 {
            ok += usize::from(l.check(&id, "free", None).await.allowed);
        }
        assert_eq!(ok, 1, "{what}: 4 of 10 admitted, lowered to 5");
        l.shutdown().await;
    }
}

#[tokio::test]
async fn a_limit_lowered_mid_window_counts_what_was_admitted_on_memory() {
    lowered_mid_window(Store::memory()).await;
}

#[tokio::test]
async fn a_limit_lowered_mid_window_counts_what_was_admitted_on_redis() {
    lowered_mid_window(Store::Redis(RedisServer::start())).await;
}

/// A lowered rate keeps the units queued ahead, not the time: GCRA of 5
/// at 1/s, spent, reloaded to 0.1/s, admits nothing at once.
async fn a_lowered_rate(store: Store) {
    let gcra = |rate: &str| {
        format!(r#"{{ name = "day", algorithm = "gcra", burst = 5, rate_per_second = {rate} }}"#)
    };
    let l = store.limiter(&gcra("1"), "").await;
    assert_eq!(admitted(&l, 5).await, 5);
    reload(&l, &store, &gcra("0.1"), "");
    assert_eq!(admitted(&l, 5).await, 0, "a slower rate emptied the queue");
    l.shutdown().await;
}

#[tokio::test]
async fn a_lowered_rate_keeps_the_queued_units_on_memory() {
    a_lowered_rate(Store::memory()).await;
}

#[tokio::test]
async fn a_lowered_rate_keeps_the_queued_units_on_redis() {
    a_lowered_rate(Store::Redis(RedisServer::start())).await;
}
