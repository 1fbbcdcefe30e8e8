//! One Redis node: every limit of a request in one `EVALSHA`, on the Redis
//! clock.
//!
//! The connection is made lazily and kept by a `ConnectionManager`, so a
//! server that starts before Redis does answers by its failure policy and
//! decides in Redis as soon as Redis is there. Each decision has a hard
//! budget (`StoreSettings::timeout`); a timed-out decision is never resent,
//! since Redis may already have charged it. `NOSCRIPT` is the only retry.
//!
//! While the shard's breaker is open, [`Store::probe`] opens a fresh
//! connection, runs the decide script on a throwaway key (loading it if
//! Redis forgot it) and, when that worked, makes the fresh connection the
//! one decisions use. So no decision is sent down a socket that died with
//! the old server, and the first request after a recovery is exact.

use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::RwLock;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use super::script::{self, ReloadCounter, Scripts};
use super::{Batch, Charge, Item, Store, StoreDecision, StoreError};
use crate::algorithm::Algorithm;
use crate::policy::StoreSettings;

/// Longest wait for a TCP connection: a few decision budgets at most, so a
/// missing server costs a prompt error, not a stall.
const MIN_CONNECT_TIMEOUT: Duration = Duration::from_millis(200);

/// The Redis store on a single node. Cheap to clone; clones share the
/// connection and the reload counter.
#[derive(Clone)]
pub struct RedisStore {
    conn: Arc<RwLock<ConnectionManager>>,
    client: redis::Client,
    config: ConnectionManagerConfig,
    scripts: Arc<Scripts>,
    shard: Arc<str>,
    timeout: Duration,
    reloads: Arc<ReloadCounter>,
    probe_key: Arc<str>,
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

/// The one limit a health probe decides: a fixed window no probe rate can
/// exhaust, whose key expires a second later. It writes, so a node that
/// became a read-only replica fails the probe.
pub(crate) fn probe_item(key: impl Into<Arc<str>>) -> Item {
    Item::new(
        key,
        Algorithm::FixedWindow {
            limit: u64::from(u32::MAX),
            window_us: 1_000_000,
        },
    )
}

impl RedisStore {
    /// A store on `settings.url` (default `redis://127.0.0.1:6379`). Fails
    /// only on an invalid URL: the connection is made by the first decision
    /// and remade in the background after a failure, so Redis may be down.
    pub async fn connect(settings: &StoreSettings) -> Result<Self, StoreError> {
        let url = settings.url.as_deref().unwrap_or(DEFAULT_URL);
        let client = crate::redis_client::client(url, &settings.tls)?;
        let shard: Arc<str> = host_port(client.get_connection_info()).into();
        Self::with_client(client, shard, settings, Arc::default())
    }

    /// A store on `client`, labelled `shard`, counting reloads in `reloads`.
    pub(crate) fn with_client(
        client: redis::Client,
        shard: Arc<str>,
        settings: &StoreSettings,
        reloads: Arc<ReloadCounter>,
    ) -> Result<Self, StoreError> {
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(settings.timeout.max(MIN_CONNECT_TIMEOUT)))
            // No response timeout of the client's own: every decision
            // runs under the store's budget (`decide`) and the probe under
            // its own, so a second timer per call would only cost.
            .set_response_timeout(None)
            .set_number_of_retries(1)
            .set_min_delay(Duration::from_millis(10))
            .set_max_delay(Duration::from_millis(100));
        let conn = ConnectionManager::new_lazy_with_config(client.clone(), config.clone())
            .map_err(script::classify)?;
        Ok(Self {
            conn: Arc::new(RwLock::new(conn)),
            client,
            config,
            scripts: Arc::new(Scripts::new()),
            shard,
            timeout: settings.timeout,
            reloads,
            probe_key: format!("{}:{{health}}:probe", settings.key_prefix).into(),
        })
    }

    /// Script reloads after `NOSCRIPT` so far, per shard (one entry here).
    pub fn script_reloads(&self) -> Vec<(Arc<str>, u64)> {
        self.reloads.snapshot()
    }

