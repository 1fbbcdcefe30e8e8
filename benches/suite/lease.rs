//! One hot key in lease mode against a real Redis, in process:
//! `Limiter::check` from two threads on one identity whose only limit is
//! `mode = "leased"`, beside the redis-benchmark EVALSHA ceiling of the
//! same run, with the Redis commands it cost (`INFO commandstats`).

use std::time::{Duration, Instant};

use ratewatch::identity::{Identity, IdentityKind};
use ratewatch::policy::{LeaseMode, LeaseSettings, StoreKind};
use ratewatch::{Limit, Limiter, Policy, Tier};

/// What one measurement saw.
#[derive(Debug, Clone, Copy)]
pub struct LeaseRun {
    /// Decisions per second.
    pub ops: f64,
    /// Decisions made.
    pub decisions: u64,
    /// Decide-script calls (`EVALSHA`, from `INFO commandstats`)
    /// meanwhile: every Redis command sent for the key. The fleet view's
    /// own flushes (a pipeline per second, for all keys) are not counted.
    pub commands: u64,
}

impl LeaseRun {
    /// Decisions per Redis command.
    pub fn per_command(&self) -> f64 {
        self.decisions as f64 / self.commands.max(1) as f64
    }
}

/// Decide-script calls on the node at `port`.
fn evalsha_calls(port: u16) -> u64 {
    crate::support::command_calls(port, "evalsha")
}

/// `threads` threads of `Limiter::check` on one leased key for `secs`.
pub fn measure(redis_url: &str, port: u16, threads: usize, secs: f64) -> LeaseRun {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let policy = Policy::builder()
        .store(crate::serve::redis_settings(
            StoreKind::Redis,
            &[redis_url.to_owned()],
        ))
        .leases(LeaseSettings::default())
        .tier(
            Tier::new("free").match_prefix("free_").limit(
                Limit::fixed_window("hour", 1_000_000_000, Duration::from_secs(3600))
                    .with_mode(LeaseMode::Leased),
            ),
        )
        .tier(Tier::new("anonymous").limit(Limit::per_second("burst", 10)))
        .build()
        .expect("a valid lease policy");
    let limiter = rt.block_on(async { Limiter::new(policy).await.expect("limiter") });
    let id = Identity::new(IdentityKind::ApiKey, crate::serve::API_KEY);
    // Warm: the script loaded, the key in lease mode.
    rt.block_on(async {
        for _ in 0..1000 {
            limiter.check(&id, "free", None).await;
        }
    });
    let before = evalsha_calls(port);
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let started = Instant::now();
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let (limiter, id) = (limiter.clone(), id.clone());
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("runtime");
                let mut n: u64 = 0;
                rt.block_on(async {
                    while Instant::now() < deadline {
                        for _ in 0..256 {
                            let d = limiter.check(&id, "free", None).await;
                            std::hint::black_box(d.allowed);
                        }
                        n += 256;
                    }
                });
                n
            })
        })
        .collect();
    let decisions: u64 = handles.into_iter().map(|h| h.join().expect("thread")).sum();
    let elapsed = started.elapsed().as_secs_f64().max(secs);
    let commands = evalsha_calls(port).saturating_sub(before);
    drop(limiter);
    rt.shutdown_background();
    LeaseRun {
        ops: decisions as f64 / elapsed,
        decisions,
        commands,
    }
}
