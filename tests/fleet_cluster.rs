//! A lost Redis Cluster master marks only its part of the fleet view stale:
//! on a real 3-master cluster with two `ratewatch serve` instances, the
//! page keeps the fleet's view of the buckets the surviving masters hold
//! and shades the lost master's buckets, instead of dropping to the
//! single-instance view.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::Value;
use support::{Ratewatch, RedisCluster, eventually, get_json};

fn config(dir: &Path, nodes: &[String]) -> PathBuf {
    let path = dir.join("cluster.toml");
    let nodes: Vec<String> = nodes.iter().map(|u| format!("\"{u}\"")).collect();
    std::fs::write(
        &path,
        format!(
            r#"
[store]
kind = "redis-cluster"
nodes = [{}]
timeout_ms = 200

[resilience]
on_store_failure = "open"

[identity]
trusted_proxies = []

[telemetry]
flush_interval_ms = 200

[[tiers]]
name = "free"
match_prefix = "free_"
limits = [{{ name = "burst", algorithm = "token_bucket", capacity = 100000, refill_per_second = 10000 }}]

[[tiers]]
name = "anonymous"
limits = [{{ name = "burst", algorithm = "token_bucket", capacity = 1000, refill_per_second = 100 }}]
"#,
            nodes.join(", ")
        ),
    )
    .expect("write config");
    path
}

/// Decisions per bucket start, over every tier and outcome.
fn per_bucket(stats: &Value) -> BTreeMap<u64, u64> {
    let starts: Vec<u64> = stats["bucket_starts"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_u64).collect())
        .unwrap_or_default();
    let mut out: BTreeMap<u64, u64> = BTreeMap::new();
    for outcomes in stats["series"]
        .as_object()
        .into_iter()
        .flat_map(|t| t.values())
    {
        for values in outcomes.as_object().into_iter().flat_map(|o| o.values()) {
            for (start, n) in starts.iter().zip(values.as_array().into_iter().flatten()) {
                *out.entry(*start).or_insert(0) += n.as_u64().unwrap_or(0);
            }
        }
    }
    out.retain(|_, n| *n > 0);
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lost_cluster_master_marks_only_its_buckets_stale_and_the_rest_stays_the_fleets() {
    let mut cluster = tokio::task::block_in_place(RedisCluster::start);
    // Without this Redis itself refuses every slot once a master is marked
    // failed, and no shard answers.
    for n in &cluster.nodes {
        n.cli(&["CONFIG", "SET", "cluster-require-full-coverage", "no"]);
    }
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), &cluster.urls());
    let a = Ratewatch::start("serve", Some(&cfg), &[("RATEWATCH_INSTANCE", "edge-a")]);
    let b = Ratewatch::start("serve", Some(&cfg), &[("RATEWATCH_INSTANCE", "edge-b")]);
    let stop = Arc::new(AtomicBool::new(false));
    let mut traffic = Vec::new();
    for (base, key) in [(a.url(), "free_cluster_a"), (b.url(), "free_cluster_b")] {
        let stop = stop.clone();
        traffic.push(tokio::spawn(async move {
            let client = reqwest::Client::new();
            while !stop.load(Ordering::SeqCst) {
                let _ = client
                    .get(format!("{base}/api/users"))
                    .header("x-api-key", key)
                    .send()
                    .await;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }));
    }
    let client = reqwest::Client::new();
    let stats_url = format!("{}/dashboard/api/stats?range=5m", a.url());
    // The master holding each bucket's keys (the bucket is the hash tag).
    let owner_of =
        |start: u64| -> u16 { cluster.node_for(&format!("rw:tm:{{10s:{start}}}:c")).port };
    // Wait for complete buckets with data on at least two masters.
    let (before, owners) = eventually(
        Duration::from_secs(60),
        "complete buckets with data on two masters",
        || async {
            let s = get_json(&client, &stats_url).await?;
            if s["source"]["kind"] != "fleet" {
                return None;
            }
            let now = ratewatch::telemetry::unix_now();
            let mut done = per_bucket(&s);
            done.retain(|start, _| start + 10 < now);
            let owners: BTreeMap<u64, u16> = done.keys().map(|t| (*t, owner_of(*t))).collect();
            let masters: BTreeSet<u16> = owners.values().copied().collect();
            (masters.len() >= 2).then_some((done, owners))
        },
    )
    .await;
    // The victim: the master of the newest complete bucket.
    let newest = *before.keys().next_back().unwrap();
    let victim_port = owners[&newest];
    let lost: BTreeSet<u64> = owners
        .iter()
        .filter(|(_, p)| **p == victim_port)
        .map(|(t, _)| *t)
        .collect();
    let kept: BTreeSet<u64> = owners
        .iter()
        .filter(|(_, p)| **p != victim_port)
        .map(|(t, _)| *t)
        .collect();
    let victim = cluster
        .nodes
        .iter_mut()
        .find(|n| n.port == victim_port)
        .unwrap();
    tokio::task::block_in_place(|| victim.kill());

    let after = eventually(
        Duration::from_secs(30),
        "the fleet view with the lost master's buckets stale",
        || async {
            let s = get_json(&client, &stats_url).await?;
            let stale: BTreeSet<u64> = s["source"]["stale_buckets"]
                .as_array()?
                .iter()
                .filter_map(Value::as_u64)
                .collect();
            (s["source"]["kind"] == "fleet" && lost.is_subset(&stale)).then_some(s)
        },
    )
    .await;
    stop.store(true, Ordering::SeqCst);
    assert!(
        after["source"]["fleet_unavailable"].is_null(),
        "not the single-instance view: {}",
        after["source"]
    );
    let stale: BTreeSet<u64> = after["source"]["stale_buckets"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_u64)
        .collect();
    assert!(
        stale.is_disjoint(&kept),
        "buckets on surviving masters are not stale: stale {stale:?}, kept {kept:?}"
    );
    assert!(
        !after["source"]["stale_reason"]
            .as_str()
            .unwrap_or("")
            .is_empty()
    );
    // The surviving masters' buckets still hold both instances' decisions:
    // read from Redis, not from this instance's own view.
    let now = per_bucket(&after);
    for t in &kept {
        assert!(
            now.get(t).copied().unwrap_or(0) >= before[t],
            "bucket {t}: {:?} after, {} before",
            now.get(t),
            before[t]
        );
    }

    // The page says so, and does not show the single-instance banner.
    let url = format!("{}/dashboard?range=5m", a.url());
    let (dom, log) = tokio::task::spawn_blocking(move || support::dump_dom(&url, 4_000))
        .await
        .unwrap();
    assert!(!log.contains("Uncaught"), "{log}");
    let partial = dom.split("id=\"partial\"").nth(1).expect("partial note");
    assert!(
        !partial[..partial.find('>').unwrap()].contains("hidden"),
        "the stale part is announced: {partial:.300}"
    );
    assert!(dom.contains("Part of the fleet view is stale"));
    let banner = dom.split("id=\"banner\"").nth(1).expect("banner");
    assert!(
        banner[..banner.find('>').unwrap()].contains("hidden"),
        "not the single-instance view"
    );
    assert!(
        dom.contains("class=\"stale-bucket\""),
        "stale buckets shaded"
    );
    assert!(dom.contains("fleet (partial)"));
    for t in traffic {
        t.await.unwrap();
    }
}
