//! The Lua scripts both Redis stores run, and how a batch becomes one
//! `EVALSHA` and its reply becomes verdicts.
//!
//! `lua/common.lua` and the six algorithm files are concatenated with
//! `lua/decide.lua` (or `lua/refund.lua`) into one script, so a request's
//! limits are decided in one atomic call. Arguments and replies keep
//! numbers exact: floats travel as shortest round-trip decimal strings one
//! way and as a double's eight bytes the other; the decide script answers
//! one binary string, read in place.

use std::collections::HashMap;
use std::io::Write as _;
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};
use redis::{Cmd, ErrorKind, RedisError, RedisWrite as _, ServerErrorKind, Value};

use super::{Batch, Item, StoreError, StoreObserver};
use crate::algorithm::{Algorithm, Verdict, interval_us};
use crate::clock::Micros;

macro_rules! with_algorithms {
    ($entry:literal, $main:literal) => {
        concat!(
            // Where common.lua finds the algorithm names among the arguments.
            "local ENTRY = '",
            $entry,
            "'\n",
            include_str!("../../lua/common.lua"),
            include_str!("../../lua/token_bucket.lua"),
            include_str!("../../lua/sliding_window.lua"),
            include_str!("../../lua/sliding_log.lua"),
            include_str!("../../lua/fixed_window.lua"),
            include_str!("../../lua/gcra.lua"),
            include_str!("../../lua/leaky_bucket.lua"),
            include_str!("../../lua/concurrency.lua"),
            include_str!($main),
        )
    };
}

/// The source of the decide script (every algorithm plus `lua/decide.lua`).
pub const DECIDE_LUA: &str = with_algorithms!("decide", "../../lua/decide.lua");

/// The source of the refund script (every algorithm plus `lua/refund.lua`).
pub const REFUND_LUA: &str = with_algorithms!("refund", "../../lua/refund.lua");

/// The source of the settle script (`lua/common.lua` plus `lua/settle.lua`,
/// which reads and writes the algorithms' records itself).
pub const SETTLE_LUA: &str = concat!(
    "local ENTRY = 'settle'\n",
    include_str!("../../lua/common.lua"),
    include_str!("../../lua/settle.lua"),
);
/// The source of the release script (`lua/release.lua`): gives back one
/// request's in-flight slots.
pub const RELEASE_LUA: &str = include_str!("../../lua/release.lua");

/// The source of the renewal script (`lua/renew.lua`): pushes one
/// request's in-flight deadlines on.
pub const RENEW_LUA: &str = include_str!("../../lua/renew.lua");

/// The scripts, their SHA1 computed once.
pub(crate) struct Scripts {
    pub(crate) decide: redis::Script,
    pub(crate) refund: redis::Script,
    pub(crate) settle: redis::Script,
    pub(crate) release: redis::Script,
    pub(crate) renew: redis::Script,
}

impl Scripts {
    pub(crate) fn new() -> Self {
        Self {
            decide: redis::Script::new(DECIDE_LUA),
            refund: redis::Script::new(REFUND_LUA),
            settle: redis::Script::new(SETTLE_LUA),
            release: redis::Script::new(RELEASE_LUA),
            renew: redis::Script::new(RENEW_LUA),
        }
    }
}

/// `EVALSHA` of the settle script for `items` (one slot) of `settle`.
pub(crate) fn settle_cmd(scripts: &Scripts, settle: &super::Settle<'_>, items: &[&Item]) -> Cmd {
    use crate::algorithm::Adjust;
    let bytes = 80
        + items
            .iter()
            .map(|i| i.key.len() + ITEM_BYTES)
            .sum::<usize>();
    let mut cmd = keyed(&scripts.settle, items, 7 + 5 * items.len(), bytes);
    match settle.now {
        Some(now) => cmd.arg(now),
        None => cmd.arg(""),
    };
    cmd.arg(settle.charged_at);
    match settle.adjust {
        Adjust::Charge(n) => cmd.arg("c").arg(n),
        Adjust::Refund(n) => cmd.arg("r").arg(n),
    };
    for item in items {
        cmd.arg(item.algorithm.kind());
        push_params(&mut cmd, &item.algorithm);
    }
    cmd
}

