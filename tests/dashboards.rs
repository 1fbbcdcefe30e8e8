//! `dashboards/`: the Grafana dashboards and Prometheus alert rules are
//! checked with the real tools: promtool parses and unit-tests the rules,
//! parses every dashboard query, and a real Prometheus scrapes an exposition
//! of every ratewatch metric, answers every dashboard query and evaluates
//! every alert rule.
mod support;

use std::collections::{BTreeSet, HashSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

/// The metrics ratewatch exports (DESIGN.md, "Telemetry").
const METRICS: [&str; 36] = [
    "ratewatch_decisions_total",
    "ratewatch_limit_exceeded_total",
    "ratewatch_fallbacks_total",
    "ratewatch_redis_rtt_seconds",
    "ratewatch_breaker_state",
    "ratewatch_breaker_trips_total",
    "ratewatch_script_reloads_total",
    "ratewatch_store_evictions_total",
    "ratewatch_telemetry_dropped_total",
    "ratewatch_build_info",
    "ratewatch_config_reloads_total",
    "ratewatch_config_last_reload_successful",
    "ratewatch_config_restart_required",
    "ratewatch_policy_info",
    "ratewatch_lease_keys",
    "ratewatch_lease_tokens_total",
    "ratewatch_lease_transitions_total",
    "ratewatch_lease_renew_seconds",
    "ratewatch_lease_decisions_total",
    "ratewatch_rls_decisions_total",
    "ratewatch_rls_request_duration_seconds",
    "ratewatch_rls_errors_total",
    "ratewatch_store_keys",
    "ratewatch_store_memory_used_bytes",
    "ratewatch_store_memory_max_bytes",
    "ratewatch_cost_units_total",
    "ratewatch_settles_total",
    "ratewatch_settled_units_total",
    "ratewatch_inflight_slots",
    "ratewatch_inflight_expired_holders_total",
    "ratewatch_inflight_renewals_failed_total",
    "ratewatch_inflight_releases_failed_total",
    "ratewatch_units_charged_total",
    "ratewatch_units_refunded_total",
    "ratewatch_units_settled_total",
    "ratewatch_limit_unit_info",
];

const HISTOGRAMS: [&str; 3] = [
    "ratewatch_redis_rtt_seconds",
    "ratewatch_lease_renew_seconds",
    "ratewatch_rls_request_duration_seconds",
];

const DATASOURCE_UID: &str = "${datasource}";

const ALERTS: [&str; 13] = [
    "RatewatchFailOpenRateHigh",
    "RatewatchBreakerOpen",
    "RatewatchRedisSlow",
    "RatewatchBlockRateSpike",
    "RatewatchTelemetryDropping",
    "RatewatchFailClosedRefusing",
    "RatewatchHotShard",
    "RatewatchPolicyReloadFailed",
    "RatewatchRlsErrors",
    "RatewatchStoreMemoryHigh",
    "RatewatchStoreKeysGrowing",
    "RatewatchStoreEvicting",
    "RatewatchTokenBudgetRefusals",
];

fn dashboards_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("dashboards")
}

fn tool(name: &str) -> PathBuf {
    for dir in std::env::var("PATH").unwrap_or_default().split(':') {
        let p = Path::new(dir).join(name);
        if p.is_file() {
            return p;
        }
    }
    panic!(
        "`{name}` is not installed: the dashboard tests run the real Prometheus tools. \
         Install them with `apt-get install prometheus` (Debian ships promtool with it)."
    );
}

/// Runs promtool and returns its combined output, panicking with it on failure.
fn promtool(args: &[&str]) -> String {
    let out = Command::new(tool("promtool"))
        .args(args)
        .output()
        .expect("run promtool");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "promtool {} failed:\n{text}",
        args.join(" ")
    );
    text
}

// ---------------------------------------------------------------------------
// Reading the dashboards and the rules
// ---------------------------------------------------------------------------

struct Dashboard {
    file: String,
    json: Value,
}

fn dashboards() -> Vec<Dashboard> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dashboards_dir())
        .expect("read dashboards/")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    assert!(
        files.iter().any(|f| f.ends_with("ratewatch-overview.json")),
        "dashboards/ratewatch-overview.json is missing"
    );
    files
        .into_iter()
        .map(|path| {
            let text = std::fs::read_to_string(&path).expect("read dashboard");
            let file = path.file_name().unwrap().to_string_lossy().into_owned();
            let json = serde_json::from_str(&text)
                .unwrap_or_else(|e| panic!("{file} is not valid JSON: {e}"));
            Dashboard { file, json }
        })
        .collect()
}

/// Every panel, including those nested in collapsed rows.
fn panels(d: &Value) -> Vec<&Value> {
    fn walk<'a>(list: &'a Value, out: &mut Vec<&'a Value>) {
        for p in list.as_array().into_iter().flatten() {
            out.push(p);
            if let Some(nested) = p.get("panels") {
                walk(nested, out);
            }
        }
    }
    let mut out = Vec::new();
    walk(&d["panels"], &mut out);
    out
}

/// `(panel title, expr)` of every query of every panel.
fn exprs(d: &Value) -> Vec<(String, String)> {
    panels(d)
        .into_iter()
        .flat_map(|p| {
            let title = p["title"].as_str().unwrap_or("?").to_string();
            p["targets"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(move |t| t["expr"].as_str().map(|e| (title.clone(), e.to_string())))
        })
        .collect()
}

/// The template variable called `name`.
fn variable<'a>(d: &'a Value, name: &str) -> Option<&'a Value> {
    d["templating"]["list"]
        .as_array()?
        .iter()
        .find(|v| v["name"] == name)
}

