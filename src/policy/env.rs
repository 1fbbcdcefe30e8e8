//! Environment overrides, the same for an embedding app and the
//! `ratewatch` binary.
//!
//! - `RATEWATCH_CONFIG`: the policy file [`Policy::from_env`] loads.
//! - `RATEWATCH_REDIS_URL`: the Redis to decide against. One URL turns a
//!   `memory` or `redis` policy into `kind = "redis"` with that `url`; a
//!   comma-separated list replaces the `nodes` of a `redis-cluster` policy
//!   or the `sentinels` of a `redis-sentinel` one.
//! - `RATEWATCH_HASH_SECRET`: the secret identity hashes are keyed with
//!   (`[identity] hash_secret`), replacing the file's `hash_secret` or
//!   `hash_secret_file`.
//!
//! envoyproxy/ratelimit's own variables (`REDIS_URL`, `RUNTIME_ROOT`, ...)
//! are read by [`peer_env`](super::peer_env) when no policy file is given.
//!
//! ```
//! use ratewatch::policy::{Policy, StoreKind};
//! let policy = Policy::from_toml_str("[[tiers]]\nname = \"free\"\nunlimited = true\n[[tiers]]\nname = \"anonymous\"\nunlimited = true\n", None)
//!     .unwrap()
//!     .with_env_from(|name| (name == "RATEWATCH_REDIS_URL").then(|| "redis://10.0.0.5:6379".into()))
//!     .unwrap();
//! assert_eq!(policy.store.kind, StoreKind::Redis);
//! assert_eq!(policy.store.url.as_deref(), Some("redis://10.0.0.5:6379"));
//! ```

use super::{ConfigError, HashSecret, Policy, StoreKind};

/// The policy file [`Policy::from_env`] loads.
pub const CONFIG_VAR: &str = "RATEWATCH_CONFIG";
/// The Redis URL (or cluster nodes, comma-separated) overriding `[store]`.
pub const REDIS_URL_VAR: &str = "RATEWATCH_REDIS_URL";
/// The secret identity hashes are keyed with, overriding `[identity]
/// hash_secret` and `hash_secret_file`.
pub const HASH_SECRET_VAR: &str = "RATEWATCH_HASH_SECRET";

impl Policy {
    /// Loads the policy file named by `RATEWATCH_CONFIG` and applies
    /// [`Policy::with_env`]. An unset variable is an error naming it.
    pub fn from_env() -> Result<Policy, ConfigError> {
        let path = std::env::var_os(CONFIG_VAR).ok_or_else(|| ConfigError::Invalid {
            file: None,
            line: None,
            field: CONFIG_VAR.into(),
            message: "is not set; name the policy file it should load".into(),
        })?;
        Self::from_toml_file(path)?.with_env()
    }

    /// Applies the environment overrides (`RATEWATCH_REDIS_URL`,
    /// `RATEWATCH_HASH_SECRET`) and
    /// validates the result.
    pub fn with_env(self) -> Result<Policy, ConfigError> {
        self.with_env_from(|name| std::env::var(name).ok())
    }

    /// [`Policy::with_env`] reading variables through `var` (for tests, or
    /// for an app with its own configuration source).
    pub fn with_env_from(
        mut self,
        var: impl Fn(&str) -> Option<String>,
    ) -> Result<Policy, ConfigError> {
        if let Some(secret) = hash_secret_from(&var)? {
            self.identity.hash_secret = Some(secret);
            self.identity.hash_secret_file = None;
        }
        if let Some(value) = var(REDIS_URL_VAR) {
            let urls: Vec<String> = value
                .split(',')
                .map(str::trim)
                .filter(|u| !u.is_empty())
                .map(str::to_owned)
                .collect();
            if urls.is_empty() {
                return Err(env_error(REDIS_URL_VAR, "is set but names no URL"));
            }
            match self.store.kind {
                StoreKind::RedisCluster => self.store.nodes = urls,
                StoreKind::RedisSentinel => self.store.sentinels = urls,
                _ if urls.len() > 1 => {
                    return Err(env_error(
                        REDIS_URL_VAR,
                        "names several URLs, which only a `redis-cluster` store takes",
                    ));
                }
                _ => {
                    self.store.kind = StoreKind::Redis;
                    self.store.url = urls.into_iter().next();
                }
            }
            self.validate()
                .map_err(|e| env_error(REDIS_URL_VAR, &format!("gives an invalid policy: {e}")))?;
        }
        Ok(self)
    }
}

/// The secret `RATEWATCH_HASH_SECRET` gives through `var`, if it is set:
/// read by [`Policy::with_env`] (so `serve` and `check-config`) and by
/// every limiter choosing its identity key, whatever built its policy.
/// Set, it replaces the policy's `hash_secret` and `hash_secret_file`.
pub(crate) fn hash_secret_from(
    var: impl Fn(&str) -> Option<String>,
) -> Result<Option<HashSecret>, ConfigError> {
    let Some(value) = var(HASH_SECRET_VAR) else {
        return Ok(None);
    };
    HashSecret::new(&value).map(Some).ok_or_else(|| {
        env_error(
            HASH_SECRET_VAR,
            &format!(
                "must be at least {} bytes; generate one with `openssl rand -hex 32`",
                HashSecret::MIN_LEN
            ),
        )
    })
}

/// A configuration error naming the environment variable `var`.
pub(super) fn env_error(var: &str, message: &str) -> ConfigError {
    ConfigError::Invalid {
        file: None,
        line: None,
        field: var.into(),
        message: message.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base(store: &str) -> Policy {
        let text = format!(
            "{store}\n[[tiers]]\nname = \"free\"\nunlimited = true\n[[tiers]]\nname = \"anonymous\"\nunlimited = true\n"
        );
        Policy::from_toml_str(&text, None).unwrap()
    }

    fn env(value: &'static str) -> impl Fn(&str) -> Option<String> {
        move |name| (name == REDIS_URL_VAR).then(|| value.to_owned())
    }

    #[test]
    fn no_variable_changes_nothing() {
        let p = base("");
        assert_eq!(p.clone().with_env_from(|_| None).unwrap(), p);
    }

    #[test]
    fn a_cluster_policy_takes_every_node_of_the_list() {
        let p = base("[store]\nkind = \"redis-cluster\"\nnodes = [\"redis://a:1\"]")
            .with_env_from(env("redis://b:1, redis://c:1"))
            .unwrap();
        assert_eq!(p.store.kind, StoreKind::RedisCluster);
        assert_eq!(p.store.nodes, ["redis://b:1", "redis://c:1"]);
    }

    #[test]
    fn a_sentinel_policy_takes_the_list_as_its_sentinels() {
        let p = base(
            "[store]\nkind = \"redis-sentinel\"\nmaster_name = \"m\"\nsentinels = [\"redis://a:1\"]",
        )
        .with_env_from(env("redis://b:26379,redis://c:26379"))
        .unwrap();
        assert_eq!(p.store.kind, StoreKind::RedisSentinel);
        assert_eq!(p.store.sentinels, ["redis://b:26379", "redis://c:26379"]);
    }

    #[test]
    fn a_list_for_a_single_node_or_an_empty_value_is_an_error_naming_the_variable() {
        for value in ["redis://a:1,redis://b:1", " , "] {
            let err = base("").with_env_from(env(value)).unwrap_err();
            assert_eq!(err.field(), Some(REDIS_URL_VAR), "{err}");
        }
    }
}
