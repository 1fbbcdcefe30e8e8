//! The gRPC front end: `envoy.service.ratelimit.v3.RateLimitService` and
//! `grpc.health.v1.Health` as tonic services, over h2c.
//!
//! Each is a thin tower service, what tonic's code generator would write:
//! route by path, decode with [`ProstCodec`], convert ([`super::request_from_wire`]),
//! ask [`RateLimitService`], convert back. No decision is made here.

use std::convert::Infallible;
use std::future::Future;
use std::marker::PhantomData;
use std::task::{Context, Poll};

use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::BoxFuture;
use tonic::server::{Grpc, NamedService, UnaryService};
use tonic::{Request, Response, Status};

use super::convert;
use super::decide::{RateLimitService, RlsError};
use super::proto::{
    HealthCheckRequest, HealthCheckResponse, RateLimitRequest, RateLimitResponse, ServingStatus,
};

/// The gRPC service name of the rate limit service.
pub const RLS_SERVICE: &str = "envoy.service.ratelimit.v3.RateLimitService";
/// The gRPC service name of health checking.
pub const HEALTH_SERVICE: &str = "grpc.health.v1.Health";

/// Largest `RateLimitRequest` decoded (tonic's default is 4 MiB).
const MAX_MESSAGE: usize = 64 * 1024;

const SHOULD_RATE_LIMIT: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";
const HEALTH_CHECK: &str = "/grpc.health.v1.Health/Check";

/// A tonic codec for prost messages: encodes `E`, decodes `D`.
#[derive(Debug)]
pub struct ProstCodec<E, D>(PhantomData<fn() -> (E, D)>);

impl<E, D> Default for ProstCodec<E, D> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

impl<E, D> Codec for ProstCodec<E, D>
where
    E: prost::Message + Send + 'static,
    D: prost::Message + Default + Send + 'static,
{
    type Encode = E;
    type Decode = D;
    type Encoder = ProstEncoder<E>;
    type Decoder = ProstDecoder<D>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstEncoder(PhantomData)
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProstDecoder(PhantomData)
    }
}

/// [`ProstCodec`]'s encoder.
#[derive(Debug)]
pub struct ProstEncoder<E>(PhantomData<fn() -> E>);

impl<E: prost::Message> Encoder for ProstEncoder<E> {
    type Item = E;
    type Error = Status;

    fn encode(&mut self, item: E, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        item.encode(dst)
            .map_err(|e| Status::internal(format!("encoding the answer: {e}")))
    }
}

/// [`ProstCodec`]'s decoder.
#[derive(Debug)]
pub struct ProstDecoder<D>(PhantomData<fn() -> D>);

impl<D: prost::Message + Default> Decoder for ProstDecoder<D> {
    type Item = D;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<D>, Status> {
        D::decode(src)
            .map(Some)
            .map_err(|e| Status::invalid_argument(format!("malformed message: {e}")))
    }
}

/// `envoy.service.ratelimit.v3.RateLimitService` as a tonic service.
#[derive(Clone, Debug)]
pub struct RateLimitServer {
    service: RateLimitService,
}

impl RateLimitServer {
    /// Serves `service`.
    pub fn new(service: RateLimitService) -> Self {
        Self { service }
    }
}

impl NamedService for RateLimitServer {
    const NAME: &'static str = RLS_SERVICE;
}

struct ShouldRateLimit(RateLimitService);

impl UnaryService<RateLimitRequest> for ShouldRateLimit {
    type Response = RateLimitResponse;
    type Future = BoxFuture<Response<RateLimitResponse>, Status>;

    fn call(&mut self, request: Request<RateLimitRequest>) -> Self::Future {
        let service = self.0.clone();
        Box::pin(async move {
            let request = convert::request_from_wire(request.into_inner());
            request
                .check_size()
                .map_err(|e| Status::invalid_argument(format!("invalid RateLimitRequest: {e}")))?;
            // envoyproxy/ratelimit's error for these is a plain one, which
            // gRPC carries as UNKNOWN.
            request.check_required().map_err(Status::unknown)?;
            match service.decide(&request, "grpc").await {
                Ok(answer) => Ok(Response::new(convert::response_to_wire(&answer))),
                // Envoy's `failure_mode_deny` decides what an UNAVAILABLE means.
                Err(RlsError::Unavailable(e)) => Err(Status::unavailable(e.to_string())),
            }
        })
    }
}

impl tower::Service<http::Request<tonic::body::Body>> for RateLimitServer {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Infallible>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        if req.uri().path() != SHOULD_RATE_LIMIT {
            return unimplemented();
        }
        let service = self.service.clone();
        Box::pin(async move {
            // As the HTTP front end's body limit: a request is small, and
            // a decoded message is many times its wire size.
            let mut grpc = Grpc::new(ProstCodec::<RateLimitResponse, RateLimitRequest>::default())
                .max_decoding_message_size(MAX_MESSAGE);
            Ok(grpc.unary(ShouldRateLimit(service), req).await)
        })
    }
}

/// `grpc.health.v1.Health/Check`: SERVING for the server (`""`) and the
/// rate limit service, SERVICE_UNKNOWN (gRPC NOT_FOUND) for any other.
/// `Watch` is not served (UNIMPLEMENTED).
#[derive(Clone, Debug, Default)]
pub struct HealthServer;

impl NamedService for HealthServer {
    const NAME: &'static str = HEALTH_SERVICE;
}

struct Check;

impl UnaryService<HealthCheckRequest> for Check {
    type Response = HealthCheckResponse;
    type Future = std::future::Ready<Result<Response<HealthCheckResponse>, Status>>;

    fn call(&mut self, request: Request<HealthCheckRequest>) -> Self::Future {
        std::future::ready(health_answer(request, ServingStatus::Serving))
    }
}

/// The answer to `Health/Check`: `status` for the server (an empty
/// service name) and the rate limit service, NOT_FOUND for any other.
pub(crate) fn health_answer(
    request: Request<HealthCheckRequest>,
    status: ServingStatus,
) -> Result<Response<HealthCheckResponse>, Status> {
    let service = request.into_inner().service;
    if service.is_empty() || service == RLS_SERVICE {
        Ok(Response::new(HealthCheckResponse {
            status: status as i32,
        }))
    } else {
        Err(Status::not_found(format!("unknown service {service:?}")))
    }
}

impl tower::Service<http::Request<tonic::body::Body>> for HealthServer {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Infallible>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        if req.uri().path() != HEALTH_CHECK {
            return unimplemented();
        }
        Box::pin(async move {
            let mut grpc =
                Grpc::new(ProstCodec::<HealthCheckResponse, HealthCheckRequest>::default());
            Ok(grpc.unary(Check, req).await)
        })
    }
}

fn unimplemented() -> BoxFuture<http::Response<tonic::body::Body>, Infallible> {
    Box::pin(async { Ok(Status::unimplemented("no such method").into_http()) })
}

/// Serves the rate limit service and health checking on `listener`
/// (h2c) until `shutdown` completes.
pub async fn serve(
    service: RateLimitService,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()>,
) -> Result<(), tonic::transport::Error> {
    service.register_metrics();
    tonic::transport::Server::builder()
        .add_service(RateLimitServer::new(service))
        .add_service(HealthServer)
        .serve_with_incoming_shutdown(
            tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true)),
            shutdown,
        )
        .await
}
