//! The deployment's identity hash key, chosen once when a limiter starts.
//!
//! - The `RATEWATCH_HASH_SECRET` environment variable, else `[identity]
//!   hash_secret` or `hash_secret_file`: HMAC-SHA256 with it, however the
//!   policy was built (a file, [`Policy::with_env`](crate::policy::Policy::with_env) or code).
//!   Every instance sharing a store must be given the same secret.
//! - No secret, memory store: a random secret for this process. Counters
//!   live in the process, so nothing else needs to agree with it.
//! - No secret, a Redis store: the unkeyed SHA-256 of earlier versions,
//!   with a warning. A random secret per process would give every replica
//!   its own counters (its own quota) for the same caller; a refusal to
//!   start would break every deployment that upgrades.
//!
//! A secret file is read like the policy file (a regular file of at most
//! 4096 bytes, never waited on).
//!
//! The key is read once: a reload never changes it, since new hashes are
//! new counters (a one-time reset of every quota).

use super::IdentityKey;
use crate::policy::{ConfigError, IdentitySettings, read_secret_file};

/// The key identities are hashed with, from `settings` and the kind of
/// the store decisions go to (`Store::kind`: `memory`, `redis`, ...).
pub(crate) fn deployment_key(
    settings: &IdentitySettings,
    store: &str,
) -> Result<IdentityKey, ConfigError> {
    // The environment first, as `serve` reads it: a policy built in code
    // or read with `Limiter::builder_from_file` follows it too.
    if let Some(secret) = crate::policy::hash_secret_from(|name| std::env::var(name).ok())? {
        return Ok(IdentityKey::new(secret.expose()));
    }
    if let Some(secret) = &settings.hash_secret {
        return Ok(IdentityKey::new(secret.expose()));
    }
    if let Some(path) = &settings.hash_secret_file {
        let secret = read_secret_file(path, "identity.hash_secret_file")?;
        return Ok(IdentityKey::new(secret.expose()));
    }
    if store == "memory" {
        tracing::info!(
            "no [identity] hash_secret: identity hashes are keyed with a random secret for this \
             process (masked and hashed forms change at restart); set hash_secret_file or \
             RATEWATCH_HASH_SECRET to keep them"
        );
        return Ok(IdentityKey::random());
    }
    tracing::warn!(
        store,
        "no [identity] hash_secret: identity hashes in Redis key names and on the dashboard are \
         unkeyed SHA-256, so a guessed key can be checked offline against them. Set \
         hash_secret_file or RATEWATCH_HASH_SECRET, the same on every instance (changing it \
         resets every counter once)"
    );
    Ok(IdentityKey::unkeyed())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::HashSecret;

    fn settings() -> IdentitySettings {
        IdentitySettings::default()
    }

    #[test]
    fn a_configured_secret_keys_the_hashes_alike_on_every_store() {
        let mut s = settings();
        s.hash_secret = HashSecret::new("a shared secret of the fleet");
        let memory = deployment_key(&s, "memory").unwrap();
        let redis = deployment_key(&s, "redis").unwrap();
        assert!(memory.is_keyed() && memory.same_as(&redis));
    }

    #[test]
    fn without_a_secret_memory_is_random_and_redis_stays_unkeyed() {
        let a = deployment_key(&settings(), "memory").unwrap();
        let b = deployment_key(&settings(), "memory").unwrap();
        assert!(a.is_keyed() && !a.same_as(&b));
        let redis = deployment_key(&settings(), "redis").unwrap();
        assert!(!redis.is_keyed());
    }

    #[test]
    fn a_secret_file_is_read_trimmed_and_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("secret");
        std::fs::write(&file, "a shared secret of the fleet\n").unwrap();
        let mut s = settings();
        s.hash_secret_file = Some(file.clone());
        let from_file = deployment_key(&s, "redis").unwrap();
        let inline = IdentityKey::new(b"a shared secret of the fleet");
        assert!(from_file.same_as(&inline));
        std::fs::write(&file, "short\n").unwrap();
        let err = deployment_key(&s, "redis").unwrap_err().to_string();
        assert!(
            err.contains("identity.hash_secret_file") && err.contains("16 bytes"),
            "{err}"
        );
        std::fs::write(&file, "x".repeat(10_000)).unwrap();
        assert!(deployment_key(&s, "redis").is_err());
        s.hash_secret_file = Some(dir.path().to_owned());
        let err = deployment_key(&s, "redis").unwrap_err().to_string();
        assert!(err.contains("not a regular file"), "{err}");
        s.hash_secret_file = Some(dir.path().join("missing"));
        assert!(deployment_key(&s, "redis").is_err());
    }
}
