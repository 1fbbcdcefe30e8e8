//! Loading policies from TOML: the demo file, equivalence with the builder,
//! and the error every kind of mistake gives (field, line, what is valid).

use std::time::Duration;

use ratewatch::algorithm::Algorithm;
use ratewatch::policy::{
    AnonymousMode, ConfigError, FailurePolicy, IdentitySettings, KeyDisplay, Limit, Policy,
    RouteRule, Scope, StoreKind, StoreSettings, Tier,
};

const FILE: &str = "ratewatch.toml";

/// Parses a policy written in a test; the first line after the opening
/// quote is line 1.
fn load(text: &str) -> Result<Policy, ConfigError> {
    Policy::from_toml_str(text.strip_prefix('\n').unwrap_or(text), Some(FILE))
}

/// The error a policy gives, which must be about `field` on `line`.
#[track_caller]
fn error_of(text: &str, field: &str, line: usize) -> String {
    let err = match load(text) {
        Ok(policy) => panic!("expected an error about `{field}`, got {policy:#?}"),
        Err(err) => err,
    };
    assert_eq!(err.field(), Some(field), "wrong field in: {err}");
    assert_eq!(err.line(), Some(line), "wrong line in: {err}");
    let shown = err.to_string();
    assert!(
        shown.starts_with(&format!("{FILE}:{line}: `{field}` ")),
        "not `file:line: field` form: {shown}"
    );
    shown
}

#[track_caller]
fn assert_says(message: &str, parts: &[&str]) {
    for part in parts {
        assert!(message.contains(part), "{message:?} does not say {part:?}");
    }
}

#[test]
fn demo_policy_loads_with_its_tiers_routes_and_limits() {
    let policy = Policy::from_toml_str(include_str!("../ratewatch.toml"), Some(FILE))
        .unwrap_or_else(|e| panic!("{e}"));
    let names: Vec<&str> = policy.tiers.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["free", "pro", "enterprise", "anonymous"]);
    assert_eq!(policy.store.kind, StoreKind::Memory);
    assert_eq!(policy.identity.default_tier, "free");
    assert_eq!(policy.tier_for_key("pro_abc"), "pro");
    assert_eq!(policy.tier_for_key("ent_abc"), "enterprise");
    assert_eq!(policy.tier_for_key("someone"), "free");

    let free = policy.tier("free").expect("free tier");
    assert_eq!(free.limits[0], Limit::token_bucket("burst", 10, 0.33));
    assert_eq!(
        free.limits[2],
        Limit::fixed_window("day", 1000, Duration::from_secs(86_400))
    );
    let ip = free
        .limits
        .iter()
        .find(|l| l.name == "ip_minute")
        .expect("ip limit");
    assert_eq!(ip.scope, Scope::Ip);
    let hour = free
        .limits
        .iter()
        .find(|l| l.name == "hour")
        .expect("shadow limit");
    assert!(hour.shadow);
    assert_eq!(hour.algorithm.window_secs(), 3600);

    let ent = policy.tier("enterprise").expect("enterprise tier");
    assert_eq!(
        ent.limits[0].algorithm,
        Algorithm::Gcra {
            rate_per_second: 100.0,
            burst: 500
        }
    );

    let export = policy
        .route_for("POST", "/api/export")
        .expect("export route");
    assert_eq!(export.cost, 5);
    assert_eq!(export.on_store_failure, Some(FailurePolicy::Closed));
    let status = policy
        .route_for("GET", "/api/ratelimit/status")
        .expect("status route");
    assert!(status.exempt);
    let slow = policy.route_for("GET", "/api/slow").expect("slow route");
    assert_eq!(
        slow.limits[0].algorithm,
        ratewatch::algorithm::Algorithm::Concurrency {
            limit: 2,
            hold_us: 30_000_000
        }
    );
    let complete = policy
        .route_for("POST", "/api/complete")
        .expect("complete route");
    let units: Vec<(&str, &str, Option<&str>)> = complete
        .limits
        .iter()
        .map(|l| (l.name.as_str(), l.unit.as_str(), l.tier.as_deref()))
        .collect();
    assert!(
        units.contains(&("tpm", "tokens", Some("free"))),
        "{units:?}"
    );
    assert!(
        units.contains(&("streams", "requests", Some("pro"))),
        "{units:?}"
    );
    assert_eq!(policy.routes.len(), 4);
}

