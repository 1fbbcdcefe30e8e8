//! A typed view of a parsed TOML document that knows where every value came
//! from: each getter either returns what the policy needs or a
//! [`ConfigError`] naming the field, its line and what would be valid.

use std::time::Duration;

use toml::Spanned;
use toml::de::{DeTable, DeValue};

use super::{ConfigError, parse_duration};

pub(super) type Result<T> = std::result::Result<T, ConfigError>;

/// The text being parsed, to turn byte offsets into lines.
#[derive(Clone, Copy)]
pub(super) struct Source<'a> {
    text: &'a str,
    file: Option<&'a str>,
}

impl<'a> Source<'a> {
    pub(super) fn new(text: &'a str, file: Option<&'a str>) -> Self {
        Self { text, file }
    }

    /// The 1-based line holding byte `offset`.
    pub(super) fn line_of(&self, offset: usize) -> usize {
        let end = offset.min(self.text.len());
        self.text.as_bytes()[..end]
            .iter()
            .filter(|&&b| b == b'\n')
            .count()
            + 1
    }

    pub(super) fn error(
        &self,
        offset: usize,
        field: impl Into<String>,
        message: impl Into<String>,
    ) -> ConfigError {
        ConfigError::Invalid {
            file: self.file.map(str::to_owned),
            line: Some(self.line_of(offset)),
            field: field.into(),
            message: message.into(),
        }
    }

    /// A TOML syntax error, on the line the parser points at.
    pub(super) fn syntax(&self, err: &toml::de::Error) -> ConfigError {
        let offset = err.span().map_or(0, |s| s.start);
        let message = err
            .message()
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect::<Vec<_>>()
            .join("; ");
        // Name the key a duplicate-key error is about: the parser only
        // points at it.
        let key = err
            .span()
            .and_then(|s| self.text.get(s))
            .filter(|k| !k.is_empty() && !k.contains('\n'));
        let message = match key {
            Some(key) if message == "duplicate key" => {
                format!("duplicate key `{key}`; a key may be set only once per table")
            }
            _ => message,
        };
        self.error(offset, "", format!("TOML syntax error: {message}"))
    }

    /// The offset of the key (or array element) a validation path such as
    /// `tiers[1].limits[0].name` names, or of the nearest table holding it
    /// when the key itself was left to its default.
    pub(super) fn locate(&self, root: &Spanned<DeTable<'_>>, path: &str) -> usize {
        let mut table = root.get_ref();
        let mut at = root.span().start;
        for segment in path.split('.') {
            let (key, index) = match segment.split_once('[') {
                Some((key, rest)) => (key, rest.trim_end_matches(']').parse::<usize>().ok()),
                None => (segment, None),
            };
            let Some((k, v)) = table.get_key_value(key) else {
                return at;
            };
            at = k.span().start;
            let value = match (index, v.get_ref()) {
                (Some(i), DeValue::Array(items)) => match items.get(i) {
                    Some(item) => {
                        at = item.span().start;
                        item.get_ref()
                    }
                    None => return at,
                },
                (Some(_), _) => return at,
                (None, value) => value,
            };
            match value {
                DeValue::Table(t) => table = t,
                _ => return at,
            }
        }
        at
    }
}

/// One table of the document, with its path (`tiers[0].limits[1]`).
#[derive(Clone)]
pub(super) struct Table<'a> {
    src: Source<'a>,
    path: String,
    at: usize,
    map: &'a DeTable<'a>,
}

impl<'a> Table<'a> {
    /// The document's root table.
    pub(super) fn root(src: Source<'a>, doc: &'a Spanned<DeTable<'a>>) -> Self {
        Self {
            src,
            path: String::new(),
            at: doc.span().start,
            map: doc.get_ref(),
        }
    }

    /// The path of `key` in this table.
    pub(super) fn field(&self, key: &str) -> String {
        if self.path.is_empty() {
            key.to_owned()
        } else {
            format!("{}.{key}", self.path)
        }
    }

    /// An error about a key this table lacks, on the table's line.
    pub(super) fn missing(&self, key: &str, message: impl Into<String>) -> ConfigError {
        self.src.error(self.at, self.field(key), message)
    }

    /// The keys present, in the order they appear in the document.
    pub(super) fn keys(&self) -> Vec<(&'a str, usize)> {
        let mut keys: Vec<_> = self
            .map
            .iter()
            .map(|(k, _)| (k.get_ref().as_ref(), k.span().start))
            .collect();
        keys.sort_by_key(|&(_, at)| at);
        keys
    }

    /// Rejects any key not in `allowed`; `what` names the table in the
    /// message (`[store]`, `a tier`).
    pub(super) fn only(&self, allowed: &[&str], what: &str) -> Result<()> {
        for (key, at) in self.keys() {
            if !allowed.contains(&key) {
                return Err(self
                    .src
                    .error(at, self.field(key), unknown_key(key, allowed, what)));
            }
        }
        Ok(())
    }

    /// An error about `key`, on its line.
    pub(super) fn error_at(&self, key: &str, message: impl Into<String>) -> ConfigError {
        match self.get(key) {
            Some(v) => v.error(message),
            None => self.missing(key, message),
        }
    }

