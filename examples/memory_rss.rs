//! Resident memory of the memory store when one client invents a new API
//! key for every request: the worst case for an in-process store.
//!
//! cargo run --release --example memory_rss [-- REQUESTS [MAX_ENTRIES]]
//!
//! Each request is admitted and writes three long-lived entries (burst,
//! minute, day), so only the `max_entries` cap bounds the store. Prints the
//! resident set before, at the peak and after the entries expired and were
//! swept (Linux: `/proc/self/status`).

use std::sync::Arc;
use std::time::Duration;

use ratewatch::clock::{Clock, ManualClock, SystemClock};
use ratewatch::identity::{Identity, IdentityKind};
use ratewatch::store::MemoryStore;
use ratewatch::{Limit, Limiter, Policy, Tier};

/// A field of `/proc/self/status` in kB (`VmRSS`, `VmHWM`), or 0 elsewhere.
fn status_kb(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
        .unwrap_or(0)
}

fn mb(kb: u64) -> f64 {
    kb as f64 / 1024.0
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let requests: u64 = args.next().map_or(Ok(10_000_000), |a| a.parse())?;
    let policy = Policy::builder()
        .tier(
            Tier::new("free")
                .match_prefix("free_")
                .limit(Limit::token_bucket("burst", 10, 0.33))
                .limit(Limit::sliding_window("minute", 20, Duration::from_secs(60)))
                .limit(Limit::fixed_window(
                    "day",
                    1000,
                    Duration::from_secs(86_400),
                )),
        )
        .tier(Tier::new("anonymous").limit(Limit::token_bucket("burst", 30, 1.0)))
        .build()?;
    let max_entries = match args.next() {
        Some(a) => a.parse()?,
        None => policy.store.max_entries,
    };
    // Time stands still while the client floods, so nothing expires: the
    // cap alone holds the store.
    let clock = ManualClock::new(SystemClock.now_us());
    let store = MemoryStore::with_clock(Arc::new(clock.clone())).with_max_entries(max_entries);
    let limiter = Limiter::builder(policy)
        .with_store(Arc::new(store.clone()))
        .with_clock(Arc::new(clock.clone()))
        .build()
        .await?;

    let before = status_kb("VmRSS");
    let ip = Some("192.0.2.7".parse()?);
    let started = std::time::Instant::now();
    for i in 0..requests {
        let caller = Identity::new(IdentityKind::ApiKey, format!("free_{i:016x}")).with_ip(ip);
        let d = limiter.check(&caller, "free", None).await;
        assert!(d.allowed, "every invented key is admitted");
    }
    let took = started.elapsed();
    let held = store.len();
    let peak = status_kb("VmHWM");
    let at_end = status_kb("VmRSS");

    // Two days later every entry has expired; a sweep drops them and
    // shrinks the maps.
    clock.advance_us(2 * 86_400 * 1_000_000);
    store.sweep();
    let after = status_kb("VmRSS");

    println!("requests (invented keys): {requests} in {took:.1?}");
    println!("max_entries:              {max_entries}");
    println!("entries held at the end:  {held}");
    println!("evictions:                {}", store.evictions());
    println!("RSS before:               {:.0} MB", mb(before));
    println!("RSS peak (VmHWM):         {:.0} MB", mb(peak));
    println!("RSS after the flood:      {:.0} MB", mb(at_end));
    println!(
        "bytes per entry held:     {:.0}",
        (at_end.saturating_sub(before) * 1024) as f64 / held.max(1) as f64
    );
    println!("RSS after expiry + sweep: {:.0} MB", mb(after));
    Ok(())
}
