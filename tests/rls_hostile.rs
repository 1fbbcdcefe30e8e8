//! The decision service against a hostile client: numbers at the edge of
//! their types, limits sent with the request, oversized and malformed
//! bodies. Nothing panics, nothing wraps, a refused request charges
//! nothing, and no request value reaches a metric label.

mod support;

use std::net::SocketAddr;

use axum::body::Body;
use axum::extract::connect_info::MockConnectInfo;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use ratewatch::{Limiter, server};
use serde_json::{Value, json};
use tower::ServiceExt;

const EDGE_YAML: &str = r#"
domain: edge
descriptors:
  - key: remote_address
    rate_limit:
      unit: hour
      requests_per_unit: 2
"#;

async fn app() -> (tempfile::TempDir, Limiter) {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("edge.yaml"), EDGE_YAML).expect("yaml");
    let toml = r#"
[identity]
default_tier = "free"
anonymous_tier = "free"

[[tiers]]
name = "free"
match_prefix = "free_"
limits = [{ name = "burst", algorithm = "fixed_window", limit = 2, window = "1h" }]

[rls]
envoy_configs = ["edge.yaml"]
"#;
    let file = dir.path().join("ratewatch.toml");
    std::fs::write(&file, toml).expect("toml");
    let limiter = Limiter::from_config_file(&file).await.expect("limiter");
    (dir, limiter)
}

