//! `/metrics`: the Prometheus exposition of every ratewatch metric.
//!
//! ratewatch installs its own global recorder unless the application
//! handed it the handle of one it installed first
//! ([`metrics::use_handle`], with the builder passed through
//! [`metrics::with_ratewatch_buckets`] so the round-trip histogram keeps
//! its buckets). Either way every series known at start-up exists at zero.

use std::sync::atomic::{AtomicBool, Ordering};

use axum::response::{IntoResponse, Response};
use http::StatusCode;

use super::Limiter;
use crate::policy::Policy;
use crate::telemetry::metrics;

/// At build time: the recorder (ratewatch's own unless the application
/// gave one), then every known series at zero.
pub(super) fn prepare(policy: &Policy) {
    if metrics::handle().is_none() {
        tracing::warn!(
            "another metrics recorder is installed and its handle was not given to \
             ratewatch::telemetry::metrics::use_handle; ratewatch's /metrics cannot render it"
        );
    }
    metrics::register_at_zero(policy);
}

const NO_HANDLE: &str = "ratewatch cannot render these metrics: the application installed \
its own metrics recorder. Build it with ratewatch::telemetry::metrics::with_ratewatch_buckets \
and pass its handle to ratewatch::telemetry::metrics::use_handle before building the limiter, \
or serve that recorder's own exposition.\n";

impl Limiter {
    /// An axum handler serving the Prometheus exposition of every ratewatch
    /// metric (mount it at `/metrics`). It renders ratewatch's recorder, or
    /// the application's when its handle was given to
    /// [`metrics::use_handle`]; with another recorder installed and no
    /// handle given it answers 500 and says so, rather than an empty page.
    pub fn metrics_handler(
        &self,
    ) -> impl Fn() -> std::future::Ready<Response> + Clone + Send + Sync + 'static {
        move || {
            let res = match metrics::handle() {
                Some(handle) => {
                    let body = metrics::render(&handle);
                    warn_once_if_summary(&body);
                    (
                        [(http::header::CONTENT_TYPE, "text/plain; version=0.0.4")],
                        body,
                    )
                        .into_response()
                }
                None => (StatusCode::INTERNAL_SERVER_ERROR, NO_HANDLE).into_response(),
            };
            std::future::ready(res)
        }
    }
}

/// An application recorder built without ratewatch's buckets exports the
/// round-trip histogram as a summary: the shipped p99 panels and the
/// slow-Redis alert then see nothing. Said once, not on every scrape.
fn warn_once_if_summary(body: &str) {
    static WARNED: AtomicBool = AtomicBool::new(false);
    if !WARNED.load(Ordering::Relaxed) && metrics::rtt_rendered_as_summary(body) {
        WARNED.store(true, Ordering::Relaxed);
        tracing::warn!(
            "ratewatch_redis_rtt_seconds renders as a summary: build the application's recorder \
             with ratewatch::telemetry::metrics::with_ratewatch_buckets"
        );
    }
}