/// `EVALSHA` of the release script for `holder`'s slots on `items` (one
/// slot).
pub(crate) fn release_cmd(scripts: &Scripts, items: &[&Item], holder: &str) -> Cmd {
    let mut cmd = keyed(
        &scripts.release,
        items,
        4 + items.len(),
        64 + items.iter().map(|i| i.key.len()).sum::<usize>(),
    );
    cmd.arg(holder);
    cmd
}

/// `EVALSHA` of the renewal script for `holder`'s slots on `items` (one
/// slot), on the server's clock.
pub(crate) fn renew_cmd(scripts: &Scripts, items: &[&Item], holder: &str) -> Cmd {
    let mut cmd = keyed(
        &scripts.renew,
        items,
        5 + 2 * items.len(),
        80 + items.iter().map(|i| i.key.len() + 16).sum::<usize>(),
    );
    cmd.arg(holder).arg("");
    for item in items {
        let hold = match item.algorithm {
            Algorithm::Concurrency { hold_us, .. } => hold_us,
            _ => 0,
        };
        cmd.arg(hold);
    }
    cmd
}

/// Runs `cmd` of `script` (release or renew) and reads its integer reply.
pub(crate) async fn eval_count<C>(
    conn: &mut C,
    script: &redis::Script,
    cmd: &Cmd,
    reloads: &ReloadCounter,
    shard: &Arc<str>,
) -> Result<u64, StoreError>
where
    C: redis::aio::ConnectionLike + Send,
{
    let value = eval(conn, script, cmd, reloads, shard)
        .await
        .map_err(classify)?;
    int(&value)
}

/// Script reloads after `NOSCRIPT`, per shard, told to the store's
/// observer as they happen (telemetry counts them as
/// `ratewatch_script_reloads_total{shard}`).
#[derive(Default)]
pub(crate) struct ReloadCounter {
    counts: Mutex<HashMap<Arc<str>, u64>>,
    observer: RwLock<Option<Arc<dyn StoreObserver>>>,
}

impl ReloadCounter {
    pub(crate) fn bump(&self, shard: &Arc<str>) {
        *self.counts.lock().entry(shard.clone()).or_insert(0) += 1;
        if let Some(o) = self.observer.read().as_ref() {
            o.script_reloaded(shard);
        }
    }

    pub(crate) fn snapshot(&self) -> Vec<(Arc<str>, u64)> {
        let mut v: Vec<_> = self
            .counts
            .lock()
            .iter()
            .map(|(k, n)| (k.clone(), *n))
            .collect();
        v.sort();
        v
    }

    /// Tells `observer` of every reload from now on.
    pub(crate) fn observe(&self, observer: Arc<dyn StoreObserver>) {
        *self.observer.write() = Some(observer);
    }

    /// Tells the observer that `n` expired in-flight holders were dropped
    /// on `shard`.
    pub(crate) fn holders_expired(&self, shard: &str, n: u64) {
        if n > 0
            && let Some(o) = self.observer.read().as_ref()
        {
            o.holders_expired(shard, n);
        }
    }
}

/// One numeric script argument, written straight into the command's
/// buffer rather than through a `String` of its own.
#[derive(Debug, Clone, Copy)]
enum Param {
    Int(u64),
    Float(f64),
}

/// The three algorithm parameters of an item, as the Lua files expect them.
fn params(algorithm: &Algorithm) -> [Param; 3] {
    use Param::{Float, Int};
    match *algorithm {
        Algorithm::TokenBucket {
            capacity,
            refill_per_second,
        } => [Int(capacity), Float(refill_per_second), Int(0)],
        Algorithm::SlidingWindow { limit, window_us }
        | Algorithm::SlidingLog { limit, window_us }
        | Algorithm::FixedWindow { limit, window_us } => [Int(limit), Int(window_us), Int(0)],
        Algorithm::Gcra {
            rate_per_second,
            burst,
        } => [Int(interval_us(rate_per_second)), Int(burst), Int(0)],
        Algorithm::LeakyBucket {
            rate_per_second,
            capacity,
            max_delay_us,
        } => [
            Int(interval_us(rate_per_second)),
            Int(capacity),
            Int(max_delay_us),
        ],
        // The third parameter, the holder id, is the batch's (decide_cmd).
        Algorithm::Concurrency { limit, hold_us } => [Int(limit), Int(hold_us), Int(0)],
    }
}

