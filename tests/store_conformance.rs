//! One suite, run on every store: memory, a Redis node, a Redis Cluster.
//! Each store must give the same answers to the same requests.

mod support;

use support::identity_key as key;

use std::sync::Arc;
use std::time::Duration;

use ratewatch::algorithm::Algorithm;
use ratewatch::clock::{Clock, ManualClock, SystemClock};
use ratewatch::policy::StoreSettings;
use ratewatch::store::{Batch, ClusterStore, Item, MemoryStore, RedisStore, Store};

/// A store under test and what keeps it alive.
struct Fixture {
    store: Arc<dyn Store>,
    clock: Option<ManualClock>,
    memory: Option<MemoryStore>,
    single: Option<support::RedisServer>,
    cluster: Option<support::RedisCluster>,
}

impl Fixture {
    async fn memory() -> Self {
        let clock = ManualClock::new(SystemClock.now_us());
        let store = MemoryStore::with_clock(Arc::new(clock.clone()));
        Self {
            store: Arc::new(store.clone()),
            clock: Some(clock),
            memory: Some(store),
            single: None,
            cluster: None,
        }
    }

    async fn redis() -> Self {
        let server = support::RedisServer::start();
        let store = RedisStore::connect(&settings(Some(server.url()), vec![]))
            .await
            .expect("connect");
        Self {
            store: Arc::new(store),
            clock: None,
            memory: None,
            single: Some(server),
            cluster: None,
        }
    }

    async fn redis_cluster() -> Self {
        let cluster = support::RedisCluster::start();
        let store = ClusterStore::connect(&settings(None, cluster.urls()))
            .await
            .expect("connect");
        Self {
            store: Arc::new(store),
            clock: None,
            memory: None,
            single: None,
            cluster: Some(cluster),
        }
    }

    /// The store's idea of now (explicit times in tests start here).
    fn now(&self) -> u64 {
        self.clock
            .as_ref()
            .map_or_else(|| SystemClock.now_us(), |c| c.now_us())
    }

    /// Lets `d` pass on the store's clock.
    async fn wait(&self, d: Duration) {
        match &self.clock {
            Some(c) => c.advance(d),
            None => tokio::time::sleep(d).await,
        }
    }

    fn nodes(&self) -> Vec<&support::RedisServer> {
        match (&self.single, &self.cluster) {
            (Some(s), _) => vec![s],
            (_, Some(c)) => c.nodes.iter().collect(),
            _ => vec![],
        }
    }

    /// Keys held (memory: after dropping expired ones).
    fn live_keys(&self) -> usize {
        if let Some(m) = &self.memory {
            m.sweep();
            return m.len();
        }
        self.nodes()
            .iter()
            .map(|n| n.cli(&["DBSIZE"]).trim().parse::<usize>().expect("DBSIZE"))
            .sum()
    }

    /// `PTTL` of a key in Redis (None for the memory store).
    fn pttl(&self, key: &str) -> Option<i64> {
        let node = match (&self.single, &self.cluster) {
            (Some(s), _) => s,
            (_, Some(c)) => c.node_for(key),
            _ => return None,
        };
        Some(node.cli(&["PTTL", key]).trim().parse().expect("PTTL"))
    }
}

fn settings(url: Option<String>, nodes: Vec<String>) -> StoreSettings {
    StoreSettings {
        url,
        nodes,
        timeout: Duration::from_secs(2),
        ..StoreSettings::default()
    }
}

fn burst(identity: &str, capacity: u64) -> Item {
    Item::new(
        key(identity, "burst"),
        Algorithm::TokenBucket {
            capacity,
            refill_per_second: 0.0001,
        },
    )
}

async fn consume(f: &Fixture, items: &[Item], cost: u64) -> ratewatch::store::StoreDecision {
    f.store
        .decide(&Batch::consume(items, cost))
        .await
        .expect("store decides")
}

