//! Redis Clusters with options the plain three-master helper lacks:
//! replicas (for failover) and extra per-node arguments (TLS).

use std::process::Command;
use std::time::{Duration, Instant};

use super::{RedisCluster, RedisServer, require};

/// Starts `nodes` cluster-enabled nodes, node `i` with `extra(i)` added to
/// its arguments, creates a cluster with `replicas` replicas per master
/// (`redis-cli --cluster create`), and waits until every node reports
/// `cluster_state:ok` and sees every master with its replicas.
pub fn start_cluster(
    nodes: usize,
    replicas: usize,
    extra: impl Fn(usize) -> Vec<String>,
) -> RedisCluster {
    let nodes: Vec<RedisServer> = (0..nodes)
        .map(|i| {
            let mut args: Vec<String> = [
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                "1000",
                // A replica syncs at once (the default waits 5 s for
                // others), so it can be promoted as soon as the test wants.
                "--repl-diskless-sync-delay",
                "0",
            ]
            .map(String::from)
            .to_vec();
            args.extend(extra(i));
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            RedisServer::start_with(&args)
        })
        .collect();
    let addrs: Vec<String> = nodes.iter().map(|n| n.addr()).collect();
    let out = Command::new(require("redis-cli"))
        .args(["--cluster", "create"])
        .args(&addrs)
        .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
        .output()
        .expect("run redis-cli --cluster create");
    assert!(
        out.status.success(),
        "cluster create failed: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    for n in &nodes {
        loop {
            let info = n.cli(&["CLUSTER", "INFO"]);
            let known = n
                .cli(&["CLUSTER", "NODES"])
                .lines()
                .filter(|l| l.contains("connected"))
                .count();
            if info.contains("cluster_state:ok") && known == addrs.len() {
                break;
            }
            assert!(Instant::now() < deadline, "cluster did not reach state ok");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    for n in &nodes {
        while role(n) == "slave"
            && !n
                .cli(&["INFO", "replication"])
                .contains("master_link_status:up")
        {
            assert!(Instant::now() < deadline, "a replica never synced");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    RedisCluster { nodes }
}

/// The role of the node on `port`: `master` or `slave`.
pub fn role(node: &RedisServer) -> String {
    node.cli(&["ROLE"])
        .lines()
        .next()
        .unwrap_or_default()
        .trim()
        .to_owned()
}
