//! Units in the fleet view and on the dashboard: two `ratewatch serve`
//! processes share one Redis; tokens charged from two keys rank those keys
//! by tokens in the fleet view, the dashboard's HTML and the page as
//! Chromium draws it; stream slots held show on the dashboard and in the
//! `ratewatch_inflight_slots` gauge, and go back to 0 when released or
//! when the client goes away.

mod support;

use std::io::Write;
use std::net::TcpStream;
use std::time::Duration;

use support::{Ratewatch, RedisServer, eventually, get_json};

const ALICE: &str = "free_alice_0000000001";
const BOB: &str = "free_bob_00000000002";

fn policy(dir: &std::path::Path, redis: &str) -> std::path::PathBuf {
    let path = dir.join("units.toml");
    std::fs::write(
        &path,
        format!(
            r#"
[store]
kind = "redis"
url = "{redis}"
timeout_ms = 500

[telemetry]
flush_interval_ms = 200
key_display = "hashed"

[[tiers]]
name = "free"
match_prefix = "free_"
limits = [{{ name = "day", algorithm = "fixed_window", limit = 100000, window = "1d" }}]

[[tiers]]
name = "anonymous"
limits = [{{ name = "burst", algorithm = "token_bucket", capacity = 5, refill_per_second = 1 }}]

[[routes]]
method = "POST"
path = "/api/complete"
costs = [{{ unit = "tokens", json = "max_tokens" }}]
limits = [
  {{ name = "tpm", algorithm = "sliding_window", limit = 100000, window = "60s", unit = "tokens" }},
  {{ name = "streams", algorithm = "concurrency", limit = 2, hold_timeout = "30s" }},
]
"#
        ),
    )
    .unwrap();
    path
}

