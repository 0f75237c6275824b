//! The agent loop in local mode: watch a manifest directory, compile, write the
//! difference to the maps. The Kubernetes API source will feed the same compiler.

use std::{collections::BTreeSet, path::PathBuf, time::Duration};

use anyhow::Context as _;
use tracing::{info, warn};

use crate::{
    compiler::{self, Skipped},
    kernel::{Attached, Capacities, Datapath, PinDir},
    local::ManifestDir,
    writer::MapWriter,
};

/// Settings of `sliceway-agent run`.
#[derive(Clone, Debug)]
pub struct Settings {
    pub manifests: PathBuf,
    pub interfaces: Vec<String>,
    pub compiler: compiler::Options,
    pub capacities: Capacities,
    /// How often the manifest directory is checked for changes.
    pub poll: Duration,
    /// Where maps and links are pinned; `None` keeps them private to this process
    /// (programs detach when it exits).
    pub pins: Option<PinDir>,
}

/// Per-sync state that outlives one sync.
struct Syncer {
    writer: MapWriter,
    reported: BTreeSet<Skipped>,
    syncs: u64,
}

impl Syncer {
    fn sync(&mut self, dir: &ManifestDir, dp: &mut Datapath, opts: &compiler::Options) {
        let started = std::time::Instant::now();
        let objects = dir.objects();
        let compiled = compiler::compile(&objects.services, &objects.slices, opts);
        // Say each problem once, not at every sync.
        let now: BTreeSet<Skipped> = compiled.skipped.iter().cloned().collect();
        for s in now.difference(&self.reported) {
            warn!(object = %s.object, "skipped: {}", s.reason);
        }
        self.reported = now;
        let report = self.writer.apply(&compiled.frontends, &mut dp.maps);
        for (service, reason) in &report.rejected {
            warn!(%service, "kept its previous state: {reason}");
        }
        for e in &report.errors {
            warn!("map write failed: {e}");
        }
        self.syncs += 1;
        info!(
            sync = self.syncs,
            services = objects.services.len(),
            slices = objects.slices.len(),
            frontends = self.writer.programmed().len(),
            backends = self.writer.backend_count(),
            writes = report.map_writes,
            deletes = report.map_deletes,
            skipped = compiled.skipped.len(),
            micros = started.elapsed().as_micros() as u64,
            "synced"
        );
    }
}

/// Runs until `shutdown` resolves.
pub async fn run_local(
    settings: Settings,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    let mut dp = Datapath::load(&settings.capacities, settings.pins.as_ref())
        .context("loading the datapath")?;
    // Adopt what an earlier run left in pinned maps: the first sync then writes only
    // the difference and flushes nothing (conntrack included).
    let writer = match &settings.pins {
        Some(pins) => {
            let state = dp.maps.state();
            info!(
                dir = %pins.dir().display(),
                frontends = state.services.len(),
                backends = state.backends.len(),
                "adopted pinned maps"
            );
            MapWriter::restore(dp.limits(), state)
        }
        None => MapWriter::new(dp.limits()),
    };
    for iface in &settings.interfaces {
        let how = dp
            .attach(iface)
            .with_context(|| format!("attaching to {iface}"))?;
        match how {
            Attached::NewPinned => info!(interface = %iface, "attached (pinned link)"),
            Attached::Replaced => info!(interface = %iface, "took over the pinned link"),
            Attached::Unpinned => info!(interface = %iface, "attached (until the agent exits)"),
        }
    }
    let mut dir = ManifestDir::new(&settings.manifests);
    let mut syncer = Syncer {
        writer,
        reported: BTreeSet::new(),
        syncs: 0,
    };
    tokio::pin!(shutdown);
    loop {
        match dir.rescan() {
            Ok(scan) => {
                for p in &scan.new_problems {
                    warn!(file = %p.file.display(), "{}", p.reason);
                }
                if scan.changed || syncer.syncs == 0 {
                    syncer.sync(&dir, &mut dp, &settings.compiler);
                }
            }
            Err(e) => {
                warn!(dir = %settings.manifests.display(), "cannot read the manifest directory: {e}; keeping the current state")
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(settings.poll) => {}
            _ = &mut shutdown => break,
        }
    }
    info!("shutting down; programs detach as the agent exits");
    Ok(())
}
