//! Deciding on what an auth layer verified: the caller (and its tier) an
//! auth layer put into the request's extensions, instead of whatever
//! credential the request carries.
//!
//! With [`crate::LimiterBuilder::identity_from_extension`], a request's
//! identity is the verified caller the auth layer left in its extensions;
//! a request without one is anonymous (limited by its client address in the
//! anonymous tier, or refused with `[identity] anonymous = "reject"`),
//! whatever key or token it sends. An invented credential then never mints
//! its own quota: only a caller the auth layer verified has one.
//!
//! The auth layer must run first, so it sits outside the limiter: in axum
//! the layer added last runs first.
//!
//! ```
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! use axum::{Router, routing::get, middleware::{self, Next}, extract::Request, response::Response};
//! use ratewatch::identity::Principal;
//! use ratewatch::{Limit, Limiter, Policy, Tier};
//!
//! async fn auth(mut req: Request, next: Next) -> Response {
//!     // ... verify the token, then say who it is and on which plan:
//!     req.extensions_mut().insert(Principal::new("customer-42").with_tier("pro"));
//!     next.run(req).await
//! }
//! let policy = Policy::builder()
//!     .tier(Tier::new("pro").limit(Limit::per_minute("minute", 600)))
//!     .tier(Tier::new("free").limit(Limit::per_minute("minute", 60)))
//!     .tier(Tier::new("anonymous").limit(Limit::per_minute("minute", 10)))
//!     .build()
//!     .unwrap();
//! let limiter = Limiter::builder(policy)
//!     .identity_from_extension::<Principal>()
//!     .build()
//!     .await
//!     .unwrap();
//! let app: Router = Router::new()
//!     .route("/api/orders", get(|| async { "orders" }))
//!     .layer(limiter.layer())                  // runs second: reads the Principal
//!     .layer(middleware::from_fn(auth));      // runs first: verifies, inserts it
//! # let _ = app;
//! # });
//! ```

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use http::Extensions;

use super::{HeaderExtractor, Identity, IdentityError, IdentityKind, KeyExtractor, peer_ip};

/// A caller an auth layer verified: its stable id (a customer, a tenant, a
/// token's subject) and, if the auth layer knows it, its tier. Insert it
/// into the request's extensions and build the limiter with
/// `.identity_from_extension::<Principal>()`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// The verified caller's id: one quota per id.
    pub id: String,
    /// The verified tier (plan), if known; else the limiter's resolver or
    /// key-prefix rule names it from the id.
    pub tier: Option<String>,
    /// A name for people (a customer id, an account name), shown on the
    /// dashboard beside the masked identity; never a secret. See
    /// [`Identity::with_display_name`] for what is kept of it.
    pub display_name: Option<String>,
}

impl Principal {
    /// A verified caller with no tier of its own.
    pub fn new(id: impl Into<String>) -> Self {
        Self {
            id: id.into(),
            tier: None,
            display_name: None,
        }
    }

    /// The caller, shown on the dashboard as `name` beside its masked id.
    pub fn with_display_name(mut self, name: impl Into<String>) -> Self {
        self.display_name = Some(name.into());
        self
    }

    /// The caller, on `tier`.
    pub fn with_tier(mut self, tier: impl Into<String>) -> Self {
        self.tier = Some(tier.into());
        self
    }
}

/// A record an auth layer leaves in the request's extensions once it has
/// verified the caller (its own claims type, or [`Principal`]). Implement
/// it for your claims to let the limiter read them directly.
///
/// ```
/// use ratewatch::identity::VerifiedCaller;
/// #[derive(Clone)]
/// struct Claims { sub: String, plan: String }
/// impl VerifiedCaller for Claims {
///     fn caller_id(&self) -> &str { &self.sub }
///     fn caller_tier(&self) -> Option<&str> { Some(&self.plan) }
/// }
/// ```
pub trait VerifiedCaller: Send + Sync + 'static {
    /// The verified caller's stable id.
    fn caller_id(&self) -> &str;
    /// The verified tier, if the auth layer knows it.
    fn caller_tier(&self) -> Option<&str> {
        None
    }
    /// A name people can act on (a customer id), shown on the dashboard
    /// beside the masked identity. Not a secret: it is kept in the fleet
    /// view (control characters removed, at most
    /// [`MAX_DISPLAY_NAME`](super::MAX_DISPLAY_NAME) characters).
    fn display_name(&self) -> Option<&str> {
        None
    }
}

