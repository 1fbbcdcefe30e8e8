//! envoyproxy/ratelimit's environment: a Deployment of that service,
//! with its variables kept and the binary swapped for `ratewatch serve`,
//! starts on the same rule files, the same Redis and the same ports.
//!
//! The environment is read when no policy file is given and any of the
//! variables in [`TRIGGERS`] is set. It describes a policy (its TOML is
//! [`PeerEnv::policy_toml`]): the store from `REDIS_*`, and `[rls]
//! envoy_configs` naming the directory
//! `RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY` (every
//! `*.yaml` / `*.yml` in it, followed like a policy file). A variable set
//! to a value ratewatch cannot honour (a behaviour it does not have) is
//! an error naming the variable and why; so is a rule directory with no
//! rule file. Values are read as the peer reads them (Go's booleans,
//! case-insensitive `REDIS_TYPE`).
//!
//! ```
//! use ratewatch::policy::peer_env::PeerEnv;
//! let dir = tempfile::tempdir().unwrap();
//! std::fs::create_dir_all(dir.path().join("ratelimit/config")).unwrap();
//! std::fs::write(dir.path().join("ratelimit/config/edge.yaml"), "domain: edge\n").unwrap();
//! let root = dir.path().display().to_string();
//! let env = |name: &str| match name {
//!     "RUNTIME_ROOT" => Some(root.clone()),
//!     "RUNTIME_SUBDIRECTORY" => Some("ratelimit".into()),
//!     "REDIS_SOCKET_TYPE" => Some("tcp".into()),
//!     "REDIS_URL" => Some("10.0.0.5:6379".into()),
//!     "USE_STATSD" => Some("false".into()),
//!     _ => None,
//! };
//! let peer = PeerEnv::from_vars(env).unwrap().expect("the peer's environment is set");
//! assert_eq!(peer.grpc_listen.port(), 8081);
//! let policy = peer.policy().unwrap();
//! assert_eq!(policy.store.url.as_deref(), Some("redis://10.0.0.5:6379"));
//! assert!(policy.rls.domains.domain("edge").is_some());
//! ```

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

use super::env::env_error as error;
use super::{ConfigError, Policy};

/// Variables whose presence says the environment is envoyproxy/ratelimit's
/// (generic names such as `PORT` or `LOG_LEVEL` alone do not).
pub const TRIGGERS: [&str; 13] = [
    "RUNTIME_ROOT",
    "RUNTIME_SUBDIRECTORY",
    "RUNTIME_APPDIRECTORY",
    "RUNTIME_WATCH_ROOT",
    "RUNTIME_IGNOREDOTFILES",
    "REDIS_URL",
    "REDIS_TYPE",
    "REDIS_SOCKET_TYPE",
    "GRPC_PORT",
    "USE_STATSD",
    "BACKEND_TYPE",
    "CONFIG_TYPE",
    "MERGE_DOMAIN_CONFIG",
];

/// What envoyproxy/ratelimit's environment asks for. Its `Debug` output
/// leaves out the policy's text, which may hold `REDIS_AUTH`.
#[derive(Clone, PartialEq)]
#[non_exhaustive]
pub struct PeerEnv {
    /// The policy it describes, as TOML (read with [`PeerEnv::policy`]).
    pub policy_toml: String,
    /// Where the rule files are: `RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY`.
    pub rules_dir: PathBuf,
    /// `HOST:PORT` (default `0.0.0.0:8080`): the HTTP listener.
    pub listen: SocketAddr,
    /// `GRPC_HOST:GRPC_PORT` (default `0.0.0.0:8081`): the gRPC listener.
    pub grpc_listen: SocketAddr,
    /// A log filter from `LOG_LEVEL`, if set.
    pub log_filter: Option<String>,
    /// `LOG_FORMAT=json`.
    pub json_logs: bool,
}

