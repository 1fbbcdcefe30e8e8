//! The public API is deliberate: every `pub` declaration in `src/` is
//! listed in `tests/public-api.txt`, so adding, removing or changing one
//! fails this test until the snapshot is updated with
//! `RATEWATCH_UPDATE_PUBLIC_API=1 cargo test --test public_api` and the
//! change is reviewed in the diff.
//!
//! Items in private modules are listed too: a `pub` there is one
//! `pub use` away from the API, and their methods on exported types
//! (`impl Limiter` in `src/limiter/*.rs`) are part of it.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

const SNAPSHOT: &str = "tests/public-api.txt";

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The first line of every `pub` declaration outside test modules, with
/// whitespace collapsed.
fn public_items(root: &Path) -> String {
    let mut files = Vec::new();
    rust_files(&root.join("src"), &mut files);
    let mut out = String::new();
    for file in files {
        let rel = file.strip_prefix(root).unwrap().display().to_string();
        if rel == "src/main.rs" {
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap();
        for line in text.lines() {
            let line = line.trim();
            if line.starts_with("#[cfg(test)]") {
                // Unit tests sit at the end of a file.
                break;
            }
            if !line.starts_with("pub ") {
                continue;
            }
            let decl = line
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ")
                .trim_end_matches('{')
                .trim_end()
                .to_owned();
            writeln!(out, "{rel}: {decl}").unwrap();
        }
    }
    out
}

#[test]
fn every_public_item_is_in_the_snapshot() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let now = public_items(root);
    if std::env::var_os("RATEWATCH_UPDATE_PUBLIC_API").is_some() {
        std::fs::write(root.join(SNAPSHOT), &now).unwrap();
        return;
    }
    let before = std::fs::read_to_string(root.join(SNAPSHOT)).unwrap_or_default();
    if before != now {
        let old: Vec<&str> = before.lines().collect();
        let new: Vec<&str> = now.lines().collect();
        let added: Vec<&&str> = new.iter().filter(|l| !old.contains(l)).collect();
        let removed: Vec<&&str> = old.iter().filter(|l| !new.contains(l)).collect();
        panic!(
            "the public API changed; review it and update {SNAPSHOT} with \
             RATEWATCH_UPDATE_PUBLIC_API=1 cargo test --test public_api\n\
             added:\n{added:#?}\nremoved:\n{removed:#?}"
        );
    }
}

#[test]
fn the_embedding_api_is_reachable_from_outside() {
    // Compiles only while these paths stay public.
    use ratewatch::identity::{HeaderExtractor, IdentityError, IdentityKind, PrefixResolver};
    use ratewatch::layer::{HeaderFamilies, RateLimitLayer, Refusal, ResponseFuture};
    use ratewatch::policy::{ConfigError, PolicyBuilder, Scope};
    use ratewatch::store::{MemoryStore, Store};
    use ratewatch::{
        BreakerState, Decision, Identity, KeyExtractor, Limit, LimitReport, Limiter, Policy,
        RateLimit, RouteRule, Source, Tier, TierResolver,
    };
    let _ = (
        std::any::type_name::<HeaderExtractor>(),
        std::any::type_name::<IdentityError>(),
        std::any::type_name::<IdentityKind>(),
        std::any::type_name::<PrefixResolver>(),
        std::any::type_name::<HeaderFamilies>(),
        std::any::type_name::<RateLimitLayer>(),
        std::any::type_name::<Refusal<'static>>(),
        std::any::type_name::<ResponseFuture<std::future::Ready<()>>>(),
        std::any::type_name::<ConfigError>(),
        std::any::type_name::<PolicyBuilder>(),
        std::any::type_name::<Scope>(),
        std::any::type_name::<MemoryStore>(),
        std::any::type_name::<dyn Store>(),
        std::any::type_name::<BreakerState>(),
        std::any::type_name::<Decision>(),
        std::any::type_name::<Identity>(),
        std::any::type_name::<dyn KeyExtractor>(),
        std::any::type_name::<Limit>(),
        std::any::type_name::<LimitReport>(),
        std::any::type_name::<Limiter>(),
        std::any::type_name::<Policy>(),
        std::any::type_name::<RateLimit<()>>(),
        std::any::type_name::<RouteRule>(),
        std::any::type_name::<Source>(),
        std::any::type_name::<Tier>(),
        std::any::type_name::<dyn TierResolver>(),
    );
}
