//! The reset a sliding window reports: when every unit it counted has
//! left the estimate, `2w − (now mod w)` while the current (epoch-aligned)
//! fixed window holds units, so between `w` and `2w`; `w − (now mod w)`
//! when only the previous one does. A 60 s window 8 s into its fixed
//! window says 112 s, in the decision and in the headers
//! (`docs/headers.md`, "Reset of a sliding window").

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use http::Request;
use ratewatch::clock::ManualClock;
use ratewatch::identity::{Identity, IdentityKind};
use ratewatch::{Limit, Limiter, Policy, Tier};
use tower::ServiceExt;

const WINDOW: u64 = 60;
/// An epoch second that starts a fixed window of 60 s.
const T0: u64 = 1_800_000_000;

async fn limiter(clock: &Arc<ManualClock>) -> Limiter {
    let policy = Policy::builder()
        .tier(Tier::new("free").limit(Limit::sliding_window(
            "minute",
            10,
            Duration::from_secs(WINDOW),
        )))
        .tier(Tier::new("anonymous").limit(Limit::sliding_window(
            "minute",
            10,
            Duration::from_secs(WINDOW),
        )))
        .build()
        .unwrap();
    Limiter::builder(policy)
        .with_clock(clock.clone())
        .build()
        .await
        .unwrap()
}

fn caller() -> Identity {
    Identity::new(IdentityKind::ApiKey, "free_reset")
}

#[tokio::test]
async fn a_sixty_second_window_resets_within_two_windows_as_documented() {
    assert_eq!(T0 % WINDOW, 0);
    let clock = Arc::new(ManualClock::new(0));
    let limiter = limiter(&clock).await;
    // Every offset into the fixed window: units admitted now weigh on the
    // estimate until the end of the next fixed window.
    for offset in [0, 1, 8, 30, 59] {
        clock.set_us((T0 + 10 * WINDOW * (offset + 1) + offset) * 1_000_000);
        let d = limiter.check(&caller(), "free", None).await;
        assert!(d.allowed);
        let reset = d.limits[0].reset_after;
        assert_eq!(
            reset,
            Duration::from_secs(2 * WINDOW - offset),
            "offset {offset}"
        );
        assert!(reset > Duration::from_secs(WINDOW) && reset <= Duration::from_secs(2 * WINDOW));
    }
    // 8 s in: 112 s, the number seen in the headers.
    let later = T0 + 1_000 * WINDOW;
    clock.set_us((later + 8) * 1_000_000);
    let d = limiter.check(&caller(), "free", None).await;
    assert_eq!(d.limits[0].reset_after, Duration::from_secs(112));
    // Next fixed window, 30 s in, only the previous one holding units: a
    // check that charges nothing sees them gone in w − 30 s.
    clock.set_us((later + WINDOW + 30) * 1_000_000);
    let d = limiter.peek(&caller(), "free", None).await;
    assert_eq!(d.limits[0].reset_after, Duration::from_secs(30));

    // The headers say the same: t and X-RateLimit-Reset, 112 s after an
    // admission 8 s into a fixed window.
    let now = T0 + 2_000 * WINDOW + 8;
    clock.set_us(now * 1_000_000);
    let app = Router::new()
        .route("/work", get(|| async { "done" }))
        .layer(limiter.layer());
    let res = app
        .oneshot(
            Request::get("/work")
                .header("x-api-key", "free_headers")
                .body(Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let h = res.headers();
    assert_eq!(h["x-ratelimit-reset"], (now + 112).to_string().as_str());
    assert!(
        h["ratelimit"].to_str().unwrap().ends_with(";t=112"),
        "{:?}",
        h["ratelimit"]
    );
}