    /// The value of `key`, if present.
    pub(super) fn get(&self, key: &str) -> Option<Value<'a>> {
        self.map.get_key_value(key).map(|(k, v)| Value {
            src: self.src,
            field: self.field(key),
            at: k.span().start,
            value: v,
        })
    }

    /// A string.
    pub(super) fn str(&self, key: &str) -> Result<Option<&'a str>> {
        self.get(key).map(|v| v.as_str()).transpose()
    }

    /// A string that must be present; `hint` says what it is for.
    pub(super) fn required_str(&self, key: &str, hint: &str) -> Result<&'a str> {
        self.str(key)?
            .ok_or_else(|| self.missing(key, format!("is required: {hint}")))
    }

    /// A boolean.
    pub(super) fn bool(&self, key: &str) -> Result<Option<bool>> {
        self.get(key).map(|v| v.as_bool()).transpose()
    }

    /// A whole number in `min..=max`.
    pub(super) fn uint(&self, key: &str, min: u64, max: u64) -> Result<Option<u64>> {
        self.get(key).map(|v| v.as_uint(min, max)).transpose()
    }

    /// A number (integer or float).
    pub(super) fn number(&self, key: &str) -> Result<Option<f64>> {
        self.get(key).map(|v| v.as_number()).transpose()
    }

    /// Milliseconds, as a duration of at least `min_ms`.
    pub(super) fn millis(&self, key: &str, min_ms: u64) -> Result<Option<Duration>> {
        Ok(self.uint(key, min_ms, u64::MAX)?.map(Duration::from_millis))
    }

    /// One of a fixed set of strings.
    pub(super) fn choice<T: Copy>(&self, key: &str, options: &[(&str, T)]) -> Result<Option<T>> {
        self.get(key).map(|v| v.as_choice(options)).transpose()
    }

    /// A sub-table (`[store]`, or an inline `breaker = { ... }`).
    pub(super) fn table(&self, key: &str) -> Result<Option<Table<'a>>> {
        self.get(key).map(|v| v.as_table()).transpose()
    }

    /// An array of tables (`[[tiers]]`, or `limits = [{ ... }, ...]`).
    pub(super) fn tables(&self, key: &str) -> Result<Vec<Table<'a>>> {
        self.items(key, "an array of tables")?
            .into_iter()
            .map(|v| v.as_table())
            .collect()
    }

    /// The elements of an array, each with its own path and line.
    pub(super) fn items(&self, key: &str, want: &str) -> Result<Vec<Value<'a>>> {
        let Some(v) = self.get(key) else {
            return Ok(Vec::new());
        };
        let DeValue::Array(items) = v.value.get_ref() else {
            return Err(v.wrong_type(want));
        };
        Ok(items
            .iter()
            .enumerate()
            .map(|(i, item)| Value {
                src: self.src,
                field: format!("{}[{i}]", v.field),
                at: item.span().start,
                value: item,
            })
            .collect())
    }
}

/// One value of the document, with its path and position.
pub(super) struct Value<'a> {
    src: Source<'a>,
    field: String,
    at: usize,
    value: &'a Spanned<DeValue<'a>>,
}

impl<'a> Value<'a> {
    /// An error about this value, on its line.
    pub(super) fn error(&self, message: impl Into<String>) -> ConfigError {
        self.src.error(self.at, self.field.clone(), message)
    }

    fn wrong_type(&self, want: &str) -> ConfigError {
        let got = describe(self.value.get_ref());
        let hint = match self.value.get_ref() {
            DeValue::String(s) if s.trim().parse::<f64>().is_ok() && want.contains("number") => {
                " (write it without quotes)"
            }
            _ => "",
        };
        self.error(format!("must be {want}, got {got}{hint}"))
    }

