//! Incident drill: an invalid policy reloaded. On the real `ratewatch
//! serve`, scraped by a real Prometheus that loads `dashboards/alerts.yml`:
//! within two flush intervals of the reload the dashboard's JSON and its
//! rendered page (headless Chromium) show the failure, with its time and
//! error, while the old policy keeps deciding; and the expression of
//! `RatewatchPolicyReloadFailed`, evaluated by Prometheus without its `for`,
//! is above its threshold (and was not before).

mod support;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use support::{Prometheus, Ratewatch, alert_expr, dump_dom, eventually};

/// Two flush intervals of the policy below.
const FLUSH: Duration = Duration::from_millis(2000);

fn policy(capacity: &str) -> String {
    format!(
        r#"version = "2026-12-01.1"

[telemetry]
flush_interval_ms = {}

[[tiers]]
name = "free"
match_prefix = "free_"
limits = [{{ name = "burst", algorithm = "token_bucket", capacity = {capacity}, refill_per_second = 1 }}]

[[tiers]]
name = "anonymous"
limits = [{{ name = "burst", algorithm = "token_bucket", capacity = 100, refill_per_second = 10 }}]
"#,
        FLUSH.as_millis()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_policy_reloaded_shows_on_the_dashboard_and_fires_its_alert() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("ratewatch.toml");
    std::fs::write(&file, policy("50")).unwrap();
    let server = Ratewatch::start_logged("serve", Some(&file), &[], &["--reload-poll-ms", "0"]);
    let base = server.url();
    let rules = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("dashboards/alerts.yml");
    let prom = Prometheus::start(&[server.addr()], &[rules]);
    let expr = alert_expr("RatewatchPolicyReloadFailed").remove(0);

    // Healthy: Prometheus sees the instance, and the alert expression is
    // below its threshold (no series).
    eventually(
        Duration::from_secs(60),
        "Prometheus scrapes the healthy gauge",
        || async {
            (!prom
                .query("ratewatch_config_last_reload_successful == 1")
                .await
                .is_empty())
            .then_some(())
        },
    )
    .await;
    assert!(
        prom.query(&expr).await.is_empty(),
        "fires on a healthy instance"
    );

    // The incident: a typo in the file, then SIGHUP.
    std::fs::write(&file, policy("\"fifty\"")).unwrap();
    let reloaded = Instant::now();
    server.signal("HUP");
    let client = reqwest::Client::new();
    let live = eventually(
        Duration::from_secs(30),
        "the dashboard JSON shows the failure",
        || {
            let (client, base) = (client.clone(), base.clone());
            async move {
                let json =
                    support::get_json(&client, &format!("{base}/dashboard/api/policy")).await?;
                (json["live"]["last_reload"]["ok"] == false).then(|| json["live"].clone())
            }
        },
    )
    .await;
    let shown = reloaded.elapsed();
    assert!(shown <= 2 * FLUSH, "the JSON showed it after {shown:?}");
    // The page as served carries it too, within the same bound.
    let html = client
        .get(format!("{base}/dashboard"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let page_shown = reloaded.elapsed();
    assert!(html.contains("reload failed"), "{html}");
    assert!(
        page_shown <= 2 * FLUSH,
        "the page showed it after {page_shown:?}"
    );
    let error = live["last_reload"]["error"].as_str().unwrap();
    assert!(error.contains("tiers[0].limits[0].capacity"), "{error}");
    assert!(error.contains(&format!("{}:", file.display())), "{error}");
    assert_eq!(
        live["version"], "2026-12-01.1",
        "the old policy is in force"
    );

    // The page, rendered by a browser.
    let page_started = Instant::now();
    let (dom, _) = dump_dom(&format!("{base}/dashboard"), 3000);
    assert!(dom.contains("reload failed"), "{dom}");
    assert!(dom.contains("tiers[0].limits[0].capacity"), "{dom}");
    assert!(dom.contains("2026-12-01.1"), "{dom}");
    println!(
        "JSON showed the failure {shown:?} after SIGHUP, the served page {page_shown:?}; \
         Chromium rendered it in {:?}",
        page_started.elapsed()
    );

    // The old policy still decides.
    let res = client
        .get(format!("{base}/api/users"))
        .header("x-api-key", "free_drill")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert!(
        res.headers()["ratelimit-policy"]
            .to_str()
            .unwrap()
            .contains("q=50"),
        "{:?}",
        res.headers()
    );

    // The alert expression, as Prometheus evaluates it.
    let firing = eventually(
        Duration::from_secs(60),
        "the alert expression is above its threshold",
        || async {
            let r = prom.query(&expr).await;
            (!r.is_empty()).then_some(r)
        },
    )
    .await;
    let value: f64 = firing[0]["value"][1].as_str().unwrap().parse().unwrap();
    assert!(value > 0.0, "{firing:?}");
    assert_eq!(firing[0]["metric"]["instance"], server.addr().as_str());
    let errors = prom
        .query(r#"ratewatch_config_reloads_total{result="error"}"#)
        .await;
    assert_eq!(errors[0]["value"][1], "1", "{errors:?}");
}
