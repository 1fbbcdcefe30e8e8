//! Route rules: which requests cost more, carry extra limits or fail
//! differently, matched by method and path pattern.

use super::{FailurePolicy, Limit};

/// A route rule. The pattern is the route's label in metrics, never the raw
/// path, so label values stay bounded.
#[derive(Debug, Clone, PartialEq)]
pub struct RouteRule {
    /// HTTP method, upper case; `None` matches every method.
    pub method: Option<String>,
    /// Path pattern: literal segments, `{name}` for one segment, `{*rest}`
    /// (or a trailing `*`) for the rest of the path.
    pub path: String,
    /// Units a request consumes from every limit (default 1).
    pub cost: u64,
    /// Limits added to the tier's limits on this route.
    pub limits: Vec<Limit>,
    /// What to do when the store cannot decide; `None` takes the default.
    pub on_store_failure: Option<FailurePolicy>,
    /// Requests on this route are never limited (like `/health`).
    pub exempt: bool,
}

impl RouteRule {
    /// A rule for `method` (or `*`) and `path`, cost 1.
    pub fn new(method: &str, path: impl Into<String>) -> Self {
        let method = (method != "*").then(|| method.to_ascii_uppercase());
        Self {
            method,
            path: path.into(),
            cost: 1,
            limits: Vec::new(),
            on_store_failure: None,
            exempt: false,
        }
    }

    /// Sets the cost per request.
    pub fn with_cost(mut self, cost: u64) -> Self {
        self.cost = cost;
        self
    }

    /// Adds a limit that applies on this route only.
    pub fn with_limit(mut self, limit: Limit) -> Self {
        self.limits.push(limit);
        self
    }

    /// Sets the failure policy of this route.
    pub fn on_store_failure(mut self, policy: FailurePolicy) -> Self {
        self.on_store_failure = Some(policy);
        self
    }

    /// Exempts the route from limiting.
    pub fn exempt(mut self) -> Self {
        self.exempt = true;
        self
    }

    /// Whether the rule matches a request.
    pub fn matches(&self, method: &str, path: &str) -> bool {
        if let Some(m) = &self.method {
            if !m.eq_ignore_ascii_case(method) {
                return false;
            }
        }
        path_matches(&self.path, path)
    }

    /// The `route` label of metrics: the pattern, never the raw path.
    pub fn label(&self) -> &str {
        &self.path
    }
}

/// Matches a path against a pattern of literal segments, `{param}` (one
/// segment) and `{*rest}` or `*` (everything after).
pub fn path_matches(pattern: &str, path: &str) -> bool {
    let path = path.split('?').next().unwrap_or("");
    let mut want = pattern.trim_matches('/').split('/');
    let mut have = path.trim_matches('/').split('/');
    loop {
        match (want.next(), have.next()) {
            (None, None) => return true,
            (Some(w), _) if w == "*" || (w.starts_with("{*") && w.ends_with('}')) => return true,
            (Some(w), Some(h)) => {
                let param = w.starts_with('{') && w.ends_with('}');
                if !(param && !h.is_empty() || w == h) {
                    return false;
                }
            }
            _ => return false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_match_literal_param_and_wildcard_segments() {
        assert!(path_matches("/api/export", "/api/export"));
        assert!(path_matches("/api/export", "/api/export/"));
        assert!(!path_matches("/api/export", "/api/exports"));
        assert!(path_matches("/api/users/{id}", "/api/users/42"));
        assert!(!path_matches("/api/users/{id}", "/api/users"));
        assert!(!path_matches("/api/users/{id}", "/api/users/42/x"));
        assert!(path_matches("/api/*", "/api/anything/at/all"));
        assert!(path_matches("/files/{*rest}", "/files/a/b"));
        assert!(path_matches("/", "/"));
        assert!(path_matches("/api/x", "/api/x?y=1"));
    }

    #[test]
    fn method_is_compared_without_case() {
        let r = RouteRule::new("post", "/api/data");
        assert!(r.matches("POST", "/api/data"));
        assert!(!r.matches("GET", "/api/data"));
        assert_eq!(r.label(), "/api/data");
    }
}
