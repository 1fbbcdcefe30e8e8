//! Every metric family a shipped Grafana board or alert rule uses exists,
//! at zero, in a fresh `/metrics` scrape of every store kind: a board or
//! rule never looks at a family that only appears after the first event.

mod support;

use std::collections::BTreeSet;
use std::path::Path;

use support::{Ratewatch, RedisServer};

/// Every `ratewatch_*` family named in `text` (histogram series folded to
/// their family).
fn families_in(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    while let Some(at) = text[i..].find("ratewatch_") {
        let start = i + at;
        let before_ok = start == 0 || {
            let c = bytes[start - 1];
            !(c.is_ascii_alphanumeric() || c == b'_')
        };
        let end = text[start..]
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .map_or(text.len(), |e| start + e);
        if before_ok {
            let name = &text[start..end];
            let family = ["_bucket", "_count", "_sum"]
                .iter()
                .find_map(|s| name.strip_suffix(s))
                .unwrap_or(name);
            out.insert(family.to_owned());
        }
        i = end;
    }
    out
}

/// The families the boards' queries and the alert rules' expressions use.
fn used_families() -> BTreeSet<String> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("dashboards");
    let mut used = BTreeSet::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if name.ends_with(".json") {
            let board: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
            let mut exprs = Vec::new();
            collect_exprs(&board, &mut exprs);
            for e in exprs {
                used.extend(families_in(&e));
            }
        }
    }
    let alerts = std::fs::read_to_string(dir.join("alerts.yml")).unwrap();
    for line in alerts.lines() {
        let line = line.trim_start();
        // Only expressions: names in annotations are prose.
        if !(line.starts_with("expr:") || line.starts_with("- expr:") || line.starts_with("(")) {
            continue;
        }
        used.extend(families_in(line));
    }
    // Multi-line expressions (`expr: |`) : every indented line under one.
    let mut in_expr = false;
    let mut indent = 0;
    for line in alerts.lines() {
        let trimmed = line.trim_start();
        let this_indent = line.len() - trimmed.len();
        if in_expr && (trimmed.is_empty() || this_indent > indent) {
            used.extend(families_in(trimmed));
            continue;
        }
        in_expr = false;
        if trimmed.starts_with("expr:") && trimmed.ends_with(['|', '>']) {
            in_expr = true;
            indent = this_indent;
        }
    }
    assert!(
        used.contains("ratewatch_decisions_total"),
        "the parse found the boards' queries: {used:?}"
    );
    used
}

fn collect_exprs(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, v) in m {
                match (k.as_str(), v) {
                    ("expr" | "query" | "definition", serde_json::Value::String(s)) => {
                        out.push(s.clone())
                    }
                    _ => collect_exprs(v, out),
                }
            }
        }
        serde_json::Value::Array(a) => a.iter().for_each(|v| collect_exprs(v, out)),
        _ => {}
    }
}

/// Families with at least one sample in the exposition.
fn exposed(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .flat_map(families_in)
        .collect()
}

async fn scrape(server: &Ratewatch) -> String {
    reqwest::get(format!("{}/metrics", server.url()))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

const TIERS: &str = r#"
[[tiers]]
name = "free"
match_prefix = "free_"
limits = [{ name = "burst", algorithm = "token_bucket", capacity = 10, refill_per_second = 1 }]

[[tiers]]
name = "anonymous"
limits = [{ name = "burst", algorithm = "token_bucket", capacity = 10, refill_per_second = 1 }]

[[routes]]
path = "/api/slow"
limits = [{ name = "inflight", algorithm = "concurrency", limit = 2 }]
"#;

fn missing(used: &BTreeSet<String>, text: &str) -> Vec<String> {
    let have = exposed(text);
    used.iter()
        .filter(|f| !have.contains(*f))
        .cloned()
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_family_a_board_or_rule_uses_exists_at_start_up_on_every_store() {
    let used = used_families();
    let dir = tempfile::tempdir().unwrap();

    let memory = dir.path().join("memory.toml");
    std::fs::write(&memory, format!("[store]\nkind = \"memory\"\n{TIERS}")).unwrap();
    let server = Ratewatch::start("serve", Some(&memory), &[]);
    let text = scrape(&server).await;
    let on_memory = missing(&used, &text);

    let redis = RedisServer::start();
    let on_redis_cfg = dir.path().join("redis.toml");
    std::fs::write(&on_redis_cfg, format!("[store]\nkind = \"redis\"\n{TIERS}")).unwrap();
    let server = Ratewatch::start(
        "serve",
        Some(&on_redis_cfg),
        &[("RATEWATCH_REDIS_URL", &redis.url())],
    );
    let text = scrape(&server).await;
    let on_redis = missing(&used, &text);

    assert!(
        on_memory.is_empty() && on_redis.is_empty(),
        "families used by dashboards/ but absent at start-up: memory store {on_memory:?}, \
         redis store {on_redis:?}"
    );
}

#[test]
fn boards_ask_for_their_datasource_at_import_and_runbooks_start_at_a_configurable_base() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("dashboards");
    for board in ["ratewatch-overview.json", "ratewatch-redis.json"] {
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join(board)).unwrap()).unwrap();
        let input = &json["__inputs"][0];
        assert_eq!(input["type"], "datasource", "{board}");
        assert_eq!(input["pluginId"], "prometheus", "{board}");
        let name = input["name"].as_str().unwrap();
        let var = json["templating"]["list"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == "datasource")
            .unwrap();
        assert_eq!(
            var["current"]["value"],
            format!("${{{name}}}"),
            "{board}: the import's choice is the variable's default"
        );
    }
    let alerts = std::fs::read_to_string(dir.join("alerts.yml")).unwrap();
    let urls: Vec<&str> = alerts
        .lines()
        .filter_map(|l| l.trim().strip_prefix("runbook_url:"))
        .collect();
    assert!(!urls.is_empty());
    for url in urls {
        assert!(
            url.trim()
                .starts_with("\"{{ $externalLabels.runbook_base }}/docs/operations.md#"),
            "runbook_url {url} is not built from the runbook_base external label"
        );
    }
}
