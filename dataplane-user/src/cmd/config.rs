//! `run --config FILE`: kube-proxy's configuration file, a KubeProxyConfiguration
//! (`kubeproxy.config.k8s.io/v1alpha1`, YAML or JSON), read as kube-proxy v1.37.2
//! reads it, in three stages:
//!
//! 1. [`decode`]: the document, strictly ([`KubeProxyConfiguration`] has every field
//!    of kube-proxy's type; an unknown or repeated field, a wrong `apiVersion` or
//!    `kind` or a value of the wrong type is an error naming the field).
//! 2. [`translate`]: kube-proxy's defaults and checks applied, and each field mapped
//!    onto the agent's setting of the same meaning ([`FromFile`]); a field sliceway
//!    does not honour gets one [`Warning`] (field path and why) when it is set to
//!    something that would change what kube-proxy does.
//! 3. [`apply`]: the file's settings go where the command line gave nothing; a
//!    flag given (or its environment variable) wins over the file.
//!
//! Upstream, all at v1.37.2: the type in
//! <https://github.com/kubernetes/kube-proxy/blob/v0.37.2/config/v1alpha1/types.go>
//! (staged from `staging/src/k8s.io/kube-proxy`), its defaults in
//! <https://github.com/kubernetes/kubernetes/blob/v1.37.2/pkg/proxy/apis/config/v1alpha1/defaults.go>,
//! its checks in
//! <https://github.com/kubernetes/kubernetes/blob/v1.37.2/pkg/proxy/apis/config/validation/validation.go>,
//! the loading in
//! <https://github.com/kubernetes/kubernetes/blob/v1.37.2/cmd/kube-proxy/app/options.go>
//! (`loadConfig`, `Complete`) and the mode's defaults in `server_linux.go`
//! (`platformApplyDefaults`) beside it; conntrack's sizing in
//! <https://github.com/kubernetes/kubernetes/blob/v1.37.2/pkg/proxy/conntrack/sysctls.go>.
//! Where sliceway reads the file differently from kube-proxy (flags win; unknown
//! fields are not decoded leniently; the file is read once) is in
//! `docs/configuration.md`.

use std::{
    collections::BTreeMap,
    fmt,
    net::IpAddr,
    path::{Path, PathBuf},
};

use clap::parser::{ArgMatches, ValueSource};
use conventions::logging::{Format, LogArgs};
use serde::Deserialize;

use crate::{
    cmd::cli::{ClusterCidrs, LocalMode, RunArgs},
    compiler::{prefix, NodePortAddresses},
    kernel::{interfaces::Selection, netfilter, Capacities},
    serve::bind::{self, BindAddress},
};

/// The only `apiVersion` kube-proxy v1.37.2 reads.
pub const API_VERSION: &str = "kubeproxy.config.k8s.io/v1alpha1";
/// The only `kind`.
pub const KIND: &str = "KubeProxyConfiguration";

/// `--config FILE` could not be used: the agent does not start.
#[derive(Debug, thiserror::Error)]
#[error("--config {}: {problem}", path.display())]
pub struct Error {
    pub path: PathBuf,
    pub problem: Problem,
}

/// What is wrong with a configuration file.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum Problem {
    #[error("{0}")]
    Read(String),
    /// Not a YAML or JSON document, or more than one.
    #[error("{0}")]
    Document(String),
    /// A field (its path, as `conntrack.maxPerCore`) that is unknown, repeated, of
    /// the wrong type, or holds a value kube-proxy refuses.
    #[error("{field}: {reason}")]
    Field { field: String, reason: String },
}

fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Problem {
    Problem::Field {
        field: field.into(),
        reason: reason.into(),
    }
}

/// A field sliceway reads but does not honour: the agent logs one warning line for
/// each and goes on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Warning {
    /// Its path, as `conntrack.tcpBeLiberal`.
    pub field: String,
    pub reason: String,
}

impl fmt::Display for Warning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: not honoured: {}", self.field, self.reason)
    }
}

// ---------------------------------------------------------------------------------
// Stage 1: the document.

/// kube-proxy's `v1alpha1.KubeProxyConfiguration`, field for field. Every field is
/// optional: `null` and absent are alike, as for Go's zero values (and the pointers
/// kube-proxy defaults when nil).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct KubeProxyConfiguration {
    pub api_version: Option<String>,
    pub kind: Option<String>,
    pub feature_gates: Option<BTreeMap<String, bool>>,
    pub client_connection: Option<ClientConnection>,
    pub logging: Option<Logging>,
    pub hostname_override: Option<String>,
    pub bind_address: Option<String>,
    pub healthz_bind_address: Option<String>,
    pub metrics_bind_address: Option<String>,
    pub bind_address_hard_fail: Option<bool>,
    pub enable_profiling: Option<bool>,
    pub show_hidden_metrics_for_version: Option<String>,
    pub mode: Option<String>,
    pub iptables: Option<IpTables>,
    pub ipvs: Option<Ipvs>,
    pub nftables: Option<NfTables>,
    pub winkernel: Option<Winkernel>,
    pub detect_local_mode: Option<String>,
    pub detect_local: Option<DetectLocal>,
    #[serde(rename = "clusterCIDR")]
    pub cluster_cidr: Option<String>,
    pub node_port_addresses: Option<Vec<String>>,
    pub oom_score_adj: Option<i32>,
    pub conntrack: Option<Conntrack>,
    pub config_sync_period: Option<GoDuration>,
    pub port_range: Option<String>,
    pub windows_run_as_service: Option<bool>,
}

/// component-base's `ClientConnectionConfiguration`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ClientConnection {
    pub kubeconfig: Option<String>,
    pub accept_content_types: Option<String>,
    pub content_type: Option<String>,
    pub qps: Option<f32>,
    pub burst: Option<i32>,
}

