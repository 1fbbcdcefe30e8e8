//! The reservations `POST /v1/decide` holds (`"reserve": true`) until
//! `POST /v1/settle` names them: a bounded table of this process.
//!
//! - An id is 128 random bits from a cryptographic generator, written as
//!   32 lowercase hex digits: knowing the id is the only way to settle a
//!   reservation, and ids cannot be guessed from each other.
//! - At most [`MAX_HELD`] reservations are held at once (counting the
//!   decisions still being made for one): beyond it a reserve is refused
//!   before anything is charged, never held in memory without bound.
//! - A reservation is held for its hold time ([`DEFAULT_HOLD`], at most
//!   [`MAX_HOLD`]), then forgotten: dropping a [`Reservation`] unsettled
//!   keeps what it charged, so an expired reservation stands as charged.
//!   Expiries are kept in a heap: each request sweeps only what is due,
//!   never the whole table.
//! - A settled id is remembered (at most [`MAX_SETTLED`] of them, for at
//!   most [`MAX_HOLD`]) with its result, so settling it again answers the
//!   same and changes nothing. Two settles of one id at once share one
//!   store call.
//!
//! The table lives in the process that made the reservation: another
//! instance behind the same load balancer does not know its ids.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::limiter::{Reservation, Settled};

/// Most reservations held at once by one table.
pub(crate) const MAX_HELD: usize = 100_000;
/// How long a reservation is held unless the reserve says otherwise.
pub(crate) const DEFAULT_HOLD: Duration = Duration::from_secs(60);
/// The longest hold a reserve may ask for.
pub(crate) const MAX_HOLD: Duration = Duration::from_secs(600);
/// Most settled ids remembered, with their results.
pub(crate) const MAX_SETTLED: usize = 100_000;

/// How each unit of a settled reservation ended, in the reservation's
/// order.
pub(crate) type Outcome = Arc<Vec<(Arc<str>, Settled)>>;

/// A reservation's id: 128 random bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct ReservationId(u128);

impl ReservationId {
    fn random() -> Self {
        Self(rand::random())
    }

    /// The id written as 32 lowercase hex digits; anything else is `None`.
    pub(crate) fn parse(s: &str) -> Option<Self> {
        let well_formed = s.len() == 32
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        well_formed
            .then(|| u128::from_str_radix(s, 16).ok())
            .flatten()
            .map(Self)
    }
}

impl fmt::Display for ReservationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

/// Every reservation is held: a reserve is refused before its decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "{0} reservations are held, the most this instance holds: settle them, or retry once they expire"
)]
pub(crate) struct Full(pub(crate) usize);

/// The table of one front end. Cheap to share behind an `Arc`.
#[derive(Debug)]
pub(crate) struct Reservations {
    table: Arc<Mutex<Table>>,
    cap: usize,
}

#[derive(Debug, Default)]
struct Table {
    held: HashMap<ReservationId, Held>,
    /// When each held reservation expires; ids settled before are skipped
    /// when their time comes.
    expiries: BinaryHeap<Reverse<(Instant, ReservationId)>>,
    /// Slots taken by reserves whose decision is still being made.
    claimed: usize,
    settled: HashMap<ReservationId, watch::Receiver<Option<Outcome>>>,
    /// Settled ids, oldest first.
    settled_order: VecDeque<(Instant, ReservationId)>,
}

#[derive(Debug)]
struct Held {
    reservation: Reservation,
    expires: Instant,
}

/// What a settle finds under an id.
#[derive(Debug)]
pub(crate) enum Lookup {
    /// A held reservation, now taken out: settle it and send the outcome
    /// (to any settle of the same id that waits on it).
    Settle(Reservation, watch::Sender<Option<Outcome>>),
    /// Settled before (or being settled): the outcome once known.
    Settled(watch::Receiver<Option<Outcome>>),
    /// Never held here, expired, or settled too long ago.
    Unknown,
}

/// A slot claimed for one reserve; released when dropped unused.
#[derive(Debug)]
pub(crate) struct Claim {
    table: Arc<Mutex<Table>>,
}

impl Reservations {
    /// A table holding at most `cap` reservations.
    pub(crate) fn new(cap: usize) -> Self {
        Self {
            table: Arc::default(),
            cap,
        }
    }

    /// Claims a slot for one reserve, before its decision: refused while
    /// `cap` reservations are held or being made.
    pub(crate) fn claim(&self) -> Result<Claim, Full> {
        let expired;
        {
            let mut t = self.table.lock();
            expired = t.sweep(Instant::now());
            if t.held.len() + t.claimed >= self.cap {
                return Err(Full(self.cap));
            }
            t.claimed += 1;
        }
        drop(expired);
        Ok(Claim {
            table: self.table.clone(),
        })
    }

    /// Takes the reservation `id` names out of the table to be settled, or
    /// what its earlier settle found.
    pub(crate) fn take(&self, id: ReservationId) -> Lookup {
        let now = Instant::now();
        let (lookup, expired) = {
            let mut t = self.table.lock();
            let expired = t.sweep(now);
            let lookup = match t.held.remove(&id) {
                Some(h) if h.expires > now => {
                    let (tx, rx) = watch::channel(None);
                    t.remember(id, rx, now);
                    Lookup::Settle(h.reservation, tx)
                }
                Some(_) => Lookup::Unknown,
                None => match t.settled.get(&id) {
                    Some(rx) => Lookup::Settled(rx.clone()),
                    None => Lookup::Unknown,
                },
            };
            (lookup, expired)
        };
        drop(expired);
        lookup
    }

