//! The test support itself: servers start, answer, and die when told.
mod support;

#[test]
fn a_cluster_spreads_slots_over_three_masters_and_names_the_owner() {
    let cluster = support::RedisCluster::start();
    let mut owners = std::collections::HashSet::new();
    for i in 0..30 {
        owners.insert(cluster.node_for(&format!("{{id{i}}}:k")).port);
    }
    assert_eq!(owners.len(), 3);
}

#[test]
fn a_killed_server_stops_answering_and_a_restarted_one_answers_again() {
    let mut s = support::RedisServer::start();
    assert_eq!(s.cli(&["PING"]).trim(), "PONG");
    s.kill();
    assert_ne!(s.cli(&["PING"]).trim(), "PONG");
    s.restart();
    assert_eq!(s.cli(&["PING"]).trim(), "PONG");
}
