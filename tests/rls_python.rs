//! A second real client of the decision service: the Python code Envoy's
//! own API generates (PyPI `xds-protos`) over `grpcio`, against `ratewatch
//! serve --grpc-listen` on Redis. `tests/python/rls_client.py` only speaks
//! the wire; the expectations are here.

mod support;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};
use support::RedisServer;
use support::envoy::{RlsPolicy, RlsServer, python_client};

const EDGE_YAML: &str = "\
domain: edge
descriptors:
  - key: api_key
    rate_limit:
      unit: hour
      requests_per_unit: 3
  - key: generic_key
    value: edge
    rate_limit:
      name: edge_total
      unit: day
      requests_per_unit: 1000
";

fn start() -> (RedisServer, RlsPolicy, RlsServer) {
    let redis = RedisServer::start();
    let policy = RlsPolicy::new(
        &format!(
            "[store]\nkind = \"redis\"\nurl = \"{}\"\ntimeout_ms = 1000\n\n\
             [rls]\nenvoy_configs = [\"edge.yaml\"]\non_store_failure = \"unavailable\"\n",
            redis.url()
        ),
        EDGE_YAML,
    );
    let rls = RlsServer::start(&policy.path());
    (redis, policy, rls)
}

fn epoch_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs()
}

/// `[api_key=key]` then `[generic_key=edge]`, or the other way round.
fn call(key: &str, edge_first: bool) -> Value {
    let api = json!({"entries": [["api_key", key]]});
    let edge = json!({"entries": [["generic_key", "edge"]]});
    let descriptors = if edge_first {
        json!([edge, api])
    } else {
        json!([api, edge])
    };
    json!({"domain": "edge", "descriptors": descriptors})
}

fn response(step: &Value) -> &Value {
    step.get("response")
        .unwrap_or_else(|| panic!("a RateLimitResponse, got {step}"))
}

/// (code, requests_per_unit, unit, remaining) of each status.
fn statuses(step: &Value) -> Vec<(String, u64, String, u64)> {
    response(step)["statuses"]
        .as_array()
        .expect("statuses")
        .iter()
        .map(|s| {
            (
                s["code"].as_str().expect("code").to_owned(),
                s["current_limit"]["requests_per_unit"]
                    .as_u64()
                    .expect("requests_per_unit"),
                s["current_limit"]["unit"]
                    .as_str()
                    .expect("unit")
                    .to_owned(),
                s["limit_remaining"].as_u64().expect("limit_remaining"),
            )
        })
        .collect()
}

fn st(code: &str, per_unit: u64, unit: &str, remaining: u64) -> (String, u64, String, u64) {
    (code.into(), per_unit, unit.into(), remaining)
}

#[test]
fn generated_python_client_gets_statuses_in_request_order_and_over_limit_after_the_limit() {
    let (_redis, _policy, rls) = start();
    let key = format!("py-{}-{}", std::process::id(), epoch_secs());
    // Keep the few seconds of this test inside one hourly window.
    if epoch_secs() % 3600 > 3540 {
        std::thread::sleep(Duration::from_secs(3600 - epoch_secs() % 3600 + 1));
    }
    let mut check_only = call(&key, false);
    check_only["descriptors"][0]["hits_addend"] = json!(0);
    let plan = json!([
        call(&key, false),
        call(&key, true),
        check_only,
        call(&key, false),
        call(&key, false),
        call(&key, true),
    ]);
    let out = python_client(&rls.grpc_addr(), &plan);
    assert_eq!(out.len(), 6, "{out:?}");

    assert_eq!(
        statuses(&out[0]),
        vec![st("OK", 3, "HOUR", 2), st("OK", 1000, "DAY", 999)]
    );
    // Request order, whatever it is.
    assert_eq!(
        statuses(&out[1]),
        vec![st("OK", 1000, "DAY", 998), st("OK", 3, "HOUR", 1)]
    );
    // An explicit hits_addend of 0 (a UInt64Value on the wire) checks
    // without charging that descriptor.
    assert_eq!(
        statuses(&out[2]),
        vec![st("OK", 3, "HOUR", 1), st("OK", 1000, "DAY", 997)]
    );
    assert_eq!(response(&out[3])["overall_code"], "OK");
    assert_eq!(
        statuses(&out[3]),
        vec![st("OK", 3, "HOUR", 0), st("OK", 1000, "DAY", 996)]
    );
    // The fourth charge of a 3-an-hour key.
    assert_eq!(response(&out[4])["overall_code"], "OVER_LIMIT");
    let over = statuses(&out[4]);
    assert_eq!(over[0], st("OVER_LIMIT", 3, "HOUR", 0));
    assert_eq!(over[1].0, "OK");
    assert_eq!(response(&out[5])["overall_code"], "OVER_LIMIT");
    assert_eq!(statuses(&out[5])[1], st("OVER_LIMIT", 3, "HOUR", 0));

    // The rule's name travels in current_limit; the reset is the end of
    // the epoch-aligned window, within its unit.
    let s = &response(&out[0])["statuses"];
    assert_eq!(s[1]["current_limit"]["name"], "edge_total");
    let reset = s[0]["duration_until_reset"]
        .as_str()
        .and_then(|d| d.strip_suffix('s'))
        .and_then(|d| d.parse::<f64>().ok())
        .expect("duration_until_reset as proto3 JSON");
    assert!(reset > 0.0 && reset <= 3600.0, "reset {reset} s");
}

#[test]
fn generated_python_health_client_sees_serving() {
    let (_redis, _policy, rls) = start();
    let plan = json!([
        {"health": ""},
        {"health": "envoy.service.ratelimit.v3.RateLimitService"},
        {"health": "no.such.Service"},
    ]);
    let out = python_client(&rls.grpc_addr(), &plan);
    assert_eq!(
        out,
        vec![
            json!({"health": "SERVING"}),
            json!({"health": "SERVING"}),
            json!({"error": "NOT_FOUND"}),
        ]
    );
}
