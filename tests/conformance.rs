//! Conformance with envoyproxy/ratelimit: what its documentation and its
//! own tests (`test/config`, `test/service`, `test/integration`,
//! `examples/`) expect of a rate limit service, asked of ratewatch with
//! YAML files of the same shapes (in `tests/conformance/`, one case a
//! file), table by table:
//!
//! - the limit every descriptor gets, through `POST /json` and gRPC;
//! - the refusal, line and field of every invalid file;
//! - answers to sequences of requests (OK / OVER_LIMIT, `limit_remaining`,
//!   `duration_until_reset`, a request's `hits_addend`, a descriptor's own
//!   `limit`, `shadow_mode`, `replaces`, `unlimited`, a deny-list rule),
//!   through both front ends;
//! - one domain in two files, merged or refused;
//! - a YAML edited (and one added) under a directory entry, applied
//!   without a signal.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::connect_info::MockConnectInfo;
use http::Request;
use http_body_util::BodyExt;
use ratewatch::policy::rls::Domain;
use ratewatch::service::grpc::ProstCodec;
use ratewatch::service::proto::{
    Entry, RateLimitDescriptor, RateLimitOverride, RateLimitRequest, RateLimitResponse, UInt64Value,
};
use ratewatch::{Follow, Limiter, Policy, server};
use serde_json::{Value, json};
use tower::ServiceExt;

/// A descriptor entry: key, value.
type Pair = (&'static str, &'static str);
/// A descriptor's entries.
type Entries = Vec<Pair>;

/// A case file.
fn case(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/conformance")
        .join(name)
}

/// A policy directory with `files` copied in and named in `envoy_configs`,
/// plus `extra` lines of `[rls]`.
fn policy_dir(files: &[(&str, &str)], extra: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut names = Vec::new();
    for (case_name, as_name) in files {
        std::fs::copy(case(case_name), dir.path().join(as_name)).expect("copy a case");
        names.push(format!("\"{as_name}\""));
    }
    let toml = dir.path().join("ratewatch.toml");
    std::fs::write(
        &toml,
        format!("[rls]\nenvoy_configs = [{}]\n{extra}\n", names.join(", ")),
    )
    .expect("toml");
    (dir, toml)
}

/// Both front ends of one limiter.
struct Service {
    _dir: tempfile::TempDir,
    http: axum::Router,
    grpc: tonic::transport::Channel,
}

async fn service(files: &[&str]) -> Service {
    let files: Vec<(&str, &str)> = files.iter().map(|f| (*f, *f)).collect();
    let (dir, toml) = policy_dir(&files, "");
    let limiter = Limiter::from_config_file(&toml).await.expect("limiter");
    front_ends(dir, limiter).await
}

async fn front_ends(dir: tempfile::TempDir, limiter: Limiter) -> Service {
    let local: SocketAddr = "127.0.0.1:5000".parse().unwrap();
    let http = server::app(limiter.clone()).layer(MockConnectInfo(local));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().unwrap();
    let svc = ratewatch::service::RateLimitService::new(limiter);
    tokio::spawn(ratewatch::service::serve(
        svc,
        listener,
        std::future::pending(),
    ));
    let grpc = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .expect("connect");
    Service {
        _dir: dir,
        http,
        grpc,
    }
}

/// One descriptor of a request.
#[derive(Clone, Copy)]
struct D<'a> {
    entries: &'a [(&'a str, &'a str)],
    /// A limit of its own: requests per unit, unit name.
    limit: Option<(u32, &'a str)>,
    hits_addend: Option<u64>,
}

const fn d<'a>(entries: &'a [(&'a str, &'a str)]) -> D<'a> {
    D {
        entries,
        limit: None,
        hits_addend: None,
    }
}

/// One descriptor's status, front-end neutral.
#[derive(Debug, Clone, PartialEq)]
struct Status {
    over: bool,
    /// requests_per_unit, unit, name.
    limit: Option<(u32, String, String)>,
    remaining: u32,
    reset_secs: u64,
}

/// An answer, front-end neutral.
#[derive(Debug)]
struct Answer {
    over: bool,
    statuses: Vec<Status>,
}

