//! `ratewatch demo` sends traffic that looks like a real fleet: clients
//! from their own addresses, in every tier, and one abusive key that its
//! own limits block.

mod support;

use std::time::{Duration, Instant};

use serde_json::Value;
use support::Ratewatch;

/// Sum of one tier's decisions over every outcome.
fn tier_decisions(stats: &Value, tier: &str) -> u64 {
    stats["totals"][tier]
        .as_object()
        .map(|o| o.values().filter_map(Value::as_u64).sum())
        .unwrap_or(0)
}

/// The free-tier identity with the most decisions: the abusive key, which
/// sends a hundred times what any free user does.
fn busiest_free_key(stats: &Value) -> Option<String> {
    stats["hot_keys"]
        .as_array()?
        .iter()
        .filter(|k| k["tier"] == "free")
        .max_by_key(|k| k["decisions"].as_u64().unwrap_or(0))
        .and_then(|k| k["identity"].as_str().map(str::to_owned))
}

#[tokio::test]
async fn the_demo_fleet_is_blocked_by_the_abusers_own_limit_not_a_shared_address() {
    // The shipped policy with the enterprise tier's per-address ceiling
    // scaled from a day to a minute: traffic from one shared address
    // reaches it within seconds (as the daily one would within the hour),
    // traffic spread over the enterprise's own addresses does not.
    let shipped =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/ratewatch.toml")).unwrap();
    let ceiling = r#"{ name = "ip_minute", algorithm = "sliding_window", limit = 6000,"#;
    assert!(shipped.contains(ceiling), "the enterprise ceiling moved");
    let policy = support::policy_file(&shipped.replace(
        ceiling,
        r#"{ name = "ip_minute", algorithm = "sliding_window", limit = 300,"#,
    ));
    let server = Ratewatch::start("demo", Some(policy.path()), &[]);
    let client = reqwest::Client::new();
    let url = format!("{}/dashboard/api/stats?range=5m", server.url());
    let tiers = ["free", "pro", "enterprise", "anonymous"];
    let deadline = Instant::now() + Duration::from_secs(60);
    let stats = loop {
        let stats: Value = client.get(&url).send().await.unwrap().json().await.unwrap();
        let tiers_seen = tiers.iter().all(|t| tier_decisions(&stats, t) > 0);
        let blocked_enough = stats["top_blocked"][0]["blocked"].as_u64().unwrap_or(0) >= 200;
        if tiers_seen && blocked_enough {
            break stats;
        }
        assert!(
            Instant::now() < deadline,
            "the demo did not fill the fleet view in 60 s: {stats:#}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let top = &stats["top_blocked"][0];
    let cause = top["cause"].as_str().unwrap();
    assert!(
        cause == "burst" || cause == "minute",
        "the top block is the abusive key's own limit, not {cause}: {stats:#}"
    );
    assert_eq!(
        top["identity"].as_str(),
        busiest_free_key(&stats).as_deref(),
        "the most blocked identity is the abusive free key: {stats:#}"
    );
    let causes = stats["blocked_by_cause"].as_object().unwrap();
    let (top_cause, _) = causes
        .iter()
        .max_by_key(|(_, n)| n.as_u64().unwrap_or(0))
        .unwrap();
    assert!(
        !top_cause.starts_with("ip_"),
        "the top block cause is not a per-address ceiling: {stats:#}"
    );
    // Every anonymous visitor is its own address, so its own identity.
    let anonymous = stats["hot_keys"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|k| k["tier"] == "anonymous")
        .count();
    assert!(anonymous >= 4, "{anonymous} anonymous addresses: {stats:#}");
    for tier in tiers {
        assert!(
            tier_decisions(&stats, tier) > 0,
            "{tier} has no traffic: {stats:#}"
        );
    }
    // Well-behaved free users stay under their tier's refill: only the
    // abuser among free keys is blocked.
    let blocked_free: Vec<_> = stats["top_blocked"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|k| k["identity"].as_str().is_some_and(|i| i.starts_with("fr")))
        .collect();
    assert_eq!(blocked_free.len(), 1, "one free key blocked: {stats:#}");
    server.stop();
}
