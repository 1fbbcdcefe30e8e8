//! The envoyproxy/ratelimit runtime layout: `[rls] envoy_configs` entries
//! that are files, directories or globs, followed by the real server like
//! the policy file (edits, new files, removed files, a ConfigMap's
//! `..data` swap; no SIGHUP), domains merged only when asked, and a
//! deleted policy file logged while the policy in force stays.

mod support;

use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ratewatch::policy::Policy;
use serde_json::Value;
use support::{Ratewatch, eventually};

const WITHIN: Duration = Duration::from_secs(30);

fn rules(domain: &str, key: &str, per_hour: u64) -> String {
    format!(
        "domain: {domain}\ndescriptors:\n  - key: {key}\n    rate_limit:\n      unit: hour\n      requests_per_unit: {per_hour}\n"
    )
}

/// Writes `text` to `path` as a deployment would: elsewhere, then
/// renamed over it.
fn replace(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp~");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// The `requests_per_unit` the server's rule for `domain`/`key` has now
/// (`None`: no rule, or no answer), asked over `POST /json`.
async fn limit_of(server: &Ratewatch, domain: &str, key: &str) -> Option<u64> {
    let body = serde_json::json!({
        "domain": domain,
        "descriptors": [{"entries": [{"key": key, "value": "v"}]}],
        "hitsAddend": 0,
    });
    let v: Value = reqwest::Client::new()
        .post(format!("{}/json", server.url()))
        .json(&body)
        .send()
        .await
        .ok()?
        .json()
        .await
        .ok()?;
    v["statuses"][0]["currentLimit"]["requestsPerUnit"].as_u64()
}

fn serve(policy: &Path) -> Ratewatch {
    Ratewatch::start_logged(
        "serve",
        Some(policy),
        &[],
        &["--reload-poll-ms", "50", "--reload-settle-ms", "100"],
    )
}

async fn until_limit(server: &Ratewatch, domain: &str, key: &str, want: Option<u64>) {
    let what = format!("{domain}/{key} limited at {want:?}");
    eventually(WITHIN, &what, || async {
        (limit_of(server, domain, key).await == want).then_some(())
    })
    .await;
}

fn policy_dir(toml: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ratewatch.toml");
    std::fs::write(&path, toml).unwrap();
    (dir, path)
}

#[tokio::test]
async fn a_rules_directory_is_followed_through_edits_additions_and_deletions() {
    let (dir, path) = policy_dir("[rls]\nenvoy_configs = [\"rules\"]\n");
    let rules_dir = dir.path().join("rules");
    std::fs::create_dir(&rules_dir).unwrap();
    std::fs::write(rules_dir.join("a.yaml"), rules("a", "k", 10)).unwrap();
    let server = serve(&path);
    until_limit(&server, "a", "k", Some(10)).await;

    replace(&rules_dir.join("a.yaml"), &rules("a", "k", 20));
    until_limit(&server, "a", "k", Some(20)).await;

    std::fs::write(rules_dir.join("b.yml"), rules("b", "k", 30)).unwrap();
    until_limit(&server, "b", "k", Some(30)).await;

    std::fs::remove_file(rules_dir.join("b.yml")).unwrap();
    until_limit(&server, "b", "k", None).await;
    assert_eq!(limit_of(&server, "a", "k").await, Some(20));
}

#[tokio::test]
async fn a_configmap_data_swap_of_a_yaml_file_is_followed_without_sighup() {
    // A ConfigMap volume: the visible name links through `..data`, which
    // links to a timestamped directory; an update writes a new directory
    // and renames a fresh `..data` link over the old one.
    let (dir, path) = policy_dir("[rls]\nenvoy_configs = [\"cfg/edge.yaml\"]\n");
    let cfg = dir.path().join("cfg");
    std::fs::create_dir_all(cfg.join("..2026_01")).unwrap();
    std::fs::write(cfg.join("..2026_01/edge.yaml"), rules("edge", "k", 5)).unwrap();
    symlink("..2026_01", cfg.join("..data")).unwrap();
    symlink("..data/edge.yaml", cfg.join("edge.yaml")).unwrap();
    let server = serve(&path);
    until_limit(&server, "edge", "k", Some(5)).await;

    std::fs::create_dir_all(cfg.join("..2026_02")).unwrap();
    std::fs::write(cfg.join("..2026_02/edge.yaml"), rules("edge", "k", 7)).unwrap();
    symlink("..2026_02", cfg.join("..data_tmp")).unwrap();
    std::fs::rename(cfg.join("..data_tmp"), cfg.join("..data")).unwrap();
    std::fs::remove_dir_all(cfg.join("..2026_01")).unwrap();
    until_limit(&server, "edge", "k", Some(7)).await;
}

#[tokio::test]
async fn a_glob_entry_picks_up_a_new_matching_file() {
    let (dir, path) = policy_dir("[rls]\nenvoy_configs = [\"*/rules.yaml\"]\n");
    std::fs::create_dir(dir.path().join("one")).unwrap();
    std::fs::write(dir.path().join("one/rules.yaml"), rules("one", "k", 3)).unwrap();
    let server = serve(&path);
    until_limit(&server, "one", "k", Some(3)).await;
    std::fs::create_dir(dir.path().join("two")).unwrap();
    std::fs::write(dir.path().join("two/rules.yaml"), rules("two", "k", 4)).unwrap();
    until_limit(&server, "two", "k", Some(4)).await;
}

#[tokio::test]
async fn a_deleted_policy_file_is_logged_and_the_policy_in_force_stays() {
    let (dir, path) = policy_dir("[rls]\nenvoy_configs = [\"edge.yaml\"]\n");
    std::fs::write(dir.path().join("edge.yaml"), rules("edge", "k", 9)).unwrap();
    let server = serve(&path);
    until_limit(&server, "edge", "k", Some(9)).await;
    std::fs::remove_file(&path).unwrap();
    eventually(WITHIN, "the deletion logged", || async {
        server.log().contains("policy file is gone").then_some(())
    })
    .await;
    assert_eq!(limit_of(&server, "edge", "k").await, Some(9));
    assert_eq!(
        server.log().matches("policy file is gone").count(),
        1,
        "logged once: {}",
        server.log()
    );
}

#[test]
fn two_files_of_one_domain_are_an_error_naming_both_unless_merged() {
    let dir = tempfile::tempdir().unwrap();
    let rules_dir = dir.path().join("rules");
    std::fs::create_dir(&rules_dir).unwrap();
    std::fs::write(rules_dir.join("1.yaml"), rules("edge", "a", 1)).unwrap();
    std::fs::write(rules_dir.join("2.yaml"), rules("edge", "b", 2)).unwrap();
    let path = dir.path().join("ratewatch.toml");
    std::fs::write(&path, "[rls]\nenvoy_configs = [\"rules\"]\n").unwrap();
    let err = Policy::from_toml_file(&path).unwrap_err().to_string();
    assert!(
        err.contains("1.yaml") && err.contains("2.yaml") && err.contains("\"edge\""),
        "{err}"
    );

    std::fs::write(
        &path,
        "[rls]\nenvoy_configs = [\"rules\"]\nmerge_domains = true\n",
    )
    .unwrap();
    let policy = Policy::from_toml_file(&path).unwrap();
    let edge = policy.rls.domains.domain("edge").unwrap();
    assert_eq!(edge.find(&[("a", "x")]).unwrap().limits.len(), 1);
    assert_eq!(edge.find(&[("b", "x")]).unwrap().limits.len(), 1);

    // Merged files may not both define one top-level descriptor.
    std::fs::write(rules_dir.join("3.yaml"), rules("edge", "a", 3)).unwrap();
    let err = Policy::from_toml_file(&path).unwrap_err().to_string();
    assert!(err.contains("3.yaml") && err.contains("`a`"), "{err}");
}
