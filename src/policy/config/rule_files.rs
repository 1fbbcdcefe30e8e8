//! Which files one `[rls] envoy_configs` entry names: a file, a directory
//! (every `*.yaml` / `*.yml` in it and in its subdirectories, as
//! envoyproxy/ratelimit walks its runtime directory) or a glob (`*` and
//! `?` in any component). Files come back sorted, so every instance loads
//! them in the same order.
//!
//! Names starting with `.` are skipped in directories and by globs
//! (unless the glob's own component starts with `.`): they are hidden
//! files and a Kubernetes ConfigMap's `..data` and `..<timestamp>`
//! entries, whose files the visible symlinks already name. Symlinks to
//! files are followed; symlinks to directories are not descended into
//! (no loops). A walk stops at [`MAX_RULE_FILES`] files or
//! [`MAX_DEPTH`] levels: the error names the entry.
//!
//! Only `stat` and `readdir` here; the files are read by the safe reader.

use std::path::{Component, Path, PathBuf};

/// The most YAML files all entries of one policy may name together.
pub(crate) const MAX_RULE_FILES: usize = 1000;
/// How deep a directory or a glob is walked.
pub(crate) const MAX_DEPTH: usize = 8;
/// The most directory entries one walk looks at (files of any kind and
/// subdirectories): a directory such as `/` is refused quickly instead of
/// being listed for minutes.
pub(crate) const MAX_ENTRIES_SEEN: usize = 20_000;

/// Whether `entry` is a glob rather than a path.
pub(crate) fn is_glob(entry: &Path) -> bool {
    entry
        .to_str()
        .is_some_and(|s| s.contains('*') || s.contains('?'))
}

/// The files `entry` names now, sorted; an error says why none can be
/// taken (a missing path, a directory or glob with no YAML file, too
/// many files). A plain path is returned as it is (the reader then says
/// what is wrong with it).
pub(crate) fn expand(entry: &Path) -> Result<Vec<PathBuf>, String> {
    if is_glob(entry) {
        let mut out = Vec::new();
        glob(entry, &mut out)?;
        out.sort();
        if out.is_empty() {
            return Err("is a pattern that matches no file".into());
        }
        return Ok(out);
    }
    match std::fs::metadata(entry) {
        Ok(m) if m.is_dir() => {
            let mut out = Vec::new();
            walk(entry, 0, &mut 0, &mut out)?;
            out.sort();
            if out.is_empty() {
                return Err(
                    "is a directory without any *.yaml or *.yml file (a directory entry loads \
                     every one of them)"
                        .into(),
                );
            }
            Ok(out)
        }
        _ => Ok(vec![entry.to_path_buf()]),
    }
}

fn is_yaml(name: &str) -> bool {
    !name.starts_with('.') && (name.ends_with(".yaml") || name.ends_with(".yml"))
}

fn too_many() -> String {
    format!("names more than {MAX_RULE_FILES} files, the most a policy may load")
}

fn too_many_entries() -> String {
    format!(
        "holds more than {MAX_ENTRIES_SEEN} entries; name the directory of the rule files itself"
    )
}

/// Every YAML file under `dir`, descending into real subdirectories;
/// `seen` counts the entries looked at.
fn walk(dir: &Path, depth: usize, seen: &mut usize, out: &mut Vec<PathBuf>) -> Result<(), String> {
    if depth > MAX_DEPTH {
        return Err(format!("nests directories deeper than {MAX_DEPTH} levels"));
    }
    let unlisted =
        |e: std::io::Error| format!("holds {}, which cannot be listed: {e}", dir.display());
    let entries = std::fs::read_dir(dir).map_err(unlisted)?;
    for entry in entries {
        let entry = entry.map_err(unlisted)?;
        *seen += 1;
        if *seen > MAX_ENTRIES_SEEN {
            return Err(too_many_entries());
        }
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if name.starts_with('.') {
            continue;
        }
        let path = entry.path();
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        if kind.is_dir() {
            walk(&path, depth + 1, seen, out)?;
        } else if is_yaml(name) && std::fs::metadata(&path).is_ok_and(|m| !m.is_dir()) {
            // Not only regular files: a FIFO or a device here is
            // refused by name when read, rather than skipped unseen.
            out.push(path);
            if out.len() > MAX_RULE_FILES {
                return Err(too_many());
            }
        }
    }
    Ok(())
}