    /// The `host:port` this store decides on.
    pub(crate) fn shard(&self) -> &Arc<str> {
        &self.shard
    }

    /// Proves on a fresh connection that this node decides (the script
    /// runs, reloaded if forgotten, and may write), then makes that
    /// connection the one decisions use.
    pub(crate) async fn probe_node(&self) -> Result<(), StoreError> {
        let fresh = ConnectionManager::new_with_config(self.client.clone(), self.config.clone())
            .await
            .map_err(script::classify)?;
        let mut conn = fresh.clone();
        let item = probe_item(&*self.probe_key);
        let batch = Batch::consume(std::slice::from_ref(&item), 1);
        let cmd = script::decide_cmd(&self.scripts, &batch, &[&item]);
        let value = script::eval(
            &mut conn,
            &self.scripts.decide,
            &cmd,
            &self.reloads,
            &self.shard,
        )
        .await
        .map_err(script::classify)?;
        script::parse_reply(&value, 1)?;
        *self.conn.write() = fresh;
        Ok(())
    }

    /// `DBSIZE` and `INFO memory` of this node, within a few decision
    /// budgets; `None` if it does not answer.
    pub(crate) async fn node_usage(&self) -> Option<super::ShardUsage> {
        let mut conn = self.conn.read().clone();
        let ask = async {
            let keys: u64 = redis::cmd("DBSIZE").query_async(&mut conn).await?;
            let info: String = redis::cmd("INFO")
                .arg("memory")
                .query_async(&mut conn)
                .await?;
            Ok::<_, redis::RedisError>((keys, info))
        };
        let budget = (self.timeout * 4).max(MIN_CONNECT_TIMEOUT);
        let (keys, info) = tokio::time::timeout(budget, ask).await.ok()?.ok()?;
        let (used_bytes, max_bytes) = super::usage::parse_info_memory(&info);
        Some(super::ShardUsage {
            shard: self.shard.clone(),
            keys,
            used_bytes,
            max_bytes,
        })
    }

    async fn run(&self, batch: &Batch<'_>) -> Result<StoreDecision, StoreError> {
        self.run_charged(batch, false).await.map(|(d, _)| d)
    }

    /// Decides `batch`; with `keep`, returns what an admitted decision
    /// charged, for [`Store::give_back`].
    pub(crate) async fn run_charged(
        &self,
        batch: &Batch<'_>,
        keep: bool,
    ) -> Result<(StoreDecision, Option<Charge>), StoreError> {
        // On the stack for the usual few limits: no allocation per call.
        let items: smallvec::SmallVec<[&Item; 4]> = batch.items.iter().collect();
        let cmd = script::decide_cmd(&self.scripts, batch, &items);
        let mut conn = self.conn.read().clone();
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
        // The whole reply is read only where it becomes a lease's receipt.
        let receipt = keep && !batch.peek;
        let reply = if receipt {
            script::parse_reply(&value, items.len())?
        } else {
            script::parse_verdicts(&value, items.len())?
        };
        self.reloads.holders_expired(&self.shard, reply.expired);
        let (allowed, now) = (reply.allowed, reply.now);
        // The reply is kept whole only as a lease's receipt.
        let (mut verdicts, kept) = if receipt && allowed {
            (reply.verdicts.clone(), Some(reply))
        } else {
            (reply.verdicts, None)
        };
        if !allowed {
            batch.uncharge(&mut verdicts);
        }
        let decision = StoreDecision {
            allowed,
            verdicts,
            shard: self.shard.clone(),
            now,
            rtt: Some(rtt),
        };
        let charge = kept.map(Charge::new);
        Ok((decision, charge))
    }

    /// Runs the release (`renew` false) or renewal script for `holder` on
    /// `items`, within the decision budget; its count.
    pub(crate) async fn holders(
        &self,
        items: &[Item],
        holder: &str,
        renew: bool,
    ) -> Result<u64, StoreError> {
        let refs: Vec<&Item> = items.iter().collect();
        let (script, cmd) = if renew {
            (
                &self.scripts.renew,
                script::renew_cmd(&self.scripts, &refs, holder),
            )
        } else {
            (
                &self.scripts.release,
                script::release_cmd(&self.scripts, &refs, holder),
            )
        };
        let mut conn = self.conn.read().clone();
        let call = script::eval_count(&mut conn, script, &cmd, &self.reloads, &self.shard);
        tokio::time::timeout(self.timeout, call)
            .await
            .map_err(|_| StoreError::Timeout)?
    }

