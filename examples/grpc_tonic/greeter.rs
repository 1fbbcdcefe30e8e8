//! `hello.Greeter/SayHello`, a gRPC service written by hand as tonic's
//! generated code would have it (a prost message, no protoc), and a
//! client call. Shared by the example and `tests/embedding_tower.rs`.
#![allow(dead_code)]
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::uri::PathAndQuery;

#[derive(Clone, PartialEq, prost::Message)]
pub struct HelloRequest {
    #[prost(string, tag = "1")]
    pub name: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct HelloReply {
    #[prost(string, tag = "1")]
    pub message: String,
}

pub const PATH: &str = "/hello.Greeter/SayHello";

struct SayHello;

impl tonic::server::UnaryService<HelloRequest> for SayHello {
    type Response = HelloReply;
    type Future = std::future::Ready<Result<tonic::Response<HelloReply>, tonic::Status>>;

    fn call(&mut self, req: tonic::Request<HelloRequest>) -> Self::Future {
        let message = format!("hello {}", req.into_inner().name);
        std::future::ready(Ok(tonic::Response::new(HelloReply { message })))
    }
}

/// The server side, as tonic's generated code would have it.
#[derive(Clone)]
pub struct GreeterServer;

impl tonic::server::NamedService for GreeterServer {
    const NAME: &'static str = "hello.Greeter";
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<B> tower::Service<http::Request<B>> for GreeterServer
where
    B: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        Box::pin(async move {
            if req.uri().path() == PATH {
                let mut grpc = tonic::server::Grpc::new(tonic_prost::ProstCodec::default());
                return Ok(grpc.unary(SayHello, req).await);
            }
            Ok(tonic::Status::unimplemented("no such method").into_http())
        })
    }
}

/// One call as a client makes it, with `x-api-key` if given.
pub async fn say_hello(
    channel: tonic::transport::Channel,
    key: Option<&str>,
) -> Result<tonic::Response<HelloReply>, tonic::Status> {
    let mut client = tonic::client::Grpc::new(channel);
    client
        .ready()
        .await
        .map_err(|e| tonic::Status::unknown(e.to_string()))?;
    let mut req = tonic::Request::new(HelloRequest {
        name: "ratewatch".into(),
    });
    if let Some(k) = key {
        req.metadata_mut()
            .insert("x-api-key", k.parse().expect("ascii key"));
    }
    client
        .unary(
            req,
            PathAndQuery::from_static(PATH),
            tonic_prost::ProstCodec::default(),
        )
        .await
}
