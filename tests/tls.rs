//! `rediss://` against real redis-server processes serving TLS with a
//! throwaway CA: a single node (with and without client certificates) and
//! a Redis Cluster decide exactly over TLS, and a server the CA did not
//! sign is refused.
#![cfg(feature = "tls")]

mod support;

use std::time::Duration;

use ratewatch::algorithm::Algorithm;
use ratewatch::policy::{StoreKind, StoreSettings, TlsFiles};
use ratewatch::store::{Batch, ClusterStore, Item, RedisStore, Store};
use support::identity_key as key;
use support::tls::{Certs, TlsRedis};

fn bucket(identity: &str, capacity: u64) -> Item {
    Item::new(
        key(identity, "burst"),
        Algorithm::TokenBucket {
            capacity,
            refill_per_second: 0.000_001,
        },
    )
}

fn settings(url: String, tls: TlsFiles) -> StoreSettings {
    StoreSettings {
        kind: StoreKind::Redis,
        url: Some(url),
        tls,
        timeout: Duration::from_secs(2),
        ..Default::default()
    }
}

fn trusting(certs: &Certs) -> TlsFiles {
    TlsFiles {
        ca_file: Some(certs.ca()),
        ..Default::default()
    }
}

/// `capacity` admitted, then one blocked.
async fn admits_exactly(store: &dyn Store, identity: &str, capacity: u64) {
    let items = [bucket(identity, capacity)];
    for n in 0..capacity {
        let d = support::consume(store, &items, 1).await;
        assert!(d.allowed, "request {n} of {capacity} admitted");
    }
    assert!(!support::consume(store, &items, 1).await.allowed);
}

#[tokio::test]
async fn a_redis_serving_only_tls_decides_exactly_over_rediss_with_the_test_ca() {
    let certs = Certs::generate();
    let redis = TlsRedis::start(&certs, false);
    let store = RedisStore::connect(&settings(redis.url(), trusting(&certs)))
        .await
        .expect("a rediss:// store");
    admits_exactly(&store, "tls-node", 10).await;
    assert!(
        redis.server.command_calls("evalsha") >= 11,
        "the decisions ran on the TLS server"
    );
    // The TLS port speaks nothing but TLS.
    let plain = RedisStore::connect(&StoreSettings {
        url: Some(format!("redis://127.0.0.1:{}", redis.tls_port)),
        timeout: Duration::from_millis(300),
        ..settings(String::new(), TlsFiles::default())
    })
    .await
    .unwrap();
    let items = [bucket("plain", 1)];
    assert!(plain.decide(&Batch::consume(&items, 1)).await.is_err());
}

#[tokio::test]
async fn a_server_certificate_the_ca_did_not_sign_is_refused() {
    let certs = Certs::generate();
    let other = Certs::generate();
    let redis = TlsRedis::start(&certs, false);
    let store = RedisStore::connect(&StoreSettings {
        timeout: Duration::from_millis(500),
        ..settings(redis.url(), trusting(&other))
    })
    .await
    .unwrap();
    let items = [bucket("mitm", 1)];
    let err = store
        .decide(&Batch::consume(&items, 1))
        .await
        .expect_err("an unknown issuer is refused");
    assert!(err.is_transient(), "{err}");
    assert_eq!(redis.server.command_calls("evalsha"), 0);
}

#[tokio::test]
async fn mutual_tls_presents_the_client_certificate() {
    let certs = Certs::generate();
    let redis = TlsRedis::start(&certs, true);
    let without = RedisStore::connect(&StoreSettings {
        timeout: Duration::from_millis(500),
        ..settings(redis.url(), trusting(&certs))
    })
    .await
    .unwrap();
    let items = [bucket("no-client-cert", 1)];
    assert!(
        without.decide(&Batch::consume(&items, 1)).await.is_err(),
        "the server requires a client certificate"
    );
    let with = RedisStore::connect(&settings(
        redis.url(),
        TlsFiles {
            ca_file: Some(certs.ca()),
            cert_file: Some(certs.client_cert()),
            key_file: Some(certs.client_key()),
        },
    ))
    .await
    .unwrap();
    admits_exactly(&with, "mtls", 5).await;
}

