//! In-flight limits on real `ratewatch serve` processes and a real Redis:
//! two servers share one limit; a client that goes away gives its slot
//! back within a second; a server killed with SIGKILL gives its slots back
//! after the hold timeout; Redis killed while slots are held follows the
//! failure policy; the shipped policy limits `GET /api/slow`.

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use support::{Ratewatch, RedisServer};

const KEY: &str = "free_inflight_client";

/// A policy on `store` whose free tier has an in-flight limit of `limit`
/// with `hold` as hold timeout, and `on_failure` as failure policy.
fn policy(dir: &std::path::Path, store: &str, limit: u64, hold: &str, on_failure: &str) -> PathBuf {
    let path = dir.join("inflight.toml");
    std::fs::write(
        &path,
        format!(
            r#"
{store}

[resilience]
on_store_failure = "{on_failure}"
breaker = {{ failures = 3, open_ms = 1000 }}
expected_instances = 1

[identity]
hash_secret = "inflight-test-secret-0123456789"

[telemetry]
flush_interval_ms = 200

[[tiers]]
name = "free"
match_prefix = "free_"
limits = [
  {{ name = "burst", algorithm = "token_bucket", capacity = 1000, refill_per_second = 100 }},
]

[[tiers]]
name = "anonymous"
limits = [{{ name = "burst", algorithm = "token_bucket", capacity = 1000, refill_per_second = 100 }}]

[[routes]]
method = "GET"
path = "/api/slow"
limits = [
  {{ name = "inflight", algorithm = "concurrency", limit = {limit}, hold_timeout = "{hold}" }},
]
"#
        ),
    )
    .unwrap();
    path
}

fn redis_store(url: &str) -> String {
    format!("[store]\nkind = \"redis\"\nurl = \"{url}\"\ntimeout_ms = 200")
}

async fn slow(client: &reqwest::Client, server: &Ratewatch, ms: u64) -> reqwest::Response {
    client
        .get(format!("{}/api/slow?ms={ms}", server.url()))
        .header("x-api-key", KEY)
        .send()
        .await
        .expect("the server answers")
}

