//! Per-unit costs over the wire, against a real `ratewatch serve` on the
//! memory store and on a real Redis: `POST /v1/decide` with `"costs"` and
//! `"reserve": true`, then `POST /v1/settle`. A policy with a requests per
//! minute limit and a tokens per minute limit.

mod support;

use std::time::Duration;

use serde_json::{Value, json};
use support::{Ratewatch, RedisServer, eventually};

/// The `[rls] token` of the test that sets one (sent by every request,
/// ignored where none is set).
const TOKEN: &str = "wire-units-token-0123456789";

/// Refills so slow nothing comes back during a test.
const POLICY: &str = r#"
[identity]
hash_secret = "wire-units-test-secret-0123456789"

[[tiers]]
name = "free"
match_prefix = "free_"
limits = [
  { name = "rpm", algorithm = "token_bucket", capacity = 10, refill_per_second = 0.00001 },
  { name = "tpm", algorithm = "token_bucket", capacity = 1000, refill_per_second = 0.00001, unit = "tokens" },
]

[[tiers]]
name = "anonymous"
limits = [{ name = "burst", algorithm = "token_bucket", capacity = 5, refill_per_second = 1 }]
"#;

/// A `ratewatch serve` with [`POLICY`], and the Redis it uses if any.
struct Server {
    rw: Ratewatch,
    http: reqwest::Client,
    _redis: Option<RedisServer>,
    _policy: tempfile::NamedTempFile,
}

impl Server {
    fn start(redis: bool) -> Self {
        Self::start_with(redis, "")
    }

    /// [`Server::start`] with `extra` added to the policy.
    fn start_with(redis: bool, extra: &str) -> Self {
        let redis = redis.then(RedisServer::start);
        let store = match &redis {
            Some(r) => format!(
                "[store]\nkind = \"redis\"\nurl = \"{}\"\ntimeout_ms = 2000\n",
                r.url()
            ),
            None => String::new(),
        };
        let policy = support::policy_file(&format!("{store}{extra}{POLICY}"));
        let rw = Ratewatch::start("serve", Some(policy.path()), &[]);
        Self {
            rw,
            http: reqwest::Client::new(),
            _redis: redis,
            _policy: policy,
        }
    }

    async fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        self.post_raw(path, body.to_string()).await
    }

    async fn post_raw(&self, path: &str, body: String) -> (u16, Value) {
        self.post_as(path, body, TOKEN).await
    }

    async fn post_as(&self, path: &str, body: String, token: &str) -> (u16, Value) {
        let r = self
            .http
            .post(format!("{}{path}", self.rw.url()))
            .header("content-type", "application/json")
            .bearer_auth(token)
            .body(body)
            .send()
            .await
            .expect("the server answers");
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    async fn decide(&self, body: Value) -> (u16, Value) {
        self.post("/v1/decide", &body).await
    }

    async fn settle(&self, id: &str, used: Value) -> (u16, Value) {
        self.post("/v1/settle", &json!({"reservation": id, "used": used}))
            .await
    }

    /// Whole units left of (rpm, tpm) for `key`, charging nothing.
    async fn left(&self, key: &str) -> (u64, u64) {
        let (status, v) = self.decide(json!({"key": key, "peek": true})).await;
        assert_eq!(status, 200, "{v}");
        (remaining(&v, "rpm"), remaining(&v, "tpm"))
    }
}

fn limit<'a>(v: &'a Value, name: &str) -> &'a Value {
    v["limits"]
        .as_array()
        .and_then(|ls| ls.iter().find(|l| l["name"] == name))
        .unwrap_or_else(|| panic!("no limit {name} in {v}"))
}

fn remaining(v: &Value, name: &str) -> u64 {
    limit(v, name)["remaining"].as_u64().expect("known")
}

/// Runs `$body(server)` on the memory store and on a real Redis.
macro_rules! on_both_stores {
    ($($name:ident => $body:ident;)*) => {
        mod memory {
            $(
                #[tokio::test]
                async fn $name() {
                    super::$body(super::Server::start(false)).await;
                }
            )*
        }
        mod redis {
            $(
                #[tokio::test]
                async fn $name() {
                    super::$body(super::Server::start(true)).await;
                }
            )*
        }
    };
}

