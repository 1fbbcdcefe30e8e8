//! A do-nothing rate limit service: the floor of any RLS behind Envoy.
//!
//! `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit` over h2c
//! (tonic's server, default settings), decoding each `RateLimitRequest`
//! with ratewatch's own prost messages and answering `OK` with one
//! descriptor status, deciding nothing. Envoy + this against Envoy +
//! ratewatch is what deciding costs behind Envoy; everything else (Envoy,
//! the gRPC hop, decoding, encoding) is in both.

use std::convert::Infallible;
use std::task::{Context, Poll};

use ratewatch::service::grpc::ProstCodec;
use ratewatch::service::proto::{DescriptorStatus, RateLimitRequest, RateLimitResponse};
use tonic::codegen::BoxFuture;
use tonic::server::{Grpc, NamedService, UnaryService};

const PATH: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";
/// `envoy.service.ratelimit.v3.RateLimitResponse.Code.OK`.
const OK: i32 = 1;

#[derive(Clone, Debug, Default)]
struct NopRls;

impl NamedService for NopRls {
    const NAME: &'static str = "envoy.service.ratelimit.v3.RateLimitService";
}

struct Answer;

impl UnaryService<RateLimitRequest> for Answer {
    type Response = RateLimitResponse;
    type Future = std::future::Ready<Result<tonic::Response<RateLimitResponse>, tonic::Status>>;

    fn call(&mut self, _: tonic::Request<RateLimitRequest>) -> Self::Future {
        std::future::ready(Ok(tonic::Response::new(RateLimitResponse {
            overall_code: OK,
            statuses: vec![DescriptorStatus {
                code: OK,
                ..Default::default()
            }],
            ..Default::default()
        })))
    }
}

impl tower::Service<http::Request<tonic::body::Body>> for NopRls {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Infallible>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        Box::pin(async move {
            if req.uri().path() != PATH {
                return Ok(tonic::Status::unimplemented("").into_http());
            }
            let mut grpc = Grpc::new(ProstCodec::<RateLimitResponse, RateLimitRequest>::default());
            Ok(grpc.unary(Answer, req).await)
        })
    }
}

/// `nop-rls PORT`: serves the do-nothing RLS on `127.0.0.1:PORT` until
/// killed.
pub fn serve(port: u16) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        tonic::transport::Server::builder()
            .add_service(NopRls)
            .serve(([127, 0, 0, 1], port).into())
            .await
            .expect("serve the do-nothing RLS");
    });
}

/// The do-nothing RLS as a child process of the benchmark, killed when
/// dropped.
pub struct NopServer {
    child: std::process::Child,
    pub port: u16,
}

impl NopServer {
    pub fn start() -> Self {
        let port = crate::support::free_port();
        let exe = std::env::current_exe().expect("own path");
        let mut child = std::process::Command::new(exe)
            .args(["nop-rls", &port.to_string()])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::inherit())
            .spawn()
            .expect("start the do-nothing RLS");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Ok(Some(status)) = child.try_wait() {
                panic!("nop-rls exited: {status}");
            }
            assert!(
                std::time::Instant::now() < deadline,
                "nop-rls did not listen"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        Self { child, port }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for NopServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