    /// Runs the refund script for `units` of `charge`.
    pub(crate) async fn give_back_units(
        &self,
        items: &[Item],
        charge: &Charge,
        units: u64,
    ) -> Result<(), StoreError> {
        let Some(reply) = charge.inner.downcast_ref::<script::GroupReply>() else {
            return Err(StoreError::Protocol("a charge from another store".into()));
        };
        let refs: Vec<&Item> = items.iter().collect();
        if refs.len() != reply.written.len() {
            return Err(StoreError::Protocol("a charge for other limits".into()));
        }
        let Some(cmd) = script::refund_cmd(&self.scripts, &refs, reply, |_| units) else {
            return Ok(());
        };
        let mut conn = self.conn.read().clone();
        let call = script::eval(
            &mut conn,
            &self.scripts.refund,
            &cmd,
            &self.reloads,
            &self.shard,
        );
        tokio::time::timeout(self.timeout, call)
            .await
            .map_err(|_| StoreError::Timeout)?
            .map_err(script::classify)?;
        Ok(())
    }
}

#[async_trait::async_trait]
impl Store for RedisStore {
    async fn decide(&self, batch: &Batch<'_>) -> Result<StoreDecision, StoreError> {
        tokio::time::timeout(self.timeout, self.run(batch))
            .await
            .map_err(|_| StoreError::Timeout)?
    }

    async fn decide_bounded(&self, batch: &Batch<'_>) -> Result<StoreDecision, StoreError> {
        // The caller's timeout bounds the call: no second timer.
        self.run(batch).await
    }

    fn shard_for(&self, _key: &str) -> Arc<str> {
        self.shard.clone()
    }

    fn kind(&self) -> &'static str {
        "redis"
    }

    fn leases(&self) -> bool {
        true
    }

    async fn decide_charged(
        &self,
        batch: &Batch<'_>,
    ) -> Result<(StoreDecision, Option<Charge>), StoreError> {
        tokio::time::timeout(self.timeout, self.run_charged(batch, true))
            .await
            .map_err(|_| StoreError::Timeout)?
    }

    async fn give_back(
        &self,
        items: &[Item],
        charge: &Charge,
        units: u64,
    ) -> Result<(), StoreError> {
        self.give_back_units(items, charge, units).await
    }

    async fn settle(&self, settle: &super::Settle<'_>) -> Result<(), StoreError> {
        if settle.items.is_empty() {
            return Ok(());
        }
        let items: Vec<&Item> = settle.items.iter().collect();
        let cmd = script::settle_cmd(&self.scripts, settle, &items);
        let mut conn = self.conn.read().clone();
        let call = script::eval(
            &mut conn,
            &self.scripts.settle,
            &cmd,
            &self.reloads,
            &self.shard,
        );
        tokio::time::timeout(self.timeout, call)
            .await
            .map_err(|_| StoreError::Timeout)?
            .map_err(script::classify)?;
        Ok(())
    }

    async fn release(&self, items: &[Item], holder: &str) -> Result<(), StoreError> {
        if items.is_empty() {
            return Ok(());
        }
        self.holders(items, holder, false).await.map(|_| ())
    }

    async fn renew(&self, items: &[Item], holder: &str) -> Result<u64, StoreError> {
        if items.is_empty() {
            return Ok(0);
        }
        self.holders(items, holder, true).await
    }

    fn probes(&self) -> bool {
        true
    }

    async fn probe(&self, _shard: &Arc<str>) -> Result<(), StoreError> {
        self.probe_node().await
    }

    async fn usage(&self) -> Vec<super::ShardUsage> {
        self.node_usage().await.into_iter().collect()
    }

    fn observe(&self, observer: Arc<dyn super::StoreObserver>) {
        self.reloads.observe(observer);
    }
}
