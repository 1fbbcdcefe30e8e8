//! The rate limit service over real gRPC: a tonic client with ratewatch's
//! wire messages, over a real socket, against `ratewatch serve
//! --grpc-listen` and the library server, on the memory store, a real
//! Redis (killed and frozen) and a real Redis Cluster.

mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use ratewatch::Limiter;
use ratewatch::service::grpc::ProstCodec;
use ratewatch::service::proto::{
    Code, Entry, HealthCheckRequest, HealthCheckResponse, RateLimitDescriptor, RateLimitRequest,
    RateLimitResponse, ServingStatus, UInt64Value, Unit,
};
use ratewatch::service::{RateLimitService, serve};
use support::{Ratewatch, RedisCluster, RedisServer, free_port};
use tonic::transport::Channel;

const EDGE_YAML: &str = r#"
domain: edge
descriptors:
  - key: remote_address
    rate_limit:
      unit: minute
      requests_per_unit: 3
  - key: tight
    rate_limit:
      unit: hour
      requests_per_unit: 1
  - key: shadow
    shadow_mode: true
    rate_limit:
      unit: hour
      requests_per_unit: 1
  - key: free
    rate_limit:
      unlimited: true
  - key: twice
    rate_limit:
      unit: hour
      requests_per_unit: 5
  - key: denied
    rate_limit:
      unit: hour
      requests_per_unit: 0
"#;

/// A policy directory: `ratewatch.toml` (store `store`, `[rls]
/// on_store_failure = failure`) beside `edge.yaml`.
fn policy_dir(store: &str, failure: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("edge.yaml"), EDGE_YAML).expect("yaml");
    let toml = format!(
        r#"
{store}

[resilience]
breaker = {{ failures = 3, open_ms = 60000 }}
expected_instances = 3

[rls]
envoy_configs = ["edge.yaml"]
on_store_failure = "{failure}"
"#
    );
    std::fs::write(dir.path().join("ratewatch.toml"), toml).expect("toml");
    dir
}

fn redis_store(url: &str) -> String {
    format!("[store]\nkind = \"redis\"\nurl = \"{url}\"\ntimeout_ms = 50\n")
}

/// Serves the library's gRPC service for the policy in `dir` on a free
/// port; the task ends with the test's runtime.
async fn library_server(dir: &Path) -> (Limiter, Channel) {
    let limiter = Limiter::from_config_file(dir.join("ratewatch.toml"))
        .await
        .expect("limiter");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let service = RateLimitService::new(limiter.clone());
    tokio::spawn(serve(service, listener, std::future::pending()));
    let c = channel(&addr.to_string()).await;
    warm(&c).await;
    (limiter, c)
}

