//! In-flight limits (`algorithm = "concurrency"`) in the library: the layer
//! holds a slot until the response body ends (streamed bodies included)
//! or anything on the way is dropped; slots are taken in the same atomic
//! decision as the other limits (all or nothing); the Lua script and the
//! Rust algorithm agree step for step; Redis and a Redis Cluster release
//! and renew.

mod support;

use std::convert::Infallible;
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::routing::get;
use http::Request;
use http_body_util::BodyExt;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use ratewatch::algorithm::{Algorithm, State, concurrency};
use ratewatch::clock::{Clock, SystemClock};
use ratewatch::identity::{Identity, IdentityKind};
use ratewatch::policy::StoreSettings;
use ratewatch::store::{Batch, ClusterStore, Item, MemoryStore, RedisStore, Store};
use ratewatch::{Limit, Limiter, Policy, Tier};
use support::{RedisCluster, RedisServer};
use tower::ServiceExt;

const HOLD: Duration = Duration::from_secs(30);

fn policy(limit: u64) -> Policy {
    Policy::builder()
        .tier(
            Tier::new("free")
                .match_prefix("free_")
                .limit(Limit::concurrency_held("inflight", limit, HOLD)),
        )
        .tier(Tier::new("anonymous").limit(Limit::per_second("burst", 100)))
        .build()
        .expect("valid policy")
}

