//! Per-value descriptor statistics, bounded: envoyproxy/ratelimit's
//! `detailed_metric` and `value_to_metric` as Prometheus series.
//!
//! That service names a descriptor's statistics after the request's
//! values when its YAML asks (`detailed_metric: true` on the rule, or
//! `value_to_metric: true` on an entry): one statistic per value a client
//! sends, without bound. Here each rule keeps at most `top_k` values with
//! series of their own ([`RLS_DESCRIPTOR_HITS_TOTAL`] {domain, key, value,
//! result}); every other value is counted under [`OTHER_VALUE`], so a
//! flood of values adds at most one series per result.
//!
//! Which values get a series: a value earns one once it has been seen in
//! at least [`PROMOTE_AFTER`] requests while a slot is free. Candidates
//! are counted in a space-saving sketch of a few times `top_k` entries
//! (Metwally et al.), whose guaranteed count (its count less its error)
//! is what is compared, so a stream of values each sent once never takes
//! a slot, and a heavy value takes one within its first requests. A
//! series, once made, is kept until the process ends (a Prometheus
//! counter cannot be taken back); hits of a value before its series
//! existed stay in `_other`, so the sum over `value` is every hit.
//!
//! A `value` label is at most [`MAX_VALUE_LABEL`] characters: a longer
//! one is cut and ended by a hash of the whole, control characters are
//! dropped.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock};

use metrics::{counter, describe_counter};
use sha2::{Digest, Sha256};

/// Hits of a `detailed_metric` / `value_to_metric` descriptor per value:
/// counter {domain, key, value, result}, in hits (the addend), as
/// envoyproxy/ratelimit counts them.
pub const RLS_DESCRIPTOR_HITS_TOTAL: &str = "ratewatch_rls_descriptor_hits_total";

/// The `value` of every value without a series of its own.
pub const OTHER_VALUE: &str = "_other";

/// The longest `value` label, in characters.
pub const MAX_VALUE_LABEL: usize = 128;

/// Requests a value must have been seen in (guaranteed, not estimated)
/// before it may take a slot.
pub const PROMOTE_AFTER: u64 = 2;

/// Rules tracked at most; hits of rules past it count under `_other`.
const MAX_RULES: usize = 4096;

/// What happened to a descriptor's hits, one label per hit: the three
/// partition the hits (envoyproxy/ratelimit's `within_limit` is
/// `within_limit` + `near_limit` here, its `total_hits` their sum).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HitResult {
    /// Allowed, below `[rls] near_limit_ratio` of the limit.
    Within,
    /// Allowed, at or past `[rls] near_limit_ratio` of the limit.
    Near,
    /// Refused (or would have been, for a shadow rule).
    Over,
}

impl HitResult {
    /// The `result` label.
    pub fn as_str(self) -> &'static str {
        match self {
            HitResult::Within => "within_limit",
            HitResult::Near => "near_limit",
            HitResult::Over => "over_limit",
        }
    }
}

/// Describes the metric to the current recorder.
pub fn describe() {
    describe_counter!(
        RLS_DESCRIPTOR_HITS_TOTAL,
        "Hits of decision-service descriptors whose YAML asks for per-value statistics \
         (detailed_metric, value_to_metric), by domain, rule, value (the top [rls] \
         detailed_metric_top_k values of a rule; _other for the rest) and result."
    );
}

/// Counts `hits` of a descriptor of rule `key` in `domain` whose value
/// path is `value`, in the process's table.
pub fn record(domain: &str, key: &str, value: &str, hits: u64, result: HitResult, top_k: usize) {
    static TABLE: OnceLock<Mutex<DetailedStats>> = OnceLock::new();
    let table = TABLE.get_or_init(|| Mutex::new(DetailedStats::default()));
    let label = table
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .label(domain, key, value, top_k);
    counter!(RLS_DESCRIPTOR_HITS_TOTAL,
        "domain" => domain.to_owned(),
        "key" => key.to_owned(),
        "value" => label,
        "result" => result.as_str())
    .increment(hits);
}

/// Which values of which rules have series of their own.
#[derive(Debug, Default)]
pub struct DetailedStats {
    rules: HashMap<(Arc<str>, Arc<str>), Tracker>,
}

/// One rule's values.
#[derive(Debug, Default)]
struct Tracker {
    /// Values with a series (their bounded labels' sources).
    promoted: HashSet<String>,
    /// Candidates: value to (count, error).
    sketch: HashMap<String, (u64, u64)>,
}

