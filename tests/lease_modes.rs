//! Lease modes against a real Redis, in process: a remembered refusal
//! costs no round trip, unspent units go back at shutdown, a route-wide
//! ceiling goes into lease mode by itself when hot, and `mode` errors name
//! the file, line and field.

mod support;

use ratewatch::identity::{Identity, IdentityKind};
use ratewatch::policy::{LeaseMode, Limit, Policy, Scope};
use ratewatch::{DecisionPath, Limiter};
use std::time::Duration;

use support::RedisServer;

async fn limiter(redis: &RedisServer, limits: &str, extra: &str) -> Limiter {
    Limiter::new(policy(redis, limits, extra))
        .await
        .expect("limiter")
}

fn policy(redis: &RedisServer, limits: &str, extra: &str) -> Policy {
    let text = format!(
        r#"
[store]
kind = "redis"
url = "{}"
timeout_ms = 2000

[resilience]
expected_instances = 1
{extra}

[[tiers]]
name = "free"
match_prefix = "free_"
limits = [{limits}]

[[tiers]]
name = "anonymous"
limits = [{{ name = "burst", algorithm = "token_bucket", capacity = 5, refill_per_second = 1 }}]
"#,
        redis.url()
    );
    Policy::from_toml_str(&text, Some("leases.toml")).expect("policy")
}

fn caller() -> Identity {
    Identity::new(IdentityKind::ApiKey, "free_lease_test_key")
}

#[tokio::test]
async fn a_refused_key_is_answered_locally_until_its_retry_time() {
    let redis = RedisServer::start();
    let l = limiter(
        &redis,
        r#"{ name = "minute", algorithm = "fixed_window", limit = 3, window = "1h", mode = "auto" }"#,
        "",
    )
    .await;
    for _ in 0..3 {
        assert!(l.check(&caller(), "free", None).await.allowed);
    }
    let first = l.check(&caller(), "free", None).await;
    assert!(!first.allowed);
    assert_eq!(first.path, DecisionPath::Store);
    let calls = redis.command_calls("evalsha");
    for _ in 0..20 {
        let d = l.check(&caller(), "free", None).await;
        assert!(!d.allowed);
        assert_eq!(d.path, DecisionPath::Local);
        let retry = d.retry_after.expect("a refusal says when to retry");
        assert!(!retry.is_zero() && retry <= first.retry_after.unwrap());
    }
    assert_eq!(
        redis.command_calls("evalsha"),
        calls,
        "still blocked cost a round trip"
    );
}

#[tokio::test]
async fn an_exact_key_asks_the_store_every_time() {
    let redis = RedisServer::start();
    let l = limiter(
        &redis,
        r#"{ name = "minute", algorithm = "fixed_window", limit = 3, window = "60s" }"#,
        "",
    )
    .await;
    for _ in 0..3 {
        l.check(&caller(), "free", None).await;
    }
    let calls = redis.command_calls("evalsha");
    for _ in 0..5 {
        assert_eq!(
            l.check(&caller(), "free", None).await.path,
            DecisionPath::Store
        );
    }
    assert_eq!(redis.command_calls("evalsha"), calls + 5);
}

/// The one limit key's window count in Redis.
fn window_count(redis: &RedisServer) -> u64 {
    count_of(redis, "minute")
}

/// The window count of tier `free`'s fixed-window limit named `name` in
/// Redis: its key ends with the limit's code.
fn count_of(redis: &RedisServer, name: &str) -> u64 {
    let code = ratewatch::store::keys::limit_code(Some("free"), name, "fw");
    let keys = redis.cli(&["--scan", "--pattern", &format!("rw:{{*}}:{code}")]);
    let key = keys
        .lines()
        .next()
        .expect("the limit's key")
        .trim()
        .to_owned();
    support::window_count(redis.port, &key).unwrap_or_else(|| panic!("count of {key}"))
}

#[tokio::test]
async fn unspent_lease_units_go_back_at_shutdown() {
    let redis = RedisServer::start();
    let l = limiter(
        &redis,
        r#"{ name = "minute", algorithm = "fixed_window", limit = 4000, window = "60s", mode = "leased" }"#,
        "[leases]\nrenew_ms = 100\nttl_ms = 1000",
    )
    .await;
    let mut local = 0;
    for _ in 0..300 {
        let d = l.check(&caller(), "free", None).await;
        assert!(d.allowed);
        local += usize::from(d.path == DecisionPath::Local);
    }
    assert!(local > 150, "only {local} of 300 were spent from leases");
    // Paid ahead: Redis holds more than was admitted (unless a window
    // roll intervened, which a 60 s window makes rare: then it is less).
    let charged = window_count(&redis);
    l.shutdown().await;
    let after = window_count(&redis);
    assert!(
        after <= 300 && after < charged,
        "charged {charged}, after shutdown {after}"
    );
    if charged > 300 {
        assert_eq!(after, 300, "every unspent unit goes back");
    }
}

