//! A request body that must keep arriving: the HTTP port's bound on a
//! request whose head came whole but whose body never does (a declared
//! `Content-Length` never sent), which would otherwise hold its
//! connection, busy, for ever.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};

/// Why a body stopped: no byte came for the allowed time.
#[derive(Debug, thiserror::Error)]
#[error("no part of the request body arrived within {0:?} ([server] header_read_timeout_ms)")]
pub(super) struct BodyStalled(Duration);

pin_project! {
    /// `inner`, failing when no frame arrives within `within` of the
    /// previous one (or of the request's start).
    pub(super) struct Stalling<B> {
        #[pin]
        inner: B,
        #[pin]
        deadline: Sleep,
        within: Duration,
    }
}

impl<B> Stalling<B> {
    pub(super) fn new(inner: B, within: Duration) -> Self {
        Self {
            inner,
            deadline: tokio::time::sleep(within),
            within,
        }
    }
}

impl<B> Body for Stalling<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let mut this = self.project();
        match this.inner.poll_frame(cx) {
            Poll::Ready(frame) => {
                this.deadline.as_mut().reset(Instant::now() + *this.within);
                Poll::Ready(frame.map(|f| f.map_err(Into::into)))
            }
            Poll::Pending => match this.deadline.poll(cx) {
                Poll::Ready(()) => Poll::Ready(Some(Err(Box::new(BodyStalled(*this.within))))),
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
