//! The memory store: all limits of a request decided together, all or
//! nothing; shadow limits; peeks; concurrency; memory bounded under millions
//! of distinct keys (a hard entry cap, evictions closest to expiry first and
//! counted, periodic sweeps that give memory back); expired keys deciding
//! like fresh ones.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use ratewatch::algorithm::Algorithm;
use ratewatch::clock::ManualClock;
use ratewatch::store::{Batch, Item, MemoryStore, Store, StoreDecision, StoreObserver};

const SEC: u64 = 1_000_000;
const T0: u64 = 1_700_000_000_000_000;

fn store() -> (MemoryStore, ManualClock) {
    let clock = ManualClock::new(T0);
    (MemoryStore::with_clock(Arc::new(clock.clone())), clock)
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a current-thread runtime")
        .block_on(f)
}

async fn decide(store: &MemoryStore, batch: Batch<'_>) -> StoreDecision {
    store
        .decide(&batch)
        .await
        .expect("the memory store decides")
}

fn burst(capacity: u64) -> Algorithm {
    Algorithm::TokenBucket {
        capacity,
        refill_per_second: 1.0,
    }
}

fn day(limit: u64) -> Algorithm {
    Algorithm::FixedWindow {
        limit,
        window_us: 86_400 * SEC,
    }
}

/// The free tier: burst + minute + day, on one identity.
fn free_tier(id: &str, day_limit: u64) -> Vec<Item> {
    vec![
        Item::new(format!("rw:{{free:{id}}}:burst"), burst(10)),
        Item::new(
            format!("rw:{{free:{id}}}:minute"),
            Algorithm::SlidingWindow {
                limit: 20,
                window_us: 60 * SEC,
            },
        ),
        Item::new(format!("rw:{{free:{id}}}:day"), day(day_limit)),
    ]
}

#[tokio::test]
async fn a_request_blocked_by_its_daily_limit_consumes_no_burst_token() {
    let (store, _clock) = store();
    let items = free_tier("a", 3);
    for _ in 0..3 {
        assert!(decide(&store, Batch::consume(&items, 1)).await.allowed);
    }
    for _ in 0..5 {
        let d = decide(&store, Batch::consume(&items, 1)).await;
        assert!(!d.allowed);
        assert!(!d.verdicts[2].allowed, "the day limit blocks");
        assert!(d.verdicts[0].allowed, "the burst limit alone would admit");
        // Reported uncharged: what the burst had before the blocked request.
        assert_eq!(d.verdicts[0].remaining.floor(), 7.0);
    }
    let peek = decide(&store, Batch::peek(&items)).await;
    assert_eq!(peek.verdicts[0].remaining.floor(), 7.0, "burst: 10 - 3");
    assert!(
        (peek.verdicts[1].remaining - 17.0).abs() < 1e-9,
        "minute: 20 - 3"
    );
    assert_eq!(peek.verdicts[2].remaining, 0.0);
}

#[tokio::test]
async fn a_request_blocked_by_its_burst_consumes_nothing_from_the_day() {
    let (store, _clock) = store();
    let items = free_tier("b", 1000);
    for _ in 0..10 {
        assert!(decide(&store, Batch::consume(&items, 1)).await.allowed);
    }
    for _ in 0..50 {
        assert!(!decide(&store, Batch::consume(&items, 1)).await.allowed);
    }
    let peek = decide(&store, Batch::peek(&items)).await;
    assert_eq!(peek.verdicts[2].remaining, 990.0);
    assert!((peek.verdicts[1].remaining - 10.0).abs() < 1e-9);
}

#[tokio::test]
async fn a_blocked_request_still_passes_at_its_retry_time() {
    let (store, clock) = store();
    let items = free_tier("c", 1000);
    for _ in 0..10 {
        assert!(decide(&store, Batch::consume(&items, 1)).await.allowed);
    }
    let blocked = decide(&store, Batch::consume(&items, 1)).await;
    assert!(!blocked.allowed);
    let retry = blocked.verdicts[0].retry_after_us;
    assert_eq!(retry, SEC, "one token at 1/s");
    clock.advance_us(retry - 1);
    assert!(!decide(&store, Batch::consume(&items, 1)).await.allowed);
    clock.advance_us(1);
    assert!(decide(&store, Batch::consume(&items, 1)).await.allowed);
}

