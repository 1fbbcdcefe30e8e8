//! `RATEWATCH_HASH_SECRET` keys identity hashes however the limiter was
//! built, as `serve` does: here from a policy file read by the library,
//! which never calls `Policy::with_env`. One test in its own process: it
//! sets the variable.

mod support;

use ratewatch::Limiter;
use ratewatch::identity::{Identity, IdentityKind};
use ratewatch::store::keys::{self, IdentityKey};
use support::RedisServer;

const SECRET: &str = "a fleet secret read from the environment";

#[tokio::test]
async fn a_limiter_built_from_a_policy_file_keys_its_hashes_with_the_environment_secret() {
    // SAFETY: the only test of this process, set before any thread of it
    // reads the environment.
    unsafe { std::env::set_var("RATEWATCH_HASH_SECRET", SECRET) };
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("ratewatch.toml");
    std::fs::write(
        &file,
        format!(
            r#"
[store]
kind = "redis"
url = "{}"
timeout_ms = 500

[[tiers]]
name = "free"
match_prefix = "free_"
limits = [{{ name = "burst", algorithm = "token_bucket", capacity = 3, refill_per_second = 0.01 }}]

[[tiers]]
name = "anonymous"
limits = [{{ name = "burst", algorithm = "token_bucket", capacity = 3, refill_per_second = 0.01 }}]
"#,
            redis.url()
        ),
    )
    .unwrap();
    let limiter = Limiter::builder_from_file(&file)
        .await
        .unwrap()
        .build()
        .await
        .unwrap();
    let raw = "free_from_the_environment";
    let caller = Identity::new(IdentityKind::ApiKey, raw);
    assert!(limiter.check(&caller, "free", None).await.allowed);

    let keys = redis.cli(&["--scan", "--pattern", "rw:*"]);
    let name = |hash: &str| {
        keys::identity_key(
            "rw",
            hash,
            None,
            &keys::limit_code(
                Some("free"),
                "burst",
                keys::algorithm_code(&ratewatch::algorithm::Algorithm::TokenBucket {
                    capacity: 3,
                    refill_per_second: 0.01,
                }),
            ),
        )
    };
    let keyed = name(&IdentityKey::new(SECRET.as_bytes()).hash_identity("key", raw));
    let unkeyed = name(&keys::hash_identity("key", raw));
    assert_ne!(keyed, unkeyed);
    assert!(keys.contains(&keyed), "keyed with the secret: {keys}");
    assert!(!keys.contains(&unkeyed), "never the unkeyed hash: {keys}");
}