on_both_stores! {
    costs_charge_each_limit_in_its_unit_and_a_tokens_refusal_charges_no_request
        => costs_charge_each_limit_in_its_unit;
    a_reservation_settled_below_its_estimate_gives_the_unused_tokens_back
        => reserve_and_settle;
    settling_a_reservation_twice_answers_the_first_result_and_changes_nothing
        => settle_twice;
    an_unknown_or_expired_reservation_is_404_and_an_expired_one_stays_charged
        => unknown_and_expired;
    unknown_fields_and_bad_costs_are_400_and_charge_nothing
        => unknown_fields;
    a_client_without_the_id_cannot_settle_another_clients_reservation
        => hostile_settle;
    settles_of_one_id_sent_at_once_settle_it_once_and_all_answer_alike
        => concurrent_settles;
}

async fn costs_charge_each_limit_in_its_unit(s: Server) {
    let (status, v) = s
        .decide(json!({"key": "free_a", "costs": {"tokens": 300}}))
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["allowed"], true);
    assert_eq!(limit(&v, "rpm")["unit"], "requests");
    assert_eq!(limit(&v, "tpm")["unit"], "tokens");
    assert_eq!((remaining(&v, "rpm"), remaining(&v, "tpm")), (9, 700));
    assert!(v.get("reservation").is_none(), "nothing reserved: {v}");

    // `cost` stays the requests unit, beside costs in other units.
    let (status, v) = s
        .decide(json!({"key": "free_a", "cost": 2, "costs": {"tokens": 100}}))
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!((remaining(&v, "rpm"), remaining(&v, "tpm")), (7, 600));

    // More tokens than are left: refused by tpm, and no request charged.
    let (status, v) = s
        .decide(json!({"key": "free_a", "costs": {"tokens": 601}}))
        .await;
    assert_eq!(status, 429, "{v}");
    assert_eq!(v["allowed"], false);
    assert_eq!(limit(&v, "tpm")["allowed"], false);
    assert_eq!(s.left("free_a").await, (7, 600));
}

async fn reserve_and_settle(s: Server) {
    let (status, v) = s
        .decide(json!({"key": "free_r", "costs": {"tokens": 500}, "reserve": true}))
        .await;
    assert_eq!(status, 200, "{v}");
    let id = v["reservation"].as_str().expect("a reservation").to_owned();
    assert_eq!(id.len(), 32, "128 bits in hex: {id}");
    assert!(id.bytes().all(|b| b.is_ascii_hexdigit()), "{id}");
    assert_eq!(v["expires_in_ms"], 60_000);
    assert_eq!(s.left("free_r").await, (9, 500));

    let (status, v) = s.settle(&id, json!({"tokens": 120})).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["reservation"], id.as_str());
    assert_eq!(
        v["settled"],
        json!([{"unit": "tokens", "outcome": "refunded", "units": 380}])
    );
    assert_eq!(s.left("free_r").await, (9, 880), "380 tokens back");

    // Used more than reserved: the difference is charged.
    let (_, v) = s
        .decide(
            json!({"key": "free_r", "costs": {"tokens": 100}, "reserve": true, "hold_ms": 5000}),
        )
        .await;
    assert_eq!(v["expires_in_ms"], 5000);
    let id = v["reservation"].as_str().expect("a reservation").to_owned();
    let (status, v) = s.settle(&id, json!({"tokens": 180})).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["settled"][0]["outcome"], "charged");
    assert_eq!(s.left("free_r").await, (8, 700));

    // A refused reserve holds nothing.
    let (status, v) = s
        .decide(json!({"key": "free_r", "costs": {"tokens": 701}, "reserve": true}))
        .await;
    assert_eq!(status, 429, "{v}");
    assert_eq!(v["reservation"], Value::Null);
    assert_eq!(s.left("free_r").await, (8, 700));
}

async fn settle_twice(s: Server) {
    let (_, v) = s
        .decide(json!({"key": "free_t", "costs": {"tokens": 400}, "reserve": true}))
        .await;
    let id = v["reservation"].as_str().expect("a reservation").to_owned();
    let (status, first) = s.settle(&id, json!({"tokens": 100})).await;
    assert_eq!(status, 200, "{first}");
    assert_eq!(s.left("free_t").await, (9, 900));

    for used in [json!({"tokens": 0}), json!({"tokens": 400}), json!({})] {
        let (status, again) = s.settle(&id, used).await;
        assert_eq!(status, 200, "{again}");
        assert_eq!(again, first, "the first settle's result");
        assert_eq!(s.left("free_t").await, (9, 900), "nothing changed");
    }
}