/// component-base's `LoggingConfiguration`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Logging {
    pub format: Option<String>,
    /// Nanoseconds as a number, or a duration string (`TimeOrMetaDuration`).
    pub flush_frequency: Option<TimeOrDuration>,
    pub verbosity: Option<u32>,
    pub vmodule: Option<Vec<VModuleItem>>,
    pub options: Option<FormatOptions>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct VModuleItem {
    pub file_pattern: Option<String>,
    pub verbosity: Option<u32>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct FormatOptions {
    pub text: Option<OutputRouting>,
    pub json: Option<OutputRouting>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct OutputRouting {
    pub split_stream: Option<bool>,
    pub info_buffer_size: Option<Quantity>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct IpTables {
    pub masquerade_bit: Option<i32>,
    pub masquerade_all: Option<bool>,
    pub localhost_node_ports: Option<bool>,
    pub sync_period: Option<GoDuration>,
    pub min_sync_period: Option<GoDuration>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Ipvs {
    pub sync_period: Option<GoDuration>,
    pub min_sync_period: Option<GoDuration>,
    pub scheduler: Option<String>,
    #[serde(rename = "excludeCIDRs")]
    pub exclude_cidrs: Option<Vec<String>>,
    #[serde(rename = "strictARP")]
    pub strict_arp: Option<bool>,
    pub tcp_timeout: Option<GoDuration>,
    pub tcp_fin_timeout: Option<GoDuration>,
    pub udp_timeout: Option<GoDuration>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct NfTables {
    pub masquerade_bit: Option<i32>,
    pub masquerade_all: Option<bool>,
    pub sync_period: Option<GoDuration>,
    pub min_sync_period: Option<GoDuration>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Winkernel {
    pub network_name: Option<String>,
    pub source_vip: Option<String>,
    #[serde(rename = "enableDSR")]
    pub enable_dsr: Option<bool>,
    pub root_hns_endpoint_name: Option<String>,
    pub forward_health_check_vip: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct DetectLocal {
    pub bridge_interface: Option<String>,
    pub interface_name_prefix: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Conntrack {
    pub max_per_core: Option<i32>,
    pub min: Option<i32>,
    pub tcp_established_timeout: Option<GoDuration>,
    pub tcp_close_wait_timeout: Option<GoDuration>,
    pub tcp_be_liberal: Option<bool>,
    pub udp_timeout: Option<GoDuration>,
    pub udp_stream_timeout: Option<GoDuration>,
}

/// A `metav1.Duration`: Go's `time.ParseDuration` text (`"1h0m0s"`, `"300ms"`,
/// `"0s"`), in nanoseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GoDuration(pub i128);

impl<'de> Deserialize<'de> for GoDuration {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        parse_go_duration(&s)
            .map(GoDuration)
            .map_err(serde::de::Error::custom)
    }
}

/// `logging.flushFrequency`: nanoseconds, or a duration string.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum TimeOrDuration {
    Nanos(i64),
    Text(GoDuration),
}

/// A `resource.Quantity` (`logging.options.*.infoBufferSize`): a number or a string.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Quantity {
    Number(f64),
    Text(String),
}

impl Quantity {
    /// Whether this is zero (`"0"`, `0`, `"0Mi"`): kube-proxy's default.
    fn is_zero(&self) -> bool {
        match self {
            Quantity::Number(n) => *n == 0.0,
            Quantity::Text(s) => {
                let s = s.trim();
                let digits = s
                    .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
                    .unwrap_or(s.len());
                s[..digits].parse::<f64>().is_ok_and(|n| n == 0.0)
            }
        }
    }
}

/// Go's `time.ParseDuration`: an optional sign, then one or more decimal numbers
/// each with a unit (`ns`, `us`, `µs`, `μs`, `ms`, `s`, `m`, `h`), as `1h2m0.5s`; or
/// `0` alone. In nanoseconds.
pub fn parse_go_duration(text: &str) -> Result<i128, String> {
    let bad = || format!("time: invalid duration {text:?}");
    let (negative, mut s) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    if s == "0" {
        return Ok(0);
    }
    if s.is_empty() {
        return Err(bad());
    }
    let digits_end = |s: &str| s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let mut total: i128 = 0;
    while !s.is_empty() {
        let int_end = digits_end(s);
        let (int, mut rest) = s.split_at(int_end);
        let mut frac = "";
        if let Some(r) = rest.strip_prefix('.') {
            let end = digits_end(r);
            frac = &r[..end];
            rest = &r[end..];
        }
        if int.is_empty() && frac.is_empty() {
            return Err(bad());
        }
        let unit_end = rest
            .find(|c: char| c == '.' || c.is_ascii_digit())
            .unwrap_or(rest.len());
        let (unit, next) = rest.split_at(unit_end);
        let scale: i128 = match unit {
            "ns" => 1,
            "us" | "\u{b5}s" | "\u{3bc}s" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            "" => return Err(format!("time: missing unit in duration {text:?}")),
            _ => return Err(format!("time: unknown unit {unit:?} in duration {text:?}")),
        };
        // More digits than an i64 of nanoseconds holds is an overflow anyway.
        if int.len() > 20 {
            return Err(bad());
        }
        let mut value = if int.is_empty() {
            0
        } else {
            int.parse::<i128>().map_err(|_| bad())? * scale
        };
        // Digits past the nanosecond add nothing.
        let frac = &frac[..frac.len().min(18)];
        if !frac.is_empty() {
            let f = frac.parse::<i128>().map_err(|_| bad())?;
            value += f * scale / 10i128.pow(frac.len() as u32);
        }
        total += value;
        if total > i64::MAX as i128 {
            return Err(bad());
        }
        s = next;
    }
    Ok(if negative { -total } else { total })
}

/// Decodes one KubeProxyConfiguration document (YAML, or JSON, which is YAML):
/// strictly, with the path of the field an error is about. `apiVersion` and `kind`
/// are checked first, as kube-proxy's decoder picks the type by them.
pub fn decode(text: &str) -> Result<KubeProxyConfiguration, Problem> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct TypeMeta {
        api_version: Option<serde_yaml_ng::Value>,
        kind: Option<serde_yaml_ng::Value>,
    }
    let meta: TypeMeta =
        serde_yaml_ng::from_str(text).map_err(|e| Problem::Document(e.to_string()))?;
    let string = |v: &Option<serde_yaml_ng::Value>| match v {
        Some(serde_yaml_ng::Value::String(s)) => Some(s.clone()),
        _ => None,
    };
    match string(&meta.kind).as_deref() {
        Some(KIND) => {}
        None => return Err(invalid("kind", format!("missing: must be {KIND}"))),
        Some(other) => {
            return Err(invalid(
                "kind",
                format!("{other:?}: must be {KIND} (of {API_VERSION})"),
            ))
        }
    }
    match string(&meta.api_version).as_deref() {
        Some(API_VERSION) => {}
        None => {
            return Err(invalid(
                "apiVersion",
                format!("missing: must be {API_VERSION}"),
            ))
        }
        Some(other) => {
            return Err(invalid(
                "apiVersion",
                format!("{other:?}: must be {API_VERSION}, the version kube-proxy v1.37.2 reads"),
            ))
        }
    }
    let de = serde_yaml_ng::Deserializer::from_str(text);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let field = e.path().to_string();
        let reason = e.into_inner().to_string();
        if field == "." {
            return Problem::Document(reason);
        }
        // serde_yaml_ng starts its message with the path it knows (the field's, or a
        // section's): said once is enough.
        let mut prefix = field.as_str();
        let reason = loop {
            if let Some(rest) = reason
                .strip_prefix(prefix)
                .and_then(|r| r.strip_prefix(": "))
            {
                break rest.to_string();
            }
            match prefix.rsplit_once('.') {
                Some((parent, _)) => prefix = parent,
                None => break reason,
            }
        };
        invalid(field, reason)
    })
}

// ---------------------------------------------------------------------------------
// Stage 2: kube-proxy's meaning, in the agent's settings.

/// What a configuration file sets, in the agent's terms; `None` where it leaves the
/// agent's default.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FromFile {
    /// `clientConnection.kubeconfig`.
    pub kubeconfig: Option<PathBuf>,
    /// `hostnameOverride`, trimmed and lowercased.
    pub node: Option<String>,
    /// `healthzBindAddress` (an IP alone takes port 10256), or `[::]:10256` when
    /// `bindAddress` is IPv6.
    pub healthz_bind_address: Option<BindAddress>,
    /// `metricsBindAddress` (an IP alone takes port 10249), or `[::1]:10249` when
    /// `bindAddress` is IPv6.
    pub metrics_bind_address: Option<BindAddress>,
    /// `nodePortAddresses`; unset, the mode's default (`all`, or `primary` for
    /// nftables).
    pub nodeport_addresses: Option<NodePortAddresses>,
    /// `detectLocalMode: InterfaceNamePrefix`: `PREFIX*`.
    pub interfaces: Option<Vec<String>>,
    /// The mode's `masqueradeAll` (`iptables`' also for ipvs).
    pub masquerade_all: Option<bool>,
    /// `clusterCIDR`, when set.
    pub cluster_cidr: Option<ClusterCidrs>,
    /// `detectLocalMode`, blank as ClusterCIDR.
    pub detect_local_mode: Option<LocalMode>,
    /// `detectLocal.bridgeInterface` (BridgeInterface mode).
    pub pod_bridge_interface: Option<String>,
    /// `detectLocal.interfaceNamePrefix` (InterfaceNamePrefix mode).
    pub pod_interface_name_prefix: Option<String>,
    /// `conntrack.maxPerCore` and `min`, two entries per connection.
    pub max_conntrack: Option<u32>,
    /// `conntrack.*Timeout`, as `--conntrack-timeout` entries.
    pub conntrack_timeouts: Vec<String>,
    /// `conntrack.*` for netfilter's own table, as kube-proxy sets it
    /// (`--conntrack-max-per-core`, ...).
    pub netfilter: NetfilterFromFile,
    /// `logging.format`.
    pub logging_format: Option<Format>,
    /// `logging.verbosity`, when above 0.
    pub verbosity: Option<u8>,
}

/// The `conntrack` fields a file gives, for netfilter's table (the `--conntrack-*`
/// flags of kube-proxy's names); durations in whole seconds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NetfilterFromFile {
    pub max_per_core: Option<u32>,
    pub min: Option<u32>,
    pub tcp_established: Option<u64>,
    pub tcp_close_wait: Option<u64>,
    pub tcp_be_liberal: Option<bool>,
    pub udp: Option<u64>,
    pub udp_stream: Option<u64>,
}