#[test]
fn toml_policy_equals_the_same_policy_built_in_code() {
    let from_toml = load(
        r#"
        [store]
        kind = "redis"
        url = "redis://127.0.0.1:6379"
        timeout_ms = 20

        [identity]
        anonymous = "reject"
        default_tier = "basic"
        anonymous_tier = "basic"
        trusted_proxies = ["10.0.0.0/8", "127.0.0.1"]

        [[tiers]]
        name = "basic"
        match_prefix = "b_"
        limits = [
          { name = "burst", algorithm = "token_bucket", capacity = 10, refill_per_second = 0.5 },
          { name = "minute", algorithm = "sliding_window", limit = 60, window = 60, scope = "ip" },
          { name = "day", algorithm = "fixed_window", limit = 1000, window = "1d", shadow = true },
        ]

        [[routes]]
        method = "post"
        path = "/api/export"
        cost = 5
        on_store_failure = "closed"
        limits = [{ name = "exports", algorithm = "leaky_bucket", rate_per_second = 2, capacity = 5, max_delay = "250ms" }]
        "#,
    )
    .unwrap_or_else(|e| panic!("{e}"));

    let built = Policy::builder()
        .store(StoreSettings {
            kind: StoreKind::Redis,
            url: Some("redis://127.0.0.1:6379".into()),
            timeout: Duration::from_millis(20),
            ..StoreSettings::default()
        })
        .identity(IdentitySettings {
            anonymous: AnonymousMode::Reject,
            default_tier: "basic".into(),
            anonymous_tier: "basic".into(),
            trusted_proxies: vec![
                "10.0.0.0/8".parse().expect("cidr"),
                "127.0.0.1/32".parse().expect("cidr"),
            ],
            ..IdentitySettings::default()
        })
        .tier(
            Tier::new("basic")
                .match_prefix("b_")
                .limit(Limit::token_bucket("burst", 10, 0.5))
                .limit(
                    Limit::sliding_window("minute", 60, Duration::from_secs(60))
                        .with_scope(Scope::Ip),
                )
                .limit(Limit::fixed_window("day", 1000, Duration::from_secs(86_400)).shadow()),
        )
        .route(
            RouteRule::new("POST", "/api/export")
                .with_cost(5)
                .on_store_failure(FailurePolicy::Closed)
                .with_limit(Limit::new(
                    "exports",
                    Algorithm::LeakyBucket {
                        rate_per_second: 2.0,
                        capacity: 5,
                        max_delay_us: 250_000,
                    },
                )),
        )
        .build()
        .unwrap_or_else(|e| panic!("{e}"));

    assert_eq!(from_toml, built);
}