/// Appends `algorithm`'s three parameters to `cmd`.
fn push_params(cmd: &mut Cmd, algorithm: &Algorithm) {
    for p in params(algorithm) {
        match p {
            Param::Int(n) => {
                cmd.arg(n);
            }
            Param::Float(x) => {
                // Display prints the shortest decimal that parses back to
                // the same f64. Writing into the command cannot fail.
                let _ = write!(cmd.writer_for_next_arg(), "{x}");
            }
        }
    }
}

/// A command with room for `args` arguments of about `bytes` bytes in all,
/// so building it does not grow its buffers again and again.
fn evalsha(args: usize, bytes: usize) -> Cmd {
    let mut cmd = Cmd::with_capacity(args, bytes);
    cmd.arg("EVALSHA");
    cmd
}

/// `EVALSHA` of `script` on the keys of `items`, with room for `args`
/// arguments in `bytes`: the head every script call of one slot shares.
fn keyed(script: &redis::Script, items: &[&Item], args: usize, bytes: usize) -> Cmd {
    let mut cmd = evalsha(args, bytes);
    cmd.arg(script.get_hash()).arg(items.len());
    for item in items {
        cmd.arg(item.key.as_bytes());
    }
    cmd
}

/// Room for an item's key and the arguments that follow it.
const ITEM_BYTES: usize = 64;

/// `EVALSHA` of the decide script for `items` (one slot) of `batch`.
pub(crate) fn decide_cmd(scripts: &Scripts, batch: &Batch<'_>, items: &[&Item]) -> Cmd {
    let bytes = 80
        + items
            .iter()
            .map(|i| i.key.len() + ITEM_BYTES)
            .sum::<usize>();
    let mut cmd = keyed(&scripts.decide, items, 6 + 6 * items.len(), bytes);
    match batch.now {
        Some(now) => cmd.arg(now),
        None => cmd.arg(""),
    };
    // Per-item costs (decision service requests) go after the limits,
    // behind the marker `i`, so the common call keeps its one cost.
    let per_item = batch.has_item_costs();
    if per_item {
        cmd.arg("i");
    } else {
        cmd.arg(batch.effective_cost());
    }
    // A key named twice is charged twice, in order: the script then writes
    // as it decides (and undoes it all if the call is refused).
    cmd.arg(if batch.peek {
        "1"
    } else if repeats(items) {
        "r"
    } else {
        "0"
    });
    for item in items {
        cmd.arg(item.algorithm.kind())
            .arg(if item.shadow { "1" } else { "0" });
        if let Algorithm::Concurrency { limit, hold_us } = item.algorithm {
            cmd.arg(limit).arg(hold_us).arg(batch.holder.unwrap_or(""));
        } else {
            push_params(&mut cmd, &item.algorithm);
        }
    }
    if per_item {
        for item in items {
            // `c`: checked for one unit left, charged nothing.
            if batch.checks_left(item) {
                cmd.arg("c");
            } else {
                cmd.arg(batch.cost_of(item));
            }
        }
    }
    cmd
}

/// Whether two of `items` name the same key.
fn repeats(items: &[&Item]) -> bool {
    if items.len() <= 8 {
        return items
            .iter()
            .enumerate()
            .any(|(i, a)| items[..i].iter().any(|b| b.key == a.key));
    }
    let mut seen = std::collections::HashSet::with_capacity(items.len());
    !items.iter().all(|i| seen.insert(&*i.key))
}

/// `EVALSHA` of the refund script giving back what `reply` charged.
/// `None` when the decision wrote nothing.
pub(crate) fn refund_cmd(
    scripts: &Scripts,
    items: &[&Item],
    reply: &GroupReply,
    cost_of: impl Fn(&Item) -> u64,
) -> Option<Cmd> {
    // A peek, or a limit checked at cost 0, charged nothing to give back.
    let written: Vec<usize> = (0..items.len())
        // In-flight slots are given back by the release script instead.
        .filter(|&i| {
            reply.written[i] && cost_of(items[i]) > 0 && !items[i].algorithm.is_concurrency()
        })
        .collect();
    if written.is_empty() {
        return None;
    }
    let cost = cost_of(items[written[0]]);
    let per_item = written.iter().any(|&i| cost_of(items[i]) != cost);
    let bytes = 80
        + written
            .iter()
            .map(|&i| items[i].key.len() + ITEM_BYTES)
            .sum::<usize>();
    let mut cmd = evalsha(4 + 8 * written.len(), bytes);
    cmd.arg(scripts.refund.get_hash()).arg(written.len());
    for &i in &written {
        cmd.arg(items[i].key.as_bytes());
    }
    if per_item {
        cmd.arg("i");
    } else {
        cmd.arg(cost);
    }
    for &i in &written {
        if per_item {
            cmd.arg(cost_of(items[i]));
        }
        cmd.arg(items[i].algorithm.kind());
        push_params(&mut cmd, &items[i].algorithm);
        cmd.arg(reply.window_start[i])
            .arg(reply.members[i].len())
            .arg(&reply.members[i]);
    }
    Some(cmd)
}

