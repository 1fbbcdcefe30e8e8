//! Telemetry: decision events, Prometheus metrics and the fleet view.
//!
//! The hot path only calls [`Telemetry::record`], which never blocks and
//! never fails a request.

mod event;

pub use event::{Event, FallbackReason, Outcome};

/// The telemetry pipeline of a limiter. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct Telemetry {}

impl Telemetry {
    /// A pipeline that records nothing but Prometheus metrics.
    pub fn new() -> Self {
        Self {}
    }

    /// Records one decision; never blocks.
    pub fn record(&self, _event: &Event) {}

    /// Flushes what is buffered.
    pub async fn shutdown(&self) {}
}
