//! The decision service's operations beside deciding, as
//! envoyproxy/ratelimit offers them: `GET /rlconfig` (the loaded
//! descriptor configuration, guarded like `POST /json`) and the
//! `ratewatch_rls_near_limit_total` count of hits past
//! `[rls] near_limit_ratio` of their limit.

mod support;

use support::{Ratewatch, check_config, policy_file};

const EDGE_YAML: &str = r#"
domain: edge
descriptors:
  - key: remote_address
    rate_limit:
      unit: minute
      requests_per_unit: 10
  - key: tenant
    value: acme
    descriptors:
      - key: path
        rate_limit:
          unit: hour
          requests_per_unit: 3
  - key: bot
    rate_limit:
      unlimited: true
  - key: search
    shadow_mode: true
    rate_limit:
      unit: second
      requests_per_unit: 1
  - key: quota
    rate_limit:
      unit: hour
      requests_per_unit: 10
"#;

const TOKEN: &str = "rlconfig-secret-0123456789";

/// A policy directory holding `edge.yaml` and a `ratewatch.toml` whose
/// `[rls]` loads it, with `extra` lines in `[rls]`.
fn policy(extra: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("edge.yaml"), EDGE_YAML).expect("yaml");
    let file = dir.path().join("ratewatch.toml");
    std::fs::write(
        &file,
        format!("[rls]\nenvoy_configs = [\"edge.yaml\"]\n{extra}\n"),
    )
    .expect("toml");
    (dir, file)
}

/// `GET /rlconfig` with `headers`: status and body.
async fn rlconfig(server: &Ratewatch, headers: &[(&str, &str)]) -> (u16, String) {
    let mut req = reqwest::Client::new().get(format!("{}/rlconfig", server.url()));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let res = req.send().await.expect("an answer");
    let status = res.status().as_u16();
    (status, res.text().await.expect("a body"))
}

#[tokio::test]
async fn rlconfig_lists_every_rule_of_the_loaded_yaml_one_line_each() {
    let (_dir, file) = policy("");
    let server = Ratewatch::start("serve", Some(&file), &[]);
    let (status, body) = rlconfig(&server, &[]).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body,
        "edge.remote_address: unit=MINUTE requests_per_unit=10, shadow_mode: false\n\
         edge.tenant_acme.path: unit=HOUR requests_per_unit=3, shadow_mode: false\n\
         edge.bot: unlimited, shadow_mode: false\n\
         edge.search: unit=SECOND requests_per_unit=1, shadow_mode: true\n\
         edge.quota: unit=HOUR requests_per_unit=10, shadow_mode: false\n"
    );
}

#[tokio::test]
async fn rlconfig_refuses_a_proxy_on_this_host_with_403() {
    let (_dir, file) = policy("");
    let server = Ratewatch::start("serve", Some(&file), &[]);
    for header in [
        ("x-forwarded-for", "203.0.113.9"),
        ("x-forwarded-for", "127.0.0.1"),
        ("forwarded", "for=203.0.113.9"),
    ] {
        let (status, body) = rlconfig(&server, &[header]).await;
        assert_eq!(status, 403, "{header:?}: {body}");
        assert!(!body.contains("remote_address"), "{body}");
    }
}

#[tokio::test]
async fn with_a_token_rlconfig_needs_the_bearer_and_never_prints_the_token() {
    let (_dir, file) = policy(&format!("token = \"{TOKEN}\""));
    let server = Ratewatch::start("serve", Some(&file), &[]);
    let (status, body) = rlconfig(&server, &[]).await;
    assert_eq!(status, 401, "a local caller without the token: {body}");
    let (status, _) = rlconfig(&server, &[("authorization", "Bearer not-the-token-at-all")]).await;
    assert_eq!(status, 401, "a wrong token");
    let auth = format!("Bearer {TOKEN}");
    let fwd = ("x-forwarded-for", "203.0.113.9");
    let (status, body) = rlconfig(&server, &[fwd, ("authorization", &auth)]).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("edge.remote_address: unit=MINUTE requests_per_unit=10"));
    assert!(!body.contains(TOKEN), "{body}");
    assert!(!body.contains("rlconfig-secret"), "{body}");
}

/// The value of the series `name{labels}` in `/metrics` of `server`.
async fn metric(server: &Ratewatch, series: &str) -> Option<f64> {
    let text = reqwest::get(format!("{}/metrics", server.url()))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("metrics body");
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
}

/// One hit of the `quota` descriptor over `/json`: its HTTP status.
async fn hit(server: &Ratewatch, value: &str) -> u16 {
    let body = format!(
        r#"{{"domain":"edge","descriptors":[{{"entries":[{{"key":"quota","value":"{value}"}}]}}]}}"#
    );
    reqwest::Client::new()
        .post(format!("{}/json", server.url()))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .expect("an answer")
        .status()
        .as_u16()
}

const NEAR: &str = r#"ratewatch_rls_near_limit_total{domain="edge",rule="quota"}"#;

#[tokio::test]
async fn allowed_hits_at_or_past_the_near_limit_ratio_are_counted_and_refusals_are_not() {
    let (_dir, file) = policy("near_limit_ratio = 0.5");
    let server = Ratewatch::start("serve", Some(&file), &[]);
    // Described and at zero before any traffic, like its siblings.
    assert_eq!(metric(&server, NEAR).await, Some(0.0));
    // 10 per hour: hits 1..=4 leave less than half used.
    for _ in 0..4 {
        assert_eq!(hit(&server, "client-a").await, 200);
    }
    assert_eq!(metric(&server, NEAR).await, Some(0.0));
    // Hits 5..=10 are allowed with at least half of the limit used.
    for _ in 0..6 {
        assert_eq!(hit(&server, "client-a").await, 200);
    }
    assert_eq!(metric(&server, NEAR).await, Some(6.0));
    // Refused hits are over the limit, not near it.
    assert_eq!(hit(&server, "client-a").await, 429);
    assert_eq!(metric(&server, NEAR).await, Some(6.0));
    let text = reqwest::get(format!("{}/metrics", server.url()))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(!text.contains("client-a"), "no descriptor value in a label");
    assert!(
        text.contains("# HELP ratewatch_rls_near_limit_total "),
        "described at start-up: {text}"
    );
}

#[tokio::test]
async fn the_default_near_limit_ratio_is_eight_tenths() {
    let (_dir, file) = policy("");
    let server = Ratewatch::start("serve", Some(&file), &[]);
    for _ in 0..7 {
        assert_eq!(hit(&server, "client-b").await, 200);
    }
    assert_eq!(metric(&server, NEAR).await, Some(0.0));
    // The 8th hit uses 8 of 10.
    assert_eq!(hit(&server, "client-b").await, 200);
    assert_eq!(metric(&server, NEAR).await, Some(1.0));
}

#[test]
fn a_near_limit_ratio_outside_zero_to_one_names_file_line_and_field() {
    for bad in ["0", "1.5", "-0.2", "\"high\""] {
        let f = policy_file(&format!("\n[rls]\nnear_limit_ratio = {bad}\n"));
        let (code, text) = check_config(f.path());
        assert_ne!(code, 0, "{bad}: {text}");
        let file = f.path().display().to_string();
        assert!(text.contains(&file), "{bad}: {text}");
        assert!(text.contains("near_limit_ratio"), "{bad}: {text}");
        assert!(text.contains(":3"), "line 3 in {text}");
    }
    let f = policy_file("[rls]\nnear_limit_ratio = 1\n");
    let (code, text) = check_config(f.path());
    assert_eq!(code, 0, "{text}");
}
