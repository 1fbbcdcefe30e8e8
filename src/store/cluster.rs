//! A Redis Cluster: the same script, routed by the first key's slot.
//!
//! The limits of one identity share a hash tag, so they are one script call
//! on the master owning that slot. Limits scoped to the client IP or to a
//! route live in other slots; a request's items are grouped by slot and the
//! groups run in parallel. If one group blocks while another admitted and
//! charged, the charged groups are refunded, so the request is all or
//! nothing as on a single node.
//!
//! `shard_for` names the master serving a key's slot from a slot map read
//! with `CLUSTER SLOTS` at start-up and re-read in the background after a
//! failed call (a moved slot or a lost node), never per request.
//!
//! When a master is lost and its replica promoted, that master's breaker
//! opens; its half-open probe re-reads the slot map and runs the decide
//! script, through the same connections decisions use, on a throwaway key
//! in a slot the lost master served. It succeeds once the promoted replica
//! decides there (the script reloaded after `NOSCRIPT`), and the slots'
//! identities, now labelled with the new master, decide exactly again.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use parking_lot::RwLock;
use redis::Value;
use redis::cluster_async::ClusterConnection;

use super::keys::hash_tag;
use super::script::{self, GroupReply, ReloadCounter, Scripts};
use super::{Batch, Charge, Item, Store, StoreDecision, StoreError};
use crate::policy::StoreSettings;

/// Slots of a Redis Cluster.
pub const SLOTS: u16 = 16384;

/// CRC16/XMODEM (polynomial 0x1021, initial value 0), the checksum Redis
/// Cluster hashes keys with.
fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in bytes {
        crc ^= (b as u16) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// The cluster slot of `key`: CRC16 of its hash tag (or of the whole key
/// without one) modulo 16384.
pub fn slot_of(key: &str) -> u16 {
    crc16(hash_tag(key).as_bytes()) % SLOTS
}

/// Ranges of slots (by first slot) and the master serving each.
type SlotMap = BTreeMap<u16, (u16, Arc<str>)>;

/// The Redis Cluster store. Cheap to clone; clones share connections, the
/// slot map and the reload counter.
#[derive(Clone)]
pub struct ClusterStore {
    /// The connections decisions use; replaced by a fresh set when a
    /// probe finds them stale and a fresh set decides.
    conn: Arc<RwLock<ClusterConnection>>,
    client: redis::cluster::ClusterClient,
    config: redis::cluster::ClusterConfig,
    scripts: Arc<Scripts>,
    slots: Arc<RwLock<SlotMap>>,
    refreshing: Arc<AtomicBool>,
    seed: Arc<str>,
    timeout: Duration,
    reloads: Arc<ReloadCounter>,
    prefix: Arc<str>,
}

impl std::fmt::Debug for ClusterStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterStore")
            .field("seed", &self.seed)
            .field("masters", &self.masters())
            .finish()
    }
}

impl ClusterStore {
    /// A store on the cluster reachable through `settings.nodes`. Fails only
    /// on invalid node URLs: connections are made in the background, so the
    /// cluster may be down at start-up (decisions fail until it is up).
    pub async fn connect(settings: &StoreSettings) -> Result<Self, StoreError> {
        if settings.nodes.is_empty() {
            return Err(StoreError::Unavailable(
                "a redis-cluster store needs at least one node in `store.nodes`".into(),
            ));
        }
        let client = crate::redis_client::cluster_builder(settings.nodes.clone(), &settings.tls)?
            .connection_timeout(settings.timeout.max(Duration::from_millis(200)))
            .response_timeout(settings.timeout)
            .overall_response_timeout(Some(settings.timeout))
            // No client-side retries: a resent EVALSHA whose first reply was
            // lost would charge every limit twice. A moved slot fails this
            // decision (the failure policy answers) and refreshes the map.
            .retries(0)
            .build()
            .map_err(|e| StoreError::Unavailable(format!("invalid cluster nodes: {e}")))?;
        let seed = redis::IntoConnectionInfo::into_connection_info(settings.nodes[0].as_str())
            .map(|info| super::redis::host_port(&info))
            .map_err(|e| StoreError::Unavailable(format!("invalid cluster node: {e}")))?;
        let config = redis::cluster::ClusterConfig::new()
            .set_connection_timeout(settings.timeout.max(Duration::from_millis(200)))
            .set_response_timeout(settings.timeout);
        let conn = client.get_pending_async_connection_with_config(config.clone());
        let store = Self {
            conn: Arc::new(RwLock::new(conn)),
            client,
            config,
            scripts: Arc::new(Scripts::new()),
            slots: Arc::new(RwLock::new(SlotMap::new())),
            refreshing: Arc::new(AtomicBool::new(false)),
            seed: seed.into(),
            timeout: settings.timeout,
            reloads: Arc::new(ReloadCounter::default()),
            prefix: settings.key_prefix.as_str().into(),
        };
        // A reachable cluster has its map before the first request; an
        // unreachable one gets it after the first failure.
        let _ = tokio::time::timeout(
            settings.timeout.max(Duration::from_millis(500)),
            store.refresh_slots(),
        )
        .await;
        Ok(store)
    }

