//! The `ratewatch` binary as the README runs it: `serve` on the built-in
//! policy and the memory store, and `check-config`.

mod support;

use std::process::Command;

use support::Ratewatch;

fn sf_list(value: &str) -> Vec<(String, Vec<(String, i64)>)> {
    use sfv::{BareItem, ListEntry, Parser};
    Parser::new(value)
        .parse::<sfv::List>()
        .unwrap_or_else(|e| panic!("{value:?} is not a structured-field list: {e}"))
        .into_iter()
        .map(|entry| match entry {
            ListEntry::Item(item) => {
                let BareItem::String(name) = item.bare_item else {
                    panic!("member of {value:?} is not a string")
                };
                let params = item
                    .params
                    .into_iter()
                    .map(|(k, v)| {
                        (
                            k.as_str().to_owned(),
                            v.as_integer().map(i64::from).unwrap(),
                        )
                    })
                    .collect();
                (name.as_str().to_owned(), params)
            }
            ListEntry::InnerList(_) => panic!("inner list in {value:?}"),
        })
        .collect()
}

#[tokio::test]
async fn the_built_in_server_gives_a_fresh_free_key_ten_requests_then_429_and_lets_pro_pass() {
    let server = Ratewatch::start("serve", None, &[]);
    let client = reqwest::Client::new();
    let get = |key: &'static str| {
        client
            .get(format!("{}/api/users", server.url()))
            .header("x-api-key", key)
            .send()
    };
    for i in 0..10 {
        let res = get("free_readme_user").await.unwrap();
        assert_eq!(res.status(), 200, "request {i}");
        let policy = sf_list(res.headers()["ratelimit-policy"].to_str().unwrap());
        assert_eq!(policy[0].0, "burst");
        assert_eq!(policy[0].1[0], ("q".into(), 10));
    }
    let res = get("free_readme_user").await.unwrap();
    assert_eq!(res.status(), 429);
    let h = res.headers();
    let rl = sf_list(h["ratelimit"].to_str().unwrap());
    assert_eq!(rl[0].0, "burst");
    assert_eq!(rl[0].1[0], ("r".into(), 0));
    let t = rl[0].1[1].1;
    let retry: i64 = h["retry-after"].to_str().unwrap().parse().unwrap();
    assert!(
        retry >= t && t >= 1,
        "Retry-After {retry} is never earlier than t={t}"
    );
    sf_list(h["ratelimit-policy"].to_str().unwrap());
    let body: serde_json::Value = res.json().await.unwrap();
    assert_eq!(
        (body["tier"].as_str(), body["limit"].as_str()),
        (Some("free"), Some("burst"))
    );

    for _ in 0..30 {
        assert_eq!(get("pro_readme_user").await.unwrap().status(), 200);
    }
    for _ in 0..50 {
        let health = client
            .get(format!("{}/health", server.url()))
            .send()
            .await
            .unwrap();
        assert_eq!(health.status(), 200);
    }
}

#[test]
fn check_config_accepts_the_built_in_policy() {
    let out = Command::new(env!("CARGO_BIN_EXE_ratewatch"))
        .args([
            "check-config",
            concat!(env!("CARGO_MANIFEST_DIR"), "/ratewatch.toml"),
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("ok (4 tiers, 4 routes)"), "{said}");
}

#[test]
fn check_config_names_the_file_line_and_field_and_exits_non_zero() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (
            "[[tiers]]\nname = \"free\"\nlimits = [\n  { name = \"burst\", algorithm = \"token_bucket\", capacity = 10, refill_per_second = 0 },\n]\n",
            ":4:",
            "tiers[0].limits[0].refill_per_second",
        ),
        (
            "[store]\nkind = \"memory\"\ntimeout = 50\n",
            ":3:",
            "store.timeout",
        ),
        (
            "[[tiers]]\nname = \"free\"\nlimits = [{ name = \"burst\", algorithm = \"leaky\", capacity = 1 }]\n",
            ":3:",
            "algorithm",
        ),
    ];
    for (i, (text, line, field)) in cases.into_iter().enumerate() {
        let path = dir.path().join(format!("bad{i}.toml"));
        std::fs::write(&path, text).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_ratewatch"))
            .arg("check-config")
            .arg(&path)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "case {i}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(&format!("bad{i}.toml{line}")),
            "case {i} names file and line: {err}"
        );
        assert!(
            err.contains(field),
            "case {i} names the field {field}: {err}"
        );
    }
}

