//! The committed copy of a run: `cargo xtask bench` passes `--results bench/results`,
//! and after the run `report.md` and `report.json` are copied into
//! `bench/results/<YYYY-MM-DD>-<short commit>[-quick]/`, named by the run's date,
//! commit and mode (the plots stay in the output directory). The files are written by
//! the tool only, never edited by hand (`bench/results/README.md`).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::{Environment, Mode};

/// The results folder of a run: `2026-12-01-c161e47`, `-quick` appended for a quick
/// run (a smoke run is not kept).
pub fn folder_name(date: &str, commit: &str, mode: Mode) -> Option<String> {
    match mode {
        Mode::Smoke => None,
        Mode::Quick => Some(format!("{date}-{commit}-quick")),
        Mode::Full => Some(format!("{date}-{commit}")),
    }
}

/// Copies `report.md` and `report.json` from `out` into their folder under
/// `results`; returns the folder (`None` for a smoke run). A second run of the same
/// commit on the same day replaces the first.
pub fn save(results: &Path, out: &Path, env: &Environment, mode: Mode) -> Result<Option<PathBuf>> {
    let Some(name) = folder_name(&env.date, &env.commit, mode) else {
        return Ok(None);
    };
    let dir = results.join(name);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    for file in ["report.md", "report.json"] {
        std::fs::copy(out.join(file), dir.join(file)).with_context(|| {
            format!(
                "copying {} into {}",
                out.join(file).display(),
                dir.display()
            )
        })?;
    }
    Ok(Some(dir))
}

/// The machine's memory, from `/proc/meminfo` (`MemTotal: 8131012 kB` is `7.8 GiB`).
pub fn memory(meminfo: &str) -> Option<String> {
    let kib: f64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))?
        .trim()
        .strip_suffix("kB")?
        .trim()
        .parse()
        .ok()?;
    Some(format!("{:.1} GiB", kib / (1024.0 * 1024.0)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_runs_folder_is_named_by_date_commit_and_mode() {
        assert_eq!(
            folder_name("2026-12-01", "c161e47", Mode::Full).as_deref(),
            Some("2026-12-01-c161e47")
        );
        assert_eq!(
            folder_name("2026-12-01", "c161e47", Mode::Quick).as_deref(),
            Some("2026-12-01-c161e47-quick")
        );
        assert_eq!(folder_name("2026-12-01", "c161e47", Mode::Smoke), None);
    }

    #[test]
    fn memory_is_read_from_meminfo() {
        let meminfo = "MemTotal:        8131012 kB\nMemFree:          123456 kB\n";
        assert_eq!(memory(meminfo).as_deref(), Some("7.8 GiB"));
        assert_eq!(memory("MemFree: 1 kB\n"), None);
    }

    #[test]
    fn the_reports_are_copied_into_their_folder() {
        let tmp = std::env::temp_dir().join(format!("sliceway-results-{}", std::process::id()));
        let (out, results) = (tmp.join("out"), tmp.join("results"));
        std::fs::create_dir_all(&out).unwrap();
        std::fs::write(out.join("report.md"), "# md\n").unwrap();
        std::fs::write(out.join("report.json"), "{}\n").unwrap();
        let env = Environment {
            date: "2026-12-01".into(),
            commit: "c161e47".into(),
            ..Environment::default()
        };
        let dir = save(&results, &out, &env, Mode::Quick).unwrap().unwrap();
        assert_eq!(dir, results.join("2026-12-01-c161e47-quick"));
        assert_eq!(
            std::fs::read_to_string(dir.join("report.md")).unwrap(),
            "# md\n"
        );
        assert_eq!(
            std::fs::read_to_string(dir.join("report.json")).unwrap(),
            "{}\n"
        );
        assert_eq!(save(&results, &out, &env, Mode::Smoke).unwrap(), None);
        std::fs::remove_dir_all(&tmp).unwrap();
    }
}
