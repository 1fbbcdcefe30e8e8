//! A request costing more than a limit can ever admit is refused with no
//! retry time (waiting would never let it pass) and charges nothing; a
//! cost of 0 only looks.

use std::time::Duration;

use ratewatch::identity::{Identity, IdentityKind};
use ratewatch::{Limit, Limiter, Policy, Tier};

async fn limiter() -> Limiter {
    Limiter::new(
        Policy::builder()
            .tier(Tier::new("free").limit(Limit::token_bucket("burst", 10, 1.0)))
            .tier(Tier::new("anonymous").limit(Limit::fixed_window(
                "day",
                10,
                Duration::from_secs(86_400),
            )))
            .build()
            .unwrap(),
    )
    .await
    .unwrap()
}

#[tokio::test]
async fn a_cost_above_a_capacity_gets_no_retry_time_that_lies() {
    let limiter = limiter().await;
    let who = Identity::new(IdentityKind::ApiKey, "k");
    for tier in ["free", "anonymous"] {
        let d = limiter
            .snapshot()
            .check_with_cost(&who, tier, None, 11)
            .await;
        assert!(!d.allowed, "{tier}");
        assert_eq!(
            d.retry_after, None,
            "{tier}: no wait lets 11 units through a quota of 10"
        );
        assert!(!d.limits[0].allowed);
    }
}

#[tokio::test]
async fn a_cost_of_zero_charges_nothing() {
    let limiter = limiter().await;
    let who = Identity::new(IdentityKind::ApiKey, "k");
    for _ in 0..3 {
        assert!(
            limiter
                .snapshot()
                .check_with_cost(&who, "anonymous", None, 0)
                .await
                .allowed
        );
    }
    let d = limiter.peek(&who, "anonymous", None).await;
    assert_eq!(d.limits[0].remaining, Some(10.0));
}
