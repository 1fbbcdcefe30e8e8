//! Several limiters in one process, each named (`[telemetry]
//! limiter_name`): each keeps its own reload status in `/metrics`, under a
//! `limiter` label, and its dashboard says which one it is.

use std::net::SocketAddr;
use std::path::Path;

use axum::body::Body;
use axum::extract::connect_info::MockConnectInfo;
use http::Request;
use ratewatch::Limiter;
use ratewatch::telemetry::metrics;
use tower::ServiceExt;

fn policy(name: &str) -> String {
    format!(
        r#"
[telemetry]
limiter_name = "{name}"

[[tiers]]
name = "free"
limits = [{{ name = "burst", algorithm = "token_bucket", capacity = 10, refill_per_second = 1 }}]

[[tiers]]
name = "anonymous"
limits = [{{ name = "burst", algorithm = "token_bucket", capacity = 5, refill_per_second = 1 }}]
"#
    )
}

async fn limiter(file: &Path) -> Limiter {
    Limiter::builder_from_file(file)
        .await
        .unwrap()
        .with_follow(ratewatch::Follow::off())
        .build()
        .await
        .unwrap()
}

/// The value of the one line of `family` carrying every label of `labels`.
fn value(scrape: &str, family: &str, labels: &[&str]) -> Vec<String> {
    scrape
        .lines()
        .filter(|l| {
            l.starts_with(&format!("{family}{{"))
                || *l == family
                || l.starts_with(&format!("{family} "))
        })
        .filter(|l| labels.iter().all(|want| l.contains(want)))
        .map(|l| l.rsplit(' ').next().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn two_named_limiters_each_keep_their_own_reload_status_and_dashboard_title() {
    let handle = metrics::install_prometheus().expect("install the recorder");
    let dir = tempfile::tempdir().unwrap();
    let (edge_file, internal_file) = (
        dir.path().join("edge.toml"),
        dir.path().join("internal.toml"),
    );
    std::fs::write(&edge_file, policy("edge")).unwrap();
    std::fs::write(&internal_file, policy("internal")).unwrap();
    let edge = limiter(&edge_file).await;
    let internal = limiter(&internal_file).await;

    // The edge's reload applies; the internal one's is refused.
    std::fs::write(
        &edge_file,
        policy("edge").replace("capacity = 10", "capacity = 20"),
    )
    .unwrap();
    assert!(edge.reload().unwrap().changed);
    std::fs::write(
        &internal_file,
        policy("internal").replace("capacity = 10", "capacity = -1"),
    )
    .unwrap();
    assert!(internal.reload().is_err());

    let scrape = metrics::render(&handle);
    let gauge = "ratewatch_config_last_reload_successful";
    assert_eq!(
        value(&scrape, gauge, &[r#"limiter="edge""#]),
        vec!["1"],
        "{scrape}"
    );
    assert_eq!(
        value(&scrape, gauge, &[r#"limiter="internal""#]),
        vec!["0"],
        "{scrape}"
    );
    let reloads = "ratewatch_config_reloads_total";
    for (name, ok, error) in [("edge", "1", "0"), ("internal", "0", "1")] {
        let named = format!(r#"limiter="{name}""#);
        assert_eq!(
            value(&scrape, reloads, &[&named, r#"result="ok""#]),
            vec![ok],
            "{scrape}"
        );
        assert_eq!(
            value(&scrape, reloads, &[&named, r#"result="error""#]),
            vec![error],
            "{scrape}"
        );
    }
    // Each has its policy info; nothing of theirs is left unnamed.
    for name in ["edge", "internal"] {
        let named = format!(r#"limiter="{name}""#);
        assert!(
            value(&scrape, "ratewatch_policy_info", &[&named]).contains(&"1".to_owned()),
            "{scrape}"
        );
    }
    assert!(
        value(&scrape, gauge, &[]).len() == 2,
        "one reload gauge per limiter, no unnamed one: {scrape}"
    );

    // Each dashboard names its limiter.
    for (limiter, name) in [(&edge, "edge"), (&internal, "internal")] {
        let app = axum::Router::new().nest("/dashboard", limiter.dashboard());
        let peer: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let res = app
            .layer(MockConnectInfo(peer))
            .oneshot(Request::get("/dashboard").body(Body::empty()).unwrap())
            .await
            .unwrap();
        assert_eq!(res.status(), 200);
        let html = String::from_utf8(
            axum::body::to_bytes(res.into_body(), 1 << 22)
                .await
                .unwrap()
                .to_vec(),
        )
        .unwrap();
        assert!(
            html.contains(&format!("<title>ratewatch {name} · ")),
            "{name}"
        );
        assert!(
            html.contains(&format!(r#"<span class="limiter-name">{name}</span>"#)),
            "{name}"
        );
    }
}

#[test]
fn a_limiter_name_that_could_not_be_a_label_value_is_refused_with_its_field() {
    let dir = tempfile::tempdir().unwrap();
    for bad in ["", "edge one", "a\\\"b", &"x".repeat(65)] {
        let file = dir.path().join("bad.toml");
        std::fs::write(&file, policy(bad)).unwrap();
        let err = ratewatch::policy::Policy::from_toml_file(&file).expect_err(bad);
        assert!(err.to_string().contains("limiter_name"), "{bad:?}: {err}");
    }
    let built = ratewatch::policy::Policy::builder()
        .limiter_name("no spaces please")
        .build()
        .expect_err("the builder checks it too");
    assert!(
        built.to_string().contains("telemetry.limiter_name"),
        "{built}"
    );
}

/// A memory-store limiter, named or not, whose `free` tier admits `quota`
/// requests an hour and holds in-flight slots.
async fn counting_limiter(dir: &Path, name: Option<&str>, quota: u64) -> Limiter {
    let telemetry = name.map_or(String::new(), |n| {
        format!("[telemetry]\nlimiter_name = \"{n}\"\n")
    });
    let file = dir.join(format!("{}.toml", name.unwrap_or("unnamed")));
    std::fs::write(
        &file,
        format!(
            r#"{telemetry}
[[tiers]]
name = "free"
limits = [
  {{ name = "hourly", algorithm = "fixed_window", limit = {quota}, window = "1h" }},
  {{ name = "inflight", algorithm = "concurrency", limit = 1000 }},
]

[[tiers]]
name = "anonymous"
limits = [{{ name = "burst", algorithm = "token_bucket", capacity = 5, refill_per_second = 1 }}]
"#
        ),
    )
    .unwrap();
    limiter(&file).await
}

#[tokio::test]
async fn each_named_limiter_counts_its_decisions_units_and_slots_under_its_name() {
    let handle = metrics::install_prometheus().expect("install the recorder");
    let dir = tempfile::tempdir().unwrap();
    let caller = ratewatch::identity::Identity::new(
        ratewatch::identity::IdentityKind::ApiKey,
        "free_aaaaaaaaaaaa",
    );
    // (name, quota, requests): each refuses what is over its quota.
    let runs = [(Some("alpha"), 3, 5), (Some("beta"), 4, 4), (None, 2, 7)];
    // The decisions hold their in-flight slots until the scrape.
    let (mut limiters, mut held) = (Vec::new(), Vec::new());
    for (name, quota, requests) in runs {
        let limiter = counting_limiter(dir.path(), name, quota).await;
        for _ in 0..requests {
            held.push(limiter.check_cost(&caller, "free", None, 1).await);
        }
        limiters.push(limiter);
    }

    let scrape = metrics::render(&handle);
    let decisions = "ratewatch_decisions_total";
    for (name, quota, requests) in runs {
        let allowed = quota.min(requests);
        let blocked = requests - allowed;
        let Some(name) = name else { continue };
        let named = format!(r#"limiter="{name}""#);
        for (outcome, n) in [("allowed", allowed), ("blocked", blocked)] {
            // Every series exists at zero from start-up, under its name.
            assert_eq!(
                value(
                    &scrape,
                    decisions,
                    &[&named, r#"tier="free""#, &format!(r#"outcome="{outcome}""#)]
                ),
                vec![n.to_string()],
                "{name} {outcome}: {scrape}"
            );
        }
        assert_eq!(
            value(
                &scrape,
                "ratewatch_units_charged_total",
                &[&named, r#"tier="free""#, r#"unit="requests""#]
            ),
            vec![allowed.to_string()],
            "{name}: {scrape}"
        );
        assert_eq!(
            value(
                &scrape,
                "ratewatch_inflight_slots",
                &[&named, r#"tier="free""#, r#"limit="inflight""#]
            ),
            vec![allowed.to_string()],
            "{name}: {scrape}"
        );
        assert_eq!(
            value(
                &scrape,
                "ratewatch_limit_exceeded_total",
                &[&named, r#"tier="free""#, r#"limit="hourly""#]
            ),
            vec![blocked.to_string()],
            "{name}: {scrape}"
        );
    }
    // The unnamed limiter's series carry no `limiter` label at all, and
    // hold its counts alone.
    let unnamed = |family: &str, labels: &[&str]| -> Vec<String> {
        scrape
            .lines()
            .filter(|l| l.starts_with(&format!("{family}{{")) && !l.contains("limiter="))
            .filter(|l| labels.iter().all(|want| l.contains(want)))
            .map(|l| l.rsplit(' ').next().unwrap().to_owned())
            .collect()
    };
    assert_eq!(
        unnamed(decisions, &[r#"tier="free""#, r#"outcome="allowed""#]),
        vec!["2"],
        "{scrape}"
    );
    assert_eq!(
        unnamed(decisions, &[r#"tier="free""#, r#"outcome="blocked""#]),
        vec!["5"],
        "{scrape}"
    );
    assert_eq!(
        unnamed(
            "ratewatch_units_charged_total",
            &[r#"tier="free""#, r#"unit="requests""#]
        ),
        vec!["2"],
        "{scrape}"
    );
    assert_eq!(
        unnamed(
            "ratewatch_inflight_slots",
            &[r#"tier="free""#, r#"limit="inflight""#]
        ),
        vec!["2"],
        "{scrape}"
    );
    assert!(
        !scrape.contains(r#"limiter="""#),
        "no empty label: {scrape}"
    );
    drop((held, limiters));
}
