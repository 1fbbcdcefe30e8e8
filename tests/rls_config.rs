//! `[rls]` loaded from real files: envoyproxy/ratelimit YAML next to the
//! policy, native `[[rls.domains]]`, and errors that name the file, the
//! line and the field.

use std::path::Path;

use ratewatch::policy::rls::{RlsFailure, RlsUnit};
use ratewatch::policy::{LeaseMode, Policy};

const EDGE: &str = "\
# The gateway's limits, as envoyproxy/ratelimit reads them.
domain: edge
descriptors:
  - key: remote_address
    rate_limit:
      unit: minute
      requests_per_unit: 60
  - key: header_match
    value: export
    descriptors:
      - key: remote_address
        rate_limit:
          name: export_per_ip
          unit: hour
          requests_per_unit: 10
";

const TIERS: &str = "\
[[tiers]]
name = \"free\"
match_prefix = \"free_\"
limits = [{ name = \"burst\", algorithm = \"token_bucket\", capacity = 10, refill_per_second = 1 }]

[[tiers]]
name = \"anonymous\"
limits = [{ name = \"burst\", algorithm = \"token_bucket\", capacity = 5, refill_per_second = 1 }]
";

fn write(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
    let path = dir.join(name);
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).unwrap();
    }
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn envoy_configs_load_relative_to_the_policy_file() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "conf/rls/edge.yaml", EDGE);
    let policy = write(
        dir.path(),
        "conf/ratewatch.toml",
        "[rls]\nenvoy_configs = [\"rls/edge.yaml\"]\n",
    );
    let p = Policy::from_toml_file(&policy).unwrap();
    assert_eq!(
        p.rls.envoy_configs,
        vec![dir.path().join("conf").join("rls/edge.yaml")]
    );
    let edge = p.rls.domains.domain("edge").unwrap();
    let r = edge.find(&[("remote_address", "10.1.2.3")]).unwrap();
    assert_eq!(r.unit, Some(RlsUnit::Minute));
    let r = edge
        .find(&[("header_match", "export"), ("remote_address", "10.1.2.3")])
        .unwrap();
    assert_eq!(&*r.label, "export_per_ip");
    assert!(edge.find(&[("header_match", "import")]).is_none());
    assert!(p.rls.domains.domain("other").is_none());
    // Without [rls] nothing is configured and failures follow [resilience].
    let plain = write(
        dir.path(),
        "plain.toml",
        "[resilience]\non_store_failure = \"closed\"\n",
    );
    let p = Policy::from_toml_file(&plain).unwrap();
    assert!(p.rls.domains.is_empty());
    assert_eq!(p.rls.on_store_failure, RlsFailure::Closed);
}

#[test]
fn a_yaml_error_names_the_yaml_file_its_line_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = write(
        dir.path(),
        "edge.yaml",
        &EDGE.replace("unit: hour", "unit: fortnight"),
    );
    let policy = write(
        dir.path(),
        "ratewatch.toml",
        "[rls]\nenvoy_configs = [\"edge.yaml\"]\n",
    );
    let err = Policy::from_toml_file(&policy).unwrap_err();
    assert_eq!(err.line(), Some(14));
    assert_eq!(
        err.field(),
        Some("descriptors[1].descriptors[0].rate_limit.unit")
    );
    let text = err.to_string();
    assert!(
        text.starts_with(&format!("{}:14:", yaml.display())),
        "{text}"
    );
}

#[test]
fn a_missing_yaml_file_is_an_error_of_the_policy_line_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let policy = write(
        dir.path(),
        "ratewatch.toml",
        "version = \"1\"\n\n[rls]\nenvoy_configs = [\n  \"absent.yaml\",\n]\n",
    );
    let err = Policy::from_toml_file(&policy).unwrap_err();
    assert_eq!(err.field(), Some("rls.envoy_configs[0]"));
    assert_eq!(err.line(), Some(5));
    assert!(err.to_string().contains("absent.yaml"), "{err}");
}