/// What one decide call answered.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct GroupReply {
    /// Whether every enforced limit of the call admitted.
    pub(crate) allowed: bool,
    /// The time the script decided at.
    pub(crate) now: Micros,
    /// One verdict per item, in order (not yet uncharged).
    pub(crate) verdicts: super::Verdicts,
    /// Whether the item's state was written (unless the call peeked).
    pub(crate) written: Vec<bool>,
    /// The window start written (window counters), else 0.
    pub(crate) window_start: Vec<u64>,
    /// Sliding-log members added.
    pub(crate) members: Vec<Vec<String>>,
    /// Expired in-flight holders the call dropped.
    pub(crate) expired: u64,
}

fn protocol(what: &str) -> StoreError {
    StoreError::Protocol(format!("decide script reply: {what}"))
}

fn int(v: &Value) -> Result<u64, StoreError> {
    match v {
        Value::Int(n) if *n >= 0 => Ok(*n as u64),
        Value::BulkString(b) => std::str::from_utf8(b)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| protocol("expected an integer")),
        _ => Err(protocol("expected an integer")),
    }
}

/// A reader over the decide script's one-string reply: fixed-width big
/// endian fields read in place, no allocation per field.
struct Fields<'a>(&'a [u8]);

impl<'a> Fields<'a> {
    fn bytes(&mut self, n: usize) -> Result<&'a [u8], StoreError> {
        let Some((head, rest)) = self.0.split_at_checked(n) else {
            return Err(protocol("too short"));
        };
        self.0 = rest;
        Ok(head)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], StoreError> {
        let Some((head, rest)) = self.0.split_first_chunk::<N>() else {
            return Err(protocol("too short"));
        };
        self.0 = rest;
        Ok(*head)
    }

    fn u8(&mut self) -> Result<u8, StoreError> {
        self.array::<1>().map(|[b]| b)
    }

    fn u32(&mut self) -> Result<u32, StoreError> {
        self.array().map(u32::from_be_bytes)
    }

    fn u64(&mut self) -> Result<u64, StoreError> {
        self.array().map(u64::from_be_bytes)
    }

    fn f64(&mut self) -> Result<f64, StoreError> {
        self.array().map(f64::from_be_bytes)
    }
}

/// Parses the decide script's reply for `n` items: one string of
/// fixed-width fields, a limit's extra fields named by its head (see
/// `lua/decide.lua`).
pub(crate) fn parse_reply(value: &Value, n: usize) -> Result<GroupReply, StoreError> {
    parse(value, n, true)
}

/// [`parse_reply`] for a decision whose receipt is not kept (every call
/// but a lease's take): the same checks, but only the verdicts are built,
/// so a decision allocates one vector, not four plus a string per
/// sliding-log member.
pub(crate) fn parse_verdicts(value: &Value, n: usize) -> Result<GroupReply, StoreError> {
    parse(value, n, false)
}