impl std::fmt::Debug for PeerEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerEnv")
            .field("policy_toml", &"<hidden>")
            .field("rules_dir", &self.rules_dir)
            .field("listen", &self.listen)
            .field("grpc_listen", &self.grpc_listen)
            .field("log_filter", &self.log_filter)
            .field("json_logs", &self.json_logs)
            .finish()
    }
}

/// How the policy of the environment is named in errors.
pub const SOURCE_NAME: &str = "<envoyproxy/ratelimit environment>";

impl PeerEnv {
    /// [`PeerEnv::from_vars`] on the process environment.
    pub fn from_env() -> Result<Option<PeerEnv>, ConfigError> {
        Self::from_vars(|name| std::env::var(name).ok())
    }

    /// The variables of [`TRIGGERS`] that are set.
    pub fn triggers_set(var: impl Fn(&str) -> Option<String>) -> Vec<&'static str> {
        TRIGGERS
            .iter()
            .copied()
            .filter(|name| var(name).is_some())
            .collect()
    }

    /// The environment's settings, `None` when none of [`TRIGGERS`] is
    /// set; an error names the first variable that cannot be honoured.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Option<PeerEnv>, ConfigError> {
        if Self::triggers_set(&var).is_empty() {
            return Ok(None);
        }
        let env = Env(&var);
        env.refuse_unsupported()?;
        let rules_dir = env.rules_dir()?;
        let mut toml = String::new();
        env.store(&mut toml)?;
        toml.push_str("\n[rls]\n");
        toml.push_str(&format!(
            "envoy_configs = [{}]\n",
            quote(&rules_dir.display().to_string())
        ));
        if env.flag("MERGE_DOMAIN_CONFIG", false)? {
            toml.push_str("merge_domains = true\n");
        }
        if env.flag("RESPONSE_DYNAMIC_METADATA", false)? {
            toml.push_str("response_dynamic_metadata = true\n");
        }
        // The peer's healthcheck fails while it has no Redis connection;
        // ratewatch's while every store shard's breaker is open. (Last: it
        // opens the `[server]` table.)
        if env.flag("REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", false)? {
            toml.push_str("\n[server]\nhealthcheck_store = true\n");
        }
        let listen = env.addr("HOST", "PORT", 8080)?;
        let grpc_listen = env.addr("GRPC_HOST", "GRPC_PORT", 8081)?;
        if let Some(r) = env.get("NEAR_LIMIT_RATIO") {
            // Only the peer's near-limit statistic reads it.
            if !r.parse::<f32>().is_ok_and(|r| r > 0.0 && r <= 1.0) {
                return Err(error(
                    "NEAR_LIMIT_RATIO",
                    &format!("must be a number above 0 and at most 1, got \"{r}\""),
                ));
            }
        }
        // Both settings of the peer count as it does for every hit a
        // window admits; ratewatch never counts a refused hit (the
        // peer's `true`), which differs only for a hit larger than what is
        // left of a window.
        env.flag("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", false)?;
        let log_filter = match env.get("LOG_LEVEL") {
            None => None,
            Some(level) => Some(log_filter(&level)?),
        };
        let json_logs = match env.get("LOG_FORMAT").as_deref() {
            None | Some("text") => false,
            Some("json") => true,
            Some(other) => {
                return Err(error(
                    "LOG_FORMAT",
                    &format!("must be \"text\" or \"json\", got \"{other}\""),
                ));
            }
        };
        Ok(Some(PeerEnv {
            policy_toml: toml,
            rules_dir,
            listen,
            grpc_listen,
            log_filter,
            json_logs,
        }))
    }

    /// The policy: [`PeerEnv::policy_toml`] loaded, its rule files read.
    pub fn policy(&self) -> Result<Policy, ConfigError> {
        Policy::from_toml_str(&self.policy_toml, Some(SOURCE_NAME))
    }
}

struct Env<'a, F: Fn(&str) -> Option<String>>(&'a F);