#[tokio::test]
async fn a_tls_cluster_decides_exactly_on_every_master() {
    let certs = Certs::generate();
    let cluster = support::tls::TlsCluster::start(&certs);
    let store = ClusterStore::connect(&StoreSettings {
        kind: StoreKind::RedisCluster,
        nodes: cluster.urls(),
        tls: trusting(&certs),
        timeout: Duration::from_secs(2),
        ..Default::default()
    })
    .await
    .expect("a rediss:// cluster store");
    assert_eq!(store.masters().len(), 3, "{:?}", store.masters());
    // Enough identities that their hash tags land on every master.
    for i in 0..24 {
        admits_exactly(&store, &format!("tls-cluster-{i}"), 3).await;
    }
    for node in &cluster.cluster.nodes {
        assert!(
            node.command_calls("evalsha") > 0,
            "every master decided over TLS"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sentinel_deployment_behind_tls_decides_on_its_master_and_follows_a_failover() {
    use support::sentinel::{MASTER_NAME, SentinelSet};
    let certs = Certs::generate();
    let mut set = tokio::task::block_in_place(|| SentinelSet::start_tls(&certs));
    let store = ratewatch::store::SentinelStore::connect(&StoreSettings {
        kind: StoreKind::RedisSentinel,
        sentinels: set.tls_urls(),
        master_name: Some(MASTER_NAME.into()),
        tls: trusting(&certs),
        timeout: Duration::from_millis(500),
        ..Default::default()
    })
    .await
    .expect("a rediss:// sentinel store");
    // The sentinels name the master by its TLS port.
    let master_tls = store
        .master_shard()
        .expect("the sentinels named the master");
    assert_ne!(*master_tls, *set.master.addr(), "not the plain port");
    admits_exactly(&store, "tls-sentinel", 5).await;
    assert!(set.master.command_calls("evalsha") >= 6);

    tokio::task::block_in_place(|| set.master.kill());
    // The failover is followed over TLS: the breaker's probe (called here
    // directly) asks the sentinels and proves the new master decides.
    let started = std::time::Instant::now();
    while store.probe(&master_tls).await.is_err()
        || store.master_shard() == Some(master_tls.clone())
    {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no failover to the replica over TLS"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    admits_exactly(&store, "tls-sentinel-after", 5).await;
    assert!(
        set.replica.command_calls("evalsha") >= 6,
        "decided on the promoted replica"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fleet_view_is_flushed_over_tls_with_the_same_ca() {
    use ratewatch::identity::{Identity, IdentityKind};
    use ratewatch::policy::{Limit, Policy, Tier};
    let certs = Certs::generate();
    let redis = TlsRedis::start(&certs, false);
    let policy = Policy::builder()
        .store(StoreSettings {
            timeout: Duration::from_millis(500),
            ..settings(redis.url(), trusting(&certs))
        })
        .tier(
            Tier::new("free")
                .match_prefix("free_")
                .limit(Limit::token_bucket("burst", 3, 0.001)),
        )
        .tier(Tier::new("anonymous").limit(Limit::token_bucket("burst", 3, 0.001)))
        .build()
        .unwrap();
    let limiter = ratewatch::Limiter::new(policy).await.unwrap();
    let caller = Identity::new(IdentityKind::ApiKey, "free_tls_fleet");
    for _ in 0..5 {
        limiter.check(&caller, "free", None).await;
    }
    limiter.telemetry().flush().await;
    let keys = redis.server.cli(&["--scan", "--pattern", "rw:tm:*"]);
    assert!(
        keys.lines().count() > 0,
        "the fleet view reached the TLS server"
    );
}