#[test]
fn one_domain_comes_from_one_place() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "a.yaml", EDGE);
    write(dir.path(), "b.yaml", EDGE);
    let policy = write(
        dir.path(),
        "ratewatch.toml",
        "[rls]\nenvoy_configs = [\"a.yaml\", \"b.yaml\"]\n",
    );
    let err = Policy::from_toml_file(&policy).unwrap_err();
    assert_eq!(err.field(), Some("rls.envoy_configs[1]"));
    assert!(err.to_string().contains("\"edge\""), "{err}");

    let native = write(
        dir.path(),
        "native.toml",
        "[rls]\nenvoy_configs = [\"a.yaml\"]\n\n[[rls.domains]]\nname = \"edge\"\n",
    );
    let err = Policy::from_toml_file(&native).unwrap_err();
    assert_eq!(err.field(), Some("rls.domains[0].name"));
    assert_eq!(err.line(), Some(5));
}

#[test]
fn a_reload_reads_the_yaml_again() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = write(dir.path(), "edge.yaml", EDGE);
    let policy = write(
        dir.path(),
        "ratewatch.toml",
        "[rls]\nenvoy_configs = [\"edge.yaml\"]\n",
    );
    let before = Policy::from_toml_file(&policy).unwrap();
    std::fs::write(
        &yaml,
        EDGE.replace("requests_per_unit: 60", "requests_per_unit: 6"),
    )
    .unwrap();
    let after = Policy::from_toml_file(&policy).unwrap();
    assert_ne!(before, after, "the YAML is part of the policy");
    let quota = |p: &Policy| {
        p.rls
            .domains
            .domain("edge")
            .unwrap()
            .find(&[("remote_address", "x")])
            .unwrap()
            .limits[0]
            .algorithm
            .max_cost()
    };
    assert_eq!((quota(&before), quota(&after)), (60, 6));
    // A broken YAML refuses the whole policy, so a reload keeps the old one.
    std::fs::write(&yaml, "domain: edge\ndescriptors:\n  - value: x\n").unwrap();
    let err = Policy::from_toml_file(&policy).unwrap_err();
    assert_eq!(err.line(), Some(3));
}

