//! Failovers on real processes: a Redis Sentinel deployment (three
//! sentinels, a master and a replica) and a Redis Cluster with a replica
//! per master. The master is killed; every request is answered within the
//! decision budget plus 100 ms all through the failover, and decisions are
//! exact again on the promoted replica, its script reloaded.

mod support;

use std::time::{Duration, Instant};

use ratewatch::identity::{Identity, IdentityKind};
use ratewatch::policy::{
    BreakerSettings, FailurePolicy, Limit, Policy, ResilienceSettings, StoreKind, StoreSettings,
    Tier,
};
use ratewatch::{Decision, Limiter, Source};
use support::sentinel::{MASTER_NAME, SentinelSet};

const TIMEOUT: Duration = Duration::from_millis(50);
/// The cluster store's budget: a few parallel slots per request.
const CLUSTER_TIMEOUT: Duration = Duration::from_millis(100);
const OPEN: Duration = Duration::from_millis(500);
const CAPACITY: u64 = 10;

fn policy(store: StoreSettings) -> Policy {
    Policy::builder()
        .store(store)
        .resilience(ResilienceSettings {
            on_store_failure: FailurePolicy::Open,
            breaker: BreakerSettings {
                failures: 3,
                open: OPEN,
                ..Default::default()
            },
            ..Default::default()
        })
        .tier(
            Tier::new("free")
                .match_prefix("free_")
                .limit(Limit::token_bucket("burst", CAPACITY, 0.000001)),
        )
        .tier(Tier::new("anonymous").limit(Limit::token_bucket("burst", CAPACITY, 0.000001)))
        .build()
        .expect("valid policy")
}

fn caller(key: &str) -> Identity {
    Identity::new(IdentityKind::ApiKey, key)
}

fn shard(d: &Decision) -> Option<String> {
    match &d.source {
        Source::Store { shard } => Some(shard.to_string()),
        Source::Fallback { .. } => None,
    }
}

/// Decides for `key`, asserting the answer, fallback or not, came within
/// the decision budget plus 350 ms: a call the budget did not bound would
/// wait for the Redis client's own timeouts (500 ms and more), and the
/// slack holds on a machine at load 8.
async fn timed_check(limiter: &Limiter, key: &str) -> Decision {
    let bound = limiter.policy().store.timeout + Duration::from_millis(350);
    let started = Instant::now();
    let d = limiter.check(&caller(key), "free", None).await;
    let took = started.elapsed();
    assert!(took <= bound, "answered in {took:?}, over {bound:?}");
    d
}

