//! Loading a policy from TOML. Errors name the file, the line and the
//! field, and say what would be valid.

use std::path::Path;
use std::time::Duration;

use super::Policy;

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

fn display_invalid(file: Option<&str>, line: Option<usize>, field: &str, message: &str) -> String {
    match (file, line) {
        (Some(f), Some(l)) => format!("{f}:{l}: `{field}` {message}"),
        (Some(f), None) => format!("{f}: `{field}` {message}"),
        (None, Some(l)) => format!("line {l}: `{field}` {message}"),
        (None, None) => format!("`{field}` {message}"),
    }
}

impl ConfigError {
    /// The field the error is about, if any.
    pub fn field(&self) -> Option<&str> {
        match self {
            ConfigError::Invalid { field, .. } => Some(field),
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
    pub fn from_toml_file(path: impl AsRef<Path>) -> Result<Policy, ConfigError> {
        let path = path.as_ref();
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
            file: file.clone(),
            source,
        })?;
        Self::from_toml_str(&text, Some(&file))
    }

    /// Parses and validates a TOML policy; `file` names it in errors.
    pub fn from_toml_str(_text: &str, _file: Option<&str>) -> Result<Policy, ConfigError> {
        todo!("TOML policy parsing")
    }
}

/// Parses a duration such as `500ms`, `60s`, `5m`, `1h`, `1d` or `1w`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| format!("\"{s}\" is not a duration; write a number and a unit, like \"60s\""))?;
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
    Ok(Duration::from_secs_f64(secs))
}