/// kube-proxy's `mode`, defaulted as on Linux (`""` is iptables).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    IpTables,
    Ipvs,
    NfTables,
}

/// Checks `file` as kube-proxy's validation does and maps it onto the agent's
/// settings. `cpus` is the node's online CPU count ([`online_cpus`]), for
/// `conntrack.maxPerCore`.
pub fn translate(
    file: &KubeProxyConfiguration,
    cpus: usize,
) -> Result<(FromFile, Vec<Warning>), Problem> {
    let mut out = FromFile::default();
    let mut w = Warnings(Vec::new());
    for gate in file.feature_gates.iter().flat_map(|g| g.keys()) {
        w.warn(
            &format!("featureGates.{gate}"),
            "sliceway has no kube-proxy feature gates",
        );
    }
    client_connection(file, &mut out, &mut w)?;
    logging(file, &mut out, &mut w)?;
    node_and_servers(file, &mut out, &mut w)?;
    let mode = mode(file, &mut out, &mut w)?;
    windows(file, &mut w)?;
    local_detection(file, &mut out, &mut w)?;
    node_ports(file, mode, &mut out, &mut w)?;
    conntrack_and_the_rest(file, cpus, &mut out, &mut w)?;
    Ok((out, w.0))
}

/// The warnings of a translation, one per field.
struct Warnings(Vec<Warning>);

impl Warnings {
    fn warn(&mut self, field: &str, reason: &str) {
        self.0.push(Warning {
            field: field.to_string(),
            reason: reason.to_string(),
        })
    }
}

