//! What `ratewatch serve` writes to stderr: with `RATEWATCH_LOG_FORMAT=json`
//! every line is one JSON object carrying the text format's fields, and no
//! line carries terminal escapes when stderr is not a terminal.

mod support;

use std::time::{Duration, Instant};

use support::Ratewatch;

/// Waits until the log holds the "listening" line and a warning, then
/// returns it.
fn log_once_listening(server: &Ratewatch) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let log = server.log();
        if log.contains("listening") && log.contains("no tier") {
            return log;
        }
        assert!(Instant::now() < deadline, "no listening line: {log}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A policy with no tier: `serve` warns about it.
fn empty_policy() -> tempfile::NamedTempFile {
    support::policy_file("")
}

#[test]
fn with_the_json_log_format_every_line_is_one_json_object_with_the_text_fields() {
    let policy = empty_policy();
    let server = Ratewatch::start_logged(
        "serve",
        Some(policy.path()),
        // Colours asked for, and still none in JSON.
        &[("RATEWATCH_LOG_FORMAT", "json"), ("NO_COLOR", "")],
        &[],
    );
    let log = log_once_listening(&server);
    let mut listening = None;
    for line in log.lines().filter(|l| !l.trim().is_empty()) {
        let v: serde_json::Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("not one JSON object ({e}): {line:?}"));
        let obj = v
            .as_object()
            .unwrap_or_else(|| panic!("not an object: {line}"));
        for field in ["timestamp", "level", "target", "message"] {
            assert!(obj.contains_key(field), "no {field:?} in {line}");
        }
        if obj["message"] == "ratewatch listening" {
            listening = Some(obj.clone());
        }
    }
    let listening = listening.unwrap_or_else(|| panic!("no listening line in {log}"));
    assert_eq!(listening["level"], "INFO");
    assert_eq!(listening["store"], "memory");
    assert_eq!(listening["addr"], server.addr());
    assert!(log.contains("\"level\":\"WARN\""), "{log}");
}

#[test]
fn log_lines_carry_no_terminal_escapes_when_stderr_is_not_a_terminal() {
    let policy = empty_policy();
    // NO_COLOR unset: only the output not being a terminal keeps colours off.
    let server = Ratewatch::start_logged("serve", Some(policy.path()), &[("NO_COLOR", "")], &[]);
    let log = log_once_listening(&server);
    assert!(
        !log.contains('\u{1b}'),
        "terminal escapes in a log file: {log:?}"
    );
    assert!(log.contains("ratewatch listening addr="), "{log}");
}
