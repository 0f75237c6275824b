//! Issue 47: the agent logs as Kubernetes components do, run as a user runs it (its
//! stderr a pipe, not a terminal): `--logging-format json` writes one JSON object a
//! line, text has no colour codes.

use std::{path::PathBuf, process::Command};

/// A manifest directory holding one file the reader refuses, which it logs.
fn directory_with_a_bad_file(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sliceway-agent-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("bad.yaml"), "kind: Service\nmetadata: {name: x\n").unwrap();
    dir
}

/// The agent's stderr for `trace` over `dir` with `flags` first. The trace itself
/// needs BPF (root); its warning about the file comes before, either way.
fn stderr_of(flags: &[&str], dir: &std::path::Path) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_sliceway-agent"))
        .args(flags)
        .arg("trace")
        .arg("--manifests")
        .arg(dir)
        .args(["--src", "10.244.1.2", "--dst", "10.96.0.10:80"])
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    String::from_utf8(out.stderr).unwrap()
}

#[test]
fn json_lines_parse_and_text_has_no_colour_off_a_terminal() {
    let dir = directory_with_a_bad_file("logging");
    let json = stderr_of(&["--logging-format", "json", "-v", "2"], &dir);
    // The lines before the error `main` returns without root (not a log line).
    let lines: Vec<serde_json::Value> = json
        .lines()
        .take_while(|l| !l.starts_with("Error: "))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?} is not JSON: {e}")))
        .collect();
    let warning = lines
        .iter()
        .find(|l| {
            l["msg"]
                .as_str()
                .is_some_and(|m| m.contains("not valid YAML"))
        })
        .unwrap_or_else(|| panic!("the refused file is logged: {json}"));
    assert_eq!(warning["level"], "warn", "{warning}");
    assert!(warning["file"].as_str().unwrap().ends_with("bad.yaml"));

    let text = stderr_of(&[], &dir);
    assert!(
        text.contains("WARN") && text.contains("not valid YAML"),
        "{text}"
    );
    assert!(!text.contains('\x1b'), "colour codes in {text:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