/// A router whose `/stream` answers at once with a first chunk and ends
/// its body only once `gate` is opened.
fn streaming_app(limiter: &Limiter, gate: tokio::sync::watch::Receiver<bool>) -> Router {
    let handler = move || {
        let gate = gate.clone();
        async move {
            let chunks = futures_util::stream::unfold((0u8, gate), |(step, mut gate)| async move {
                match step {
                    0 => Some((
                        Ok::<_, Infallible>(Bytes::from_static(b"first ")),
                        (1, gate),
                    )),
                    1 => {
                        let _ = gate.wait_for(|open| *open).await;
                        Some((Ok(Bytes::from_static(b"last")), (2, gate)))
                    }
                    _ => None,
                }
            });
            Body::from_stream(chunks)
        }
    };
    Router::new()
        .route("/stream", get(handler))
        .route("/never", get(std::future::pending::<&'static str>))
        .route("/quick", get(|| async { "quick" }))
        .layer(limiter.layer())
}

fn get_as(path: &str) -> Request<Body> {
    Request::get(path)
        .header("x-api-key", "free_streamer")
        .body(Body::empty())
        .unwrap()
}

#[tokio::test]
async fn a_streamed_body_holds_its_slot_until_its_last_chunk() {
    let limiter = Limiter::new(policy(1)).await.unwrap();
    let (open, gate) = tokio::sync::watch::channel(false);
    let app = streaming_app(&limiter, gate);

    let first = app.clone().oneshot(get_as("/stream")).await.unwrap();
    assert_eq!(first.status(), 200);
    let mut body = first.into_body();
    let chunk = body.frame().await.unwrap().unwrap().into_data().unwrap();
    assert_eq!(chunk, "first ");
    // Headers and a first chunk are out, the body is not over: the slot is
    // still held.
    let second = app.clone().oneshot(get_as("/quick")).await.unwrap();
    assert_eq!(
        second.status(),
        429,
        "the streaming request holds the only slot"
    );
    assert_eq!(second.headers()["retry-after"], "1");

    open.send(true).unwrap();
    let rest = body.collect().await.unwrap().to_bytes();
    assert_eq!(rest, "last");
    let third = app.clone().oneshot(get_as("/quick")).await.unwrap();
    assert_eq!(
        third.status(),
        200,
        "the slot came back when the body ended"
    );
}

#[tokio::test]
async fn a_response_dropped_unread_or_a_request_cancelled_gives_its_slot_back() {
    let limiter = Limiter::new(policy(1)).await.unwrap();
    let (_open, gate) = tokio::sync::watch::channel(false);
    let app = streaming_app(&limiter, gate);

    // A response whose body is never read, dropped (a client gone).
    let unread = app.clone().oneshot(get_as("/stream")).await.unwrap();
    assert_eq!(
        app.clone()
            .oneshot(get_as("/quick"))
            .await
            .unwrap()
            .status(),
        429
    );
    drop(unread);
    assert_eq!(
        app.clone()
            .oneshot(get_as("/quick"))
            .await
            .unwrap()
            .status(),
        200
    );

    // A request whose handler never answers, cancelled.
    let mut pending = Box::pin(app.clone().oneshot(get_as("/never")));
    assert!(
        tokio::time::timeout(Duration::from_millis(50), &mut pending)
            .await
            .is_err()
    );
    assert_eq!(
        app.clone()
            .oneshot(get_as("/quick"))
            .await
            .unwrap()
            .status(),
        429
    );
    drop(pending);
    assert_eq!(
        app.clone()
            .oneshot(get_as("/quick"))
            .await
            .unwrap()
            .status(),
        200
    );
}

#[tokio::test]
async fn a_checked_decision_holds_its_slot_until_dropped_and_a_peek_takes_none() {
    let limiter = Limiter::new(policy(2)).await.unwrap();
    let caller = Identity::new(IdentityKind::ApiKey, "free_checker");
    let a = limiter.check(&caller, "free", None).await;
    let peek = limiter.peek(&caller, "free", None).await;
    assert!(peek.slot.is_none());
    let b = limiter.check(&caller, "free", None).await;
    assert!(a.allowed && b.allowed);
    assert_eq!(
        a.slot.as_ref().map(|s| s.limits().to_vec()),
        Some(vec!["inflight".into()])
    );
    let c = limiter.check(&caller, "free", None).await;
    assert!(!c.allowed && c.slot.is_none());
    assert_eq!(c.retry_after, Some(Duration::from_secs(1)));
    drop(a);
    assert!(limiter.check(&caller, "free", None).await.allowed);
}

/// A token bucket of one and an in-flight limit of `slots`, on `prefix`.
fn mixed(prefix: &str, slots: u64) -> [Item; 2] {
    [
        Item::new(
            format!("{prefix}:{{t}}:bucket"),
            Algorithm::TokenBucket {
                capacity: 1,
                refill_per_second: 0.000_001,
            },
        ),
        Item::new(
            format!("{prefix}:{{t}}:slots"),
            Algorithm::Concurrency {
                limit: slots,
                hold_us: HOLD.as_micros() as u64,
            },
        ),
    ]
}

/// All or nothing on `store`: a request blocked by the rate limit takes no
/// slot, one blocked by the in-flight limit charges no token.
async fn all_or_nothing(store: &dyn Store, prefix: &str) {
    // Blocked by the bucket: the slot stays free.
    let items = mixed(&format!("{prefix}a"), 1);
    assert!(
        store
            .decide(&Batch::consume(&items, 1).holding("h1"))
            .await
            .unwrap()
            .allowed
    );
    let d = store.decide(&Batch::consume(&items[..1], 1)).await.unwrap();
    assert!(!d.allowed);
    let blocked = store
        .decide(&Batch::consume(&items, 1).holding("h2"))
        .await
        .unwrap();
    assert!(!blocked.allowed && !blocked.verdicts[1].allowed);
    store.release(&items[1..], "h1").await.unwrap();
    let slots_only = store
        .decide(&Batch::consume(&items[1..], 1).holding("h3"))
        .await
        .unwrap();
    assert!(slots_only.allowed, "the blocked request took no slot");

    // Blocked by the in-flight limit: the bucket keeps its token.
    let items = mixed(&format!("{prefix}b"), 1);
    assert!(
        store
            .decide(&Batch::consume(&items[1..], 1).holding("h1"))
            .await
            .unwrap()
            .allowed
    );
    let blocked = store
        .decide(&Batch::consume(&items, 1).holding("h2"))
        .await
        .unwrap();
    assert!(!blocked.allowed && blocked.verdicts[0].allowed && !blocked.verdicts[1].allowed);
    let bucket = store.decide(&Batch::consume(&items[..1], 1)).await.unwrap();
    assert!(bucket.allowed, "the token was not charged");

    // A release repeats harmlessly, and a renewal of a holder that is gone
    // reports it.
    store.release(&items[1..], "h1").await.unwrap();
    store.release(&items[1..], "h1").await.unwrap();
    assert_eq!(store.renew(&items[1..], "h1").await.unwrap(), 1);
    assert!(
        store
            .decide(&Batch::consume(&items[1..], 1).holding("h4"))
            .await
            .unwrap()
            .allowed
    );
    assert_eq!(store.renew(&items[1..], "h4").await.unwrap(), 0);
}

#[tokio::test]
async fn the_memory_store_takes_slots_all_or_nothing() {
    all_or_nothing(&MemoryStore::new(), "rw").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_takes_slots_all_or_nothing_and_never_names_a_holder_by_its_key() {
    let server = RedisServer::start();
    let store = RedisStore::connect(&StoreSettings {
        url: Some(server.url()),
        timeout: Duration::from_secs(2),
        ..StoreSettings::default()
    })
    .await
    .unwrap();
    all_or_nothing(&store, "rw").await;
    // Holders are the ids the limiter makes: random per process plus a
    // counter, nothing of the key.
    let id = ratewatch::store::holder_id();
    let (process, n) = id.split_once(':').unwrap();
    assert_eq!(process.len(), 16);
    assert!(n.parse::<u64>().is_ok());
    assert_ne!(ratewatch::store::holder_id(), id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_decides_slots_per_hash_slot_and_gives_back_what_a_blocked_request_took() {
    let cluster = RedisCluster::start();
    let store = ClusterStore::connect(&StoreSettings {
        nodes: cluster.urls(),
        timeout: Duration::from_secs(2),
        ..StoreSettings::default()
    })
    .await
    .unwrap();
    all_or_nothing(&store, "rw").await;
    // Two in-flight limits in two different slots: one full, one free. A
    // request needing both is refused, and the slot its free part took in
    // the other slot is given back.
    let slots = |key: &str, limit| {
        Item::new(
            key,
            Algorithm::Concurrency {
                limit,
                hold_us: HOLD.as_micros() as u64,
            },
        )
    };
    let full = slots("rw:{alpha}:cc", 1);
    let free = slots("rw:{omega}:cc", 2);
    assert_ne!(
        ratewatch::store::slot_of(&full.key),
        ratewatch::store::slot_of(&free.key)
    );
    let one = [full.clone()];
    assert!(
        store
            .decide(&Batch::consume(&one, 1).holding("h1"))
            .await
            .unwrap()
            .allowed
    );
    let both = [full, free.clone()];
    let d = store
        .decide(&Batch::consume(&both, 1).holding("h2"))
        .await
        .unwrap();
    assert!(!d.allowed);
    let node = cluster.node_for(&free.key);
    assert_eq!(
        node.cli(&["ZCARD", &free.key]).trim(),
        "0",
        "the free part's slot went back"
    );
    store.release(&both, "h1").await.unwrap();
    assert!(
        store
            .decide(&Batch::consume(&both, 1).holding("h3"))
            .await
            .unwrap()
            .allowed
    );
    assert_eq!(node.cli(&["ZCARD", &free.key]).trim(), "1");
}

/// The Rust state as (holder, deadline) pairs, sorted.
fn rust_holders(state: &Option<State>) -> Vec<(String, u64)> {
    let mut v = match state {
        Some(State::Holders(h)) => h.clone(),
        _ => Vec::new(),
    };
    v.sort();
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_acquires_and_releases_agree_in_rust_and_in_lua() {
    let server = RedisServer::start();
    let store = RedisStore::connect(&StoreSettings {
        url: Some(server.url()),
        timeout: Duration::from_secs(2),
        ..StoreSettings::default()
    })
    .await
    .unwrap();
    let mut compared = 0;
    for seed in 0..8u64 {
        let mut rng = StdRng::seed_from_u64(seed);
        let limit = rng.random_range(1..=4u64);
        // Long holds: deadlines pass on the explicit clock, never on the
        // real one Redis expires keys by while the test runs.
        let hold_us = rng.random_range(60..=600u64) * 1_000_000;
        let algorithm = Algorithm::Concurrency { limit, hold_us };
        let key = format!("rw:{{parity{seed}}}:cc");
        let items = [Item::new(key.clone(), algorithm.clone())];
        let mut state: Option<State> = None;
        let mut now = SystemClock.now_us();
        for step in 0..80 {
            now += match rng.random_range(0..6) {
                0 => 0,
                1..=3 => rng.random_range(1..=hold_us / 4),
                _ => rng.random_range(hold_us / 2..=hold_us + 1),
            };
            let holder = format!("h{}", rng.random_range(0..6));
            if rng.random_bool(0.3) {
                store.release(&items, &holder).await.unwrap();
                if let Some(s) = concurrency::release(state.as_ref(), &holder) {
                    state = Some(s);
                }
            } else {
                let cost = if rng.random_bool(0.1) {
                    0
                } else {
                    rng.random_range(1..=3)
                };
                let rust = algorithm.decide_as(state.as_ref(), now, cost, Some(&holder));
                let batch = Batch::consume(&items, cost).at(now).holding(&holder);
                let lua = store.decide(&batch).await.unwrap();
                assert_eq!(lua.verdicts[0], rust.verdict, "seed {seed} step {step}");
                if rust.verdict.allowed && rust.state.is_some() {
                    state = rust.state;
                }
            }
            let raw = server.cli(&["ZRANGE", &key, "0", "-1", "WITHSCORES"]);
            let words: Vec<&str> = raw.split_whitespace().collect();
            let mut redis: Vec<(String, u64)> = words
                .chunks(2)
                .map(|p| (p[0].to_owned(), p[1].parse().unwrap()))
                .collect();
            redis.sort();
            assert_eq!(redis, rust_holders(&state), "seed {seed} step {step}");
            compared += 1;
        }
    }
    assert_eq!(compared, 640);
}

#[test]
fn a_bad_in_flight_limit_is_refused_naming_the_file_line_and_field() {
    let file = |limit: &str| {
        format!(
            "[[tiers]]\nname = \"free\"\nlimits = [\n  {limit},\n]\n\n\
             [[tiers]]\nname = \"anonymous\"\nlimits = [{{ name = \"b\", algorithm = \"token_bucket\", capacity = 1, refill_per_second = 1 }}]\n"
        )
    };
    for (limit, field, says) in [
        (
            r#"{ name = "inflight", algorithm = "concurrency", limit = 2, hold_timeout = "100ms" }"#,
            "tiers[0].limits[0].hold_timeout",
            "from 1s to 1d",
        ),
        (
            r#"{ name = "inflight", algorithm = "concurrency", limit = 0 }"#,
            "tiers[0].limits[0].limit",
            "",
        ),
        (
            r#"{ name = "inflight", algorithm = "concurrency", limit = 2, window = "60s" }"#,
            "window",
            "limit, hold_timeout",
        ),
    ] {
        let err = Policy::from_toml_str(&file(limit), Some("policy.toml"))
            .expect_err(limit)
            .to_string();
        assert!(err.starts_with("policy.toml:4:"), "{err}");
        assert!(err.contains(field) && err.contains(says), "{err}");
    }
    let ok = Policy::from_toml_str(
        &file(r#"{ name = "inflight", algorithm = "concurrency", limit = 2 }"#),
        None,
    )
    .unwrap();
    assert_eq!(
        ok.tiers[0].limits[0].algorithm,
        Algorithm::Concurrency {
            limit: 2,
            hold_us: ratewatch::algorithm::DEFAULT_HOLD_US
        }
    );
}

/// How many holders the in-flight sets on `server` hold in all.
fn holders_on(server: &RedisServer) -> u64 {
    // Holder ids (hex, a colon, a counter) in any sorted set.
    const COUNT: &str = "local n = 0 \
        for _, k in ipairs(redis.call('KEYS', '*')) do \
          if redis.call('TYPE', k).ok == 'zset' then \
            for _, m in ipairs(redis.call('ZRANGE', k, 0, -1)) do \
              if string.match(m, '^%x+:%d+$') then n = n + 1 end \
            end \
          end \
        end return n";
    server.cli(&["EVAL", COUNT, "0"]).trim().parse().unwrap()
}

/// A decision whose answer never arrives (the caller gave up, or the
/// store's budget ran out) while Redis did run the script: the slot it
/// took has no holder in process to renew or give it back, so it must be
/// given back at once, not after the hold timeout (30 s here). Without
/// that, a client that disconnects while its decision is on the wire
/// leaves a slot behind, and a route-scoped limit can be filled by anyone.
async fn given_up_while_redis_takes_the_slot(budget: Duration) {
    let server = RedisServer::start();
    let settings = StoreSettings {
        url: Some(server.url()),
        timeout: budget,
        ..StoreSettings::default()
    };
    let store = RedisStore::connect(&settings).await.unwrap();
    let policy = Policy::builder()
        .store(settings)
        .tier(
            Tier::new("free")
                .match_prefix("free_")
                .limit(Limit::concurrency_held("inflight", 1, HOLD)),
        )
        .tier(Tier::new("anonymous").limit(Limit::per_second("burst", 100)))
        .build()
        .unwrap();
    let limiter = Limiter::builder(policy)
        .with_store(std::sync::Arc::new(store))
        .build()
        .await
        .unwrap();
    let caller = Identity::new(IdentityKind::ApiKey, "free_gone");
    // Scripts are loaded and the connection is up before the pause.
    drop(limiter.check(&caller, "free", None).await);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while holders_on(&server) > 0 {
        assert!(std::time::Instant::now() < deadline, "first release");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let calls = server.command_calls("evalsha");

    // Redis holds every script for 1.5 s; the caller gives up after 100 ms
    // (its future is dropped, as when a client disconnects), or the
    // decision's own budget runs out first and the failure policy answers.
    server.cli(&["CLIENT", "PAUSE", "1500", "WRITE"]);
    let answer = tokio::time::timeout(
        Duration::from_millis(100),
        limiter.check(&caller, "free", None),
    )
    .await;
    if let Ok(d) = &answer {
        assert!(
            !matches!(d.source, ratewatch::Source::Store { .. }),
            "{d:?}"
        );
    }
    drop(answer);

    // The script runs once the pause ends; then the slot must be back well
    // before its hold timeout.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while server.command_calls("evalsha") <= calls {
        assert!(std::time::Instant::now() < deadline, "the script never ran");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while holders_on(&server) > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the slot taken for a decision nobody saw is still held (until its 30 s hold timeout)"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let d = limiter.check(&caller, "free", None).await;
    assert!(d.allowed && d.slot.is_some(), "{d:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decision_cancelled_while_redis_takes_the_slot_gives_it_back() {
    given_up_while_redis_takes_the_slot(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decision_timed_out_while_redis_takes_the_slot_gives_it_back() {
    given_up_while_redis_takes_the_slot(Duration::from_millis(50)).await;
}

/// The task that renews held slots runs on the runtime of the request
/// that first took one. A limiter that outlives that runtime (built and
/// first used on one, serving on another) must renew on the next: else a
/// request held past its hold timeout loses its slot and a second one is
/// admitted beside it.
#[test]
fn renewals_go_on_after_the_runtime_that_started_them_is_gone() {
    let rt = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    };
    let hold = Duration::from_secs(1);
    let policy = Policy::builder()
        .tier(
            Tier::new("free")
                .match_prefix("free_")
                .limit(Limit::concurrency_held("inflight", 1, hold)),
        )
        .tier(Tier::new("anonymous").limit(Limit::per_second("burst", 100)))
        .build()
        .unwrap();
    let caller = Identity::new(IdentityKind::ApiKey, "free_twice");
    let first = rt();
    let limiter = first.block_on(async {
        let limiter = Limiter::new(policy).await.unwrap();
        drop(limiter.check(&caller, "free", None).await);
        limiter
    });
    drop(first);

    rt().block_on(async {
        let held = limiter.check(&caller, "free", None).await;
        assert!(held.allowed && held.slot.is_some());
        // Three hold timeouts: renewed every third of one, the slot stays.
        tokio::time::sleep(3 * hold).await;
        let second = limiter.check(&caller, "free", None).await;
        assert!(
            !second.allowed,
            "a held slot was not renewed: a second request took it"
        );
        drop(held);
    });
}

/// A process forked after it made its first holder id makes ids of its
/// own: else parent and child name two requests alike, and one set entry
/// counts for both (a slot too many, and one's release frees the other's).
#[cfg(unix)]
#[test]
fn a_forked_process_makes_holder_ids_of_its_own() {
    use std::io::Read;
    use std::os::fd::FromRawFd;
    let _ = ratewatch::store::holder_id();
    let mut fds = [0; 2];
    // SAFETY: a pipe of two new descriptors; the child only formats an id
    // (glibc's malloc is fork-safe), writes it and exits.
    let pid = unsafe {
        assert_eq!(libc::pipe(fds.as_mut_ptr()), 0);
        libc::fork()
    };
    assert!(pid >= 0);
    if pid == 0 {
        let id = ratewatch::store::holder_id();
        unsafe {
            libc::write(fds[1], id.as_ptr().cast(), id.len());
            libc::_exit(0);
        }
    }
    // SAFETY: the read end is ours alone; the write end is closed here.
    let mut read = unsafe {
        libc::close(fds[1]);
        std::fs::File::from_raw_fd(fds[0])
    };
    let mut child = String::new();
    read.read_to_string(&mut child).unwrap();
    unsafe { libc::waitpid(pid, std::ptr::null_mut(), 0) };
    let parent = ratewatch::store::holder_id();
    assert!(!child.is_empty());
    assert_ne!(child, parent, "parent and child made the same holder id");
}