/// `clientConnection`: the kubeconfig; the rest of no meaning here.
fn client_connection(
    file: &KubeProxyConfiguration,
    out: &mut FromFile,
    w: &mut Warnings,
) -> Result<(), Problem> {
    let cc = file.client_connection.as_ref();
    if let Some(path) = cc.and_then(|c| c.kubeconfig.as_deref()) {
        if !path.is_empty() {
            out.kubeconfig = Some(PathBuf::from(path));
        }
    }
    for (field, value) in [
        (
            "acceptContentTypes",
            cc.and_then(|c| c.accept_content_types.as_deref()),
        ),
        ("contentType", cc.and_then(|c| c.content_type.as_deref())),
    ] {
        if value.is_some_and(|v| !v.is_empty()) {
            w.warn(
                &format!("clientConnection.{field}"),
                "the agent's API client asks for and sends JSON",
            );
        }
    }
    if cc.and_then(|c| c.burst).is_some_and(|b| b < 0) {
        return Err(invalid(
            "clientConnection.burst",
            "must be greater than or equal to 0",
        ));
    }
    const NO_RATE_LIMIT: &str = "the agent's API client does not limit its request rate";
    if cc.and_then(|c| c.qps).is_some_and(|q| q != 0.0) {
        w.warn("clientConnection.qps", NO_RATE_LIMIT);
    }
    if cc.and_then(|c| c.burst).is_some_and(|b| b != 0) {
        w.warn("clientConnection.burst", NO_RATE_LIMIT);
    }
    Ok(())
}

/// `logging`: format and verbosity.
fn logging(
    file: &KubeProxyConfiguration,
    out: &mut FromFile,
    w: &mut Warnings,
) -> Result<(), Problem> {
    let logging = file.logging.as_ref();
    match logging.and_then(|l| l.format.as_deref()) {
        None | Some("") => {}
        Some("text") => out.logging_format = Some(Format::Text),
        Some("json") => out.logging_format = Some(Format::Json),
        Some(other) => {
            return Err(invalid(
                "logging.format",
                format!("{other:?}: unsupported log format (text or json)"),
            ))
        }
    }
    if let Some(v) = logging.and_then(|l| l.verbosity) {
        if v > 0 {
            out.verbosity = Some(v.min(u8::MAX as u32) as u8);
        }
    }
    if let Some(TimeOrDuration::Text(GoDuration(ns))) =
        logging.and_then(|l| l.flush_frequency.as_ref())
    {
        if *ns < 0 {
            return Err(invalid(
                "logging.flushFrequency",
                "must be greater than or equal to 0",
            ));
        }
    }
    if logging
        .and_then(|l| l.vmodule.as_ref())
        .is_some_and(|v| !v.is_empty())
    {
        w.warn(
            "logging.vmodule",
            "one verbosity applies to every module (RUST_LOG's directives, without -v, \
             set levels per module)",
        );
    }
    let options = logging.and_then(|l| l.options.as_ref());
    for (name, routing) in [
        ("text", options.and_then(|o| o.text.as_ref())),
        ("json", options.and_then(|o| o.json.as_ref())),
    ] {
        let Some(routing) = routing else { continue };
        if routing.split_stream == Some(true) {
            w.warn(
                &format!("logging.options.{name}.splitStream"),
                "every log line goes to standard error",
            );
        }
        if routing
            .info_buffer_size
            .as_ref()
            .is_some_and(|q| !q.is_zero())
        {
            w.warn(
                &format!("logging.options.{name}.infoBufferSize"),
                "log lines are written unbuffered",
            );
        }
    }
    Ok(())
}

/// `hostnameOverride`, `bindAddress` and the servers' addresses.
fn node_and_servers(
    file: &KubeProxyConfiguration,
    out: &mut FromFile,
    w: &mut Warnings,
) -> Result<(), Problem> {
    // hostnameOverride: nodeutil.GetHostname's trimming and lowercasing. Empty, the
    // agent has no node name: it does not fall back to the hostname.
    if let Some(name) = file.hostname_override.as_deref() {
        let name = name.trim();
        if !name.is_empty() {
            out.node = Some(name.to_lowercase());
        }
    }

    // bindAddress: what it still means to kube-proxy is the node's primary address
    // (sliceway reads its Node object's) and the family of the servers' defaults.
    let bind_address = match file.bind_address.as_deref().map(str::trim) {
        None | Some("") => None,
        Some(s) => Some(
            s.parse::<IpAddr>()
                .map_err(|_| invalid("bindAddress", format!("{s:?}: not a valid IP address")))?,
        ),
    };
    if bind_address.is_some_and(|ip| !ip.is_unspecified()) {
        w.warn(
            "bindAddress",
            "the node's primary address is its Node object's (InternalIP, else ExternalIP)",
        );
    }
    let ipv6 = bind_address.is_some_and(|ip| ip.is_ipv6());
    out.healthz_bind_address = server_address(
        "healthzBindAddress",
        file.healthz_bind_address.as_deref(),
        bind::HEALTHZ_PORT,
        ipv6.then_some("[::]"),
    )?;
    out.metrics_bind_address = server_address(
        "metricsBindAddress",
        file.metrics_bind_address.as_deref(),
        bind::METRICS_PORT,
        ipv6.then_some("[::1]"),
    )?;
    if file.bind_address_hard_fail == Some(true) {
        w.warn(
            "bindAddressHardFail",
            "a port in use is tried again every 5 s; the agent does not exit",
        );
    }
    if file.enable_profiling == Some(true) {
        w.warn("enableProfiling", "sliceway serves no /debug/pprof");
    }
    if file
        .show_hidden_metrics_for_version
        .as_deref()
        .is_some_and(|v| !v.is_empty())
    {
        w.warn(
            "showHiddenMetricsForVersion",
            "sliceway's metrics are its own; none is hidden",
        );
    }
    Ok(())
}

