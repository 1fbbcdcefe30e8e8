//! The `llm_gateway` example, run as its operators would: two instances of
//! the gateway on one real Redis, each built from the example's own policy
//! file, driven over real sockets. Requests and tokens per window hold
//! across both, tokens reserved from `max_tokens` and settled from what the
//! model used.

#[path = "../examples/llm_gateway.rs"]
#[allow(dead_code)]
mod llm_gateway;
mod support;

use std::time::{Duration, Instant};

use ratewatch::identity::{Identity, IdentityKind};
use ratewatch::{Limiter, Policy};
use support::RedisServer;

/// The example's policy on `redis`, its windows a day long so a test that
/// straddles a minute boundary still counts in one window.
fn policy(redis: &RedisServer) -> Policy {
    let text = std::fs::read_to_string("examples/llm_gateway.toml")
        .expect("the example's policy")
        .replace("redis://127.0.0.1:6379", &redis.url())
        .replace("window = \"60s\"", "window = \"1d\"");
    Policy::from_toml_str(&text, Some("examples/llm_gateway.toml")).expect("a valid policy")
}

/// One instance of the gateway on a free loopback port: its URL, and its
/// limiter to look at the counts without charging them.
async fn instance(redis: &RedisServer) -> (String, Limiter) {
    let limiter = Limiter::new(policy(redis)).await.expect("limiter");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = llm_gateway::app(&limiter);
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}/v1/completions"), limiter)
}

/// The tokens `key` of the free plan has left, as the store counts them.
async fn tokens_left(limiter: &Limiter, key: &str) -> f64 {
    let who = Identity::new(IdentityKind::ApiKey, key);
    let d = limiter.peek(&who, "free", None).await;
    d.limits
        .iter()
        .find(|l| &*l.unit == "tokens")
        .and_then(|l| l.remaining)
        .expect("a tokens limit")
}

/// Waits until the store shows `want` tokens left for `key`: a settle is
/// made after the response, in the background.
async fn settled(limiter: &Limiter, key: &str, want: f64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = tokens_left(limiter, key).await;
        if left == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{left} tokens left, not {want}: the settle did not land"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn post(url: &str, key: &str, body: serde_json::Value) -> reqwest::Response {
    reqwest::Client::new()
        .post(url)
        .header("x-api-key", key)
        .json(&body)
        .send()
        .await
        .expect("an answer")
}

fn header(r: &reqwest::Response, name: &str) -> String {
    r.headers()
        .get(name)
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tokens_are_reserved_settled_and_never_exceed_the_plan_across_two_instances() {
    let redis = RedisServer::start();
    let (a, b) = (instance(&redis).await, instance(&redis).await);
    let urls = [a.0.clone(), b.0.clone()];
    // Each request reserves its max_tokens (500) and uses 150 (its prompt),
    // so a request passes while 500 are left: 11 pass and settle to 1,650
    // of the free plan's 2,000 tokens, and the 12th, reserving 500 with
    // 350 left, is refused whichever instance it reaches.
    let prompt = "x".repeat(150);
    for i in 0..11u64 {
        let r = post(
            &urls[i as usize % 2],
            "free_alice",
            serde_json::json!({"prompt": prompt, "max_tokens": 500}),
        )
        .await;
        assert_eq!(r.status(), 200, "request {i}");
        // The answer shows the reservation: 500 charged on top of what the
        // earlier requests used.
        assert_eq!(header(&r, "x-ratelimit-limit-tokens"), "2000");
        let reserved_left = 2000 - 150 * i - 500;
        assert_eq!(
            header(&r, "x-ratelimit-remaining-tokens"),
            reserved_left.to_string(),
            "request {i}"
        );
        drop(r.bytes().await);
        // Then the settle gives back the 350 it did not use, as the other
        // instance sees it.
        let other = if i % 2 == 0 { &b.1 } else { &a.1 };
        settled(other, "free_alice", (2000 - 150 * (i + 1)) as f64).await;
    }
    let refused = post(
        &urls[1],
        "free_alice",
        serde_json::json!({"prompt": prompt, "max_tokens": 500}),
    )
    .await;
    assert_eq!(refused.status(), 429);
    let body: serde_json::Value = refused.json().await.unwrap();
    assert_eq!(body["limit"], "tpm", "{body}");
    assert_eq!(body["unit"], "tokens", "{body}");
    // What is left is what was not used: a request that fits passes.
    let small = post(
        &urls[0],
        "free_alice",
        serde_json::json!({"prompt": "x".repeat(40), "max_tokens": 300}),
    )
    .await;
    assert_eq!(small.status(), 200);
    assert_eq!(header(&small, "x-ratelimit-remaining-tokens"), "50");
    // Requests per minute are counted beside: 12 admitted of 20, the
    // refused one charged nothing.
    assert_eq!(header(&small, "x-ratelimit-remaining-requests"), "8");
    // Another key of the plan has its own budget.
    let bob = post(
        &urls[1],
        "free_bob",
        serde_json::json!({"prompt": "hi", "max_tokens": 500}),
    )
    .await;
    assert_eq!(bob.status(), 200);
}
