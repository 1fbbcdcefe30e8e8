//! Handles of the unit, settle and decision-service counters, the
//! in-flight gauge and the Redis round-trip and decision-service latency
//! histograms, kept per thread by their labels' text.
//!
//! A metered decision counts its units (`ratewatch_cost_units_total`,
//! `ratewatch_units_charged_total`), a settle its outcome and units, a
//! decision-service request each descriptor's outcome and its latency, a
//! decision on Redis its round trip, and every slot moves
//! `ratewatch_inflight_slots` twice. Asking the recorder for a labelled
//! series builds its key (an owned `String` per label), hashes it and looks
//! it up under a lock: about 1.2 k instructions a call, a third of what a
//! three-unit decision cost beyond its limits. Each thread keeps the
//! handles it has used instead, found by comparing the labels' text (short
//! policy names), so nothing is allocated on a hit and a reload's new
//! strings of the same text are the same series, as they are to the
//! recorder.
//!
//! As with the decision counters (`counters`), only handles of ratewatch's
//! own global recorder are kept: under a scoped or application recorder
//! every call takes the uncached path, and so does a thread whose cache is
//! full (label values are policy names, so a thread sees few series).

use std::cell::RefCell;
use std::sync::Arc;

use metrics::{Counter, Gauge, Histogram, Label, counter, gauge, histogram};

/// Most series one thread keeps handles for, per kind; past it, the
/// uncached path.
const MAX_CACHED: usize = 64;

/// One series: its family, two labels, an optional third with a fixed
/// value (an outcome) and the limiter's name (`None`: an unnamed limiter,
/// no `limiter` label).
pub(crate) struct Series<'a> {
    /// The family's name.
    pub(crate) family: &'static str,
    /// The first label's name and value.
    pub(crate) first: (&'static str, &'a str),
    /// The second label's name and value.
    pub(crate) second: (&'static str, &'a str),
    /// A third label whose values are constants (`outcome`, `direction`).
    pub(crate) third: Option<(&'static str, &'static str)>,
    /// The limiter's name, if it is named.
    pub(crate) limiter: Option<&'a Arc<str>>,
}

impl<'a> Series<'a> {
    /// A series of two labels, for an unnamed limiter.
    pub(crate) fn two(
        family: &'static str,
        first: (&'static str, &'a str),
        second: (&'static str, &'a str),
    ) -> Self {
        Self {
            family,
            first,
            second,
            third: None,
            limiter: None,
        }
    }

    /// The same series with a third label of a constant value.
    pub(crate) fn and(self, name: &'static str, value: &'static str) -> Self {
        Self {
            third: Some((name, value)),
            ..self
        }
    }

    fn labels(&self) -> Vec<Label> {
        let mut labels = Vec::with_capacity(4);
        labels.push(Label::new(self.first.0, self.first.1.to_owned()));
        labels.push(Label::new(self.second.0, self.second.1.to_owned()));
        if let Some((name, value)) = self.third {
            labels.push(Label::from_static_parts(name, value));
        }
        super::metrics::push_limiter(&mut labels, self.limiter);
        labels
    }
}