/// `mode` (defaulted as on Linux) and the settings of its section.
fn mode(
    file: &KubeProxyConfiguration,
    out: &mut FromFile,
    w: &mut Warnings,
) -> Result<Mode, Problem> {
    let mode = match file.mode.as_deref() {
        None | Some("") => Mode::IpTables,
        Some(m @ ("iptables" | "ipvs" | "nftables")) => {
            w.warn(
                "mode",
                &format!(
                    "{m:?}: sliceway is a proxy mode of its own (BPF programs and maps) \
                     in place of every kube-proxy mode"
                ),
            );
            match m {
                "ipvs" => Mode::Ipvs,
                "nftables" => Mode::NfTables,
                _ => Mode::IpTables,
            }
        }
        Some(other) => {
            return Err(invalid(
                "mode",
                format!(
                    "{other:?}: must be iptables, ipvs, nftables or blank (kube-proxy's \
                     modes on Linux)"
                ),
            ))
        }
    };
    let iptables = file.iptables.as_ref();
    let nftables = file.nftables.as_ref();
    let ipvs = file.ipvs.as_ref();
    for (field, bit, checked) in [
        (
            "iptables.masqueradeBit",
            iptables.and_then(|t| t.masquerade_bit),
            true,
        ),
        (
            "nftables.masqueradeBit",
            nftables.and_then(|t| t.masquerade_bit),
            mode == Mode::NfTables,
        ),
    ] {
        // No netfilter marks are used: any bit is as good as another.
        if checked && bit.is_some_and(|b| !(0..=31).contains(&b)) {
            return Err(invalid(field, "must be within the range [0, 31]"));
        }
    }
    let (section, masquerade_all, sync, min_sync) = match mode {
        Mode::IpTables => (
            "iptables",
            iptables.and_then(|t| t.masquerade_all),
            iptables.and_then(|t| t.sync_period),
            iptables.and_then(|t| t.min_sync_period),
        ),
        Mode::NfTables => (
            "nftables",
            nftables.and_then(|t| t.masquerade_all),
            nftables.and_then(|t| t.sync_period),
            nftables.and_then(|t| t.min_sync_period),
        ),
        Mode::Ipvs => (
            "ipvs",
            iptables.and_then(|t| t.masquerade_all),
            ipvs.and_then(|t| t.sync_period),
            ipvs.and_then(|t| t.min_sync_period),
        ),
    };
    // `--masquerade-all`: the section of the mode in use.
    out.masquerade_all = masquerade_all.filter(|all| *all);
    let sync_ns = sync.map_or(0, |d| d.0);
    let min_sync_ns = min_sync.map_or(0, |d| d.0);
    if sync_ns < 0 {
        return Err(invalid(
            format!("{section}.syncPeriod"),
            "must be greater than 0",
        ));
    }
    if min_sync_ns < 0 {
        return Err(invalid(
            format!("{section}.minSyncPeriod"),
            "must be greater than or equal to 0",
        ));
    }
    // Both defaulted as kube-proxy does (30 s and 1 s; IPVS's minimum 0) before
    // comparing.
    let defaulted_sync = if sync_ns == 0 {
        30_000_000_000
    } else {
        sync_ns
    };
    let defaulted_min = match (min_sync_ns, mode) {
        (0, Mode::Ipvs) => 0,
        (0, _) => 1_000_000_000,
        (n, _) => n,
    };
    if defaulted_min > defaulted_sync {
        return Err(invalid(
            format!("{section}.syncPeriod"),
            format!("must be greater than or equal to {section}.minSyncPeriod"),
        ));
    }
    if sync_ns > 0 {
        w.warn(
            &format!("{section}.syncPeriod"),
            "sliceway writes each change as it comes and compares the maps with what it \
             wrote every --audit-interval-seconds",
        );
    }
    if min_sync_ns > 0 {
        w.warn(
            &format!("{section}.minSyncPeriod"),
            "sliceway collects a burst of changes for --batch-delay-ms into one sync",
        );
    }
    if mode == Mode::Ipvs {
        let ipvs = ipvs.cloned().unwrap_or_default();
        for (field, d) in [
            ("tcpTimeout", ipvs.tcp_timeout),
            ("tcpFinTimeout", ipvs.tcp_fin_timeout),
            ("udpTimeout", ipvs.udp_timeout),
        ] {
            match d.map_or(0, |d| d.0) {
                n if n < 0 => {
                    return Err(invalid(
                        format!("ipvs.{field}"),
                        "must be greater than or equal to 0",
                    ))
                }
                0 => {}
                _ => w.warn(
                    &format!("ipvs.{field}"),
                    "an IPVS setting; sliceway's timeouts are conntrack's (conntrack.*)",
                ),
            }
        }
        for (i, cidr) in ipvs.exclude_cidrs.iter().flatten().enumerate() {
            parse_cidr(cidr).map_err(|_| {
                invalid(
                    format!("ipvs.excludeCIDRs[{i}]"),
                    format!("{cidr:?}: must be a valid CIDR"),
                )
            })?;
        }
        if !ipvs.exclude_cidrs.unwrap_or_default().is_empty() {
            w.warn(
                "ipvs.excludeCIDRs",
                "an IPVS setting; sliceway does not use IPVS",
            );
        }
        if ipvs.scheduler.is_some_and(|s| !s.is_empty()) {
            w.warn(
                "ipvs.scheduler",
                "sliceway picks backends by flow hash, or Maglev from outside the node",
            );
        }
        if ipvs.strict_arp == Some(true) {
            w.warn(
                "ipvs.strictARP",
                "sliceway has no kube-ipvs0 interface to answer ARP for",
            );
        }
    }
    Ok(mode)
}

/// `winkernel` and the other Windows fields.
fn windows(file: &KubeProxyConfiguration, w: &mut Warnings) -> Result<(), Problem> {
    let wk = file.winkernel.as_ref();
    let windows = [
        (
            "winkernel.networkName",
            wk.and_then(|w| w.network_name.as_deref())
                .is_some_and(|s| !s.is_empty()),
        ),
        (
            "winkernel.sourceVip",
            wk.and_then(|w| w.source_vip.as_deref())
                .is_some_and(|s| !s.is_empty()),
        ),
        (
            "winkernel.enableDSR",
            wk.and_then(|w| w.enable_dsr) == Some(true),
        ),
        (
            "winkernel.rootHnsEndpointName",
            wk.and_then(|w| w.root_hns_endpoint_name.as_deref())
                .is_some_and(|s| !s.is_empty()),
        ),
        (
            "winkernel.forwardHealthCheckVip",
            wk.and_then(|w| w.forward_health_check_vip) == Some(true),
        ),
        (
            "windowsRunAsService",
            file.windows_run_as_service == Some(true),
        ),
    ];
    for (field, set) in windows {
        if set {
            w.warn(field, "a Windows setting; sliceway runs on Linux");
        }
    }
    Ok(())
}