impl VerifiedCaller for Principal {
    fn caller_id(&self) -> &str {
        &self.id
    }

    fn caller_tier(&self) -> Option<&str> {
        self.tier.as_deref()
    }

    fn display_name(&self) -> Option<&str> {
        self.display_name.as_deref()
    }
}

/// What the limiter reads of a verified caller: id, tier, display name.
pub(crate) type CallerParts<'a> = (&'a str, Option<&'a str>, Option<&'a str>);

/// Reads a verified caller of one type out of the extensions.
pub(crate) type ReadCaller = for<'a> fn(&'a Extensions) -> Option<CallerParts<'a>>;

/// The [`ReadCaller`] of `T`.
pub(crate) fn principal_reader<T: VerifiedCaller>() -> ReadCaller {
    read_caller::<T>
}

fn read_caller<T: VerifiedCaller>(ext: &Extensions) -> Option<CallerParts<'_>> {
    ext.get::<T>()
        .map(|c| (c.caller_id(), c.caller_tier(), c.display_name()))
        .filter(|(id, _, _)| !id.is_empty())
}

/// Requests with a credential but no verified caller after which, if no
/// verified caller was ever seen, the limiter warns that the auth layer
/// probably sits inside it.
const MISPLACED_AFTER: u32 = 100;

/// The extractor of [`crate::LimiterBuilder::identity_from_extension`]:
/// the verified caller in the extensions, else the anonymous caller at the
/// client's address (or a 401 with `anonymous = "reject"`). Headers are
/// still read for conflicts: two different credentials are a 400 here too.
pub struct PrincipalExtractor {
    read: ReadCaller,
    headers: HeaderExtractor,
    seen_verified: AtomicBool,
    unverified: AtomicU32,
}

impl std::fmt::Debug for PrincipalExtractor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PrincipalExtractor").finish_non_exhaustive()
    }
}

impl PrincipalExtractor {
    /// Reads verified callers of type `T`; `headers` gives the credential
    /// headers, the anonymous rule, the client address and the hash key.
    pub fn new<T: VerifiedCaller>(headers: HeaderExtractor) -> Self {
        Self::reading(read_caller::<T>, headers)
    }

    pub(crate) fn reading(read: ReadCaller, headers: HeaderExtractor) -> Self {
        Self {
            read,
            headers,
            seen_verified: AtomicBool::new(false),
            unverified: AtomicU32::new(0),
        }
    }

    /// A request came with a credential but without a verified caller:
    /// after [`MISPLACED_AFTER`] of them and no verified caller ever, the
    /// auth layer is most likely inside the limiter (it runs too late).
    fn note_unverified(&self) {
        if self.seen_verified.load(Ordering::Relaxed) {
            return;
        }
        if self.unverified.fetch_add(1, Ordering::Relaxed) + 1 == MISPLACED_AFTER {
            tracing::warn!(
                "{MISPLACED_AFTER} requests carried a credential but no verified caller, and none \
                 ever did: every caller is counted as anonymous. Is the auth layer added after \
                 (outside) `limiter.layer()`? In axum the layer added last runs first."
            );
        }
    }
}

impl KeyExtractor for PrincipalExtractor {
    fn extract(&self, request: &http::request::Parts) -> Result<Identity, IdentityError> {
        let credential = self.headers.credential(&request.headers)?;
        let ip = self
            .headers
            .client_ip(&request.headers, peer_ip(&request.extensions))?;
        match (self.read)(&request.extensions) {
            Some((id, tier, name)) => {
                self.seen_verified.store(true, Ordering::Relaxed);
                let mut identity =
                    Identity::keyed(IdentityKind::Custom, id, self.headers.key()).with_ip(ip);
                if let Some(name) = name {
                    identity = identity.with_display_name(name);
                }
                Ok(match tier {
                    Some(t) => identity.with_tier(t),
                    None => identity,
                })
            }
            None => {
                if credential.is_some() {
                    self.note_unverified();
                }
                self.headers.anonymous(ip)
            }
        }
    }
}
