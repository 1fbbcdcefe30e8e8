//! One Redis node: every limit of a request in one `EVALSHA`, on the Redis
//! clock.
//!
//! The connection is made lazily and kept by a `ConnectionManager`, so a
//! server that starts before Redis does answers by its failure policy and
//! decides in Redis as soon as Redis is there. Each decision has a hard
//! budget (`StoreSettings::timeout`); a timed-out decision is never resent,
//! since Redis may already have charged it. `NOSCRIPT` is the only retry.

use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use super::script::{self, ReloadCounter, Scripts};
use super::{Batch, Item, Store, StoreDecision, StoreError, uncharge};
use crate::policy::StoreSettings;

/// Longest wait for a TCP connection: a few decision budgets at most, so a
/// missing server costs a prompt error, not a stall.
const MIN_CONNECT_TIMEOUT: Duration = Duration::from_millis(200);

/// The Redis store on a single node. Cheap to clone; clones share the
/// connection and the reload counter.
#[derive(Clone)]
pub struct RedisStore {
    conn: ConnectionManager,
    scripts: Arc<Scripts>,
    shard: Arc<str>,
    timeout: Duration,
    reloads: Arc<ReloadCounter>,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("shard", &self.shard)
            .field("timeout", &self.timeout)
            .finish()
    }
}

/// `host:port` of a Redis URL, the `shard` label of its decisions.
pub(crate) fn host_port(info: &redis::ConnectionInfo) -> String {
    match info.addr() {
        redis::ConnectionAddr::Tcp(host, port) => format!("{host}:{port}"),
        redis::ConnectionAddr::TcpTls { host, port, .. } => format!("{host}:{port}"),
        redis::ConnectionAddr::Unix(path) => path.display().to_string(),
        _ => "redis".to_owned(),
    }
}

/// The Redis a `redis` store without `url` connects to.
pub const DEFAULT_URL: &str = crate::policy::DEFAULT_REDIS_URL;

impl RedisStore {
    /// A store on `settings.url` (default `redis://127.0.0.1:6379`). Fails
    /// only on an invalid URL: the connection is made by the first decision
    /// and remade in the background after a failure, so Redis may be down.
    pub async fn connect(settings: &StoreSettings) -> Result<Self, StoreError> {
        let url = settings.url.as_deref().unwrap_or(DEFAULT_URL);
        let client = redis::Client::open(url)
            .map_err(|e| StoreError::Unavailable(format!("invalid Redis URL: {e}")))?;
        let shard: Arc<str> = host_port(client.get_connection_info()).into();
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(settings.timeout.max(MIN_CONNECT_TIMEOUT)))
            .set_response_timeout(Some(settings.timeout))
            .set_number_of_retries(1)
            .set_min_delay(Duration::from_millis(10))
            .set_max_delay(Duration::from_millis(100));
        let conn =
            ConnectionManager::new_lazy_with_config(client, config).map_err(script::classify)?;
        Ok(Self {
            conn,
            scripts: Arc::new(Scripts::new()),
            shard,
            timeout: settings.timeout,
            reloads: Arc::new(ReloadCounter::default()),
        })
    }

    /// Script reloads after `NOSCRIPT` so far, per shard (one entry here).
    pub fn script_reloads(&self) -> Vec<(Arc<str>, u64)> {
        self.reloads.snapshot()
    }

    async fn run(&self, batch: &Batch<'_>) -> Result<StoreDecision, StoreError> {
        let items: Vec<&Item> = batch.items.iter().collect();
        let cmd = script::decide_cmd(&self.scripts, batch, &items);
        let mut conn = self.conn.clone();
        let started = Instant::now();
        let value = script::eval(
            &mut conn,
            &self.scripts.decide,
            &cmd,
            &self.reloads,
            &self.shard,
        )
        .await
        .map_err(script::classify)?;
        let rtt = started.elapsed();
        let reply = script::parse_reply(&value, items.len())?;
        let mut verdicts = reply.verdicts;
        if !reply.allowed {
            uncharge(batch.items, &mut verdicts, batch.effective_cost());
        }
        Ok(StoreDecision {
            allowed: reply.allowed,
            verdicts,
            shard: self.shard.clone(),
            now: reply.now,
            rtt: Some(rtt),
        })
    }
}

#[async_trait::async_trait]
impl Store for RedisStore {
    async fn decide(&self, batch: &Batch<'_>) -> Result<StoreDecision, StoreError> {
        tokio::time::timeout(self.timeout, self.run(batch))
            .await
            .map_err(|_| StoreError::Timeout)?
    }

    fn shard_for(&self, _key: &str) -> Arc<str> {
        self.shard.clone()
    }

    fn kind(&self) -> &'static str {
        "redis"
    }

    fn observe(&self, observer: Arc<dyn super::StoreObserver>) {
        self.reloads.observe(observer);
    }
}
