//! The fleet view in Redis: every instance HINCRBYs its flushed batch into
//! shared bucket keys, and any instance (or the dashboard) reads them back.
//!
//! Keys, with the bucket as hash tag so one bucket's pipeline is
//! single-slot on a cluster:
//!
//! ```text
//! {prefix}:tm:{10s:<start>}:c      hash  tier|outcome|shard|route -> decisions
//! {prefix}:tm:{10s:<start>}:blk    zset  cause|identity (display form) -> blocked
//! {prefix}:tm:{10s:<start>}:hot    zset  tier|shard|identity -> decisions
//! {prefix}:tm:{10s:<start>}:rtt    hash  shard|le -> round trips
//! {prefix}:tm:{10s:<start>}:trips  hash  shard -> breaker trips
//! {prefix}:tm:{10s:<start>}:brk    hash  shard|state -> instance flushes in that state
//! {prefix}:tm:{10s:<start>}:pol    hash  version#hash -> flushes that ran it
//! {prefix}:tm:{10s:<start>}:inst   hash  instance -> events it flushed
//! {prefix}:tm:{10s:<start>}:seen   hash  instance -> when it last flushed (Unix s)
//! {prefix}:tm:{10s:<start>}:u      hash  tier|unit -> units charged
//! {prefix}:tm:{10s:<start>}:uk:<unit>  zset  tier|identity -> units charged
//! ```
//! and the same under `{1m:<start>}`. 10 s buckets expire after an hour,
//! 1 min buckets after two days; every write re-arms the expiry.
//!
//! The connection is made lazily and never blocks a decision: while Redis
//! is away a flush fails fast (or times out) and its batch is kept, bounded
//! (see [`super::pending`]), and written into its original buckets once
//! Redis answers again.
//!
//! Reads cost O(`top_keys`) per bucket whatever the number of identities
//! written: the zsets are read with `ZREVRANGE key 0 top_keys-1`.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use redis::aio::ConnectionManager;
use redis::cluster_async::ClusterConnection;
use tokio::sync::OnceCell;

use super::TelemetryError;
use super::aggregate::Flat;
use super::fleet::{RESOLUTIONS, Resolution};
use super::metrics::{RttOp, record_redis_rtt};
use super::pending::{MAX_PENDING_BUCKETS, Pending, PendingBuckets, PendingStats, expired};

/// Where the fleet view lives in Redis.
#[derive(Debug, Clone, PartialEq)]
pub struct RedisTarget {
    /// One node or a cluster.
    pub endpoints: Endpoints,
    /// Prefix of every key (`store.key_prefix`).
    pub key_prefix: String,
    /// Budget of one flush (and of one read); past it the flush is dropped.
    pub timeout: Duration,
    /// What a `rediss://` connection trusts and presents (`store.tls_*`);
    /// shared, so the sink stays small.
    pub tls: std::sync::Arc<crate::policy::TlsFiles>,
}

/// One Redis node or a cluster's seed nodes.
#[derive(Debug, Clone, PartialEq)]
pub enum Endpoints {
    /// A single node: `redis://host:port`.
    Node(String),
    /// Cluster seed nodes: `redis://host:port` each.
    Cluster(Vec<String>),
}

impl RedisTarget {
    /// A single node, with a 1 s flush budget.
    pub fn node(url: impl Into<String>, key_prefix: impl Into<String>) -> Self {
        Self {
            endpoints: Endpoints::Node(url.into()),
            key_prefix: key_prefix.into(),
            timeout: Duration::from_secs(1),
            tls: Default::default(),
        }
    }

    /// A cluster from its seed nodes, with a 1 s flush budget.
    pub fn cluster(nodes: Vec<String>, key_prefix: impl Into<String>) -> Self {
        Self {
            endpoints: Endpoints::Cluster(nodes),
            key_prefix: key_prefix.into(),
            timeout: Duration::from_secs(1),
            tls: Default::default(),
        }
    }

    /// Trusts (and presents) the TLS files of the store's settings.
    pub fn with_tls(mut self, tls: crate::policy::TlsFiles) -> Self {
        self.tls = std::sync::Arc::new(tls);
        self
    }