/// `detectLocalMode`, `detectLocal` and `clusterCIDR`: the flags
/// `--detect-local-mode`, `--pod-bridge-interface`, `--pod-interface-name-prefix`
/// and `--cluster-cidr`, checked as kube-proxy checks them.
fn local_detection(
    file: &KubeProxyConfiguration,
    out: &mut FromFile,
    w: &mut Warnings,
) -> Result<(), Problem> {
    let local_mode = file.detect_local_mode.as_deref().unwrap_or("");
    let detect = file.detect_local.as_ref();
    let cluster_cidrs = file
        .cluster_cidr
        .as_deref()
        .map(|text| parse_cluster_cidrs(text).map_err(|e| invalid("clusterCIDR", e)))
        .transpose()?;
    let mode = match local_mode {
        "" | "ClusterCIDR" => LocalMode::ClusterCidr,
        "NodeCIDR" => LocalMode::NodeCidr,
        "BridgeInterface" => {
            let bridge = detect
                .and_then(|d| d.bridge_interface.as_deref())
                .unwrap_or("");
            if bridge.is_empty() {
                return Err(invalid("detectLocal.bridgeInterface", "must not be empty"));
            }
            w.warn(
                "detectLocalMode",
                "\"BridgeInterface\": sliceway attaches to the pods' own interfaces \
                 (--interfaces, such as the bridge's veth ports), not to a bridge",
            );
            out.pod_bridge_interface = Some(bridge.to_string());
            LocalMode::BridgeInterface
        }
        "InterfaceNamePrefix" => {
            let prefix = detect
                .and_then(|d| d.interface_name_prefix.as_deref())
                .unwrap_or("");
            if prefix.is_empty() {
                return Err(invalid(
                    "detectLocal.interfaceNamePrefix",
                    "must not be empty",
                ));
            }
            let pattern = format!("{prefix}*");
            Selection::parse(&[&pattern]).map_err(|e| {
                invalid(
                    "detectLocal.interfaceNamePrefix",
                    format!("{prefix:?}: {e}"),
                )
            })?;
            out.interfaces = Some(vec![pattern]);
            out.pod_interface_name_prefix = Some(prefix.to_string());
            LocalMode::InterfaceNamePrefix
        }
        other => {
            return Err(invalid(
                "detectLocalMode",
                format!(
                    "{other:?}: must be ClusterCIDR, NodeCIDR, BridgeInterface, \
                     InterfaceNamePrefix or blank"
                ),
            ))
        }
    };
    if !local_mode.is_empty() {
        out.detect_local_mode = Some(mode);
    }
    out.cluster_cidr = cluster_cidrs.filter(|c| !c.is_empty()).map(ClusterCidrs);
    Ok(())
}

/// `nodePortAddresses`, with `mode`'s default; loopback in iptables mode.
fn node_ports(
    file: &KubeProxyConfiguration,
    mode: Mode,
    out: &mut FromFile,
    w: &mut Warnings,
) -> Result<(), Problem> {
    // nodePortAddresses: kube-proxy's list, its keywords included; unset, the
    // mode's default (`primary` for nftables, every local address otherwise).
    let iptables = file.iptables.as_ref();
    let node_ports = file.node_port_addresses.clone().unwrap_or_default();
    for (i, entry) in node_ports.iter().enumerate() {
        if !matches!(entry.as_str(), "primary" | "all" | "localhost") && parse_cidr(entry).is_err()
        {
            return Err(invalid(
                format!("nodePortAddresses[{i}]"),
                format!("{entry:?}: must be a valid CIDR or one of the keywords 'primary', 'localhost', 'all'"),
            ));
        }
    }
    let joined = if node_ports.is_empty() {
        match mode {
            Mode::NfTables => "primary".to_string(),
            _ => "all".to_string(),
        }
    } else {
        node_ports.join(",")
    };
    out.nodeport_addresses =
        Some(NodePortAddresses::parse(&joined).map_err(|e| invalid("nodePortAddresses", e))?);
    let localhost_node_ports = iptables.and_then(|t| t.localhost_node_ports) != Some(false);
    let loopback_listed = node_ports.is_empty()
        || node_ports.iter().any(|e| {
            e == "all"
                || e == "localhost"
                || parse_cidr(e).is_ok_and(|(ip, len)| {
                    covers(ip, len, IpAddr::V4(std::net::Ipv4Addr::LOCALHOST))
                })
        });
    if mode == Mode::IpTables && localhost_node_ports && loopback_listed {
        w.warn(
            "iptables.localhostNodePorts",
            "loopback addresses never serve NodePorts here (kube-proxy's iptables mode \
             serves them on 127.0.0.1 by default)",
        );
    }
    Ok(())
}

