//! An LLM gateway on one policy (`examples/llm_gateway.toml`): requests per
//! minute, tokens per minute reserved from `max_tokens` and settled from
//! what the model used, and concurrent streams per plan, on Redis.
//!
//! ```sh
//! redis-server --port 6379 &
//! cargo run --example llm_gateway --features server
//! curl -i -H 'x-api-key: free_me' -d '{"prompt":"hi","max_tokens":500}' localhost:3000/v1/completions
//! ```

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json, Router, routing::post};
use ratewatch::{Limiter, Meter};

/// The body a client posts.
#[derive(serde::Deserialize)]
pub struct Completion {
    prompt: String,
    max_tokens: u64,
    #[serde(default)]
    stream: bool,
}

/// The model, as a limiter sees it: one token a byte of prompt, at most
/// `max_tokens`, in chunks of ten.
fn generate(c: &Completion) -> Vec<u64> {
    let used = (c.prompt.len() as u64).clamp(1, c.max_tokens);
    (0..used).step_by(10).map(|i| (used - i).min(10)).collect()
}

async fn complete(Extension(meter): Extension<Meter>, Json(c): Json<Completion>) -> Response {
    let chunks = generate(&c);
    if !c.stream {
        meter.record_unit("tokens", chunks.iter().sum());
        return format!("{} tokens\n", chunks.iter().sum::<u64>()).into_response();
    }
    // Each chunk adds what it used; the meter settles when the stream ends
    // or its client goes away, and the stream slot is held until then.
    let stream = futures_util::stream::unfold(chunks.into_iter(), move |mut rest| {
        let meter = meter.clone();
        async move {
            let n = rest.next()?;
            tokio::time::sleep(Duration::from_millis(20)).await;
            meter.add_unit("tokens", n);
            Some((Ok::<_, std::io::Error>(Bytes::from(format!("{n}\n"))), rest))
        }
    });
    Body::from_stream(stream).into_response()
}

/// The gateway: the limiter's layer, and outside it the layer that reads
/// `max_tokens` and `stream` from the JSON body (bounded).
pub fn app(limiter: &Limiter) -> Router {
    Router::new()
        .route("/v1/completions", post(complete))
        .layer(limiter.layer())
        .layer(limiter.body_costs_layer())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let policy = ratewatch::Policy::from_toml_file("examples/llm_gateway.toml")?.with_env()?;
    let limiter = Limiter::new(policy).await?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    axum::serve(listener, app(&limiter)).await?;
    Ok(())
}
