//! The response future of [`super::RateLimit`].
//!
//! A decision the store took in process (the memory store) leaves nothing
//! to wait for but the inner service, so the future is that service's own
//! future, with the decision kept beside it to add the headers: no box, no
//! extra task state. Only a decision that must wait (a Redis store, a
//! leaky bucket's shaping delay) goes through a boxed future.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use http::Response;
use pin_project_lite::pin_project;

use super::headers::{self, HeaderFamilies};
use super::response_body::ResponseBody;
use crate::{Decision, Slot};

/// The in-flight slot a boxed future's response carries to
/// [`ResponseFuture`], which moves it into the [`ResponseBody`].
#[derive(Clone)]
pub(super) struct HeldSlot(pub(super) Slot);

type Boxed<O> = Pin<Box<dyn Future<Output = O> + Send + 'static>>;

pin_project! {
    /// Resolves to the inner service's response with rate-limit headers, or
    /// to the limiter's own answer (429, 503, 400, 401), its body wrapped
    /// in a [`ResponseBody`] that holds the request's in-flight slot until
    /// it ends. `F` is the inner service's future. Dropped before it
    /// resolves (a client gone), it gives the slot back.
    pub struct ResponseFuture<F: Future> {
        #[pin]
        kind: Kind<F>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<F: Future> {
        /// The request went on: the inner service's future, and the
        /// decision its response is finished with (none for an exempt
        /// route).
        Inner {
            #[pin]
            inner: F,
            decided: Option<(Decision, HeaderFamilies)>,
            slot: Option<Slot>,
        },
        /// The limiter answered itself.
        Ready { response: Option<F::Output> },
        /// A decision that waits (a Redis store, a shaping delay).
        Waiting { fut: Boxed<F::Output> },
    }
}

impl<F: Future> ResponseFuture<F> {
    /// The inner service's response, finished with `decision`'s headers
    /// and the decision itself in its extensions.
    pub(super) fn limited(
        inner: F,
        decision: Decision,
        slot: Option<Slot>,
        families: HeaderFamilies,
    ) -> Self {
        Self {
            kind: Kind::Inner {
                inner,
                decided: Some((decision, families)),
                slot,
            },
        }
    }

    /// The inner service's response as it is (an exempt route).
    pub(super) fn passed(inner: F) -> Self {
        Self {
            kind: Kind::Inner {
                inner,
                decided: None,
                slot: None,
            },
        }
    }

    /// The limiter's own answer.
    pub(super) fn ready<B, E>(response: Response<B>) -> Self
    where
        F: Future<Output = Result<Response<B>, E>>,
    {
        Self {
            kind: Kind::Ready {
                response: Some(Ok(response)),
            },
        }
    }

    /// A decision that must wait.
    pub(super) fn waiting(fut: Boxed<F::Output>) -> Self {
        Self {
            kind: Kind::Waiting { fut },
        }
    }
}

impl<F, B, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<ResponseBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            KindProj::Inner {
                inner,
                decided,
                slot,
            } => {
                let mut res = ready!(inner.poll(cx))?;
                if let Some((decision, families)) = decided.take() {
                    headers::insert_families(res.headers_mut(), &decision, families);
                    res.extensions_mut().insert(decision);
                }
                let slot = slot.take();
                Poll::Ready(Ok(res.map(|b| ResponseBody::holding(b, slot))))
            }
            KindProj::Ready { response } => Poll::Ready(
                response
                    .take()
                    .expect("ResponseFuture polled after it completed")
                    .map(|res| res.map(ResponseBody::new)),
            ),
            KindProj::Waiting { fut } => {
                let mut res = ready!(fut.as_mut().poll(cx))?;
                let slot = res.extensions_mut().remove::<HeldSlot>().map(|h| h.0);
                Poll::Ready(Ok(res.map(|b| ResponseBody::holding(b, slot))))
            }
        }
    }
}

impl<F: Future> std::fmt::Debug for ResponseFuture<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ResponseFuture")
    }
}
