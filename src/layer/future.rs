//! The response future of [`super::RateLimit`].

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::response::Response;

type Boxed<E> = Pin<Box<dyn Future<Output = Result<Response, E>> + Send + 'static>>;

/// Resolves to the inner service's response with rate-limit headers, or to
/// the limiter's own answer (429, 503, 400, 401).
pub struct ResponseFuture<E> {
    inner: Boxed<E>,
}

impl<E> ResponseFuture<E> {
    pub(super) fn new(inner: Boxed<E>) -> Self {
        Self { inner }
    }
}

impl<E> Future for ResponseFuture<E> {
    type Output = Result<Response, E>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.inner.as_mut().poll(cx)
    }
}

impl<E> std::fmt::Debug for ResponseFuture<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ResponseFuture")
    }
}