async fn burst_of_capacity_then_block(f: Fixture) {
    let items = [burst("burst-then-block", 5)];
    for i in 0..5 {
        let d = consume(&f, &items, 1).await;
        assert!(d.allowed, "request {i} of the burst is admitted");
        assert_eq!(d.verdicts[0].remaining.floor(), (4 - i) as f64);
    }
    let d = consume(&f, &items, 1).await;
    assert!(!d.allowed, "the request after the burst is blocked");
    assert!(d.verdicts[0].retry_after_us > 0);
}

async fn blocked_request_consumes_nothing(f: Fixture) {
    let items = [burst("blocked-consumes-nothing", 3)];
    assert!(consume(&f, &items, 2).await.allowed);
    // Costs 2 with 1 left: blocked, and the 1 token stays.
    let blocked = consume(&f, &items, 2).await;
    assert!(!blocked.allowed);
    assert_eq!(blocked.verdicts[0].remaining.floor(), 1.0);
    let after = consume(&f, &items, 1).await;
    assert!(
        after.allowed,
        "the token a blocked request saw is still there"
    );
}

async fn blocked_by_day_consumes_no_burst_token(f: Fixture) {
    let id = "all-or-nothing";
    let items = [
        burst(id, 10),
        Item::new(
            key(id, "minute"),
            Algorithm::SlidingWindow {
                limit: 20,
                window_us: 60_000_000,
            },
        ),
        Item::new(
            key(id, "day"),
            Algorithm::FixedWindow {
                limit: 3,
                window_us: 86_400_000_000,
            },
        ),
    ];
    for _ in 0..3 {
        assert!(consume(&f, &items, 1).await.allowed);
    }
    for _ in 0..3 {
        let d = consume(&f, &items, 1).await;
        assert!(!d.allowed, "the daily quota is spent");
        assert!(!d.verdicts[2].allowed && d.verdicts[0].allowed && d.verdicts[1].allowed);
        assert_eq!(
            d.verdicts[0].remaining.floor(),
            7.0,
            "no burst token was taken"
        );
        assert_eq!(d.verdicts[1].remaining.floor(), 17.0, "nothing was counted");
    }
    let peek = f.store.decide(&Batch::peek(&items)).await.expect("peek");
    assert_eq!(peek.verdicts[0].remaining.floor(), 7.0);
    assert_eq!(peek.verdicts[1].remaining.floor(), 17.0);
    assert_eq!(peek.verdicts[2].remaining, 0.0);
}

async fn shadow_limit_never_blocks(f: Fixture) {
    let mut shadow = burst("shadow", 1);
    shadow.shadow = true;
    let items = [shadow, burst("shadow-enforced", 3)];
    for i in 0..3 {
        let d = consume(&f, &items, 1).await;
        assert!(d.allowed, "request {i} passes despite the shadow limit");
        assert_eq!(
            d.verdicts[0].allowed,
            i == 0,
            "the shadow verdict is still reported"
        );
    }
    assert!(
        !consume(&f, &items, 1).await.allowed,
        "the enforced limit still blocks"
    );
}

async fn peek_consumes_nothing(f: Fixture) {
    let id = "peek";
    let items = [
        burst(id, 2),
        Item::new(
            key(id, "log"),
            Algorithm::SlidingLog {
                limit: 2,
                window_us: 60_000_000,
            },
        ),
        Item::new(
            key(id, "gcra"),
            Algorithm::Gcra {
                rate_per_second: 0.01,
                burst: 2,
            },
        ),
    ];
    for _ in 0..5 {
        let d = f.store.decide(&Batch::peek(&items)).await.expect("peek");
        assert!(d.allowed);
        assert_eq!(
            d.verdicts
                .iter()
                .map(|v| v.remaining.floor())
                .collect::<Vec<_>>(),
            [2.0; 3]
        );
    }
    assert_eq!(f.live_keys(), 0, "peeking writes nothing");
    assert!(
        consume(&f, &items, 2).await.allowed,
        "the whole quota is still there"
    );
}

