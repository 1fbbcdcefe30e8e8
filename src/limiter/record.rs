//! The decision event: what telemetry hears of every decision.

use std::cell::RefCell;
use std::net::IpAddr;
use std::sync::Arc;

use super::live::Live;
use super::{Decision, Limiter, Source};
use crate::identity::{Identity, IdentityKind};
use crate::policy::KeyDisplay;
use crate::telemetry::Event;

/// The display form last built on this thread, and what it was built from.
struct LastDisplay {
    hash: String,
    kind: IdentityKind,
    ip: Option<IpAddr>,
    mode: KeyDisplay,
    name: Option<String>,
    display: Arc<str>,
}

thread_local! {
    /// A client's decisions come in runs (a keep-alive connection, a retry
    /// loop), and masking costs several times a copy: the event shares the
    /// memo's string instead. Never holds a raw key: the raw display mode
    /// is not memoised.
    static LAST_DISPLAY: RefCell<Option<LastDisplay>> = const { RefCell::new(None) };
    /// The identity of an event whose identity nobody reads, shared per
    /// thread so that it costs no allocation and no cross-thread count.
    static NO_DISPLAY: Arc<str> = Arc::from("");
}

/// The identity of an event whose identity nobody reads.
pub(super) fn no_display() -> Arc<str> {
    NO_DISPLAY.with(Arc::clone)
}

/// `identity.display(mode)` with its display name appended, from the
/// thread's memo when the previous event's identity was the same one.
fn display(identity: &Identity, mode: KeyDisplay) -> Arc<str> {
    let build = || {
        let mut shown = identity.display(mode);
        crate::telemetry::append_display_name(&mut shown, identity.display_name());
        shown
    };
    if mode == KeyDisplay::Raw {
        return build().into();
    }
    LAST_DISPLAY.with_borrow_mut(|last| {
        if let Some(l) = last.as_ref() {
            if l.mode == mode
                && l.kind == identity.kind()
                && l.ip == identity.ip
                && l.hash == identity.hash()
                && l.name.as_deref() == identity.display_name()
            {
                return l.display.clone();
            }
        }
        let display: Arc<str> = build().into();
        *last = Some(LastDisplay {
            hash: identity.hash().to_owned(),
            kind: identity.kind(),
            ip: identity.ip,
            mode,
            name: identity.display_name().map(str::to_owned),
            display: display.clone(),
        });
        display
    })
}

impl Limiter {
    pub(super) fn record(
        &self,
        live: &Live,
        d: &Decision,
        route: Option<usize>,
        identity: &Identity,
        cost: u64,
        units: crate::telemetry::UnitsCharged,
    ) {
        let c = &live.compiled;
        // A fallback that counted nothing exceeded nothing.
        let exceeded: Vec<Arc<str>> = d
            .limits
            .iter()
            .filter(|l| d.state_known() && !l.allowed)
            .map(|l| l.name.clone())
            .collect();
        let fallback = match &d.source {
            Source::Fallback { reason, policy, .. } => Some((*reason, *policy)),
            Source::Store { .. } => None,
        };
        let event = Event {
            tier: d.tier.clone(),
            route: route.map_or_else(|| c.any_route.clone(), |i| c.routes[i].label.clone()),
            limit: d.most_constraining().map(|l| l.name.clone()),
            exceeded,
            outcome: d.outcome,
            shard: d.source.shard().clone(),
            // Only the fleet view's top keys read the display form.
            identity: if self.inner.telemetry.keeps_identities() {
                display(identity, live.policy.telemetry.key_display)
            } else {
                no_display()
            },
            cost,
            units,
            redis_rtt: d.store_rtt,
            fallback,
        };
        crate::telemetry::span::decision(
            &event.tier,
            &event.route,
            event.outcome,
            event.limit.as_deref(),
            d.path.as_str(),
            d.store_rtt,
        );
        self.inner.telemetry.record(&event);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_memo_shows_each_identity_as_it_would_be_shown_fresh() {
        let a = Identity::new(IdentityKind::ApiKey, "free_aaaaaaaaaaaa");
        let b = Identity::new(IdentityKind::ApiKey, "free_bbbbbbbbbbbb");
        // The same caller under two display names, and under none.
        let a_acme = a.clone().with_display_name("Acme");
        let a_other = a.clone().with_display_name("Other");
        let ip = Identity::from_ip(Some("203.0.113.9".parse().unwrap()));
        // The same address without its IP attached masks differently.
        let bare = Identity::new(IdentityKind::Ip, ip.raw());
        let fresh = |id: &Identity, mode| {
            let mut shown = id.display(mode);
            crate::telemetry::append_display_name(&mut shown, id.display_name());
            shown
        };
        for id in [
            &a, &a, &a_acme, &a_other, &a, &b, &a, &ip, &bare, &ip, &bare,
        ] {
            for mode in [KeyDisplay::Masked, KeyDisplay::Hashed, KeyDisplay::Raw] {
                assert_eq!(&*display(id, mode), fresh(id, mode));
                assert_eq!(&*display(id, mode), fresh(id, mode));
            }
        }
    }
}