/// Waits until the store itself answers (its connection is made in the
/// background, and a loaded machine may miss the first timeouts): a
/// failure policy's answer reports no time until reset.
async fn warm(c: &Channel) {
    let mut probe = descriptor(&[("remote_address", "warm-up")]);
    probe.hits_addend = Some(UInt64Value { value: 0 });
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(r) = ask(c, request(vec![probe.clone()])).await {
            if r.statuses[0]
                .duration_until_reset
                .is_some_and(|d| d.seconds > 0)
            {
                return;
            }
        }
        assert!(Instant::now() < deadline, "the store never answered");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn channel(addr: &str) -> Channel {
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .expect("endpoint")
        .connect_timeout(Duration::from_secs(5));
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match endpoint.connect().await {
            Ok(c) => return c,
            Err(e) => {
                assert!(Instant::now() < deadline, "no gRPC server at {addr}: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

async fn ask(
    channel: &Channel,
    request: RateLimitRequest,
) -> Result<RateLimitResponse, tonic::Status> {
    let mut grpc = tonic::client::Grpc::new(channel.clone());
    grpc.ready().await.expect("channel ready");
    grpc.unary(
        tonic::Request::new(request),
        http::uri::PathAndQuery::from_static(
            "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
        ),
        ProstCodec::<RateLimitRequest, RateLimitResponse>::default(),
    )
    .await
    .map(tonic::Response::into_inner)
}

async fn health(channel: &Channel, service: &str) -> Result<i32, tonic::Status> {
    let mut grpc = tonic::client::Grpc::new(channel.clone());
    grpc.ready().await.expect("channel ready");
    grpc.unary(
        tonic::Request::new(HealthCheckRequest {
            service: service.into(),
        }),
        http::uri::PathAndQuery::from_static("/grpc.health.v1.Health/Check"),
        ProstCodec::<HealthCheckRequest, HealthCheckResponse>::default(),
    )
    .await
    .map(|r| r.into_inner().status)
}

fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(k, v)| Entry {
                key: (*k).into(),
                value: (*v).into(),
            })
            .collect(),
        limit: None,
        hits_addend: None,
    }
}

fn request(descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest {
        domain: "edge".into(),
        descriptors,
        hits_addend: 0,
    }
}

const OK: i32 = Code::Ok as i32;
const OVER: i32 = Code::OverLimit as i32;

/// Waits until the current minute has at least 5 s left: the rules count
/// in fixed minute windows aligned to the epoch, and a sequence that
/// straddles a window's end would see its counts reset.
async fn clear_of_minute_edge() {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    let into = now.as_millis() % 60_000;
    if into > 55_000 {
        tokio::time::sleep(Duration::from_millis((60_000 - into) as u64 + 50)).await;
    }
}

/// The decision rules every store must answer alike.
async fn decides_like_envoyproxy_ratelimit_but_all_or_nothing(c: &Channel, tag: &str) {
    clear_of_minute_edge().await;
    let addr = format!("10.0.0.{tag}");
    // Statuses: one per descriptor, in request order, each with its limit.
    let r = ask(
        c,
        request(vec![
            descriptor(&[("free", "x")]),
            descriptor(&[("remote_address", &addr)]),
            descriptor(&[("nobody", "configured")]),
            descriptor(&[("tight", &addr)]),
        ]),
    )
    .await
    .expect("answer");
    assert_eq!(r.overall_code, OK);
    assert_eq!(r.statuses.len(), 4);
    assert!(r.statuses.iter().all(|s| s.code == OK));
    assert_eq!(r.statuses[0].current_limit, None, "unlimited has no limit");
    assert_eq!(
        r.statuses[0].limit_remaining,
        u32::MAX,
        "unlimited leaves all of u32, as envoyproxy/ratelimit reports it"
    );
    assert_eq!(
        r.statuses[2].limit_remaining, 0,
        "no rule, nothing reported"
    );
    assert_eq!(r.statuses[2].current_limit, None, "no rule matched");
    let ra = r.statuses[1].current_limit.as_ref().expect("a limit");
    assert_eq!((ra.requests_per_unit, ra.unit), (3, Unit::Minute as i32));
    assert_eq!(r.statuses[1].limit_remaining, 2);
    let reset = r.statuses[1].duration_until_reset.expect("a reset");
    assert!((1..=60).contains(&reset.seconds), "{reset:?}");
    let tight = r.statuses[3].current_limit.as_ref().expect("a limit");
    assert_eq!(
        (tight.requests_per_unit, tight.unit),
        (1, Unit::Hour as i32)
    );
    assert_eq!(r.statuses[3].limit_remaining, 0);
    assert!(
        r.response_headers_to_add.is_empty(),
        "no headers unless [rls] response_headers = \"ietf\": {:?}",
        r.response_headers_to_add
    );

    // The tight descriptor refuses: the whole request is OVER_LIMIT and
    // the remote_address counter is NOT charged.
    let r = ask(
        c,
        request(vec![
            descriptor(&[("remote_address", &addr)]),
            descriptor(&[("tight", &addr)]),
        ]),
    )
    .await
    .expect("answer");
    assert_eq!(r.overall_code, OVER);
    assert_eq!(r.statuses[0].code, OK);
    assert_eq!(r.statuses[1].code, OVER);
    // 2 left, as before the refused request.
    assert_eq!(r.statuses[0].limit_remaining, 2);
    for left in [1, 0] {
        let r = ask(c, request(vec![descriptor(&[("remote_address", &addr)])]))
            .await
            .expect("answer");
        assert_eq!(r.overall_code, OK, "a refused request charged nothing");
        assert_eq!(r.statuses[0].limit_remaining, left);
    }
    let r = ask(c, request(vec![descriptor(&[("remote_address", &addr)])]))
        .await
        .expect("answer");
    assert_eq!(r.overall_code, OVER);

    // An explicit hits_addend of 0 checks without charging; a shadow rule
    // over its limit answers OK.
    let mut check = descriptor(&[("remote_address", &format!("{addr}9"))]);
    check.hits_addend = Some(UInt64Value { value: 0 });
    for _ in 0..5 {
        let r = ask(c, request(vec![check.clone()])).await.expect("answer");
        assert_eq!(r.overall_code, OK);
        assert_eq!(r.statuses[0].limit_remaining, 3);
    }
    for _ in 0..3 {
        let r = ask(c, request(vec![descriptor(&[("shadow", &addr)])]))
            .await
            .expect("answer");
        assert_eq!(r.overall_code, OK);
        assert_eq!(r.statuses[0].code, OK);
    }

    // A request-level hits_addend charges every descriptor that much.
    let mut heavy = request(vec![descriptor(&[("remote_address", &format!("{addr}8"))])]);
    heavy.hits_addend = 3;
    assert_eq!(
        ask(c, heavy.clone()).await.expect("answer").overall_code,
        OK
    );
    assert_eq!(ask(c, heavy).await.expect("answer").overall_code, OVER);

    // OVER_LIMIT leaves nothing, even when only the addend was too large
    // for what is left (1 here).
    let some = format!("{addr}7");
    let mut two = request(vec![descriptor(&[("remote_address", &some)])]);
    two.hits_addend = 2;
    assert_eq!(ask(c, two.clone()).await.expect("answer").overall_code, OK);
    let r = ask(c, two).await.expect("answer");
    assert_eq!(r.overall_code, OVER);
    assert_eq!(r.statuses[0].code, OVER);
    assert_eq!(r.statuses[0].limit_remaining, 0);
    let mut check = descriptor(&[("remote_address", &some)]);
    check.hits_addend = Some(UInt64Value { value: 0 });
    let r = ask(c, request(vec![check])).await.expect("answer");
    assert_eq!(
        r.statuses[0].limit_remaining, 1,
        "the refused hits charged nothing"
    );

    // requests_per_unit: 0 refuses every hit (envoyproxy/ratelimit's deny
    // list), all or nothing with the request's other descriptors; a check
    // of 0 passes.
    let other = format!("{addr}6");
    let r = ask(
        c,
        request(vec![
            descriptor(&[("remote_address", &other)]),
            descriptor(&[("denied", "anyone")]),
        ]),
    )
    .await
    .expect("answer");
    assert_eq!(r.overall_code, OVER);
    assert_eq!((r.statuses[0].code, r.statuses[1].code), (OK, OVER));
    let denied = r.statuses[1].current_limit.as_ref().expect("a limit");
    assert_eq!(
        (denied.requests_per_unit, denied.unit),
        (0, Unit::Hour as i32)
    );
    assert_eq!(r.statuses[1].limit_remaining, 0);
    let mut look = descriptor(&[("denied", "anyone")]);
    look.hits_addend = Some(UInt64Value { value: 0 });
    let r = ask(
        c,
        request(vec![descriptor(&[("remote_address", &other)]), look]),
    )
    .await
    .expect("answer");
    assert_eq!(r.overall_code, OK, "a check of a deny rule passes");
    assert_eq!(
        r.statuses[0].limit_remaining, 2,
        "the refused request charged nothing"
    );

    // An unknown domain is OK, with a status per descriptor.
    let mut other = request(vec![descriptor(&[("a", "b")]), descriptor(&[("c", "d")])]);
    other.domain = "nobody-knows".into();
    let r = ask(c, other).await.expect("answer");
    assert_eq!(r.overall_code, OK);
    assert_eq!(r.statuses.len(), 2);
}

/// A descriptor sent twice in one request (Envoy sends a route's and its
/// virtual host's) names one counter twice: each copy is charged, in
/// order, inside the one atomic call, as envoyproxy/ratelimit charges it;
/// a check-only copy (addend 0) reports what the charged one left.
async fn every_copy_of_a_repeated_descriptor_is_charged(c: &Channel, tag: &str) {
    let with = |value: &str, addend: u64| {
        let mut d = descriptor(&[("twice", value)]);
        d.hits_addend = Some(UInt64Value { value: addend });
        d
    };
    // [k +1, k +0] at 5 an hour: 5 of 100 pass, not 100.
    let k = format!("check-{tag}");
    let mut admitted = 0;
    for _ in 0..100 {
        let r = ask(c, request(vec![with(&k, 1), with(&k, 0)]))
            .await
            .expect("answer");
        assert_eq!(r.statuses.len(), 2);
        if r.overall_code == OK {
            admitted += 1;
            let left = 5 - admitted;
            assert_eq!(r.statuses[0].limit_remaining, left);
            assert_eq!(
                r.statuses[1].limit_remaining, left,
                "the check sees the charge"
            );
        } else {
            assert_eq!(r.statuses[0].code, OVER);
        }
    }
    assert_eq!(admitted, 5, "[k +1, k +0] charges 1 per request");

    // [k +1, k +1] charges 2: twice (2, 4), then 6 > 5 is refused and
    // charges neither copy, so one more single hit still fits.
    let k = format!("pair-{tag}");
    for left in [(4, 3), (2, 1)] {
        let r = ask(c, request(vec![with(&k, 1), with(&k, 1)]))
            .await
            .expect("answer");
        assert_eq!(r.overall_code, OK);
        let got = (r.statuses[0].limit_remaining, r.statuses[1].limit_remaining);
        assert_eq!(got, left);
    }
    let r = ask(c, request(vec![with(&k, 1), with(&k, 1)]))
        .await
        .expect("answer");
    assert_eq!(r.overall_code, OVER);
    assert_eq!((r.statuses[0].code, r.statuses[1].code), (OK, OVER));
    let r = ask(c, request(vec![descriptor(&[("twice", &k)])]))
        .await
        .expect("answer");
    assert_eq!(r.overall_code, OK, "the refused pair charged nothing");
    assert_eq!(r.statuses[0].limit_remaining, 0);
    let r = ask(c, request(vec![descriptor(&[("twice", &k)])]))
        .await
        .expect("answer");
    assert_eq!(r.overall_code, OVER);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_descriptor_is_charged_once_per_copy_on_the_memory_store() {
    let dir = policy_dir("", "open");
    let (_limiter, c) = library_server(dir.path()).await;
    every_copy_of_a_repeated_descriptor_is_charged(&c, "memory").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_descriptor_is_charged_once_per_copy_on_redis_in_one_script_call() {
    let redis = RedisServer::start();
    let dir = policy_dir(&redis_store(&redis.url()), "open");
    let (_limiter, c) = library_server(dir.path()).await;
    let before = redis.command_calls("evalsha");
    every_copy_of_a_repeated_descriptor_is_charged(&c, "redis").await;
    assert_eq!(
        redis.command_calls("evalsha") - before,
        100 + 3 + 2,
        "one script call per request"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_descriptor_is_charged_once_per_copy_on_a_cluster() {
    let cluster = RedisCluster::start();
    let nodes = cluster
        .urls()
        .iter()
        .map(|u| format!("\"{u}\""))
        .collect::<Vec<_>>()
        .join(", ");
    let store = format!("[store]\nkind = \"redis-cluster\"\nnodes = [{nodes}]\ntimeout_ms = 200\n");
    let dir = policy_dir(&store, "open");
    let (_limiter, c) = library_server(dir.path()).await;
    every_copy_of_a_repeated_descriptor_is_charged(&c, "cluster").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_domain_or_descriptor_list_is_an_error_as_envoyproxy_ratelimit_answers_it() {
    let dir = policy_dir("", "open");
    let (_limiter, c) = library_server(dir.path()).await;
    let mut no_domain = request(vec![descriptor(&[("remote_address", "x")])]);
    no_domain.domain = String::new();
    let e = ask(&c, no_domain).await.expect_err("an error");
    assert_eq!(e.code(), tonic::Code::Unknown);
    assert_eq!(e.message(), "rate limit domain must not be empty");
    let e = ask(&c, request(vec![])).await.expect_err("an error");
    assert_eq!(e.code(), tonic::Code::Unknown);
    assert_eq!(e.message(), "rate limit descriptor list must not be empty");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn response_headers_ietf_adds_ratelimit_policy_and_ratelimit_for_the_client() {
    let dir = policy_dir("", "open");
    let toml = std::fs::read_to_string(dir.path().join("ratewatch.toml")).unwrap();
    std::fs::write(
        dir.path().join("ratewatch.toml"),
        toml.replace("[rls]\n", "[rls]\nresponse_headers = \"ietf\"\n"),
    )
    .unwrap();
    let (_limiter, c) = library_server(dir.path()).await;
    clear_of_minute_edge().await;
    let r = ask(&c, request(vec![descriptor(&[("remote_address", "ietf")])]))
        .await
        .expect("answer");
    let header = |name: &str| {
        r.response_headers_to_add
            .iter()
            .find(|h| h.key == name)
            .map(|h| h.value.clone())
    };
    assert_eq!(
        header("RateLimit-Policy").as_deref(),
        Some("\"minute\";q=3;w=60")
    );
    let rl = header("RateLimit").expect("RateLimit");
    assert!(rl.starts_with("\"minute\";r=2;t="), "{rl}");
}

/// Envoy's token pattern: the request is checked (addend 0) before it
/// runs, and the tokens it used are charged by a second `rate_limits`
/// entry with `apply_on_stream_done` once its response is done. The
/// charge always lands, past the limit as capped debt, so the next check
/// refuses once the tokens used reach the limit.
async fn tokens_used_after_the_response_are_charged_and_stop_the_next_request(store: &str) {
    let dir = tempfile::tempdir().expect("temp dir");
    let toml = format!(
        r#"
{store}

[[rls.domains]]
name = "llm"

[[rls.domains.rules]]
descriptor = ["api_key"]
name = "tokens"
apply_on_stream_done = true
limits = [{{ name = "tpm", algorithm = "fixed_window", limit = 100, window = "1h" }}]
"#
    );
    std::fs::write(dir.path().join("ratewatch.toml"), toml).expect("toml");
    let limiter = Limiter::from_config_file(dir.path().join("ratewatch.toml"))
        .await
        .expect("limiter");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(serve(
        RateLimitService::new(limiter),
        listener,
        std::future::pending(),
    ));
    let c = channel(&addr.to_string()).await;
    let llm = |addend: u64| {
        let mut d = descriptor(&[("api_key", "k1")]);
        d.hits_addend = Some(UInt64Value { value: addend });
        RateLimitRequest {
            domain: "llm".into(),
            descriptors: vec![d],
            hits_addend: 0,
        }
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    let check = loop {
        match ask(&c, llm(0)).await {
            Ok(r) if r.statuses[0].duration_until_reset.is_some() => break r,
            _ => {
                assert!(Instant::now() < deadline, "the store never answered");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    assert_eq!(check.overall_code, OK);
    assert_eq!(check.statuses[0].limit_remaining, 100);
    // A response that used 60 tokens, then one that used 70: more than
    // was left, charged all the same.
    let r = ask(&c, llm(60)).await.expect("answer");
    assert_eq!((r.overall_code, r.statuses[0].limit_remaining), (OK, 40));
    assert_eq!(ask(&c, llm(0)).await.expect("answer").overall_code, OK);
    let r = ask(&c, llm(70)).await.expect("answer");
    assert_eq!(
        r.overall_code, OK,
        "a charge after the response is never refused"
    );
    assert_eq!(r.statuses[0].limit_remaining, 0);
    // 130 of 100 used: the next request's check refuses, whether it
    // checks only (an explicit 0) or comes as Envoy's request-time entry
    // sends it, with no addend at all (decided at 1, not forced).
    let r = ask(&c, llm(0)).await.expect("answer");
    assert_eq!(r.overall_code, OVER);
    assert_eq!(r.statuses[0].limit_remaining, 0);
    let plain = RateLimitRequest {
        domain: "llm".into(),
        descriptors: vec![descriptor(&[("api_key", "k1")])],
        hits_addend: 0,
    };
    assert_eq!(
        ask(&c, plain.clone()).await.expect("answer").overall_code,
        OVER
    );
    // Another caller's request with no addend is an ordinary hit of 1.
    let mut fresh = plain;
    fresh.descriptors = vec![descriptor(&[("api_key", "k2")])];
    let r = ask(&c, fresh).await.expect("answer");
    assert_eq!((r.overall_code, r.statuses[0].limit_remaining), (OK, 99));
    // The debt is capped (twice the limit): a hostile report of u64::MAX
    // tokens neither wraps the counter nor locks the key for longer.
    let r = ask(&c, llm(u64::MAX)).await.expect("answer");
    assert_eq!(r.overall_code, OK);
    assert_eq!(ask(&c, llm(0)).await.expect("answer").overall_code, OVER);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_charged_after_the_response_land_and_refuse_the_next_check_on_the_memory_store() {
    tokens_used_after_the_response_are_charged_and_stop_the_next_request("").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_charged_after_the_response_land_and_refuse_the_next_check_on_redis() {
    let redis = RedisServer::start();
    tokens_used_after_the_response_are_charged_and_stop_the_next_request(&redis_store(
        &redis.url(),
    ))
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_serves_grpc_decisions_and_health_on_the_memory_store() {
    let dir = policy_dir("", "open");
    let grpc_port = free_port();
    let grpc_addr = format!("127.0.0.1:{grpc_port}");
    let _rw = Ratewatch::start(
        "serve",
        Some(&dir.path().join("ratewatch.toml")),
        &[("RATEWATCH_GRPC_LISTEN", &grpc_addr)],
    );
    let c = channel(&grpc_addr).await;
    assert_eq!(health(&c, "").await.unwrap(), ServingStatus::Serving as i32);
    assert_eq!(
        health(&c, "envoy.service.ratelimit.v3.RateLimitService")
            .await
            .unwrap(),
        ServingStatus::Serving as i32
    );
    assert_eq!(
        health(&c, "nope").await.unwrap_err().code(),
        tonic::Code::NotFound
    );
    decides_like_envoyproxy_ratelimit_but_all_or_nothing(&c, "1").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_redis_decides_the_same_in_one_script_call() {
    let redis = RedisServer::start();
    let dir = policy_dir(&redis_store(&redis.url()), "open");
    let (_limiter, c) = library_server(dir.path()).await;
    decides_like_envoyproxy_ratelimit_but_all_or_nothing(&c, "2").await;
    // Four descriptors, one EVALSHA.
    let before = redis.command_calls("evalsha");
    let r = ask(
        &c,
        request(vec![
            descriptor(&[("remote_address", "192.0.2.1")]),
            descriptor(&[("remote_address", "192.0.2.2")]),
            descriptor(&[("tight", "192.0.2.3")]),
            descriptor(&[("shadow", "192.0.2.3")]),
        ]),
    )
    .await
    .expect("answer");
    assert_eq!(r.overall_code, OK);
    assert_eq!(redis.command_calls("evalsha") - before, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_decides_every_descriptor_of_a_request_on_one_slot() {
    let cluster = RedisCluster::start();
    let nodes = cluster
        .urls()
        .iter()
        .map(|u| format!("\"{u}\""))
        .collect::<Vec<_>>()
        .join(", ");
    let store = format!("[store]\nkind = \"redis-cluster\"\nnodes = [{nodes}]\ntimeout_ms = 200\n");
    let dir = policy_dir(&store, "open");
    let (_limiter, c) = library_server(dir.path()).await;
    decides_like_envoyproxy_ratelimit_but_all_or_nothing(&c, "3").await;
    for i in 0..5 {
        let before = cluster.command_calls("evalsha");
        let r = ask(
            &c,
            request(vec![
                descriptor(&[("remote_address", &format!("198.51.100.{i}"))]),
                descriptor(&[("remote_address", &format!("203.0.113.{i}"))]),
                descriptor(&[("tight", &format!("t{i}"))]),
            ]),
        )
        .await
        .expect("answer");
        assert_eq!(r.overall_code, OK);
        assert_eq!(
            cluster.command_calls("evalsha") - before,
            1,
            "one script on one slot for the whole request"
        );
    }
}

/// Asks 20 times while Redis is unreachable; every answer comes within
/// the store timeout (50 ms) + 350 ms (under the Redis client's own 500 ms
/// response timeout, what an unbounded call would wait for, and wide
/// enough for a machine at load 8) and is what `check` says.
async fn answers_within_bound(
    c: &Channel,
    check: impl Fn(Result<RateLimitResponse, tonic::Status>),
) {
    let bound = Duration::from_millis(50 + 350);
    for i in 0..20 {
        let started = Instant::now();
        let answer = ask(
            c,
            request(vec![descriptor(&[("remote_address", &format!("a{i}"))])]),
        )
        .await;
        let took = started.elapsed();
        assert!(took < bound, "answer {i} took {took:?}");
        check(answer);
    }
}

async fn under_failure(
    failure: &str,
    check: impl Fn(Result<RateLimitResponse, tonic::Status>) + Copy,
) {
    let mut redis = RedisServer::start();
    let dir = policy_dir(&redis_store(&redis.url()), failure);
    let (_limiter, c) = library_server(dir.path()).await;
    // Frozen: every call waits the timeout until the breaker opens.
    redis.pause();
    answers_within_bound(&c, check).await;
    redis.resume();
    // Killed: refused connections, then the open breaker.
    redis.kill();
    answers_within_bound(&c, check).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_answers_ok_while_redis_is_frozen_or_killed() {
    under_failure("open", |a| {
        let r = a.expect("an answer");
        assert_eq!(r.overall_code, OK);
        assert_eq!(r.statuses.len(), 1);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closed_answers_over_limit_while_redis_is_frozen_or_killed() {
    under_failure("closed", |a| {
        let r = a.expect("an answer");
        assert_eq!(r.overall_code, OVER);
        assert_eq!(r.statuses[0].code, OVER);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unavailable_answers_grpc_unavailable_while_redis_is_frozen_or_killed() {
    under_failure("unavailable", |a| {
        assert_eq!(a.expect_err("no answer").code(), tonic::Code::Unavailable);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_decides_in_process_while_redis_is_killed() {
    let mut redis = RedisServer::start();
    let dir = policy_dir(&redis_store(&redis.url()), "local");
    let (_limiter, c) = library_server(dir.path()).await;
    redis.kill();
    clear_of_minute_edge().await;
    // The local share of 3 per minute over 3 expected instances is 1.
    let one = || request(vec![descriptor(&[("remote_address", "local")])]);
    let first = ask(&c, one()).await.expect("answer");
    assert_eq!(first.overall_code, OK);
    let second = ask(&c, one()).await.expect("answer");
    assert_eq!(second.overall_code, OVER);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_deployment_decides_the_same_in_one_script_call_on_its_master() {
    use support::sentinel::{MASTER_NAME, SentinelSet};
    let set = tokio::task::spawn_blocking(SentinelSet::start)
        .await
        .expect("sentinels");
    let sentinels = set
        .urls()
        .iter()
        .map(|u| format!("\"{u}\""))
        .collect::<Vec<_>>()
        .join(", ");
    let store = format!(
        "[store]\nkind = \"redis-sentinel\"\nmaster_name = \"{MASTER_NAME}\"\nsentinels = [{sentinels}]\ntimeout_ms = 200\n"
    );
    let dir = policy_dir(&store, "open");
    let (limiter, c) = library_server(dir.path()).await;
    assert_eq!(limiter.store().kind(), "redis-sentinel");
    decides_like_envoyproxy_ratelimit_but_all_or_nothing(&c, "4").await;
    let before = set.master.command_calls("evalsha");
    let r = ask(
        &c,
        request(vec![
            descriptor(&[("remote_address", "192.0.2.41")]),
            descriptor(&[("tight", "192.0.2.41")]),
        ]),
    )
    .await
    .expect("answer");
    assert_eq!(r.overall_code, OK);
    assert_eq!(set.master.command_calls("evalsha") - before, 1);
}