#[tokio::test]
async fn a_shadow_limit_never_blocks_and_is_not_charged_when_it_would_block() {
    let (store, _clock) = store();
    let mut shadow = Item::new("rw:{free:s}:strict", burst(2));
    shadow.shadow = true;
    let items = vec![Item::new("rw:{free:s}:burst", burst(5)), shadow];
    let mut shadow_blocked = 0;
    for i in 0..5 {
        let d = decide(&store, Batch::consume(&items, 1)).await;
        assert!(d.allowed, "request {i} is admitted by the enforced limit");
        if !d.verdicts[1].allowed {
            shadow_blocked += 1;
        }
    }
    assert_eq!(shadow_blocked, 3);
    let peek = decide(&store, Batch::peek(&items)).await;
    assert_eq!(peek.verdicts[0].remaining.floor(), 0.0);
    // Charged for the two it admitted, not for the three it would have blocked.
    assert!(peek.verdicts[1].remaining.abs() < 1e-9);
    let blocked = decide(&store, Batch::consume(&items, 1)).await;
    assert!(!blocked.allowed, "the enforced limit still blocks");
    // Exactly 1 s until the shadow bucket has a token: it was not charged
    // below zero by the requests it would have blocked.
    assert_eq!(blocked.verdicts[1].retry_after_us, SEC);
}

#[tokio::test]
async fn a_shadow_limit_that_admits_is_charged_like_an_enforced_one() {
    let (store, _clock) = store();
    let mut shadow = Item::new("rw:{free:t}:strict", day(10));
    shadow.shadow = true;
    let items = vec![Item::new("rw:{free:t}:burst", burst(5)), shadow];
    for _ in 0..4 {
        assert!(decide(&store, Batch::consume(&items, 1)).await.allowed);
    }
    let peek = decide(&store, Batch::peek(&items)).await;
    assert_eq!(peek.verdicts[1].remaining, 6.0);
}

#[tokio::test]
async fn a_peek_reports_the_quota_without_consuming_it() {
    let (store, _clock) = store();
    let items = free_tier("p", 1000);
    assert!(decide(&store, Batch::consume(&items, 4)).await.allowed);
    for _ in 0..20 {
        let peek = decide(&store, Batch::peek(&items)).await;
        assert!(peek.allowed);
        assert_eq!(peek.verdicts[0].remaining.floor(), 6.0);
        assert_eq!(peek.verdicts[2].remaining, 996.0);
    }
    // The six tokens left are all still there.
    assert!(decide(&store, Batch::consume(&items, 6)).await.allowed);
    assert!(!decide(&store, Batch::consume(&items, 1)).await.allowed);
}

#[tokio::test]
async fn a_peek_of_a_fresh_identity_stores_nothing() {
    let (store, _clock) = store();
    let items = free_tier("fresh", 1000);
    let peek = decide(&store, Batch::peek(&items)).await;
    assert!(peek.allowed);
    assert_eq!(peek.verdicts[2].remaining, 1000.0);
    assert!(store.is_empty());
}

