//! Route rules: which requests cost more, carry extra limits or fail
//! differently, matched by method and path pattern.
//!
//! Matching follows axum's routing: a `HEAD` request is answered by the
//! `GET` handler, so it matches (and is charged like) a `GET` rule; the path
//! is the one the client sent, percent-decoded segment by segment (axum
//! decodes path parameters, so `/api/%65xport` reaching a `{action}` route
//! is `/api/export` to the handler and to the rules). A rule that could
//! never match is a config error (see [`RouteRule::check`]).

use super::{FailurePolicy, Limit};

/// The methods a rule may name. `HEAD` is not one: axum answers `HEAD`
/// with the `GET` handler, so a `GET` rule covers it.
pub const METHODS: [&str; 8] = [
    "GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE", "CONNECT",
];

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
    /// How this route's requests are decided, for all their limits; `None`
    /// lets the limits say (see [`crate::policy::LeaseMode::of_request`]).
    pub mode: Option<crate::policy::LeaseMode>,
    /// A metered request ([`RateLimitLayer::with_costs`](crate::RateLimitLayer::with_costs))
    /// answered with a status of 400 or more and no usage recorded gets
    /// everything its decision reserved back, in every unit (true by
    /// default): a request the handler refused used nothing. False keeps
    /// the reservation charged.
    pub refund_on_error: bool,
    /// Where the layer finds a request's cost in units other than requests
    /// (`costs = [{ unit = "tokens", header = "x-max-tokens" }]`): a route
    /// with estimates is metered like a layer with
    /// [`with_costs`](crate::RateLimitLayer::with_costs).
    pub estimates: Vec<CostEstimate>,
    /// The largest request body read for a JSON estimate
    /// ([`DEFAULT_MAX_BODY_BYTES`] unless set): a longer one is refused
    /// with 413, never read further.
    pub max_body_bytes: u64,
    /// Conditions on the request's headers or JSON body, all of which must
    /// hold for the rule to match (`when = [{ json = "stream", equals =
    /// true }]`). A rule with conditions matches only where the request is
    /// known: in the layer ([`RouteRule::matches_request`]), never by
    /// method and path alone.
    pub when: Vec<Condition>,
}

/// A condition of a route rule on the request.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Condition {
    /// Header `name` has the value `equals` (compared without case).
    Header {
        /// The header's name, lower case.
        name: String,
        /// The value it must have.
        equals: String,
    },
    /// Field `field` of the JSON body (dots go into objects) is `equals`
    /// (read by [`BodyCostsLayer`](crate::layer::BodyCostsLayer)).
    Json {
        /// The field.
        field: String,
        /// The value it must have: a string, a boolean or a number.
        equals: serde_json::Value,
    },
}

impl Condition {
    /// Whether the condition holds for a request with `headers` and, if
    /// it was read, JSON `body`.
    pub fn holds(&self, headers: &http::HeaderMap, body: Option<&serde_json::Value>) -> bool {
        match self {
            Condition::Header { name, equals } => headers
                .get(name.as_str())
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.trim().eq_ignore_ascii_case(equals)),
            Condition::Json { field, equals } => body
                .and_then(|b| field.split('.').try_fold(b, |v, key| v.get(key)))
                .is_some_and(|v| v == equals),
        }
    }

    /// Whether it needs the JSON body.
    pub fn reads_body(&self) -> bool {
        matches!(self, Condition::Json { .. })
    }
}

/// One unit's cost estimate of a route rule, read from each request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CostEstimate {
    /// The unit estimated (never `requests`: the route's `cost` is that,
    /// and a client must not choose it).
    pub unit: String,
    /// Where the estimate is read.
    pub source: EstimateSource,
}

/// Where a [`CostEstimate`] is read.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum EstimateSource {
    /// A request header holding a whole number (`x-max-tokens: 512`).
    Header(String),
    /// The request's `Content-Length` (bytes).
    ContentLength,
    /// A whole number in the request's JSON body: a top-level field
    /// (`max_tokens`) or a dotted path into objects (`options.max_tokens`).
    /// Read by [`BodyCostsLayer`](crate::layer::BodyCostsLayer), within the
    /// route's [`max_body_bytes`](RouteRule::max_body_bytes).
    JsonField(String),
}

/// The default [`RouteRule::max_body_bytes`]: 1 MiB.
pub const DEFAULT_MAX_BODY_BYTES: u64 = 1 << 20;