const UNITS: [&str; 8] = [
    "UNKNOWN", "SECOND", "MINUTE", "HOUR", "DAY", "MONTH", "YEAR", "WEEK",
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Api {
    Grpc,
    Json,
}

impl Service {
    async fn ask(&self, api: Api, domain: &str, ds: &[D<'_>], hits_addend: u32) -> Answer {
        match api {
            Api::Grpc => self.ask_grpc(domain, ds, hits_addend).await,
            Api::Json => self.ask_json(domain, ds, hits_addend).await,
        }
    }

    async fn ask_grpc(&self, domain: &str, ds: &[D<'_>], hits_addend: u32) -> Answer {
        let request = RateLimitRequest {
            domain: domain.into(),
            descriptors: ds
                .iter()
                .map(|d| RateLimitDescriptor {
                    entries: d
                        .entries
                        .iter()
                        .map(|(k, v)| Entry {
                            key: (*k).into(),
                            value: (*v).into(),
                        })
                        .collect(),
                    limit: d.limit.map(|(n, unit)| RateLimitOverride {
                        requests_per_unit: n,
                        unit: UNITS.iter().position(|u| *u == unit).unwrap() as i32,
                    }),
                    hits_addend: d.hits_addend.map(|value| UInt64Value { value }),
                })
                .collect(),
            hits_addend,
        };
        let mut grpc = tonic::client::Grpc::new(self.grpc.clone());
        grpc.ready().await.expect("ready");
        let r: RateLimitResponse = grpc
            .unary(
                tonic::Request::new(request),
                http::uri::PathAndQuery::from_static(
                    "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
                ),
                ProstCodec::<RateLimitRequest, RateLimitResponse>::default(),
            )
            .await
            .expect("a gRPC answer")
            .into_inner();
        Answer {
            over: r.overall_code == 2,
            statuses: r
                .statuses
                .iter()
                .map(|s| Status {
                    over: s.code == 2,
                    limit: s.current_limit.as_ref().map(|l| {
                        (
                            l.requests_per_unit,
                            UNITS[l.unit as usize].to_owned(),
                            l.name.clone(),
                        )
                    }),
                    remaining: s.limit_remaining,
                    reset_secs: s.duration_until_reset.map_or(0, |d| d.seconds as u64),
                })
                .collect(),
        }
    }

    async fn ask_json(&self, domain: &str, ds: &[D<'_>], hits_addend: u32) -> Answer {
        let descriptors: Vec<Value> = ds
            .iter()
            .map(|d| {
                let mut o = json!({"entries": d.entries.iter()
                    .map(|(k, v)| json!({"key": k, "value": v})).collect::<Vec<_>>()});
                if let Some((n, unit)) = d.limit {
                    o["limit"] = json!({"requestsPerUnit": n, "unit": unit});
                }
                if let Some(n) = d.hits_addend {
                    o["hitsAddend"] = json!(n);
                }
                o
            })
            .collect();
        let body = json!({"domain": domain, "descriptors": descriptors, "hitsAddend": hits_addend});
        let res = self
            .http
            .clone()
            .oneshot(
                Request::post("/json")
                    .header("content-type", "application/json")
                    .body(Body::from(body.to_string()))
                    .unwrap(),
            )
            .await
            .unwrap();
        let bytes = res.into_body().collect().await.unwrap().to_bytes();
        let v: Value = serde_json::from_slice(&bytes).expect("a JSON answer");
        let over = |c: &Value| c == "OVER_LIMIT";
        Answer {
            over: over(&v["overallCode"]),
            statuses: v["statuses"]
                .as_array()
                .expect("statuses")
                .iter()
                .map(|s| Status {
                    over: over(&s["code"]),
                    limit: s.get("currentLimit").map(|l| {
                        (
                            l["requestsPerUnit"].as_u64().unwrap_or(0) as u32,
                            l["unit"].as_str().unwrap_or("UNKNOWN").to_owned(),
                            l["name"].as_str().unwrap_or("").to_owned(),
                        )
                    }),
                    remaining: s["limitRemaining"].as_u64().unwrap_or(0) as u32,
                    reset_secs: s["durationUntilReset"].as_str().map_or(0, |t| {
                        t.trim_end_matches('s').parse::<f64>().unwrap() as u64
                    }),
                })
                .collect(),
        }
    }

    /// The limit `entries` get in `domain`, checked without charging.
    async fn limit_of(&self, api: Api, domain: &str, entries: &[(&str, &str)]) -> Got {
        let probe = D {
            hits_addend: Some(0),
            ..d(entries)
        };
        let a = self.ask(api, domain, &[probe], 0).await;
        let s = &a.statuses[0];
        assert!(!s.over, "a check is never over: {s:?}");
        match &s.limit {
            Some((n, unit, name)) => Got::Limit(*n, unit.clone(), name.clone()),
            None if s.remaining == u32::MAX => Got::Unlimited,
            None => Got::Nothing,
        }
    }
}

/// What a descriptor gets.
#[derive(Debug, Clone, PartialEq)]
enum Got {
    /// No rule: OK, no limit, nothing counted.
    Nothing,
    /// `unlimited: true`: OK with all of u32 left.
    Unlimited,
    /// requests per unit, unit, name.
    Limit(u32, String, String),
}

fn lim(n: u32, unit: &str) -> Got {
    Got::Limit(n, unit.into(), String::new())
}

/// Waits until the current minute has at least 5 s left: limits count in
/// windows aligned to the epoch, and a sequence straddling a window's end
/// would see its counts reset.
async fn clear_of_minute_edge() {
    let into = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis()
        % 60_000;
    if into > 55_000 {
        tokio::time::sleep(Duration::from_millis((60_000 - into) as u64 + 50)).await;
    }
}

#[tokio::test]
async fn every_descriptor_gets_the_limit_the_peer_gives_it() {
    let s = service(&["basic.yaml", "wildcard.yaml", "shadow.yaml"]).await;
    let named = |n, unit: &str, name: &str| Got::Limit(n, unit.into(), name.into());
    #[rustfmt::skip]
    let table: Vec<(&str, Entries, Got)> = vec![
        // An unknown domain, and a level without a rule.
        ("no-such-domain", vec![("client", "x")], Got::Nothing),
        ("conf-basic", vec![("tenant", "globex")], Got::Nothing),
        ("conf-basic", vec![("tenant", "acme")], Got::Nothing),
        // Deeper or shallower than a rule: nothing.
        ("conf-basic", vec![("plan", "gold"), ("seat", "guest")], Got::Nothing),
        ("conf-basic", vec![("client", "partner"), ("extra", "1")], Got::Nothing),
        // Key-only default, then a specific value.
        ("conf-basic", vec![("tenant", "acme"), ("route", "cart")], lim(5, "SECOND")),
        ("conf-basic", vec![("tenant", "acme"), ("route", "checkout")], lim(10, "SECOND")),
        ("conf-basic", vec![("client", "someone")], lim(20, "MINUTE")),
        ("conf-basic", vec![("client", "partner")], lim(30, "MINUTE")),
        // A value listed without a limit is exempt from the default.
        ("conf-basic", vec![("client", "internal")], Got::Nothing),
        ("conf-basic", vec![("region", "eu")], lim(1, "HOUR")),
        ("conf-basic", vec![("upload", "u-1")], named(1, "DAY", "upload_daily")),
        ("conf-basic", vec![("plan", "gold")], lim(15, "DAY")),
        ("conf-basic", vec![("plan", "gold"), ("seat", "owner")], lim(25, "DAY")),
        ("conf-basic", vec![("crawler", "bot")], Got::Unlimited),
        ("conf-basic", vec![("user", "a")], lim(70, "MINUTE")),
        ("conf-basic", vec![("user", "b")], lim(70, "MINUTE")),
        ("conf-basic", vec![("blocked", "x")], lim(0, "SECOND")),
        // A unit in capitals, and the week the v3 response knows.
        ("conf-basic", vec![("seats", "s")], lim(7, "WEEK")),
        // Wildcards: a star matches any run, possibly empty; an exact
        // value is matched whole.
        ("conf-wild", vec![("object", "img-1.png")], lim(21, "MINUTE")),
        ("conf-wild", vec![("object", "img")], lim(21, "MINUTE")),
        ("conf-wild", vec![("object", "pic")], Got::Nothing),
        ("conf-wild", vec![("exact", "img")], lim(22, "MINUTE")),
        ("conf-wild", vec![("exact", "img2")], Got::Nothing),
        ("conf-wild", vec![("anyval", "whatever")], lim(23, "MINUTE")),
        ("conf-wild", vec![("middle", "abz")], lim(24, "MINUTE")),
        ("conf-wild", vec![("middle", "ab--z")], lim(24, "MINUTE")),
        ("conf-wild", vec![("middle", "ab--y")], Got::Nothing),
        ("conf-wild", vec![("many", "a1b2c")], lim(25, "MINUTE")),
        ("conf-wild", vec![("many", "a1c2b")], Got::Nothing),
        ("conf-wild", vec![("bucket", "b1"), ("object", "doc-9")], lim(26, "MINUTE")),
        ("conf-wild", vec![("bucket", "b1"), ("object", "img-9")], Got::Nothing),
        ("conf-wild", vec![("bucket", "b2"), ("object", "doc-9")], Got::Nothing),
        // shadow_mode changes nothing about the limit reported.
        ("conf-shadow", vec![("app", "web"), ("page", "home")], lim(1, "HOUR")),
        ("conf-shadow", vec![("caller", "x")], lim(1, "HOUR")),
        ("conf-shadow", vec![("caller", "vip")], lim(2, "HOUR")),
    ];
    for api in [Api::Grpc, Api::Json] {
        for (domain, entries, want) in &table {
            let got = s.limit_of(api, domain, entries).await;
            assert_eq!(&got, want, "{api:?} {domain} {entries:?}");
        }
    }
}

/// One request of a sequence and what it must get: the overall code and
/// each status's (over, remaining).
struct Step<'a> {
    domain: &'a str,
    descriptors: Vec<D<'a>>,
    hits_addend: u32,
    over: bool,
    statuses: Vec<(bool, u32)>,
}

fn step<'a>(
    domain: &'a str,
    descriptors: Vec<D<'a>>,
    hits_addend: u32,
    over: bool,
    statuses: Vec<(bool, u32)>,
) -> Step<'a> {
    Step {
        domain,
        descriptors,
        hits_addend,
        over,
        statuses,
    }
}

/// Runs `steps` through `api`, checking every answer; returns the answers.
async fn run(s: &Service, api: Api, name: &str, steps: &[Step<'_>]) -> Vec<Answer> {
    let mut out = Vec::new();
    for (i, st) in steps.iter().enumerate() {
        let a = s.ask(api, st.domain, &st.descriptors, st.hits_addend).await;
        let got: Vec<(bool, u32)> = a.statuses.iter().map(|s| (s.over, s.remaining)).collect();
        assert_eq!(
            (a.over, &got),
            (st.over, &st.statuses),
            "{api:?} {name}, step {i}: {a:?}"
        );
        out.push(a);
    }
    out
}

const OK: bool = false;
const OVER: bool = true;
const ALL: u32 = u32::MAX;

#[tokio::test]
async fn sequences_of_requests_are_answered_as_the_peer_answers_them() {
    let s = service(&["basic.yaml", "shadow.yaml", "replaces.yaml"]).await;
    for api in [Api::Grpc, Api::Json] {
        clear_of_minute_edge().await;
        // Each front end counts on values of its own.
        let v = match api {
            Api::Grpc => "grpc",
            Api::Json => "json",
        };
        let region = [("region", v)];
        let a = run(
            &s,
            api,
            "one per hour",
            &[
                step("conf-basic", vec![d(&region)], 0, OK, vec![(OK, 0)]),
                step("conf-basic", vec![d(&region)], 0, OVER, vec![(OVER, 0)]),
            ],
        )
        .await;
        for answer in &a {
            let r = answer.statuses[0].reset_secs;
            assert!(r > 0 && r <= 3600, "{api:?}: reset in {r} s");
        }

        // A request's hits_addend charges every descriptor that much.
        let client = [("client", v)];
        run(
            &s,
            api,
            "hits_addend",
            &[
                step("conf-basic", vec![d(&client)], 5, OK, vec![(OK, 15)]),
                step("conf-basic", vec![d(&client)], 15, OK, vec![(OK, 0)]),
                step("conf-basic", vec![d(&client)], 1, OVER, vec![(OVER, 0)]),
                // A descriptor's own addend of 0 only checks.
                step(
                    "conf-basic",
                    vec![D {
                        hits_addend: Some(0),
                        ..d(&client)
                    }],
                    7,
                    OK,
                    vec![(OK, 0)],
                ),
            ],
        )
        .await;

        // A descriptor's own limit replaces the configured one.
        let quota = [("quota", v)];
        let own = D {
            limit: Some((2, "MINUTE")),
            ..d(&quota)
        };
        let a = run(
            &s,
            api,
            "override",
            &[
                step("conf-basic", vec![own], 0, OK, vec![(OK, 1)]),
                step("conf-basic", vec![own], 0, OK, vec![(OK, 0)]),
                step("conf-basic", vec![own], 0, OVER, vec![(OVER, 0)]),
                // The configured 3 per hour has its own counter.
                step("conf-basic", vec![d(&quota)], 0, OK, vec![(OK, 2)]),
            ],
        )
        .await;
        assert_eq!(
            a[0].statuses[0].limit,
            Some((2, "MINUTE".to_owned(), String::new()))
        );
        assert!(a[0].statuses[0].reset_secs <= 60);

        // Unlimited and unmatched descriptors are always OK; a deny-list
        // rule always refuses.
        let crawler = [("crawler", v)];
        let nobody = [("nobody", v)];
        let blocked = [("blocked", v)];
        run(
            &s,
            api,
            "unlimited, unmatched, deny",
            &[
                step(
                    "conf-basic",
                    vec![d(&crawler), d(&nobody)],
                    0,
                    OK,
                    vec![(OK, ALL), (OK, 0)],
                ),
                step(
                    "conf-basic",
                    vec![d(&crawler), d(&nobody)],
                    1000,
                    OK,
                    vec![(OK, ALL), (OK, 0)],
                ),
                step("conf-basic", vec![d(&blocked)], 0, OVER, vec![(OVER, 0)]),
                step("unknown-domain", vec![d(&blocked)], 0, OK, vec![(OK, 0)]),
            ],
        )
        .await;

        // shadow_mode: counted, reported, never refused; its enforced
        // neighbour refuses.
        let shadowed = [("caller", v)];
        let vip = [("caller", "vip")];
        let page = [("app", "web"), ("page", "home")];
        let other_page = [("app", "web"), ("page", v)];
        let vip_steps = match api {
            Api::Grpc => vec![
                step("conf-shadow", vec![d(&vip)], 0, OK, vec![(OK, 1)]),
                step("conf-shadow", vec![d(&vip)], 0, OK, vec![(OK, 0)]),
                step("conf-shadow", vec![d(&vip)], 0, OVER, vec![(OVER, 0)]),
            ],
            Api::Json => vec![step("conf-shadow", vec![d(&vip)], 0, OVER, vec![(OVER, 0)])],
        };
        run(
            &s,
            api,
            "shadow",
            &[
                step("conf-shadow", vec![d(&shadowed)], 0, OK, vec![(OK, 0)]),
                step("conf-shadow", vec![d(&shadowed)], 0, OK, vec![(OK, 0)]),
                step("conf-shadow", vec![d(&shadowed)], 0, OK, vec![(OK, 0)]),
            ],
        )
        .await;
        if api == Api::Grpc {
            run(
                &s,
                api,
                "shadow page",
                &[
                    step("conf-shadow", vec![d(&page)], 0, OK, vec![(OK, 0)]),
                    step("conf-shadow", vec![d(&page)], 0, OK, vec![(OK, 0)]),
                ],
            )
            .await;
        }
        run(
            &s,
            api,
            "enforced page",
            &[
                step("conf-shadow", vec![d(&other_page)], 0, OK, vec![(OK, 0)]),
                step(
                    "conf-shadow",
                    vec![d(&other_page)],
                    0,
                    OVER,
                    vec![(OVER, 0)],
                ),
            ],
        )
        .await;
        run(&s, api, "enforced neighbour", &vip_steps).await;

        // replaces: a matched rule naming another matched rule's name
        // takes its place; the replaced one is not counted.
        let team = [("team", "core")];
        let member = [("member", v)];
        let lead = [("member", "lead")];
        let team_steps: Vec<Step> = match api {
            Api::Grpc => (0..4)
                .map(|i| {
                    step(
                        "conf-replaces",
                        vec![d(&team), d(&member)],
                        0,
                        OK,
                        vec![(OK, 3 - i), (OK, 0)],
                    )
                })
                .chain([step(
                    "conf-replaces",
                    vec![d(&team), d(&member)],
                    0,
                    OVER,
                    vec![(OVER, 0), (OK, 0)],
                )])
                .collect(),
            Api::Json => vec![step(
                "conf-replaces",
                vec![d(&team), d(&member)],
                0,
                OVER,
                vec![(OVER, 0), (OK, 0)],
            )],
        };
        let a = run(&s, api, "replaces", &team_steps).await;
        assert_eq!(
            a[0].statuses[1].limit, None,
            "the replaced rule reports no limit"
        );
        // Alone, the member's own limit applies (and counts from zero).
        run(
            &s,
            api,
            "not replaced",
            &[
                step("conf-replaces", vec![d(&member)], 0, OK, vec![(OK, 0)]),
                step("conf-replaces", vec![d(&member)], 0, OVER, vec![(OVER, 0)]),
            ],
        )
        .await;
        if api == Api::Grpc {
            let bob = [("member", "bob")];
            run(
                &s,
                api,
                "lead replaces per_member",
                &[
                    step(
                        "conf-replaces",
                        vec![d(&lead), d(&bob)],
                        0,
                        OK,
                        vec![(OK, 1), (OK, 0)],
                    ),
                    step(
                        "conf-replaces",
                        vec![d(&lead), d(&bob)],
                        0,
                        OK,
                        vec![(OK, 0), (OK, 0)],
                    ),
                    step("conf-replaces", vec![d(&bob)], 0, OK, vec![(OK, 0)]),
                ],
            )
            .await;
        }
    }
}

#[test]
fn invalid_files_are_refused_naming_line_field_and_reason() {
    #[rustfmt::skip]
    let table: [(&str, usize, &str, &str); 14] = [
        ("bad_unit.yaml", 5, "descriptors[0].rate_limit.unit", "got \"fortnight\""),
        ("bad_yaml.yaml", 1, "", "YAML syntax error"),
        ("duplicate_key.yaml", 5, "descriptors[1]", "repeats the descriptor `k_v`"),
        ("empty_domain.yaml", 1, "domain", "must not be empty"),
        ("empty_key.yaml", 3, "descriptors[0].key", "non-empty key"),
        ("misspelled_descriptor_field.yaml", 4, "descriptors[0].ratelimit", "is not a field of a descriptor"),
        ("misspelled_rate_limit_field.yaml", 6, "descriptors[0].rate_limit.requestsperunit", "is not a field of a rate_limit"),
        ("non_map_list.yaml", 3, "descriptors[0]", "must be a mapping"),
        ("non_string_key.yaml", 1, "1.5", "is not a field of the top level"),
        ("replaces_empty.yaml", 9, "descriptors[0].rate_limit.replaces[0].name", "must name the rate_limit"),
        ("replaces_self.yaml", 9, "descriptors[0].rate_limit.replaces[0].name", "itself"),
        ("unlimited_with_unit.yaml", 6, "descriptors[0].rate_limit.unit", "must not be set when `unlimited` is true"),
        ("quota_mode.yaml", 5, "descriptors[0].quota_mode", "quota mode"),
        ("share_threshold_without_wildcard.yaml", 5, "descriptors[0].share_threshold", "only be used with a wildcard"),
    ];
    for (file, line, field, reason) in table {
        let path = case(&format!("invalid/{file}"));
        let err = Domain::from_envoy_yaml_file(&path).unwrap_err();
        let text = err.to_string();
        assert_eq!(err.line(), Some(line), "{file}: {text}");
        assert_eq!(err.field().unwrap_or(""), field, "{file}: {text}");
        assert!(text.contains(reason), "{file}: {text}");
        assert!(text.contains(file), "names the file: {text}");
        // And the policy naming it is refused with the same error.
        let (_dir, toml) = policy_dir(&[(&format!("invalid/{file}"), file)], "");
        let err = Policy::from_toml_file(&toml).unwrap_err().to_string();
        assert!(err.contains(reason), "{file}: {err}");
    }
}

#[tokio::test]
async fn a_shared_wildcard_counts_every_value_it_matches_on_one_counter() {
    let s = service(&["share.yaml"]).await;
    // One counter for files/*, whatever the value and the front end.
    run(
        &s,
        Api::Grpc,
        "share_threshold",
        &[step(
            "conf-share",
            vec![d(&[("files", "files/a")])],
            0,
            OK,
            vec![(OK, 1)],
        )],
    )
    .await;
    run(
        &s,
        Api::Json,
        "share_threshold",
        &[
            step(
                "conf-share",
                vec![d(&[("files", "files/b")])],
                0,
                OK,
                vec![(OK, 0)],
            ),
            step(
                "conf-share",
                vec![d(&[("files", "files/c")])],
                0,
                OVER,
                vec![(OVER, 0)],
            ),
        ],
    )
    .await;
    // Without it, each value the wildcard matches has its own.
    run(
        &s,
        Api::Grpc,
        "no share_threshold",
        &[
            step(
                "conf-share",
                vec![d(&[("pics", "pics/a")])],
                0,
                OK,
                vec![(OK, 0)],
            ),
            step(
                "conf-share",
                vec![d(&[("pics", "pics/b")])],
                0,
                OK,
                vec![(OK, 0)],
            ),
            step(
                "conf-share",
                vec![d(&[("pics", "pics/a")])],
                0,
                OVER,
                vec![(OVER, 0)],
            ),
        ],
    )
    .await;
    // A shared level above a nested rule: every tenant t-* shares the
    // op's counter, but ops below it stay apart.
    run(
        &s,
        Api::Json,
        "share_threshold above a nested rule",
        &[
            step(
                "conf-share",
                vec![d(&[("tenant", "t-1"), ("op", "read")])],
                0,
                OK,
                vec![(OK, 0)],
            ),
            step(
                "conf-share",
                vec![d(&[("tenant", "t-2"), ("op", "read")])],
                0,
                OVER,
                vec![(OVER, 0)],
            ),
            step(
                "conf-share",
                vec![d(&[("tenant", "t-2"), ("op", "write")])],
                0,
                OK,
                vec![(OK, 0)],
            ),
        ],
    )
    .await;
}

#[tokio::test]
async fn one_domain_in_two_files_merges_when_asked_and_is_refused_otherwise() {
    let files = [
        ("merge_a.yaml", "merge_a.yaml"),
        ("merge_b.yaml", "merge_b.yaml"),
    ];
    let (_dir, toml) = policy_dir(&files, "");
    let err = Policy::from_toml_file(&toml).unwrap_err().to_string();
    assert!(
        err.contains("merge_a.yaml") && err.contains("merge_b.yaml") && err.contains("conf-merged"),
        "{err}"
    );

    let (dir, toml) = policy_dir(&files, "merge_domains = true");
    let limiter = Limiter::from_config_file(&toml).await.expect("merged");
    let s = front_ends(dir, limiter).await;
    for api in [Api::Grpc, Api::Json] {
        assert_eq!(
            s.limit_of(api, "conf-merged", &[("left", "l1")]).await,
            lim(10, "MINUTE")
        );
        assert_eq!(
            s.limit_of(api, "conf-merged", &[("right", "r1")]).await,
            lim(20, "MINUTE")
        );
    }

    // The same entry from two files is a duplicate even when merging.
    let twice = [("merge_a.yaml", "one.yaml"), ("merge_a.yaml", "two.yaml")];
    let (_dir, toml) = policy_dir(&twice, "merge_domains = true");
    let err = Policy::from_toml_file(&toml).unwrap_err().to_string();
    assert!(err.contains("left_l1"), "{err}");
}

#[tokio::test]
async fn a_yaml_edited_or_added_under_a_directory_entry_applies_without_a_signal() {
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("rules");
    std::fs::create_dir(&rules).unwrap();
    let yaml = |n: u32| {
        format!(
            "domain: conf-reload\ndescriptors:\n  - key: k\n    rate_limit: {{unit: minute, requests_per_unit: {n}}}\n"
        )
    };
    std::fs::write(rules.join("reload.yaml"), yaml(1)).unwrap();
    let toml = dir.path().join("ratewatch.toml");
    std::fs::write(&toml, "[rls]\nenvoy_configs = [\"rules\"]\n").unwrap();
    let quick = Follow::every(Duration::from_millis(50)).settle(Duration::from_millis(50));
    let limiter = Limiter::builder_from_file(&toml)
        .await
        .unwrap()
        .with_follow(quick)
        .build()
        .await
        .unwrap();
    let s = front_ends(dir, limiter).await;
    assert_eq!(
        s.limit_of(Api::Grpc, "conf-reload", &[("k", "v")]).await,
        lim(1, "MINUTE")
    );

    std::fs::write(rules.join("reload.yaml"), yaml(9)).unwrap();
    wait_for(&s, "conf-reload", lim(9, "MINUTE")).await;

    std::fs::copy(case("wildcard.yaml"), rules.join("added.yaml")).unwrap();
    wait_for(&s, "conf-wild", lim(21, "MINUTE")).await;

    // A broken edit keeps the running rules.
    std::fs::write(
        rules.join("reload.yaml"),
        "domain: conf-reload\ndescriptors: [oops\n",
    )
    .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        s.limit_of(Api::Json, "conf-reload", &[("k", "v")]).await,
        lim(9, "MINUTE")
    );
}

/// Waits (up to 60 s: a loaded machine settles and reloads late) until `domain`'s probe answers `want`.
async fn wait_for(s: &Service, domain: &str, want: Got) {
    let entries: &[(&str, &str)] = if domain == "conf-wild" {
        &[("object", "img1")]
    } else {
        &[("k", "v")]
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let got = s.limit_of(Api::Json, domain, entries).await;
        if got == want {
            return;
        }
        assert!(Instant::now() < deadline, "{domain} still answers {got:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[test]
fn per_value_statistics_are_named_as_the_peer_names_its_stat_keys() {
    let domain = Domain::from_envoy_yaml_file(case("stat_names.yaml")).unwrap();
    #[rustfmt::skip]
    let table: [(&[Pair], Option<&str>); 11] = [
        // value_to_metric on two levels: their values, the leaf's key.
        (&[("path", "draw"), ("verb", "GET"), ("who", "123")], Some("path_draw.verb_GET.who")),
        // detailed_metric on the leaf wins: every entry with its value.
        (&[("path", "draw"), ("verb", "GET"), ("session", "s1")], Some("path_draw.verb_GET.session_s1")),
        // A configured value is named by itself.
        (&[("path", "api"), ("verb", "PUT"), ("who", "u")], Some("path_api.verb_PUT.who")),
        // A wildcard with value_to_metric is named by the request's value.
        (&[("path", "api"), ("op", "listfiles"), ("item", "i")], Some("path_api.op_listfiles.item")),
        // An empty value adds no `_`.
        (&[("path", ""), ("verb", "GET"), ("who", "123")], Some("path.verb_GET.who")),
        (&[("path", ""), ("verb", ""), ("who", "123")], Some("path.verb.who")),
        // value_to_metric on a key-only first level.
        (&[("first", "A"), ("second", "foo")], Some("first_A.second")),
        // ... and on a middle level only.
        (&[("outer", "X"), ("middle", "Y"), ("inner", "Z")], Some("outer.middle_Y.inner")),
        // Asked for by no level: no per-value statistics at all.
        (&[("plain", "X"), ("deeper", "Y")], None),
        (&[("glob", "g1")], None),
        (&[("nothing", "matches")], None),
    ];
    for (entries, want) in table {
        assert_eq!(domain.value_path(entries).as_deref(), want, "{entries:?}");
    }
}
