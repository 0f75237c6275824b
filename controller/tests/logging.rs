//! Issue 47: the controller logs as Kubernetes components do, run as a user runs it
//! (its stderr a pipe, not a terminal): `--logging-format json` writes one JSON object
//! a line, text has no colour codes.

use std::{
    io::{BufRead as _, BufReader},
    process::{Command, Stdio},
};

/// The controller's first log lines in local mode over a directory whose one file
/// it refuses, up to the one saying so; `flags` go after `run`, where clap takes the
/// global flags too.
fn lines_until_the_refusal(flags: &[&str], name: &str) -> Vec<String> {
    let dir =
        std::env::temp_dir().join(format!("sliceway-controller-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("bad.yaml"), "kind: Service\nmetadata: {name: x\n").unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_sliceway-controller"))
        .arg("run")
        .arg("--manifests")
        .arg(&dir)
        .args(["--metrics-addr", "127.0.0.1:0"])
        .args(flags)
        .env_remove("RUST_LOG")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = Vec::new();
    for line in BufReader::new(child.stderr.take().unwrap()).lines() {
        let line = line.unwrap();
        let done = line.contains("skipping manifest");
        lines.push(line);
        if done || lines.len() > 100 {
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
    lines
}

#[test]
fn json_lines_parse_and_text_has_no_colour_off_a_terminal() {
    let json = lines_until_the_refusal(&["--logging-format", "json", "--v=2"], "json");
    let parsed: Vec<serde_json::Value> = json
        .iter()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?} is not JSON: {e}")))
        .collect();
    let last = parsed.last().expect("a log line");
    assert_eq!(last["msg"], "skipping manifest", "{json:?}");
    assert_eq!(last["level"], "warn");
    assert!(last["ts"].is_f64() && last["caller"].is_string(), "{last}");

    let text = lines_until_the_refusal(&[], "text");
    assert!(text.last().is_some_and(|l| l.contains("WARN")), "{text:?}");
    assert!(
        text.iter().all(|l| !l.contains('\x1b')),
        "colour codes in {text:?}"
    );
}
