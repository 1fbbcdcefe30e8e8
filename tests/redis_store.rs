//! The single-node Redis store against a real `redis-server`: exact under
//! concurrency, one script call per decision, transparent script reloads,
//! a hard timeout that is never retried, and a lazy start.

mod support;

use support::identity_key as key;

use std::sync::Arc;
use std::time::{Duration, Instant};

use ratewatch::algorithm::Algorithm;
use ratewatch::policy::StoreSettings;
use ratewatch::store::{Batch, Item, RedisStore, Store, StoreError, keys};
use support::RedisServer;

async fn store(server: &RedisServer, timeout: Duration) -> RedisStore {
    RedisStore::connect(&StoreSettings {
        url: Some(server.url()),
        timeout,
        ..StoreSettings::default()
    })
    .await
    .expect("connect")
}

fn bucket(identity: &str, capacity: u64) -> Item {
    Item::new(
        key(identity, "burst"),
        Algorithm::TokenBucket {
            capacity,
            refill_per_second: 0.000_001,
        },
    )
}

fn six_limits(identity: &str) -> Vec<Item> {
    let w = 60_000_000;
    vec![
        bucket(identity, 100),
        Item::new(
            key(identity, "sw"),
            Algorithm::SlidingWindow {
                limit: 100,
                window_us: w,
            },
        ),
        Item::new(
            key(identity, "sl"),
            Algorithm::SlidingLog {
                limit: 100,
                window_us: w,
            },
        ),
        Item::new(
            key(identity, "fw"),
            Algorithm::FixedWindow {
                limit: 100,
                window_us: w,
            },
        ),
        Item::new(
            key(identity, "gcra"),
            Algorithm::Gcra {
                rate_per_second: 1.0,
                burst: 100,
            },
        ),
        Item::new(
            key(identity, "lb"),
            Algorithm::LeakyBucket {
                rate_per_second: 1.0,
                capacity: 100,
                max_delay_us: 0,
            },
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_instances_hammering_one_identity_admit_exactly_the_capacity() {
    let server = RedisServer::start();
    let stores: Vec<Arc<RedisStore>> =
        futures_util::future::join_all((0..4).map(|_| store(&server, Duration::from_secs(2))))
            .await
            .into_iter()
            .map(Arc::new)
            .collect();
    let capacity = 37;
    let items = Arc::new([bucket("hammered", capacity)]);
    let mut tasks = Vec::new();
    for i in 0..200 {
        let store = stores[i % 4].clone();
        let items = items.clone();
        tasks.push(tokio::spawn(async move {
            store
                .decide(&Batch::consume(&items[..], 1))
                .await
                .expect("decide")
                .allowed
        }));
    }
    let mut admitted = 0;
    for t in tasks {
        admitted += t.await.expect("task") as u64;
    }
    assert_eq!(admitted, capacity, "exactly the capacity, never one more");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_decision_is_one_script_call_whatever_the_number_of_limits() {
    let server = RedisServer::start();
    let store = store(&server, Duration::from_secs(2)).await;
    let one = [bucket("one-limit", 100)];
    let six = six_limits("six-limits");
    store
        .decide(&Batch::consume(&one, 1))
        .await
        .expect("warm up");
    server.cli(&["CONFIG", "RESETSTAT"]);
    for _ in 0..10 {
        assert!(support::consume(&store, &one, 1).await.allowed);
        assert!(support::consume(&store, &six, 1).await.allowed);
        assert!(
            store
                .decide(&Batch::peek(&six))
                .await
                .expect("peek")
                .allowed
        );
    }
    assert_eq!(server.command_calls("evalsha"), 30);
    // Commands a script runs are counted too; only these come from clients.
    for client_side in ["eval", "script|load", "multi", "exec"] {
        assert_eq!(server.command_calls(client_side), 0, "{client_side}");
    }
    assert_eq!(
        server.command_calls("time"),
        30,
        "one Redis clock read per decision"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forgotten_script_is_reloaded_transparently_and_counted() {
    let mut server = RedisServer::start();
    let store = store(&server, Duration::from_secs(1)).await;
    let items = [bucket("reloads", 10)];
    assert!(support::consume(&store, &items, 1).await.allowed);
    assert_eq!(
        store.script_reloads(),
        vec![(server.addr().into(), 1)],
        "first use loads it"
    );

    server.cli(&["SCRIPT", "FLUSH"]);
    let d = store
        .decide(&Batch::consume(&items, 1))
        .await
        .expect("decide after SCRIPT FLUSH");
    assert_eq!(d.verdicts[0].remaining.floor(), 8.0);
    assert_eq!(store.script_reloads()[0].1, 2);

    server.restart();
    // The first call on the old connection may fail while it reconnects.
    let deadline = Instant::now() + Duration::from_secs(5);
    let d = loop {
        match store.decide(&Batch::consume(&items, 1)).await {
            Ok(d) => break d,
            Err(e) => {
                assert!(e.is_transient(), "{e}");
                assert!(
                    Instant::now() < deadline,
                    "no decision after the restart: {e}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    assert_eq!(
        d.verdicts[0].remaining.floor(),
        9.0,
        "the restarted server is empty"
    );
    assert_eq!(store.script_reloads()[0].1, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_server_times_out_promptly_and_the_decision_is_not_resent() {
    let server = RedisServer::start();
    let store = store(&server, Duration::from_millis(50)).await;
    let items = [bucket("frozen", 10)];
    store
        .decide(&Batch::consume(&items, 1))
        .await
        .expect("warm up");
    server.cli(&["CONFIG", "RESETSTAT"]);

    server.pause();
    let started = Instant::now();
    let outcome = store.decide(&Batch::consume(&items, 1)).await;
    let took = started.elapsed();
    server.resume();

    assert!(matches!(outcome, Err(StoreError::Timeout)), "{outcome:?}");
    assert!(
        took < Duration::from_millis(500),
        "timed out after {took:?}"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(server.command_calls("evalsha"), 1, "sent once, never again");
    let peek = support::peek(&store, &items).await;
    assert_eq!(
        peek.verdicts[0].remaining.floor(),
        8.0,
        "charged at most once"
    );
}

/// A Redis store that counts how the limiter asks it.
struct Counting {
    inner: RedisStore,
    decide: std::sync::atomic::AtomicU64,
    bounded: std::sync::atomic::AtomicU64,
}

#[async_trait::async_trait]
impl Store for Counting {
    async fn decide(
        &self,
        batch: &Batch<'_>,
    ) -> Result<ratewatch::store::StoreDecision, StoreError> {
        self.decide
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.inner.decide(batch).await
    }

    async fn decide_bounded(
        &self,
        batch: &Batch<'_>,
    ) -> Result<ratewatch::store::StoreDecision, StoreError> {
        self.bounded
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.inner.decide_bounded(batch).await
    }

    fn shard_for(&self, key: &str) -> Arc<str> {
        self.inner.shard_for(key)
    }

    fn kind(&self) -> &'static str {
        self.inner.kind()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_limiter_bounds_a_decision_itself_so_the_store_sets_no_second_timer() {
    use ratewatch::identity::{Identity, IdentityKind};
    use ratewatch::{Limit, Limiter, Policy, Tier};
    let server = RedisServer::start();
    let settings = StoreSettings {
        url: Some(server.url()),
        timeout: Duration::from_millis(50),
        ..StoreSettings::default()
    };
    let store = Arc::new(Counting {
        inner: RedisStore::connect(&settings).await.expect("connect"),
        decide: Default::default(),
        bounded: Default::default(),
    });
    let policy = Policy::builder()
        .store(settings)
        .tier(
            Tier::new("free")
                .match_prefix("free_")
                .limit(Limit::per_second("burst", 100)),
        )
        .tier(Tier::new("anonymous").limit(Limit::per_second("burst", 100)))
        .build()
        .unwrap();
    let limiter = Limiter::builder(policy)
        .with_store(store.clone())
        .build()
        .await
        .unwrap();
    let caller = Identity::new(IdentityKind::ApiKey, "free_bounded");
    let d = limiter.check(&caller, "free", None).await;
    assert!(
        d.allowed && matches!(d.source, ratewatch::Source::Store { .. }),
        "{d:?}"
    );
    let calls = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(calls(&store.decide), 0, "decided under a second timer");
    assert_eq!(calls(&store.bounded), 1);

    // A frozen server: the limiter's budget alone answers, promptly, by
    // the failure policy.
    server.pause();
    let started = Instant::now();
    let d = limiter.check(&caller, "free", None).await;
    let took = started.elapsed();
    server.resume();
    assert!(
        !matches!(d.source, ratewatch::Source::Store { .. }),
        "{d:?}"
    );
    assert!(took < Duration::from_secs(2), "answered after {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_made_while_redis_is_down_decides_once_redis_is_up() {
    let mut server = RedisServer::start();
    server.kill();
    let started = Instant::now();
    let store = store(&server, Duration::from_millis(50)).await;
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "connect does not wait for Redis"
    );
    let items = [bucket("late", 3)];
    let started = Instant::now();
    let down = store.decide(&Batch::consume(&items, 1)).await;
    assert!(down.is_err(), "{down:?}");
    assert!(started.elapsed() < Duration::from_millis(500));

    server.restart();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match store.decide(&Batch::consume(&items, 1)).await {
            Ok(d) => {
                assert!(d.allowed);
                assert_eq!(d.shard.as_ref(), server.addr());
                break;
            }
            Err(e) => assert!(Instant::now() < deadline, "still failing: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_identity_maps_to_a_normal_length_key() {
    let server = RedisServer::start();
    let store = store(&server, Duration::from_secs(2)).await;
    let hostile = format!("free_{{x}}:y}}{{:{}", "j".repeat(10 * 1024));
    let items = [bucket(&hostile, 2)];
    assert!(support::consume(&store, &items, 1).await.allowed);
    let keys = server.cli(&["KEYS", "*"]);
    let keys: Vec<&str> = keys.lines().collect();
    assert_eq!(keys.len(), 1);
    assert!(keys[0].len() <= 30, "{}", keys[0]);
    assert!(!keys[0].contains("jjj") && !keys[0].contains("free_"));
    assert_eq!(keys::hash_tag(keys[0]).len(), 16);
}

/// Prints the table of `docs/redis-memory.md`:
/// `cargo test --test redis_store memory_per_identity -- --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_per_identity_stays_small_and_grows_only_with_a_sliding_log() {
    let server = RedisServer::start();
    let store = store(&server, Duration::from_secs(2)).await;
    let w = 3_600_000_000;
    let mut rows = Vec::new();
    let usage = |item: Item, cost: u64, fill: u64| {
        let server = &server;
        let store = &store;
        async move {
            let items = [item];
            for _ in 0..fill {
                let d = support::consume(store, &items, cost).await;
                assert!(d.allowed);
            }
            let bytes: u64 = server
                .cli(&["MEMORY", "USAGE", &items[0].key, "SAMPLES", "0"])
                .trim()
                .parse()
                .expect("MEMORY USAGE answers a number");
            (items[0].algorithm.kind(), fill * cost, bytes)
        }
    };
    // Keys as the limiter writes them (`rw:{<16 base64url>}:<5>`).
    let real =
        |name: &str, alg: Algorithm| Item::new(support::limiter_key(name, "burst", &alg), alg);
    let tb = Algorithm::TokenBucket {
        capacity: 10_000,
        refill_per_second: 0.000_001,
    };
    rows.push(usage(real("mem-tb", tb), 1, 1).await);
    for (name, alg) in [
        (
            "mem-sw",
            Algorithm::SlidingWindow {
                limit: 10_000,
                window_us: w,
            },
        ),
        (
            "mem-fw",
            Algorithm::FixedWindow {
                limit: 10_000,
                window_us: w,
            },
        ),
        (
            "mem-gcra",
            Algorithm::Gcra {
                rate_per_second: 1.0,
                burst: 10_000,
            },
        ),
        (
            "mem-lb",
            Algorithm::LeakyBucket {
                rate_per_second: 1.0,
                capacity: 10_000,
                max_delay_us: 0,
            },
        ),
    ] {
        rows.push(usage(real(name, alg), 1, 1).await);
    }
    for fill in [1, 10, 100, 1000] {
        let alg = Algorithm::SlidingLog {
            limit: 10_000,
            window_us: w,
        };
        let cost = if fill >= 100 { 10 } else { 1 };
        rows.push(usage(real(&format!("mem-sl-{fill}"), alg), cost, fill / cost).await);
    }
    println!("| algorithm | entries | bytes (MEMORY USAGE) |\n|---|---|---|");
    for (kind, entries, bytes) in &rows {
        println!("| {kind} | {entries} | {bytes} |");
        assert!(*bytes > 0 && *bytes < 200_000, "{kind}: {bytes} bytes");
    }
    let log = |n: u64| {
        rows.iter()
            .find(|r| r.0 == "sliding_log" && r.1 == n)
            .map(|r| r.2)
    };
    assert!(log(1000) > log(10), "a sliding log grows with its fill");
    // Redis 7 on 64 bits: 24 bytes of dict entry, the name (up to 30 bytes in
    // a 32-byte allocation), the value (a string of up to 12 bytes in 32,
    // up to 28 in 48): GCRA's and the fixed window's 12-byte records fit
    // the smaller one, the sliding window's 18 (its latest admission, for
    // reloads) the larger.
    let bytes = |kind: &str| rows.iter().find(|r| r.0 == kind).map_or(0, |r| r.2);
    assert!(
        bytes("gcra") <= 88 && bytes("leaky_bucket") <= 88,
        "{rows:?}"
    );
    assert!(bytes("fixed_window") <= 88, "{rows:?}");
    assert!(bytes("sliding_window") <= 104, "{rows:?}");
    assert!(bytes("token_bucket") <= 104, "{rows:?}");
}

#[tokio::test]
async fn state_in_the_previous_layout_decides_as_fresh_and_is_replaced() {
    let server = RedisServer::start();
    let store = store(&server, Duration::from_secs(1)).await;
    let minute = 60_000_000;
    // What the previous layout wrote: hashes (an empty bucket, windows
    // already full, dated far ahead so that they would still count) and,
    // where a sliding log now lives, a string.
    let far = "4000000000000000";
    let cases: [(Algorithm, &[&str], &str); 4] = [
        (
            Algorithm::TokenBucket {
                capacity: 3,
                refill_per_second: 0.001,
            },
            &["HSET", "K", "tokens", "0", "last", far],
            "string",
        ),
        (
            Algorithm::SlidingWindow {
                limit: 3,
                window_us: minute,
            },
            &["HSET", "K", "start", far, "count", "3", "prev", "3"],
            "string",
        ),
        (
            Algorithm::FixedWindow {
                limit: 3,
                window_us: minute,
            },
            &["HSET", "K", "start", far, "count", "3", "prev", "0"],
            "string",
        ),
        (
            Algorithm::SlidingLog {
                limit: 3,
                window_us: minute,
            },
            &["SET", "K", far],
            "zset",
        ),
    ];
    for (n, (algorithm, old, now_held)) in cases.into_iter().enumerate() {
        let k = key(&format!("previous_layout_{n}"), "burst");
        let old: Vec<&str> = old
            .iter()
            .map(|a| if *a == "K" { k.as_str() } else { a })
            .collect();
        server.cli(&old);
        let items = [Item::new(k.clone(), algorithm.clone())];
        let peek = store.decide(&Batch::peek(&items)).await;
        let peek = peek.unwrap_or_else(|e| panic!("{algorithm:?}: {e}"));
        assert_eq!(
            peek.verdicts[0].remaining, 3.0,
            "{algorithm:?} reads as fresh"
        );
        for i in 0..3 {
            let d = store.decide(&Batch::consume(&items, 1)).await.unwrap();
            assert!(
                d.allowed,
                "{algorithm:?} request {i} starts from a fresh key"
            );
        }
        let d = store.decide(&Batch::consume(&items, 1)).await.unwrap();
        assert!(!d.allowed, "{algorithm:?} then counts as usual");
        assert_eq!(server.cli(&["TYPE", &k]).trim(), now_held, "{algorithm:?}");
    }
}

#[tokio::test]
async fn changing_a_limits_algorithm_under_the_same_name_decides_as_fresh() {
    let server = RedisServer::start();
    let store = store(&server, Duration::from_secs(1)).await;
    let k = key("changed_algorithm", "burst");
    // Yesterday the limit was a GCRA (a string), a sliding log (a sorted
    // set), then a token bucket (a hash); each change must decide, not fail
    // with WRONGTYPE until the old state expires.
    let shapes = [
        Algorithm::Gcra {
            rate_per_second: 1.0,
            burst: 3,
        },
        Algorithm::SlidingLog {
            limit: 3,
            window_us: 60_000_000,
        },
        Algorithm::TokenBucket {
            capacity: 3,
            refill_per_second: 0.001,
        },
        Algorithm::FixedWindow {
            limit: 3,
            window_us: 60_000_000,
        },
    ];
    for algorithm in shapes {
        let items = [Item::new(k.clone(), algorithm.clone())];
        for n in 0..3 {
            let d = store
                .decide(&Batch::consume(&items, 1))
                .await
                .unwrap_or_else(|e| panic!("{algorithm:?}: {e}"));
            assert!(
                d.allowed,
                "{algorithm:?} request {n} starts from a fresh key"
            );
        }
        let d = store.decide(&Batch::consume(&items, 1)).await.unwrap();
        assert!(!d.allowed, "{algorithm:?} then counts as usual");
    }
}
