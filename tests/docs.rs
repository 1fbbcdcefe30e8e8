//! The guide checks itself: README.md, CHANGELOG.md and docs/*.md.
//!
//! Rust blocks are doc tests (src/lib.rs includes every page that has
//! one); this file checks the rest. Every TOML block is a policy the real
//! `ratewatch check-config` accepts, except a block marked
//! ` ```toml,fragment `, which is a part of one and must still parse as
//! TOML. A YAML block whose first line is a `# NAME.yaml` comment is
//! written under that name beside the page's policies, so a policy can
//! name it in `[rls] envoy_configs`. Every YAML block loads, and one with a
//! top-level `domain` is an envoyproxy/ratelimit file `check-config`
//! accepts. Every relative link and `#anchor` leads somewhere, and the
//! README stays a five-minute read.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use yaml_rust2::{Yaml, YamlLoader};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// README.md, CHANGELOG.md and every page of docs/, in a fixed order.
fn pages() -> Vec<PathBuf> {
    let mut pages = vec![root().join("README.md"), root().join("CHANGELOG.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .expect("docs/")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    pages.extend(docs);
    pages
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn name(path: &Path) -> String {
    path.strip_prefix(root())
        .unwrap_or(path)
        .display()
        .to_string()
}

/// A fenced code block: where it starts, its info string, its text.
struct Block {
    line: usize,
    info: String,
    body: String,
}

fn blocks(text: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut open: Option<Block> = None;
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        if let Some(info) = trimmed.strip_prefix("```") {
            match open.take() {
                None => {
                    open = Some(Block {
                        line: i + 1,
                        info: info.trim().to_owned(),
                        body: String::new(),
                    })
                }
                Some(b) => out.push(b),
            }
        } else if let Some(b) = open.as_mut() {
            b.body.push_str(line);
            b.body.push('\n');
        }
    }
    assert!(open.is_none(), "a code block is never closed");
    out
}

fn lang(info: &str) -> &str {
    info.split([',', ' ']).next().unwrap_or("")
}

/// The file name a block's first line gives it (`# edge.yaml: ...`).
fn named(body: &str, ext: &[&str]) -> Option<String> {
    let first = body.lines().next()?.strip_prefix("# ")?;
    let word = first.split([' ', ':']).next()?;
    ext.iter()
        .any(|e| word.ends_with(e))
        .then(|| word.to_owned())
}

fn check_config(dir: &Path, file: &str) -> Result<String, String> {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ratewatch"));
    cmd.arg("check-config").arg(dir.join(file)).current_dir(dir);
    for (k, _) in std::env::vars() {
        if k.starts_with("RATEWATCH_") {
            cmd.env_remove(k);
        }
    }
    let out = cmd.output().expect("run ratewatch check-config");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() {
        Ok(text)
    } else {
        Err(text)
    }
}

/// Writes a page's named YAML blocks into `dir`.
fn write_named_yaml(dir: &Path, blocks: &[Block]) {
    for b in blocks.iter().filter(|b| lang(&b.info) == "yaml") {
        if let Some(file) = named(&b.body, &[".yaml", ".yml"]) {
            std::fs::write(dir.join(file), &b.body).unwrap();
        }
    }
}

#[test]
fn every_toml_block_is_a_policy_check_config_accepts_or_a_fragment_that_parses() {
    let mut checked = 0;
    let mut failures = Vec::new();
    for page in pages() {
        let blocks = blocks(&read(&page));
        let dir = tempfile::tempdir().unwrap();
        write_named_yaml(dir.path(), &blocks);
        for b in blocks.iter().filter(|b| lang(&b.info) == "toml") {
            let at = format!("{}:{}", name(&page), b.line);
            if b.info.split(',').any(|w| w.trim() == "fragment") {
                if let Err(e) = b.body.parse::<toml::Table>() {
                    failures.push(format!("{at}: a fragment that is not TOML: {e}"));
                }
                continue;
            }
            let file = named(&b.body, &[".toml"]).unwrap_or_else(|| "policy.toml".into());
            std::fs::write(dir.path().join(&file), &b.body).unwrap();
            match check_config(dir.path(), &file) {
                Ok(_) => checked += 1,
                Err(e) => failures.push(format!("{at}: check-config refused it:\n{e}")),
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    assert!(checked >= 2, "only {checked} whole policies were checked");
}

#[test]
fn every_yaml_block_loads_and_a_ratelimit_file_is_one_check_config_accepts() {
    let mut peer_files = 0;
    let mut failures = Vec::new();
    for page in pages() {
        let blocks = blocks(&read(&page));
        for b in blocks.iter().filter(|b| lang(&b.info) == "yaml") {
            let at = format!("{}:{}", name(&page), b.line);
            let docs = match YamlLoader::load_from_str(&b.body) {
                Ok(docs) => docs,
                Err(e) => {
                    failures.push(format!("{at}: not YAML: {e}"));
                    continue;
                }
            };
            let Some(Yaml::Hash(top)) = docs.first() else {
                failures.push(format!("{at}: no YAML mapping in the block"));
                continue;
            };
            if !top.contains_key(&Yaml::String("domain".into())) {
                continue;
            }
            let dir = tempfile::tempdir().unwrap();
            std::fs::write(dir.path().join("rules.yaml"), &b.body).unwrap();
            std::fs::write(
                dir.path().join("policy.toml"),
                "[rls]\nenvoy_configs = [\"rules.yaml\"]\n",
            )
            .unwrap();
            match check_config(dir.path(), "policy.toml") {
                Ok(_) => peer_files += 1,
                Err(e) => failures.push(format!(
                    "{at}: check-config refused it as an envoyproxy/ratelimit file:\n{e}"
                )),
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    assert!(peer_files >= 1, "no envoyproxy/ratelimit file was checked");
}

/// GitHub's anchor for a heading: lower case, punctuation dropped, spaces
/// as hyphens, `-1`, `-2` ... for repeats.
fn anchors(text: &str) -> Vec<String> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut out = Vec::new();
    let mut in_block = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_block = !in_block;
            continue;
        }
        if in_block || !line.starts_with('#') {
            continue;
        }
        let heading = line.trim_start_matches('#');
        if !heading.starts_with(' ') {
            continue;
        }
        let slug: String = heading
            .trim()
            .to_lowercase()
            .chars()
            .filter_map(|c| match c {
                ' ' => Some('-'),
                c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
                _ => None,
            })
            .collect();
        let n = seen.entry(slug.clone()).or_insert(0);
        out.push(if *n == 0 {
            slug.clone()
        } else {
            format!("{slug}-{n}")
        });
        *n += 1;
    }
    out
}

/// The targets of a page's links and images, outside code blocks and
/// code spans, with their line numbers.
fn links(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut in_block = false;
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            in_block = !in_block;
            continue;
        }
        if in_block {
            continue;
        }
        // Code spans are text, not links.
        let mut plain = String::new();
        for (k, part) in line.split('`').enumerate() {
            if k % 2 == 0 {
                plain.push_str(part);
            }
            plain.push(' ');
        }
        let mut rest = plain.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let end = after.find(')').unwrap_or(after.len());
            out.push((i + 1, after[..end].trim().to_owned()));
            rest = &after[end..];
        }
        // Reference definitions: `[name]: target`.
        if let Some((_, target)) = plain
            .strip_prefix('[')
            .and_then(|def| def.split_once("]: "))
        {
            out.push((i + 1, target.trim().to_owned()));
        }
    }
    out
}

#[test]
fn every_relative_link_and_anchor_resolves() {
    let mut failures = Vec::new();
    let mut checked = 0;
    for page in pages() {
        let text = read(&page);
        let dir = page.parent().unwrap();
        for (line, target) in links(&text) {
            let at = format!("{}:{line}", name(&page));
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (path, anchor) = target.split_once('#').unwrap_or((&target, ""));
            let file = if path.is_empty() {
                page.clone()
            } else {
                dir.join(path)
            };
            if !file.exists() {
                failures.push(format!("{at}: {target}: no {}", file.display()));
                continue;
            }
            if !anchor.is_empty() {
                if file.extension().is_none_or(|e| e != "md") {
                    failures.push(format!("{at}: {target}: an anchor into a non-page"));
                } else if !anchors(&read(&file)).iter().any(|a| a == anchor) {
                    failures.push(format!(
                        "{at}: {target}: {} has no heading #{anchor}",
                        name(&file)
                    ));
                }
            }
            checked += 1;
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(checked > 50, "only {checked} links were found");
}

#[test]
fn every_page_with_a_rust_block_is_compiled_as_doc_tests() {
    let lib = read(&root().join("src/lib.rs"));
    let mut failures = Vec::new();
    for page in pages() {
        let blocks = blocks(&read(&page));
        let rust: Vec<&Block> = blocks.iter().filter(|b| lang(&b.info) == "rust").collect();
        let included = format!("include_str!(\"../{}\")", name(&page));
        if !rust.is_empty() && !lib.contains(&included) {
            failures.push(format!(
                "{} has Rust blocks but src/lib.rs has no {included}",
                name(&page)
            ));
        }
        for b in blocks.iter().filter(|b| b.info.is_empty()) {
            failures.push(format!(
                "{}:{}: a code block without a language is compiled as Rust by rustdoc; name one (text, sh, ...)",
                name(&page),
                b.line
            ));
        }
        for b in rust.iter().filter(|b| b.info.contains("ignore")) {
            if !b.body.trim_start().starts_with("// Not compiled here:") {
                failures.push(format!(
                    "{}:{}: an ignored block must say why in a first `// Not compiled here:` line",
                    name(&page),
                    b.line
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn the_readme_is_a_five_minute_read_that_names_the_four_starting_points_early() {
    let readme = read(&root().join("README.md"));
    let lines = readme.lines().count();
    assert!(lines <= 250, "README.md has {lines} lines, 250 at most");
    let head = readme
        .lines()
        .take(60)
        .collect::<Vec<_>>()
        .join("\n")
        .to_lowercase();
    for needle in [
        "middleware",
        "decision service",
        "Envoy",
        "/v1/decide",
        "dashboard",
        "token quotas",
    ] {
        assert!(
            head.contains(&needle.to_lowercase()),
            "the first 60 lines of README.md do not name {needle:?}"
        );
    }
    for command in [
        "cargo run --release --features server -- serve",
        ".ci/test.sh",
    ] {
        assert!(readme.contains(command), "README.md lost `{command}`");
    }
    let ci = read(&root().join(".ci/run"));
    assert!(
        ci.contains("exec .ci/test.sh"),
        ".ci/run no longer runs the README's test command"
    );
}

#[test]
fn every_chapter_opens_with_what_the_reader_has_at_its_end() {
    let mut failures = Vec::new();
    for page in pages() {
        if page.parent() != Some(&root().join("docs")) {
            continue;
        }
        let text = read(&page);
        let first = text.split("\n\n").nth(1).unwrap_or("").replace('\n', " ");
        if !first.starts_with("At the end of this") {
            failures.push(format!(
                "{}: the paragraph after the title should say what the reader has at its end",
                name(&page)
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn the_changelog_opens_with_an_unreleased_section_in_keep_a_changelog_form() {
    let changelog = read(&root().join("CHANGELOG.md"));
    let versions: Vec<&str> = changelog.lines().filter(|l| l.starts_with("## ")).collect();
    assert_eq!(
        versions.first().copied(),
        Some("## [Unreleased]"),
        "CHANGELOG.md must open with `## [Unreleased]`, where new entries go"
    );
    for line in changelog.lines().filter(|l| l.starts_with("### ")) {
        let kind = &line[4..];
        assert!(
            [
                "Added",
                "Changed",
                "Deprecated",
                "Removed",
                "Fixed",
                "Security"
            ]
            .contains(&kind),
            "CHANGELOG.md: `{line}` is not a Keep a Changelog section"
        );
    }
}