#[test]
fn eight_threads_hammering_one_identity_admit_exactly_the_capacity() {
    const CAPACITY: u64 = 500;
    let (store, _clock) = store();
    // The clock stands still, so the bucket refills nothing while it is hammered.
    let items = vec![
        Item::new(
            "rw:{free:hot}:burst",
            Algorithm::TokenBucket {
                capacity: CAPACITY,
                refill_per_second: 0.001,
            },
        ),
        Item::new("rw:{free:hot}:day", day(1_000_000)),
    ];
    let admitted: u64 = std::thread::scope(|s| {
        let handles: Vec<_> = (0..8)
            .map(|_| {
                s.spawn(|| {
                    block_on(async {
                        let mut n = 0;
                        for _ in 0..200 {
                            if decide(&store, Batch::consume(&items, 1)).await.allowed {
                                n += 1;
                            }
                        }
                        n
                    })
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a hammering thread"))
            .sum()
    });
    assert_eq!(admitted, CAPACITY);
    let peek = block_on(decide(&store, Batch::peek(&items)));
    assert_eq!(peek.verdicts[1].remaining, (1_000_000 - CAPACITY) as f64);
}

#[test]
fn memory_stays_bounded_under_two_million_distinct_short_lived_keys() {
    let (store, clock) = store();
    // Each key holds one token refilled in 1 s, so it lives for 1 s; one new
    // key arrives every 100 µs, so at most LIVE keys are live at any time.
    const LIVE: usize = 10_000;
    let alg = Algorithm::TokenBucket {
        capacity: 1,
        refill_per_second: 1.0,
    };
    // The store keeps 64 shards and sweeps one when it has grown past
    // max(2 × its keys after its last sweep, 1024). A sweep leaves only live
    // keys, about LIVE / 64 = 156 per shard (12 standard deviations below
    // 512), so every threshold stays at 1024 and a shard never holds more
    // than 1025 keys: the store holds at most 64 × 1025 = 65,600, against
    // 2,000,000 without sweeping.
    const BOUND: usize = 64 * 1025;
    let mut most = 0;
    for i in 0..2_000_000u64 {
        let items = [Item::new(format!("rw:{{free:{i:x}}}:burst"), alg.clone())];
        assert!(store.decide_now(&Batch::consume(&items, 1)).allowed);
        clock.advance_us(100);
        if i % 10_000 == 0 {
            let len = store.len();
            most = most.max(len);
            assert!(len <= BOUND, "{len} keys held after {i} inserts");
        }
    }
    assert!(most > LIVE, "the sweep is amortised, not per insert");
    // The first key expired long ago and decides like a fresh one.
    let first = [Item::new("rw:{free:0}:burst", alg)];
    let d = store.decide_now(&Batch::peek(&first));
    assert_eq!(d.verdicts[0].remaining, 1.0);
}

#[tokio::test]
async fn a_key_past_its_ttl_decides_like_a_fresh_one() {
    let (store, clock) = store();
    let used = free_tier("old", 1000);
    let fresh = free_tier("new", 1000);
    for _ in 0..10 {
        assert!(decide(&store, Batch::consume(&used, 1)).await.allowed);
    }
    // The longest TTL of the three: the day window's end, at most one day.
    clock.advance_us(86_400 * SEC);
    let a = decide(&store, Batch::consume(&used, 3)).await;
    let b = decide(&store, Batch::consume(&fresh, 3)).await;
    assert_eq!(a.verdicts, b.verdicts);
    store.sweep();
    assert_eq!(
        store.len(),
        6,
        "only the two identities' fresh writes are left"
    );
}

/// A day window: an entry that lives until the end of the UTC day.
fn day_key(i: u64) -> [Item; 1] {
    [Item::new(format!("rw:{{free:{i:x}}}:day"), day(1000))]
}

#[test]
fn the_entry_cap_holds_under_two_million_invented_identities() {
    const CAP: usize = 100_000;
    let (store, _clock) = store();
    let store = store.with_max_entries(CAP);
    // Long-lived entries that never expire during the test: only the cap
    // can keep them in check.
    const N: u64 = 2_100_000;
    for i in 0..N {
        assert!(store.decide_now(&Batch::consume(&day_key(i), 1)).allowed);
        if i % 50_000 == 0 {
            let len = store.len();
            assert!(len <= CAP, "{len} entries held after {i} inserts");
        }
    }
    let len = store.len();
    assert!(len <= CAP, "{len} entries held at the end");
    // Shards evict a batch (1/16 of their share) at a time: the store stays
    // close to its cap, not far below it.
    assert!(len >= CAP * 9 / 10, "only {len} entries kept of {CAP}");
    assert_eq!(
        store.evictions(),
        N - len as u64,
        "every entry not held was an eviction"
    );
}

/// A token bucket of one token refilled in `secs` seconds: its entry lives
/// exactly `secs` seconds after a request.
fn lives_for(secs: u64) -> Algorithm {
    Algorithm::TokenBucket {
        capacity: 1,
        refill_per_second: 1.0 / secs as f64,
    }
}

#[test]
fn a_full_store_evicts_the_entries_closest_to_expiry_first() {
    // One shard makes the order exact (with many, each shard keeps it).
    let (store, _clock) = store();
    let store = store.with_max_entries(1_000).with_shards(1);
    let key = |i: u64| {
        [Item::new(
            format!("rw:{{free:{i}}}:burst"),
            lives_for(i + 1),
        )]
    };
    // Inserted in a scrambled order: entry i lives i + 1 seconds.
    for n in 0..1_000u64 {
        let i = (n * 7_919) % 1_000;
        assert!(store.decide_now(&Batch::consume(&key(i), 1)).allowed);
    }
    assert_eq!(store.len(), 1_000);
    assert_eq!(store.evictions(), 0);
    // One more, long-lived: a batch of 1000 / 16 = 62 goes, the 62 closest
    // to expiry.
    assert!(store.decide_now(&Batch::consume(&key(5_000), 1)).allowed);
    assert_eq!(store.evictions(), 62);
    assert_eq!(store.len(), 1_000 - 62 + 1);
    for i in 0..1_000u64 {
        let d = store.decide_now(&Batch::peek(&key(i)));
        let evicted = d.verdicts[0].remaining == 1.0;
        assert_eq!(evicted, i < 62, "entry {i} living {} s", i + 1);
    }
}

#[test]
fn a_full_store_never_evicts_what_the_request_it_admits_just_charged() {
    let (store, _clock) = store();
    let store = store.with_max_entries(1_000).with_shards(1);
    for i in 0..1_000u64 {
        assert!(store.decide_now(&Batch::consume(&day_key(i), 1)).allowed);
    }
    // A new identity whose burst entry would be the closest to expiry of
    // the whole store: it is written after room was made, so it stays.
    let items = [
        Item::new("rw:{free:new}:burst", lives_for(1)),
        Item::new("rw:{free:new}:day", day(1000)),
    ];
    assert!(store.decide_now(&Batch::consume(&items, 1)).allowed);
    let peek = store.decide_now(&Batch::peek(&items));
    assert_eq!(peek.verdicts[0].remaining, 0.0, "the burst token is spent");
    assert_eq!(peek.verdicts[1].remaining, 999.0);
    assert!(store.len() <= 1_000);
}

#[test]
fn a_request_with_more_new_keys_than_a_shard_holds_is_decided_and_the_cap_still_holds() {
    let (store, _clock) = store();
    let store = store.with_max_entries(1).with_shards(1);
    let items = free_tier("many", 1000);
    for _ in 0..3 {
        assert!(store.decide_now(&Batch::consume(&items, 1)).allowed);
        assert_eq!(store.len(), 1);
    }
}

/// Collects what a store reports.
#[derive(Default)]
struct Reported {
    evicted: AtomicU64,
    calls: AtomicU64,
}

impl StoreObserver for Reported {
    fn evicted(&self, shard: &str, n: u64) {
        assert_eq!(shard, "memory");
        self.evicted.fetch_add(n, Ordering::SeqCst);
        self.calls.fetch_add(1, Ordering::SeqCst);
    }
}

#[test]
fn every_eviction_is_reported_to_the_observer_which_hears_of_the_store_at_once() {
    let (store, _clock) = store();
    let store = store.with_max_entries(1_000);
    let seen = Arc::new(Reported::default());
    store.observe(seen.clone());
    assert_eq!(
        seen.calls.load(Ordering::SeqCst),
        1,
        "a zero count at start, so the metric exists before any eviction"
    );
    assert_eq!(seen.evicted.load(Ordering::SeqCst), 0);
    for i in 0..5_000u64 {
        store.decide_now(&Batch::consume(&day_key(i), 1));
    }
    assert!(store.evictions() >= 4_000);
    assert_eq!(seen.evicted.load(Ordering::SeqCst), store.evictions());
}

#[test]
fn expired_entries_are_swept_on_time_not_only_when_a_shard_doubles() {
    let (store, clock) = store();
    // One new identity per millisecond, each entry living one second, for
    // 100 seconds. A shard touched by decisions is swept every 10 s, so at
    // most about 11 s of arrivals are held (11,000 entries). Sweeping only
    // when a shard doubles past 1024 would let 64 × 1024 pile up.
    let alg = lives_for(1);
    let mut most = 0;
    for i in 0..100_000u64 {
        let items = [Item::new(
            format!("rw:{{anonymous:{i:x}}}:burst"),
            alg.clone(),
        )];
        assert!(store.decide_now(&Batch::consume(&items, 1)).allowed);
        clock.advance_us(1_000);
        if i > 20_000 && i % 1_000 == 0 {
            most = most.max(store.len());
        }
    }
    assert!(most <= 13_000, "{most} entries held, about 1,000 live");
    assert_eq!(store.evictions(), 0, "expired entries are not evictions");
}

#[tokio::test(start_paused = true)]
async fn an_idle_store_sweeps_itself_and_gives_the_memory_of_a_spike_back() {
    let (store, clock) = store();
    // A spike of 300,000 identities, each entry living one second.
    for i in 0..300_000u64 {
        let items = [Item::new(
            format!("rw:{{anonymous:{i:x}}}:burst"),
            lives_for(1),
        )];
        store.decide_now(&Batch::consume(&items, 1));
    }
    let spike = store.capacity();
    assert!(spike >= 300_000);
    clock.advance_us(2 * SEC);
    // No request comes; the background sweep runs on its own.
    tokio::time::sleep(std::time::Duration::from_secs(11)).await;
    assert_eq!(store.len(), 0);
    let after = store.capacity();
    assert!(
        after * 10 < spike,
        "{after} slots still allocated after a spike of {spike}"
    );
}

#[test]
fn a_max_entries_below_a_thousand_is_a_config_error_naming_file_line_and_field() {
    let text = "[store]\nkind = \"memory\"\nmax_entries = 10\n";
    let err = ratewatch::Policy::from_toml_str(text, Some("ratewatch.toml"))
        .expect_err("a cap of 10 entries is refused");
    assert_eq!(err.field(), Some("store.max_entries"), "{err}");
    assert_eq!(err.line(), Some(3), "{err}");
    let shown = err.to_string();
    assert!(
        shown.starts_with("ratewatch.toml:3: `store.max_entries` ") && shown.contains("1000"),
        "{shown}"
    );
}

/// The value of `ratewatch_store_evictions_total{shard="memory"}` in a
/// scrape, if the series exists.
fn evictions_in(scrape: &str) -> Option<f64> {
    scrape
        .lines()
        .find_map(|l| l.strip_prefix("ratewatch_store_evictions_total{shard=\"memory\"} "))
        .map(|v| v.trim().parse().expect("a number"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_inventing_keys_against_the_server_meets_the_cap_and_is_counted() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("ratewatch.toml");
    std::fs::write(
        &config,
        r#"
[store]
kind = "memory"
max_entries = 1000

[[tiers]]
name = "free"
match_prefix = "free_"
limits = [
  { name = "burst", algorithm = "token_bucket", capacity = 10, refill_per_second = 0.001 },
  { name = "hour", algorithm = "sliding_window", limit = 1000, window = "1h" },
]

[[tiers]]
name = "anonymous"
limits = [{ name = "burst", algorithm = "token_bucket", capacity = 30, refill_per_second = 1 }]
"#,
    )
    .expect("write config");
    let server = support::Ratewatch::start("serve", Some(&config), &[]);
    let client = reqwest::Client::new();
    let scrape = || async {
        client
            .get(format!("{}/metrics", server.url()))
            .send()
            .await
            .expect("metrics")
            .text()
            .await
            .expect("text")
    };
    assert_eq!(
        evictions_in(&scrape().await),
        Some(0.0),
        "the eviction count exists at zero from start-up"
    );
    // 3,000 invented keys, two entries each, against a cap of 1,000. Both
    // entries live for many minutes (a burst token takes 1,000 s to come
    // back, a sliding hour at least an hour), so none expires during the
    // test: only evictions make room.
    const KEYS: u64 = 3_000;
    for i in 0..KEYS {
        let status = client
            .get(format!("{}/api/users", server.url()))
            .header("x-api-key", format!("free_invented_{i:08x}"))
            .send()
            .await
            .expect("server answers")
            .status();
        assert_eq!(status, 200, "a fresh identity is admitted");
    }
    let evicted = evictions_in(&scrape().await).expect("the series exists");
    assert!(
        evicted >= (2 * KEYS - 1_000) as f64,
        "{evicted} evictions: the store held more than its 1,000 entries"
    );
}