/// A dashboard query as Prometheus would receive it: Grafana's interval
/// variables become `5m`, template variables (always used as `=~"$var"`)
/// match anything.
fn concrete(expr: &str) -> String {
    let mut s = expr.to_string();
    for v in ["$__rate_interval", "$__interval", "$__range"] {
        s = s.replace(v, "5m");
    }
    let mut out = String::new();
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '$' {
            out.push(c);
            continue;
        }
        if chars.peek() == Some(&'{') {
            for c in chars.by_ref() {
                if c == '}' {
                    break;
                }
            }
        } else {
            while chars
                .peek()
                .is_some_and(|c| c.is_ascii_alphanumeric() || *c == '_')
            {
                chars.next();
            }
        }
        out.push_str(".*");
    }
    out
}

/// PromQL words that are not metric names.
const PROMQL_WORDS: [&str; 22] = [
    "sum",
    "min",
    "max",
    "avg",
    "count",
    "topk",
    "bottomk",
    "quantile",
    "group",
    "stddev",
    "stdvar",
    "count_values",
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "inf",
    "nan",
    "by",
    "without",
    "on",
];

/// The metric names an expression selects. A small lexer: strings, label
/// matchers `{...}`, ranges `[...]`, numbers, function calls, operators and
/// the label lists of `by`/`without`/`on`/`ignoring`/`group_*` are skipped;
/// every other identifier is a metric name.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let chars: Vec<char> = expr.chars().collect();
    let mut names = BTreeSet::new();
    let mut i = 0;
    let skip_string = |i: &mut usize| {
        let quote = chars[*i];
        *i += 1;
        while *i < chars.len() && chars[*i] != quote {
            if chars[*i] == '\\' {
                *i += 1;
            }
            *i += 1;
        }
        *i += 1;
    };
    let skip_until = |i: &mut usize, close: char| {
        while *i < chars.len() && chars[*i] != close {
            if matches!(chars[*i], '"' | '\'' | '`') {
                skip_string(i);
            } else {
                *i += 1;
            }
        }
        *i += 1;
    };
    while i < chars.len() {
        let c = chars[i];
        if matches!(c, '"' | '\'' | '`') {
            skip_string(&mut i);
        } else if c == '{' {
            skip_until(&mut i, '}');
        } else if c == '[' {
            skip_until(&mut i, ']');
        } else if c.is_ascii_digit()
            || (c == '.' && chars.get(i + 1).is_some_and(char::is_ascii_digit))
        {
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.') {
                i += 1;
            }
        } else if c.is_ascii_alphabetic() || c == '_' || c == ':' {
            let start = i;
            while i < chars.len()
                && (chars[i].is_ascii_alphanumeric() || matches!(chars[i], '_' | ':'))
            {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let mut j = i;
            while j < chars.len() && chars[j].is_whitespace() {
                j += 1;
            }
            let call = chars.get(j) == Some(&'(');
            let label_list = [
                "by",
                "without",
                "on",
                "ignoring",
                "group_left",
                "group_right",
            ]
            .contains(&word.as_str());
            if call && label_list {
                i = j + 1;
                skip_until(&mut i, ')');
            } else if !call && !PROMQL_WORDS.contains(&word.to_lowercase().as_str()) {
                names.insert(word);
            }
        } else {
            i += 1;
        }
    }
    names
}

/// Whether `name` is one of ratewatch's series (histogram series included).
fn is_ratewatch_series(name: &str) -> bool {
    METRICS.contains(&name)
        || ["_bucket", "_sum", "_count"].iter().any(|suffix| {
            name.strip_suffix(suffix)
                .is_some_and(|base| HISTOGRAMS.contains(&base))
        })
}

/// The metric a series name belongs to (`_bucket` and friends folded).
fn base_metric(name: &str) -> &str {
    ["_bucket", "_sum", "_count"]
        .iter()
        .find_map(|s| name.strip_suffix(s).filter(|b| HISTOGRAMS.contains(b)))
        .unwrap_or(name)
}

/// `(alert name, expr)` of every rule in alerts.yml ([`support::alert_rules`]),
/// checked against the `- alert:` lines so a format change fails.
fn alert_exprs() -> Vec<(String, String)> {
    let out = support::alert_rules();
    let text = std::fs::read_to_string(dashboards_dir().join("alerts.yml")).expect("alerts.yml");
    let rules = text
        .lines()
        .filter(|l| l.trim_start().starts_with("- alert:"))
        .count();
    assert_eq!(out.len(), rules, "every alert rule has one expr");
    out
}

/// A rules file recording every dashboard query, so promtool parses them.
fn dashboard_queries_as_rules(dir: &Path) -> PathBuf {
    let mut yaml = String::from("groups:\n");
    for (d, dash) in dashboards().iter().enumerate() {
        yaml.push_str(&format!("  - name: dashboard_{d}\n    rules:\n"));
        for (q, (_, expr)) in exprs(&dash.json).iter().enumerate() {
            yaml.push_str(&format!(
                "      - record: dashboard_{d}:query_{q}\n        expr: |\n"
            ));
            for line in concrete(expr).lines() {
                yaml.push_str(&format!("          {line}\n"));
            }
        }
    }
    let path = dir.join("dashboard_queries.yml");
    std::fs::write(&path, yaml).expect("write rules");
    path
}

// ---------------------------------------------------------------------------
// promtool
// ---------------------------------------------------------------------------

#[test]
fn alert_rules_pass_promtool_check_and_their_unit_tests() {
    let dir = dashboards_dir();
    let check = promtool(&["check", "rules", dir.join("alerts.yml").to_str().unwrap()]);
    assert!(check.contains("SUCCESS"), "{check}");
    let tests = promtool(&[
        "test",
        "rules",
        dir.join("alerts_test.yml").to_str().unwrap(),
    ]);
    assert!(tests.contains("SUCCESS"), "{tests}");
}

