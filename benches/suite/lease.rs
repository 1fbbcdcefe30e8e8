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

/// Three servers sharing one identity at a moderate rate each: what the
/// leases cost in script calls, and what each window admitted.
#[derive(Debug, Clone, Default)]
pub struct FleetRun {
    /// The identity's limit, per one-second window.
    pub limit: u64,
    /// Decisions made (all servers).
    pub decisions: u64,
    /// Of them admitted.
    pub admitted: u64,
    /// Script calls meanwhile (decide takes, per-request decisions in the
    /// tail, refunds: every `EVALSHA`).
    pub calls: u64,
    /// Windows counted whole (the first and last partial ones left out).
    pub windows: usize,
    /// The most any counted window admitted, counting only decisions
    /// asked and answered inside it (decided in it for sure).
    pub max_admitted: u64,
    /// Admissions above the limit, summed over counted windows.
    pub overshoot: u64,
}

impl FleetRun {
    /// Decisions per script call.
    pub fn per_call(&self) -> f64 {
        self.decisions as f64 / self.calls.max(1) as f64
    }
}

/// Instances of the fleet run, the rate each decides at (decisions per
/// second) and the window of its limit, µs.
pub const FLEET_SERVERS: usize = 3;
pub const FLEET_RATE: f64 = 300.0;
/// The identity's limits per second the fleet runs under: one the three
/// servers' 900/s never reach, one they press (a third refused).
pub const FLEET_LIMITS: [u64; 2] = [100_000, 600];
const FLEET_WINDOW_US: u64 = 1_000_000;

fn unix_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// [`FLEET_SERVERS`] limiters (each its own instance, `expected_instances
/// = 3`, the default lease settings) on the Redis at `port`, one identity
/// whose only limit is a leased fixed window of `limit` per second, each
/// deciding [`FLEET_RATE`] times a second, paced, for `secs` after one
/// second of warm-up.
pub fn fleet(redis_url: &str, port: u16, limit: u64, secs: f64) -> FleetRun {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
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
                Limit::fixed_window("second", limit, Duration::from_secs(1))
                    .with_mode(LeaseMode::Leased),
            ),
        )
        .tier(Tier::new("anonymous").limit(Limit::per_second("burst", 10)))
        .build()
        .expect("a valid lease policy");
    // A fresh identity per run: no state left from an earlier one.
    let id = Identity::new(
        IdentityKind::ApiKey,
        format!("free_fleet_{limit}_{}", unix_us()),
    );
    let limiters: Vec<Limiter> = rt.block_on(async {
        let mut v = Vec::new();
        for _ in 0..FLEET_SERVERS {
            v.push(Limiter::new(policy.clone()).await.expect("limiter"));
        }
        v
    });
    let warm_until = unix_us() + 1_000_000;
    let start = warm_until - warm_until % FLEET_WINDOW_US + FLEET_WINDOW_US;
    let end = start + (secs * 1e6) as u64;
    let mut calls_before = None;
    let shots: Vec<(u64, u64, bool)> = rt.block_on(async {
        let tasks: Vec<_> = limiters
            .iter()
            .map(|l| {
                let (l, id) = (l.clone(), id.clone());
                tokio::spawn(async move {
                    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / FLEET_RATE));
                    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
                    let mut out = Vec::new();
                    loop {
                        tick.tick().await;
                        let sent = unix_us();
                        if sent >= end {
                            break;
                        }
                        let d = l.check(&id, "free", None).await;
                        out.push((sent, unix_us(), d.allowed));
                    }
                    out
                })
            })
            .collect();
        // Calls are counted from the first counted window on.
        let now = unix_us();
        if start > now {
            tokio::time::sleep(Duration::from_micros(start - now)).await;
        }
        calls_before = Some(evalsha_calls(port));
        let mut all = Vec::new();
        for t in tasks {
            all.extend(t.await.expect("pacer"));
        }
        all
    });
    let calls = evalsha_calls(port).saturating_sub(calls_before.unwrap_or(0));
    let counted: Vec<_> = shots.iter().filter(|s| s.0 >= start).collect();
    let windows = ((end - start) / FLEET_WINDOW_US) as usize;
    let mut per_window = vec![0u64; windows];
    for &&(sent, answered, allowed) in &counted {
        let w = ((sent - start) / FLEET_WINDOW_US) as usize;
        if allowed && w < windows && (answered - start) / FLEET_WINDOW_US == w as u64 {
            per_window[w] += 1;
        }
    }
    for l in limiters {
        rt.block_on(l.shutdown());
    }
    rt.shutdown_background();
    FleetRun {
        limit,
        decisions: counted.len() as u64,
        admitted: counted.iter().filter(|s| s.2).count() as u64,
        calls,
        windows,
        max_admitted: per_window.iter().copied().max().unwrap_or(0),
        overshoot: per_window.iter().map(|&n| n.saturating_sub(limit)).sum(),
    }
}
