//! Loading a policy from TOML. Errors name the file, the line and the
//! field, and say what would be valid.

use std::path::Path;
use std::time::Duration;

use super::Policy;

mod file;
mod reader;
mod rls;
mod rule_files;
mod rules;
mod sections;
mod server;

pub(crate) use file::{
    FileKind, Fingerprint, PolicyFile, ReadError, read_named_file, read_policy_file,
    read_secret_file, read_text_file,
};
pub use file::{MAX_POLICY_FILE_BYTES, MAX_RULE_FILE_BYTES};
pub(crate) use rule_files::expand as expand_rule_entry;

use reader::{Source, Table};

/// Top-level keys of a policy file.
const TOP_LEVEL: [&str; 12] = [
    "version",
    "partition",
    "store",
    "resilience",
    "identity",
    "telemetry",
    "dashboard",
    "leases",
    "tiers",
    "routes",
    "rls",
    "server",
];

/// Why a policy could not be loaded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file could not be read.
    #[error("{file}: {source}")]
    Io {
        /// The path.
        file: String,
        /// The cause.
        source: std::io::Error,
    },
    /// A field is missing, unknown, mistyped or out of range.
    #[error("{}", display_invalid(file.as_deref(), *line, field, message))]
    Invalid {
        /// The file, if the policy came from one.
        file: Option<String>,
        /// The 1-based line of the field, if known.
        line: Option<usize>,
        /// The field's path, as in the TOML (`tiers[0].limits[1].capacity`).
        field: String,
        /// What is wrong and what would be valid.
        message: String,
    },
}

/// `file:line: `field` message`, as a compiler would print it; an error
/// about no single field (a syntax error) prints the message alone.
fn display_invalid(file: Option<&str>, line: Option<usize>, field: &str, message: &str) -> String {
    let at = match (file, line) {
        (Some(f), Some(l)) => format!("{f}:{l}: "),
        (Some(f), None) => format!("{f}: "),
        (None, Some(l)) => format!("line {l}: "),
        (None, None) => String::new(),
    };
    if field.is_empty() {
        format!("{at}{message}")
    } else {
        format!("{at}`{field}` {message}")
    }
}

impl ConfigError {
    /// The field the error is about (`tiers[0].limits[1].capacity`), if
    /// the error is about one field; a syntax error is not.
    pub fn field(&self) -> Option<&str> {
        match self {
            ConfigError::Invalid { field, .. } if !field.is_empty() => Some(field),
            ConfigError::Invalid { .. } => None,
            ConfigError::Io { .. } => None,
        }
    }

    /// The 1-based line the error is about, if known.
    pub fn line(&self) -> Option<usize> {
        match self {
            ConfigError::Invalid { line, .. } => *line,
            ConfigError::Io { .. } => None,
        }
    }
}

impl Policy {
    /// Reads and validates a TOML policy file.
    ///
    /// Only a regular file (or a symlink to one) of at most
    /// [`MAX_POLICY_FILE_BYTES`] is read; a FIFO or a device is refused
    /// without waiting on it, and a file that changed while it was read is
    /// refused as still being written.
    pub fn from_toml_file(path: impl AsRef<Path>) -> Result<Policy, ConfigError> {
        let path = path.as_ref();
        let read = read_policy_file(path).map_err(|e| e.error)?;
        Self::from_toml_str(&read.text, Some(&path.display().to_string()))
    }

    /// Parses and validates a TOML policy; `file` names it in errors.
    ///
    /// Every error is [`ConfigError::Invalid`] with the line of the field
    /// it is about, including those found by validation after parsing.
    ///
    /// ```
    /// use ratewatch::policy::Policy;
    /// let err = Policy::from_toml_str("[store]\nkind = \"mongo\"\n", Some("ratewatch.toml"))
    ///     .unwrap_err();
    /// assert_eq!(err.line(), Some(2));
    /// assert_eq!(err.field(), Some("store.kind"));
    /// ```
    pub fn from_toml_str(text: &str, file: Option<&str>) -> Result<Policy, ConfigError> {
        let src = Source::new(text, file);
        let doc = toml::de::DeTable::parse(text).map_err(|e| src.syntax(&e))?;
        let root = Table::root(src, &doc);
        root.only(&TOP_LEVEL, "a ratewatch policy")?;
        let resilience = sections::resilience(root.table("resilience")?)?;
        let rls_cx = rls::Context {
            src,
            doc: &doc,
            file,
            on_store_failure: resilience.on_store_failure,
            has_tiers: !root.tables("tiers")?.is_empty(),
        };
        let rls = rls::rls(root.table("rls")?, &rls_cx)?;
        let mut builder = Policy::builder()
            .store(sections::store(root.table("store")?)?)
            .resilience(resilience)
            .identity(sections::identity(root.table("identity")?)?)
            .telemetry(sections::telemetry(root.table("telemetry")?)?)
            .dashboard(sections::dashboard(root.table("dashboard")?)?)
            .leases(sections::leases(root.table("leases")?)?)
            .rls(rls)
            .server(server::server(root.table("server")?)?);
        if let Some(version) = root.str("version")? {
            builder = builder.version(version);
        }
        if let Some(fraction) = root.number("partition")? {
            builder = builder.partition(fraction);
        }
        for tier in root.tables("tiers")? {
            builder = builder.tier(rules::tier(&tier)?);
        }
        for route in root.tables("routes")? {
            builder = builder.route(rules::route(&route)?);
        }
        builder.build().map_err(|err| match err {
            ConfigError::Invalid { field, message, .. } => {
                let message = after_field(&field, &message);
                src.error(src.locate(&doc, &field), field, message)
            }
            other => other,
        })
    }
}

/// Rewords a validation message to follow the field's path, as in
/// `` `routes[0].cost` 50 exceeds ... ``: validation messages may start by
/// naming the field themselves, which the path already does.
fn after_field(field: &str, message: &str) -> String {
    let last = field.rsplit('.').next().unwrap_or(field);
    let last = last.split('[').next().unwrap_or(last);
    if let Some(rest) = message.strip_prefix(&format!("`{last}` ")) {
        rest.to_owned()
    } else if let Some(rest) = message.strip_prefix(&format!("{last} ")) {
        rest.to_owned()
    } else if let Some(rest) = message.strip_prefix("duplicate ") {
        format!("repeats the {rest}")
    } else {
        message.to_owned()
    }
}

/// Parses a duration such as `500ms`, `60s`, `5m`, `1h`, `1d` or `1w`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: f64 = num.parse().map_err(|_| {
        format!("\"{s}\" is not a duration; write a number and a unit, like \"60s\"")
    })?;
    let secs = match unit.trim() {
        "ms" => n / 1000.0,
        "s" | "" => n,
        "m" | "min" => n * 60.0,
        "h" => n * 3600.0,
        "d" => n * 86_400.0,
        "w" => n * 604_800.0,
        other => {
            return Err(format!(
                "unknown unit \"{other}\" in \"{s}\"; use ms, s, m, h, d or w"
            ));
        }
    };
    if !(secs.is_finite() && secs > 0.0) {
        return Err(format!("\"{s}\" must be longer than zero"));
    }
    if secs > 1e10 {
        return Err(format!("\"{s}\" is too long; at most about 300 years"));
    }
    Ok(Duration::from_secs_f64(secs))
}
