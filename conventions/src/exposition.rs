//! Reading back the Prometheus text format the binaries serve on `/metrics`: each
//! family's name, type and help, and the label names its series carry. The generated
//! metrics reference (`docs/reference/metrics.md`) is rendered from it, and the
//! binaries' tests check with it that every series has the labels its family declares.

use std::collections::{BTreeMap, BTreeSet};

/// One metric family as the text format announces it (`# HELP`, `# TYPE`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Family {
    /// The full name, prefix included (`sliceway_syncs`).
    pub name: String,
    /// `counter`, `gauge`, `histogram`, ...
    pub kind: String,
    /// The help text.
    pub help: String,
}

/// The families of `text`, in the order it announces them.
pub fn families(text: &str) -> Vec<Family> {
    let mut out: Vec<Family> = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            out.push(Family {
                name: name.to_string(),
                kind: String::new(),
                help: unescape_help(help),
            });
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, ""));
            match out.iter_mut().find(|f| f.name == name) {
                Some(f) => f.kind = kind.to_string(),
                None => out.push(Family {
                    name: name.to_string(),
                    kind: kind.to_string(),
                    help: String::new(),
                }),
            }
        }
    }
    out
}

/// The label names of every series in `text`, by family: a sample's name is taken to
/// its family by dropping the suffix its type adds (`_total`, `_bucket`, `_sum`,
/// `_count`, `_created`, `_info`); a histogram's `le` is not counted. A family whose
/// series carry different label sets has each of them.
pub fn series_labels(text: &str) -> BTreeMap<String, BTreeSet<Vec<String>>> {
    let known: BTreeSet<String> = families(text).into_iter().map(|f| f.name).collect();
    let mut out: BTreeMap<String, BTreeSet<Vec<String>>> = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let (sample, labels) = match line.split_once('{') {
            Some((sample, rest)) => (sample, label_names(rest)),
            None => (line.split_whitespace().next().unwrap_or(line), Vec::new()),
        };
        let family = ["_total", "_bucket", "_sum", "_count", "_created", "_info"]
            .iter()
            .filter_map(|suffix| sample.strip_suffix(suffix))
            .find(|f| known.contains(*f))
            .unwrap_or(sample);
        let labels = labels.into_iter().filter(|l| l != "le").collect();
        out.entry(family.to_string()).or_default().insert(labels);
    }
    out
}

/// The names of the labels in `rest`, the text after a sample's `{`.
fn label_names(rest: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut chars = rest.chars();
    loop {
        let name: String = chars.by_ref().take_while(|&c| c != '=').collect();
        let name = name.trim_start_matches([',', ' ']).to_string();
        if name.is_empty() || name.starts_with('}') {
            break;
        }
        names.push(name);
        // The value: a quoted string with backslash escapes.
        if chars.next() != Some('"') {
            break;
        }
        let mut escaped = false;
        for c in chars.by_ref() {
            match (escaped, c) {
                (false, '\\') => escaped = true,
                (false, '"') => break,
                _ => escaped = false,
            }
        }
    }
    names
}

/// A help text with the format's escapes (`\\`, `\n`) undone.
fn unescape_help(help: &str) -> String {
    help.replace("\\n", "\n").replace("\\\\", "\\")
}

/// Checks the reference example of a binary's metrics (its `with_one_series_each`):
/// `text` has a series in each of the `registered` families (a family without one
/// would be missing from `docs/reference/metrics.md`), and each family's series carry
/// one set of labels. What is wrong, if anything.
pub fn check_one_series_each(registered: usize, text: &str) -> Result<(), String> {
    let families = families(text);
    if families.len() != registered {
        return Err(format!(
            "{} of {registered} families have a series in with_one_series_each: {:?}",
            families.len(),
            families.iter().map(|f| &f.name).collect::<Vec<_>>()
        ));
    }
    for (family, sets) in series_labels(text) {
        if sets.len() != 1 {
            return Err(format!(
                "{family}'s series carry different labels: {sets:?}"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "# HELP a_syncs Syncs of the maps.\n\
        # TYPE a_syncs counter\n\
        a_syncs_total 3\n\
        # HELP a_lat Latency.\n\
        # TYPE a_lat histogram\n\
        a_lat_bucket{le=\"0.1\",map=\"x\"} 1\n\
        a_lat_sum{map=\"x\"} 0.5\n\
        # HELP a_links Links.\n\
        # TYPE a_links gauge\n\
        a_links{interface=\"eth0\",how=\"a,b=\\\"c\\\"\"} 1\n\
        # HELP a_idle Nothing yet.\n\
        # TYPE a_idle gauge\n";

    #[test]
    fn families_are_read_with_their_type_and_help() {
        let f = families(TEXT);
        assert_eq!(
            f.iter()
                .map(|f| (f.name.as_str(), f.kind.as_str(), f.help.as_str()))
                .collect::<Vec<_>>(),
            [
                ("a_syncs", "counter", "Syncs of the maps."),
                ("a_lat", "histogram", "Latency."),
                ("a_links", "gauge", "Links."),
                ("a_idle", "gauge", "Nothing yet."),
            ]
        );
    }

    #[test]
    fn series_are_taken_to_their_family_with_their_label_names() {
        let s = series_labels(TEXT);
        let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(s["a_syncs"], [names(&[])].into());
        assert_eq!(s["a_lat"], [names(&["map"])].into());
        // A value holding a comma, an equals sign and escaped quotes is one value.
        assert_eq!(s["a_links"], [names(&["interface", "how"])].into());
        assert!(
            !s.contains_key("a_idle"),
            "a family with no series has none"
        );
    }
}