    /// Sets the budget of one flush or read.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The key of one part (`c`, `top`, `rtt`, `trips`) of a bucket.
    pub fn key(&self, res: Resolution, start: u64, part: &str) -> String {
        format!("{}:tm:{{{}}}:{part}", self.key_prefix, res.tag(start))
    }

    /// The `shard` label of telemetry round trips: the node's `host:port`,
    /// or `cluster`.
    fn shard_label(&self) -> String {
        match &self.endpoints {
            Endpoints::Node(url) => host_port(url),
            Endpoints::Cluster(_) => "cluster".into(),
        }
    }
}

fn host_port(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let rest = rest.rsplit_once('@').map_or(rest, |(_, r)| r);
    rest.split('/').next().unwrap_or(rest).to_owned()
}

#[derive(Clone)]
enum Conn {
    Node(ConnectionManager),
    Cluster(ClusterConnection),
}

impl Conn {
    async fn query<T: redis::FromRedisValue>(
        &mut self,
        p: &redis::Pipeline,
    ) -> redis::RedisResult<T> {
        match self {
            Conn::Node(c) => p.query_async(c).await,
            Conn::Cluster(c) => p.query_async(c).await,
        }
    }
}

/// What a read got: the buckets that answered, and those that did not (a
/// cluster shard that is down; always empty on a single node, where a
/// failure fails the read).
#[derive(Debug, Default)]
pub(crate) struct Partial {
    /// `(start, data)` of every bucket that answered.
    pub buckets: Vec<(u64, Flat)>,
    /// Starts of the buckets that did not answer, oldest first.
    pub missing: Vec<u64>,
    /// Why the last of them did not.
    pub reason: Option<String>,
}

/// Writes flushed batches into, and reads buckets from, Redis.
pub(crate) struct RedisSink {
    target: RedisTarget,
    shard: String,
    conn: OnceCell<Conn>,
    /// Identities kept per bucket zset.
    keep_top: usize,
    /// Identities read per bucket zset.
    read_top: usize,
    /// Batches Redis has not taken yet.
    pending: PendingBuckets,
}

impl std::fmt::Debug for RedisSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisSink")
            .field("target", &self.target)
            .field("connected", &self.conn.initialized())
            .finish()
    }
}

impl RedisSink {
    pub fn new(target: RedisTarget, top_keys: usize) -> Self {
        Self {
            shard: target.shard_label(),
            target,
            conn: OnceCell::new(),
            keep_top: top_keys.max(1) * 4,
            read_top: top_keys.max(1),
            pending: PendingBuckets::new(MAX_PENDING_BUCKETS, top_keys.max(1) * 4),
        }
    }

    async fn conn(&self) -> Result<Conn, TelemetryError> {
        let t = self.target.timeout;
        let c = self
            .conn
            .get_or_try_init(|| async {
                match &self.target.endpoints {
                    Endpoints::Node(url) => {
                        let client = crate::redis_client::client(url.as_str(), &self.target.tls)
                            .map_err(redis::RedisError::from)?;
                        let config = redis::aio::ConnectionManagerConfig::new()
                            .set_connection_timeout(Some(t))
                            .set_response_timeout(Some(t))
                            .set_number_of_retries(2)
                            .set_min_delay(Duration::from_millis(100))
                            .set_max_delay(Duration::from_secs(2));
                        // Lazy: connects on first use, reconnects by itself.
                        Ok::<_, TelemetryError>(Conn::Node(
                            ConnectionManager::new_lazy_with_config(client, config)?,
                        ))
                    }
                    Endpoints::Cluster(nodes) => {
                        let client =
                            crate::redis_client::cluster_builder(nodes.clone(), &self.target.tls)
                                .map_err(redis::RedisError::from)?
                                .connection_timeout(t)
                                .response_timeout(t)
                                .overall_response_timeout(Some(t))
                                // A resent pipeline whose reply was lost would
                                // count its events twice.
                                .retries(0)
                                .build()?;
                        let conn = tokio::time::timeout(t, client.get_async_connection())
                            .await
                            .map_err(|_| TelemetryError::Timeout)??;
                        Ok(Conn::Cluster(conn))
                    }
                }
            })
            .await?;
        Ok(c.clone())
    }