/// A cached handle and the labels it was asked for.
struct Entry<H> {
    family: &'static str,
    first: (&'static str, Box<str>),
    second: (&'static str, Box<str>),
    third: Option<(&'static str, &'static str)>,
    limiter: Option<Arc<str>>,
    handle: H,
}

impl<H> Entry<H> {
    fn is(&self, s: &Series<'_>) -> bool {
        self.family == s.family
            && self.first.0 == s.first.0
            && *self.first.1 == *s.first.1
            && self.second.0 == s.second.0
            && *self.second.1 == *s.second.1
            && self.third == s.third
            && self.limiter.as_deref() == s.limiter.map(|l| &**l)
    }
}

thread_local! {
    static COUNTERS: RefCell<Vec<Entry<Counter>>> = const { RefCell::new(Vec::new()) };
    static GAUGES: RefCell<Vec<Entry<Gauge>>> = const { RefCell::new(Vec::new()) };
    static HISTOGRAMS: RefCell<Vec<Entry<Histogram>>> = const { RefCell::new(Vec::new()) };
    static ONE_LABEL_HISTOGRAMS: RefCell<Vec<StaticEntry<Histogram>>> = const { RefCell::new(Vec::new()) };
}

/// A cached handle of a series whose one label has a constant value.
type StaticEntry<H> = (&'static str, (&'static str, &'static str), H);

/// Adds `n` to the counter `s` names.
pub(crate) fn add(s: &Series<'_>, n: u64) {
    apply(&COUNTERS, s, |l| counter!(s.family, l), |c| c.increment(n));
}

/// Moves the gauge `s` names by `delta`.
pub(crate) fn shift(s: &Series<'_>, delta: f64) {
    apply(&GAUGES, s, |l| gauge!(s.family, l), |g| g.increment(delta));
}

/// Records `value` in the histogram `s` names.
pub(crate) fn observe(s: &Series<'_>, value: f64) {
    apply(
        &HISTOGRAMS,
        s,
        |l| histogram!(s.family, l),
        |h| h.record(value),
    );
}

/// Runs `change` on the handle of `s`: this thread's, kept in `cache`,
/// under ratewatch's own recorder; else one `make` asks the recorder for.
fn apply<H>(
    cache: &'static std::thread::LocalKey<RefCell<Vec<Entry<H>>>>,
    s: &Series<'_>,
    make: impl Fn(Vec<Label>) -> H,
    change: impl Fn(&H),
) {
    let cached = super::counters::own_recorder_in_force()
        && cache.with_borrow_mut(|c| with_handle(c, s, &make, &change));
    if !cached {
        change(&make(s.labels()));
    }
}

/// Records `value` in the histogram `family` of the one constant label
/// `label` (`api="grpc"`).
pub(crate) fn record(family: &'static str, label: (&'static str, &'static str), value: f64) {
    let cached = super::counters::own_recorder_in_force()
        && ONE_LABEL_HISTOGRAMS.with_borrow_mut(|cache| {
            if let Some((_, _, h)) = cache.iter().find(|(f, l, _)| *f == family && *l == label) {
                h.record(value);
                return true;
            }
            if cache.len() >= MAX_CACHED {
                return false;
            }
            let h = histogram!(family, label.0 => label.1);
            h.record(value);
            cache.push((family, label, h));
            true
        });
    if !cached {
        histogram!(family, label.0 => label.1).record(value);
    }
}

/// Runs `apply` on `s`'s handle from `cache`, made by `make` (and kept) on
/// a miss; `false` when the cache is full and `s` is not in it.
fn with_handle<H>(
    cache: &mut Vec<Entry<H>>,
    s: &Series<'_>,
    make: impl FnOnce(Vec<Label>) -> H,
    apply: impl FnOnce(&H),
) -> bool {
    if let Some(e) = cache.iter().find(|e| e.is(s)) {
        apply(&e.handle);
        return true;
    }
    if cache.len() >= MAX_CACHED {
        return false;
    }
    let handle = make(s.labels());
    apply(&handle);
    cache.push(Entry {
        family: s.family,
        first: (s.first.0, s.first.1.into()),
        second: (s.second.0, s.second.1.into()),
        third: s.third,
        limiter: s.limiter.cloned(),
        handle,
    });
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series<'a>(tier: &'a str, unit: &'a str, limiter: Option<&'a Arc<str>>) -> Series<'a> {
        Series {
            family: "f",
            first: ("tier", tier),
            second: ("unit", unit),
            third: None,
            limiter,
        }
    }

    #[test]
    fn a_handle_is_found_by_every_label_and_only_by_them() {
        let named: Arc<str> = Arc::from("edge");
        let other: Arc<str> = Arc::from("edge");
        let mut cache: Vec<Entry<u32>> = Vec::new();
        let mut made = 0;
        let mut touch = |s: &Series<'_>| {
            let mut seen = None;
            assert!(with_handle(
                &mut cache,
                s,
                |_| {
                    made += 1;
                    made
                },
                |h| seen = Some(*h)
            ));
            seen.expect("applied")
        };
        let a = touch(&series("free", "tokens", None));
        assert_eq!(touch(&series("free", "tokens", None)), a);
        let b = touch(&series("free", "requests", None));
        let c = touch(&series("pro", "tokens", None));
        let d = touch(&series("free", "tokens", Some(&named)));
        // The same name in another allocation is the same series.
        assert_eq!(touch(&series("free", "tokens", Some(&other))), d);
        let ids: std::collections::HashSet<u32> = [a, b, c, d].into();
        assert_eq!(ids.len(), 4, "every label tells series apart");
        assert_eq!(made, 4);
    }

    #[test]
    fn a_full_cache_keeps_what_it_has_and_refuses_the_rest() {
        let mut cache: Vec<Entry<usize>> = Vec::new();
        let names: Vec<String> = (0..=MAX_CACHED).map(|i| format!("t{i}")).collect();
        for (i, n) in names.iter().enumerate() {
            let kept = with_handle(&mut cache, &series(n, "u", None), |_| i, |_| {});
            assert_eq!(kept, i < MAX_CACHED, "series {i}");
        }
        assert_eq!(cache.len(), MAX_CACHED);
        let mut seen = None;
        assert!(with_handle(
            &mut cache,
            &series("t0", "u", None),
            |_| usize::MAX,
            |h| seen = Some(*h)
        ));
        assert_eq!(seen, Some(0));
    }
}