    pub(super) fn as_str(&self) -> Result<&'a str> {
        match self.value.get_ref() {
            DeValue::String(s) => Ok(s.as_ref()),
            _ => Err(self.wrong_type("a string")),
        }
    }

    pub(super) fn as_bool(&self) -> Result<bool> {
        match self.value.get_ref() {
            DeValue::Boolean(b) => Ok(*b),
            _ => Err(self.wrong_type("true or false")),
        }
    }

    pub(super) fn as_uint(&self, min: u64, max: u64) -> Result<u64> {
        let range = if max == u64::MAX {
            format!("at least {min}")
        } else {
            format!("between {min} and {max}")
        };
        match self.value.get_ref() {
            DeValue::Integer(i) => {
                let n = i128::from_str_radix(i.as_str(), i.radix())
                    .map_err(|_| self.error(format!("must be {range}, got {i}")))?;
                if n < i128::from(min) || n > i128::from(max) {
                    return Err(self.error(format!("must be {range}, got {n}")));
                }
                u64::try_from(n).map_err(|_| self.error(format!("must be {range}, got {n}")))
            }
            DeValue::Float(f) => Err(self.error(format!(
                "must be a whole number {range}, got {}",
                f.as_str()
            ))),
            _ => Err(self.wrong_type(&format!("a whole number {range}"))),
        }
    }

    pub(super) fn as_number(&self) -> Result<f64> {
        match self.value.get_ref() {
            DeValue::Integer(i) => i128::from_str_radix(i.as_str(), i.radix())
                .map(|n| n as f64)
                .map_err(|_| self.error(format!("is too large, got {i}"))),
            DeValue::Float(f) => f
                .as_str()
                .parse::<f64>()
                .map_err(|_| self.error(format!("is not a number, got {}", f.as_str()))),
            _ => Err(self.wrong_type("a number")),
        }
    }

    /// A rate: a number above 0 and at most one million per second.
    pub(super) fn as_rate(&self) -> Result<f64> {
        let r = self.as_number()?;
        if r.is_finite() && r > 0.0 && r <= 1e6 {
            Ok(r)
        } else {
            Err(self.error(format!(
                "must be a number above 0 and at most 1000000 (per second), got {r}"
            )))
        }
    }

    /// A duration: a string such as `"60s"`, or whole seconds. `zero_ok`
    /// admits `"0s"` / `0`.
    pub(super) fn as_duration(&self, zero_ok: bool) -> Result<Duration> {
        const EXAMPLES: &str =
            "a duration such as \"500ms\", \"60s\", \"5m\", \"1h\" or \"1d\", or whole seconds";
        let min = u64::from(!zero_ok);
        let d = match self.value.get_ref() {
            DeValue::Integer(_) => match self.as_number()? {
                n if n >= min as f64 => Duration::from_secs(self.as_uint(min, u64::MAX)?),
                n if zero_ok => {
                    return Err(
                        self.error(format!("must not be negative, got {n}; write {EXAMPLES}"))
                    );
                }
                n => {
                    return Err(self.error(format!(
                        "must be longer than zero, got {n}; write {EXAMPLES}"
                    )));
                }
            },
            DeValue::String(s) if zero_ok && is_zero_duration(s) => Duration::ZERO,
            DeValue::String(s) if is_zero_duration(s) => {
                return Err(self.error(format!(
                    "must be longer than zero, got \"{s}\"; write {EXAMPLES}"
                )));
            }
            DeValue::String(s) => {
                parse_duration(s).map_err(|e| self.error(format!("must be {EXAMPLES}: {e}")))?
            }
            _ => return Err(self.wrong_type(EXAMPLES)),
        };
        if !d.is_zero() && d < Duration::from_millis(1) {
            return Err(self.error(format!("must be at least 1ms, got {d:?}")));
        }
        Ok(d)
    }

    pub(super) fn as_choice<T: Copy>(&self, options: &[(&str, T)]) -> Result<T> {
        let names = options
            .iter()
            .map(|(n, _)| format!("\"{n}\""))
            .collect::<Vec<_>>()
            .join(", ");
        let s = self
            .as_str()
            .map_err(|_| self.wrong_type(&format!("one of {names}")))?;
        options
            .iter()
            .find(|(n, _)| *n == s)
            .map(|&(_, v)| v)
            .ok_or_else(|| self.error(format!("must be one of {names}, got \"{s}\"")))
    }

    pub(super) fn as_table(&self) -> Result<Table<'a>> {
        match self.value.get_ref() {
            DeValue::Table(map) => Ok(Table {
                src: self.src,
                path: self.field.clone(),
                at: self.value.span().start,
                map,
            }),
            _ => Err(self.wrong_type("a table")),
        }
    }
}

/// `"0s"`, `"0"`, `"0ms"` ...: zero in any unit `parse_duration` knows.
fn is_zero_duration(s: &str) -> bool {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    num.parse::<f64>().is_ok_and(|n| n == 0.0)
        && ["", "ms", "s", "m", "min", "h", "d", "w"].contains(&unit.trim())
}

fn describe(v: &DeValue<'_>) -> String {
    match v {
        DeValue::String(s) => format!("the string \"{s}\""),
        DeValue::Integer(i) => format!("the integer {i}"),
        DeValue::Float(f) => format!("the number {}", f.as_str()),
        DeValue::Boolean(b) => format!("{b}"),
        DeValue::Datetime(d) => format!("the date {d}"),
        DeValue::Array(_) => "an array".into(),
        DeValue::Table(_) => "a table".into(),
    }
}

/// "is not a setting of [store]; allowed keys are ... (did you mean ...?)"
pub(super) fn unknown_key(key: &str, allowed: &[&str], what: &str) -> String {
    let near = allowed
        .iter()
        .map(|a| (edit_distance(key, a), *a))
        .filter(|&(d, a)| d <= 2.max(a.len() / 3))
        .min_by_key(|&(d, _)| d);
    let hint = near.map_or(String::new(), |(_, a)| format!(" (did you mean `{a}`?)"));
    format!(
        "is not a setting of {what}; allowed keys are {}{hint}",
        allowed.join(", ")
    )
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diag = row[0];
        row[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let next = (diag + usize::from(ca != cb))
                .min(row[j] + 1)
                .min(row[j + 1] + 1);
            diag = row[j + 1];
            row[j + 1] = next;
        }
    }
    row[b.len()]
}
