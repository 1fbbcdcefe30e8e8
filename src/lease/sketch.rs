//! Decision rates per key in bounded memory: an exponentially decayed
//! count-min sketch.
//!
//! Each of [`DEPTH`] rows has [`WIDTH`] cells; a key adds its cost to one
//! cell per row, chosen by independent hashes, and its rate is the smallest
//! of its cells (collisions only ever add, so the estimate is never low, and
//! is high only when every row collides with a hotter key). A cell holds
//! `value` decayed with time constant `TAU`: at a steady rate `r` it settles
//! at `r × TAU`, so `value / TAU` estimates the rate. Memory is fixed
//! (`DEPTH × WIDTH` words) whatever the number of keys; updates are
//! lock-free compare-and-swaps.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::clock::Micros;

/// Rows (independent hashes).
pub(crate) const DEPTH: usize = 2;
/// Cells per row.
pub(crate) const WIDTH: usize = 4096;
/// The decay's time constant, in seconds: long enough that a steady rate's
/// estimate moves a few percent between decisions, short enough that a key
/// that cools is seen within a few seconds.
pub(crate) const TAU: f64 = 0.5;

/// A decayed rate estimate: `value` units at time `at`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Ewma {
    value: f64,
    at: Micros,
}

impl Ewma {
    /// Adds `units` at `now` and returns the rate in units per second.
    pub(crate) fn add(&mut self, now: Micros, units: f64) -> f64 {
        self.value = self.decayed(now) + units;
        self.at = self.at.max(now);
        self.value / TAU
    }

    /// An estimate already at `rate` units per second at `now` (a key that
    /// enters lease mode keeps the rate the sketch saw).
    pub(crate) fn starting_at(rate: f64, now: Micros) -> Self {
        Self {
            value: rate * TAU,
            at: now,
        }
    }

    /// The rate at `now`, without adding anything.
    pub(crate) fn rate(&self, now: Micros) -> f64 {
        self.decayed(now) / TAU
    }

    fn decayed(&self, now: Micros) -> f64 {
        let dt = now.saturating_sub(self.at) as f64 / 1e6;
        self.value * (-dt / TAU).exp()
    }
}

/// The sketch. A cell packs its value (an `f32`) and the time it was last
/// decayed to (milliseconds since the sketch started, wrapping after 49
/// days, which only ever makes one update decay too much).
pub(crate) struct RateSketch {
    cells: Box<[AtomicU64]>,
    origin: Micros,
}

impl RateSketch {
    /// An empty sketch whose time starts at `origin`.
    pub(crate) fn new(origin: Micros) -> Self {
        Self {
            cells: (0..DEPTH * WIDTH).map(|_| AtomicU64::new(0)).collect(),
            origin,
        }
    }

    /// Adds `units` to `key`'s cells at `now`; returns its estimated rate in
    /// units per second.
    pub(crate) fn add(&self, key: u64, now: Micros, units: f64) -> f64 {
        let ms = (now.saturating_sub(self.origin) / 1000) as u32;
        let mut rate = f64::INFINITY;
        for row in 0..DEPTH {
            let cell = &self.cells[row * WIDTH + index(key, row)];
            let mut old = cell.load(Ordering::Relaxed);
            loop {
                let (value, at) = unpack(old);
                // Signed: a thread that read the clock just before another
                // one wrote the cell sees `at` ahead of it. Unsigned, that
                // wrapped to 49 days and wiped a hot key's estimate, so
                // under concurrent load it might never look hot.
                let ahead = (ms.wrapping_sub(at) as i32) < 0;
                let dt = if ahead {
                    0.0
                } else {
                    ms.wrapping_sub(at) as f64 / 1000.0
                };
                let stamp = if ahead { at } else { ms };
                let decayed = if at == 0 && value == 0.0 {
                    0.0
                } else {
                    f64::from(value) * (-dt / TAU).exp()
                };
                let new_value = decayed + units;
                match cell.compare_exchange_weak(
                    old,
                    pack(new_value as f32, stamp),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => {
                        rate = rate.min(new_value / TAU);
                        break;
                    }
                    Err(now_held) => old = now_held,
                }
            }
        }
        rate
    }
}

fn index(key: u64, row: usize) -> usize {
    // Two halves of a 64-bit hash, remixed per row, are independent enough
    // for two rows.
    let mixed = key
        .rotate_left(32 * row as u32)
        .wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (mixed >> 52) as usize % WIDTH
}

fn pack(value: f32, ms: u32) -> u64 {
    (u64::from(value.to_bits()) << 32) | u64::from(ms)
}

fn unpack(v: u64) -> (f32, u32) {
    (f32::from_bits((v >> 32) as u32), v as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `rate` units per second to `key` for `secs` seconds, from `t`.
    fn feed(s: &RateSketch, key: u64, t: &mut Micros, rate: u64, secs: u64) -> f64 {
        let step = 1_000_000 / rate;
        let mut last = 0.0;
        for _ in 0..rate * secs {
            *t += step;
            last = s.add(key, *t, 1.0);
        }
        last
    }

    #[test]
    fn a_clock_read_a_moment_before_the_last_update_keeps_the_estimate() {
        let s = RateSketch::new(0);
        for i in 0..1_000 {
            s.add(7, 1_000_000 + i, 1.0);
        }
        // Another worker read the clock 1 ms earlier and updates now.
        let rate = s.add(7, 999_000, 1.0);
        assert!(rate > 1_000.0, "the estimate was wiped: {rate}/s");
    }

    #[test]
    fn a_steady_rate_is_estimated_within_ten_percent() {
        let s = RateSketch::new(0);
        let mut t = 0;
        let r = feed(&s, 42, &mut t, 200, 5);
        assert!((180.0..=220.0).contains(&r), "{r}");
    }

    #[test]
    fn a_cold_key_beside_a_hot_one_reads_cold() {
        let s = RateSketch::new(0);
        let mut t = 0;
        feed(&s, 1, &mut t, 1000, 2);
        let cold = s.add(2, t, 1.0);
        assert!(cold < 10.0, "{cold}");
    }

    #[test]
    fn a_key_that_stops_decays_to_nothing() {
        let s = RateSketch::new(0);
        let mut t = 0;
        feed(&s, 7, &mut t, 500, 2);
        let later = s.add(7, t + 5_000_000, 0.0);
        assert!(later < 1.0, "{later}");
    }

    #[test]
    fn the_ewma_settles_at_the_rate() {
        let mut e = Ewma::default();
        let mut r = 0.0;
        for i in 1..=1000u64 {
            r = e.add(i * 10_000, 1.0);
        }
        assert!((90.0..=110.0).contains(&r), "{r}");
        assert!(e.rate(10_000_000 + 5_000_000) < 1.0);
    }
}