#[tokio::test]
async fn a_route_wide_ceiling_goes_into_lease_mode_when_hot_by_itself() {
    let redis = RedisServer::start();
    let text = format!(
        r#"
[store]
kind = "redis"
url = "{}"
timeout_ms = 2000

[[tiers]]
name = "free"
match_prefix = "free_"
limits = [{{ name = "burst", algorithm = "token_bucket", capacity = 100000, refill_per_second = 100000 }}]

[[tiers]]
name = "anonymous"
limits = [{{ name = "burst", algorithm = "token_bucket", capacity = 5, refill_per_second = 1 }}]

[[routes]]
path = "/search"
limits = [{{ name = "all", algorithm = "fixed_window", limit = 1000000, window = "60s", scope = "route" }}]
"#,
        redis.url()
    );
    let policy = Policy::from_toml_str(&text, Some("auto.toml")).unwrap();
    assert_eq!(
        policy.routes[0].limits[0].effective_mode(),
        Some(LeaseMode::Auto)
    );
    let l = Limiter::new(policy).await.unwrap();
    let route = l.route_for("GET", "/search");
    let mut local = 0;
    for i in 0..2000 {
        let d = l.check(&caller(), "free", route.clone()).await;
        assert!(d.allowed, "request {i}");
        local += usize::from(d.path == DecisionPath::Local);
    }
    assert!(local > 1000, "only {local} of 2000 hot requests were local");
    // Hottest first: the identity's own lease. The ceiling's lease (shown
    // as `*`) may also be there, taken before the identity was hot.
    let hot = l.hot_keys();
    assert!(
        hot.iter().filter(|h| h.identity != "*").count() == 1,
        "{hot:?}"
    );
    assert_ne!(hot[0].identity, "*", "{hot:?}");
    assert_eq!(hot[0].route, "/search");
    assert!(
        !hot[0].identity.contains("free_lease_test_key"),
        "raw key shown"
    );
}

#[test]
fn route_scope_limits_default_to_auto_and_others_follow() {
    let second = std::time::Duration::from_secs(1);
    let route = Limit::fixed_window("all", 10, second).with_scope(Scope::Route);
    assert_eq!(route.effective_mode(), Some(LeaseMode::Auto));
    let exact = route.clone().with_mode(LeaseMode::Exact);
    assert_eq!(exact.effective_mode(), Some(LeaseMode::Exact));
    let ident = Limit::fixed_window("x", 10, second);
    assert_eq!(ident.effective_mode(), None);
    let of = |limits: &[&Limit], route_mode| {
        LeaseMode::of_request(route_mode, limits.iter().map(|l| l.effective_mode()))
    };
    // A tier's limits without a mode follow a route-wide ceiling's auto.
    assert_eq!(of(&[&ident, &route], None), LeaseMode::Auto);
    assert_eq!(of(&[&ident], None), LeaseMode::Exact);
    assert_eq!(of(&[&ident, &exact], None), LeaseMode::Exact);
    let leased = ident.clone().with_mode(LeaseMode::Leased);
    assert_eq!(of(&[&leased, &route], None), LeaseMode::Leased);
    assert_eq!(
        of(&[&leased, &route], Some(LeaseMode::Exact)),
        LeaseMode::Exact
    );
}

#[test]
fn a_mode_error_names_the_file_line_and_field() {
    let text = r#"
[[tiers]]
name = "anonymous"
limits = [
  { name = "exact", algorithm = "sliding_log", limit = 5, window = "10s", mode = "leased" },
]
"#;
    let err = Policy::from_toml_str(text, Some("p.toml")).unwrap_err();
    assert_eq!(err.field(), Some("tiers[0].limits[0].mode"));
    assert_eq!(err.line(), Some(5));
    assert!(err.to_string().contains("p.toml"), "{err}");
    assert!(err.to_string().contains("sliding_log"), "{err}");

    let text = "[[routes]]\npath = \"/x\"\nmode = \"fast\"\n";
    let err = Policy::from_toml_str(text, Some("p.toml")).unwrap_err();
    assert_eq!(err.field(), Some("routes[0].mode"));
    assert_eq!(err.line(), Some(3));
    assert!(err.to_string().contains("\"auto\""), "{err}");

    let text = "[leases]\nenter_per_second = 10\nexit_per_second = 10\n";
    let err = Policy::from_toml_str(text, Some("p.toml")).unwrap_err();
    assert_eq!(err.field(), Some("leases.exit_per_second"));
    assert_eq!(err.line(), Some(3));
}

