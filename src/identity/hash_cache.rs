//! Identity hashes computed once per key, not once per request.
//!
//! Hashing an identity is an HMAC-SHA256 (two SHA-256 blocks) under the
//! deployment's key; the same few callers send most requests. Each thread
//! keeps a small direct-mapped table from (key fingerprint, hash class,
//! raw value) to the hex hash:
//!
//! - bounded: [`SLOTS`] entries per thread, raw values of at most
//!   [`MAX_RAW`] bytes (a longer one is hashed every time); a flood of
//!   distinct keys overwrites slots, it never grows the table, and a miss
//!   costs the hash it would have cost anyway plus a table probe;
//! - no lock: a thread reads and writes only its own table;
//! - process memory only: what it holds never reaches a key name, a label
//!   or a log (the raw value is compared, never shown);
//! - the slot is picked, and a resident entry first compared, by a 64-bit
//!   hash seeded at random per thread: a raw value is compared with a
//!   resident one only when their seeded hashes agree, so how long a
//!   comparison takes tells a client nothing about another's key.

use std::cell::RefCell;
use std::hash::{BuildHasher, Hasher};

use crate::store::keys::IdentityKey;

/// Entries per thread.
pub(crate) const SLOTS: usize = 256;

/// Longest raw value cached, in bytes.
pub(crate) const MAX_RAW: usize = 128;

#[derive(Default)]
struct Slot {
    /// The seeded hash of the entry (0: empty).
    tag: u64,
    key: u64,
    class: &'static str,
    raw: String,
    hash: String,
}

struct Table {
    seed: ahash::RandomState,
    slots: Vec<Slot>,
}

thread_local! {
    static TABLE: RefCell<Option<Table>> = const { RefCell::new(None) };
}

/// `key`'s hash of an identity of hash class `class` with raw value `raw`
/// ([`IdentityKey::hash_identity`]), from this thread's table when it holds
/// it.
pub(crate) fn hash_identity(key: &IdentityKey, class: &'static str, raw: &str) -> String {
    if raw.len() > MAX_RAW {
        return key.hash_identity(class, raw);
    }
    TABLE
        .try_with(|table| {
            let Ok(mut table) = table.try_borrow_mut() else {
                return key.hash_identity(class, raw);
            };
            let table = table.get_or_insert_with(|| Table {
                seed: ahash::RandomState::new(),
                slots: std::iter::repeat_with(Slot::default).take(SLOTS).collect(),
            });
            let mut h = table.seed.build_hasher();
            h.write_u64(key.fingerprint());
            h.write(class.as_bytes());
            h.write_u8(0xff);
            h.write(raw.as_bytes());
            let tag = h.finish() | 1;
            let slot = &mut table.slots[(tag >> 56) as usize % SLOTS];
            if slot.tag == tag
                && slot.key == key.fingerprint()
                && slot.class == class
                && slot.raw == raw
            {
                return slot.hash.clone();
            }
            let hash = key.hash_identity(class, raw);
            slot.tag = tag;
            slot.key = key.fingerprint();
            slot.class = class;
            slot.raw.clear();
            slot.raw.push_str(raw);
            slot.hash.clear();
            slot.hash.push_str(&hash);
            hash
        })
        .unwrap_or_else(|_| key.hash_identity(class, raw))
}

#[cfg(test)]
pub(crate) fn cached_raws() -> usize {
    TABLE.with(|t| {
        t.borrow()
            .as_ref()
            .map_or(0, |t| t.slots.iter().filter(|s| s.tag != 0).count())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cached_hash_is_the_hash_under_its_own_key_and_class() {
        let a = IdentityKey::new(b"secret-a-secret-a");
        let b = IdentityKey::new(b"secret-b-secret-b");
        for _ in 0..3 {
            for key in [&a, &b, &IdentityKey::unkeyed()] {
                for class in ["key", "ip", "custom"] {
                    assert_eq!(
                        hash_identity(key, class, "free_k1"),
                        key.hash_identity(class, "free_k1")
                    );
                }
            }
        }
        assert_ne!(
            hash_identity(&a, "key", "free_k1"),
            hash_identity(&b, "key", "free_k1")
        );
        assert_ne!(
            hash_identity(&a, "key", "free_k1"),
            hash_identity(&a, "ip", "free_k1")
        );
    }

    #[test]
    fn a_flood_of_distinct_keys_stays_within_the_table_and_hashes_right() {
        let key = IdentityKey::new(b"secret-a-secret-a");
        for i in 0..20 * SLOTS {
            let raw = format!("free_flood_{i}");
            assert_eq!(
                hash_identity(&key, "key", &raw),
                key.hash_identity("key", &raw)
            );
        }
        assert!(cached_raws() <= SLOTS);
        // Colliding slots are overwritten, never confused.
        for i in 0..20 * SLOTS {
            let raw = format!("free_flood_{i}");
            assert_eq!(
                hash_identity(&key, "key", &raw),
                key.hash_identity("key", &raw)
            );
        }
    }

    #[test]
    fn an_identity_hashed_twice_on_a_thread_is_hashed_once() {
        let key = IdentityKey::new(b"secret-c-secret-c");
        let first = crate::identity::Identity::keyed(
            crate::identity::IdentityKind::ApiKey,
            "free_once",
            &key,
        );
        TABLE.with(|t| {
            let t = t.borrow();
            let held = t
                .as_ref()
                .expect("a table")
                .slots
                .iter()
                .find(|s| s.raw == "free_once");
            assert_eq!(held.map(|s| s.hash.as_str()), Some(first.hash()));
        });
        let again = crate::identity::Identity::keyed(
            crate::identity::IdentityKind::Bearer,
            "free_once",
            &key,
        );
        assert_eq!(
            again.hash(),
            first.hash(),
            "a key and a token are one class"
        );
    }

    #[test]
    fn a_long_raw_value_is_hashed_but_not_kept() {
        let key = IdentityKey::new(b"secret-a-secret-a");
        let long = "k".repeat(65_536);
        assert_eq!(
            hash_identity(&key, "custom", &long),
            key.hash_identity("custom", &long)
        );
        TABLE.with(|t| {
            if let Some(t) = t.borrow().as_ref() {
                assert!(t.slots.iter().all(|s| s.raw.len() <= MAX_RAW));
            }
        });
    }
}
