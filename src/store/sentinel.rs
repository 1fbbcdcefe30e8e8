//! The master of a Redis Sentinel deployment.
//!
//! The sentinels are asked which node is the master of `master_name`
//! (`SENTINEL get-master-addr-by-name`); decisions go there, one `EVALSHA`
//! each, exactly as on a single node. The shard label is the master's
//! `host:port`, so each master has its own breaker.
//!
//! Sentinel does not push a failover to its clients. The store asks again
//! after a failed decision (at most every [`RESOLVE_EVERY`], one question at
//! a time, in the background) and on every half-open probe: a probe
//! resolves the master, proves on a fresh connection that it decides (the
//! script runs and writes, so a demoted master, now a read-only replica,
//! fails), and switches decisions to it. The promoted replica has no
//! scripts loaded; the first call there reloads them after `NOSCRIPT`.
//!
//! `rediss://` sentinel URLs make the master connection TLS too, with the
//! same `tls_*` files. Credentials in a sentinel URL are for that sentinel;
//! `[store] username` / `password` are for the master.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};
use redis::{AsyncConnectionConfig, ConnectionAddr, IntoConnectionInfo, RedisConnectionInfo};

use super::redis::RedisStore;
use super::script::{self, ReloadCounter};
use super::{Batch, Store, StoreDecision, StoreError};
use crate::policy::StoreSettings;

/// Least time between two background questions to the sentinels.
pub const RESOLVE_EVERY: Duration = Duration::from_millis(100);

/// The Redis Sentinel store. Cheap to clone; clones share everything.
#[derive(Clone)]
pub struct SentinelStore {
    inner: Arc<Inner>,
}

struct Inner {
    sentinels: Vec<redis::Client>,
    master_name: String,
    settings: StoreSettings,
    tls: bool,
    /// The master decisions go to, once one is known.
    master: RwLock<Option<RedisStore>>,
    /// The label of decisions before any master is known.
    unknown: Arc<str>,
    reloads: Arc<ReloadCounter>,
    resolving: AtomicBool,
    last_resolve: Mutex<Option<Instant>>,
    /// The sentinel that answered last, asked first next time.
    preferred: AtomicUsize,
}

impl std::fmt::Debug for SentinelStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SentinelStore")
            .field("master_name", &self.inner.master_name)
            .field("master", &self.master_shard())
            .finish()
    }
}

impl SentinelStore {
    /// A store on the master the sentinels of `settings.sentinels` name
    /// `settings.master_name`. Fails only on invalid settings: when no
    /// sentinel answers yet, decisions fail (and answer by failure policy)
    /// until one does.
    pub async fn connect(settings: &StoreSettings) -> Result<Self, StoreError> {
        let Some(master_name) = settings.master_name.clone() else {
            return Err(StoreError::Unavailable(
                "a redis-sentinel store needs `store.master_name`".into(),
            ));
        };
        if settings.sentinels.is_empty() {
            return Err(StoreError::Unavailable(
                "a redis-sentinel store needs at least one URL in `store.sentinels`".into(),
            ));
        }
        let sentinels = settings
            .sentinels
            .iter()
            .map(|url| crate::redis_client::client(url.as_str(), &settings.tls))
            .collect::<Result<Vec<_>, _>>()?;
        let tls = sentinels
            .iter()
            .any(|c| crate::redis_client::is_tls(c.get_connection_info()));
        let store = Self {
            inner: Arc::new(Inner {
                unknown: format!("sentinel:{master_name}").into(),
                sentinels,
                master_name,
                settings: settings.clone(),
                tls,
                master: RwLock::new(None),
                reloads: Arc::default(),
                resolving: AtomicBool::new(false),
                last_resolve: Mutex::new(None),
                preferred: AtomicUsize::new(0),
            }),
        };
        // Reachable sentinels name the master before the first request.
        let _ = store.resolve_and_switch().await;
        Ok(store)
    }

    /// The master decisions go to (`host:port`), once one is known.
    pub fn master_shard(&self) -> Option<Arc<str>> {
        self.inner.master.read().as_ref().map(|m| m.shard().clone())
    }

    /// Script reloads after `NOSCRIPT` so far, per master.
    pub fn script_reloads(&self) -> Vec<(Arc<str>, u64)> {
        self.inner.reloads.snapshot()
    }

    fn budget(&self) -> Duration {
        self.inner.settings.timeout.max(Duration::from_millis(200))
    }