#[test]
fn every_alert_has_a_severity_a_summary_and_a_runbook_section() {
    let text = std::fs::read_to_string(dashboards_dir().join("alerts.yml")).unwrap();
    let runbook =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/operations.md"))
            .expect("docs/operations.md");
    for alert in ALERTS {
        let rules: Vec<&str> = text
            .split("- alert: ")
            .skip(1)
            .filter(|r| r.starts_with(&format!("{alert}\n")))
            .collect();
        assert!(!rules.is_empty(), "alerts.yml has no rule {alert}");
        for rule in rules {
            for field in ["severity:", "summary:", "description:"] {
                assert!(rule.contains(field), "{alert} has no {field}");
            }
            let anchor = format!("docs/operations.md#{}", alert.to_lowercase());
            assert!(rule.contains(&anchor), "{alert} does not point to {anchor}");
        }
        assert!(
            runbook.contains(&format!("## {alert}")),
            "docs/operations.md has no section `## {alert}`"
        );
    }
}

#[test]
fn every_dashboard_query_parses_as_promql() {
    let dir = tempfile::tempdir().unwrap();
    let rules = dashboard_queries_as_rules(dir.path());
    let out = promtool(&["check", "rules", rules.to_str().unwrap()]);
    let total: usize = dashboards().iter().map(|d| exprs(&d.json).len()).sum();
    assert!(
        out.contains(&format!("SUCCESS: {total} rules found")),
        "promtool did not parse all {total} queries:\n{out}"
    );
}

// ---------------------------------------------------------------------------
// Structure
// ---------------------------------------------------------------------------

#[test]
fn dashboards_pick_their_datasource_at_import_and_every_panel_uses_it() {
    let wanted = serde_json::json!({"type": "prometheus", "uid": DATASOURCE_UID});
    for Dashboard { file, json } in dashboards() {
        let ds = variable(&json, "datasource")
            .unwrap_or_else(|| panic!("{file}: no `datasource` template variable"));
        assert_eq!(ds["type"], "datasource", "{file}");
        assert_eq!(ds["query"], "prometheus", "{file}");
        assert!(
            json["schemaVersion"].as_u64().is_some_and(|v| v >= 36),
            "{file}: schemaVersion {}",
            json["schemaVersion"]
        );
        assert!(
            json["uid"].as_str().is_some_and(|u| !u.is_empty()),
            "{file}: no uid"
        );
        for p in panels(&json) {
            let title = p["title"].as_str().unwrap_or("?");
            if p["type"] == "row" {
                continue;
            }
            assert_eq!(p["datasource"], wanted, "{file}: panel {title:?}");
            let targets = p["targets"].as_array();
            assert!(
                targets.is_some_and(|t| !t.is_empty()),
                "{file}: panel {title:?} has no query"
            );
            for t in targets.unwrap() {
                assert!(
                    t["expr"].is_string(),
                    "{file}: panel {title:?}: a target has no expr"
                );
                if let Some(tds) = t.get("datasource") {
                    assert_eq!(tds, &wanted, "{file}: panel {title:?}");
                }
            }
        }
    }
}

#[test]
fn panels_have_unique_ids_and_do_not_overlap_on_the_grid() {
    for Dashboard { file, json } in dashboards() {
        let mut ids = HashSet::new();
        let mut boxes: Vec<(&str, u64, u64, u64, u64)> = Vec::new();
        for p in panels(&json) {
            let title = p["title"].as_str().unwrap_or("?");
            let id = p["id"]
                .as_u64()
                .unwrap_or_else(|| panic!("{file}: {title:?} has no id"));
            assert!(
                ids.insert(id),
                "{file}: panel id {id} used twice ({title:?})"
            );
            let g = &p["gridPos"];
            let [x, y, w, h] = ["x", "y", "w", "h"].map(|k| {
                g[k].as_u64()
                    .unwrap_or_else(|| panic!("{file}: {title:?} has no gridPos.{k}"))
            });
            assert!(
                w > 0 && h > 0 && x + w <= 24,
                "{file}: {title:?} is off the 24-column grid"
            );
            for (other, ox, oy, ow, oh) in &boxes {
                let apart = x + w <= *ox || *ox + ow <= x || y + h <= *oy || *oy + oh <= y;
                assert!(apart, "{file}: {title:?} overlaps {other:?}");
            }
            boxes.push((title, x, y, w, h));
        }
    }
}

