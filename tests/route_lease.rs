//! A route-wide ceiling hot only in aggregate, on real processes: three
//! `ratewatch serve` on one real Redis, 50 identities in turn on one route
//! at twice the ceiling. Each identity is far below `enter_per_second`, so
//! none is leased as a whole; the ceiling is leased on its own.
//!
//! The ceiling is a fixed window of `CEILING` per second (`scope =
//! "route"`, `auto` by default); with `expected_instances = 3` and
//! `max_share = 0.25` its largest lease is `CAP` units, so: admitted per
//! window <= CEILING, and in a window with a refusal, admitted >=
//! CEILING minus 3 x CAP. One identity (tier `tiny`) has its own limit of `TINY` per
//! hour, which must hold exactly while the ceiling is leased.

mod support;

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use support::hammer::{Window, admitted_against_asked, hammer_keys, odd_answers, unix_us, windows};
use support::{Ratewatch, RedisServer};

const CEILING: usize = 200;
const INSTANCES: usize = 3;
/// floor(0.25 x 200 / 3).
const CAP: usize = 16;
const TINY: usize = 5;
const IDENTITIES: usize = 50;
const WINDOW_US: u64 = 1_000_000;

fn config(dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("route_lease.toml");
    std::fs::write(
        &path,
        format!(
            r#"
[store]
kind = "redis"
url = "redis://127.0.0.1:1"
# Generous: a machine at load 20 (debug builds of three servers, 2 cores)
# can leave a server unscheduled for seconds, and a store call that times
# out fails this route closed (a 503). Half the client's 10 s timeout.
timeout_ms = 5000

[resilience]
on_store_failure = "closed"
expected_instances = {INSTANCES}

[leases]
renew_ms = 100
ttl_ms = 1000
max_share = 0.25

[[tiers]]
name = "free"
match_prefix = "free_"
limits = [{{ name = "mine", algorithm = "fixed_window", limit = 100000, window = "1s" }}]

[[tiers]]
name = "tiny"
match_prefix = "tiny_"
limits = [{{ name = "mine", algorithm = "fixed_window", limit = {TINY}, window = "1h" }}]

[[tiers]]
name = "anonymous"
limits = [{{ name = "burst", algorithm = "token_bucket", capacity = 5, refill_per_second = 1 }}]

[[routes]]
path = "/api/users"
limits = [{{ name = "all", algorithm = "fixed_window", limit = {CEILING}, window = "1s", scope = "route" }}]
"#
        ),
    )
    .expect("write config");
    path
}

/// The start of the window after the next boundary: a whole window away,
/// so the servers are warm when counting starts.
fn next_window() -> u64 {
    let now = unix_us();
    now - now % WINDOW_US + 2 * WINDOW_US
}

/// `redis-cli MONITOR` into a file, for counting the commands that touch
/// one key; stopped on drop.
struct Monitor {
    child: std::process::Child,
    out: tempfile::NamedTempFile,
}

impl Monitor {
    fn start(redis: &RedisServer) -> Self {
        let out = tempfile::NamedTempFile::new().expect("monitor file");
        let child = Command::new("redis-cli")
            .args(["-u", &redis.url(), "MONITOR"])
            .stdout(out.reopen().expect("reopen"))
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-cli MONITOR");
        Self { child, out }
    }