/// `oomScoreAdj`, `conntrack`, `configSyncPeriod` and `portRange`.
fn conntrack_and_the_rest(
    file: &KubeProxyConfiguration,
    cpus: usize,
    out: &mut FromFile,
    w: &mut Warnings,
) -> Result<(), Problem> {
    if let Some(adj) = file.oom_score_adj {
        if !(-1000..=1000).contains(&adj) {
            return Err(invalid(
                "oomScoreAdj",
                "must be within the range [-1000, 1000]",
            ));
        }
        w.warn(
            "oomScoreAdj",
            "sliceway keeps the oom_score_adj it was started with",
        );
    }

    // conntrack: kube-proxy sizes and times netfilter's table for the whole node. The
    // agent sets netfilter's as kube-proxy does, and sizes and times its own, which
    // holds the Services' connections, to match.
    let ct = file.conntrack.as_ref();
    let per_core = ct.and_then(|c| c.max_per_core);
    let min = ct.and_then(|c| c.min);
    if per_core.is_some_and(|n| n < 0) {
        return Err(invalid(
            "conntrack.maxPerCore",
            "must be greater than or equal to 0",
        ));
    }
    if min.is_some_and(|n| n < 0) {
        return Err(invalid(
            "conntrack.min",
            "must be greater than or equal to 0",
        ));
    }
    out.netfilter.max_per_core = per_core.map(|n| n as u32);
    out.netfilter.min = min.map(|n| n as u32);
    if per_core.is_some() || min.is_some() {
        // kube-proxy's defaults for the one not given.
        let defaults = netfilter::Conntrack::default();
        let connections = netfilter::conntrack_max(
            per_core.map_or(defaults.max_per_core.into(), |n| n as u64),
            min.map_or(defaults.min.into(), |n| n as u64),
            cpus as u64,
        );
        // Two entries per connection; and, as kube-proxy never lowers
        // nf_conntrack_max, never below the agent's own default.
        let entries = (connections * 2).min(u32::MAX as u64) as u32;
        if entries > Capacities::default().conntrack {
            out.max_conntrack = Some(entries);
        }
    }
    let nf = &mut out.netfilter;
    for (field, state, value, netfilter) in [
        (
            "conntrack.tcpEstablishedTimeout",
            "tcp_established",
            ct.and_then(|c| c.tcp_established_timeout),
            &mut nf.tcp_established,
        ),
        // sliceway has one state for a FIN seen in one direction, netfilter's
        // FIN_WAIT and CLOSE_WAIT both.
        (
            "conntrack.tcpCloseWaitTimeout",
            "tcp_fin_wait",
            ct.and_then(|c| c.tcp_close_wait_timeout),
            &mut nf.tcp_close_wait,
        ),
        (
            "conntrack.udpTimeout",
            "udp_unreplied",
            ct.and_then(|c| c.udp_timeout),
            &mut nf.udp,
        ),
        (
            "conntrack.udpStreamTimeout",
            "udp_replied",
            ct.and_then(|c| c.udp_stream_timeout),
            &mut nf.udp_stream,
        ),
    ] {
        let ns = value.map_or(0, |d| d.0);
        if ns < 0 {
            return Err(invalid(field, "must be greater than or equal to 0"));
        }
        // netfilter's: truncated to seconds, as kube-proxy's `setSysctls`.
        *netfilter = value.map(|d| (d.0 / 1_000_000_000).min(u64::MAX as i128) as u64);
        // 0: leave as it is, as kube-proxy does. Whole seconds, rounded up.
        if ns > 0 {
            let secs = (ns + 999_999_999) / 1_000_000_000;
            if secs > u32::MAX as i128 {
                return Err(invalid(field, format!("at most {} seconds", u32::MAX)));
            }
            out.conntrack_timeouts.push(format!("{state}={secs}"));
        }
    }
    // sliceway's own conntrack does not check TCP windows; netfilter's is set.
    out.netfilter.tcp_be_liberal = ct.and_then(|c| c.tcp_be_liberal);

    match file.config_sync_period.map_or(0, |d| d.0) {
        n if n < 0 => return Err(invalid("configSyncPeriod", "must be greater than 0")),
        0 => {}
        _ => w.warn(
            "configSyncPeriod",
            "the agent's watches do not resync; it compares the maps with what it wrote \
             every --audit-interval-seconds",
        ),
    }
    if file.port_range.as_deref().is_some_and(|p| !p.is_empty()) {
        w.warn("portRange", "unused, as by kube-proxy");
    }
    Ok(())
}

/// `healthzBindAddress` or `metricsBindAddress`: empty, the default (`ipv6_default`
/// with `port` when `bindAddress` is IPv6, else the agent's, which is kube-proxy's);
/// an IP alone gets `port` (`AppendPortIfNeeded`); IP:PORT as it is, port 0 refused.
fn server_address(
    field: &str,
    value: Option<&str>,
    port: u16,
    ipv6_default: Option<&str>,
) -> Result<Option<BindAddress>, Problem> {
    let value = value.map(str::trim).unwrap_or("");
    if value.is_empty() {
        return Ok(ipv6_default.map(|ip| {
            BindAddress::IpPort(format!("{ip}:{port}").parse().expect("an IPv6 address"))
        }));
    }
    // Not empty: `parse`'s default for an empty value does not apply.
    let parsed = BindAddress::parse(value, bind::DEFAULT_HEALTHZ).map_err(|e| invalid(field, e))?;
    Ok(Some(match parsed {
        BindAddress::Ip(ip) => BindAddress::IpPort(std::net::SocketAddr::new(ip, port)),
        with_port => with_port,
    }))
}

/// `clusterCIDR` (and `--cluster-cidr`): blank, one CIDR or a dual-stack pair,
/// comma-separated, as kube-proxy's validation takes it
/// (https://github.com/kubernetes/kubernetes/blob/v1.37.2/pkg/proxy/apis/config/validation/validation.go);
/// each as its network address (host bits cleared) and prefix length.
pub fn parse_cluster_cidrs(text: &str) -> Result<Vec<(IpAddr, u8)>, String> {
    if text.trim().is_empty() {
        return Ok(Vec::new());
    }
    let cidrs: Vec<&str> = text.split(',').collect();
    if cidrs.len() > 2 {
        return Err(
            "must be a either a single CIDR or dual-stack pair of CIDRs (e.g. \
                    10.100.0.0/16,fde4:8dba:82e1::/48)"
                .into(),
        );
    }
    let mut out = Vec::new();
    for cidr in cidrs {
        let (ip, len) = parse_cidr(cidr).map_err(|_| {
            format!(
                "{cidr:?}: must be a valid CIDR block (e.g. 10.100.0.0/16 or fde4:8dba:82e1::/48)"
            )
        })?;
        let net = match ip {
            IpAddr::V4(a) => IpAddr::V4((u32::from(a) & crate::compiler::prefix_mask(len)).into()),
            IpAddr::V6(a) => {
                IpAddr::V6((u128::from(a) & crate::compiler::prefix_mask6(len)).into())
            }
        };
        out.push((net, len));
    }
    if out.len() == 2 && out[0].0.is_ipv6() == out[1].0.is_ipv6() {
        return Err("a pair of CIDRs must be one of each family".into());
    }
    Ok(out)
}

/// `ADDRESS/LENGTH` of either family, spaces around it allowed.
fn parse_cidr(s: &str) -> Result<(IpAddr, u8), ()> {
    let syntax = prefix::Syntax {
        address: prefix::exact,
        canonical_length: false,
    };
    prefix::parse(s.trim(), syntax).map_err(|_| ())
}