async fn unknown_and_expired(s: Server) {
    for id in ["0123456789abcdef0123456789abcdef", "", "not-an-id"] {
        let (status, v) = s.settle(id, json!({"tokens": 0})).await;
        assert_eq!(status, 404, "{id:?}: {v}");
        assert!(v["error"].is_string(), "{v}");
    }

    let (_, v) = s
        .decide(json!({"key": "free_e", "costs": {"tokens": 300}, "reserve": true, "hold_ms": 200}))
        .await;
    let id = v["reservation"].as_str().expect("a reservation").to_owned();
    // A settle would end the reservation, so nothing can poll for its
    // expiry: wait out its hold (a lower bound, whatever the load).
    tokio::time::sleep(Duration::from_millis(400)).await;
    let (status, v) = s.settle(&id, json!({"tokens": 0})).await;
    assert_eq!(status, 404, "expired: {v}");
    assert_eq!(
        s.left("free_e").await,
        (9, 700),
        "an expired reservation stands as charged"
    );
}

async fn unknown_fields(s: Server) {
    let bad_decides = [
        json!({"key": "free_u", "costs": {"tokens": 5}, "reserved": true}),
        json!({"key": "free_u", "costs": {"tokens": -5}}),
        json!({"key": "free_u", "costs": {"tokens": "5"}}),
        json!({"key": "free_u", "cost": 1, "costs": {"requests": 2}}),
        json!({"key": "free_u", "costs": {"tokens": 5}, "hold_ms": 1000}),
        json!({"key": "free_u", "reserve": true, "hold_ms": 0}),
        json!({"key": "free_u", "reserve": true, "hold_ms": 600_001}),
        json!({"key": "free_u", "reserve": true, "peek": true}),
        json!({"domain": "edge", "descriptors": [], "costs": {"tokens": 5}}),
    ];
    for body in bad_decides {
        let (status, v) = s.decide(body.clone()).await;
        assert_eq!(status, 400, "{body}: {v}");
        assert!(v["error"].is_string(), "{v}");
    }
    assert_eq!(s.left("free_u").await, (10, 1000), "nothing charged");

    let (_, v) = s
        .decide(json!({"key": "free_u", "costs": {"tokens": 100}, "reserve": true}))
        .await;
    let id = v["reservation"].as_str().expect("a reservation").to_owned();
    let bad_settles = [
        json!({"reservation": id, "used": {"tokens": 1}, "extra": 1}),
        json!({"reservation": id, "used": {"tokens": -1}}),
        json!({"used": {"tokens": 1}}),
    ];
    for body in bad_settles {
        let (status, v) = s.post("/v1/settle", &body).await;
        assert_eq!(status, 400, "{body}: {v}");
    }
    let (status, _) = s.post_raw("/v1/settle", "{".into()).await;
    assert_eq!(status, 400);
    // The reservation is still there to settle.
    let (status, v) = s.settle(&id, json!({"tokens": 0})).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(s.left("free_u").await, (9, 1000));
}

async fn hostile_settle(s: Server) {
    let (_, v) = s
        .decide(json!({"key": "free_victim", "costs": {"tokens": 600}, "reserve": true}))
        .await;
    let id = v["reservation"].as_str().expect("a reservation").to_owned();
    // Another client's reservation: its id shares nothing with this one.
    let (_, other) = s
        .decide(json!({"key": "free_attacker", "costs": {"tokens": 1}, "reserve": true}))
        .await;
    let other = other["reservation"].as_str().expect("a reservation");
    assert_ne!(other, id);

    let flip = |i: usize| {
        let mut b = id.clone().into_bytes();
        b[i] = if b[i] == b'0' { b'1' } else { b'0' };
        String::from_utf8(b).unwrap()
    };
    let guesses = [
        id.to_uppercase(),
        format!("{id}0"),
        id[..31].to_owned(),
        format!(" {id}"),
        flip(0),
        flip(31),
        "00000000000000000000000000000000".to_owned(),
    ];
    for guess in &guesses {
        if *guess == id {
            continue;
        }
        let (status, v) = s.settle(guess, json!({"tokens": 600})).await;
        assert_eq!(status, 404, "{guess:?}: {v}");
    }
    // The owner settles as if nothing happened.
    let (status, v) = s.settle(&id, json!({"tokens": 0})).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["settled"][0]["outcome"], "refunded");
    assert_eq!(s.left("free_victim").await, (9, 1000));
}