    /// Asks the sentinels, preferred one first, for the master's address.
    async fn resolve(&self) -> Result<(String, u16), StoreError> {
        let inner = &*self.inner;
        let n = inner.sentinels.len();
        let first = inner.preferred.load(Ordering::Relaxed) % n;
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.budget()))
            .set_response_timeout(Some(self.budget()));
        let mut last = StoreError::Unavailable("no sentinel answered".into());
        for i in (0..n).map(|k| (first + k) % n) {
            let asked = async {
                let mut conn = inner.sentinels[i]
                    .get_multiplexed_async_connection_with_config(&config)
                    .await?;
                redis::cmd("SENTINEL")
                    .arg("get-master-addr-by-name")
                    .arg(&inner.master_name)
                    .query_async::<Option<(String, u16)>>(&mut conn)
                    .await
            };
            match tokio::time::timeout(self.budget(), asked).await {
                Ok(Ok(Some(addr))) => {
                    inner.preferred.store(i, Ordering::Relaxed);
                    return Ok(addr);
                }
                Ok(Ok(None)) => {
                    last = StoreError::Command(format!(
                        "the sentinels monitor no master named {:?}",
                        inner.master_name
                    ));
                }
                Ok(Err(e)) => last = script::classify(e),
                Err(_) => last = StoreError::Timeout,
            }
        }
        Err(last)
    }

    /// A (lazily connecting) store on the master at `host:port`.
    fn master_at(&self, host: String, port: u16) -> Result<RedisStore, StoreError> {
        let inner = &*self.inner;
        let addr = if inner.tls {
            ConnectionAddr::TcpTls {
                host: host.clone(),
                port,
                insecure: false,
                tls_params: None,
            }
        } else {
            ConnectionAddr::Tcp(host.clone(), port)
        };
        let mut redis = RedisConnectionInfo::default();
        if let Some(user) = &inner.settings.username {
            redis = redis.set_username(user);
        }
        if let Some(password) = &inner.settings.password {
            redis = redis.set_password(password);
        }
        let info = addr
            .into_connection_info()
            .map_err(script::classify)?
            .set_redis_settings(redis);
        let client = crate::redis_client::client(info, &inner.settings.tls)?;
        let shard: Arc<str> = if host.contains(':') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        }
        .into();
        RedisStore::with_client(client, shard, &inner.settings, inner.reloads.clone())
    }

    /// Asks the sentinels and, if they name another master, sends later
    /// decisions there (connecting on first use).
    async fn resolve_and_switch(&self) -> Result<(), StoreError> {
        let (host, port) = self.resolve().await?;
        let next = self.master_at(host, port)?;
        let mut master = self.inner.master.write();
        if master.as_ref().map(|m| m.shard()) != Some(next.shard()) {
            tracing::info!(master = %next.shard(), name = %self.inner.master_name, "sentinels name a new master");
            *master = Some(next);
        }
        Ok(())
    }

    /// [`Self::resolve_and_switch`] in the background, once at a time and
    /// at most every [`RESOLVE_EVERY`].
    fn resolve_later(&self) {
        {
            let mut last = self.inner.last_resolve.lock();
            if last.is_some_and(|t| t.elapsed() < RESOLVE_EVERY) {
                return;
            }
            *last = Some(Instant::now());
        }
        if self.inner.resolving.swap(true, Ordering::AcqRel) {
            return;
        }
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            self.inner.resolving.store(false, Ordering::Release);
            return;
        };
        let store = self.clone();
        handle.spawn(async move {
            let _ = store.resolve_and_switch().await;
            store.inner.resolving.store(false, Ordering::Release);
        });
    }

    fn current(&self) -> Option<RedisStore> {
        self.inner.master.read().clone()
    }
}

#[async_trait::async_trait]
impl Store for SentinelStore {
    async fn decide(&self, batch: &Batch<'_>) -> Result<StoreDecision, StoreError> {
        let Some(master) = self.current() else {
            self.resolve_later();
            return Err(StoreError::Unavailable(format!(
                "no sentinel has named the master {:?} yet",
                self.inner.master_name
            )));
        };
        let decided = master.decide(batch).await;
        if decided.is_err() {
            // A lost or demoted master: the sentinels may know a new one.
            self.resolve_later();
        }
        decided
    }

    async fn settle(&self, settle: &super::Settle<'_>) -> Result<(), StoreError> {
        let Some(master) = self.current() else {
            self.resolve_later();
            return Err(StoreError::Unavailable(format!(
                "no sentinel has named the master {:?} yet",
                self.inner.master_name
            )));
        };
        let settled = master.settle(settle).await;
        if settled.is_err() {
            self.resolve_later();
        }
        settled
    }

    async fn release(&self, items: &[super::Item], holder: &str) -> Result<(), StoreError> {
        match self.current() {
            Some(master) => master.release(items, holder).await,
            None => Err(StoreError::Unavailable("no master known".into())),
        }
    }

    async fn renew(&self, items: &[super::Item], holder: &str) -> Result<u64, StoreError> {
        match self.current() {
            Some(master) => master.renew(items, holder).await,
            None => Err(StoreError::Unavailable("no master known".into())),
        }
    }

    fn shard_for(&self, _key: &str) -> Arc<str> {
        self.master_shard()
            .unwrap_or_else(|| self.inner.unknown.clone())
    }

    fn kind(&self) -> &'static str {
        "redis-sentinel"
    }

    async fn usage(&self) -> Vec<super::ShardUsage> {
        match self.current() {
            Some(master) => master.node_usage().await.into_iter().collect(),
            None => Vec::new(),
        }
    }

    fn observe(&self, observer: Arc<dyn super::StoreObserver>) {
        // One counter for every master, so reloads after a failover count.
        self.inner.reloads.observe(observer);
    }

    fn probes(&self) -> bool {
        true
    }

    /// Resolves the master now and proves it decides on a fresh
    /// connection; only then do decisions move to it. Success closes the
    /// breaker of the master that failed, whose requests now go to the new
    /// master's own breaker.
    async fn probe(&self, _shard: &Arc<str>) -> Result<(), StoreError> {
        let (host, port) = self.resolve().await?;
        let named = self.master_at(host, port)?;
        let current = self.current();
        match current {
            Some(m) if m.shard() == named.shard() => m.probe_node().await,
            _ => {
                named.probe_node().await?;
                tracing::info!(master = %named.shard(), name = %self.inner.master_name, "decisions move to the new master");
                *self.inner.master.write() = Some(named);
                Ok(())
            }
        }
    }
}