/// Whether `ip/len` holds `addr`.
fn covers(ip: IpAddr, len: u8, addr: IpAddr) -> bool {
    match (ip, addr) {
        (IpAddr::V4(net), IpAddr::V4(a)) => {
            let mask = crate::compiler::prefix_mask(len);
            u32::from(net) & mask == u32::from(a) & mask
        }
        (IpAddr::V6(net), IpAddr::V6(a)) => {
            let mask = crate::compiler::prefix_mask6(len);
            u128::from(net) & mask == u128::from(a) & mask
        }
        _ => false,
    }
}

/// The node's online CPUs, as kube-proxy counts them for `maxPerCore`
/// (`/sys/devices/system/cpu/online`, not the process's CPU set); else the CPUs this
/// process may use.
pub fn online_cpus() -> usize {
    std::fs::read_to_string("/sys/devices/system/cpu/online")
        .ok()
        .and_then(|s| count_cpu_list(s.trim()))
        .filter(|n| *n > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// The CPUs of a kernel CPU list (`0-3,6,8-9`).
fn count_cpu_list(list: &str) -> Option<usize> {
    let mut n = 0;
    for part in list.split(',').filter(|p| !p.is_empty()) {
        n += match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (usize, usize) = (a.parse().ok()?, b.parse().ok()?);
                b.checked_sub(a)? + 1
            }
            None => {
                part.parse::<usize>().ok()?;
                1
            }
        };
    }
    Some(n)
}

// ---------------------------------------------------------------------------------
// Stage 3: under the command line.

/// Whether the flag `id` (clap's id: the field's name) was given on the command line
/// or through its environment variable, in `matches`.
pub fn given(matches: &ArgMatches, id: &str) -> bool {
    matches.try_contains_id(id).unwrap_or(false)
        && matches!(
            matches.value_source(id),
            Some(ValueSource::CommandLine | ValueSource::EnvVariable)
        )
}

/// Puts the file's settings where `given` (a flag's id: given on the command line?)
/// says no flag was. `--conntrack-timeout` entries add up: the file's first, then the
/// flags', so a flag's state wins.
pub fn apply(run: &mut RunArgs, log: &mut LogArgs, from: FromFile, given: impl Fn(&str) -> bool) {
    fn set<T>(slot: &mut T, value: Option<T>, given: bool) {
        if let (Some(v), false) = (value, given) {
            *slot = v;
        }
    }
    set(
        &mut run.kubeconfig,
        from.kubeconfig.map(Some),
        given("kubeconfig"),
    );
    set(&mut run.node, from.node.map(Some), given("node"));
    set(
        &mut run.healthz_bind_address,
        from.healthz_bind_address,
        given("healthz_bind_address"),
    );
    set(
        &mut run.metrics_bind_address,
        from.metrics_bind_address,
        given("metrics_bind_address"),
    );
    set(
        &mut run.nodeport_addresses,
        from.nodeport_addresses,
        given("nodeport_addresses"),
    );
    set(&mut run.interfaces, from.interfaces, given("interfaces"));
    set(
        &mut run.masquerade_all,
        from.masquerade_all,
        given("masquerade_all"),
    );
    set(
        &mut run.cluster_cidr,
        from.cluster_cidr.map(Some),
        given("cluster_cidr"),
    );
    set(
        &mut run.detect_local_mode,
        from.detect_local_mode,
        given("detect_local_mode"),
    );
    set(
        &mut run.pod_bridge_interface,
        from.pod_bridge_interface.map(Some),
        given("pod_bridge_interface"),
    );
    set(
        &mut run.pod_interface_name_prefix,
        from.pod_interface_name_prefix.map(Some),
        given("pod_interface_name_prefix"),
    );
    set(
        &mut run.max_conntrack,
        from.max_conntrack,
        given("max_conntrack"),
    );
    let nf = from.netfilter;
    set(
        &mut run.conntrack_max_per_core,
        nf.max_per_core,
        given("conntrack_max_per_core"),
    );
    set(&mut run.conntrack_min, nf.min, given("conntrack_min"));
    set(
        &mut run.conntrack_tcp_timeout_established,
        nf.tcp_established,
        given("conntrack_tcp_timeout_established"),
    );
    set(
        &mut run.conntrack_tcp_timeout_close_wait,
        nf.tcp_close_wait,
        given("conntrack_tcp_timeout_close_wait"),
    );
    set(
        &mut run.conntrack_tcp_be_liberal,
        nf.tcp_be_liberal,
        given("conntrack_tcp_be_liberal"),
    );
    set(
        &mut run.conntrack_udp_timeout,
        nf.udp,
        given("conntrack_udp_timeout"),
    );
    set(
        &mut run.conntrack_udp_timeout_stream,
        nf.udp_stream,
        given("conntrack_udp_timeout_stream"),
    );
    if !from.conntrack_timeouts.is_empty() {
        let flags = std::mem::take(&mut run.conntrack_timeout);
        run.conntrack_timeout = from.conntrack_timeouts;
        run.conntrack_timeout.extend(flags);
    }
    set(
        &mut log.logging_format,
        from.logging_format,
        given("logging_format"),
    );
    set(&mut log.v, from.verbosity.map(Some), given("v"));
}

/// Reads `path` and translates it ([`decode`], [`translate`]).
pub fn read(path: &Path) -> Result<(FromFile, Vec<Warning>), Error> {
    let error = |problem| Error {
        path: path.to_path_buf(),
        problem,
    };
    let text = std::fs::read_to_string(path).map_err(|e| error(Problem::Read(e.to_string())))?;
    let file = decode(&text).map_err(error)?;
    translate(&file, online_cpus()).map_err(error)
}

/// `run --config FILE`: reads the file and applies it under the command line
/// ([`apply`]); the warnings to log. Nothing to do without `--config`.
pub fn load(
    run: &mut RunArgs,
    log: &mut LogArgs,
    given: impl Fn(&str) -> bool,
) -> Result<Vec<Warning>, Error> {
    let Some(path) = run.config.clone() else {
        return Ok(Vec::new());
    };
    let (from, warnings) = read(&path)?;
    apply(run, log, from, given);
    Ok(warnings)
}

#[cfg(test)]
mod tests;