impl<F: Fn(&str) -> Option<String>> Env<'_, F> {
    /// A variable set to something other than blanks.
    fn get(&self, name: &str) -> Option<String> {
        (self.0)(name).filter(|v| !v.trim().is_empty())
    }

    /// A boolean as Go's `strconv.ParseBool` reads it.
    fn flag(&self, name: &str, default: bool) -> Result<bool, ConfigError> {
        match self.get(name).as_deref().map(str::trim) {
            None => Ok(default),
            Some("1" | "t" | "T" | "true" | "TRUE" | "True") => Ok(true),
            Some("0" | "f" | "F" | "false" | "FALSE" | "False") => Ok(false),
            Some(other) => Err(error(
                name,
                &format!("must be true or false, got \"{other}\""),
            )),
        }
    }

    /// Settings whose value asks for a behaviour ratewatch does not have.
    fn refuse_unsupported(&self) -> Result<(), ConfigError> {
        const FLAGS: [(&str, &str); 11] = [
            (
                "USE_STATSD",
                "ratewatch exports Prometheus metrics on GET /metrics of PORT, not statsd; set USE_STATSD=false",
            ),
            (
                "USE_DOG_STATSD",
                "ratewatch exports Prometheus metrics on GET /metrics of PORT, not DogStatsD",
            ),
            (
                "REDIS_PERSECOND",
                "ratewatch keeps every limit in one store; a second Redis for per-second limits is not supported",
            ),
            (
                "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION",
                "ratewatch always verifies the Redis server's name",
            ),
            (
                "GRPC_SERVER_USE_TLS",
                "ratewatch's own TLS covers both ports: set RATEWATCH_TLS_CERT and RATEWATCH_TLS_KEY (and RATEWATCH_TLS_CLIENT_CA for client certificates) instead",
            ),
            (
                "SHADOW_MODE",
                "a global shadow mode is not supported; set shadow_mode on the descriptors instead",
            ),
            ("QUOTA_MODE", "quota mode is not supported"),
            (
                "FORCE_START_WITHOUT_INITIAL_CONFIG",
                "ratewatch refuses to start without rule files",
            ),
            (
                "TRACING_ENABLED",
                "ratewatch exports no OpenTelemetry traces",
            ),
            (
                "LIMIT_RESPONSE_HEADERS_ENABLED",
                "ratewatch does not add the peer's RateLimit-Limit/-Remaining/-Reset headers",
            ),
            ("MEMCACHE_TLS", "ratewatch has no memcached store"),
        ];
        for (name, why) in FLAGS {
            if self.flag(name, false)? {
                return Err(error(
                    name,
                    &format!("is true, which ratewatch cannot honour: {why}"),
                ));
            }
        }
        const SET: [(&str, &str); 4] = [
            (
                "GRPC_UDS",
                "ratewatch serves gRPC on TCP only (GRPC_HOST:GRPC_PORT)",
            ),
            (
                "REDIS_SENTINEL_AUTH",
                "ratewatch authenticates to sentinels as to Redis (REDIS_AUTH); a separate sentinel password is not supported",
            ),
            ("MEMCACHE_HOST_PORT", "ratewatch has no memcached store"),
            ("MEMCACHE_SRV", "ratewatch has no memcached store"),
        ];
        for (name, why) in SET {
            if self.get(name).is_some() {
                return Err(error(
                    name,
                    &format!("is set, which ratewatch cannot honour: {why}"),
                ));
            }
        }
        match self
            .get("BACKEND_TYPE")
            .map(|b| b.to_ascii_lowercase())
            .as_deref()
        {
            None | Some("redis") => {}
            Some(other) => {
                return Err(error(
                    "BACKEND_TYPE",
                    &format!(
                        "is \"{other}\"; ratewatch's store for the peer's environment is Redis (\"redis\")"
                    ),
                ));
            }
        }
        match self
            .get("CONFIG_TYPE")
            .map(|c| c.to_ascii_uppercase())
            .as_deref()
        {
            None | Some("FILE") => {}
            Some(other) => {
                return Err(error(
                    "CONFIG_TYPE",
                    &format!(
                        "is \"{other}\"; ratewatch reads rule files (\"FILE\"), not an xDS server"
                    ),
                ));
            }
        }
        Ok(())
    }

    /// `RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY`, which must
    /// hold at least one rule file.
    fn rules_dir(&self) -> Result<PathBuf, ConfigError> {
        let root = self
            .get("RUNTIME_ROOT")
            .unwrap_or_else(|| "/srv/runtime_data/current".into());
        let sub = self.get("RUNTIME_SUBDIRECTORY").unwrap_or_default();
        let app = self
            .get("RUNTIME_APPDIRECTORY")
            .unwrap_or_else(|| "config".into());
        // Either way of reloading (a swap of the root symlink, or edits in
        // the directory) is followed: the files are looked at again on
        // every poll.
        let watch_root = self.flag("RUNTIME_WATCH_ROOT", true)?;
        // Hidden files are always skipped (a ConfigMap's `..data`
        // directories would otherwise load every file twice).
        self.flag("RUNTIME_IGNOREDOTFILES", false)?;
        if watch_root && sub.is_empty() {
            return Err(error(
                "RUNTIME_SUBDIRECTORY",
                "is not set, so envoyproxy/ratelimit would load no rule file at all (with \
                 RUNTIME_WATCH_ROOT true, its default); set it: the rule files are read from \
                 RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY",
            ));
        }
        let dir = PathBuf::from(root).join(sub).join(app);
        super::expand_rule_entry(&dir).map_err(|why| {
            error(
                "RUNTIME_ROOT",
                &format!(
                    "with RUNTIME_SUBDIRECTORY and RUNTIME_APPDIRECTORY names {}, which {why}; \
                     a start needs rule files",
                    dir.display()
                ),
            )
        })?;
        if !std::fs::metadata(&dir).is_ok_and(|m| m.is_dir()) {
            return Err(error(
                "RUNTIME_ROOT",
                &format!(
                    "with RUNTIME_SUBDIRECTORY and RUNTIME_APPDIRECTORY names {}, which is not a \
                     directory; a start needs rule files",
                    dir.display()
                ),
            ));
        }
        Ok(dir)
    }

    /// `[store]` from `REDIS_*`.
    fn store(&self, toml: &mut String) -> Result<(), ConfigError> {
        let Some(url) = self.get("REDIS_URL") else {
            return Err(error(
                "REDIS_URL",
                "is not set; envoyproxy/ratelimit would use the unix socket \
                 /var/run/nutcracker/ratelimit.sock, and ratewatch reaches Redis over TCP: \
                 set REDIS_SOCKET_TYPE=tcp and REDIS_URL=host:port",
            ));
        };
        let url = url.trim().to_owned();
        let socket = self
            .get("REDIS_SOCKET_TYPE")
            .map(|s| s.to_ascii_lowercase());
        let is_url = url.starts_with("redis://") || url.starts_with("rediss://");
        if socket.as_deref() == Some("unix") && !is_url || url.starts_with('/') {
            return Err(error(
                "REDIS_SOCKET_TYPE",
                "is unix (its default), which ratewatch cannot honour: it reaches Redis over \
                 TCP; set REDIS_SOCKET_TYPE=tcp and REDIS_URL=host:port",
            ));
        }
        if let Some(other) = socket.as_deref().filter(|s| !["tcp", "unix"].contains(s)) {
            return Err(error(
                "REDIS_SOCKET_TYPE",
                &format!("must be \"tcp\" or \"unix\", got \"{other}\""),
            ));
        }
        let tls = self.flag("REDIS_TLS", false)?;
        // "user:password", or a password alone, as the peer splits it.
        let auth = self.get("REDIS_AUTH").map(|a| match a.split_once(':') {
            Some((user, password)) => (Some(user.to_owned()), password.to_owned()),
            None => (None, a),
        });
        let kind = self
            .get("REDIS_TYPE")
            .unwrap_or_else(|| "single".into())
            .to_ascii_lowercase();
        // A single node or a cluster takes credentials in its URLs; a
        // sentinel deployment's master takes `username` / `password`.
        let userinfo = match (&auth, kind.as_str()) {
            (Some((user, password)), "single" | "cluster") => format!(
                "{}:{}@",
                user.as_deref().map(percent_encode).unwrap_or_default(),
                percent_encode(password)
            ),
            _ => String::new(),
        };
        let to_url = |addr: &str| -> Result<String, ConfigError> {
            let addr = addr.trim();
            let (scheme, rest) = match addr.split_once("://") {
                Some(("redis", rest)) if tls => ("rediss", rest),
                Some((scheme @ ("redis" | "rediss"), rest)) => (scheme, rest),
                Some((other, _)) => {
                    return Err(error(
                        "REDIS_URL",
                        &format!(
                            "has the scheme \"{other}\"; write host:port or redis://host:port"
                        ),
                    ));
                }
                None if tls => ("rediss", addr),
                None => ("redis", addr),
            };
            if !userinfo.is_empty() && rest.contains('@') {
                return Err(error(
                    "REDIS_AUTH",
                    "is set and REDIS_URL holds credentials too; give them in one place",
                ));
            }
            Ok(format!("{scheme}://{userinfo}{rest}"))
        };
        let list = |s: &str| -> Vec<String> {
            s.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect()
        };
        toml.push_str("[store]\n");
        match kind.as_str() {
            "single" => {
                toml.push_str("kind = \"redis\"\n");
                toml.push_str(&format!("url = {}\n", quote(&to_url(&url)?)));
            }
            "cluster" => {
                let nodes = list(&url)
                    .iter()
                    .map(|n| to_url(n).map(|u| quote(&u)))
                    .collect::<Result<Vec<_>, _>>()?;
                toml.push_str("kind = \"redis-cluster\"\n");
                toml.push_str(&format!("nodes = [{}]\n", nodes.join(", ")));
            }
            "sentinel" => {
                let parts = list(&url);
                let Some((master, sentinels)) = parts.split_first().filter(|(_, s)| !s.is_empty())
                else {
                    return Err(error(
                        "REDIS_URL",
                        "must be <master name>,<sentinel host:port>,... with REDIS_TYPE=sentinel",
                    ));
                };
                let sentinels = sentinels
                    .iter()
                    .map(|s| to_url(s).map(|u| quote(&u)))
                    .collect::<Result<Vec<_>, _>>()?;
                toml.push_str("kind = \"redis-sentinel\"\n");
                toml.push_str(&format!("master_name = {}\n", quote(master)));
                toml.push_str(&format!("sentinels = [{}]\n", sentinels.join(", ")));
            }
            other => {
                return Err(error(
                    "REDIS_TYPE",
                    &format!("must be \"single\", \"cluster\" or \"sentinel\", got \"{other}\""),
                ));
            }
        }
        if let (Some((user, password)), "sentinel") = (&auth, kind.as_str()) {
            if let Some(user) = user {
                toml.push_str(&format!("username = {}\n", quote(user)));
            }
            toml.push_str(&format!("password = {}\n", quote(password)));
        }
        for (var, key) in [
            ("REDIS_TLS_CACERT", "tls_ca_file"),
            ("REDIS_TLS_CLIENT_CERT", "tls_cert_file"),
            ("REDIS_TLS_CLIENT_KEY", "tls_key_file"),
        ] {
            if let Some(path) = self.get(var) {
                if !tls {
                    return Err(error(
                        var,
                        "is set but REDIS_TLS is not true; set REDIS_TLS=true to reach Redis over TLS",
                    ));
                }
                toml.push_str(&format!("{key} = {}\n", quote(&path)));
            }
        }
        if let Some(prefix) = self.get("CACHE_KEY_PREFIX") {
            toml.push_str(&format!("key_prefix = {}\n", quote(&prefix)));
        }
        Ok(())
    }

    /// `host:port` from two variables, with the peer's defaults.
    fn addr(&self, host: &str, port: &str, default: u16) -> Result<SocketAddr, ConfigError> {
        let ip = match self.get(host) {
            None => IpAddr::from([0, 0, 0, 0]),
            Some(h) => h.trim().parse().map_err(|_| {
                error(
                    host,
                    &format!("must be an IP address to listen on, got \"{h}\""),
                )
            })?,
        };
        let port_number = match self.get(port) {
            None => default,
            Some(p) => p
                .trim()
                .parse()
                .map_err(|_| error(port, &format!("must be a port number, got \"{p}\"")))?,
        };
        Ok(SocketAddr::new(ip, port_number))
    }
}