    /// Script reloads after `NOSCRIPT` so far, per master.
    pub fn script_reloads(&self) -> Vec<(Arc<str>, u64)> {
        self.reloads.snapshot()
    }

    /// The masters in the slot map (`host:port`), sorted.
    pub fn masters(&self) -> Vec<Arc<str>> {
        let mut v: Vec<Arc<str>> = self.slots.read().values().map(|(_, m)| m.clone()).collect();
        v.sort();
        v.dedup();
        v
    }

    /// Reads `CLUSTER SLOTS` into the slot map.
    async fn refresh_slots(&self) -> Result<(), StoreError> {
        let mut conn = self.conn.read().clone();
        let value: Value = redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query_async(&mut conn)
            .await
            .map_err(script::classify)?;
        let map = parse_slots(&value)?;
        *self.slots.write() = map;
        Ok(())
    }

    /// Refreshes the slot map in the background, once at a time.
    fn refresh_later(&self) {
        if self.refreshing.swap(true, Ordering::AcqRel) {
            return;
        }
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            self.refreshing.store(false, Ordering::Release);
            return;
        };
        let store = self.clone();
        handle.spawn(async move {
            let _ = tokio::time::timeout(Duration::from_secs(2), store.refresh_slots()).await;
            store.refreshing.store(false, Ordering::Release);
        });
    }

    /// The slot ranges `master` serves in the current map.
    fn ranges_of(&self, master: &str) -> Vec<(u16, u16)> {
        self.slots
            .read()
            .iter()
            .filter(|(_, (_, m))| &**m == master)
            .map(|(&start, &(end, _))| (start, end))
            .collect()
    }

    /// A throwaway key whose slot lies in `start..=end`.
    fn probe_key_in(&self, start: u16, end: u16) -> String {
        (0u32..)
            .map(|n| format!("{}:{{health:{n}}}:probe", self.prefix))
            .find(|k| (start..=end).contains(&slot_of(k)))
            .expect("some tag hashes into every slot range")
    }

    /// Runs the decide script on `key` through `conn`.
    async fn decide_probe(&self, conn: ClusterConnection, key: &str) -> Result<(), StoreError> {
        let item = super::redis::probe_item(key);
        let batch = Batch::consume(std::slice::from_ref(&item), 1);
        let shard = self.shard_for(&item.key);
        let cmd = script::decide_cmd(&self.scripts, &batch, &[&item]);
        let value = self
            .eval_on(conn, &cmd, &self.scripts.decide, &shard)
            .await?;
        script::parse_reply(&value, 1).map(|_| ())
    }

    fn master_of(&self, slot: u16) -> Option<Arc<str>> {
        let map = self.slots.read();
        map.range(..=slot)
            .next_back()
            .filter(|(_, (end, _))| slot <= *end)
            .map(|(_, (_, master))| master.clone())
    }

    async fn eval(
        &self,
        cmd: &redis::Cmd,
        script: &redis::Script,
        shard: &Arc<str>,
    ) -> Result<Value, StoreError> {
        let conn = self.conn.read().clone();
        self.eval_on(conn, cmd, script, shard).await
    }

    async fn eval_on(
        &self,
        mut conn: ClusterConnection,
        cmd: &redis::Cmd,
        script: &redis::Script,
        shard: &Arc<str>,
    ) -> Result<Value, StoreError> {
        let first = script::eval(&mut conn, script, cmd, &self.reloads, shard).await;
        let result = match first {
            // While it repairs a lost node's connection, the cluster client
            // may hand a command for a healthy slot to another node, dead or
            // alive. A command that never ran cannot have charged anything,
            // so sending it once more cannot charge twice.
            Err(e) if never_delivered(&e) => {
                script::eval(&mut conn, script, cmd, &self.reloads, shard).await
            }
            other => other,
        };
        result.map_err(|e| {
            // A moved slot or a lost node: the map may be stale.
            if !script::is_noscript(&e) {
                self.refresh_later();
            }
            script::classify(e)
        })
    }

    async fn decide_group(
        &self,
        batch: &Batch<'_>,
        items: &[&Item],
    ) -> Result<GroupReply, StoreError> {
        let shard = self.shard_for(&items[0].key);
        let cmd = script::decide_cmd(&self.scripts, batch, items);
        // Each group times out a little before the whole decision does, so
        // a frozen master is named as the one that failed and healthy ones
        // are not blamed with it.
        let budget = self.timeout.mul_f64(0.9);
        let value = tokio::time::timeout(budget, self.eval(&cmd, &self.scripts.decide, &shard))
            .await
            .map_err(|_| StoreError::Timeout.on_shard(shard.clone()))?
            .map_err(|e| e.on_shard(shard.clone()))?;
        let reply =
            script::parse_reply(&value, items.len()).map_err(|e| e.on_shard(shard.clone()))?;
        self.reloads.holders_expired(&shard, reply.expired);
        Ok(reply)
    }

    /// Releases (`renew` false) or renews `holder`'s slots on `items`, one
    /// script call per slot, in parallel; the sum of their counts.
    async fn holders(&self, items: &[Item], holder: &str, renew: bool) -> Result<u64, StoreError> {
        let mut groups: Vec<(u16, Vec<&Item>)> = Vec::new();
        for item in items {
            let slot = slot_of(&item.key);
            match groups.iter_mut().find(|(s, _)| *s == slot) {
                Some((_, g)) => g.push(item),
                None => groups.push((slot, vec![item])),
            }
        }
        let calls = groups.iter().map(|(_, group)| async move {
            let shard = self.shard_for(&group[0].key);
            let (script, cmd) = if renew {
                (
                    &self.scripts.renew,
                    script::renew_cmd(&self.scripts, group, holder),
                )
            } else {
                (
                    &self.scripts.release,
                    script::release_cmd(&self.scripts, group, holder),
                )
            };
            let conn = self.conn.read().clone();
            let mut conn = conn;
            script::eval_count(&mut conn, script, &cmd, &self.reloads, &shard)
                .await
                .map_err(|e| e.on_shard(shard))
        });
        let mut total = 0;
        for r in tokio::time::timeout(self.timeout, join_all(calls))
            .await
            .map_err(|_| StoreError::Timeout)?
        {
            total += r?;
        }
        Ok(total)
    }

    async fn refund(
        &self,
        items: &[&Item],
        reply: &GroupReply,
        cost_of: impl Fn(&Item) -> u64,
    ) -> Result<(), StoreError> {
        let Some(cmd) = script::refund_cmd(&self.scripts, items, reply, cost_of) else {
            return Ok(());
        };
        let shard = self.shard_for(&items[0].key);
        self.eval(&cmd, &self.scripts.refund, &shard)
            .await
            .map(|_| ())
    }

    async fn run(&self, batch: &Batch<'_>) -> Result<StoreDecision, StoreError> {
        self.run_charged(batch, false).await.map(|(d, _)| d)
    }

    /// Decides `batch`; with `keep`, returns what an admitted decision
    /// charged in each slot, for [`Store::give_back`].
    async fn run_charged(
        &self,
        batch: &Batch<'_>,
        keep: bool,
    ) -> Result<(StoreDecision, Option<Charge>), StoreError> {
        // Items grouped by slot, in order of first appearance.
        let mut groups: Vec<(u16, Vec<usize>)> = Vec::new();
        for (i, item) in batch.items.iter().enumerate() {
            let slot = slot_of(&item.key);
            match groups.iter_mut().find(|(s, _)| *s == slot) {
                Some((_, idx)) => idx.push(i),
                None => groups.push((slot, vec![i])),
            }
        }
        let grouped: Vec<Vec<&Item>> = groups
            .iter()
            .map(|(_, idx)| idx.iter().map(|&i| &batch.items[i]).collect())
            .collect();
        let started = Instant::now();
        let replies = join_all(grouped.iter().map(|items| self.decide_group(batch, items))).await;
        let rtt = started.elapsed();

        let failed = replies.iter().any(Result::is_err);
        let allowed = !failed && replies.iter().all(|r| r.as_ref().is_ok_and(|r| r.allowed));
        if !allowed && !batch.peek {
            // Give back what the admitted groups charged, so the request
            // consumed nothing anywhere.
            let refunds = grouped
                .iter()
                .zip(&replies)
                .filter_map(|(items, r)| r.as_ref().ok().map(|r| (items, r)))
                .filter(|(_, r)| r.allowed)
                .map(|(items, r)| self.refund(items, r, |i| batch.cost_of(i)));
            for r in join_all(refunds).await {
                // Over-charging is the safe side: a failed refund must not
                // turn a decision the store blocked into a fallback.
                if let Err(e) = r {
                    tracing::warn!(error = %e, "refund after a blocked request failed; the admitted limits stay charged");
                }
            }
            // In-flight slots the admitted groups took go back too (a slot
            // not given back expires after its hold timeout).
            if let Some(holder) = batch.holder {
                let taken: Vec<Item> = grouped
                    .iter()
                    .zip(&replies)
                    .filter(|(_, r)| r.as_ref().is_ok_and(|r| r.allowed))
                    .flat_map(|(items, _)| items.iter())
                    .filter(|i| i.algorithm.is_concurrency())
                    .map(|i| (*i).clone())
                    .collect();
                if !taken.is_empty()
                    && let Err(e) = self.holders(&taken, holder, false).await
                {
                    tracing::warn!(error = %e, "in-flight release after a blocked request failed; the slots expire after their hold timeout");
                }
            }
        }
        let kept: Option<ClusterCharge> = (keep && allowed && !batch.peek).then(|| {
            groups
                .iter()
                .zip(&replies)
                .filter_map(|((_, idx), r)| r.as_ref().ok().map(|r| (idx.clone(), r.clone())))
                .collect()
        });
        let mut verdicts = vec![None; batch.items.len()];
        let mut now = None;
        for ((_, idx), reply) in groups.iter().zip(replies) {
            let reply = reply?;
            now.get_or_insert(reply.now);
            for (&i, v) in idx.iter().zip(reply.verdicts) {
                verdicts[i] = Some(v);
            }
        }
        let mut verdicts: super::Verdicts = verdicts.into_iter().flatten().collect();
        if verdicts.len() != batch.items.len() {
            return Err(StoreError::Protocol("a limit got no verdict".into()));
        }
        if !allowed {
            batch.uncharge(&mut verdicts);
        }
        let shard = batch
            .items
            .first()
            .map_or_else(|| self.seed.clone(), |i| self.shard_for(&i.key));
        let decision = StoreDecision {
            allowed,
            verdicts,
            shard,
            now: now.unwrap_or_else(|| crate::clock::Clock::now_us(&crate::clock::SystemClock)),
            rtt: Some(rtt),
        };
        Ok((decision, kept.map(Charge::new)))
    }

    /// Gives `units` of `charge` back, slot by slot.
    async fn give_back_units(
        &self,
        items: &[Item],
        charge: &Charge,
        units: u64,
    ) -> Result<(), StoreError> {
        let Some(groups) = charge.inner.downcast_ref::<ClusterCharge>() else {
            return Err(StoreError::Protocol("a charge from another store".into()));
        };
        let refunds = groups.iter().map(|(idx, reply)| async move {
            let group: Vec<&Item> = idx.iter().filter_map(|&i| items.get(i)).collect();
            if group.len() != idx.len() {
                return Err(StoreError::Protocol("a charge for other limits".into()));
            }
            self.refund(&group, reply, |_| units).await
        });
        tokio::time::timeout(self.timeout, join_all(refunds))
            .await
            .map_err(|_| StoreError::Timeout)?
            .into_iter()
            .collect()
    }
}