#[test]
fn every_board_picks_job_and_instance_and_every_query_honours_them() {
    for Dashboard { file, json } in dashboards() {
        for name in ["job", "instance"] {
            let v = variable(&json, name).unwrap_or_else(|| panic!("{file}: no `{name}` variable"));
            assert_eq!(v["type"], "query", "{file}: {name}");
            assert_eq!(v["multi"], true, "{file}: {name}");
            assert_eq!(v["includeAll"], true, "{file}: {name}");
            assert_eq!(v["allValue"], ".*", "{file}: {name}");
        }
        let instance = variable(&json, "instance").unwrap();
        assert!(
            instance["query"]["query"]
                .as_str()
                .is_some_and(|q| q.contains(r#"job=~"$job""#)),
            "{file}: instances follow the chosen job"
        );
        for (title, expr) in exprs(&json) {
            let selectors = expr.matches("ratewatch_").count();
            let filtered = expr
                .matches(r#"job=~"$job", instance=~"$instance""#)
                .count();
            assert_eq!(
                selectors, filtered,
                "{file}: {title:?}: a selector ignores job or instance: {expr}"
            );
        }
    }
}

#[test]
fn the_boards_chart_the_share_of_decisions_per_shard() {
    for Dashboard { file, json } in dashboards() {
        let shares: Vec<String> = exprs(&json)
            .into_iter()
            .filter(|(t, _)| t.contains("hare"))
            .map(|(_, e)| e)
            .collect();
        assert!(
            shares.len() >= 2,
            "{file}: busiest shard and share per shard panels"
        );
        for e in shares {
            assert!(
                e.contains("scalar(sum(rate(ratewatch_decisions_total{"),
                "{file}: {e}"
            );
        }
    }
}

#[test]
fn the_overview_filters_by_tier_and_shard_with_multi_value_variables() {
    let overview = dashboards()
        .into_iter()
        .find(|d| d.file == "ratewatch-overview.json")
        .unwrap();
    for name in ["tier", "shard"] {
        let v = variable(&overview.json, name).unwrap_or_else(|| panic!("no `{name}` variable"));
        assert_eq!(v["type"], "query", "{name}");
        assert_eq!(v["multi"], true, "{name}");
        assert_eq!(v["includeAll"], true, "{name}");
        let query = v["query"]["query"]
            .as_str()
            .or(v["query"].as_str())
            .unwrap();
        assert_eq!(
            query,
            format!(
                "label_values(ratewatch_decisions_total{{job=~\"$job\", instance=~\"$instance\"}}, {name})"
            )
        );
    }
    let decisions: Vec<String> = exprs(&overview.json)
        .into_iter()
        .map(|(_, e)| e)
        .filter(|e| e.contains("ratewatch_decisions_total{"))
        .collect();
    assert!(!decisions.is_empty());
    for e in decisions {
        assert!(
            e.contains(r#"tier=~"$tier""#) && e.contains(r#"shard=~"$shard""#),
            "a decisions query ignores the tier or shard filter: {e}"
        );
    }
}

#[test]
fn the_overview_charts_every_metric_and_the_fail_open_rate_by_the_design_formula() {
    let overview = dashboards()
        .into_iter()
        .find(|d| d.file == "ratewatch-overview.json")
        .unwrap();
    let queries = exprs(&overview.json);
    let used: BTreeSet<String> = queries
        .iter()
        .flat_map(|(_, e)| metric_names(e))
        .map(|n| base_metric(&n).to_string())
        .collect();
    for m in METRICS {
        assert!(used.contains(m), "no overview panel charts {m}");
    }
    let fail_open: Vec<&String> = queries
        .iter()
        .filter(|(title, _)| title.starts_with("Fail-open rate"))
        .map(|(_, e)| e)
        .collect();
    assert_eq!(
        fail_open.len(),
        2,
        "a fail-open stat and a fail-open time series"
    );
    let squash = |s: &str| s.split_whitespace().collect::<String>();
    for e in fail_open {
        let e = squash(&concrete(e));
        assert!(
            e.starts_with(&squash(
                r#"sum(rate(ratewatch_decisions_total{outcome="fallback_allowed","#
            )) && e.contains("/(sum(rate(ratewatch_decisions_total{"),
            "fail-open rate is not fallback_allowed over all decisions: {e}"
        );
    }
    let p99 = r#"histogram_quantile(0.99, sum by (le, shard) (rate(ratewatch_redis_rtt_seconds_bucket{op="decide""#;
    assert!(
        queries.iter().any(|(_, e)| e.starts_with(p99)),
        "no fleet-wide p99 decide round trip per shard"
    );
}

#[test]
fn the_overview_has_a_units_row_with_units_per_tier_and_unit_refusals_per_unit_and_slots_per_tier()
{
    let overview = dashboards()
        .into_iter()
        .find(|d| d.file == "ratewatch-overview.json")
        .unwrap();
    let top = overview.json["panels"].as_array().unwrap();
    let row = top
        .iter()
        .position(|p| p["type"] == "row" && p["title"] == "Units")
        .expect("the overview has a row \"Units\"");
    let next_row = top[row + 1..]
        .iter()
        .position(|p| p["type"] == "row")
        .map_or(top.len(), |i| row + 1 + i);
    let in_row: Vec<String> = top[row + 1..next_row]
        .iter()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .filter_map(|t| t["expr"].as_str().map(str::to_owned))
        .collect();
    let squash = |s: &str| s.split_whitespace().collect::<String>();
    for family in [
        "ratewatch_units_charged_total",
        "ratewatch_units_refunded_total",
        "ratewatch_units_settled_total",
    ] {
        let want = squash(&format!("sum by (tier, unit) (rate({family}{{"));
        assert!(
            in_row
                .iter()
                .any(|e| squash(e).starts_with(&want) && e.contains("[$__rate_interval]")),
            "no Units panel charts {family} per tier and unit: {in_row:?}"
        );
    }
    assert!(
        in_row
            .iter()
            .any(|e| e.contains("ratewatch_limit_exceeded_total")
                && squash(e).contains(&squash("group_left (unit) ratewatch_limit_unit_info{"))),
        "no Units panel gives refusals their unit: {in_row:?}"
    );
    assert!(
        in_row
            .iter()
            .any(|e| squash(e).starts_with(&squash("sum by (tier) (ratewatch_inflight_slots{"))),
        "no Units panel shows the in-flight slots held now per tier: {in_row:?}"
    );
}

#[test]
fn every_query_and_alert_names_only_metrics_ratewatch_exports() {
    let mut checked = 0;
    let mut check = |place: String, expr: &str| {
        let names = metric_names(expr);
        assert!(!names.is_empty(), "{place}: no metric found in {expr}");
        for n in names {
            assert!(
                is_ratewatch_series(&n),
                "{place} uses `{n}`, which ratewatch does not export: {expr}"
            );
        }
        checked += 1;
    };
    for Dashboard { file, json } in dashboards() {
        for (title, e) in exprs(&json) {
            check(format!("{file}: {title:?}"), &e);
        }
        for v in json["templating"]["list"].as_array().unwrap() {
            let q = v["query"]["query"]
                .as_str()
                .or(v["query"].as_str())
                .unwrap_or("");
            if let Some(args) = q.strip_prefix("label_values(") {
                let metric = args.split([',', ')']).next().unwrap().trim();
                check(format!("{file}: variable {}", v["name"]), metric);
            }
        }
    }
    for (alert, e) in alert_exprs() {
        check(format!("alerts.yml: {alert}"), &e);
    }
    assert!(checked > 20, "only {checked} expressions found");
}

#[test]
fn the_metric_check_catches_a_renamed_metric_and_ignores_labels_and_functions() {
    let e = r#"histogram_quantile(0.99, sum by (le, shard) (rate(ratewatch_redis_rtt_seconds_bucket{op="decide", shard=~"a|b"}[5m]))) > 0.025 and on (shard) sum without (instance) (ratewatch_breaker_state offset 5m) == bool 2"#;
    assert_eq!(
        metric_names(e),
        BTreeSet::from([
            "ratewatch_breaker_state".to_string(),
            "ratewatch_redis_rtt_seconds_bucket".to_string()
        ])
    );
    assert!(metric_names(e).iter().all(|n| is_ratewatch_series(n)));
    let renamed = metric_names(r#"sum(rate(ratewatch_decision_total{outcome="allowed"}[5m]))"#);
    assert!(!renamed.iter().all(|n| is_ratewatch_series(n)));
    assert!(!is_ratewatch_series("ratewatch_breaker_state_bucket"));
}

// ---------------------------------------------------------------------------
// A real Prometheus
// ---------------------------------------------------------------------------

/// Serves `/metrics` with every ratewatch metric, its counters growing at
/// fixed per-second rates (so `rate()` has something to say): 5% of
/// decisions fail open, shard 6380's breaker is open, telemetry drops, the
/// fail-closed export route refuses. Returns `host:port`: any scrape
/// target works in its place, such as a `ratewatch serve` under load.
async fn serve_exposition() -> String {
    use axum::{Router, routing::get};
    let started = Instant::now();
    let app = Router::new().route(
        "/metrics",
        get(move || async move { exposition(started.elapsed().as_secs_f64()) }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr.to_string()
}

/// Appends one metric family (HELP, TYPE and its samples) to `s`.
fn family(s: &mut String, name: &str, kind: &str, help: &str, samples: &[(&str, f64)]) {
    s.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n"));
    for (labels, v) in samples {
        s.push_str(&format!("{name}{{{labels}}} {v}\n"));
    }
}

fn exposition(t: f64) -> String {
    const A: &str = "127.0.0.1:6379";
    const B: &str = "127.0.0.1:6380";
    let mut s = String::new();
    let d = |tier: &str, route: &str, shard: &str, outcome: &str, per_s: f64| {
        (
            format!(r#"tier="{tier}",route="{route}",shard="{shard}",outcome="{outcome}""#),
            per_s * t,
        )
    };
    let decisions = [
        d("free", "*", A, "allowed", 80.0),
        d("free", "*", A, "blocked", 10.0),
        d("free", "*", A, "shadow_blocked", 2.0),
        d("pro", "*", B, "allowed", 40.0),
        d("pro", "*", B, "fallback_allowed", 7.0),
        d("free", "/api/export", B, "fallback_blocked", 1.0),
    ];
    let refs: Vec<(&str, f64)> = decisions.iter().map(|(l, v)| (l.as_str(), *v)).collect();
    family(
        &mut s,
        "ratewatch_decisions_total",
        "counter",
        "Rate-limit decisions.",
        &refs,
    );
    family(
        &mut s,
        "ratewatch_limit_exceeded_total",
        "counter",
        "Requests a limit blocked.",
        &[
            (r#"tier="free",limit="burst""#, 8.0 * t),
            (r#"tier="free",limit="minute""#, 4.0 * t),
        ],
    );
    family(
        &mut s,
        "ratewatch_fallbacks_total",
        "counter",
        "Decisions answered by the failure policy.",
        &[
            (
                r#"shard="127.0.0.1:6380",reason="breaker_open",policy="open""#,
                7.0 * t,
            ),
            (
                r#"shard="127.0.0.1:6380",reason="breaker_open",policy="closed""#,
                t,
            ),
        ],
    );
    s.push_str("# HELP ratewatch_redis_rtt_seconds Redis round trips.\n");
    s.push_str("# TYPE ratewatch_redis_rtt_seconds histogram\n");
    let bounds = [
        "0.0001", "0.00025", "0.0005", "0.001", "0.0025", "0.005", "0.01", "0.025", "0.05", "0.1",
        "0.25", "0.5", "0.75", "1", "+Inf",
    ];
    // Cumulative share of round trips at or under each bound.
    let fast = [
        0.0, 0.1, 0.5, 0.9, 0.99, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0,
    ];
    for (shard, op, per_s) in [
        (A, "decide", 92.0),
        (A, "telemetry", 1.0),
        (B, "telemetry", 1.0),
    ] {
        for (le, share) in bounds.iter().zip(fast) {
            s.push_str(&format!(
                "ratewatch_redis_rtt_seconds_bucket{{shard=\"{shard}\",op=\"{op}\",le=\"{le}\"}} {}\n",
                (share * per_s * t).floor()
            ));
        }
        s.push_str(&format!(
            "ratewatch_redis_rtt_seconds_sum{{shard=\"{shard}\",op=\"{op}\"}} {}\n",
            0.0006 * per_s * t
        ));
        s.push_str(&format!(
            "ratewatch_redis_rtt_seconds_count{{shard=\"{shard}\",op=\"{op}\"}} {}\n",
            (per_s * t).floor()
        ));
    }
    family(
        &mut s,
        "ratewatch_breaker_state",
        "gauge",
        "Circuit breaker state: 0 closed, 1 half-open, 2 open.",
        &[
            (r#"shard="127.0.0.1:6379""#, 0.0),
            (r#"shard="127.0.0.1:6380""#, 2.0),
        ],
    );
    family(
        &mut s,
        "ratewatch_breaker_trips_total",
        "counter",
        "Times a breaker opened.",
        &[(r#"shard="127.0.0.1:6380""#, (t / 2.0).floor())],
    );
    family(
        &mut s,
        "ratewatch_script_reloads_total",
        "counter",
        "Scripts reloaded after NOSCRIPT.",
        &[(r#"shard="127.0.0.1:6379""#, (t / 2.0).floor())],
    );
    family(
        &mut s,
        "ratewatch_store_evictions_total",
        "counter",
        "Memory-store entries evicted at max_entries.",
        &[(r#"shard="127.0.0.1:6380""#, 5.0 * t)],
    );
    // A store with room to spare: keys steady, a tenth of maxmemory on one
    // shard, no maxmemory on the other (its memory alert has no sample).
    family(
        &mut s,
        "ratewatch_store_keys",
        "gauge",
        "Keys the store holds.",
        &[
            (r#"shard="127.0.0.1:6379""#, 120_000.0),
            (r#"shard="127.0.0.1:6380""#, 80_000.0),
        ],
    );
    family(
        &mut s,
        "ratewatch_store_memory_used_bytes",
        "gauge",
        "Redis used_memory.",
        &[
            (r#"shard="127.0.0.1:6379""#, 10_000_000.0),
            (r#"shard="127.0.0.1:6380""#, 8_000_000.0),
        ],
    );
    family(
        &mut s,
        "ratewatch_store_memory_max_bytes",
        "gauge",
        "Redis maxmemory.",
        &[
            (r#"shard="127.0.0.1:6379""#, 100_000_000.0),
            (r#"shard="127.0.0.1:6380""#, 0.0),
        ],
    );
    family(
        &mut s,
        "ratewatch_telemetry_dropped_total",
        "counter",
        "Events the fleet view lost.",
        &[(r#"reason="error""#, 3.0 * t)],
    );
    family(
        &mut s,
        "ratewatch_build_info",
        "gauge",
        "Always 1, labelled with the version.",
        &[(r#"version="0.1.0""#, 1.0)],
    );
    // A healthy reload history: the policy alert stays quiet.
    family(
        &mut s,
        "ratewatch_config_reloads_total",
        "counter",
        "Policy reloads.",
        &[
            (r#"result="ok""#, (t / 10.0).floor()),
            (r#"result="error""#, 0.0),
        ],
    );
    family(
        &mut s,
        "ratewatch_config_last_reload_successful",
        "gauge",
        "1 if the latest reload applied.",
        &[("", 1.0)],
    );
    family(
        &mut s,
        "ratewatch_config_restart_required",
        "gauge",
        "Settings waiting for a restart.",
        &[("", 0.0)],
    );
    family(
        &mut s,
        "ratewatch_policy_info",
        "gauge",
        "The policy in force.",
        &[
            (r#"version="2026-12-01.1",hash="0123456789ab""#, 1.0),
            (r#"version="2026-11-30.2",hash="ba9876543210""#, 0.0),
        ],
    );
    family(
        &mut s,
        "ratewatch_lease_keys",
        "gauge",
        "Keys in lease mode.",
        &[("", 2.0)],
    );
    family(
        &mut s,
        "ratewatch_lease_tokens_total",
        "counter",
        "Lease units by event.",
        &[
            (r#"event="granted""#, 400.0 * t),
            (r#"event="spent""#, 390.0 * t),
            (r#"event="returned""#, 8.0 * t),
            (r#"event="expired""#, 2.0 * t),
        ],
    );
    family(
        &mut s,
        "ratewatch_lease_transitions_total",
        "counter",
        "Lease mode transitions.",
        &[
            (r#"to="leased",reason="hot""#, (t / 10.0).floor()),
            (r#"to="exact",reason="tail""#, (t / 20.0).floor()),
        ],
    );
    family(
        &mut s,
        "ratewatch_lease_decisions_total",
        "counter",
        "Lease-mode decisions by path.",
        &[
            (r#"path="local""#, 390.0 * t),
            (r#"path="store""#, 40.0 * t),
        ],
    );
    s.push_str("# HELP ratewatch_lease_renew_seconds Time to take a lease.\n");
    s.push_str("# TYPE ratewatch_lease_renew_seconds histogram\n");
    for (le, share) in [
        ("0.0005", 0.5),
        ("0.001", 0.9),
        ("0.0025", 0.99),
        ("+Inf", 1.0),
    ] {
        s.push_str(&format!(
            "ratewatch_lease_renew_seconds_bucket{{le=\"{le}\"}} {}\n",
            (share * 40.0 * t).floor()
        ));
    }
    s.push_str(&format!(
        "ratewatch_lease_renew_seconds_sum {}\n",
        0.0006 * 40.0 * t
    ));
    s.push_str(&format!(
        "ratewatch_lease_renew_seconds_count {}\n",
        (40.0 * t).floor()
    ));
    // The decision service: 100 descriptor decisions per second on one
    // domain, 10 of them over limit; 1% of its requests fail.
    family(
        &mut s,
        "ratewatch_rls_decisions_total",
        "counter",
        "Decision-service descriptor decisions, by domain, rule and outcome.",
        &[
            (
                r#"domain="edge",rule="remote_address",outcome="ok""#,
                90.0 * t,
            ),
            (
                r#"domain="edge",rule="remote_address",outcome="over_limit""#,
                10.0 * t,
            ),
        ],
    );
    family(
        &mut s,
        "ratewatch_inflight_slots",
        "gauge",
        "In-flight slots this instance holds, by tier and limit.",
        &[(r#"tier="free",limit="reports""#, 2.0)],
    );
    for (name, per_s) in [
        ("ratewatch_inflight_expired_holders_total", 0.1),
        ("ratewatch_inflight_renewals_failed_total", 0.05),
        ("ratewatch_inflight_releases_failed_total", 0.02),
    ] {
        family(
            &mut s,
            name,
            "counter",
            "In-flight holder events, by shard.",
            &[(r#"shard="127.0.0.1:6379""#, per_s * t)],
        );
    }
    family(
        &mut s,
        "ratewatch_rls_errors_total",
        "counter",
        "Decision-service requests answered with an error, by api and reason.",
        &[(r#"api="grpc",reason="store_unavailable""#, t)],
    );
    // Costs: 500 units a second reserved, 40 settles a second.
    family(
        &mut s,
        "ratewatch_cost_units_total",
        "counter",
        "Units admitted requests were charged at their decision.",
        &[(r#"tier="free",route="*""#, 500.0 * t)],
    );
    family(
        &mut s,
        "ratewatch_settles_total",
        "counter",
        "Settles after a response, by outcome.",
        &[
            (r#"tier="free",route="*",outcome="charged""#, 10.0 * t),
            (r#"tier="free",route="*",outcome="refunded""#, 29.0 * t),
            (r#"tier="free",route="*",outcome="failed""#, t),
        ],
    );
    family(
        &mut s,
        "ratewatch_settled_units_total",
        "counter",
        "Units settles charged or gave back.",
        &[
            (r#"tier="free",route="*",direction="charged""#, 80.0 * t),
            (r#"tier="free",route="*",direction="refunded""#, 120.0 * t),
        ],
    );
    // Units: tier free counts tokens with its limit "minute" (4 refusals a
    // second of 93 decisions: under the token-budget alert's 10%).
    for (name, per_s) in [
        ("ratewatch_units_charged_total", 900.0),
        ("ratewatch_units_refunded_total", 150.0),
        ("ratewatch_units_settled_total", 60.0),
    ] {
        family(
            &mut s,
            name,
            "counter",
            "Units per tier and unit.",
            &[
                (r#"tier="free",unit="requests""#, 80.0 * t),
                (r#"tier="free",unit="tokens""#, per_s * t),
            ],
        );
    }
    family(
        &mut s,
        "ratewatch_limit_unit_info",
        "gauge",
        "The unit each limit of each tier counts.",
        &[
            (r#"tier="free",limit="burst",unit="requests""#, 1.0),
            (r#"tier="free",limit="minute",unit="tokens""#, 1.0),
        ],
    );
    s.push_str("# HELP ratewatch_rls_request_duration_seconds Decision-service request latency.\n");
    s.push_str("# TYPE ratewatch_rls_request_duration_seconds histogram\n");
    for (le, share) in [
        ("0.0005", 0.5),
        ("0.001", 0.9),
        ("0.02", 0.999),
        ("+Inf", 1.0),
    ] {
        s.push_str(&format!(
            "ratewatch_rls_request_duration_seconds_bucket{{api=\"grpc\",le=\"{le}\"}} {}\n",
            (share * 100.0 * t).floor()
        ));
    }
    s.push_str(&format!(
        "ratewatch_rls_request_duration_seconds_sum{{api=\"grpc\"}} {}\n",
        0.0005 * 100.0 * t
    ));
    s.push_str(&format!(
        "ratewatch_rls_request_duration_seconds_count{{api=\"grpc\"}} {}\n",
        (100.0 * t).floor()
    ));
    s
}

async fn api(client: &reqwest::Client, prom: &support::Prometheus, path: &str) -> Value {
    let resp = client
        .get(format!("{}{path}", prom.url()))
        .send()
        .await
        .unwrap_or_else(|e| panic!("GET {path}: {e}"));
    resp.json()
        .await
        .unwrap_or_else(|e| panic!("GET {path}: not JSON: {e}"))
}

async fn query(client: &reqwest::Client, prom: &support::Prometheus, expr: &str) -> Value {
    let resp = client
        .get(format!("{}/api/v1/query", prom.url()))
        .query(&[("query", expr)])
        .send()
        .await
        .unwrap_or_else(|e| panic!("query {expr}: {e}"));
    resp.json()
        .await
        .unwrap_or_else(|e| panic!("query {expr}: not JSON: {e}"))
}

/// Polls `check` every 250 ms until it returns `Some`, or panics with `what`
/// after `secs`.
async fn eventually<T, F, Fut>(secs: u64, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(Instant::now() < deadline, "{what} within {secs} s");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[test]
fn the_test_exposition_is_a_valid_prometheus_exposition() {
    use std::io::Write;
    let mut child = Command::new(tool("promtool"))
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run promtool");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(exposition(10.0).as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_prometheus_answers_every_dashboard_query_and_evaluates_every_alert() {
    let target = serve_exposition().await;
    let rules = dashboards_dir().join("alerts.yml");
    let prom = tokio::task::spawn_blocking(move || support::Prometheus::start(&[target], &[rules]))
        .await
        .unwrap();
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let (c, p) = (&client, &prom);

    eventually(20, "the scrape target is up", move || async move {
        let t = api(c, p, "/api/v1/targets").await;
        let up = t["data"]["activeTargets"]
            .as_array()?
            .iter()
            .all(|t| t["health"] == "up");
        let any = !t["data"]["activeTargets"].as_array()?.is_empty();
        (any && up).then_some(())
    })
    .await;

    // rate() needs two scrapes; the fail-open rate needs both of its series.
    let fail_open = eventually(20, "the fail-open rate has a value", move || async move {
        let r = query(
            c,
            p,
            "sum(rate(ratewatch_decisions_total{outcome=\"fallback_allowed\"}[5m])) / sum(rate(ratewatch_decisions_total[5m]))",
        )
        .await;
        r["data"]["result"][0]["value"][1]
            .as_str()
            .and_then(|v| v.parse::<f64>().ok())
    })
    .await;
    // 7 of 140 decisions per second fail open.
    assert!(
        (fail_open - 0.05).abs() < 0.005,
        "fail-open rate {fail_open}"
    );

    for Dashboard { file, json } in dashboards() {
        for (title, expr) in exprs(&json) {
            let e = concrete(&expr);
            let r = query(&client, &prom, &e).await;
            assert_eq!(r["status"], "success", "{file}: {title:?}: {e}\n{r}");
            // Every metric is in the exposition, so every query has data; an
            // empty answer means a wrong metric or label value.
            let result = &r["data"]["result"];
            assert!(
                result.as_array().is_some_and(|a| !a.is_empty()),
                "{file}: {title:?} returned no data: {e}"
            );
        }
    }

    let outcomes = query(
        &client,
        &prom,
        &concrete(r#"sum by (outcome) (rate(ratewatch_decisions_total{tier=~"$tier", shard=~"$shard"}[$__rate_interval]))"#),
    )
    .await;
    let seen: BTreeSet<&str> = outcomes["data"]["result"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["metric"]["outcome"].as_str())
        .collect();
    assert_eq!(
        seen,
        BTreeSet::from([
            "allowed",
            "blocked",
            "fallback_allowed",
            "fallback_blocked",
            "shadow_blocked"
        ])
    );

    let rules = eventually(
        20,
        "every alert rule was evaluated with health ok",
        move || async move {
            let r = api(c, p, "/api/v1/rules").await;
            let rules: Vec<Value> = r["data"]["groups"]
                .as_array()?
                .iter()
                .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
                .collect();
            (!rules.is_empty() && rules.iter().all(|r| r["health"] == "ok")).then_some(rules)
        },
    )
    .await;
    let names: BTreeSet<&str> = rules.iter().filter_map(|r| r["name"].as_str()).collect();
    assert_eq!(names, BTreeSet::from(ALERTS));
    assert_eq!(
        rules.len(),
        14,
        "two fail-open severities and twelve other alerts"
    );

    // Every alert the exposition calls for is pending (none can have
    // outlasted its `for` yet); the healthy ones are not.
    let alerts = eventually(
        20,
        "the alerts the exposition calls for are pending",
        move || async move {
            let r = api(c, p, "/api/v1/alerts").await;
            let alerts = r["data"]["alerts"].as_array()?.clone();
            (alerts.len() >= 5).then_some(alerts)
        },
    )
    .await;
    let active: BTreeSet<(String, String, String)> = alerts
        .iter()
        .map(|a| {
            let l = &a["labels"];
            let s = |k: &str| l[k].as_str().unwrap_or("").to_string();
            assert_eq!(a["state"], "pending", "{a}");
            (
                s("alertname"),
                s("severity"),
                format!("{}{}", s("shard"), s("route")),
            )
        })
        .collect();
    let expected = |a: &str, sev: &str, on: &str| (a.to_string(), sev.to_string(), on.to_string());
    assert_eq!(
        active,
        BTreeSet::from([
            expected("RatewatchFailOpenRateHigh", "warning", ""),
            expected("RatewatchBreakerOpen", "warning", "127.0.0.1:6380"),
            expected("RatewatchTelemetryDropping", "warning", ""),
            expected("RatewatchFailClosedRefusing", "critical", "/api/export"),
            // The exposition's evictions grow on 127.0.0.1:6380.
            expected("RatewatchStoreEvicting", "warning", "127.0.0.1:6380"),
        ])
    );
}

/// The token-budget alert and the Units row join refusals to the unit of
/// the limit that refused: a real server names that unit per tier and
/// limit, from its policy, before the first request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_server_names_the_unit_every_limit_counts_for_the_token_budget_join() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("units.toml");
    std::fs::write(
        &config,
        r#"
[store]
kind = "memory"

[[tiers]]
name = "free"
match_prefix = "free_"
limits = [
  { name = "rpm", algorithm = "sliding_window", limit = 60, window = "60s" },
  { name = "tpm", algorithm = "sliding_window", limit = 100000, window = "60s", unit = "tokens" },
]

[[tiers]]
name = "anonymous"
limits = [{ name = "burst", algorithm = "token_bucket", capacity = 10, refill_per_second = 1 }]
"#,
    )
    .unwrap();
    let server = support::Ratewatch::start("serve", Some(&config), &[]);
    let text = reqwest::get(format!("{}/metrics", server.url()))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for line in [
        r#"ratewatch_limit_unit_info{tier="free",limit="rpm",unit="requests"} 1"#,
        r#"ratewatch_limit_unit_info{tier="free",limit="tpm",unit="tokens"} 1"#,
        r#"ratewatch_limit_unit_info{tier="anonymous",limit="burst",unit="requests"} 1"#,
    ] {
        assert!(text.contains(line), "{line} missing from:\n{text}");
    }
    let infos = text
        .lines()
        .filter(|l| l.starts_with("ratewatch_limit_unit_info{"))
        .count();
    assert_eq!(infos, 3, "one series per tier and limit:\n{text}");
}