#[tokio::test]
async fn settle_answers_only_the_callers_decide_answers() {
    let s = Server::start_with(false, &format!("[rls]\ntoken = \"{TOKEN}\"\n"));
    let (status, v) = s
        .decide(json!({"key": "free_s", "costs": {"tokens": 500}, "reserve": true}))
        .await;
    assert_eq!(status, 200, "{v}");
    let id = v["reservation"].as_str().expect("a reservation").to_owned();
    let body = json!({"reservation": id, "used": {"tokens": 0}}).to_string();
    for wrong in ["", "wire-units-token-0123456788"] {
        let (status, v) = s.post_as("/v1/settle", body.clone(), wrong).await;
        assert_eq!(status, 401, "{wrong:?}: {v}");
    }
    let (status, v) = s.post_as("/v1/settle", body, TOKEN).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        s.left("free_s").await,
        (9, 1000),
        "settled once, by the owner"
    );
}

async fn concurrent_settles(s: Server) {
    let (_, v) = s
        .decide(json!({"key": "free_c", "costs": {"tokens": 800}, "reserve": true}))
        .await;
    let id = v["reservation"].as_str().expect("a reservation").to_owned();
    // Each claims a different usage; exactly one of them is settled.
    let answers = futures_util::future::join_all(
        (0..8u64).map(|i| s.settle(&id, json!({"tokens": 100 * i}))),
    )
    .await;
    let first = &answers[0].1;
    for (status, v) in &answers {
        assert_eq!(*status, 200, "{v}");
        assert_eq!(v, first, "every settle answers the one result");
    }
    let settled = &first["settled"][0];
    let used = match settled["outcome"].as_str() {
        Some("refunded") => 800 - settled["units"].as_u64().unwrap(),
        Some("exact") => 800,
        other => panic!("{other:?}: {first}"),
    };
    assert_eq!(s.left("free_c").await, (9, 1000 - used));
}

/// `ratewatch serve` with its shipped policy (the memory store).
fn shipped() -> Server {
    let rw = Ratewatch::start("serve", None, &[]);
    Server {
        rw,
        http: reqwest::Client::new(),
        _redis: None,
        _policy: support::policy_file(""),
    }
}

impl Server {
    async fn complete(&self, key: &str, body: Value) -> reqwest::Response {
        self.http
            .post(format!("{}/api/complete", self.rw.url()))
            .header("x-api-key", key)
            .body(body.to_string())
            .send()
            .await
            .expect("the server answers")
    }

    /// Tokens left on `/api/complete` for `key`, charging nothing.
    async fn tokens_left(&self, key: &str) -> u64 {
        let (status, v) = self
            .decide(json!({"key": key, "route": "/api/complete", "method": "POST", "peek": true}))
            .await;
        assert_eq!(status, 200, "{v}");
        remaining(&v, "tpm")
    }
}

fn header(r: &reqwest::Response, name: &str) -> String {
    r.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned()
}

#[tokio::test]
async fn the_demo_completion_reserves_max_tokens_and_settles_used_tokens() {
    let s = shipped();
    let r = s
        .complete("free_c1", json!({"max_tokens": 3000, "used_tokens": 500}))
        .await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-ratelimit-remaining-tokens"), "7000");
    drop(r);
    eventually(
        Duration::from_secs(10),
        "2500 tokens given back",
        || async { (s.tokens_left("free_c1").await == 9500).then_some(()) },
    )
    .await;
    // A completion that can never fit is refused, charging nothing.
    let r = s.complete("free_c1", json!({"max_tokens": 20000})).await;
    assert_eq!(r.status(), 429);
    assert_eq!(s.tokens_left("free_c1").await, 9500);
    for bad in [
        json!({"max_tokens": "x"}),
        json!({"max_tokens": 1, "ms": 10001}),
    ] {
        let r = s.complete("free_c1", bad.clone()).await;
        assert_eq!(r.status(), 400, "{bad}");
    }
}

#[tokio::test]
async fn a_streamed_completion_holds_its_stream_slot_until_its_body_ends() {
    let s = shipped();
    let stream = s
        .complete(
            "free_c2",
            json!({"max_tokens": 10, "stream": true, "ms": 3000}),
        )
        .await;
    assert_eq!(stream.status(), 200, "the head comes at once");
    let r = s.complete("free_c2", json!({"max_tokens": 10})).await;
    assert_eq!(r.status(), 429, "the free plan streams one at a time");
    let refusal: Value = r.json().await.unwrap();
    assert_eq!(refusal["limit"], "streams", "{refusal}");
    let body = stream.text().await.expect("the stream ends");
    assert!(body.contains("\"used_tokens\":10"), "{body}");
    eventually(Duration::from_secs(10), "the slot comes back", || async {
        let r = s.complete("free_c2", json!({"max_tokens": 10})).await;
        (r.status() == 200).then_some(())
    })
    .await;
}