async fn retry_after_is_honest(f: Fixture) {
    let id = "retry-after";
    let items = [
        Item::new(
            key(id, "burst"),
            Algorithm::TokenBucket {
                capacity: 2,
                refill_per_second: 0.33,
            },
        ),
        Item::new(
            key(id, "minute"),
            Algorithm::SlidingWindow {
                limit: 4,
                window_us: 10_000_000,
            },
        ),
        Item::new(
            key(id, "log"),
            Algorithm::SlidingLog {
                limit: 3,
                window_us: 7_000_000,
            },
        ),
    ];
    let mut now = f.now();
    let mut blocked = 0;
    for _ in 0..30 {
        let d = f
            .store
            .decide(&Batch::consume(&items, 1).at(now))
            .await
            .expect("decide");
        if d.allowed {
            now += 150_000;
            continue;
        }
        blocked += 1;
        // The latest of the blocking limits' retry times.
        let retry = d
            .verdicts
            .iter()
            .filter(|v| !v.allowed)
            .map(|v| v.retry_after_us)
            .max()
            .expect("a blocking verdict");
        let early = f
            .store
            .decide(&Batch::consume(&items, 1).at(now + retry - 1))
            .await
            .expect("decide");
        assert!(!early.allowed, "retry_after is never early");
        now += retry;
        let after = f
            .store
            .decide(&Batch::consume(&items, 1).at(now))
            .await
            .expect("decide");
        assert!(
            after.allowed,
            "the request passes once retry_after has passed"
        );
        now += 150_000;
    }
    assert!(
        blocked >= 5,
        "the sequence hits the limits ({blocked} blocks)"
    );
}

async fn every_key_has_a_ttl_and_nothing_is_left_after_expiry(f: Fixture) {
    let id = "ttl";
    // (limit, longest TTL it may need, in ms)
    let limits = [
        (
            Item::new(
                key(id, "tb"),
                Algorithm::TokenBucket {
                    capacity: 3,
                    refill_per_second: 2.0,
                },
            ),
            500,
        ),
        (
            Item::new(
                key(id, "sw"),
                Algorithm::SlidingWindow {
                    limit: 5,
                    window_us: 500_000,
                },
            ),
            1000,
        ),
        (
            Item::new(
                key(id, "sl"),
                Algorithm::SlidingLog {
                    limit: 5,
                    window_us: 800_000,
                },
            ),
            800,
        ),
        (
            Item::new(
                key(id, "fw"),
                Algorithm::FixedWindow {
                    limit: 5,
                    window_us: 500_000,
                },
            ),
            500,
        ),
        (
            Item::new(
                key(id, "gcra"),
                Algorithm::Gcra {
                    rate_per_second: 2.0,
                    burst: 3,
                },
            ),
            500,
        ),
        (
            Item::new(
                key(id, "lb"),
                Algorithm::LeakyBucket {
                    rate_per_second: 2.0,
                    capacity: 3,
                    max_delay_us: 0,
                },
            ),
            500,
        ),
    ];
    let items: Vec<Item> = limits.iter().map(|(i, _)| i.clone()).collect();
    // Start at the very beginning of a fixed window, so its key lives long
    // enough to be seen even on a busy machine.
    let into_window = f.now() % 500_000;
    if into_window > 20_000 {
        f.wait(Duration::from_micros(500_000 - into_window + 1_000))
            .await;
    }
    assert!(consume(&f, &items, 1).await.allowed);
    assert_eq!(f.live_keys(), limits.len());
    for (item, max_ms) in &limits {
        if let Some(pttl) = f.pttl(&item.key) {
            assert!(
                pttl > 0 && pttl <= *max_ms,
                "{} has PTTL {pttl} (at most {max_ms})",
                item.key
            );
        }
    }
    f.wait(Duration::from_millis(1100)).await;
    assert_eq!(f.live_keys(), 0, "idle clients leave nothing behind");
}

