//! What building ratewatch costs: a cold release build of the server and
//! the number of crates an embedding app pulls in by default.
//!
//! `bench/run.sh` measures both before the benchmark starts (a fresh
//! `CARGO_TARGET_DIR`, `cargo build --release --features server
//! --timings`, on the still quiet machine) and hands the figures over in
//! the file `RATEWATCH_BENCH_BUILD` names, one `key=value` a line:
//! `wall_secs`, `crates`, `units` (compilation units built) and a `unit=`
//! line per heavy unit (`seconds name`), heaviest first. Without it the
//! rows say the build was not measured in this run.

use std::fmt::Write as _;

/// The goals: a cold release build of `--features server` within five
/// minutes on two cores, and the lean default within 110 crates.
const BUILD_SECS_GOAL: f64 = 300.0;
const CRATES_GOAL: u64 = 110;

/// The figures of one measured build.
#[derive(Debug, Default)]
pub struct Build {
    pub wall_secs: f64,
    pub crates: u64,
    pub units: u64,
    /// The heaviest compilation units: seconds and name.
    pub heaviest: Vec<(f64, String)>,
}

/// The build the run measured, if it measured one.
pub fn measured() -> Option<Build> {
    let path = std::env::var_os("RATEWATCH_BENCH_BUILD")?;
    let text = std::fs::read_to_string(path).ok()?;
    let mut b = Build::default();
    for line in text.lines() {
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        match key {
            "wall_secs" => b.wall_secs = value.trim().parse().ok()?,
            "crates" => b.crates = value.trim().parse().ok()?,
            "units" => b.units = value.trim().parse().ok()?,
            "unit" => {
                let (secs, name) = value.trim().split_once(' ')?;
                b.heaviest.push((secs.parse().ok()?, name.to_owned()));
            }
            _ => {}
        }
    }
    (b.wall_secs > 0.0).then_some(b)
}

/// The goal rows.
pub fn goal_rows(w: &mut String, build: Option<&Build>) {
    let Some(b) = build else {
        let _ = writeln!(
            w,
            "| cold release build of `--features server` ≤ 5 min (2 cores) | not measured in this run (`BENCH_BUILD=0`) | — |\n\
             | the lean default (an embedding app's dependency on ratewatch) ≤ {CRATES_GOAL} crates | not measured in this run | — |"
        );
        return;
    };
    let _ = writeln!(
        w,
        "| cold release build of `--features server` ≤ 5 min (2 cores) | {:.0} s ({} units) | {} |",
        b.wall_secs,
        b.units,
        crate::report::verdict(b.wall_secs <= BUILD_SECS_GOAL)
    );
    let _ = writeln!(
        w,
        "| the lean default (an embedding app's dependency on ratewatch) ≤ {CRATES_GOAL} crates | {} | {} |",
        b.crates,
        crate::report::verdict(b.crates <= CRATES_GOAL)
    );
}

/// The section naming the heaviest units.
pub fn render(w: &mut String, build: Option<&Build>) {
    let Some(b) = build else {
        return;
    };
    let _ = writeln!(
        w,
        "\n## Build\n\nA cold release build of the server (`cargo build --release --features server --timings` into an empty target directory, before the benchmark's own build, on the same machine): {:.0} s of wall time for {} compilation units. The crates of the lean default are counted by `cargo tree -e normal` over the default features: {}. The heaviest units, by their own compile time from the `--timings` report (units overlap on two cores, so these add up to more than the wall time):\n\n| unit | seconds |\n|---|---|",
        b.wall_secs, b.units, b.crates
    );
    for (secs, name) in &b.heaviest {
        let _ = writeln!(w, "| {name} | {secs:.1} |");
    }
}