/// Waits until a quick slow request (ms=0) on `server` passes: its slots
/// are back. Returns how long that took.
async fn wait_admitted(server: &Ratewatch, within: Duration, what: &str) -> Duration {
    let client = reqwest::Client::new();
    let started = Instant::now();
    loop {
        if slow(&client, server, 0).await.status() == 200 {
            return started.elapsed();
        }
        assert!(started.elapsed() < within, "{what} within {within:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A request of `ms` milliseconds sent on a raw socket, not read: the
/// slot is held until the socket is dropped or the request ends.
fn hold_on_socket(server: &Ratewatch, ms: u64) -> TcpStream {
    let mut s = TcpStream::connect(("127.0.0.1", server.port)).unwrap();
    write!(
        s,
        "GET /api/slow?ms={ms} HTTP/1.1\r\nHost: 127.0.0.1\r\nx-api-key: {KEY}\r\n\r\n"
    )
    .unwrap();
    s
}

/// Waits until `server` holds `n` slots of the free tier's `inflight`
/// limit (its `ratewatch_inflight_slots` gauge).
async fn wait_held(server: &Ratewatch, n: u64) {
    let started = Instant::now();
    loop {
        let metrics = reqwest::get(format!("{}/metrics", server.url()))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        if slots_line(&metrics).ends_with(&format!(" {n}")) {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "never held {n}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The free tier's `inflight` line of the slots gauge.
fn slots_line(metrics: &str) -> String {
    metrics
        .lines()
        .find(|l| {
            l.starts_with("ratewatch_inflight_slots{")
                && l.contains(r#"tier="free""#)
                && l.contains(r#"limit="inflight""#)
        })
        .unwrap_or_default()
        .to_owned()
}

/// Waits until `server` refuses a quick request: a slot taken elsewhere is
/// held.
async fn wait_refused(server: &Ratewatch) {
    let client = reqwest::Client::new();
    let started = Instant::now();
    loop {
        let res = slow(&client, server, 0).await;
        if res.status() == 429 {
            assert_eq!(res.headers()["retry-after"], "1");
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the slot was never taken"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_servers_sharing_redis_admit_two_of_six_slow_requests_and_give_both_slots_back() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let file = policy(dir.path(), &redis_store(&redis.url()), 2, "30s", "closed");
    let a = Ratewatch::start("serve", Some(&file), &[]);
    let b = Ratewatch::start("serve", Some(&file), &[]);
    let client = reqwest::Client::new();

    let started = Instant::now();
    let requests = (0..6).map(|i| {
        let server = if i % 2 == 0 { &a } else { &b };
        slow(&client, server, 1_500)
    });
    let answers = futures_util::future::join_all(requests).await;
    let statuses: Vec<u16> = answers.iter().map(|r| r.status().as_u16()).collect();
    assert_eq!(
        statuses.iter().filter(|&&s| s == 200).count(),
        2,
        "{statuses:?}"
    );
    assert_eq!(
        statuses.iter().filter(|&&s| s == 429).count(),
        4,
        "{statuses:?}"
    );
    assert!(started.elapsed() >= Duration::from_millis(1_500));
    for r in answers.iter().filter(|r| r.status() == 429) {
        assert_eq!(r.headers()["retry-after"], "1");
    }

    for r in answers {
        r.bytes().await.unwrap();
    }

    // Both slots are back (a release is a script call of its own, sent as
    // the body ends, so the client may be a moment ahead of it): two more
    // at once pass, on either server.
    let ended = Instant::now();
    loop {
        let again =
            futures_util::future::join_all([slow(&client, &a, 300), slow(&client, &b, 300)]).await;
        if again.iter().all(|r| r.status() == 200) {
            break;
        }
        assert!(
            ended.elapsed() < Duration::from_secs(2),
            "both slots never came back"
        );
    }

    // The top-blocked list names the in-flight limit as the cause.
    let url = format!("{}/dashboard/api/stats?range=5m", a.url());
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let stats: serde_json::Value = client.get(&url).send().await.unwrap().json().await.unwrap();
        if stats["top_blocked"][0]["cause"] == "inflight" {
            break;
        }
        assert!(Instant::now() < deadline, "no cause in {stats}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_disconnects_mid_request_gets_its_slot_back_within_a_second() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let file = policy(dir.path(), &redis_store(&redis.url()), 1, "30s", "closed");
    let server = Ratewatch::start("serve", Some(&file), &[]);
    let socket = hold_on_socket(&server, 10_000);
    wait_held(&server, 1).await;
    wait_refused(&server).await;
    drop(socket);
    let took = wait_admitted(&server, Duration::from_secs(1), "the slot came back").await;
    eprintln!("slot back {took:?} after the client went away");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_response_holds_its_slot_until_its_body_ends() {
    let dir = tempfile::tempdir().unwrap();
    let file = policy(dir.path(), "[store]\nkind = \"memory\"", 1, "30s", "open");
    let server = Ratewatch::start("serve", Some(&file), &[]);
    let mut s = TcpStream::connect(("127.0.0.1", server.port)).unwrap();
    write!(
        s,
        "GET /api/slow?ms=800&stream=true HTTP/1.1\r\nHost: 127.0.0.1\r\nx-api-key: {KEY}\r\n\r\n"
    )
    .unwrap();
    // The status line comes at once, the body ends 800 ms later.
    let mut head = [0u8; 12];
    s.read_exact(&mut head).unwrap();
    assert_eq!(&head, b"HTTP/1.1 200");
    let client = reqwest::Client::new();
    assert_eq!(
        slow(&client, &server, 0).await.status(),
        429,
        "held while streaming"
    );
    let mut rest = Vec::new();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    while !rest.ends_with(b"0\r\n\r\n") {
        let mut buf = [0u8; 256];
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0, "the stream ended early");
        rest.extend_from_slice(&buf[..n]);
    }
    assert!(String::from_utf8_lossy(&rest).contains("slept_ms"));
    wait_admitted(
        &server,
        Duration::from_secs(1),
        "the slot came back at the end",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_killed_holding_slots_gives_them_back_after_the_hold_timeout() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let file = policy(dir.path(), &redis_store(&redis.url()), 1, "2s", "closed");
    let holder = Ratewatch::start("serve", Some(&file), &[]);
    let other = Ratewatch::start("serve", Some(&file), &[]);
    let _socket = hold_on_socket(&holder, 10_000);
    wait_held(&holder, 1).await;
    wait_refused(&other).await;
    // Renewals keep the slot past its first hold timeout while the holder
    // lives.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    wait_refused(&other).await;
    holder.signal("KILL");
    let killed = Instant::now();
    wait_refused(&other).await;
    let took = wait_admitted(
        &other,
        Duration::from_secs(6),
        "the dead holder's slot came back",
    )
    .await;
    let since_kill = killed.elapsed();
    eprintln!("slot back {since_kill:?} after SIGKILL (waited {took:?})");
    // It came back by expiring: not before a hold timeout minus the
    // renewal period that may have just pushed it (2 s - 2 s / 3).
    assert!(since_kill >= Duration::from_millis(1_000), "{since_kill:?}");
    let metrics = reqwest::get(format!("{}/metrics", other.url()))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let expired = metrics
        .lines()
        .find(|l| l.starts_with("ratewatch_inflight_expired_holders_total{"))
        .expect("the expired-holders family");
    assert!(expired.ends_with(" 1"), "{expired}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_while_slots_are_held_follows_the_failure_policy() {
    for (on_failure, while_down) in [
        ("open", [200, 200]),
        ("closed", [503, 503]),
        ("local", [200, 429]),
    ] {
        let mut redis = RedisServer::start();
        let dir = tempfile::tempdir().unwrap();
        let file = policy(dir.path(), &redis_store(&redis.url()), 1, "30s", on_failure);
        let server = Ratewatch::start("serve", Some(&file), &[]);
        let client = reqwest::Client::new();
        let held = tokio::spawn({
            let client = client.clone();
            let url = format!("{}/api/slow?ms=1500", server.url());
            async move {
                client
                    .get(url)
                    .header("x-api-key", KEY)
                    .send()
                    .await
                    .unwrap()
                    .status()
            }
        });
        wait_held(&server, 1).await;
        redis.kill();
        // While Redis is down: `open` admits without a slot, `closed`
        // refuses (503), `local` counts slots in process (limit 1 of 1
        // instance: one passes while it is held, the next is refused).
        let first = client
            .get(format!("{}/api/slow?ms=600", server.url()))
            .header("x-api-key", KEY)
            .send();
        let second = async {
            tokio::time::sleep(Duration::from_millis(200)).await;
            slow(&client, &server, 0).await
        };
        let (first, second) = tokio::join!(first, second);
        let got = [first.unwrap().status().as_u16(), second.status().as_u16()];
        assert_eq!(got, while_down, "{on_failure}");
        // The request admitted before the outage still completes; its
        // release fails and is counted.
        assert_eq!(held.await.unwrap(), 200);
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let metrics = reqwest::get(format!("{}/metrics", server.url()))
                .await
                .unwrap()
                .text()
                .await
                .unwrap();
            let failed = metrics
                .lines()
                .find(|l| l.starts_with("ratewatch_inflight_releases_failed_total{"))
                .unwrap_or_default()
                .to_owned();
            if !failed.ends_with(" 0") && !failed.is_empty() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{on_failure}: no failed release in {failed}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shipped_policy_limits_api_slow_and_refuses_a_bad_ms_with_400() {
    let server = Ratewatch::start("serve", None, &[]);
    let client = reqwest::Client::new();
    for bad in [
        "",
        "?ms=10001",
        "?ms=-5",
        "?ms=abc",
        "?ms=1e9",
        "?ms=99999999999999999999",
    ] {
        let res = client
            .get(format!("{}/api/slow{bad}", server.url()))
            .header("x-api-key", KEY)
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 400, "{bad}");
    }
    let three = (0..3).map(|_| slow(&client, &server, 800));
    let statuses: Vec<u16> = futures_util::future::join_all(three)
        .await
        .iter()
        .map(|r| r.status().as_u16())
        .collect();
    assert_eq!(
        statuses.iter().filter(|&&s| s == 429).count(),
        1,
        "{statuses:?}"
    );
    let metrics = client
        .get(format!("{}/metrics", server.url()))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        slots_line(&metrics).ends_with(" 0"),
        "{}",
        slots_line(&metrics)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_cost_one_script_call_per_holder_every_third_of_the_hold_timeout() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let file = policy(dir.path(), &redis_store(&redis.url()), 1, "3s", "closed");
    let server = Ratewatch::start("serve", Some(&file), &[]);
    let _socket = hold_on_socket(&server, 10_000);
    wait_held(&server, 1).await;
    // A quiet window: the only scripts run are the holder's renewals (the
    // fleet view's flushes are pipelines, not scripts).
    let before = redis.command_calls("evalsha");
    let window = Duration::from_secs(3);
    tokio::time::sleep(window).await;
    let renewals = redis.command_calls("evalsha") - before;
    eprintln!("{renewals} renewal calls in {window:?} for one holder of a 3 s hold");
    assert!(
        (2..=4).contains(&renewals),
        "{renewals} renewal calls in {window:?}"
    );
    wait_refused(&server).await;
}

/// A server stopped (SIGTERM) while a request holds a slot finishes the
/// request and gives its slot back before it exits: a rolling restart
/// must not leave slots held for the hold timeout (30 s here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_stopped_while_a_request_holds_a_slot_gives_it_back_before_it_exits() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let file = policy(dir.path(), &redis_store(&redis.url()), 1, "30s", "closed");
    let server = Ratewatch::start("serve", Some(&file), &[]);
    let _socket = hold_on_socket(&server, 500);
    wait_held(&server, 1).await;
    server.stop();
    // Holder ids (hex, a colon, a counter) in any sorted set.
    const HOLDERS: &str = "local n = 0 \
        for _, k in ipairs(redis.call('KEYS', '*')) do \
          if redis.call('TYPE', k).ok == 'zset' then \
            for _, m in ipairs(redis.call('ZRANGE', k, 0, -1)) do \
              if string.match(m, '^%x+:%d+$') then n = n + 1 end \
            end \
          end \
        end return n";
    assert_eq!(
        redis.cli(&["EVAL", HOLDERS, "0"]).trim(),
        "0",
        "the server exited with a slot still held"
    );
}