async fn fractional_refill_is_kept(f: Fixture) {
    let items = [Item::new(
        key("fractional", "burst"),
        Algorithm::TokenBucket {
            capacity: 1,
            refill_per_second: 0.5,
        },
    )];
    let t = f.now();
    let at = |t| Batch::consume(&items, 1).at(t);
    assert!(f.store.decide(&at(t)).await.expect("decide").allowed);
    let half = f.store.decide(&at(t + 1_000_000)).await.expect("decide");
    assert!(!half.allowed);
    assert_eq!(
        half.verdicts[0].remaining, 0.5,
        "half a token after a second"
    );
    assert_eq!(half.verdicts[0].retry_after_us, 1_000_000);
    assert!(
        f.store
            .decide(&at(t + 2_000_000))
            .await
            .expect("decide")
            .allowed
    );
}

/// Every algorithm, quota 3, 10 s to get it back, on one identity (one
/// cluster slot), decided one limit per call.
fn three_per_ten_seconds(identity: &str) -> Vec<Item> {
    let window_us = 10_000_000;
    [
        Algorithm::TokenBucket {
            capacity: 3,
            refill_per_second: 0.3,
        },
        Algorithm::SlidingWindow {
            limit: 3,
            window_us,
        },
        Algorithm::SlidingLog {
            limit: 3,
            window_us,
        },
        Algorithm::FixedWindow {
            limit: 3,
            window_us,
        },
        Algorithm::Gcra {
            rate_per_second: 0.3,
            burst: 3,
        },
        Algorithm::LeakyBucket {
            rate_per_second: 0.3,
            capacity: 3,
            max_delay_us: 0,
        },
    ]
    .into_iter()
    .map(|a| Item::new(key(identity, a.kind()), a))
    .collect()
}

async fn a_clock_stepped_back_keeps_every_count(f: Fixture) {
    // Late in a 10 s window, so the step back crosses three fixed windows.
    let t = f.now() - f.now() % 10_000_000 + 9_000_000;
    for item in three_per_ten_seconds("stepped-back") {
        let items = [item];
        for _ in 0..3 {
            let d = f.store.decide(&Batch::consume(&items, 1).at(t)).await;
            assert!(d.expect("decide").allowed, "{:?}", items[0].algorithm);
        }
        // The store's clock steps back 30 s (a failover to a replica whose
        // clock is behind) and walks forward to where it was.
        for k in 0..60u64 {
            let now = t - 30_000_000 + k * 500_000;
            let d = f
                .store
                .decide(&Batch::consume(&items, 1).at(now))
                .await
                .expect("decide");
            assert!(
                !d.allowed,
                "{:?} admitted again at {now}, {} µs before the quota's own time",
                items[0].algorithm,
                t - now
            );
        }
    }
}

macro_rules! conformance {
    ($store:ident) => {
        mod $store {
            use super::*;

            async fn fixture() -> Fixture {
                Fixture::$store().await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_burst_of_capacity_passes_then_blocks() {
                burst_of_capacity_then_block(fixture().await).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_blocked_request_consumes_nothing() {
                blocked_request_consumes_nothing(fixture().await).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_request_blocked_by_the_day_consumes_no_burst_token() {
                blocked_by_day_consumes_no_burst_token(fixture().await).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_shadow_limit_never_blocks() {
                shadow_limit_never_blocks(fixture().await).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn peeking_consumes_nothing() {
                peek_consumes_nothing(fixture().await).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn retry_after_is_never_early_and_always_enough() {
                retry_after_is_honest(fixture().await).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn every_key_expires_once_its_limit_no_longer_needs_it() {
                every_key_has_a_ttl_and_nothing_is_left_after_expiry(fixture().await).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_clock_stepped_back_hands_out_no_quota_again() {
                a_clock_stepped_back_keeps_every_count(fixture().await).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn fractional_refill_is_kept_exactly() {
                fractional_refill_is_kept(fixture().await).await;
            }
        }
    };
}

conformance!(memory);
conformance!(redis);
conformance!(redis_cluster);
