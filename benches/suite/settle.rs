//! Settling after the response: `Limiter::reserve` + `Reservation::settle`
//! (a refund: two store calls) against a plain `Limiter::check_cost` of
//! the same cost, one thread, on the memory store and on a real Redis.
//! `cargo bench --bench suite -- settle SECS` runs it alone.

use std::time::{Duration, Instant};

use ratewatch::identity::{Identity, IdentityKind};
use ratewatch::policy::StoreKind;
use ratewatch::{Limit, Limiter, Policy, Tier};

/// Decisions per second, plain and settled, on each store.
#[derive(Debug, Clone, Copy)]
pub struct SettleRun {
    pub memory_plain: f64,
    pub memory_settled: f64,
    pub redis_plain: f64,
    pub redis_settled: f64,
}

impl SettleRun {
    /// Settled requests per second over plain decisions, memory.
    pub fn memory_ratio(&self) -> f64 {
        self.memory_settled / self.memory_plain
    }

    /// Settled requests per second over plain decisions, Redis.
    pub fn redis_ratio(&self) -> f64 {
        self.redis_settled / self.redis_plain
    }
}

fn policy(redis_url: Option<&str>) -> Policy {
    let mut b = Policy::builder()
        .tier(
            Tier::new("free")
                .match_prefix("free_")
                .limit(Limit::fixed_window(
                    "tokens",
                    1_000_000_000_000,
                    Duration::from_secs(3600),
                )),
        )
        .tier(Tier::new("anonymous").limit(Limit::per_second("burst", 10)));
    if let Some(url) = redis_url {
        b = b.store(crate::serve::redis_settings(
            StoreKind::Redis,
            &[url.to_owned()],
        ));
    }
    b.build().expect("a valid policy")
}

/// Each for `secs`: plain decisions, then reserve + settle.
async fn pair(limiter: &Limiter, secs: f64) -> (f64, f64) {
    let id = Identity::new(IdentityKind::ApiKey, crate::serve::API_KEY);
    for _ in 0..500 {
        limiter.check_cost(&id, "free", None, 5).await;
    }
    let run = |settle: bool| {
        let (limiter, id) = (limiter.clone(), id.clone());
        async move {
            let deadline = Instant::now() + Duration::from_secs_f64(secs);
            let started = Instant::now();
            let mut n: u64 = 0;
            while Instant::now() < deadline {
                for _ in 0..64 {
                    if settle {
                        let (d, r) = limiter.reserve(&id, "free", None, 5).await;
                        std::hint::black_box(d.allowed);
                        if let Some(r) = r {
                            std::hint::black_box(r.settle(3).await);
                        }
                    } else {
                        let d = limiter.check_cost(&id, "free", None, 5).await;
                        std::hint::black_box(d.allowed);
                    }
                }
                n += 64;
            }
            n as f64 / started.elapsed().as_secs_f64()
        }
    };
    (run(false).await, run(true).await)
}

/// Both stores, `secs` per measurement.
pub fn measure(redis_url: &str, secs: f64) -> SettleRun {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let memory = Limiter::new(policy(None)).await.expect("limiter");
        let (memory_plain, memory_settled) = pair(&memory, secs).await;
        let redis = Limiter::new(policy(Some(redis_url)))
            .await
            .expect("limiter");
        let (redis_plain, redis_settled) = pair(&redis, secs).await;
        SettleRun {
            memory_plain,
            memory_settled,
            redis_plain,
            redis_settled,
        }
    })
}