#[test]
fn check_config_refuses_a_store_address_serve_could_never_connect_to() {
    // Each of these passed check-config, then `serve` refused to start with
    // an error naming neither file, line nor field.
    let dir = tempfile::tempdir().unwrap();
    let tiers = "[[tiers]]\nname = \"free\"\nlimits = [{ name = \"b\", algorithm = \"fixed_window\", limit = 3, window = \"1h\" }]\n\
                 [[tiers]]\nname = \"anonymous\"\nlimits = [{ name = \"b\", algorithm = \"fixed_window\", limit = 3, window = \"1h\" }]\n";
    let cases = [
        (
            "[store]\nkind = \"redis\"\nurl = \"garbage\"\n",
            ":3:",
            "store.url",
        ),
        (
            "[store]\nkind = \"redis\"\nurl = \"http://127.0.0.1:6379\"\n",
            ":3:",
            "store.url",
        ),
        (
            "[store]\nkind = \"redis-cluster\"\nnodes = [\"redis://127.0.0.1:7000\", \"127.0.0.1:7001\"]\n",
            ":3:",
            "store.nodes",
        ),
    ];
    for (i, (store, line, field)) in cases.into_iter().enumerate() {
        let path = dir.path().join(format!("store{i}.toml"));
        std::fs::write(&path, format!("{store}{tiers}")).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_ratewatch"))
            .arg("check-config")
            .arg(&path)
            .env_remove("RATEWATCH_REDIS_URL")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "case {i}: {err}");
        assert!(
            err.contains(&format!("store{i}.toml{line}")),
            "case {i}: {err}"
        );
        assert!(err.contains(field), "case {i} names {field}: {err}");
    }
    // The environment's URL is checked the same way.
    let path = dir.path().join("ok.toml");
    std::fs::write(&path, tiers).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_ratewatch"))
        .arg("check-config")
        .arg(&path)
        .env("RATEWATCH_REDIS_URL", "garbage")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("RATEWATCH_REDIS_URL"), "{err}");
}

#[test]
fn check_config_warns_that_a_policy_without_tiers_limits_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("empty.toml");
    std::fs::write(&path, "").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_ratewatch"))
        .arg("check-config")
        .arg(&path)
        .env_remove("RATEWATCH_REDIS_URL")
        .output()
        .unwrap();
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("limits nothing"), "{err}");
}

#[test]
fn check_config_validates_the_envoy_yaml_the_policy_names() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = dir.path().join("edge.yaml");
    std::fs::write(
        &yaml,
        "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit:\n      unit: minute\n      requests_per_unit: 60\n",
    )
    .unwrap();
    let policy = dir.path().join("ratewatch.toml");
    std::fs::write(&policy, "[rls]\nenvoy_configs = [\"edge.yaml\"]\n").unwrap();
    let check = || {
        Command::new(env!("CARGO_BIN_EXE_ratewatch"))
            .arg("check-config")
            .arg(&policy)
            .env_remove("RATEWATCH_REDIS_URL")
            .output()
            .unwrap()
    };
    let out = check();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::write(
        &yaml,
        "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit:\n      unlimited: true\n      unit: minute\n",
    )
    .unwrap();
    let out = check();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("edge.yaml:6:"),
        "names the YAML file and line: {err}"
    );
    assert!(
        err.contains("descriptors[0].rate_limit.unit"),
        "names the field: {err}"
    );
}