async fn complete(client: &reqwest::Client, server: &Ratewatch, key: &str, tokens: u64) {
    let res = client
        .post(format!("{}/api/complete", server.url()))
        .header("x-api-key", key)
        .header("content-type", "application/json")
        .body(format!(r#"{{"max_tokens": {tokens}}}"#))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200, "{}", res.text().await.unwrap());
    res.bytes().await.unwrap();
}

/// The hashed display form of `key` as the fleet view shows it: the
/// tokens table's rows, `(identity, tier, units)`.
fn token_rows(stats: &serde_json::Value) -> Vec<(String, String, u64)> {
    stats["top_units"]["tokens"]
        .as_array()
        .map(|rows| {
            rows.iter()
                .map(|r| {
                    (
                        r["identity"].as_str().unwrap().to_owned(),
                        r["tier"].as_str().unwrap().to_owned(),
                        r["units"].as_u64().unwrap(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The text of the `<tbody id="...">` of `html`.
fn tbody<'a>(html: &'a str, id: &str) -> &'a str {
    let start = html
        .find(&format!(r#"<tbody id="{id}">"#))
        .unwrap_or_else(|| panic!("no {id} in {html}"));
    let end = start + html[start..].find("</tbody>").unwrap();
    &html[start..end]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_charged_through_two_servers_rank_their_keys_by_tokens_in_the_fleet_view_and_on_the_dashboard()
 {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let file = policy(dir.path(), &redis.url());
    let a = Ratewatch::start("serve", Some(&file), &[]);
    let b = Ratewatch::start("serve", Some(&file), &[]);
    let client = reqwest::Client::new();

    // Bob decides more often, Alice is charged more tokens: 3 x 700
    // through both servers against 5 x 40.
    for server in [&a, &b, &a] {
        complete(&client, server, ALICE, 700).await;
    }
    for server in [&b, &a, &b, &a, &b] {
        complete(&client, server, BOB, 40).await;
    }

    // Either server reads the whole fleet's tokens from Redis.
    let url = format!("{}/dashboard/api/stats?range=5m", a.url());
    let stats = eventually(Duration::from_secs(15), "both keys' tokens flushed", || {
        let (client, url) = (client.clone(), url.clone());
        async move {
            let s = get_json(&client, &url).await?;
            let rows = token_rows(&s);
            (rows.iter().map(|r| r.2).collect::<Vec<_>>() == vec![2100, 200]).then_some(s)
        }
    })
    .await;
    assert_eq!(stats["source"]["kind"], "fleet", "{}", stats["source"]);
    assert_eq!(stats["units"]["free"]["tokens"], 2300, "{}", stats["units"]);
    let rows = token_rows(&stats);
    assert!(rows.iter().all(|r| r.1 == "free"), "{rows:?}");
    let (alice, bob) = (rows[0].0.clone(), rows[1].0.clone());
    assert_ne!(alice, bob);
    // Never the raw key.
    let text = stats.to_string();
    assert!(!text.contains(ALICE) && !text.contains(BOB), "{text}");
    // By decisions, Bob leads: the two orders really differ.
    let hot: Vec<&str> = stats["hot_keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["identity"].as_str().unwrap())
        .collect();
    assert_eq!(
        hot,
        vec![bob.as_str(), alice.as_str()],
        "{}",
        stats["hot_keys"]
    );

    // The page the other server renders: Alice's row first, 2100 tokens.
    let html = client
        .get(format!("{}/dashboard/?range=5m", b.url()))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let rows_html = tbody(&html, "unit-key-rows");
    let (at_alice, at_bob) = (
        rows_html.find(&alice).expect("alice's row"),
        rows_html.find(&bob).expect("bob's row"),
    );
    assert!(at_alice < at_bob, "{rows_html}");
    assert!(
        rows_html.contains(">2100<") && rows_html.contains(">200<"),
        "{rows_html}"
    );
    assert!(
        html.contains("2300 tokens"),
        "the tiers table sums the tier's tokens"
    );

    // And as Chromium draws it after the page's own refresh.
    let (dom, log) = support::dump_dom(&format!("{}/dashboard/?range=5m", b.url()), 3_000);
    let rows_dom = tbody(&dom, "unit-key-rows");
    let (at_alice, at_bob) = (
        rows_dom
            .find(&alice)
            .unwrap_or_else(|| panic!("{rows_dom}\n{log}")),
        rows_dom.find(&bob).expect("bob's row"),
    );
    assert!(at_alice < at_bob, "{rows_dom}");
    assert!(!log.contains("Uncaught"), "{log}");
}

/// A streamed completion of `ms` on a raw socket, not read: it holds its
/// slot until it ends or the socket is dropped.
fn stream_on_socket(server: &Ratewatch, key: &str, ms: u64) -> TcpStream {
    let body = format!(r#"{{"max_tokens": 10, "stream": true, "ms": {ms}}}"#);
    let mut s = TcpStream::connect(("127.0.0.1", server.port)).unwrap();
    write!(
        s,
        "POST /api/complete HTTP/1.1\r\nHost: 127.0.0.1\r\nx-api-key: {key}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    s
}

/// The `free`/`streams` line of the slots gauge, and the dashboard's
/// `slots_held` entry for it.
async fn held(client: &reqwest::Client, server: &Ratewatch) -> Option<(String, u64)> {
    let metrics = client
        .get(format!("{}/metrics", server.url()))
        .send()
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    let line = metrics
        .lines()
        .find(|l| {
            l.starts_with("ratewatch_inflight_slots{")
                && l.contains(r#"tier="free""#)
                && l.contains(r#"limit="streams""#)
        })?
        .rsplit(' ')
        .next()?
        .to_owned();
    let stats = get_json(
        client,
        &format!("{}/dashboard/api/stats?range=5m", server.url()),
    )
    .await?;
    let shown = stats["slots_held"]
        .as_array()?
        .iter()
        .find(|h| h["tier"] == "free" && h["limit"] == "streams")?;
    assert_eq!(shown["capacity"], 2);
    Some((line, shown["held"].as_u64()?))
}

async fn wait_held(client: &reqwest::Client, server: &Ratewatch, n: u64) {
    eventually(
        Duration::from_secs(15),
        &format!("{n} slots held"),
        || async move {
            let (gauge, shown) = held(client, server).await?;
            (gauge == n.to_string() && shown == n).then_some(())
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_streams_show_two_slots_held_and_zero_once_one_ends_and_the_other_client_goes_away() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let file = policy(dir.path(), &redis.url());
    let server = Ratewatch::start("serve", Some(&file), &[]);
    let client = reqwest::Client::new();
    wait_held(&client, &server, 0).await;

    // One stream ends by itself after 6 s; the other would run 10 s but
    // its client goes away first.
    let ending = stream_on_socket(&server, ALICE, 6_000);
    let leaving = stream_on_socket(&server, ALICE, 10_000);
    wait_held(&client, &server, 2).await;

    // The page shows it too.
    let html = client
        .get(format!("{}/dashboard/", server.url()))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let rows = tbody(&html, "slot-rows");
    assert!(rows.contains(r#"<td class="num held">2</td>"#), "{rows}");

    drop(leaving);
    wait_held(&client, &server, 1).await;
    wait_held(&client, &server, 0).await;
    drop(ending);

    // Both slots really are back: two more streams are admitted at once.
    let again = [
        stream_on_socket(&server, ALICE, 3_000),
        stream_on_socket(&server, ALICE, 3_000),
    ];
    wait_held(&client, &server, 2).await;
    drop(again);
    wait_held(&client, &server, 0).await;
}
