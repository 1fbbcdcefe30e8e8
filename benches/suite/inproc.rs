//! In process: `Limiter::check` on the memory store against governor's
//! keyed limiter, on one hot key and on a million distinct keys, from one
//! and from two threads.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::{Duration, Instant};

use governor::{Quota, RateLimiter};
use ratewatch::identity::{Identity, IdentityKind};
use ratewatch::policy::StoreSettings;
use ratewatch::telemetry::Telemetry;
use ratewatch::{Limiter, Policy};

pub const DISTINCT: usize = 1_000_000;

/// Which contender a cell measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Who {
    Ratewatch,
    RatewatchNoTelemetry,
    Governor,
}

impl Who {
    pub const ALL: [Who; 3] = [Who::Ratewatch, Who::RatewatchNoTelemetry, Who::Governor];

    pub fn name(self) -> &'static str {
        match self {
            Who::Ratewatch => "ratewatch `Limiter::check`",
            Who::RatewatchNoTelemetry => "ratewatch `Limiter::check`, fleet view off",
            Who::Governor => "governor keyed (`DefaultKeyedRateLimiter<String>`)",
        }
    }
}

type Keyed = governor::DefaultKeyedRateLimiter<String>;

/// Everything the cells share, built once (a million identities take a
/// while to hash).
pub struct Contenders {
    ids: Arc<Vec<Identity>>,
    keys: Arc<Vec<String>>,
}

impl Contenders {
    pub fn new() -> Self {
        let keys: Vec<String> = (0..DISTINCT).map(|i| format!("free_k{i:07}")).collect();
        let ids = keys
            .iter()
            .map(|k| Identity::keyed(IdentityKind::ApiKey, k.clone(), &crate::serve::bench_key()))
            .collect();
        Self {
            ids: Arc::new(ids),
            keys: Arc::new(keys),
        }
    }

    /// One identity only (the hot-key cells), quick to build.
    pub fn hot() -> Self {
        let key = "free_k0000000".to_owned();
        Self {
            ids: Arc::new(vec![Identity::keyed(
                IdentityKind::ApiKey,
                key.clone(),
                &crate::serve::bench_key(),
            )]),
            keys: Arc::new(vec![key]),
        }
    }

    /// Decisions per second of `who`, `threads` threads for `secs`, on one
    /// key or on all of them. Every contender starts from empty state.
    pub fn measure(&self, who: Who, distinct: bool, threads: usize, secs: f64) -> f64 {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        let policy: Policy = crate::serve::policy(1, StoreSettings::default());
        let limiter = rt.block_on(async {
            let mut b = Limiter::builder(policy);
            if who == Who::RatewatchNoTelemetry {
                b = b.with_telemetry(Telemetry::disabled());
            }
            b.build().await.expect("limiter")
        });
        let quota = Quota::per_second(NonZeroU32::new(1_000_000_000).expect("nonzero"));
        let governor: Arc<Keyed> = Arc::new(RateLimiter::keyed(quota));
        let deadline = Instant::now() + Duration::from_secs_f64(secs);
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let limiter = limiter.clone();
                let governor = governor.clone();
                let ids = self.ids.clone();
                let keys = self.keys.clone();
                std::thread::spawn(move || {
                    let rt = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .expect("runtime");
                    let mut n: u64 = 0;
                    // Threads walk the keys from different points.
                    let mut i = t * DISTINCT / 2;
                    rt.block_on(async {
                        loop {
                            for _ in 0..256 {
                                let k = if distinct { i % DISTINCT } else { 0 };
                                i += 1;
                                match who {
                                    Who::Governor => {
                                        let ok = governor.check_key(&keys[k]).is_ok();
                                        std::hint::black_box(ok);
                                    }
                                    _ => {
                                        let d = limiter.check(&ids[k], "free", None).await;
                                        std::hint::black_box(d.allowed);
                                    }
                                }
                            }
                            n += 256;
                            if Instant::now() >= deadline {
                                break;
                            }
                        }
                    });
                    n
                })
            })
            .collect();
        let started = Instant::now();
        let total: u64 = handles
            .into_iter()
            .map(|h| h.join().expect("bench thread"))
            .sum();
        let elapsed = started.elapsed().as_secs_f64().max(secs);
        drop(limiter);
        rt.shutdown_background();
        total as f64 / elapsed
    }

    /// Makes exactly `n` decisions of `who` on one thread (the hot key, or
    /// every key in turn), for instruction counts that do not depend on
    /// the machine's load: run it under `valgrind --tool=callgrind` with two
    /// values of `n` and divide the difference.
    pub fn count(&self, who: Who, distinct: bool, n: u64) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let policy: Policy = crate::serve::policy(1, StoreSettings::default());
        rt.block_on(async {
            let mut b = Limiter::builder(policy);
            if who == Who::RatewatchNoTelemetry {
                b = b.with_telemetry(Telemetry::disabled());
            }
            let limiter = b.build().await.expect("limiter");
            let quota = Quota::per_second(NonZeroU32::new(1_000_000_000).expect("nonzero"));
            let governor: Keyed = RateLimiter::keyed(quota);
            for i in 0..n as usize {
                let k = if distinct { i % self.ids.len() } else { 0 };
                if who == Who::Governor {
                    std::hint::black_box(governor.check_key(&self.keys[k]).is_ok());
                } else {
                    let d = limiter.check(&self.ids[k], "free", None).await;
                    std::hint::black_box(d.allowed);
                }
            }
        });
    }
}