/// A tracing filter for the peer's `LOG_LEVEL` (logrus names).
fn log_filter(level: &str) -> Result<String, ConfigError> {
    let l = level.trim().to_ascii_lowercase();
    let level = match l.as_str() {
        "trace" | "debug" | "info" | "error" => l.as_str(),
        "warn" | "warning" => "warn",
        "fatal" | "panic" => "error",
        _ => {
            return Err(error(
                "LOG_LEVEL",
                &format!("must be one of trace, debug, info, warn, error, got \"{level}\""),
            ));
        }
    };
    Ok(level.to_owned())
}

/// `s` with every byte but RFC 3986's unreserved ones percent-encoded,
/// for a URL's user information.
fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A TOML basic string.
fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules_root() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("rl/config")).unwrap();
        std::fs::write(dir.path().join("rl/config/a.yaml"), "domain: a\n").unwrap();
        dir
    }

    fn env(
        root: &tempfile::TempDir,
        vars: &[(&'static str, &'static str)],
    ) -> impl Fn(&str) -> Option<String> {
        let root = root.path().display().to_string();
        let vars = vars.to_vec();
        move |name| match name {
            "RUNTIME_ROOT" => Some(root.clone()),
            "RUNTIME_SUBDIRECTORY" => Some("rl".into()),
            _ => vars
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| (*v).to_owned()),
        }
    }

    #[test]
    fn redis_health_check_active_connection_makes_the_healthcheck_follow_the_store() {
        let root = rules_root();
        let base = [("REDIS_SOCKET_TYPE", "tcp"), ("REDIS_URL", "a:1")];
        let policy = |extra: &[(&'static str, &'static str)]| {
            let vars: Vec<_> = base.iter().chain(extra).copied().collect();
            PeerEnv::from_vars(env(&root, &vars))
                .unwrap()
                .unwrap()
                .policy()
                .unwrap()
        };
        assert!(!policy(&[]).server.healthcheck_store);
        assert!(
            !policy(&[("REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", "false")])
                .server
                .healthcheck_store
        );
        assert!(
            policy(&[("REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", "true")])
                .server
                .healthcheck_store
        );
        let vars = [
            ("REDIS_URL", "a:1"),
            ("REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", "yes"),
        ];
        let err = PeerEnv::from_vars(env(&root, &vars)).unwrap_err();
        assert_eq!(
            err.field(),
            Some("REDIS_HEALTH_CHECK_ACTIVE_CONNECTION"),
            "{err}"
        );
    }

    #[test]
    fn no_peer_variable_means_no_peer_environment() {
        assert_eq!(PeerEnv::from_vars(|_| None).unwrap(), None);
        let only_generic = |n: &str| ["PORT", "LOG_LEVEL"].contains(&n).then(|| "9".to_owned());
        assert_eq!(PeerEnv::from_vars(only_generic).unwrap(), None);
    }

    #[test]
    fn cluster_sentinel_auth_and_tls_map_to_the_store() {
        let root = rules_root();
        let cluster = PeerEnv::from_vars(env(
            &root,
            &[
                ("REDIS_TYPE", "CLUSTER"),
                ("REDIS_URL", "a:1,b:2"),
                ("REDIS_AUTH", "user:p\"w"),
            ],
        ))
        .unwrap()
        .unwrap()
        .policy()
        .unwrap();
        assert_eq!(
            cluster.store.nodes,
            ["redis://user:p%22w@a:1", "redis://user:p%22w@b:2"]
        );

        let sentinel = PeerEnv::from_vars(env(
            &root,
            &[
                ("REDIS_TYPE", "sentinel"),
                ("REDIS_URL", "mymaster,s1:26379,s2:26379"),
                ("REDIS_AUTH", "pw-only"),
            ],
        ))
        .unwrap()
        .unwrap()
        .policy()
        .unwrap();
        assert_eq!(sentinel.store.master_name.as_deref(), Some("mymaster"));
        assert_eq!(
            sentinel.store.sentinels,
            ["redis://s1:26379", "redis://s2:26379"]
        );
        assert_eq!(sentinel.store.password.as_deref(), Some("pw-only"));

        let tls = PeerEnv::from_vars(env(
            &root,
            &[("REDIS_URL", "redis://r:6380"), ("REDIS_TLS", "true")],
        ))
        .unwrap()
        .unwrap();
        assert!(
            tls.policy_toml.contains("url = \"rediss://r:6380\""),
            "{}",
            tls.policy_toml
        );
    }

    #[test]
    fn a_value_ratewatch_cannot_honour_is_an_error_naming_the_variable() {
        let root = rules_root();
        for (name, value) in [
            ("USE_STATSD", "true"),
            ("REDIS_PERSECOND", "1"),
            ("BACKEND_TYPE", "memcache"),
            ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
            ("GRPC_UDS", "/tmp/rl.sock"),
            ("REDIS_SOCKET_TYPE", "unix"),
            ("REDIS_TYPE", "ring"),
            ("USE_STATSD", "maybe"),
        ] {
            let vars: Vec<(&'static str, &'static str)> =
                vec![(name, value), ("REDIS_URL", "127.0.0.1:6379")];
            let err = PeerEnv::from_vars(env(&root, &vars)).unwrap_err();
            assert_eq!(err.field(), Some(name), "{err}");
        }
    }

    #[test]
    fn a_rule_directory_without_rule_files_is_an_error_never_a_default() {
        let dir = tempfile::tempdir().unwrap();
        let err = PeerEnv::from_vars(env(&dir, &[("REDIS_URL", "127.0.0.1:6379")])).unwrap_err();
        assert_eq!(err.field(), Some("RUNTIME_ROOT"), "{err}");
        assert!(err.to_string().contains("rl/config"), "{err}");
        let no_sub = |n: &str| (n == "REDIS_URL").then(|| "127.0.0.1:6379".to_owned());
        let err = PeerEnv::from_vars(no_sub).unwrap_err();
        assert_eq!(err.field(), Some("RUNTIME_SUBDIRECTORY"), "{err}");
    }

    #[test]
    fn listeners_and_log_level_take_the_peers_names_and_defaults() {
        let root = rules_root();
        let p = PeerEnv::from_vars(env(
            &root,
            &[
                ("REDIS_URL", "127.0.0.1:6379"),
                ("PORT", "9000"),
                ("GRPC_HOST", "127.0.0.1"),
                ("LOG_LEVEL", "WARN"),
            ],
        ))
        .unwrap()
        .unwrap();
        assert_eq!(p.listen, "0.0.0.0:9000".parse().unwrap());
        assert_eq!(p.grpc_listen, "127.0.0.1:8081".parse().unwrap());
        assert_eq!(p.log_filter.as_deref(), Some("warn"));
    }
}