fn parse(value: &Value, n: usize, receipt: bool) -> Result<GroupReply, StoreError> {
    let Value::BulkString(bytes) = value else {
        return Err(protocol("expected one string"));
    };
    let mut fields = Fields(bytes);
    let room = if receipt { n } else { 0 };
    let mut reply = GroupReply {
        allowed: fields.u8()? == 1,
        now: fields.u64()?,
        verdicts: super::Verdicts::with_capacity(n),
        written: Vec::with_capacity(room),
        window_start: Vec::with_capacity(room),
        members: Vec::with_capacity(room),
        expired: 0,
    };
    for _ in 0..n {
        let head = fields.u8()?;
        let remaining = fields.f64()?;
        let reset_after_us = fields.u64()?;
        let retry_after_us = fields.u64()?;
        let admitted = head & 1 == 1;
        let (mut delay_us, mut start, mut members) = (0, 0, Vec::new());
        match head >> 1 {
            0 => {}
            1 => delay_us = fields.u64()?,
            2 => start = fields.u64()?,
            4 => reply.expired += fields.u64()?,
            3 => {
                let m = fields.u32()?;
                if receipt {
                    // Never more room than the reply could fill.
                    members.reserve((m as usize).min(fields.0.len() / 4));
                }
                for _ in 0..m {
                    let len = fields.u32()? as usize;
                    let member = std::str::from_utf8(fields.bytes(len)?)
                        .map_err(|_| protocol("not UTF-8"))?;
                    if receipt {
                        members.push(member.to_owned());
                    }
                }
            }
            _ => return Err(protocol("unknown head")),
        }
        reply.verdicts.push(Verdict {
            allowed: admitted,
            remaining,
            reset_after_us,
            retry_after_us,
            delay_us,
        });
        if receipt {
            // The script writes an admitting limit's state when the whole
            // call admits (a peek writes nothing, and refunds nothing
            // either).
            reply.written.push(reply.allowed && admitted);
            reply.window_start.push(start);
            reply.members.push(members);
        }
    }
    if !fields.0.is_empty() {
        return Err(protocol("wrong number of items"));
    }
    Ok(reply)
}

/// Whether the server forgot the script (restart, failover, `SCRIPT FLUSH`).
pub(crate) fn is_noscript(e: &RedisError) -> bool {
    e.kind() == ErrorKind::Server(ServerErrorKind::NoScript)
}

/// Sorts a client error into the store's error classes.
pub(crate) fn classify(e: RedisError) -> StoreError {
    if e.is_timeout() {
        StoreError::Timeout
    } else if e.is_io_error()
        || e.is_connection_refusal()
        || e.is_connection_dropped()
        || e.kind() == ErrorKind::ClusterConnectionNotFound
    {
        StoreError::Unavailable(e.to_string())
    } else if matches!(e.kind(), ErrorKind::Parse | ErrorKind::UnexpectedReturnType) {
        StoreError::Protocol(e.to_string())
    } else {
        StoreError::Command(e.to_string())
    }
}

/// Runs `cmd` (an `EVALSHA` of `script`); on `NOSCRIPT` loads the script,
/// counts the reload against `shard` (telling the store's observer) and
/// runs it once more. Nothing else is
/// ever retried.
pub(crate) async fn eval<C>(
    conn: &mut C,
    script: &redis::Script,
    cmd: &Cmd,
    reloads: &ReloadCounter,
    shard: &Arc<str>,
) -> Result<Value, RedisError>
where
    C: redis::aio::ConnectionLike + Send,
{
    match send(conn, cmd).await {
        Err(e) if is_noscript(&e) => {
            script.load_async(conn).await?;
            reloads.bump(shard);
            send(conn, cmd).await
        }
        other => other,
    }
}