#[test]
fn settings_sections_override_only_the_keys_they_name() {
    let policy = load(
        r#"
        [resilience]
        on_store_failure = "closed"
        breaker = { failures = 3, failure_ratio = 0.5, window = 40 }
        retry_after_jitter_ms = 500

        [telemetry]
        key_display = "hashed"

        [dashboard]
        enabled = false
        token = "s3cret"
        "#,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(policy.resilience.on_store_failure, FailurePolicy::Closed);
    assert_eq!(policy.resilience.breaker.failures, 3);
    assert_eq!(policy.resilience.breaker.failure_ratio, 0.5);
    assert_eq!(policy.resilience.breaker.window, 40);
    assert_eq!(policy.resilience.breaker.open, Duration::from_millis(2000));
    assert_eq!(
        policy.resilience.retry_after_jitter,
        Duration::from_millis(500)
    );
    assert_eq!(policy.resilience.expected_instances, 3);
    assert_eq!(policy.telemetry.key_display, KeyDisplay::Hashed);
    assert_eq!(policy.telemetry.top_keys, 100);
    assert!(!policy.dashboard.enabled);
    assert_eq!(policy.dashboard.token.as_deref(), Some("s3cret"));
}

#[test]
fn partition_scales_every_quota_of_the_file() {
    let policy = load(
        r#"
        partition = 0.5
        [identity]
        default_tier = "t"
        anonymous_tier = "t"
        [[tiers]]
        name = "t"
        limits = [{ name = "day", algorithm = "fixed_window", limit = 1000, window = "1d" }]
        "#,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(policy.partition, 0.5);
    assert_eq!(policy.tiers[0].limits[0].algorithm.quota(), 500);
}

#[test]
fn display_reads_file_line_field_and_what_is_valid() {
    let err = load(
        r#"
        [[tiers]]
        name = "free"
        limits = [
          { name = "burst", algorithm = "token_bucket", capacity = 10, refill_per_second = 1 },
          { name = "again", algorithm = "token_bucket", capacity = 0, refill_per_second = 1 },
        ]
        "#,
    )
    .expect_err("capacity 0");
    assert_eq!(
        err.to_string(),
        "ratewatch.toml:5: `tiers[0].limits[1].capacity` must be at least 1, got 0"
    );
}

#[test]
fn unknown_top_level_key_lists_the_sections() {
    let msg = error_of(
        r#"
        [store]
        kind = "memory"
        [limits]
        x = 1
        "#,
        "limits",
        3,
    );
    assert_says(
        &msg,
        &["store", "resilience", "identity", "tiers", "routes"],
    );
}

#[test]
fn unknown_key_in_a_section_names_the_allowed_keys_and_a_near_one() {
    let msg = error_of(
        r#"
        [store]
        kind = "memory"
        timeout = 50
        "#,
        "store.timeout",
        3,
    );
    assert_says(
        &msg,
        &[
            "kind, url, nodes, master_name, sentinels, username, password, tls_ca_file, tls_cert_file, tls_key_file, timeout_ms, key_prefix, max_entries",
            "did you mean `timeout_ms`",
        ],
    );
}

#[test]
fn unknown_key_in_an_inline_breaker_table_is_found() {
    let msg = error_of(
        r#"
        [resilience]
        breaker = { failures = 5, cooldown_ms = 100 }
        "#,
        "resilience.breaker.cooldown_ms",
        2,
    );
    assert_says(&msg, &["failures, open_ms, failure_ratio, window"]);
}

#[test]
fn unknown_key_in_a_limit_lists_what_that_algorithm_takes() {
    let msg = error_of(
        r#"
        [[tiers]]
        name = "free"
        limits = [
          { name = "burst", algorithm = "token_bucket", capacity = 10, refill_per_second = 1,
            enforce = false },
        ]
        "#,
        "tiers[0].limits[0].enforce",
        5,
    );
    assert_says(
        &msg,
        &["name, algorithm, shadow, scope, mode, unit, tier, capacity, refill_per_second"],
    );
}

#[test]
fn unknown_key_in_a_route_lists_the_route_keys() {
    let msg = error_of(
        r#"
        [[routes]]
        path = "/api/export"
        weight = 5
        "#,
        "routes[0].weight",
        3,
    );
    assert_says(
        &msg,
        &[
            "method, path, cost, on_store_failure, exempt, mode, refund_on_error, costs, max_body_bytes, when, limits",
        ],
    );
}

#[test]
fn quoted_number_is_a_wrong_type_with_a_hint() {
    let msg = error_of(
        r#"
        [[tiers]]
        name = "free"

        [[tiers.limits]]
        name = "burst"
        algorithm = "token_bucket"
        capacity = "10"
        refill_per_second = 1
        "#,
        "tiers[0].limits[0].capacity",
        7,
    );
    assert_says(
        &msg,
        &[
            "whole number at least 1",
            "the string \"10\"",
            "without quotes",
        ],
    );
}

#[test]
fn string_where_a_boolean_belongs_is_a_wrong_type() {
    let msg = error_of(
        r#"
        [dashboard]
        enabled = "yes"
        "#,
        "dashboard.enabled",
        2,
    );
    assert_says(&msg, &["must be true or false", "the string \"yes\""]);
}

#[test]
fn negative_limit_says_at_least_one() {
    let msg = error_of(
        r#"
        [[tiers]]
        name = "free"
        limits = [{ name = "minute", algorithm = "sliding_window", limit = -5, window = "60s" }]
        "#,
        "tiers[0].limits[0].limit",
        3,
    );
    assert_says(&msg, &["must be at least 1, got -5"]);
}

#[test]
fn negative_timeout_says_at_least_one() {
    let msg = error_of(
        r#"
        [store]
        timeout_ms = -1
        "#,
        "store.timeout_ms",
        2,
    );
    assert_says(&msg, &["must be at least 1, got -1"]);
}

#[test]
fn zero_or_negative_rate_says_above_zero() {
    for rate in ["0", "-2.5"] {
        let msg = error_of(
            &format!(
                r#"
                [[tiers]]
                name = "free"
                limits = [{{ name = "burst", algorithm = "gcra", burst = 5, rate_per_second = {rate} }}]
                "#
            ),
            "tiers[0].limits[0].rate_per_second",
            3,
        );
        assert_says(&msg, &["above 0", "at most 1000000"]);
    }
}

#[test]
fn zero_window_says_longer_than_zero_with_examples() {
    for window in ["\"0s\"", "0"] {
        let msg = error_of(
            &format!(
                r#"
                [[tiers]]
                name = "free"
                limits = [{{ name = "day", algorithm = "fixed_window", limit = 5, window = {window} }}]
                "#
            ),
            "tiers[0].limits[0].window",
            3,
        );
        assert_says(&msg, &["\"60s\"", "\"1d\""]);
    }
}

#[test]
fn malformed_window_names_the_units() {
    let msg = error_of(
        r#"
        [[tiers]]
        name = "free"
        limits = [{ name = "day", algorithm = "fixed_window", limit = 5, window = "1 fortnight" }]
        "#,
        "tiers[0].limits[0].window",
        3,
    );
    assert_says(&msg, &["ms, s, m, h, d or w"]);
}

#[test]
fn window_accepts_whole_seconds_and_strings() {
    let policy = load(
        r#"
        [identity]
        default_tier = "t"
        anonymous_tier = "t"
        [[tiers]]
        name = "t"
        limits = [
          { name = "a", algorithm = "sliding_log", limit = 5, window = 90 },
          { name = "b", algorithm = "sliding_log", limit = 5, window = "500ms" },
          { name = "c", algorithm = "leaky_bucket", rate_per_second = 1, capacity = 5 },
        ]
        "#,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let limits = &policy.tiers[0].limits;
    assert_eq!(
        limits[0].algorithm,
        Algorithm::SlidingLog {
            limit: 5,
            window_us: 90_000_000
        }
    );
    assert_eq!(
        limits[1].algorithm,
        Algorithm::SlidingLog {
            limit: 5,
            window_us: 500_000
        }
    );
    assert!(matches!(
        limits[2].algorithm,
        Algorithm::LeakyBucket {
            max_delay_us: 0,
            ..
        }
    ));
}

#[test]
fn unknown_algorithm_lists_the_six_valid_names() {
    let msg = error_of(
        r#"
        [[tiers]]
        name = "free"
        limits = [
          { name = "burst", algorithm = "token_bucket", capacity = 10, refill_per_second = 1 },
          { name = "minute", algorithm = "sliding_windows", limit = 20, window = "60s" },
        ]
        "#,
        "tiers[0].limits[1].algorithm",
        5,
    );
    assert_says(
        &msg,
        &[
            "token_bucket, sliding_window, sliding_log, fixed_window, gcra, leaky_bucket",
            "got \"sliding_windows\"",
        ],
    );
}

#[test]
fn missing_algorithm_lists_the_six_valid_names() {
    let msg = error_of(
        r#"
        [[tiers]]
        name = "free"
        limits = [{ name = "burst", capacity = 10 }]
        "#,
        "tiers[0].limits[0].algorithm",
        3,
    );
    assert_says(&msg, &["is required", "token_bucket, sliding_window"]);
}

#[test]
fn parameter_of_another_algorithm_says_what_this_one_takes() {
    let msg = error_of(
        r#"
        [[tiers]]
        name = "free"
        limits = [{ name = "burst", algorithm = "token_bucket", capacity = 10, refill_per_second = 1, limit = 5 }]
        "#,
        "tiers[0].limits[0].limit",
        3,
    );
    assert_says(
        &msg,
        &[
            "does not apply to a token_bucket limit",
            "capacity, refill_per_second",
        ],
    );
}

#[test]
fn missing_parameter_names_the_parameters_of_the_algorithm() {
    let msg = error_of(
        r#"
        [[tiers]]
        name = "free"

        [[tiers.limits]]
        name = "burst"
        algorithm = "token_bucket"
        capacity = 10
        "#,
        "tiers[0].limits[0].refill_per_second",
        4,
    );
    assert_says(&msg, &["is required", "capacity, refill_per_second"]);
}

#[test]
fn duplicate_tier_names_point_at_the_second_name() {
    let msg = error_of(
        r#"
        [[tiers]]
        name = "free"
        limits = [{ name = "burst", algorithm = "token_bucket", capacity = 10, refill_per_second = 1 }]

        [[tiers]]
        name = "free"
        limits = [{ name = "burst", algorithm = "token_bucket", capacity = 10, refill_per_second = 1 }]
        "#,
        "tiers[1].name",
        6,
    );
    assert_says(&msg, &["repeats the tier name \"free\"", "must be unique"]);
}

#[test]
fn duplicate_limit_names_point_at_the_second_limit() {
    let msg = error_of(
        r#"
        [identity]
        default_tier = "free"
        anonymous_tier = "free"

        [[tiers]]
        name = "free"
        limits = [
          { name = "burst", algorithm = "token_bucket", capacity = 10, refill_per_second = 1 },
          { name = "burst", algorithm = "fixed_window", limit = 100, window = "1d" },
        ]
        "#,
        "tiers[0].limits[1].name",
        9,
    );
    assert_says(
        &msg,
        &["repeats the limit name \"burst\"", "unique within a tier"],
    );
}

#[test]
fn route_cost_above_a_tier_capacity_points_at_the_cost() {
    let msg = error_of(
        r#"
        [identity]
        default_tier = "free"
        anonymous_tier = "free"

        [[tiers]]
        name = "free"
        limits = [{ name = "burst", algorithm = "token_bucket", capacity = 10, refill_per_second = 1 }]

        [[routes]]
        method = "POST"
        path = "/api/export"
        cost = 50
        "#,
        "routes[0].cost",
        12,
    );
    assert_says(
        &msg,
        &["\"burst\" of tier \"free\"", "at most 10 per request"],
    );
}

#[test]
fn unknown_store_kind_lists_the_kinds() {
    let msg = error_of(
        r#"
        [store]
        kind = "mongodb"
        "#,
        "store.kind",
        2,
    );
    assert_says(
        &msg,
        &[
            "\"memory\", \"redis\", \"redis-cluster\"",
            "got \"mongodb\"",
        ],
    );
}

#[test]
fn bad_cidr_names_the_element_and_shows_valid_forms() {
    let msg = error_of(
        r#"
        [identity]
        trusted_proxies = [
          "127.0.0.1/32",
          "10.0.0/8",
        ]
        "#,
        "identity.trusted_proxies[1]",
        4,
    );
    assert_says(
        &msg,
        &["got \"10.0.0/8\"", "\"10.0.0.0/8\"", "\"127.0.0.1\""],
    );
}

#[test]
fn default_tier_naming_no_tier_lists_the_defined_ones() {
    let msg = error_of(
        r#"
        [identity]
        default_tier = "gold"
        anonymous_tier = "free"

        [[tiers]]
        name = "free"
        limits = [{ name = "burst", algorithm = "token_bucket", capacity = 10, refill_per_second = 1 }]
        "#,
        "identity.default_tier",
        2,
    );
    assert_says(&msg, &["\"gold\"", "defined tiers: free"]);
}

#[test]
fn anonymous_tier_naming_no_tier_lists_the_defined_ones() {
    let msg = error_of(
        r#"
        [identity]
        default_tier = "free"
        anonymous_tier = "guest"

        [[tiers]]
        name = "free"
        limits = [{ name = "burst", algorithm = "token_bucket", capacity = 10, refill_per_second = 1 }]
        "#,
        "identity.anonymous_tier",
        3,
    );
    assert_says(&msg, &["\"guest\"", "defined tiers: free"]);
}

#[test]
fn partition_above_one_points_at_its_line() {
    let msg = error_of(
        r#"
        # a region's share
        partition = 1.5
        "#,
        "partition",
        2,
    );
    assert_says(&msg, &["above 0 and at most 1"]);
}

#[test]
fn syntax_error_gives_the_parser_line_and_no_field() {
    let err = load(
        r#"
        [store]
        kind = "memory"
        timeout_ms = = 50
        "#,
    )
    .expect_err("syntax error");
    assert_eq!(err.line(), Some(3));
    assert_eq!(err.field(), None);
    let shown = err.to_string();
    assert!(
        shown.starts_with("ratewatch.toml:3: TOML syntax error"),
        "{shown}"
    );
}

#[test]
fn duplicate_key_is_a_syntax_error_on_the_second_line() {
    let err = load(
        r#"
        [store]
        kind = "memory"
        kind = "redis"
        "#,
    )
    .expect_err("duplicate key");
    assert_eq!(err.line(), Some(3));
    assert!(err.to_string().contains("duplicate key `kind`"), "{err}");
}

#[test]
fn bad_route_method_says_what_is_valid() {
    let msg = error_of(
        r#"
        [[routes]]
        method = "GET /api"
        path = "/api"
        "#,
        "routes[0].method",
        2,
    );
    assert_says(&msg, &["\"GET\"", "\"*\""]);
}

#[test]
fn unknown_failure_policy_lists_the_three() {
    let msg = error_of(
        r#"
        [[routes]]
        path = "/api/export"
        on_store_failure = "retry"
        "#,
        "routes[0].on_store_failure",
        3,
    );
    assert_says(&msg, &["\"open\", \"closed\", \"local\""]);
}

#[test]
fn unknown_scope_lists_the_three() {
    let msg = error_of(
        r#"
        [[tiers]]
        name = "free"
        limits = [{ name = "burst", algorithm = "token_bucket", capacity = 10, refill_per_second = 1, scope = "user" }]
        "#,
        "tiers[0].limits[0].scope",
        3,
    );
    assert_says(&msg, &["\"identity\", \"ip\", \"route\""]);
}

#[test]
fn tier_without_a_name_points_at_its_header() {
    let msg = error_of(
        r#"
        [[tiers]]
        name = "free"
        unlimited = true

        [[tiers]]
        match_prefix = "pro_"
        "#,
        "tiers[1].name",
        5,
    );
    assert_says(&msg, &["is required"]);
}

#[test]
fn route_limit_smaller_than_the_route_cost_points_at_its_capacity() {
    let msg = error_of(
        r#"
        [[routes]]
        path = "/api/export"
        cost = 5
        limits = [
          { name = "exports", algorithm = "token_bucket", capacity = 3, refill_per_second = 1 },
        ]
        "#,
        "routes[0].limits[0].capacity",
        5,
    );
    assert_says(&msg, &["is 3, below the route's cost 5"]);
}

#[test]
fn tiers_given_as_a_string_must_be_an_array_of_tables() {
    let msg = error_of(
        r#"
        tiers = "free"
        "#,
        "tiers",
        1,
    );
    assert_says(&msg, &["must be an array of tables", "the string \"free\""]);
}

#[test]
fn missing_file_is_an_io_error_naming_the_path() {
    let err = Policy::from_toml_file("/nonexistent/ratewatch.toml").expect_err("no such file");
    assert!(matches!(err, ConfigError::Io { .. }));
    assert!(
        err.to_string().starts_with("/nonexistent/ratewatch.toml: "),
        "{err}"
    );
}

#[test]
fn misspelt_limit_name_key_is_reported_before_the_missing_name() {
    let msg = error_of(
        r#"
        [[tiers]]
        name = "free"
        limits = [{ nmae = "burst", algorithm = "token_bucket", capacity = 10, refill_per_second = 1 }]
        "#,
        "tiers[0].limits[0].nmae",
        3,
    );
    assert_says(&msg, &["did you mean `name`"]);
}

#[test]
fn integers_may_use_underscores_and_hex() {
    let policy = load(
        r#"
        [identity]
        default_tier = "t"
        anonymous_tier = "t"
        [[tiers]]
        name = "t"
        limits = [
          { name = "day", algorithm = "fixed_window", limit = 1_000_000, window = 86_400 },
          { name = "burst", algorithm = "gcra", rate_per_second = 5, burst = 0x10 },
        ]
        "#,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(policy.tiers[0].limits[0].algorithm.quota(), 1_000_000);
    assert_eq!(policy.tiers[0].limits[0].algorithm.window_secs(), 86_400);
    assert_eq!(policy.tiers[0].limits[1].algorithm.quota(), 16);
}

// Rules that could never match, shares, shared counters -------------------

/// A policy with one tier `t` (default and anonymous) of `limits`, then
/// `rest`; the tier's `limits` line is line 5.
fn with_tier(limits: &str, rest: &str) -> String {
    format!(
        "\n        [identity]\n        default_tier = \"t\"\n        anonymous_tier = \"t\"\n        [[tiers]]\n        name = \"t\"\n        limits = [{limits}]\n{rest}"
    )
}

const BURST_10: &str =
    r#"{ name = "burst", algorithm = "token_bucket", capacity = 10, refill_per_second = 1 }"#;

#[test]
fn a_misspelt_method_is_refused_on_its_line() {
    let msg = error_of(
        r#"
        [[routes]]
        method = "GTE"
        path = "/api/users"
        "#,
        "routes[0].method",
        2,
    );
    assert_says(&msg, &["\"GTE\"", "\"POST\""]);
}

#[test]
fn a_head_rule_is_refused_because_get_rules_match_head() {
    let msg = error_of(
        r#"
        [[routes]]
        method = "HEAD"
        path = "/api/users"
        "#,
        "routes[0].method",
        2,
    );
    assert_says(&msg, &["GET"]);
}

#[test]
fn axum_07_path_syntax_is_refused_with_the_08_spelling() {
    for (path, fix) in [("/users/:id", "{id}"), ("/files/*rest", "{*rest}")] {
        let msg = error_of(
            &format!("\n        [[routes]]\n        path = \"{path}\"\n"),
            "routes[0].path",
            2,
        );
        assert_says(&msg, &[fix]);
    }
}

#[test]
fn a_path_without_a_leading_slash_is_refused() {
    error_of(
        r#"
        [[routes]]
        method = "GET"
        path = "api/users"
        "#,
        "routes[0].path",
        3,
    );
}

#[test]
fn a_rule_shadowed_by_an_earlier_one_is_refused_naming_it() {
    let msg = error_of(
        r#"
        [[routes]]
        path = "/api/*"
        cost = 2

        [[routes]]
        method = "POST"
        path = "/api/export"
        cost = 5
        "#,
        "routes[1].path",
        7,
    );
    assert_says(&msg, &["routes[0]", "* /api/*"]);
}

#[test]
fn rules_of_different_methods_on_one_path_are_both_kept() {
    load(&with_tier(
        BURST_10,
        r#"
        [[routes]]
        method = "GET"
        path = "/api/data"
        [[routes]]
        method = "POST"
        path = "/api/data"
        cost = 2
        "#,
    ))
    .unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn ipv6_prefix_defaults_to_64_and_is_checked() {
    let policy = load(&with_tier(BURST_10, "")).unwrap();
    assert_eq!(policy.identity.ipv6_prefix, 64);
    let policy = load(
        r#"
        [identity]
        ipv6_prefix = 48
        "#,
    )
    .unwrap();
    assert_eq!(policy.identity.ipv6_prefix, 48);
    error_of(
        r#"
        [identity]
        ipv6_prefix = 0
        "#,
        "identity.ipv6_prefix",
        2,
    );
}

#[test]
fn ip_scoped_limits_of_one_name_must_agree_on_their_counter_across_tiers() {
    let msg = error_of(
        r#"
        [[tiers]]
        name = "free"
        limits = [{ name = "per_ip", algorithm = "sliding_window", limit = 10, window = "60s", scope = "ip" }]
        [[tiers]]
        name = "anonymous"
        limits = [{ name = "per_ip", algorithm = "fixed_window", limit = 5, window = "60s", scope = "ip" }]
        "#,
        "tiers[1].limits[0].algorithm",
        6,
    );
    assert_says(&msg, &["tiers[0].limits[0]", "one counter for every tier"]);
    error_of(
        r#"
        [[tiers]]
        name = "free"
        limits = [{ name = "per_ip", algorithm = "sliding_window", limit = 10, window = "60s", scope = "ip" }]
        [[tiers]]
        name = "anonymous"
        limits = [{ name = "per_ip", algorithm = "sliding_window", limit = 5, window = "1h", scope = "ip" }]
        "#,
        "tiers[1].limits[0].window",
        6,
    );
    // Quotas may differ: each tier's own quota against the shared counter.
    load(
        r#"
        [[tiers]]
        name = "free"
        limits = [{ name = "per_ip", algorithm = "sliding_window", limit = 10, window = "60s", scope = "ip" }]
        [[tiers]]
        name = "anonymous"
        limits = [{ name = "per_ip", algorithm = "sliding_window", limit = 5, window = "60s", scope = "ip" }]
        "#,
    )
    .unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn a_split_share_below_a_route_cost_names_the_split_and_the_route() {
    let msg = error_of(
        r#"
        [[tiers]]
        name = "free"
        split = 8
        limits = [{ name = "burst", algorithm = "token_bucket", capacity = 10, refill_per_second = 1 }]
        [[tiers]]
        name = "anonymous"
        limits = [{ name = "burst", algorithm = "token_bucket", capacity = 10, refill_per_second = 1 }]
        [[routes]]
        method = "POST"
        path = "/api/export"
        cost = 5
        "#,
        "tiers[0].split",
        3,
    );
    assert_says(&msg, &["1", "cost 5", "routes[0] (POST /api/export)"]);
}

#[test]
fn a_split_share_is_rounded_down_never_raised() {
    let policy = Policy::builder()
        .tier(
            Tier::new("free")
                .split(3)
                .limit(Limit::token_bucket("burst", 10, 3.0)),
        )
        .tier(Tier::new("anonymous").limit(Limit::token_bucket("burst", 10, 3.0)))
        .build()
        .unwrap();
    let share = ratewatch::policy::shares::split_share(&policy.tiers[0].limits[0], 3);
    assert_eq!(share.quota(), 3);
}

#[test]
fn a_local_share_is_checked_only_against_routes_that_fall_back_locally() {
    let local_route = |policy: &str| {
        with_tier(
            r#"{ name = "burst", algorithm = "token_bucket", capacity = 8, refill_per_second = 1 }"#,
            &format!(
                r#"
        [resilience]
        on_store_failure = "local"
        expected_instances = 4
        [[routes]]
        method = "POST"
        path = "/api/export"
        cost = 5
        on_store_failure = "{policy}"
        "#
            ),
        )
    };
    load(&local_route("closed")).unwrap_or_else(|e| panic!("{e}"));
    let msg = error_of(&local_route("local"), "tiers[0].limits[0].capacity", 6);
    assert_says(&msg, &["expected_instances = 4", "2", "cost 5"]);
}

#[test]
fn a_partition_share_below_a_cost_is_refused_not_raised() {
    let msg = error_of(
        &format!(
            "\n        partition = 0.1{}",
            with_tier(
                BURST_10,
                r#"
        [[routes]]
        method = "POST"
        path = "/api/export"
        cost = 5
        "#
            )
        ),
        "tiers[0].limits[0].capacity",
        7,
    );
    assert_says(&msg, &["partition = 0.1", "leaves 1", "cost 5"]);
}

#[test]
fn a_policy_valid_before_partition_but_not_after_is_refused_at_load() {
    let err = load(&format!(
        "\n        partition = 0.5{}",
        with_tier(
            r#"{ name = "slow", algorithm = "token_bucket", capacity = 10, refill_per_second = 0.000001 }"#,
            ""
        )
    ))
    .expect_err("the halved rate is out of range");
    assert_eq!(err.field(), Some("tiers[0].limits[0].refill_per_second"));
    assert!(err.to_string().contains("partition = 0.5"), "{err}");
    // And what loads is what a limiter runs: validating it again passes.
    let ok = load(&format!(
        "\n        partition = 0.5{}",
        with_tier(BURST_10, "")
    ))
    .unwrap();
    ok.validate().unwrap();
    assert_eq!(ok.tiers[0].limits[0].algorithm.quota(), 5);
}
