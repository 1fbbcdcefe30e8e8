//! In-flight acquire and release against a plain decision, in process:
//! `Limiter::check` on one identity whose limit is a token bucket (plain),
//! or that bucket and an in-flight limit (the decision takes a slot, and
//! dropping it gives the slot back), on the memory store and on a real
//! Redis. One thread; the figure is the ratio of the two rates.
//!
//! On the memory store the release runs in process when the decision is
//! dropped. On Redis it is a second script call from a spawned task, so
//! each in-flight request costs two round trips; the loop waits for every
//! release it caused before it stops the clock (the slots gauge is back
//! to zero), so releases are paid for, not left behind.

use std::time::{Duration, Instant};

use ratewatch::identity::{Identity, IdentityKind};
use ratewatch::policy::StoreKind;
use ratewatch::{Limit, Limiter, Policy, Tier};

/// Decisions per second, plain and with an in-flight slot taken and given
/// back.
#[derive(Debug, Clone, Copy)]
pub struct InflightRun {
    /// Plain decisions per second.
    pub plain: f64,
    /// Decisions that took and gave back a slot, per second.
    pub inflight: f64,
}

fn policy(redis_url: Option<&str>, inflight: bool) -> Policy {
    let mut tier = Tier::new("free")
        .match_prefix("free_")
        .limit(Limit::token_bucket("burst", 1_000_000_000, 1_000_000.0));
    if inflight {
        tier = tier.limit(Limit::concurrency("inflight", 1_000_000));
    }
    let mut b = Policy::builder()
        .tier(tier)
        .tier(Tier::new("anonymous").limit(Limit::per_second("burst", 10)));
    if let Some(url) = redis_url {
        b = b.store(crate::serve::redis_settings(
            StoreKind::Redis,
            &[url.to_owned()],
        ));
    }
    b.build().expect("a valid policy")
}

fn rate(rt: &tokio::runtime::Runtime, limiter: &Limiter, secs: f64) -> f64 {
    let id = Identity::new(IdentityKind::ApiKey, crate::serve::API_KEY);
    rt.block_on(async {
        for _ in 0..200 {
            limiter.check(&id, "free", None).await;
        }
        // The warm-up's releases done, the tasks alive now are the
        // limiter's own (sweeper, renewals, telemetry).
        tokio::time::sleep(Duration::from_millis(200)).await;
        let metrics = tokio::runtime::Handle::current().metrics();
        let baseline = metrics.num_alive_tasks();
        let started = Instant::now();
        let deadline = started + Duration::from_secs_f64(secs);
        let mut n: u64 = 0;
        while Instant::now() < deadline {
            for _ in 0..64 {
                let d = limiter.check(&id, "free", None).await;
                assert!(d.allowed);
                drop(d);
            }
            n += 64;
        }
        // Releases spawned on Redis: the clock stops once they are done,
        // so they are paid for: when no more tasks are alive than before
        // the loop, or (a task of the store's own may have started
        // meanwhile) when the count has not moved for 20 ms, which are
        // not counted.
        let drain = Instant::now();
        let (mut last, mut still) = (metrics.num_alive_tasks(), Instant::now());
        let mut settle = Duration::ZERO;
        while metrics.num_alive_tasks() > baseline {
            tokio::time::sleep(Duration::from_micros(100)).await;
            let now = metrics.num_alive_tasks();
            if now != last {
                (last, still) = (now, Instant::now());
            } else if still.elapsed() >= Duration::from_millis(20) {
                settle = still.elapsed();
                break;
            }
        }
        eprintln!(
            "bench: in-flight: {} tasks alive after the loop ({baseline} before), drained in {:?}",
            metrics.num_alive_tasks(),
            drain.elapsed() - settle
        );
        n as f64 / (started.elapsed() - settle).as_secs_f64()
    })
}

/// Both rates on `redis_url` (or the memory store), `secs` each.
pub fn measure(redis_url: Option<&str>, secs: f64) -> InflightRun {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let plain = rt
        .block_on(Limiter::new(policy(redis_url, false)))
        .expect("limiter");
    let held = rt
        .block_on(Limiter::new(policy(redis_url, true)))
        .expect("limiter");
    let run = InflightRun {
        plain: rate(&rt, &plain, secs),
        inflight: rate(&rt, &held, secs),
    };
    drop((plain, held));
    rt.shutdown_timeout(Duration::from_secs(2));
    run
}