    /// The pipeline writing `flat` into the bucket of `res` holding `at`;
    /// the keys expire when the bucket's span is older than the retention,
    /// counted from `now` (a batch written late does not live longer).
    fn pipeline(&self, res: Resolution, at: u64, now: u64, flat: &Flat) -> redis::Pipeline {
        let start = res.bucket_of(at);
        let ttl = (start + res.keep + res.secs).saturating_sub(now).max(1) as i64;
        let mut p = redis::pipe();
        let parts: [(&str, &[(String, u64)]); 7] = [
            ("c", &flat.counters),
            ("u", &flat.units),
            ("rtt", &flat.rtt),
            ("trips", &flat.trips),
            ("brk", &flat.breakers),
            ("pol", &flat.policies),
            ("inst", &flat.instances),
        ];
        for (part, fields) in parts {
            if fields.is_empty() {
                continue;
            }
            let key = self.target.key(res, start, part);
            for (f, n) in fields {
                p.hincr(&key, f, *n).ignore();
            }
            p.expire(&key, ttl).ignore();
        }
        if !flat.reported.is_empty() {
            // When the instance's events reached the fleet view: the time
            // this write is built (a batch an outage kept is reported when
            // Redis takes it, not when it was decided), to the second. A
            // time, not a count: the latest write wins.
            let key = self.target.key(res, start, "seen");
            let written = super::unix_now().max(now);
            let seen: Vec<(&str, u64)> = flat
                .reported
                .iter()
                .map(|(name, at)| (name.as_str(), (*at).max(written)))
                .collect();
            p.hset_multiple(&key, &seen).ignore();
            p.expire(&key, ttl).ignore();
        }
        for (part, members) in [("blk", &flat.top), ("hot", &flat.hot)] {
            if members.is_empty() {
                continue;
            }
            let key = self.target.key(res, start, part);
            for (id, n) in members {
                p.zincr(&key, id, *n).ignore();
            }
            // Lowest ranks go first; keep the `keep_top` highest.
            p.zremrangebyrank(&key, 0, -(self.keep_top as isize) - 1)
                .ignore();
            p.expire(&key, ttl).ignore();
        }
        // One zset per unit (names from the policy: `a-z0-9_`), so a unit
        // counted in thousands never crowds another out of its top keys.
        let mut by_unit: Vec<(&str, Vec<(&str, u64)>)> = Vec::new();
        for (member, n) in &flat.unit_keys {
            let Some((unit, rest)) = member.split_once('|') else {
                continue;
            };
            match by_unit.iter_mut().find(|(u, _)| *u == unit) {
                Some((_, v)) => v.push((rest, *n)),
                None => by_unit.push((unit, vec![(rest, *n)])),
            }
        }
        for (unit, members) in by_unit {
            let key = self.target.key(res, start, &format!("uk:{unit}"));
            for (id, n) in members {
                p.zincr(&key, id, n).ignore();
            }
            p.zremrangebyrank(&key, 0, -(self.keep_top as isize) - 1)
                .ignore();
            p.expire(&key, ttl).ignore();
        }
        p
    }

    /// Writes the batch flushed at `now` (if it holds anything), after
    /// every batch an earlier failure kept, oldest first, each into the
    /// buckets of the time it was flushed. The first failure stops: it and
    /// the batches after it are kept for the next flush (bounded, see
    /// [`PendingBuckets`]) and the error returned.
    ///
    /// A write whose reply is lost after Redis applied it (a timeout at the
    /// wrong moment) is written again: the fleet view may count such a
    /// batch twice, never lose it.
    pub async fn write(&self, now: u64, flat: Option<Flat>) -> Result<(), TelemetryError> {
        if let Some(flat) = flat {
            self.pending.push(Pending::new(now, flat));
        }
        let mut queue = self.pending.take();
        // A cluster keeps each bucket on its own shard: a bucket whose
        // shard refused is kept and the next buckets are still written, so
        // one lost master delays only its own buckets. A timeout stops the
        // flush (every further bucket could wait as long).
        let per_bucket = matches!(self.target.endpoints, Endpoints::Cluster(_));
        let mut failed = Vec::new();
        let mut first_error = None;
        while let Some(mut item) = queue.pop_front() {
            if let Err(e) = self.write_one(now, &mut item).await {
                tracing::debug!(
                    error = %e,
                    events = item.flat.events,
                    "fleet view flush failed; kept for a later flush"
                );
                let stop = !per_bucket || e.is_timeout();
                failed.push(item);
                first_error.get_or_insert(e);
                if stop {
                    break;
                }
                continue;
            }
            self.pending.written(&item);
        }
        match first_error {
            None => Ok(()),
            Some(e) => {
                self.pending.put_back(failed.into_iter().chain(queue));
                Err(e)
            }
        }
    }