/// Every limit counter on the cluster: (key, window count).
fn cluster_counts(cluster: &support::RedisCluster) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    for node in &cluster.nodes {
        for key in node.cli(&["--scan", "--pattern", "rw:{*"]).lines() {
            let key = key.trim();
            if key.is_empty() {
                continue;
            }
            if let Some(n) = support::window_count(node.port, key) {
                out.push((key.to_owned(), n));
            }
        }
    }
    out.sort();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_lease_across_cluster_slots_and_give_every_unspent_unit_back() {
    let cluster = support::RedisCluster::start();
    let nodes = cluster
        .nodes
        .iter()
        .map(|n| format!("\"{}\"", n.url()))
        .collect::<Vec<_>>()
        .join(", ");
    // The identity's hour and the route's ceiling live in different slots:
    // one take is two scripts, and a give-back two refunds.
    let text = format!(
        r#"
[store]
kind = "redis-cluster"
nodes = [{nodes}]
timeout_ms = 2000

[resilience]
expected_instances = 2

[[tiers]]
name = "free"
match_prefix = "free_"
limits = [{{ name = "hour", algorithm = "fixed_window", limit = 400, window = "1h", mode = "leased" }}]

[[tiers]]
name = "anonymous"
limits = [{{ name = "burst", algorithm = "token_bucket", capacity = 5, refill_per_second = 1 }}]

[[routes]]
path = "/search"
limits = [{{ name = "all", algorithm = "fixed_window", limit = 1000000, window = "1h", scope = "route" }}]
"#
    );
    let mut limiters = Vec::new();
    for _ in 0..2 {
        let policy = Policy::from_toml_str(&text, Some("cluster.toml")).unwrap();
        limiters.push(Limiter::new(policy).await.unwrap());
    }
    let mut tasks = Vec::new();
    for l in &limiters {
        for _ in 0..3 {
            let l = l.clone();
            tasks.push(tokio::spawn(async move {
                let route = l.route_for("GET", "/search");
                let (mut admitted, mut local) = (0u64, 0u64);
                for _ in 0..100 {
                    let d = l.check(&caller(), "free", route.clone()).await;
                    admitted += u64::from(d.allowed);
                    local += u64::from(d.allowed && d.path == DecisionPath::Local);
                }
                (admitted, local)
            }));
        }
    }
    let (mut admitted, mut local) = (0, 0);
    for t in tasks {
        let (a, l) = t.await.unwrap();
        admitted += a;
        local += l;
    }
    // cap = 0.25 x 400 / 2 = 50: at most 2 x 50 units sit in leases.
    assert!(admitted <= 400, "{admitted} admitted over 400");
    assert!(
        admitted >= 300,
        "only {admitted} admitted: more than 2 leases were lost"
    );
    assert!(local > 100, "only {local} admissions came from leases");
    for l in &limiters {
        l.shutdown().await;
    }
    let counts = cluster_counts(&cluster);
    assert_eq!(counts.len(), 2, "{counts:?}");
    for (key, n) in counts {
        assert_eq!(n, admitted, "{key}: charged {n}, admitted {admitted}");
    }
}

#[tokio::test]
async fn a_lease_that_outlives_its_ttl_in_an_open_window_gives_its_units_back() {
    let redis = RedisServer::start();
    let l = limiter(
        &redis,
        r#"{ name = "minute", algorithm = "fixed_window", limit = 4000, window = "1h", mode = "leased" }"#,
        "[leases]\nrenew_ms = 100\nttl_ms = 300",
    )
    .await;
    let mut admitted = 0;
    for _ in 0..300 {
        admitted += u64::from(l.check(&caller(), "free", None).await.allowed);
    }
    assert!(window_count(&redis) > admitted, "no lease was held");
    // Idle now: within the TTL and a sweep, the window (open for the hour)
    // is charged only what was admitted.
    support::eventually(
        std::time::Duration::from_secs(10),
        "the unspent units given back",
        || async { (window_count(&redis) == admitted).then_some(()) },
    )
    .await;
}

