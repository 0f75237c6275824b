//! Belt and braces for the lab's network safety: while a lab runs, the root
//! namespace counts and drops anything it would send to the lab's own ranges (node,
//! pod and Service networks of both families), with an nftables table of the lab's
//! own at the `output` hook. Only those ranges: the machine's resolver and everything
//! else the root namespace uses are untouched. A lab test asserts that the counter is
//! still 0 at its end ([`escaped`]); `cluster down` says so if it is not.

use anyhow::{bail, Context, Result};

/// The lab's networks: the node network, the pod and Service CIDRs, both families.
pub const LAB_NETWORKS: [&str; 6] = [
    "10.100.0.0/24",
    "10.244.0.0/16",
    "10.96.0.0/16",
    "fd00:10:100::/64",
    "fd00:10:244::/56",
    "fd00:10:96::/112",
];

/// The table of the lab with namespace prefix `prefix`.
fn table(prefix: &str) -> String {
    format!("{}_guard", prefix.replace('-', "_"))
}

fn nft(script: &str) -> Result<String> {
    use std::io::Write as _;
    let mut child = std::process::Command::new("nft")
        .args(["-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .context("running nft (Debian's nftables package)")?;
    child
        .stdin
        .take()
        .context("nft's standard input")?
        .write_all(script.as_bytes())?;
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!(
            "nft -f failed: {}\n{script}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Installs the guard of the lab `prefix` in the root namespace (again if present).
pub fn install(prefix: &str) -> Result<()> {
    let t = table(prefix);
    let v4: Vec<&str> = LAB_NETWORKS
        .iter()
        .copied()
        .filter(|n| !n.contains(':'))
        .collect();
    let v6: Vec<&str> = LAB_NETWORKS
        .iter()
        .copied()
        .filter(|n| n.contains(':'))
        .collect();
    let _ = remove(prefix);
    nft(&format!(
        "table inet {t} {{\n  chain output {{\n    type filter hook output priority 0; policy accept;\n    ip daddr {{ {} }} counter drop\n    ip6 daddr {{ {} }} counter drop\n  }}\n}}\n",
        v4.join(", "),
        v6.join(", ")
    ))?;
    Ok(())
}

/// How many packets the root namespace tried to send to the lab since
/// [`install`]; an error if the guard is not in place.
pub fn escaped(prefix: &str) -> Result<u64> {
    let out = list_table(&table(prefix))?;
    Ok(out
        .split_whitespace()
        .collect::<Vec<_>>()
        .windows(2)
        .filter(|w| w[0] == "packets")
        .filter_map(|w| w[1].parse::<u64>().ok())
        .sum())
}

fn list_table(table: &str) -> Result<String> {
    let out = std::process::Command::new("nft")
        .args(["list", "table", "inet", table])
        .output()
        .context("running nft")?;
    if !out.status.success() {
        bail!(
            "the lab's guard table {table} is missing: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Removes the guard of the lab `prefix`.
pub fn remove(prefix: &str) -> Result<()> {
    nft(&format!("delete table inet {}\n", table(prefix))).map(|_| ())
}
