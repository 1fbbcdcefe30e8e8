//! [`ResponseBody`]: the body of every response the layer returns, holding
//! the request's in-flight slots until the body ends.
//!
//! Like tower-http's in-flight-requests body, it forwards every frame, the
//! size hint and the end of stream of the body it wraps, and gives the slot
//! back when the last frame has been read (`poll_frame` returns `None` or
//! an error, or the body says it is at its end) or when the body is
//! dropped before that: a client that goes away drops the response, and
//! with it the slot. A streamed body therefore holds its slot until its
//! last chunk. A response without a slot (no in-flight limit) costs one
//! `Option` check per frame.
//!
//! ```
//! use http_body::Body as _;
//! use ratewatch::layer::ResponseBody;
//! let body = ResponseBody::new(http_body_util::Full::new(bytes::Bytes::from_static(b"hi")));
//! assert_eq!(body.size_hint().exact(), Some(2));
//! assert!(body.slot().is_none() && !body.is_end_stream());
//! assert_eq!(body.into_inner().size_hint().exact(), Some(2));
//! ```

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use super::RefusalBody;
use crate::Slot;

pin_project! {
    /// The wrapped service's response body `B`, holding the request's
    /// in-flight [`Slot`] (if any) until the body ends or is dropped.
    #[derive(Debug, Default)]
    pub struct ResponseBody<B> {
        #[pin]
        inner: B,
        slot: Option<Slot>,
    }
}

impl<B> ResponseBody<B> {
    /// `inner`, holding no slot.
    pub fn new(inner: B) -> Self {
        Self { inner, slot: None }
    }

    /// `inner`, holding `slot` until it ends or is dropped.
    pub fn holding(inner: B, slot: Option<Slot>) -> Self {
        Self { inner, slot }
    }

    /// The body it wraps.
    pub fn get_ref(&self) -> &B {
        &self.inner
    }

    /// The body it wraps, mutably.
    pub fn get_mut(&mut self) -> &mut B {
        &mut self.inner
    }

    /// The body it wraps; the slot, if any, is given back now.
    pub fn into_inner(self) -> B {
        self.inner
    }

    /// The in-flight slot held until the body ends, if any.
    pub fn slot(&self) -> Option<&Slot> {
        self.slot.as_ref()
    }
}

impl<B: Body> Body for ResponseBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        let mut inner = this.inner;
        let frame = ready!(inner.as_mut().poll_frame(cx));
        if this.slot.is_some() && (!matches!(frame, Some(Ok(_))) || inner.is_end_stream()) {
            // The body ended (or failed): the request is over.
            this.slot.take();
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Stacked layers: a refusal of an outer layer in an inner layer's body.
impl<B: RefusalBody> RefusalBody for ResponseBody<B> {
    fn from_bytes(bytes: bytes::Bytes) -> Self {
        Self::new(B::from_bytes(bytes))
    }

    fn from_axum_body(body: axum::body::Body) -> Result<Self, axum::body::Body> {
        B::from_axum_body(body).map(Self::new)
    }
}