    /// What waits for Redis, and what the buffer dropped.
    pub fn pending(&self) -> PendingStats {
        self.pending.stats()
    }

    /// One batch: one pipeline per resolution not yet written, all within
    /// the target's timeout; marks each resolution written as it lands.
    async fn write_one(&self, now: u64, item: &mut Pending) -> Result<(), TelemetryError> {
        let started = Instant::now();
        let work = async {
            let mut conn = self.conn().await?;
            for (i, res) in RESOLUTIONS.iter().enumerate() {
                if item.done[i] || expired(*res, item.at, now) {
                    item.done[i] = true;
                    continue;
                }
                let p = self.pipeline(*res, item.at, now, &item.flat);
                conn.query::<()>(&p).await?;
                item.done[i] = true;
            }
            Ok::<_, TelemetryError>(())
        };
        match tokio::time::timeout(self.target.timeout, work).await {
            Ok(Ok(())) => {
                record_redis_rtt(&self.shard, RttOp::Telemetry, started.elapsed());
                Ok(())
            }
            Ok(Err(e)) => Err(e),
            Err(_) => Err(TelemetryError::Timeout),
        }
    }

    /// Reads the buckets of `starts` at resolution `res`.
    ///
    /// A single node: the newest bucket must answer within `first_answer`,
    /// the whole read within four times the target's timeout, and any
    /// failure fails the read: a Redis that does not answer is known
    /// quickly, while a long range on a live Redis may take longer.
    ///
    /// A cluster keeps each bucket on the shard its hash tag names, so one
    /// lost master loses only its buckets: each bucket gets `first_answer`,
    /// the buckets that did not answer are listed in
    /// [`Partial::missing`], and the read fails only when none answered.
    pub async fn read(
        &self,
        res: Resolution,
        starts: &[u64],
        first_answer: Duration,
    ) -> Result<Partial, TelemetryError> {
        let Some((&newest, older)) = starts.split_last() else {
            return Ok(Partial::default());
        };
        if let Endpoints::Cluster(_) = self.target.endpoints {
            return self.read_partial(res, starts, first_answer).await;
        }
        let first = tokio::time::timeout(first_answer, async {
            let mut conn = self.conn().await?;
            self.read_bucket(&mut conn, res, newest).await
        })
        .await
        .map_err(|_| TelemetryError::Timeout)??;
        let conn = self.conn().await?;
        let work = futures_util::stream::iter(older.iter().copied())
            .map(|start| {
                let mut conn = conn.clone();
                async move { self.read_bucket(&mut conn, res, start).await }
            })
            .buffer_unordered(16)
            .collect::<Vec<_>>();
        let rows = tokio::time::timeout(self.target.timeout * 4, work)
            .await
            .map_err(|_| TelemetryError::Timeout)?;
        let mut out: Vec<(u64, Flat)> = rows.into_iter().collect::<Result<_, _>>()?;
        out.push(first);
        Ok(Partial {
            buckets: out,
            ..Partial::default()
        })
    }