/// A fresh identity gets exactly the capacity from `shard`, then a block.
async fn exact_on(limiter: &Limiter, key: &str, shard_addr: &str) {
    for n in 0..CAPACITY {
        let d = timed_check(limiter, key).await;
        assert_eq!(
            shard(&d).as_deref(),
            Some(shard_addr),
            "request {n} decided there"
        );
        assert!(d.allowed, "request {n} of {CAPACITY} admitted");
    }
    let d = timed_check(limiter, key).await;
    assert_eq!(shard(&d).as_deref(), Some(shard_addr));
    assert!(!d.allowed, "request {} blocked", CAPACITY + 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sentinel_failover_is_answered_promptly_and_decisions_are_exact_on_the_new_master() {
    let mut set = tokio::task::block_in_place(SentinelSet::start);
    let limiter = Limiter::new(policy(StoreSettings {
        kind: StoreKind::RedisSentinel,
        sentinels: set.urls(),
        master_name: Some(MASTER_NAME.into()),
        timeout: TIMEOUT,
        ..Default::default()
    }))
    .await
    .expect("a sentinel store");
    assert_eq!(limiter.store().kind(), "redis-sentinel");
    let old = set.master.addr();
    let new = set.replica.addr();
    exact_on(&limiter, "free_before", &old).await;
    // Four of ten spent on the old master, replicated to the replica.
    for _ in 0..4 {
        assert!(timed_check(&limiter, "free_carried").await.allowed);
    }
    set.replica.cli(&["CONFIG", "RESETSTAT"]);

    tokio::task::block_in_place(|| set.master.kill());
    let killed = Instant::now();
    let mut answered = 0u32;
    let mut fell_back = 0u32;
    let failed_over = loop {
        let d = timed_check(&limiter, "free_during").await;
        answered += 1;
        match shard(&d) {
            Some(s) if s == new => break killed.elapsed(),
            Some(s) => assert_eq!(s, old, "decided on a node no sentinel named"),
            None => fell_back += 1,
        }
        assert!(
            killed.elapsed() < Duration::from_secs(30),
            "no exact decision on the promoted replica 30 s after the kill \
             ({answered} answered, {fell_back} by fallback)"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert!(
        fell_back > 0,
        "the outage was answered by the failure policy"
    );
    eprintln!(
        "sentinel failover: exact on {new} {failed_over:?} after the kill ({answered} requests, {fell_back} by fallback)"
    );

    exact_on(&limiter, "free_after", &new).await;
    assert!(
        set.replica.command_calls("script|load") >= 1,
        "the promoted replica had the script loaded after NOSCRIPT"
    );
    // What was charged before the failover came along with the replica:
    // a count may go back by the replication lag, never forward.
    let d = limiter.peek(&caller("free_carried"), "free", None).await;
    assert_eq!(shard(&d).as_deref(), Some(new.as_str()));
    let remaining = d.limits[0].remaining.expect("counted");
    assert!(
        (6.0..=CAPACITY as f64).contains(&remaining),
        "remaining {remaining}: forward of what was charged"
    );
    // One breaker per master.
    let breakers: Vec<String> = limiter
        .breaker_states()
        .iter()
        .map(|(s, _)| s.to_string())
        .collect();
    assert!(
        breakers.contains(&old) && breakers.contains(&new),
        "{breakers:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cluster_master_failover_moves_its_identities_to_the_promoted_replica() {
    // Without `cluster-require-full-coverage no` every master refuses
    // queries while one shard has no master: the documented setting.
    let cluster = tokio::task::block_in_place(|| {
        support::cluster::start_cluster(6, 1, |_| {
            vec!["--cluster-require-full-coverage".into(), "no".into()]
        })
    });
    let masters: Vec<String> = cluster
        .nodes
        .iter()
        .filter(|n| support::cluster::role(n) == "master")
        .map(|n| n.addr())
        .collect();
    assert_eq!(masters.len(), 3);
    let limiter = Limiter::new(policy(StoreSettings {
        kind: StoreKind::RedisCluster,
        nodes: cluster.urls(),
        timeout: CLUSTER_TIMEOUT,
        ..Default::default()
    }))
    .await
    .expect("a cluster store");
    let victim = masters[0].clone();
    // Identities on the victim's slots, and on the other masters'.
    let mut on_victim = Vec::new();
    let mut elsewhere = Vec::new();
    for i in 0..120 {
        let key = format!("free_spread_{i}");
        let d = limiter.peek(&caller(&key), "free", None).await;
        match shard(&d) {
            Some(s) if s == victim => on_victim.push(key),
            Some(_) => elsewhere.push(key),
            None => panic!("the healthy cluster decides"),
        }
    }
    assert!(on_victim.len() >= 4 && elsewhere.len() >= 6);
    let replica = cluster
        .nodes
        .iter()
        .find(|n| {
            n.cli(&["INFO", "replication"]).contains(&format!(
                "master_port:{}",
                victim.rsplit(':').next().unwrap()
            ))
        })
        .expect("the victim has a replica");
    let promoted = replica.addr();

    let victim_node = cluster
        .nodes
        .iter()
        .position(|n| n.addr() == victim)
        .unwrap();
    let mut cluster = cluster;
    tokio::task::block_in_place(|| cluster.nodes[victim_node].kill());
    let killed = Instant::now();
    let mut round = 0usize;
    let failed_over = loop {
        round += 1;
        // The other shards never stop deciding exactly (admitting or,
        // past the capacity, blocking).
        let other = &elsewhere[1 + round % (elsewhere.len() - 1)];
        let d = timed_check(&limiter, other).await;
        assert!(
            shard(&d).is_some(),
            "a healthy shard fell back: {:?}",
            d.source
        );
        let d = timed_check(&limiter, &on_victim[0]).await;
        if shard(&d).as_deref() == Some(promoted.as_str()) {
            break killed.elapsed();
        }
        assert!(
            killed.elapsed() < Duration::from_secs(30),
            "the promoted replica did not decide 30 s after the kill"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    eprintln!("cluster failover: exact on {promoted} {failed_over:?} after the kill");
    for key in on_victim.iter().skip(1).take(3) {
        exact_on(&limiter, key, &promoted).await;
    }
    let untouched = &elsewhere[0];
    let elsewhere_shard =
        shard(&limiter.peek(&caller(untouched), "free", None).await).expect("decided");
    exact_on(&limiter, untouched, &elsewhere_shard).await;
}

const TIERS: &str = r#"
[[tiers]]
name = "free"
limits = [{ name = "burst", algorithm = "token_bucket", capacity = 10, refill_per_second = 1 }]

[[tiers]]
name = "anonymous"
limits = [{ name = "burst", algorithm = "token_bucket", capacity = 10, refill_per_second = 1 }]
"#;

#[test]
fn a_sentinel_store_is_configured_by_master_name_and_sentinels() {
    let text = format!(
        r#"[store]
kind = "redis-sentinel"
master_name = "rwmaster"
sentinels = ["redis://127.0.0.1:26379", "redis://:s3cret@127.0.0.1:26380"]
password = "master-secret"
{TIERS}"#
    );
    let policy = Policy::from_toml_str(&text, Some("ratewatch.toml")).expect("valid");
    assert_eq!(policy.store.kind, StoreKind::RedisSentinel);
    assert_eq!(policy.store.master_name.as_deref(), Some("rwmaster"));
    assert_eq!(policy.store.sentinels.len(), 2);
    assert_eq!(policy.store.password.as_deref(), Some("master-secret"));
}

#[test]
fn a_sentinel_store_without_master_name_or_sentinels_is_refused_naming_the_field() {
    let missing_name = format!(
        "[store]\nkind = \"redis-sentinel\"\nsentinels = [\"redis://127.0.0.1:26379\"]\n{TIERS}"
    );
    let e = Policy::from_toml_str(&missing_name, Some("ratewatch.toml")).unwrap_err();
    assert_eq!(e.field(), Some("store.master_name"), "{e}");
    assert_eq!(e.line(), Some(1), "{e}");
    let missing_sentinels =
        format!("[store]\nkind = \"redis-sentinel\"\nmaster_name = \"m\"\n{TIERS}");
    let e = Policy::from_toml_str(&missing_sentinels, Some("ratewatch.toml")).unwrap_err();
    assert_eq!(e.field(), Some("store.sentinels"), "{e}");
    let half_mtls = format!(
        "[store]\nkind = \"redis\"\nurl = \"redis://127.0.0.1\"\n\ntls_cert_file = \"c.pem\"\n{TIERS}"
    );
    let e = Policy::from_toml_str(&half_mtls, Some("ratewatch.toml")).unwrap_err();
    assert_eq!(e.field(), Some("store.tls_cert_file"), "{e}");
    assert_eq!(e.line(), Some(5), "{e}");
}

#[test]
fn a_rediss_url_is_accepted_exactly_when_the_build_has_tls() {
    let text = format!(
        "[store]\nkind = \"redis\"\nurl = \"rediss://127.0.0.1:6380\"\ntls_ca_file = \"ca.pem\"\n{TIERS}"
    );
    let parsed = Policy::from_toml_str(&text, Some("ratewatch.toml"));
    if cfg!(feature = "tls") {
        let policy = parsed.expect("rediss:// with the tls feature");
        assert_eq!(
            policy.store.tls.ca_file.as_deref(),
            Some(std::path::Path::new("ca.pem"))
        );
    } else {
        let e = parsed.unwrap_err();
        assert_eq!(e.field(), Some("store.url"));
        assert!(e.to_string().contains("feature `tls`"), "{e}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_master_a_sentinel_names_is_reached_with_the_configured_credentials() {
    use ratewatch::store::{Batch, Item, SentinelStore, Store};
    let set = tokio::task::block_in_place(SentinelSet::start);
    for node in [&set.master, &set.replica] {
        let ok = node.cli(&[
            "ACL",
            "SETUSER",
            "ratewatch",
            "on",
            ">s3cret",
            "~*",
            "&*",
            "+@all",
        ]);
        assert_eq!(ok.trim(), "OK");
    }
    let settings = |password: &str| StoreSettings {
        kind: StoreKind::RedisSentinel,
        sentinels: set.urls(),
        master_name: Some(MASTER_NAME.into()),
        username: Some("ratewatch".into()),
        password: Some(password.into()),
        timeout: Duration::from_millis(500),
        ..Default::default()
    };
    let items = [Item::new(
        support::identity_key("auth", "burst"),
        ratewatch::algorithm::Algorithm::TokenBucket {
            capacity: 5,
            refill_per_second: 1.0,
        },
    )];
    let store = SentinelStore::connect(&settings("s3cret")).await.unwrap();
    let d = store
        .decide(&Batch::consume(&items, 1))
        .await
        .expect("decides");
    assert_eq!(*d.shard, *set.master.addr());
    assert!(
        set.master
            .cli(&["CLIENT", "LIST"])
            .contains("user=ratewatch"),
        "the decision ran as the configured user"
    );
    let wrong = SentinelStore::connect(&settings("wrong")).await.unwrap();
    assert!(wrong.decide(&Batch::consume(&items, 1)).await.is_err());
}
