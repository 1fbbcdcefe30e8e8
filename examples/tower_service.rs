//! Rate-limiting a plain tower service, no axum: a `tower::service_fn`
//! answering `http::Response<String>`, served by hyper. hyper wants a body
//! it can stream, so the service's `String` becomes `Full<Bytes>` inside
//! the limiter; ratewatch's own answers (429 with a JSON body) are built in
//! that body, and its `ResponseBody` around it (an `http_body::Body`) holds
//! a request's in-flight slot, if any, until hyper has sent the body. The
//! peer address is a plain `SocketAddr` the accept loop puts in each
//! request's extensions.
//!
//! cargo run --example tower_service
//! curl -i localhost:3001/        # 200 200 200, then 429
use std::convert::Infallible;
use std::net::SocketAddr;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use ratewatch::{Decision, Limit, Limiter, Policy, Tier};
use tower::{ServiceBuilder, service_fn};

/// The app: a plain function from request to `Response<String>`.
async fn hello<B>(req: Request<B>) -> Result<Response<String>, Infallible> {
    let left = req
        .extensions()
        .get::<Decision>()
        .and_then(Decision::most_constraining)
        .and_then(|l| l.remaining);
    Ok(Response::new(format!("hello; {left:?} left\n")))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let policy = Policy::builder()
        .tier(Tier::new("free").limit(Limit::token_bucket("burst", 10, 1.0)))
        .tier(Tier::new("anonymous").limit(Limit::token_bucket("burst", 3, 0.2)))
        .build()?;
    let limiter = Limiter::new(policy).await?;
    let app = ServiceBuilder::new()
        .layer(limiter.layer())
        // hyper wants a body it can stream: `String` becomes `Full<Bytes>`
        // inside the limiter, which answers in `ResponseBody<Full<Bytes>>`.
        .map_response(|res: Response<String>| res.map(|b| Full::new(Bytes::from(b))))
        .service(service_fn(hello));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3001").await?;
    loop {
        let (stream, peer): (_, SocketAddr) = listener.accept().await?;
        // ratewatch finds the peer as a plain `SocketAddr` in the extensions.
        let svc = ServiceBuilder::new()
            .map_request(move |mut req: Request<_>| {
                req.extensions_mut().insert(peer);
                req
            })
            .service(app.clone());
        tokio::spawn(async move {
            let served = auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), TowerToHyperService::new(svc))
                .await;
            if let Err(e) = served {
                eprintln!("connection from {peer}: {e}");
            }
        });
    }
}