impl ClusterStore {
    /// Settles slot by slot: one settle script per slot group, all sent
    /// at once, within the store's budget.
    async fn settle_groups(&self, settle: &super::Settle<'_>) -> Result<(), StoreError> {
        let mut groups: Vec<(u16, Vec<&Item>)> = Vec::with_capacity(1);
        for item in settle.items {
            let slot = slot_of(&item.key);
            match groups.iter_mut().find(|(s, _)| *s == slot) {
                Some((_, g)) => g.push(item),
                None => groups.push((slot, vec![item])),
            }
        }
        let calls = groups.iter().map(|(_, items)| async move {
            let shard = self.shard_for(&items[0].key);
            let cmd = script::settle_cmd(&self.scripts, settle, items);
            self.eval(&cmd, &self.scripts.settle, &shard)
                .await
                .map(|_| ())
                .map_err(|e| e.on_shard(shard))
        });
        tokio::time::timeout(self.timeout, join_all(calls))
            .await
            .map_err(|_| StoreError::Timeout)?
            .into_iter()
            .collect()
    }
}

/// What an admitted decision charged: per slot, the items' indices and the
/// script's reply.
type ClusterCharge = Vec<(Vec<usize>, GroupReply)>;

/// Whether `e` says the command never ran: the connection was refused or
/// not there, the client found it already closed when it came to write
/// (redis-rs reports that as a bare broken pipe; its io error is not
/// reachable through `source`, hence the text), or a node refused it
/// without running it (`MOVED`, `ASK`, `TRYAGAIN`, `CLUSTERDOWN`,
/// `MASTERDOWN`), as happens while the client repairs its view of a lost
/// node and sends a command to the wrong one.
fn never_delivered(e: &redis::RedisError) -> bool {
    use redis::ServerErrorKind as S;
    matches!(
        e.kind(),
        redis::ErrorKind::ClusterConnectionNotFound
            | redis::ErrorKind::Server(
                S::Moved | S::Ask | S::TryAgain | S::ClusterDown | S::MasterDown
            )
    ) || e.is_connection_refusal()
        || (e.is_io_error() && e.to_string().to_ascii_lowercase().contains("broken pipe"))
}

