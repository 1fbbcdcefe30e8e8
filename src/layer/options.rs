//! What an app may change about the layer: its refusals, a hook on every
//! decision, and which header families it sends.

use std::sync::Arc;

use axum::response::Response;

use super::headers::HeaderFamilies;
use super::response::Refusal;
use crate::{Decision, Identity};

/// Builds the answer to a refused request.
pub(crate) type Responder = Arc<dyn Fn(&Refusal<'_>) -> Response + Send + Sync>;
/// Sees every decision the layer makes.
pub(crate) type DecisionHook = Arc<dyn Fn(&Decision, &Identity) + Send + Sync>;

/// The layer's options; shared by every service the layer builds.
#[derive(Clone, Default)]
pub(crate) struct Options {
    pub(crate) responder: Option<Responder>,
    pub(crate) on_decision: Option<DecisionHook>,
    pub(crate) headers: HeaderFamilies,
}

impl Options {
    /// The answer to `refusal`: the app's, or ratewatch's own, finished
    /// with the headers every refusal carries.
    pub(crate) fn refuse(&self, refusal: &Refusal<'_>) -> Response {
        let res = match &self.responder {
            Some(respond) => respond(refusal),
            None => refusal.default_response(),
        };
        refusal.finish(res, self.headers)
    }
}

impl std::fmt::Debug for Options {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Options")
            .field("custom_refusal", &self.responder.is_some())
            .field("on_decision", &self.on_decision.is_some())
            .field("headers", &self.headers)
            .finish()
    }
}