    /// How many reservations are held now.
    #[cfg(test)]
    fn held(&self) -> usize {
        self.table.lock().held.len()
    }
}

impl Claim {
    /// Holds `reservation` for `hold`, under a fresh id.
    pub(crate) fn hold(self, reservation: Reservation, hold: Duration) -> ReservationId {
        let expires = Instant::now() + hold;
        let mut t = self.table.lock();
        let id = loop {
            let id = ReservationId::random();
            if !t.held.contains_key(&id) && !t.settled.contains_key(&id) {
                break id;
            }
        };
        t.held.insert(
            id,
            Held {
                reservation,
                expires,
            },
        );
        t.expiries.push(Reverse((expires, id)));
        // `self` drops here and gives its claimed slot back: the
        // reservation now counts in `held` instead.
        id
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        let mut t = self.table.lock();
        t.claimed = t.claimed.saturating_sub(1);
    }
}

impl Table {
    /// Takes out every reservation due by `now` (returned, to be dropped
    /// outside the lock) and forgets settled ids past their memory.
    fn sweep(&mut self, now: Instant) -> Vec<Reservation> {
        let mut expired = Vec::new();
        while let Some(Reverse((at, id))) = self.expiries.peek().copied() {
            if at > now {
                break;
            }
            self.expiries.pop();
            if self.held.get(&id).is_some_and(|h| h.expires == at) {
                if let Some(h) = self.held.remove(&id) {
                    expired.push(h.reservation);
                }
            }
        }
        // Entries of reservations settled early wait in the heap for their
        // time; rebuild it when they outnumber the held ones.
        if self.expiries.len() > 2 * self.held.len() + 1024 {
            self.expiries = self
                .held
                .iter()
                .map(|(id, h)| Reverse((h.expires, *id)))
                .collect();
        }
        while let Some(&(at, id)) = self.settled_order.front() {
            if self.settled_order.len() <= MAX_SETTLED && at + MAX_HOLD > now {
                break;
            }
            self.settled_order.pop_front();
            self.settled.remove(&id);
        }
        expired
    }

    fn remember(&mut self, id: ReservationId, rx: watch::Receiver<Option<Outcome>>, now: Instant) {
        self.settled.insert(id, rx);
        self.settled_order.push_back((now, id));
        while self.settled_order.len() > MAX_SETTLED {
            if let Some((_, old)) = self.settled_order.pop_front() {
                self.settled.remove(&old);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::{Identity, IdentityKind};
    use crate::{Limit, Limiter, Policy, Tier};

    async fn reservation(limiter: &Limiter) -> Reservation {
        let who = Identity::new(IdentityKind::ApiKey, "k");
        let (d, r) = limiter.reserve(&who, "free", None, 1).await;
        assert!(d.allowed);
        r.expect("a reservation")
    }

    async fn limiter() -> Limiter {
        let policy = Policy::builder()
            .tier(Tier::new("free").limit(Limit::per_minute("rpm", 1000)))
            .tier(Tier::new("anonymous").limit(Limit::per_minute("rpm", 1)))
            .build()
            .unwrap();
        Limiter::new(policy).await.unwrap()
    }

    #[test]
    fn ids_are_32_lowercase_hex_digits_and_nothing_else_parses() {
        let id = ReservationId::random();
        let text = id.to_string();
        assert_eq!(text.len(), 32);
        assert_eq!(ReservationId::parse(&text), Some(id));
        assert_ne!(ReservationId::random(), id);
        for bad in [
            "",
            "0",
            &text.to_uppercase(),
            &format!("+{}", &text[1..]),
            &format!("{text}0"),
            "zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz",
        ] {
            if bad != text {
                assert_eq!(ReservationId::parse(bad), None, "{bad:?}");
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_table_refuses_a_claim_until_a_reservation_expires() {
        let limiter = limiter().await;
        let table = Reservations::new(2);
        let a = table.claim().unwrap();
        let _b = table.claim().unwrap();
        assert_eq!(table.claim().unwrap_err(), Full(2));
        a.hold(reservation(&limiter).await, Duration::from_secs(1));
        assert_eq!(table.held(), 1);
        assert!(table.claim().is_err(), "one held, one being made");
        tokio::time::advance(Duration::from_millis(1001)).await;
        let c = table.claim().expect("the held one expired");
        drop(c);
        assert_eq!(table.held(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn an_id_settles_once_then_answers_its_outcome_and_expires_unknown() {
        let limiter = limiter().await;
        let table = Reservations::new(10);
        let id = table
            .claim()
            .unwrap()
            .hold(reservation(&limiter).await, Duration::from_secs(5));
        let Lookup::Settle(_, tx) = table.take(id) else {
            panic!("held");
        };
        let Lookup::Settled(mut rx) = table.take(id) else {
            panic!("being settled");
        };
        tx.send(Some(Arc::new(vec![("requests".into(), Settled::Exact)])))
            .unwrap();
        let got = rx.wait_for(Option::is_some).await.unwrap().clone().unwrap();
        assert_eq!(got[0].1, Settled::Exact);

        let late = table
            .claim()
            .unwrap()
            .hold(reservation(&limiter).await, Duration::from_secs(5));
        tokio::time::advance(Duration::from_secs(5)).await;
        assert!(matches!(table.take(late), Lookup::Unknown));
        assert!(matches!(
            table.take(ReservationId::random()),
            Lookup::Unknown
        ));
    }
}