/// Parses a `CLUSTER SLOTS` reply: `[[start, end, [host, port, id], ...], ...]`.
fn parse_slots(value: &Value) -> Result<SlotMap, StoreError> {
    let bad = || StoreError::Protocol("unexpected CLUSTER SLOTS reply".into());
    let num = |v: &Value| match v {
        Value::Int(n) => u16::try_from(*n).ok(),
        _ => None,
    };
    let Value::Array(ranges) = value else {
        return Err(bad());
    };
    let mut map = SlotMap::new();
    for range in ranges {
        let Value::Array(r) = range else {
            return Err(bad());
        };
        let (Some(start), Some(end)) = (r.first().and_then(num), r.get(1).and_then(num)) else {
            return Err(bad());
        };
        let Some(Value::Array(master)) = r.get(2) else {
            return Err(bad());
        };
        let host = match master.first() {
            Some(Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
            Some(Value::SimpleString(s)) => s.clone(),
            _ => return Err(bad()),
        };
        let port = master.get(1).and_then(num).ok_or_else(bad)?;
        map.insert(start, (end, format!("{host}:{port}").into()));
    }
    Ok(map)
}

#[async_trait::async_trait]
impl Store for ClusterStore {
    async fn decide(&self, batch: &Batch<'_>) -> Result<StoreDecision, StoreError> {
        tokio::time::timeout(self.timeout, self.run(batch))
            .await
            .map_err(|_| StoreError::Timeout)?
    }

    async fn release(&self, items: &[Item], holder: &str) -> Result<(), StoreError> {
        self.holders(items, holder, false).await.map(|_| ())
    }

    async fn renew(&self, items: &[Item], holder: &str) -> Result<u64, StoreError> {
        self.holders(items, holder, true).await
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
        self.settle_groups(settle).await
    }

    fn shard_for(&self, key: &str) -> Arc<str> {
        match self.master_of(slot_of(key)) {
            Some(master) => master,
            None => {
                self.refresh_later();
                self.seed.clone()
            }
        }
    }

    async fn usage(&self) -> Vec<super::ShardUsage> {
        let budget = (self.timeout * 4).max(Duration::from_millis(200));
        let asks = self.masters().into_iter().map(|master| async move {
            let (host, port) = master.rsplit_once(':')?;
            let routing = || {
                redis::cluster_routing::RoutingInfo::SingleNode(
                    redis::cluster_routing::SingleNodeRoutingInfo::ByAddress {
                        host: host.to_owned(),
                        port: port.parse().unwrap_or(0),
                    },
                )
            };
            let mut conn = self.conn.read().clone();
            let ask = async {
                let keys = conn
                    .route_command(redis::cmd("DBSIZE"), routing())
                    .await
                    .ok()?;
                let mut info = redis::cmd("INFO");
                info.arg("memory");
                let info = conn.route_command(info, routing()).await.ok()?;
                let keys: u64 = redis::from_redis_value(keys).ok()?;
                let info: String = redis::from_redis_value(info).ok()?;
                Some((keys, info))
            };
            let (keys, info) = tokio::time::timeout(budget, ask).await.ok()??;
            let (used_bytes, max_bytes) = super::usage::parse_info_memory(&info);
            Some(super::ShardUsage {
                shard: master,
                keys,
                used_bytes,
                max_bytes,
            })
        });
        join_all(asks).await.into_iter().flatten().collect()
    }

    fn kind(&self) -> &'static str {
        "redis-cluster"
    }

    fn probes(&self) -> bool {
        true
    }

    /// Re-reads the slot map, then decides a throwaway key in a slot
    /// `shard` served, through the connections decisions use. If that
    /// fails, their sockets or slot map may be stale: a fresh set of
    /// connections tries, and replaces them if it decides.
    async fn probe(&self, shard: &Arc<str>) -> Result<(), StoreError> {
        let mut ranges = self.ranges_of(shard);
        // Through stale connections the map may not come; the old ranges
        // still name a slot to probe.
        let refreshed = self.refresh_slots().await;
        if ranges.is_empty() {
            refreshed?;
            ranges = self.ranges_of(shard);
        }
        let Some(&(start, end)) = ranges.first() else {
            // Not a master before or now: nothing routes to it.
            return Ok(());
        };
        let key = self.probe_key_in(start, end);
        let current = self.conn.read().clone();
        if self.decide_probe(current, &key).await.is_ok() {
            return Ok(());
        }
        let fresh = self
            .client
            .get_async_connection_with_config(self.config.clone())
            .await
            .map_err(script::classify)?;
        self.decide_probe(fresh.clone(), &key).await?;
        *self.conn.write() = fresh;
        let _ = self.refresh_slots().await;
        Ok(())
    }

    fn observe(&self, observer: Arc<dyn super::StoreObserver>) {
        self.reloads.observe(observer);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_match_the_redis_cluster_specification() {
        // The check value of CRC16/XMODEM, and slots `CLUSTER KEYSLOT` gives.
        assert_eq!(crc16(b"123456789"), 0x31c3);
        assert_eq!(slot_of("foo"), 12182);
        assert_eq!(
            slot_of("{user1000}.following"),
            slot_of("{user1000}.followers")
        );
        assert_eq!(slot_of("rw:{free:abc}:burst"), slot_of("free:abc"));
    }
}