    /// A cluster's read: every bucket on its own, within `each`.
    async fn read_partial(
        &self,
        res: Resolution,
        starts: &[u64],
        each: Duration,
    ) -> Result<Partial, TelemetryError> {
        let conn = tokio::time::timeout(each, self.conn())
            .await
            .map_err(|_| TelemetryError::Timeout)??;
        let work = futures_util::stream::iter(starts.iter().copied())
            .map(|start| {
                let mut conn = conn.clone();
                async move {
                    let row = tokio::time::timeout(each, self.read_bucket(&mut conn, res, start))
                        .await
                        .map_err(|_| TelemetryError::Timeout)
                        .and_then(|r| r);
                    (start, row)
                }
            })
            .buffer_unordered(16)
            .collect::<Vec<_>>();
        let rows = tokio::time::timeout(self.target.timeout * 4, work)
            .await
            .map_err(|_| TelemetryError::Timeout)?;
        let mut out = Partial::default();
        let mut last_error = None;
        for (start, row) in rows {
            match row {
                Ok(bucket) => out.buckets.push(bucket),
                Err(e) => {
                    out.missing.push(start);
                    last_error = Some(e);
                }
            }
        }
        match last_error {
            Some(e) if out.buckets.is_empty() => Err(e),
            Some(e) => {
                out.missing.sort_unstable();
                out.reason = Some(e.to_string());
                Ok(out)
            }
            None => Ok(out),
        }
    }

    /// One bucket: its hashes whole (bounded by the policy's labels) and the
    /// `read_top` highest members of each zset.
    async fn read_bucket(
        &self,
        conn: &mut Conn,
        res: Resolution,
        start: u64,
    ) -> Result<(u64, Flat), TelemetryError> {
        let last = self.read_top as isize - 1;
        let mut p = redis::pipe();
        p.hgetall(self.target.key(res, start, "c"))
            .zrevrange_withscores(self.target.key(res, start, "blk"), 0, last)
            .zrevrange_withscores(self.target.key(res, start, "hot"), 0, last)
            .hgetall(self.target.key(res, start, "rtt"))
            .hgetall(self.target.key(res, start, "trips"))
            .hgetall(self.target.key(res, start, "brk"))
            .hgetall(self.target.key(res, start, "pol"))
            .hgetall(self.target.key(res, start, "inst"))
            .hgetall(self.target.key(res, start, "seen"))
            .hgetall(self.target.key(res, start, "u"));
        type Row = (
            HashMap<String, u64>,
            Vec<(String, f64)>,
            Vec<(String, f64)>,
            HashMap<String, u64>,
            HashMap<String, u64>,
            HashMap<String, u64>,
            HashMap<String, u64>,
            HashMap<String, u64>,
            HashMap<String, u64>,
            HashMap<String, u64>,
        );
        let (c, top, hot, rtt, trips, brk, pol, inst, seen, units): Row = conn.query(&p).await?;
        let scores = |v: Vec<(String, f64)>| -> Vec<(String, u64)> {
            v.into_iter().map(|(k, s)| (k, s.max(0.0) as u64)).collect()
        };
        // The units charged name the per-unit zsets to read: a second
        // round trip, only for buckets where units were charged.
        let mut names: Vec<&str> = units
            .keys()
            .filter_map(|f| super::aggregate::parse_unit_field(f).map(|(_, u)| u))
            .collect();
        names.sort_unstable();
        names.dedup();
        names.truncate(super::aggregate::MAX_UNITS);
        let mut unit_keys = Vec::new();
        if !names.is_empty() {
            let mut p = redis::pipe();
            for unit in &names {
                p.zrevrange_withscores(self.target.key(res, start, &format!("uk:{unit}")), 0, last);
            }
            let rows: Vec<Vec<(String, f64)>> = conn.query(&p).await?;
            for (unit, row) in names.iter().zip(rows) {
                for (member, n) in scores(row) {
                    unit_keys.push((format!("{unit}|{member}"), n));
                }
            }
        }
        let units = units.into_iter().collect();
        Ok((
            start,
            Flat {
                units,
                unit_keys,
                counters: c.into_iter().collect(),
                top: scores(top),
                hot: scores(hot),
                rtt: rtt.into_iter().collect(),
                trips: trips.into_iter().collect(),
                breakers: brk.into_iter().collect(),
                policies: pol.into_iter().collect(),
                instances: inst.into_iter().collect(),
                reported: seen.into_iter().collect(),
                events: 0,
            },
        ))
    }
}
