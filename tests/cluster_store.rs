//! The Redis Cluster store on a real 3-master cluster: identities spread
//! over every master, decisions exact and labelled with the master that
//! served them, limits in other slots all or nothing, reloads transparent.

mod support;

use support::identity_key as key;

use std::collections::BTreeSet;
use std::time::Duration;

use ratewatch::algorithm::Algorithm;
use ratewatch::policy::StoreSettings;
use ratewatch::store::{Batch, ClusterStore, Item, Store, keys, slot_of};
use support::RedisCluster;

async fn store(cluster: &RedisCluster) -> ClusterStore {
    ClusterStore::connect(&StoreSettings {
        nodes: cluster.urls(),
        timeout: Duration::from_secs(2),
        ..StoreSettings::default()
    })
    .await
    .expect("connect")
}

fn bucket(key: String, capacity: u64) -> Item {
    Item::new(
        key,
        Algorithm::TokenBucket {
            capacity,
            refill_per_second: 0.000_001,
        },
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_identities_spread_over_every_master_and_decide_exactly() {
    let cluster = RedisCluster::start();
    let store = store(&cluster).await;
    let mut masters = BTreeSet::new();
    for n in 0..100 {
        let id = format!("client-{n}");
        let items = [
            bucket(key(&id, "burst"), 3),
            Item::new(
                key(&id, "minute"),
                Algorithm::SlidingWindow {
                    limit: 50,
                    window_us: 60_000_000,
                },
            ),
        ];
        let owner = cluster.node_for(&items[0].key).addr();
        assert_eq!(store.shard_for(&items[0].key).as_ref(), owner);
        for i in 0..4 {
            let d = store
                .decide(&Batch::consume(&items, 1))
                .await
                .expect("no CROSSSLOT, no error");
            assert_eq!(d.allowed, i < 3, "identity {n} request {i}");
            assert_eq!(
                d.shard.as_ref(),
                owner,
                "labelled with the master owning the key"
            );
        }
        masters.insert(owner);
    }
    assert_eq!(masters.len(), 3, "identities land on all three masters");
}

/// An identity limit, an IP limit and a route limit: three hash tags.
fn mixed(identity: &str, identity_cap: u64, ip_cap: u64) -> Vec<Item> {
    let ip = keys::hash_identity("ip", &format!("203.0.113.7/{identity}"));
    vec![
        bucket(key(identity, "burst"), identity_cap),
        Item::new(
            key(identity, "log"),
            Algorithm::SlidingLog {
                limit: identity_cap,
                window_us: 60_000_000,
            },
        ),
        bucket(
            keys::ip_key("rw", &ip, &keys::limit_code(None, "per-ip", "tb")),
            ip_cap,
        ),
        Item::new(
            keys::route_key(
                "rw",
                &keys::hash_route(Some("POST"), "/api/export")[..keys::ROUTE_TAG_HEX],
                &keys::limit_code(None, "route", "gc"),
            ),
            Algorithm::Gcra {
                rate_per_second: 0.001,
                burst: 100,
            },
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_in_other_slots_are_all_or_nothing_thanks_to_refunds() {
    let cluster = RedisCluster::start();
    let store = store(&cluster).await;
    let items = mixed("mixed", 5, 2);
    let slots: BTreeSet<u16> = items.iter().map(|i| slot_of(&i.key)).collect();
    assert_eq!(slots.len(), 3, "identity, ip and route live in three slots");

    // The IP limit blocks the third request: the identity and route groups
    // admitted it in their own slots and must give it back.
    for _ in 0..2 {
        assert!(support::consume(&store, &items, 1).await.allowed);
    }
    for _ in 0..3 {
        let d = support::consume(&store, &items, 1).await;
        assert!(!d.allowed && !d.verdicts[2].allowed);
        assert_eq!(d.verdicts[0].remaining.floor(), 3.0);
    }
    let peek = support::peek(&store, &items).await;
    let left: Vec<f64> = peek.verdicts.iter().map(|v| v.remaining.floor()).collect();
    assert_eq!(
        left,
        [3.0, 3.0, 0.0, 98.0],
        "only the two admitted requests count"
    );
    let log_node = cluster.node_for(&items[1].key);
    assert_eq!(
        log_node.cli(&["ZCARD", &items[1].key]).trim(),
        "2",
        "refund removed its members"
    );

    // The other way round: the identity blocks, the IP limit is refunded.
    let items = mixed("mixed-again", 1, 10);
    assert!(support::consume(&store, &items, 1).await.allowed);
    let d = support::consume(&store, &items, 1).await;
    assert!(!d.allowed && !d.verdicts[0].allowed && d.verdicts[2].allowed);
    let peek = support::peek(&store, &items).await;
    assert_eq!(
        peek.verdicts[2].remaining.floor(),
        9.0,
        "the IP limit kept its tokens"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn window_counters_are_refunded_in_their_own_layout_also_past_65536() {
    let cluster = RedisCluster::start();
    let store = store(&cluster).await;
    let hour = 3_600_000_000;
    let ip = keys::hash_identity("ip", "203.0.113.8/windows");
    let items = [
        Item::new(
            key("windows", "day"),
            Algorithm::FixedWindow {
                limit: 200_000,
                window_us: hour,
            },
        ),
        Item::new(
            key("windows", "minute"),
            Algorithm::SlidingWindow {
                limit: 200_000,
                window_us: hour,
            },
        ),
        bucket(
            keys::ip_key("rw", &ip, &keys::limit_code(None, "per-ip", "tb")),
            100_000,
        ),
    ];
    assert_ne!(slot_of(&items[0].key), slot_of(&items[2].key));
    // Two requests of 40 000 pass (the sliding window's count, 80 000, takes
    // its wide layout); the third blocks on the IP bucket, and the windows,
    // which admitted it in their own slot, give it back.
    for _ in 0..2 {
        assert!(support::consume(&store, &items, 40_000).await.allowed);
    }
    let d = support::consume(&store, &items, 40_000).await;
    assert!(!d.allowed && d.verdicts[0].allowed && !d.verdicts[2].allowed);
    let peek = support::peek(&store, &items).await;
    assert_eq!(
        peek.verdicts[0].remaining, 120_000.0,
        "fixed window refunded"
    );
    assert_eq!(
        peek.verdicts[1].remaining, 120_000.0,
        "sliding window refunded"
    );
    let node = cluster.node_for(&items[1].key);
    assert_eq!(node.cli(&["STRLEN", &items[1].key]).trim(), "24");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flushed_script_is_reloaded_transparently_on_the_cluster() {
    let cluster = RedisCluster::start();
    let store = store(&cluster).await;
    let items = [bucket(key("flushed", "burst"), 5)];
    assert!(support::consume(&store, &items, 1).await.allowed);
    let before: u64 = store.script_reloads().iter().map(|(_, n)| n).sum();
    for node in &cluster.nodes {
        node.cli(&["SCRIPT", "FLUSH"]);
    }
    let d = store
        .decide(&Batch::consume(&items, 1))
        .await
        .expect("decide after flush");
    assert!(d.allowed);
    assert_eq!(d.verdicts[0].remaining.floor(), 3.0);
    let after: u64 = store.script_reloads().iter().map(|(_, n)| n).sum();
    assert_eq!(after, before + 1, "one reload, counted");
    let owner = cluster.node_for(&items[0].key).addr();
    assert!(
        store
            .script_reloads()
            .iter()
            .any(|(s, _)| s.as_ref() == owner)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_made_while_the_cluster_is_down_decides_once_it_is_up() {
    let mut cluster = RedisCluster::start();
    for node in &mut cluster.nodes {
        node.kill();
    }
    let started = std::time::Instant::now();
    let store = ClusterStore::connect(&StoreSettings {
        nodes: cluster.urls(),
        timeout: Duration::from_millis(100),
        ..StoreSettings::default()
    })
    .await
    .expect("connect does not need the cluster");
    assert!(started.elapsed() < Duration::from_secs(2));
    let items = [bucket(key("late", "burst"), 3)];
    let started = std::time::Instant::now();
    assert!(store.decide(&Batch::consume(&items, 1)).await.is_err());
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "errors promptly"
    );

    // The nodes keep their cluster configuration across the restart.
    for node in &mut cluster.nodes {
        node.restart();
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        if let Ok(d) = store.decide(&Batch::consume(&items, 1)).await {
            assert!(d.allowed);
            assert_eq!(d.shard.as_ref(), cluster.node_for(&items[0].key).addr());
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no decision once the cluster is up"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
