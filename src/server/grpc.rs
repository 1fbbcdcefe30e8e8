//! What the gRPC port answers: the rate limit service and gRPC health of
//! [`crate::service`], each request bounded by `grpc_request_timeout`,
//! and health NOT_SERVING while the server drains (or, with
//! `[server] healthcheck_store`, while the store is down).

use std::future::Future;
use std::time::Duration;

use hyper::body::Incoming;
use tonic::server::{Grpc, UnaryService};
use tonic::{Request, Response, Status};
use tower::ServiceExt;

use super::Readiness;
use crate::service::grpc::{HEALTH_SERVICE, ProstCodec, RLS_SERVICE, health_answer};
use crate::service::proto::{HealthCheckRequest, HealthCheckResponse, ServingStatus};
use crate::service::{HealthServer, RateLimitServer, RateLimitService};

/// Answers one gRPC request of the gRPC port.
#[derive(Clone)]
pub(super) struct GrpcPort {
    rls: RateLimitServer,
    readiness: Readiness,
    timeout: Duration,
}

impl GrpcPort {
    pub(super) fn new(service: RateLimitService, readiness: Readiness, timeout: Duration) -> Self {
        service.register_metrics();
        Self {
            rls: RateLimitServer::new(service),
            readiness,
            timeout,
        }
    }

    /// The answer to `req`: DEADLINE_EXCEEDED when it runs longer than the
    /// request timeout (reading a body that never ends included).
    pub(super) fn answer(
        &self,
        req: http::Request<Incoming>,
    ) -> impl Future<Output = http::Response<tonic::body::Body>> + Send + use<> {
        let port = self.clone();
        async move {
            let req = req.map(tonic::body::Body::new);
            let service = service_of(req.uri().path());
            let answer = async {
                match service {
                    Some(RLS_SERVICE) => port.rls.oneshot(req).await,
                    Some(HEALTH_SERVICE) if port.readiness.unhealthy().is_some() => {
                        let mut grpc = Grpc::new(ProstCodec::<
                            HealthCheckResponse,
                            HealthCheckRequest,
                        >::default());
                        Ok(grpc.unary(NotServing, req).await)
                    }
                    Some(HEALTH_SERVICE) => HealthServer.oneshot(req).await,
                    _ => Ok(Status::unimplemented("no such service").into_http()),
                }
            };
            match tokio::time::timeout(port.timeout, answer).await {
                Ok(Ok(res)) => res,
                Ok(Err(never)) => match never {},
                Err(_) => Status::deadline_exceeded(format!(
                    "the request did not complete within {:?} ([server] grpc_request_timeout_ms)",
                    port.timeout
                ))
                .into_http(),
            }
        }
    }
}

/// The gRPC service a request path names (`/pkg.Service/Method`).
fn service_of(path: &str) -> Option<&'static str> {
    let service = path.strip_prefix('/')?.split('/').next()?;
    [RLS_SERVICE, HEALTH_SERVICE]
        .into_iter()
        .find(|s| *s == service)
}

/// `Health/Check` while unhealthy: NOT_SERVING for the server and the
/// rate limit service alike.
struct NotServing;

impl UnaryService<HealthCheckRequest> for NotServing {
    type Response = HealthCheckResponse;
    type Future = std::future::Ready<Result<Response<HealthCheckResponse>, Status>>;

    fn call(&mut self, request: Request<HealthCheckRequest>) -> Self::Future {
        std::future::ready(health_answer(request, ServingStatus::NotServing))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_names_its_service() {
        assert_eq!(
            service_of("/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"),
            Some(RLS_SERVICE)
        );
        assert_eq!(
            service_of("/grpc.health.v1.Health/Check"),
            Some(HEALTH_SERVICE)
        );
        assert_eq!(service_of("/other.Service/Call"), None);
        assert_eq!(service_of(""), None);
    }
}
