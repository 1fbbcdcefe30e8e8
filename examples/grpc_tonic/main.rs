//! Rate-limiting a tonic gRPC server with ratewatch: the same layer as for
//! axum, in `Server::builder().layer(..)` (feature `tonic`). A refused call
//! gets the gRPC status `RESOURCE_EXHAUSTED`, with the rate-limit headers
//! and `Retry-After` as response metadata.
//!
//! cargo run --example grpc_tonic
//!
//! It serves `hello.Greeter/SayHello` on 127.0.0.1:50051 (h2c), calls it
//! itself until the burst is spent, prints what the client saw, and keeps
//! serving.
mod greeter;

use ratewatch::{Limit, Limiter, Policy, Tier};
use tonic::transport::server::TcpConnectInfo;
use tonic::transport::{Channel, Server};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let policy = Policy::builder()
        .tier(
            Tier::new("free")
                .match_prefix("free_")
                .limit(Limit::token_bucket("burst", 3, 0.5)),
        )
        .tier(Tier::new("anonymous").limit(Limit::token_bucket("burst", 1, 0.1)))
        .build()?;
    let limiter = Limiter::new(policy).await?;
    // tonic records the peer in `TcpConnectInfo`: anonymous callers are
    // limited by that address.
    let layer = limiter.layer().with_peer_addr(|e: &http::Extensions| {
        e.get::<TcpConnectInfo>().and_then(|c| c.remote_addr())
    });
    let addr = "127.0.0.1:50051".parse()?;
    let server = Server::builder()
        .layer(layer)
        .add_service(greeter::GreeterServer)
        .serve(addr);
    let server = tokio::spawn(server);

    let channel = Channel::from_static("http://127.0.0.1:50051")
        .connect()
        .await?;
    for _ in 0..4 {
        match greeter::say_hello(channel.clone(), Some("free_demo")).await {
            Ok(reply) => println!(
                "OK {:?}, ratelimit: {:?}",
                reply.get_ref().message,
                reply.metadata().get("ratelimit")
            ),
            Err(status) => println!(
                "{:?}: {}, retry-after: {:?}",
                status.code(),
                status.message(),
                status.metadata().get("retry-after")
            ),
        }
    }
    server.await??;
    Ok(())
}