/// Every file matching `pattern`, component by component.
fn glob(pattern: &Path, out: &mut Vec<PathBuf>) -> Result<(), String> {
    let mut bases = vec![PathBuf::new()];
    let mut seen = 0usize;
    let components: Vec<Component<'_>> = pattern.components().collect();
    if components.len() > MAX_DEPTH + 16 {
        return Err(format!("has more than {} components", MAX_DEPTH + 16));
    }
    for (i, c) in components.iter().enumerate() {
        let last = i + 1 == components.len();
        let Component::Normal(part) = c else {
            for b in &mut bases {
                b.push(c.as_os_str());
            }
            continue;
        };
        let Some(part) = part.to_str().filter(|p| p.contains('*') || p.contains('?')) else {
            for b in &mut bases {
                b.push(part);
            }
            continue;
        };
        let mut next = Vec::new();
        for base in &bases {
            let dir = if base.as_os_str().is_empty() {
                Path::new(".")
            } else {
                base.as_path()
            };
            let Ok(entries) = std::fs::read_dir(dir) else {
                continue;
            };
            for entry in entries.flatten() {
                seen += 1;
                if seen > MAX_ENTRIES_SEEN {
                    return Err(too_many_entries());
                }
                let name = entry.file_name();
                let Some(name) = name.to_str() else { continue };
                if name.starts_with('.') && !part.starts_with('.') {
                    continue;
                }
                if !matches(part.as_bytes(), name.as_bytes()) {
                    continue;
                }
                next.push(base.join(name));
                if next.len() > MAX_RULE_FILES {
                    return Err(too_many());
                }
            }
        }
        if !last {
            // Only real directories are descended into.
            next.retain(|p| std::fs::symlink_metadata(p).is_ok_and(|m| m.is_dir()));
        }
        bases = next;
    }
    out.extend(
        bases
            .into_iter()
            .filter(|p| std::fs::metadata(p).is_ok_and(|m| !m.is_dir())),
    );
    Ok(())
}

/// Whether `name` matches `pattern` (`*` any run, `?` one byte). Linear
/// in practice: the last `*` is the only backtracking point.
fn matches(pattern: &[u8], name: &[u8]) -> bool {
    let (mut p, mut n) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while n < name.len() {
        if p < pattern.len() && (pattern[p] == b'?' || pattern[p] == name[n]) {
            p += 1;
            n += 1;
        } else if p < pattern.len() && pattern[p] == b'*' {
            star = Some((p, n));
            p += 1;
        } else if let Some((sp, sn)) = star {
            p = sp + 1;
            n = sn + 1;
            star = Some((sp, sn + 1));
        } else {
            return false;
        }
    }
    pattern[p..].iter().all(|&c| c == b'*')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn touch(path: &Path) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, "domain: x\n").unwrap();
    }

    #[test]
    fn a_glob_matches_stars_and_question_marks() {
        assert!(matches(b"*.yaml", b"a.yaml"));
        assert!(matches(b"*.yaml", b".yaml"));
        assert!(!matches(b"*.yaml", b"a.yml"));
        assert!(matches(b"r?.y*ml", b"r1.yaml"));
        assert!(matches(b"*a*b", b"xxaxxb"));
        assert!(!matches(b"*a*b", b"xxaxxbc"));
    }

    #[test]
    fn a_directory_names_its_yaml_files_sorted_and_recursively_skipping_hidden_ones() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        for f in ["b.yaml", "a.yml", "notes.txt", ".hidden.yaml", "sub/c.yaml"] {
            touch(&d.join(f));
        }
        touch(&d.join("..2026_01_01/a.yml"));
        let got = expand(d).unwrap();
        assert_eq!(
            got,
            vec![d.join("a.yml"), d.join("b.yaml"), d.join("sub/c.yaml")]
        );
    }

    #[test]
    fn a_glob_names_matching_files_sorted() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        for f in ["x/b.yaml", "y/a.yaml", "y/a.txt"] {
            touch(&d.join(f));
        }
        let got = expand(&d.join("*/*.yaml")).unwrap();
        assert_eq!(got, vec![d.join("x/b.yaml"), d.join("y/a.yaml")]);
        let err = expand(&d.join("*/*.json")).unwrap_err();
        assert!(err.contains("matches no file"), "{err}");
    }

    #[test]
    fn the_root_directory_is_refused_quickly_by_its_size() {
        let started = std::time::Instant::now();
        // Refused for its size, or for a directory it may not list.
        let err = expand(Path::new("/")).unwrap_err();
        assert!(
            err.contains("more than") || err.contains("cannot be listed"),
            "{err}"
        );
        assert!(started.elapsed() < std::time::Duration::from_secs(20));
    }

    #[test]
    fn an_empty_directory_is_an_error_and_a_plain_path_passes_through() {
        let dir = tempfile::tempdir().unwrap();
        assert!(expand(dir.path()).unwrap_err().contains("without any"));
        let missing = dir.path().join("missing.yaml");
        assert_eq!(expand(&missing).unwrap(), vec![missing]);
    }
}