impl DetailedStats {
    /// The `value` label one request of `value` counts under, for rule
    /// `key` of `domain` keeping at most `top_k` values.
    pub fn label(&mut self, domain: &str, key: &str, value: &str, top_k: usize) -> String {
        let rule = (Arc::<str>::from(domain), Arc::<str>::from(key));
        if !self.rules.contains_key(&rule) && self.rules.len() >= MAX_RULES {
            return OTHER_VALUE.to_owned();
        }
        let t = self.rules.entry(rule).or_default();
        if t.promoted.contains(value) {
            return bounded(value);
        }
        if t.promoted.len() >= top_k {
            // No slot will free up: no need to count candidates.
            t.sketch.clear();
            return OTHER_VALUE.to_owned();
        }
        let capacity = top_k.saturating_mul(4).max(16);
        let seen = t.sketch.get(value).copied();
        let (count, error) = match seen {
            Some((c, e)) => (c + 1, e),
            None if t.sketch.len() < capacity => (1, 0),
            None => {
                // Space saving: the least counted candidate makes room,
                // and the newcomer inherits its count as its error.
                let (least, min) = t
                    .sketch
                    .iter()
                    .min_by_key(|(_, (c, _))| *c)
                    .map(|(v, (c, _))| (v.clone(), *c))
                    .expect("a full sketch has entries");
                t.sketch.remove(&least);
                (min + 1, min)
            }
        };
        t.sketch.insert(value.to_owned(), (count, error));
        if count - error >= PROMOTE_AFTER {
            t.sketch.remove(value);
            t.promoted.insert(value.to_owned());
            return bounded(value);
        }
        OTHER_VALUE.to_owned()
    }
}

/// `value` as a label: control characters dropped, at most
/// [`MAX_VALUE_LABEL`] characters (a longer one cut and ended by eight
/// hex digits of its SHA-256, so two long values stay apart).
fn bounded(value: &str) -> String {
    let clean: String = value.chars().filter(|c| !c.is_control()).collect();
    if clean.chars().count() <= MAX_VALUE_LABEL && clean == value {
        return clean;
    }
    let digest = Sha256::digest(value.as_bytes());
    let tail: String = digest[..4].iter().map(|b| format!("{b:02x}")).collect();
    let head: String = clean.chars().take(MAX_VALUE_LABEL - 9).collect();
    format!("{head}…{tail}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_of_values_makes_at_most_top_k_series_and_the_heaviest_keeps_one() {
        let mut s = DetailedStats::default();
        let mut labels = HashSet::new();
        let mut heavy = Vec::new();
        for i in 0..1000 {
            // The heaviest value in every other request, the rest each
            // seen three times.
            heavy.push(s.label("edge", "user", "user_heavy", 10));
            for _ in 0..3 {
                labels.insert(s.label("edge", "user", &format!("user_{i}"), 10));
            }
        }
        labels.extend(heavy.iter().cloned());
        assert!(labels.len() <= 11, "{} series", labels.len());
        assert!(labels.contains(OTHER_VALUE));
        // From its second request on, for good.
        assert!(heavy[1..].iter().all(|l| l == "user_heavy"), "{heavy:?}");
    }

    #[test]
    fn values_seen_once_never_take_a_slot() {
        let mut s = DetailedStats::default();
        for i in 0..5000 {
            assert_eq!(s.label("edge", "ip", &format!("ip_{i}"), 10), OTHER_VALUE);
        }
        // A repeated value still finds a free slot after the flood.
        s.label("edge", "ip", "ip_x", 10);
        assert_eq!(s.label("edge", "ip", "ip_x", 10), "ip_x");
    }

    #[test]
    fn each_rule_has_its_own_slots() {
        let mut s = DetailedStats::default();
        for rule in ["a", "b"] {
            s.label("edge", rule, "v", 1);
            assert_eq!(s.label("edge", rule, "v", 1), "v");
            s.label("edge", rule, "w", 1);
            assert_eq!(s.label("edge", rule, "w", 1), OTHER_VALUE);
        }
    }

    #[test]
    fn long_or_control_laden_values_are_cut_and_told_apart_by_hash() {
        let a = bounded(&"a".repeat(70_000));
        let b = bounded(&format!("{}b", "a".repeat(69_999)));
        assert_eq!(a.chars().count(), MAX_VALUE_LABEL);
        assert_ne!(a, b);
        let c = bounded("line\nbreak");
        assert!(!c.contains('\n'));
        assert_ne!(c, bounded("linebreak"));
        assert_eq!(bounded("user_alice"), "user_alice");
    }
}
