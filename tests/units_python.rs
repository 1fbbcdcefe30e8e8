//! The same plan enforced for a client in another language: a Python
//! client with nothing but the standard library (`tests/python/
//! units_client.py`) reserves tokens over `POST /v1/decide` and settles
//! what it used over `POST /v1/settle`, against a real `ratewatch serve`
//! on a real Redis. The script only speaks HTTP; the expectations are here.

mod support;

use std::process::Command;

use serde_json::Value;
use support::{Ratewatch, RedisServer};

const POLICY: &str = r#"
[[tiers]]
name = "free"
match_prefix = "free_"
limits = [
  { name = "rpm", algorithm = "token_bucket", capacity = 10, refill_per_second = 0.00001 },
  { name = "tpm", algorithm = "token_bucket", capacity = 1000, refill_per_second = 0.00001, unit = "tokens" },
]

[[tiers]]
name = "anonymous"
limits = [{ name = "burst", algorithm = "token_bucket", capacity = 5, refill_per_second = 1 }]
"#;

fn remaining(decide: &Value, name: &str) -> u64 {
    decide["limits"]
        .as_array()
        .expect("limits")
        .iter()
        .find(|l| l["name"] == name)
        .unwrap_or_else(|| panic!("no limit {name} in {decide}"))["remaining"]
        .as_u64()
        .expect("remaining")
}

#[test]
fn a_python_client_reserves_and_settles_tokens_and_is_refused_once_the_plan_is_spent() {
    let redis = RedisServer::start();
    let policy = support::policy_file(&format!(
        "[store]\nkind = \"redis\"\nurl = \"{}\"\ntimeout_ms = 2000\n{POLICY}",
        redis.url()
    ));
    let server = Ratewatch::start("serve", Some(policy.path()), &[]);
    // 12 completions estimating 400 tokens and using 100.
    let out = Command::new("python3")
        .arg("tests/python/units_client.py")
        .args([&server.url(), "free_py", "12", "400", "100"])
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "the client failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let steps: Vec<Value> = serde_json::from_slice(&out.stdout).expect("JSON steps");
    assert_eq!(steps.len(), 12);
    // A completion passes while 400 tokens are left: each leaves 100 spent
    // once settled, so 7 pass (1,000 - 6 x 100 = 400 for the 7th).
    for (i, step) in steps.iter().enumerate().take(7) {
        assert_eq!(step["decide_status"], 200, "step {i}: {step}");
        let decide = &step["decide"];
        assert_eq!(decide["allowed"], true, "step {i}: {decide}");
        let tokens = decide["limits"]
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["name"] == "tpm")
            .unwrap();
        assert_eq!(tokens["unit"], "tokens");
        // The reservation of 400 on top of what the earlier ones used.
        assert_eq!(
            remaining(decide, "tpm"),
            1000 - 100 * i as u64 - 400,
            "step {i}"
        );
        assert_eq!(remaining(decide, "rpm"), 10 - 1 - i as u64, "step {i}");
        let (status, settled) = (&step["settle"][0], &step["settle"][1]);
        assert_eq!(status, 200, "step {i}: {settled}");
        assert_eq!(settled["settled"][0]["unit"], "tokens", "{settled}");
        assert_eq!(settled["settled"][0]["outcome"], "refunded", "{settled}");
        assert_eq!(settled["settled"][0]["units"], 300, "{settled}");
    }
    // Settling again answers the first result and gives nothing back twice.
    assert_eq!(steps[0]["settle_again"], steps[0]["settle"]);
    // Then the plan is spent: refused by the tokens limit, nothing reserved,
    // no request charged.
    for (i, step) in steps.iter().enumerate().skip(7) {
        assert_eq!(step["decide_status"], 429, "step {i}: {step}");
        assert_eq!(step["decide"]["allowed"], false);
        assert!(step["decide"]["reservation"].is_null(), "{step}");
        assert!(step.get("settle").is_none());
        assert_eq!(
            remaining(&step["decide"], "rpm"),
            3,
            "step {i}: refusals charge no request"
        );
    }
}
