//! What an app may change about the layer: its refusals, a hook on every
//! decision, which header families it sends, and where it finds a
//! request's peer address.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use axum::response::Response;
use http::{Extensions, HeaderMap};

use super::body::{RefusalBody, read_whole};
use super::grpc::is_grpc;
use super::headers::HeaderFamilies;
use super::peer::PeerAddr;
use super::response::Refusal;
use crate::{Decision, Identity};

/// Builds the answer to a refused request.
pub(crate) type Responder = Arc<dyn Fn(&Refusal<'_>) -> Response + Send + Sync>;
/// Sees every decision the layer makes.
pub(crate) type DecisionHook = Arc<dyn Fn(&Decision, &Identity) + Send + Sync>;
/// A request's costs from its parts; `None` is the route rule's.
pub(crate) type CostFn = Arc<dyn Fn(&http::request::Parts) -> Option<crate::Costs> + Send + Sync>;

/// A refusal in the wrapped service's body type: at once, or (an app's own
/// answer in a body that must be read first) later.
pub(crate) enum Refused<B> {
    /// The answer.
    Now(http::Response<B>),
    /// The answer, once the app's body is read.
    Later(Pin<Box<dyn Future<Output = http::Response<B>> + Send>>),
}

impl<B> Refused<B> {
    /// The answer, waited for if need be.
    pub(crate) async fn get(self) -> http::Response<B> {
        match self {
            Refused::Now(res) => res,
            Refused::Later(fut) => fut.await,
        }
    }
}

/// The layer's options; shared by every service the layer builds.
#[derive(Clone, Default)]
pub(crate) struct Options {
    pub(crate) responder: Option<Responder>,
    pub(crate) on_decision: Option<DecisionHook>,
    pub(crate) headers: HeaderFamilies,
    pub(crate) peer: Option<Arc<dyn PeerAddr>>,
    /// Set: requests are decided at this cost, metered and settled.
    pub(crate) cost: Option<CostFn>,
}

impl Options {
    /// The answer to `refusal` of a request with `request_headers`: a gRPC
    /// status for a gRPC request, else the app's answer or ratewatch's
    /// own; finished with the headers every refusal carries, and with the
    /// decision in its extensions.
    pub(crate) fn refuse<B: RefusalBody>(
        &self,
        refusal: &Refusal<'_>,
        request_headers: &HeaderMap,
    ) -> Refused<B> {
        let decided = |mut res: http::Response<B>| {
            if let Some(d) = refusal.decision() {
                res.extensions_mut().insert(d.clone());
            }
            refusal.finish(res, self.headers)
        };
        let respond = match &self.responder {
            Some(respond) if !is_grpc(request_headers) => respond,
            _ => {
                let res = if is_grpc(request_headers) {
                    refusal.grpc_response()
                } else {
                    refusal.default_parts()
                };
                return Refused::Now(decided(res.map(B::from_bytes)));
            }
        };
        let (parts, body) = decided_axum(refusal, respond(refusal), self.headers).into_parts();
        match B::from_axum_body(body) {
            Ok(body) => Refused::Now(http::Response::from_parts(parts, body)),
            Err(body) => Refused::Later(Box::pin(async move {
                http::Response::from_parts(parts, read_whole(body).await)
            })),
        }
    }

    /// Finds the peer address of a request where the app said it is, and
    /// leaves it in the extensions as a plain `SocketAddr`, where identity
    /// extraction looks for it. Nothing to do when no app hook is set or
    /// the address is already known.
    pub(crate) fn find_peer(&self, extensions: &mut Extensions) {
        let Some(peer) = &self.peer else {
            return;
        };
        if crate::identity::peer_ip(extensions).is_some() {
            return;
        }
        if let Some(addr) = peer.peer_addr(extensions) {
            extensions.insert(addr);
        }
    }
}

/// An app's axum answer, finished and carrying the decision.
fn decided_axum(refusal: &Refusal<'_>, mut res: Response, families: HeaderFamilies) -> Response {
    if let Some(d) = refusal.decision() {
        res.extensions_mut().insert(d.clone());
    }
    refusal.finish(res, families)
}

impl std::fmt::Debug for Options {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Options")
            .field("custom_refusal", &self.responder.is_some())
            .field("on_decision", &self.on_decision.is_some())
            .field("headers", &self.headers)
            .field("peer_addr", &self.peer.is_some())
            .field("cost", &self.cost.is_some())
            .finish()
    }
}
