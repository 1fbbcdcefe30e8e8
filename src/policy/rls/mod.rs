//! `[rls]`: the descriptor domains a decision service answers for, loaded
//! from envoyproxy/ratelimit YAML files (`envoy_configs`) and from native
//! `[[rls.domains]]` of the policy, with envoyproxy/ratelimit's matching
//! rules ([`Domain::find`]).
//!
//! Pure policy: no store and no async; the only I/O is reading the YAML
//! files while the policy is loaded.

mod domain;
mod envoy;
mod rule;
mod settings;
mod yaml;

pub use domain::{Domain, DomainSet};
pub use rule::{DescriptorRule, RlsUnit};
pub use settings::{RlsFailure, RlsHeaders, RlsSettings};