/// Sends `cmd` and turns an error reply into an error. Unlike
/// `Cmd::query_async`, it does not rebuild the whole reply to look for
/// errors nested in it: a decide or refund reply has none (a script error
/// is the whole reply), and `parse_reply` rejects anything it did not
/// expect.
async fn send<C>(conn: &mut C, cmd: &Cmd) -> Result<Value, RedisError>
where
    C: redis::aio::ConnectionLike + Send,
{
    match conn.req_packed_command(cmd).await? {
        Value::ServerError(e) => Err(e.into()),
        value => Ok(value),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Builds a reply as `lua/decide.lua` packs it.
    #[derive(Default)]
    struct Reply(Vec<u8>);

    impl Reply {
        fn new(allowed: bool, now: u64) -> Self {
            let mut r = Self::default();
            r.0.push(u8::from(allowed));
            r.0.extend(now.to_be_bytes());
            r
        }

        fn limit(mut self, head: u8, remaining: f64, reset: u64, retry: u64) -> Self {
            self.0.push(head);
            self.0.extend(remaining.to_be_bytes());
            self.0.extend(reset.to_be_bytes());
            self.0.extend(retry.to_be_bytes());
            self
        }

        fn u64(mut self, n: u64) -> Self {
            self.0.extend(n.to_be_bytes());
            self
        }

        fn members(mut self, members: &[&[u8]]) -> Self {
            self.0.extend((members.len() as u32).to_be_bytes());
            for m in members {
                self.0.extend((m.len() as u32).to_be_bytes());
                self.0.extend(*m);
            }
            self
        }

        fn value(self) -> Value {
            Value::BulkString(self.0)
        }
    }

    fn every_kind() -> Value {
        Reply::new(true, 1_700_000_000_000_000)
            // A token bucket: a fractional remaining.
            .limit(1, 8.25, 30, 0)
            // A leaky bucket that shapes: a delay follows.
            .limit(3, 4.0, 10, 0)
            .u64(2_500)
            // A fixed window written: its start follows.
            .limit(5, 99.0, 60, 0)
            .u64(1_699_999_999_000_000)
            // A sliding log written: two members follow.
            .limit(7, 8.0, 5, 0)
            .members(&[b"1700000000000000:0", b"1700000000000000:1"])
            // An in-flight limit written: expired holders follow.
            .limit(9, 2.0, 0, 0)
            .u64(3)
            // A blocked shadow limit: nothing follows.
            .limit(0, 0.0, 9, 9)
            .value()
    }

    #[test]
    fn one_string_reads_back_every_kind_of_limit() {
        let r = parse_reply(&every_kind(), 6).expect("parses");
        assert!(r.allowed);
        assert_eq!(r.now, 1_700_000_000_000_000);
        assert_eq!(r.verdicts[0].remaining.to_bits(), 8.25f64.to_bits());
        assert_eq!(r.verdicts[0].reset_after_us, 30);
        assert_eq!(r.verdicts[1].delay_us, 2_500);
        assert_eq!(r.window_start[2], 1_699_999_999_000_000);
        assert_eq!(r.members[3], ["1700000000000000:0", "1700000000000000:1"]);
        assert_eq!(r.expired, 3);
        assert!(!r.verdicts[5].allowed && r.verdicts[5].retry_after_us == 9);
        assert_eq!(r.written, [true, true, true, true, true, false]);
    }

    #[test]
    fn a_malformed_reply_is_an_error_not_a_panic() {
        let mut cases = vec![
            Value::Nil,
            Value::Int(1),
            // The flat array of an older script.
            Value::Array(vec![Value::Int(1), Value::Int(2)]),
            Reply::new(true, 2).value(),
            // Cut inside a limit.
            Value::BulkString(Reply::new(true, 2).limit(1, 1.0, 1, 0).0[..20].to_vec()),
            // Head 7 promises members that are not there.
            Reply::new(true, 2).limit(7, 1.0, 1, 0).u64(5).value(),
            // A member longer than what is left.
            Reply::new(true, 2)
                .limit(7, 1.0, 1, 0)
                .members(&[b"abc"])
                .0
                .split_last()
                .map(|(_, r)| Value::BulkString(r.to_vec()))
                .unwrap(),
            // A member count far beyond the reply.
            Value::BulkString({
                let mut b = Reply::new(true, 2).limit(7, 1.0, 1, 0).0;
                b.extend(u32::MAX.to_be_bytes());
                b
            }),
            // An unknown head.
            Reply::new(true, 2).limit(11, 1.0, 1, 0).value(),
            // Trailing bytes.
            Reply::new(true, 2).limit(1, 1.0, 1, 0).u64(0).value(),
            // A member that is not text.
            Reply::new(true, 2)
                .limit(7, 1.0, 1, 0)
                .members(&[&[0xff]])
                .value(),
        ];
        cases.push(Value::BulkString(Vec::new()));
        for case in cases {
            assert!(parse_reply(&case, 1).is_err(), "{case:?}");
            assert!(parse_verdicts(&case, 1).is_err(), "{case:?}");
        }
        // Two limits read from a reply of one.
        let one = Reply::new(true, 2).limit(1, 1.0, 1, 0).value();
        assert!(parse_reply(&one, 1).is_ok());
        assert!(parse_reply(&one, 2).is_err());
    }

    #[test]
    fn verdicts_alone_read_the_same_verdicts_without_a_receipt() {
        let whole = parse_reply(&every_kind(), 6).expect("parses");
        let lean = parse_verdicts(&every_kind(), 6).expect("parses");
        assert_eq!((lean.allowed, lean.now), (whole.allowed, whole.now));
        assert_eq!(lean.verdicts, whole.verdicts);
        assert_eq!(lean.expired, whole.expired);
        assert!(lean.written.is_empty() && lean.members.is_empty());
    }
}