impl CostEstimate {
    /// `unit` estimated from request header `name`.
    pub fn header(unit: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            unit: unit.into(),
            source: EstimateSource::Header(name.into().to_ascii_lowercase()),
        }
    }

    /// `unit` estimated from field `path` of the request's JSON body
    /// (dots go into objects).
    pub fn json(unit: impl Into<String>, path: impl Into<String>) -> Self {
        Self {
            unit: unit.into(),
            source: EstimateSource::JsonField(path.into()),
        }
    }

    /// The estimate in a JSON body already parsed: `None` when the field
    /// is missing or not a whole number.
    pub fn read_json(&self, body: &serde_json::Value) -> Option<u64> {
        let EstimateSource::JsonField(path) = &self.source else {
            return None;
        };
        path.split('.')
            .try_fold(body, |v, key| v.get(key))?
            .as_u64()
    }

    /// `unit` estimated from the request's `Content-Length`.
    pub fn content_length(unit: impl Into<String>) -> Self {
        Self {
            unit: unit.into(),
            source: EstimateSource::ContentLength,
        }
    }

    /// The estimate in `headers`: `None` when the header is missing or not
    /// a whole number (the unit is then checked without charge, never
    /// refused for a bad header).
    pub fn read(&self, headers: &http::HeaderMap) -> Option<u64> {
        let value = match &self.source {
            EstimateSource::Header(name) => headers.get(name.as_str())?,
            EstimateSource::ContentLength => headers.get(http::header::CONTENT_LENGTH)?,
            EstimateSource::JsonField(_) => return None,
        };
        value.to_str().ok()?.trim().parse().ok()
    }

    /// Why the estimate is invalid, as `(field, message)`, if it is.
    pub fn check(&self) -> Option<(&'static str, String)> {
        if let Some(m) = super::check_unit(&self.unit) {
            return Some(("unit", m));
        }
        if self.unit == super::REQUESTS {
            return Some((
                "unit",
                "must not be \"requests\": a route's requests cost is its `cost`, which a \
                 client must not choose"
                    .into(),
            ));
        }
        if let EstimateSource::JsonField(path) = &self.source {
            if path.is_empty() || path.split('.').any(str::is_empty) || path.len() > 128 {
                return Some((
                    "json",
                    format!(
                        "must name a field such as \"max_tokens\" or \"options.max_tokens\", got {path:?}"
                    ),
                ));
            }
        }
        if let EstimateSource::Header(name) = &self.source {
            if http::HeaderName::from_bytes(name.as_bytes()).is_err() {
                return Some((
                    "header",
                    format!(
                        "must be a valid HTTP header name such as \"x-max-tokens\", got {name:?}"
                    ),
                ));
            }
        }
        None
    }
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
            mode: None,
            refund_on_error: true,
            estimates: Vec::new(),
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            when: Vec::new(),
        }
    }

    /// Matches only requests for which `condition` holds too.
    pub fn when(mut self, condition: Condition) -> Self {
        self.when.push(condition);
        self
    }

    /// Whether the rule matches a request of `method` and `path` with
    /// `headers` and (if it was read) JSON `body`, conditions included.
    pub fn matches_request(
        &self,
        method: &str,
        path: &str,
        headers: &http::HeaderMap,
        body: Option<&serde_json::Value>,
    ) -> bool {
        self.matches(method, path) && self.when.iter().all(|c| c.holds(headers, body))
    }

    /// Whether an estimate or a condition reads the request's JSON body.
    pub fn reads_body(&self) -> bool {
        self.estimates
            .iter()
            .any(|e| matches!(e.source, EstimateSource::JsonField(_)))
            || self.when.iter().any(Condition::reads_body)
    }

    /// Reads each request's cost in `estimate`'s unit where it says.
    pub fn with_estimate(mut self, estimate: CostEstimate) -> Self {
        self.estimates.push(estimate);
        self
    }

    /// The request's costs from this rule's estimates (its headers and,
    /// if it was read, its JSON body), `None` without any.
    pub fn estimate(
        &self,
        headers: &http::HeaderMap,
        body: Option<&serde_json::Value>,
    ) -> Option<crate::Costs> {
        if self.estimates.is_empty() {
            return None;
        }
        let mut costs = crate::Costs::new();
        for e in &self.estimates {
            let n = match (&e.source, body) {
                (EstimateSource::JsonField(_), Some(b)) => e.read_json(b),
                _ => e.read(headers),
            };
            if let Some(n) = n {
                costs.set(e.unit.clone(), n);
            }
        }
        Some(costs)
    }

    /// Whether a metered request answered with an error and no recorded
    /// usage gets its reservation back ([`RouteRule::refund_on_error`]).
    pub fn with_refund_on_error(mut self, refund: bool) -> Self {
        self.refund_on_error = refund;
        self
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

    /// Decides this route's requests in `mode`, whatever their limits say.
    pub fn with_mode(mut self, mode: crate::policy::LeaseMode) -> Self {
        self.mode = Some(mode);
        self
    }

    /// Exempts the route from limiting.
    pub fn exempt(mut self) -> Self {
        self.exempt = true;
        self
    }

    /// Whether the rule matches a request. `HEAD` matches `GET` rules.
    pub fn matches(&self, method: &str, path: &str) -> bool {
        if let Some(m) = &self.method {
            let method = if method.eq_ignore_ascii_case("HEAD") {
                "GET"
            } else {
                method
            };
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

    /// `METHOD pattern` (`* pattern` for any method), as messages name it.
    pub fn describe(&self) -> String {
        format!("{} {}", self.method.as_deref().unwrap_or("*"), self.path)
    }

    /// Why the rule could never match as written, as `(field, message)`
    /// where field is `method` or `path`; `None` if it can.
    pub fn check(&self) -> Option<(&'static str, String)> {
        if let Some(m) = &self.method {
            if m == "HEAD" {
                return Some((
                    "method",
                    "is \"HEAD\", which never reaches a rule: HEAD requests are answered by the GET handler and matched by GET rules; write \"GET\"".into(),
                ));
            }
            if !METHODS.contains(&m.as_str()) {
                return Some((
                    "method",
                    format!(
                        "must be an HTTP method ({}) or \"*\" for any, got \"{m}\"",
                        METHODS
                            .iter()
                            .map(|m| format!("\"{m}\""))
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                ));
            }
        }
        check_pattern(&self.path).map(|m| ("path", m))
    }

    /// Whether every request this rule matches is matched by `earlier`
    /// too, so that, coming after it, this rule could never match.
    pub fn is_shadowed_by(&self, earlier: &RouteRule) -> bool {
        // A rule with conditions lets the requests it does not take by.
        if !earlier.when.is_empty() {
            return false;
        }
        let method_covered = match (&earlier.method, &self.method) {
            (None, _) => true,
            (Some(_), None) => false,
            (Some(a), Some(b)) => a == b,
        };
        method_covered && pattern_covers(&earlier.path, &self.path)
    }
}

/// One segment of a pattern.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Seg<'a> {
    Lit(&'a str),
    Param,
    Rest,
}

fn segments(pattern: &str) -> impl Iterator<Item = Seg<'_>> {
    pattern.trim_matches('/').split('/').map(|w| {
        if w == "*" || (w.starts_with("{*") && w.ends_with('}')) {
            Seg::Rest
        } else if w.starts_with('{') && w.ends_with('}') {
            Seg::Param
        } else {
            Seg::Lit(w)
        }
    })
}

/// Why a pattern could never match what its author meant, if it could not.
fn check_pattern(pattern: &str) -> Option<String> {
    if !pattern.starts_with('/') {
        return Some(format!(
            "must start with '/', like \"/{}\"; a path without it never matches a request",
            pattern.trim_start_matches('/')
        ));
    }
    let raw: Vec<&str> = pattern.trim_matches('/').split('/').collect();
    for (i, w) in raw.iter().enumerate() {
        if let Some(name) = w.strip_prefix(':') {
            return Some(format!(
                "uses axum 0.7's \":{name}\", which axum 0.8 and ratewatch read as a literal segment; write \"{{{name}}}\""
            ));
        }
        if w.starts_with('*') && *w != "*" {
            return Some(format!(
                "uses axum 0.7's \"{w}\", which axum 0.8 and ratewatch read as a literal segment; write \"{{*{}}}\"",
                &w[1..]
            ));
        }
        let braces = w.contains(['{', '}']);
        let well_formed = w.len() > 2
            && w.starts_with('{')
            && w.ends_with('}')
            && !w[1..w.len() - 1].contains(['{', '}'])
            && *w != "{*}";
        if braces && !well_formed {
            return Some(format!(
                "has a malformed segment \"{w}\"; a parameter is a whole segment like \"{{id}}\" or \"{{*rest}}\""
            ));
        }
        let rest = *w == "*" || w.starts_with("{*");
        if rest && i + 1 != raw.len() {
            return Some(format!(
                "has \"{w}\" before the last segment; a wildcard takes the rest of the path, so it must come last"
            ));
        }
        if w.is_empty() && raw.len() > 1 {
            return Some("has an empty segment (\"//\"), which no routed request has".into());
        }
    }
    None
}

/// Whether pattern `a` matches every path pattern `b` matches.
fn pattern_covers(a: &str, b: &str) -> bool {
    let mut a = segments(a);
    let mut b = segments(b);
    loop {
        match (a.next(), b.next()) {
            (Some(Seg::Rest), _) => return true,
            (None, None) => return true,
            (_, Some(Seg::Rest)) | (None, Some(_)) | (Some(_), None) => return false,
            (Some(Seg::Lit(x)), Some(Seg::Lit(y))) if x == y => {}
            (Some(Seg::Lit(_)), _) => return false,
            (Some(Seg::Param), Some(Seg::Lit(y))) if !y.is_empty() => {}
            (Some(Seg::Param), Some(Seg::Param)) => {}
            (Some(Seg::Param), _) => return false,
        }
    }
}

/// Matches a path against a pattern of literal segments, `{param}` (one
/// segment) and `{*rest}` or `*` (everything after). Path segments are
/// percent-decoded before they are compared, as axum decodes them for the
/// handler.
pub fn path_matches(pattern: &str, path: &str) -> bool {
    let path = path.split('?').next().unwrap_or("");
    let mut want = segments(pattern);
    let mut have = path.trim_matches('/').split('/');
    loop {
        match (want.next(), have.next()) {
            (None, None) => return true,
            (Some(Seg::Rest), _) => return true,
            (Some(Seg::Param), Some(h)) if !h.is_empty() => {}
            (Some(Seg::Lit(w)), Some(h)) if segment_is(h, w) => {}
            _ => return false,
        }
    }
}

/// Whether the raw path segment `raw`, percent-decoded, is `literal`.
fn segment_is(raw: &str, literal: &str) -> bool {
    if !raw.contains('%') {
        return raw == literal;
    }
    let raw = raw.as_bytes();
    let mut want = literal.bytes();
    let mut i = 0;
    while i < raw.len() {
        let mut b = raw[i];
        if b == b'%' && i + 2 < raw.len() {
            if let (Some(hi), Some(lo)) = (hex(raw[i + 1]), hex(raw[i + 2])) {
                b = hi << 4 | lo;
                i += 2;
            }
        }
        if want.next() != Some(b) {
            return false;
        }
        i += 1;
    }
    want.next().is_none()
}

fn hex(b: u8) -> Option<u8> {
    (b as char).to_digit(16).map(|d| d as u8)
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
    fn percent_encoded_segments_match_their_decoded_literal() {
        assert!(path_matches("/api/export", "/api/%65xport"));
        assert!(path_matches("/api/export", "/api/%65%78port"));
        assert!(!path_matches("/api/export", "/api/%2"));
        assert!(!path_matches("/api/export", "/api/%65xpor"));
        assert!(path_matches("/a%zz", "/a%zz"));
        assert!(path_matches("/a%", "/a%"));
    }

    #[test]
    fn method_is_compared_without_case() {
        let r = RouteRule::new("post", "/api/data");
        assert!(r.matches("POST", "/api/data"));
        assert!(!r.matches("GET", "/api/data"));
        assert_eq!(r.label(), "/api/data");
    }

    #[test]
    fn head_matches_get_rules() {
        let r = RouteRule::new("GET", "/api/users");
        assert!(r.matches("HEAD", "/api/users"));
        assert!(r.matches("head", "/api/users"));
        assert!(!RouteRule::new("POST", "/api/users").matches("HEAD", "/api/users"));
    }

    #[test]
    fn rules_that_could_never_match_are_caught() {
        let bad = |m: &str, p: &str| RouteRule::new(m, p).check();
        assert_eq!(bad("GTE", "/x").unwrap().0, "method");
        assert_eq!(bad("HEAD", "/x").unwrap().0, "method");
        assert!(bad("x", "/api").is_some());
        for p in [
            "api/x",
            "/users/:id",
            "/files/*rest",
            "/a/{id",
            "/a/{}",
            "/a/{*rest}/b",
            "/a/*/b",
            "/a//b",
        ] {
            assert_eq!(bad("GET", p).map(|e| e.0), Some("path"), "{p}");
        }
        for p in ["/", "/api/{id}", "/files/{*rest}", "/api/*", "/api/v1/"] {
            assert_eq!(bad("*", p), None, "{p}");
        }
    }

    #[test]
    fn a_rule_is_shadowed_by_an_earlier_one_covering_it() {
        let r = |m, p| RouteRule::new(m, p);
        assert!(r("GET", "/a/{x}").is_shadowed_by(&r("GET", "/a/{id}")));
        assert!(r("GET", "/a/b").is_shadowed_by(&r("*", "/a/b/")));
        assert!(r("GET", "/a/b").is_shadowed_by(&r("GET", "/a/*")));
        assert!(r("GET", "/a").is_shadowed_by(&r("GET", "/a/{*rest}")));
        assert!(!r("POST", "/a/b").is_shadowed_by(&r("GET", "/a/b")));
        assert!(!r("*", "/a/b").is_shadowed_by(&r("GET", "/a/b")));
        assert!(!r("GET", "/a/{id}").is_shadowed_by(&r("GET", "/a/b")));
        assert!(!r("GET", "/a/*").is_shadowed_by(&r("GET", "/a/{id}")));
        assert!(!r("GET", "/a/b/c").is_shadowed_by(&r("GET", "/a/b")));
    }
}
