//! The `sliceway-controller` command line, in the library so that the generated CLI
//! reference (`docs/reference/cli.md`) renders the binary's own definition.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::store::{self, Controllers};
use crate::{mirroring, reconciler, util};

#[derive(Parser)]
#[command(
    name = "sliceway-controller",
    version,
    about = "EndpointSlice, Endpoints and mirroring controllers for Services"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// `--logging-format` and `-v`, as Kubernetes components take them.
    #[command(flatten)]
    pub log: conventions::logging::LogArgs,
}

#[derive(Subcommand)]
pub enum Command {
    /// Run the controllers against the API server, or a manifest directory.
    Run(RunArgs),
    /// One reconcile pass over a manifest directory; prints the plan, writes nothing.
    Plan(PlanArgs),
    /// `completions SHELL` and `man`, generated from this definition.
    #[command(flatten)]
    Generate(conventions::clidoc::Generate),
}

#[derive(Clone, Copy, ValueEnum)]
pub enum Format {
    Json,
    Table,
}

#[derive(Args, Clone)]
pub struct ReconcileArgs {
    /// Most endpoints per EndpointSlice (1 to 1000).
    #[arg(long, env = "SLICEWAY_MAX_ENDPOINTS_PER_SLICE", default_value_t = reconciler::DEFAULT_MAX_ENDPOINTS_PER_SLICE)]
    pub max_endpoints_per_slice: usize,
    /// The `endpointslice.kubernetes.io/managed-by` value of the slices it writes.
    /// Keep upstream's value only when kube-controller-manager's controllers are off.
    #[arg(long, env = "SLICEWAY_MANAGED_BY", default_value = util::CONTROLLER_NAME)]
    pub managed_by: String,
    /// The managed-by value of mirrored slices.
    #[arg(long, env = "SLICEWAY_MIRRORING_MANAGED_BY", default_value = util::MIRRORING_CONTROLLER_NAME)]
    pub mirroring_managed_by: String,
    /// Controllers to run (comma-separated): endpointslice, endpoints, mirroring.
    #[arg(
        long,
        env = "SLICEWAY_CONTROLLERS",
        value_delimiter = ',',
        default_value = "endpointslice,endpoints,mirroring"
    )]
    pub controllers: Vec<String>,
}

impl ReconcileArgs {
    /// The store's options from these flags; `garbage_collect` deletes managed objects
    /// no Service wants (local mode and `plan`).
    pub fn options(&self, garbage_collect: bool) -> crate::Result<store::Options> {
        let mut controllers = Controllers {
            endpointslice: false,
            endpoints: false,
            mirroring: false,
        };
        for c in &self.controllers {
            match c.trim() {
                "endpointslice" => controllers.endpointslice = true,
                "endpoints" => controllers.endpoints = true,
                "mirroring" => controllers.mirroring = true,
                other => {
                    return Err(crate::Error::Options(format!(
                        "unknown controller {other:?} (endpointslice, endpoints, mirroring)"
                    )))
                }
            }
        }
        let opts = store::Options {
            slices: reconciler::Options {
                max_endpoints_per_slice: self.max_endpoints_per_slice,
                controller_name: self.managed_by.clone(),
                ..Default::default()
            },
            mirroring: mirroring::Options {
                controller_name: self.mirroring_managed_by.clone(),
                ..Default::default()
            },
            controllers,
            garbage_collect,
            endpoints_max_capacity: None,
        };
        opts.slices.validate()?;
        Ok(opts)
    }
}

#[derive(Args)]
pub struct RunArgs {
    /// Local mode: read objects from the YAML files of this directory and write the
    /// managed objects back into it.
    #[arg(long)]
    pub manifests: Option<PathBuf>,
    #[command(flatten)]
    pub reconcile: ReconcileArgs,
    /// Pod changes reach their Services at most this long after the first of them
    /// (upstream's --endpoint-updates-batch-period; 0: at once). Changes of Services,
    /// slices, Endpoints and Nodes are never delayed.
    #[arg(long, default_value = "0s", value_parser = parse_duration)]
    pub batch_period: Duration,
    /// Address of the /metrics and /healthz endpoint (loopback unless asked).
    #[arg(long, env = "SLICEWAY_METRICS_ADDR", default_value = "127.0.0.1:9090")]
    pub metrics_addr: SocketAddr,
    /// Lease name for leader election (API mode).
    #[arg(long, default_value = "sliceway-controller")]
    pub lease_name: String,
    /// Lease namespace.
    #[arg(long, env = "POD_NAMESPACE", default_value = "kube-system")]
    pub lease_namespace: String,
    /// This replica's identity in the Lease (defaults to the host name).
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,
    /// Run without leader election (a single replica only).
    #[arg(long)]
    pub no_leader_election: bool,
    /// Field manager name of writes.
    #[arg(long, default_value = "sliceway-controller")]
    pub field_manager: String,
}

#[derive(Args)]
pub struct PlanArgs {
    /// The manifest directory.
    #[arg(long)]
    pub manifests: PathBuf,
    #[command(flatten)]
    pub reconcile: ReconcileArgs,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value_t = Format::Json)]
    pub output: Format,
}

/// A duration such as `250ms`, `2s`, `1m` or a bare number of seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let (num, unit) = s
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .map(|i| s.split_at(i))
        .unwrap_or((s, "s"));
    let v: f64 = num.parse().map_err(|_| format!("bad duration {s:?}"))?;
    let secs = match unit {
        "ms" => v / 1000.0,
        "s" => v,
        "m" => v * 60.0,
        _ => return Err(format!("bad duration unit in {s:?} (ms, s, m)")),
    };
    Ok(Duration::from_secs_f64(secs))
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory as _;

    use super::Cli;

    /// Issue 47: the generated man page and shell completions name every subcommand.
    #[test]
    fn man_page_and_completions_name_the_subcommands() {
        let cmd = Cli::command();
        let names = conventions::clidoc::subcommand_names(&cmd);
        for name in ["run", "plan", "completions", "man"] {
            assert!(names.iter().any(|n| n == name), "{name} in {names:?}");
        }
        conventions::clidoc::check_names_subcommands(&cmd).unwrap();
    }
}