    /// Scripts called by clients so far (not the commands they run
    /// inside, which MONITOR shows as `[0 lua]`) on a key containing
    /// `needle`.
    fn scripts_on(&self, needle: &str) -> usize {
        std::fs::read_to_string(self.out.path())
            .expect("monitor output")
            .lines()
            .filter(|l| l.contains("\"EVALSHA\"") && !l.contains(" lua]") && l.contains(needle))
            .count()
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Never over the ceiling, and a refusal only once what was asked (up to
/// the ceiling) was admitted, less what leases may hold: measured against
/// what each window was asked, so a machine too loaded to fill a window
/// cannot fail it.
fn within_the_ceiling(ws: &[Window]) -> usize {
    admitted_against_asked(ws, CEILING, INSTANCES * CAP)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_identities_at_twice_a_route_ceiling_lease_it_and_keep_every_limit() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let servers: Vec<Ratewatch> = (0..INSTANCES)
        .map(|_| {
            Ratewatch::start_logged(
                "serve",
                Some(&cfg),
                &[("RATEWATCH_REDIS_URL", &redis.url())],
                &[],
            )
        })
        .collect();
    let urls: Vec<String> = servers.iter().map(Ratewatch::url).collect();
    // 49 ordinary identities and one with a tiny limit of its own.
    let mut keys: Vec<String> = (1..IDENTITIES)
        .map(|i| format!("free_route_identity_{i:04}"))
        .collect();
    let tiny = keys.len();
    keys.push("tiny_route_identity_0000".to_owned());
    let first = next_window();
    let n = 8;
    let end = first + n as u64 * WINDOW_US;
    let monitor = Monitor::start(&redis);
    let stop = (0..INSTANCES)
        .map(|_| Arc::new(AtomicBool::new(false)))
        .collect();
    let per_target = 2.0 * CEILING as f64 / INSTANCES as f64;
    let shots = hammer_keys(urls, "/api/users", &keys, per_target, end, stop).await;

    // The ceiling: never over, and refusals only near it.
    let ws = windows(&shots, first, WINDOW_US, n);
    within_the_ceiling(&ws);
    // What each server counted: the message of every assertion below says
    // why a request was answered as it was.
    let mut counters = String::new();
    for s in &servers {
        counters += &format!("{}:\n{}\n", s.url(), server_counters(&s.url()).await);
    }
    // Every answer is a decision. A 503 is this route failing closed: a
    // store call that did not answer within `timeout_ms` (5 s), or the
    // breaker open after five such failures; the servers' fallback and
    // breaker counters and their warnings say which. A request that got no
    // answer at all (the client's error: a connection the starved machine
    // reset, its 10 s timeout) is the machine, not ratewatch: it is
    // counted above as possibly admitted, and reported.
    let odd = odd_answers(&shots);
    let unanswered = odd.iter().filter(|o| o.contains("no answer")).count();
    let warnings = || {
        servers
            .iter()
            .flat_map(|s| {
                s.log()
                    .lines()
                    .filter(|l| l.contains("WARN") || l.contains("ERROR"))
                    .map(str::to_owned)
                    .collect::<Vec<_>>()
            })
            .collect::<Vec<_>>()
    };
    let by_status = |shots: &[support::hammer::Shot]| {
        let mut n = std::collections::BTreeMap::<u16, usize>::new();
        for s in shots {
            *n.entry(s.status).or_default() += 1;
        }
        n
    };
    assert!(
        ws.iter().all(|w| w.other == 0),
        "answers other than 200/429 (count by status, 0 = no answer: {:?}): a 503 is the route \
         failing closed because the store did not decide (a call over timeout_ms or the breaker \
         open: see ratewatch_fallbacks_total and ratewatch_breaker_trips_total below); \
         {odd:#?}\nthe servers counted:\n{counters}the servers warned: {:#?}",
        by_status(&shots),
        warnings()
    );
    if unanswered > 0 {
        eprintln!("{unanswered} requests got no answer: {odd:#?}");
    }
    assert!(
        unanswered * 100 <= shots.len(),
        "over 1% of requests got no answer: {odd:#?}"
    );

    // Leased: the route key is asked less often than requests came.
    // Without leases every request asks it; with them, what is left is
    // the takes and renewals, the tail of each window (where leases shrink
    // and then the key is decided per request: at twice the ceiling, up to
    // half of a window's requests) and the refusals remembered after it.
    // Where that tail begins depends on how promptly a starved server's
    // renewals run, so how far below one per request the count falls is
    // the machine's (from a quarter to two thirds of the requests at load
    // 10 to 14, measured); that it falls below is the leasing, and every
    // server spending lease units (below) is its evidence.
    let route_calls = monitor.scripts_on("{rt:");
    drop(monitor);
    eprintln!(
        "{} requests, {route_calls} scripts on the route key\n{counters}",
        shots.len()
    );
    assert!(route_calls > 0, "MONITOR saw no script on the route key");
    assert!(
        route_calls < shots.len(),
        "{route_calls} scripts on the route key for {} requests: not leased; the servers counted:\n{counters}",
        shots.len()
    );

    // The tiny identity's own limit holds exactly while the ceiling is
    // leased: never more than its limit, and, once it was asked often
    // enough that the ceiling cannot have refused all but a few, its limit
    // in full. Measured against what it asked, as a loaded machine may send
    // it little.
    let tiny_sent = shots.iter().filter(|s| s.key == tiny).count();
    let tiny_ok = shots
        .iter()
        .filter(|s| s.key == tiny && s.status == 200)
        .count();
    assert!(tiny_ok <= TINY, "tiny admitted {tiny_ok} of {tiny_sent}");
    if tiny_sent >= 4 * TINY {
        assert_eq!(tiny_ok, TINY, "tiny admitted {tiny_ok} of {tiny_sent}");
    } else {
        eprintln!("tiny sent only {tiny_sent}: its limit held ({tiny_ok} <= {TINY})");
    }
    // The ceiling was served from leases: local decisions on every server.
    for s in &servers {
        let text = reqwest::get(format!("{}/metrics", s.url()))
            .await
            .expect("scrape")
            .text()
            .await
            .expect("body");
        let spent = text
            .lines()
            .find_map(|l| {
                l.strip_prefix("ratewatch_lease_tokens_total{event=\"spent\"}")
                    .and_then(|v| v.trim().parse::<f64>().ok())
            })
            .unwrap_or(0.0);
        assert!(
            spent > 0.0,
            "no lease units spent on {}; the servers counted:\n{counters}",
            s.url()
        );
    }
}

/// The counters of one server that say how its requests were decided:
/// fallbacks (the store could not decide), breaker trips and state, and
/// its leases' decisions, units and renewals.
async fn server_counters(url: &str) -> String {
    let text = reqwest::get(format!("{url}/metrics"))
        .await
        .expect("scrape")
        .text()
        .await
        .expect("body");
    text.lines()
        .filter(|l| {
            !l.starts_with('#')
                && [
                    "ratewatch_fallbacks_total",
                    "ratewatch_breaker_",
                    "ratewatch_lease_decisions_total",
                    "ratewatch_lease_tokens_total",
                    "ratewatch_lease_renew_seconds_count",
                ]
                .iter()
                .any(|m| l.starts_with(m))
        })
        .map(|l| format!("  {l}\n"))
        .collect()
}

/// Redis killed mid-window while the ceiling is leased: requests still
/// spend from the ceiling's lease, but their own limits cannot be decided,
/// so the route's failure policy (`closed`) answers and nothing is admitted
/// unchecked; the windows before stay within the ceiling.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_killed_while_the_ceiling_is_leased_fails_closed_for_every_identity() {
    let mut redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let servers: Vec<Ratewatch> = (0..INSTANCES)
        .map(|_| {
            Ratewatch::start_logged(
                "serve",
                Some(&cfg),
                &[("RATEWATCH_REDIS_URL", &redis.url())],
                &[],
            )
        })
        .collect();
    let urls: Vec<String> = servers.iter().map(Ratewatch::url).collect();
    let keys: Vec<String> = (0..IDENTITIES)
        .map(|i| format!("free_route_identity_{i:04}"))
        .collect();
    let first = next_window();
    let n = 6;
    let end = first + n as u64 * WINDOW_US;
    let stop = (0..INSTANCES)
        .map(|_| Arc::new(AtomicBool::new(false)))
        .collect();
    let per_target = 2.0 * CEILING as f64 / INSTANCES as f64;
    let load = tokio::spawn({
        let keys = keys.clone();
        async move { hammer_keys(urls, "/api/users", &keys, per_target, end, stop).await }
    });
    // A quarter into the third window: every server holds a ceiling lease.
    let kill_at = first + 2 * WINDOW_US + WINDOW_US / 4;
    let now = unix_us();
    if kill_at > now {
        tokio::time::sleep(std::time::Duration::from_micros(kill_at - now)).await;
    }
    redis.kill();
    let killed = unix_us();
    let shots = load.await.expect("hammer");
    let ws = windows(&shots, first, WINDOW_US, 2);
    within_the_ceiling(&ws);
    // Whether the windows before the kill filled depends on how much load
    // this machine could send; the ceiling holding does not.
    let filled = ws.iter().filter(|w| w.refused_inside > 0).count();
    eprintln!("{filled} of {} windows before the kill filled", ws.len());
    let after: Vec<_> = shots.iter().filter(|s| s.sent >= killed).collect();
    assert!(
        after.len() > 100,
        "only {} requests after the kill",
        after.len()
    );
    let admitted_after = after.iter().filter(|s| s.status == 200).count();
    assert_eq!(
        admitted_after,
        0,
        "{admitted_after} of {} requests admitted with Redis dead",
        after.len()
    );
    assert!(
        after.iter().any(|s| s.status == 503),
        "closed never answered 503"
    );
}

/// In process: a tier limit that says `mode = "exact"` beside a route
/// ceiling. Before, any `exact` limit made the whole request exact; now the
/// ceiling is leased apart, and the exact limit still refuses at its
/// quota. The units those refused requests spent from the ceiling's lease
/// go back into it: Redis' count of the ceiling is what was admitted plus
/// what the lease holds, never a refused request more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exact_identity_limit_beside_a_leased_ceiling_refuses_exactly_and_loses_no_ceiling_unit()
{
    use ratewatch::identity::{Identity, IdentityKind};
    use ratewatch::{DecisionPath, Limiter, Policy};

    let redis = RedisServer::start();
    let text = format!(
        r#"
[store]
kind = "redis"
url = "{}"
timeout_ms = 2000

[leases]
ttl_ms = 60000

[[tiers]]
name = "free"
match_prefix = "free_"
limits = [{{ name = "mine", algorithm = "fixed_window", limit = 3, window = "1h", mode = "exact" }}]

[[tiers]]
name = "anonymous"
limits = [{{ name = "burst", algorithm = "token_bucket", capacity = 5, refill_per_second = 1 }}]

[[routes]]
path = "/search"
limits = [{{ name = "all", algorithm = "fixed_window", limit = 1000000, window = "1h", scope = "route" }}]
"#,
        redis.url()
    );
    let policy = Policy::from_toml_str(&text, Some("exact.toml")).unwrap();
    let l = Limiter::new(policy).await.unwrap();
    let route = l.route_for("GET", "/search");
    let (mut admitted, mut local, mut store_after_lease) = (0u64, 0u64, 0u64);
    // 200 identities, 5 requests each: 3 admitted, 2 refused by their own
    // limit, every one of them far below the entry rate.
    for round in 0..5 {
        for i in 0..200 {
            let who = Identity::new(IdentityKind::ApiKey, format!("free_many_{i:04}"));
            let d = l.check(&who, "free", route.clone()).await;
            assert_eq!(d.allowed, round < 3, "identity {i}, request {round}: {d:?}");
            admitted += u64::from(d.allowed);
            local += u64::from(d.path == DecisionPath::Local);
            // Every answer names both limits, wherever each came from.
            if d.allowed {
                assert_eq!(d.limits.len(), 2, "{d:?}");
                store_after_lease += u64::from(d.path == DecisionPath::Store);
            }
        }
    }
    assert_eq!(admitted, 600);
    // The identity's limit is always asked: no answer is wholly local.
    assert_eq!(local, 0);
    assert!(store_after_lease > 0);
    let hot = l.hot_keys();
    let ceiling = hot
        .iter()
        .find(|h| h.identity == "*")
        .unwrap_or_else(|| panic!("the ceiling was not leased: {hot:?}"));
    assert_eq!(ceiling.route, "/search");
    let held = ceiling.units;
    // Redis charged the ceiling exactly what was admitted plus what the
    // lease still holds: the 400 refused requests cost it nothing.
    let charged = ceiling_count(&redis);
    assert_eq!(
        charged,
        admitted + held,
        "ceiling charged {charged}, admitted {admitted}, held {held}"
    );
    l.shutdown().await;
    // And what was held went back.
    assert_eq!(ceiling_count(&redis), admitted);
}

/// The ceiling's fixed-window count in Redis.
fn ceiling_count(redis: &RedisServer) -> u64 {
    let keys = redis.cli(&["KEYS", "*{rt:*"]);
    let key = keys.lines().next().expect("a route key").trim().to_owned();
    support::window_count(redis.port, &key).unwrap_or_else(|| panic!("count of {key}"))
}