#[tokio::test]
async fn the_memory_store_decides_a_leased_limit_exactly() {
    let text = r#"
[[tiers]]
name = "free"
match_prefix = "free_"
limits = [{ name = "minute", algorithm = "fixed_window", limit = 5, window = "1h", mode = "leased" }]

[[tiers]]
name = "anonymous"
limits = [{ name = "burst", algorithm = "token_bucket", capacity = 5, refill_per_second = 1 }]
"#;
    let l = Limiter::new(Policy::from_toml_str(text, None).unwrap())
        .await
        .unwrap();
    let mut allowed = 0;
    for _ in 0..50 {
        let d = l.check(&caller(), "free", None).await;
        assert_eq!(d.path, DecisionPath::Store);
        allowed += usize::from(d.allowed);
    }
    assert_eq!(allowed, 5);
    assert!(l.hot_keys().is_empty());
}

#[tokio::test]
async fn a_lease_taken_under_the_old_limit_is_not_spent_against_a_lowered_one() {
    let redis = RedisServer::start();
    let limit = |n: u64| {
        format!(
            r#"{{ name = "minute", algorithm = "fixed_window", limit = {n}, window = "1h", mode = "leased" }}"#
        )
    };
    let extra = "[leases]\nrenew_ms = 100\nttl_ms = 30000";
    let l = limiter(&redis, &limit(4000), extra).await;
    let mut admitted = 0;
    for _ in 0..200 {
        admitted += u64::from(l.check(&caller(), "free", None).await.allowed);
    }
    let charged = window_count(&redis);
    assert!(charged > admitted + 2, "no lease held: charged {charged}");
    // Same limit name and algorithm (so the same Redis key), lower limit:
    // two more requests fit it.
    let lowered = admitted + 2;
    l.replace_policy(policy(&redis, &limit(lowered), extra))
        .expect("reload");
    for _ in 0..200 {
        admitted += u64::from(l.check(&caller(), "free", None).await.allowed);
    }
    assert!(
        admitted <= lowered,
        "{admitted} admitted in a window whose limit is now {lowered}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_take_its_caller_gave_up_on_does_not_wedge_the_key() {
    let redis = RedisServer::start();
    let l = limiter(
        &redis,
        r#"{ name = "minute", algorithm = "fixed_window", limit = 4000, window = "1h", mode = "leased" }"#,
        "[leases]\nrenew_ms = 100\nttl_ms = 1000",
    )
    .await;
    // The first request takes a lease; Redis is frozen, so the take hangs
    // and the caller (a client that hung up, a timeout layer) drops it.
    redis.pause();
    let gave_up =
        tokio::time::timeout(Duration::from_millis(300), l.check(&caller(), "free", None)).await;
    redis.resume();
    assert!(gave_up.is_err(), "the take answered while Redis was frozen");
    support::eventually(
        Duration::from_secs(15),
        "the key served from a lease again",
        || async {
            (l.check(&caller(), "free", None).await.path == DecisionPath::Local).then_some(())
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_ended_by_a_short_window_leave_nothing_charged_to_a_long_one() {
    let redis = RedisServer::start();
    let l = limiter(
        &redis,
        r#"{ name = "second", algorithm = "fixed_window", limit = 100000, window = "1s", mode = "leased" },
           { name = "hour", algorithm = "fixed_window", limit = 1000000, window = "1h" }"#,
        "[leases]\nrenew_ms = 100\nttl_ms = 1000",
    )
    .await;
    // Hot across at least two second-windows, so leases end with them.
    let started = std::time::Instant::now();
    let mut admitted = 0;
    let mut local = 0;
    while started.elapsed() < Duration::from_millis(2500) {
        let d = l.check(&caller(), "free", None).await;
        admitted += u64::from(d.allowed);
        local += u64::from(d.path == DecisionPath::Local);
    }
    assert!(
        local > admitted / 2,
        "only {local} of {admitted} from leases"
    );
    // Idle now: every unspent unit goes back to the hour, which is
    // charged only what was admitted.
    support::eventually(
        Duration::from_secs(15),
        "the hour charged only what was admitted",
        || async { (count_of(&redis, "hour") == admitted).then_some(()) },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_lease_is_spent_while_redis_is_frozen_then_the_failure_policy_answers() {
    let redis = RedisServer::start();
    let l = limiter(
        &redis,
        r#"{ name = "minute", algorithm = "fixed_window", limit = 4000, window = "1h", mode = "leased" }"#,
        "on_store_failure = \"closed\"\n[leases]\nrenew_ms = 100\nttl_ms = 30000",
    )
    .await;
    let mut admitted = 0;
    for _ in 0..300 {
        admitted += u64::from(l.check(&caller(), "free", None).await.allowed);
    }
    assert_eq!(admitted, 300);
    redis.pause();
    // Paid for: spent with no round trip while Redis answers nothing.
    let mut local = 0;
    let last = loop {
        let d = l.check(&caller(), "free", None).await;
        if d.path != DecisionPath::Local {
            break d;
        }
        assert!(d.allowed, "a held lease refused: {d:?}");
        local += 1;
        assert!(local <= 1000, "more spent than the largest lease (1000)");
    };
    redis.resume();
    assert!(local > 0, "no held lease was spent while Redis was frozen");
    assert!(!last.allowed, "closed admitted past the lease: {last:?}");
    assert!(
        matches!(last.source, ratewatch::Source::Fallback { .. }),
        "{last:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_with_redis_frozen_gives_leases_back_within_one_budget_not_one_per_lease() {
    let redis = RedisServer::start();
    let l = limiter(
        &redis,
        r#"{ name = "minute", algorithm = "fixed_window", limit = 4000, window = "1h", mode = "leased" }"#,
        "[leases]\nrenew_ms = 100\nttl_ms = 30000",
    )
    .await;
    let keys = 20;
    for i in 0..keys {
        let id = Identity::new(IdentityKind::ApiKey, format!("free_lease_frozen_{i}"));
        for _ in 0..50 {
            assert!(l.check(&id, "free", None).await.allowed);
        }
    }
    assert!(l.hot_keys().len() >= keys / 2, "few keys hold leases");
    redis.pause();
    // The budget is 2 s: one per lease, in turn, would be 40 s.
    let started = std::time::Instant::now();
    let done = tokio::time::timeout(Duration::from_secs(15), l.shutdown()).await;
    redis.resume();
    assert!(
        done.is_ok(),
        "shutdown still giving leases back after {:?}",
        started.elapsed()
    );
}

/// Three instances sharing one identity at 300 decisions/s each against a
/// window of 600 per second, so a third is refused: in the quota's tail
/// leases shrink with what is left instead of deciding every request in
/// Redis, so the whole run costs at most one script call per ten
/// decisions, and no window admits more than its limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_pressing_one_window_pay_a_script_call_per_ten_decisions_at_most() {
    use support::hammer::unix_us;
    const LIMIT: usize = 600;
    const WINDOW_US: u64 = 1_000_000;
    const WINDOWS: u64 = 3;
    let redis = RedisServer::start();
    let text = format!(
        r#"
[store]
kind = "redis"
url = "{}"
timeout_ms = 2000

[resilience]
expected_instances = 3

[[tiers]]
name = "free"
match_prefix = "free_"
limits = [{{ name = "second", algorithm = "fixed_window", limit = {LIMIT}, window = "1s", mode = "leased" }}]

[[tiers]]
name = "anonymous"
limits = [{{ name = "burst", algorithm = "token_bucket", capacity = 5, refill_per_second = 1 }}]
"#,
        redis.url()
    );
    let policy = Policy::from_toml_str(&text, Some("fleet.toml")).expect("policy");
    let mut limiters = Vec::new();
    for _ in 0..3 {
        limiters.push(Limiter::new(policy.clone()).await.expect("limiter"));
    }
    // Counted from the window after next: the leases are warm by then.
    let now = unix_us();
    let start = now - now % WINDOW_US + 2 * WINDOW_US;
    let end = start + WINDOWS * WINDOW_US;
    let tasks: Vec<_> = limiters
        .iter()
        .map(|l| {
            let l = l.clone();
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / 300.0));
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
                let mut shots = Vec::new();
                loop {
                    tick.tick().await;
                    let sent = unix_us();
                    if sent >= end {
                        break;
                    }
                    let d = l.check(&caller(), "free", None).await;
                    shots.push((sent, unix_us(), d.allowed));
                }
                shots
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_micros(start.saturating_sub(unix_us()))).await;
    let calls = redis.command_calls("evalsha");
    let mut shots = Vec::new();
    for t in tasks {
        shots.extend(t.await.expect("pacer"));
    }
    let calls = redis.command_calls("evalsha") - calls;
    let counted: Vec<_> = shots.iter().filter(|s| s.0 >= start).collect();
    let decisions = counted.len() as u64;
    assert!(decisions >= 900, "the load sent only {decisions} decisions");
    assert!(
        calls * 10 <= decisions,
        "{calls} script calls for {decisions} decisions"
    );
    for w in 0..WINDOWS {
        let (from, to) = (start + w * WINDOW_US, start + (w + 1) * WINDOW_US);
        let inside = counted
            .iter()
            .filter(|s| s.2 && s.0 >= from && s.1 < to)
            .count();
        assert!(inside <= LIMIT, "window {w} admitted {inside} > {LIMIT}");
    }
    for l in &limiters {
        l.shutdown().await;
    }
}