#[test]
fn native_domains_use_any_algorithm_tiers_cost_failure_policy_and_mode() {
    let dir = tempfile::tempdir().unwrap();
    let text = format!(
        "{TIERS}
[rls]
on_store_failure = \"unavailable\"

[[rls.domains]]
name = \"api\"

[[rls.domains.rules]]
descriptor = [\"api_key\"]
tier_from = \"api_key\"

[[rls.domains.rules]]
descriptor = [\"generic_key=export\", \"api_key\"]
name = \"export\"
cost = 5
mode = \"auto\"
on_store_failure = \"closed\"
limits = [
  {{ name = \"steady\", algorithm = \"gcra\", rate_per_second = 2.0, burst = 10 }},
  {{ name = \"daily\", algorithm = \"fixed_window\", limit = 500, window = \"1d\" }},
]

[[rls.domains.rules]]
descriptor = [\"path=/v1/*\"]
shadow = true
limits = [{{ name = \"minute\", algorithm = \"sliding_window\", limit = 100, window = \"60s\" }}]

[[rls.domains.rules]]
descriptor = [\"path=/health\"]
unlimited = true
"
    );
    let policy = write(dir.path(), "ratewatch.toml", &text);
    let p = Policy::from_toml_file(&policy).unwrap();
    assert_eq!(p.rls.on_store_failure, RlsFailure::Unavailable);
    let api = p.rls.domains.domain("api").unwrap();

    let by_tier = api.find(&[("api_key", "free_123")]).unwrap();
    assert_eq!(by_tier.tier.as_deref(), Some("api_key"));
    assert!(by_tier.limits.is_empty());
    assert_eq!(&*by_tier.label, "api_key");

    let export = api
        .find(&[("generic_key", "export"), ("api_key", "free_123")])
        .unwrap();
    assert_eq!(&*export.label, "export");
    assert_eq!(export.cost, Some(5));
    assert_eq!(export.mode, Some(LeaseMode::Auto));
    assert_eq!(export.on_store_failure, Some(RlsFailure::Closed));
    assert_eq!(export.limits.len(), 2);
    assert_eq!(export.limits[0].algorithm.kind(), "gcra");
    assert_eq!(export.unit, None, "a GCRA is not a window of one unit");

    let path = api.find(&[("path", "/v1/users")]).unwrap();
    assert!(path.shadow);
    assert_eq!(path.unit, Some(RlsUnit::Minute));
    assert_eq!(&*path.label, "path_/v1/*");
    assert!(api.find(&[("path", "/health")]).unwrap().unlimited);
    assert!(api.find(&[("path", "/v2/users")]).is_none());
}

#[test]
fn native_rule_errors_name_the_line_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        // The tier key must be one of the rule's own entries.
        (
            format!(
                "{TIERS}\n[[rls.domains]]\nname = \"api\"\n[[rls.domains.rules]]\ndescriptor = [\"user\"]\ntier_from = \"api_key\"\n"
            ),
            14,
            "rls.domains[0].rules[0].tier_from",
        ),
        // Limits are checked as those of tiers are.
        (
            "[[rls.domains]]\nname = \"api\"\n[[rls.domains.rules]]\ndescriptor = [\"user\"]\nlimits = [\n  { name = \"b\", algorithm = \"token_bucket\", capacity = 0, refill_per_second = 1 },\n]\n".to_owned(),
            6,
            "rls.domains[0].rules[0].limits[0].capacity",
        ),
        // A cost no limit could ever admit.
        (
            "[[rls.domains]]\nname = \"api\"\n[[rls.domains.rules]]\ndescriptor = [\"user\"]\ncost = 20\nlimits = [{ name = \"b\", algorithm = \"token_bucket\", capacity = 10, refill_per_second = 1 }]\n".to_owned(),
            6,
            "rls.domains[0].rules[0].limits[0].capacity",
        ),
        // A rule that limits nothing is a mistake.
        (
            "[[rls.domains]]\nname = \"api\"\n\n[[rls.domains.rules]]\ndescriptor = [\"user\"]\n".to_owned(),
            4,
            "rls.domains[0].rules[0].limits",
        ),
        (
            "[[rls.domains]]\nname = \"api\"\n[[rls.domains.rules]]\ndescriptor = [\"a\"]\nunlimited = true\n[[rls.domains.rules]]\ndescriptor = [\"a\"]\nunlimited = true\n".to_owned(),
            7,
            "rls.domains[0].rules[1].descriptor",
        ),
        (
            "[rls]\non_store_failure = \"maybe\"\n".to_owned(),
            2,
            "rls.on_store_failure",
        ),
        (
            "[rls]\nenvoy_config = [\"edge.yaml\"]\n".to_owned(),
            2,
            "rls.envoy_config",
        ),
        (
            "[[rls.domains]]\nname = \"api\"\n[[rls.domains.rules]]\ndescriptor = [\"user\"]\nlimits = [\n  { name = \"b\", algorithm = \"gcra\", rate_per_second = 1.0, burst = 5, scope = \"ip\" },\n]\n".to_owned(),
            6,
            "rls.domains[0].rules[0].limits[0].scope",
        ),
        (
            "[rls]\ntoken = \"short\"\n".to_owned(),
            2,
            "rls.token",
        ),
        // An in-flight limit needs to hear when a request ends, which a
        // rate limit service never does.
        (
            "[[rls.domains]]\nname = \"api\"\n[[rls.domains.rules]]\ndescriptor = [\"user\"]\nlimits = [\n  { name = \"c\", algorithm = \"concurrency\", limit = 2 },\n]\n".to_owned(),
            6,
            "rls.domains[0].rules[0].limits[0].algorithm",
        ),
        (
            "[rls]\nresponse_headers = \"all\"\n".to_owned(),
            2,
            "rls.response_headers",
        ),
    ];
    for (i, (text, line, field)) in cases.into_iter().enumerate() {
        let path = write(dir.path(), &format!("bad{i}.toml"), &text);
        let err = Policy::from_toml_file(&path).unwrap_err();
        assert_eq!(err.field(), Some(field), "case {i}: {err}");
        assert_eq!(err.line(), Some(line), "case {i}: {err}");
        assert!(
            err.to_string().contains(&format!("bad{i}.toml:{line}:")),
            "case {i}: {err}"
        );
    }
}

#[tokio::test]
async fn a_limiter_reload_takes_a_changed_yaml_and_keeps_the_old_policy_on_a_broken_one() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = write(dir.path(), "edge.yaml", EDGE);
    let policy = write(
        dir.path(),
        "ratewatch.toml",
        &format!("{TIERS}\n[rls]\nenvoy_configs = [\"edge.yaml\"]\n"),
    );
    let limiter = ratewatch::Limiter::from_config_file(&policy).await.unwrap();
    let quota = |l: &ratewatch::Limiter| {
        l.policy()
            .rls
            .domains
            .domain("edge")
            .unwrap()
            .find(&[("remote_address", "x")])
            .unwrap()
            .limits[0]
            .algorithm
            .max_cost()
    };
    assert_eq!(quota(&limiter), 60);
    std::fs::write(
        &yaml,
        EDGE.replace("requests_per_unit: 60", "requests_per_unit: 6"),
    )
    .unwrap();
    limiter.reload().unwrap();
    assert_eq!(quota(&limiter), 6);
    std::fs::write(&yaml, EDGE.replace("unit: minute", "unit: eon")).unwrap();
    let err = limiter.reload().unwrap_err();
    assert!(err.to_string().contains("edge.yaml:6:"), "{err}");
    assert_eq!(quota(&limiter), 6, "the running policy stays");
}

#[test]
fn partition_shares_descriptor_quotas_like_every_other_quota() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "edge.yaml", EDGE);
    let policy = write(
        dir.path(),
        "ratewatch.toml",
        "partition = 0.5\n\n[rls]\nenvoy_configs = [\"edge.yaml\"]\n",
    );
    let p = Policy::from_toml_file(&policy).unwrap();
    let edge = p.rls.domains.domain("edge").unwrap();
    let quota =
        |entries: &[(&str, &str)]| edge.find(entries).unwrap().limits[0].algorithm.max_cost();
    assert_eq!(quota(&[("remote_address", "x")]), 30);
    assert_eq!(
        quota(&[("header_match", "export"), ("remote_address", "x")]),
        5
    );
}

/// envoyproxy/ratelimit's deny-list idiom, `requests_per_unit: 0`, loads
/// (it refuses every hit, see tests/rls_grpc.rs); a missing count is still
/// an error naming its line.
#[test]
fn requests_per_unit_of_zero_loads_as_a_rule_that_refuses_and_a_missing_one_does_not() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "deny.yaml",
        "domain: edge\ndescriptors:\n  - key: blocked\n    rate_limit:\n      unit: hour\n      requests_per_unit: 0\n",
    );
    let path = write(
        dir.path(),
        "ratewatch.toml",
        "[rls]\nenvoy_configs = [\"deny.yaml\"]\nresponse_headers = \"ietf\"\n",
    );
    let policy = Policy::from_toml_file(&path).expect("0 is accepted");
    let rule = policy
        .rls
        .domains
        .domain("edge")
        .unwrap()
        .find(&[("blocked", "x")])
        .unwrap()
        .clone();
    assert!(rule.deny && !rule.unlimited);
    assert_eq!(rule.unit, Some(RlsUnit::Hour));
    assert_eq!(
        policy.rls.response_headers,
        ratewatch::policy::rls::RlsHeaders::Ietf
    );
    write(
        dir.path(),
        "deny.yaml",
        "domain: edge\ndescriptors:\n  - key: blocked\n    rate_limit:\n      unit: hour\n",
    );
    let err = Policy::from_toml_file(&path).unwrap_err();
    assert!(err.to_string().contains("deny.yaml:5:"), "{err}");
    assert!(err.to_string().contains("requests_per_unit"), "{err}");
}

#[test]
fn rules_built_in_code_are_validated_too() {
    use ratewatch::policy::rls::{DescriptorRule, Domain, RlsSettings};
    let mut domain = Domain::new("api");
    let rule = DescriptorRule {
        label: "user".into(),
        name: None,
        limits: vec![ratewatch::Limit::token_bucket("burst", 0, 1.0)],
        unlimited: false,
        shadow: false,
        replaces: Vec::new(),
        unit: None,
        tier: None,
        cost: None,
        on_store_failure: None,
        mode: None,
        detailed_metric: false,
        deny: false,
        apply_on_stream_done: false,
        metadata: None,
    };
    domain.insert(&[("user", None)], rule).unwrap();
    let mut rls = RlsSettings::default();
    rls.domains.insert(domain).unwrap();
    let err = Policy::builder().rls(rls).build().unwrap_err();
    assert_eq!(err.field(), Some("rls.domains.api.user.limits[0].capacity"));
}