async fn post(limiter: &Limiter, path: &str, body: impl Into<Body>) -> (StatusCode, Value) {
    let peer: SocketAddr = "127.0.0.1:5000".parse().unwrap();
    let app = server::app(limiter.clone()).layer(MockConnectInfo(peer));
    let req = Request::post(path)
        .header("content-type", "application/json")
        .body(body.into())
        .unwrap();
    let res = app.oneshot(req).await.unwrap();
    let status = res.status();
    let bytes = res.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

async fn metrics(limiter: &Limiter) -> String {
    let res = server::app(limiter.clone())
        .oneshot(Request::get("/metrics").body(Body::empty()).unwrap())
        .await
        .unwrap();
    String::from_utf8(res.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap()
}

fn one(value: &str, extra: Value) -> String {
    let mut d = json!({"entries": [{"key": "remote_address", "value": value}]});
    d.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    json!({"domain": "edge", "descriptors": [d]}).to_string()
}

#[tokio::test]
async fn a_descriptor_hits_addend_of_u64_max_is_refused_and_never_wraps_a_counter() {
    let (_dir, limiter) = app().await;
    let plain = one("198.51.100.1", json!({}));
    assert_eq!(
        post(&limiter, "/json", plain.clone()).await.0,
        StatusCode::OK
    );
    // 1 + u64::MAX would wrap to 0 and admit, and set the count back.
    let huge = one("198.51.100.1", json!({"hitsAddend": u64::MAX.to_string()}));
    let (status, v) = post(&limiter, "/json", huge).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{v}");
    // The refusal charged nothing: one more fits, then the limit holds.
    assert_eq!(
        post(&limiter, "/json", plain.clone()).await.0,
        StatusCode::OK
    );
    assert_eq!(
        post(&limiter, "/json", plain).await.0,
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[tokio::test]
async fn decide_by_key_with_a_cost_of_u64_max_is_refused_and_never_wraps_a_counter() {
    let (_dir, limiter) = app().await;
    let body = |cost: u64| json!({"key": "free_k1", "cost": cost}).to_string();
    assert_eq!(
        post(&limiter, "/v1/decide", body(1)).await.0,
        StatusCode::OK
    );
    let (status, v) = post(&limiter, "/v1/decide", body(u64::MAX)).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{v}");
    // It can never pass: no retry time is made up.
    assert_eq!(v["retry_after_secs"], serde_json::Value::Null, "{v}");
    assert_eq!(
        post(&limiter, "/v1/decide", body(1)).await.0,
        StatusCode::OK
    );
    assert_eq!(
        post(&limiter, "/v1/decide", body(1)).await.0,
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[tokio::test]
async fn an_override_of_zero_requests_refuses_and_other_overrides_stay_out_of_metric_labels() {
    let (_dir, limiter) = app().await;
    let zero = one(
        "198.51.100.2",
        json!({"limit": {"requestsPerUnit": 0, "unit": "MINUTE"}}),
    );
    let (status, v) = post(&limiter, "/json", zero).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{v}");
    // A client choosing the number of an override it trips must not mint
    // a metric series per number.
    for n in [1_234_567u32, 7_654_321] {
        let over = one(
            "198.51.100.3",
            json!({"limit": {"requestsPerUnit": n, "unit": "HOUR"}, "hitsAddend": u64::from(n) + 1}),
        );
        let (status, v) = post(&limiter, "/json", over).await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{v}");
    }
    let text = metrics(&limiter).await;
    for n in ["1234567", "7654321"] {
        assert!(
            !text
                .lines()
                .any(|l| l.starts_with("ratewatch") && l.contains(n)),
            "request number {n} in a metric label:\n{text}"
        );
    }
}

#[tokio::test]
async fn oversized_deep_and_malformed_bodies_are_400_with_a_reason() {
    let (_dir, limiter) = app().await;
    let big = format!(
        r#"{{"domain":"edge","descriptors":[],"pad":"{}"}}"#,
        "x".repeat(1 << 20)
    );
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    let many = json!({"domain": "edge", "descriptors":
        (0..3000).map(|_| json!({})).collect::<Vec<_>>()})
    .to_string();
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("/json", big.clone().into_bytes()),
        ("/v1/decide", big.into_bytes()),
        ("/json", deep.clone().into_bytes()),
        ("/v1/decide", deep.into_bytes()),
        ("/json", b"{\"domain\":\"\xff\xfe\"}".to_vec()),
        ("/v1/decide", b"{\"key\":\"\xff\"}".to_vec()),
        ("/json", br#"{"hitsAddend":"-1"}"#.to_vec()),
        ("/json", br#"{"hitsAddend":"1.5"}"#.to_vec()),
        ("/json", br#"{"hitsAddend":4294967296}"#.to_vec()),
        ("/json", br#"{"descriptors":[{"hitsAddend":-1}]}"#.to_vec()),
        (
            "/json",
            br#"{"descriptors":[{"hitsAddend":"18446744073709551616"}]}"#.to_vec(),
        ),
        (
            "/json",
            br#"{"descriptors":[{"limit":{"unit":99}}]}"#.to_vec(),
        ),
        (
            "/json",
            br#"{"descriptors":[{"limit":{"unit":"WEEKS"}}]}"#.to_vec(),
        ),
        ("/v1/decide", br#"{"key":"free_k","cost":-1}"#.to_vec()),
        ("/v1/decide", br#"{"key":"free_k","cost":1.5}"#.to_vec()),
        ("/v1/decide", br#"{"key":"free_k","identity":"u"}"#.to_vec()),
        (
            "/v1/decide",
            br#"{"domain":"edge","descriptors":[{"k":1}]}"#.to_vec(),
        ),
    ];
    for (path, body) in cases {
        let shown = String::from_utf8_lossy(&body)
            .chars()
            .take(80)
            .collect::<String>();
        let (status, v) = post(&limiter, path, body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path} {shown}: {v}");
        assert!(v["error"].as_str().is_some_and(|e| !e.is_empty()), "{v}");
    }
    // Thousands of descriptors fit the 64 KiB body: refused by count.
    let (status, v) = post(&limiter, "/json", many).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    assert!(v["error"].as_str().unwrap().contains("descriptors"), "{v}");
    let wide = json!({"domain": "edge", "descriptors": [{"entries":
        (0..1000).map(|_| json!({})).collect::<Vec<_>>()}]})
    .to_string();
    let (status, v) = post(&limiter, "/json", wide).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    assert!(v["error"].as_str().unwrap().contains("entries"), "{v}");
    let decide_many = json!({"domain": "edge", "descriptors":
        (0..3000).map(|_| json!({"a": "b"})).collect::<Vec<_>>()})
    .to_string();
    let (status, v) = post(&limiter, "/v1/decide", decide_many).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    // A request at the bound is decided.
    let at_bound = json!({"domain": "edge", "descriptors":
        (0..128).map(|i| json!({"entries": [{"key": "remote_address", "value": format!("203.0.113.{i}")}]})).collect::<Vec<_>>()})
    .to_string();
    let (status, v) = post(&limiter, "/json", at_bound).await;
    assert_eq!(status, StatusCode::OK, "{v}");
}

mod grpc {
    use std::time::{Duration, Instant};

    use ratewatch::service::grpc::ProstCodec;
    use ratewatch::service::proto::{
        Code, Entry, RateLimitDescriptor, RateLimitOverride, RateLimitRequest, RateLimitResponse,
        UInt64Value,
    };
    use ratewatch::service::{RateLimitService, serve};
    use tonic::transport::Channel;

    async fn server() -> (tempfile::TempDir, Channel) {
        let (dir, limiter) = super::app().await;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(serve(
            RateLimitService::new(limiter),
            listener,
            std::future::pending(),
        ));
        let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .expect("endpoint")
            .connect_timeout(Duration::from_secs(5));
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            match endpoint.connect().await {
                Ok(c) => return (dir, c),
                Err(e) => {
                    assert!(Instant::now() < deadline, "no gRPC server: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }

    async fn ask(c: &Channel, r: RateLimitRequest) -> Result<RateLimitResponse, tonic::Status> {
        let mut grpc = tonic::client::Grpc::new(c.clone());
        grpc.ready().await.expect("channel ready");
        grpc.unary(
            tonic::Request::new(r),
            http::uri::PathAndQuery::from_static(
                "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
            ),
            ProstCodec::<RateLimitRequest, RateLimitResponse>::default(),
        )
        .await
        .map(tonic::Response::into_inner)
    }

    fn descriptor(value: &str) -> RateLimitDescriptor {
        RateLimitDescriptor {
            entries: vec![Entry {
                key: "remote_address".into(),
                value: value.into(),
            }],
            ..RateLimitDescriptor::default()
        }
    }

    fn request(descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
        RateLimitRequest {
            domain: "edge".into(),
            descriptors,
            hits_addend: 0,
        }
    }

    fn code(r: &RateLimitResponse) -> Code {
        Code::try_from(r.overall_code).unwrap()
    }

    #[tokio::test]
    async fn grpc_hits_addend_of_u64_max_is_over_limit_and_charges_nothing() {
        let (_dir, c) = server().await;
        let plain = request(vec![descriptor("198.51.100.9")]);
        assert_eq!(code(&ask(&c, plain.clone()).await.unwrap()), Code::Ok);
        let mut huge = descriptor("198.51.100.9");
        huge.hits_addend = Some(UInt64Value { value: u64::MAX });
        let r = ask(&c, request(vec![huge])).await.unwrap();
        assert_eq!(code(&r), Code::OverLimit);
        // Request-wide u32::MAX on two descriptors of one counter.
        let mut wide = request(vec![descriptor("198.51.100.9"), descriptor("198.51.100.9")]);
        wide.hits_addend = u32::MAX;
        assert_eq!(code(&ask(&c, wide).await.unwrap()), Code::OverLimit);
        assert_eq!(code(&ask(&c, plain.clone()).await.unwrap()), Code::Ok);
        assert_eq!(code(&ask(&c, plain).await.unwrap()), Code::OverLimit);
    }

    #[tokio::test]
    async fn grpc_overrides_of_zero_and_unknown_units_never_panic() {
        let (_dir, c) = server().await;
        let mut zero = descriptor("198.51.100.10");
        zero.limit = Some(RateLimitOverride {
            requests_per_unit: 0,
            unit: 2,
        });
        assert_eq!(
            code(&ask(&c, request(vec![zero])).await.unwrap()),
            Code::OverLimit
        );
        // An unknown unit drops the override: the configured limit applies.
        let mut odd = descriptor("198.51.100.11");
        odd.limit = Some(RateLimitOverride {
            requests_per_unit: 1,
            unit: 99,
        });
        let r = ask(&c, request(vec![odd])).await.unwrap();
        assert_eq!(code(&r), Code::Ok);
        assert_eq!(r.statuses[0].limit_remaining, 1);
    }

    #[tokio::test]
    async fn grpc_requests_with_too_many_descriptors_or_entries_are_invalid_argument() {
        let (_dir, c) = server().await;
        // 100k descriptors in 200 KB: refused before decoding them all.
        let huge = request(
            (0..100_000)
                .map(|_| RateLimitDescriptor::default())
                .collect(),
        );
        let e = ask(&c, huge).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::OutOfRange, "{e:?}");
        let many = request((0..1000).map(|_| RateLimitDescriptor::default()).collect());
        let e = ask(&c, many).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
        assert!(e.message().contains("descriptors"), "{e:?}");
        let wide = RateLimitDescriptor {
            entries: (0..1000).map(|_| Entry::default()).collect(),
            ..RateLimitDescriptor::default()
        };
        let e = ask(&c, request(vec![wide])).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
        assert!(e.message().contains("entries"), "{e:?}");
        // Invalid UTF-8 in a string field: the message is malformed.
        let mut bytes = Vec::new();
        prost::Message::encode(&request(vec![descriptor("\u{1}x")]), &mut bytes).unwrap();
        let at = bytes.iter().position(|b| *b == 1).unwrap();
        bytes[at] = 0xff;
        let mut grpc = tonic::client::Grpc::new(c.clone());
        grpc.ready().await.unwrap();
        let e = grpc
            .unary(
                tonic::Request::new(RawBytes(bytes)),
                http::uri::PathAndQuery::from_static(
                    "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
                ),
                ProstCodec::<RawBytes, RateLimitResponse>::default(),
            )
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    }

    /// Bytes sent as they are: a message no prost type would write.
    #[derive(Clone, Default)]
    struct RawBytes(Vec<u8>);

    impl std::fmt::Debug for RawBytes {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "{} bytes", self.0.len())
        }
    }

    impl prost::Message for RawBytes {
        fn encode_raw(&self, buf: &mut impl prost::bytes::BufMut) {
            buf.put_slice(&self.0);
        }
        // Only ever sent; a decoded one keeps nothing of what it read.
        fn merge_field(
            &mut self,
            tag: u32,
            wire_type: prost::encoding::WireType,
            buf: &mut impl prost::bytes::Buf,
            ctx: prost::encoding::DecodeContext,
        ) -> Result<(), prost::DecodeError> {
            prost::encoding::skip_field(wire_type, tag, buf, ctx)
        }
        fn encoded_len(&self) -> usize {
            self.0.len()
        }
        fn clear(&mut self) {
            self.0.clear();
        }
    }
}
