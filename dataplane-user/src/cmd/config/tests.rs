//! Issue 47: `--config FILE` with real KubeProxyConfiguration documents (kubeadm's,
//! kind's, upstream's defaulted round-trip), the warnings for fields sliceway does not
//! honour, the errors that stop the agent, and the command line over the file.

use super::*;
use crate::cmd::cli::{Cli, Command};
use clap::{CommandFactory as _, FromArgMatches as _, Parser as _};

/// The `config.conf` kubeadm v1.37 writes into its `kube-proxy` ConfigMap (pod subnet
/// 10.244.0.0/16): the v1alpha1 type marshalled with kubeadm's own defaults
/// (cmd/kubeadm/app/componentconfigs/kubeproxy.go: `bindAddress`, `clusterCIDR` from
/// the pod subnet, `clientConnection.kubeconfig`), every other field at its zero
/// value, keys sorted.
const KUBEADM: &str = r#"apiVersion: kubeproxy.config.k8s.io/v1alpha1
bindAddress: 0.0.0.0
bindAddressHardFail: false
clientConnection:
  acceptContentTypes: ""
  burst: 0
  contentType: ""
  kubeconfig: /var/lib/kube-proxy/kubeconfig.conf
  qps: 0
clusterCIDR: 10.244.0.0/16
configSyncPeriod: 0s
conntrack:
  maxPerCore: null
  min: null
  tcpBeLiberal: false
  tcpCloseWaitTimeout: null
  tcpEstablishedTimeout: null
  udpStreamTimeout: 0s
  udpTimeout: 0s
detectLocal:
  bridgeInterface: ""
  interfaceNamePrefix: ""
detectLocalMode: ""
enableProfiling: false
healthzBindAddress: ""
hostnameOverride: ""
iptables:
  localhostNodePorts: null
  masqueradeAll: false
  masqueradeBit: null
  minSyncPeriod: 0s
  syncPeriod: 0s
ipvs:
  excludeCIDRs: null
  minSyncPeriod: 0s
  scheduler: ""
  strictARP: false
  syncPeriod: 0s
  tcpFinTimeout: 0s
  tcpTimeout: 0s
  udpTimeout: 0s
kind: KubeProxyConfiguration
logging:
  flushFrequency: 0
  options:
    json:
      infoBufferSize: "0"
    text:
      infoBufferSize: "0"
  verbosity: 0
metricsBindAddress: ""
mode: ""
nftables:
  masqueradeAll: false
  masqueradeBit: null
  minSyncPeriod: 0s
  syncPeriod: 0s
nodePortAddresses: null
oomScoreAdj: null
portRange: ""
showHiddenMetricsForVersion: ""
winkernel:
  enableDSR: false
  forwardHealthCheckVip: false
  networkName: ""
  rootHnsEndpointName: ""
  sourceVip: ""
"#;

/// The KubeProxyConfiguration kind's kubeadm configuration template gives
/// (sigs.k8s.io/kind pkg/cluster/internal/kubeadm/config.go, `mode: iptables`),
/// without its `metadata`, which kubeadm drops before writing the ConfigMap.
const KIND_CLUSTER: &str = r#"apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: "iptables"
iptables:
  minSyncPeriod: 1s
conntrack:
# Skip setting sysctl value "net.netfilter.nf_conntrack_max"
# It is a global variable that affects other namespaces
  maxPerCore: 0
"#;

/// Upstream's fully defaulted v1alpha1 object, as `kube-proxy --write-config-to`
/// writes it: pkg/proxy/apis/config/scheme/testdata/KubeProxyConfiguration/roundtrip/default/v1alpha1.yaml
/// at v1.37.2.
const DEFAULTED: &str = r#"apiVersion: kubeproxy.config.k8s.io/v1alpha1
bindAddress: 0.0.0.0
bindAddressHardFail: false
clientConnection:
  acceptContentTypes: ""
  burst: 10
  contentType: application/vnd.kubernetes.protobuf
  kubeconfig: ""
  qps: 5
clusterCIDR: ""
configSyncPeriod: 15m0s
conntrack:
  maxPerCore: 32768
  min: 131072
  tcpBeLiberal: false
  tcpCloseWaitTimeout: 1h0m0s
  tcpEstablishedTimeout: 24h0m0s
  udpStreamTimeout: 0s
  udpTimeout: 0s
detectLocal:
  bridgeInterface: ""
  interfaceNamePrefix: ""
detectLocalMode: ""
enableProfiling: false
healthzBindAddress: 0.0.0.0:10256
hostnameOverride: ""
iptables:
  localhostNodePorts: true
  masqueradeAll: false
  masqueradeBit: 14
  minSyncPeriod: 1s
  syncPeriod: 30s
ipvs:
  excludeCIDRs: null
  minSyncPeriod: 0s
  scheduler: ""
  strictARP: false
  syncPeriod: 0s
  tcpFinTimeout: 0s
  tcpTimeout: 0s
  udpTimeout: 0s
kind: KubeProxyConfiguration
logging:
  flushFrequency: 5s
  format: text
  options:
    json:
      infoBufferSize: "0"
    text:
      infoBufferSize: "0"
  verbosity: 0
metricsBindAddress: 127.0.0.1:10249
mode: ""
nftables:
  masqueradeAll: false
  masqueradeBit: 14
  minSyncPeriod: 0s
  syncPeriod: 0s
nodePortAddresses: null
oomScoreAdj: -999
portRange: ""
showHiddenMetricsForVersion: ""
winkernel:
  enableDSR: false
  forwardHealthCheckVip: false
  networkName: ""
  rootHnsEndpointName: ""
  sourceVip: ""
"#;

const HEAD: &str = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n";

fn translated(text: &str, cpus: usize) -> Result<(FromFile, Vec<Warning>), Problem> {
    translate(&decode(text)?, cpus)
}

/// The fields of the warnings `text` gets.
fn warned(text: &str) -> Vec<String> {
    let (_, warnings) = translated(text, 4).unwrap();
    warnings.into_iter().map(|w| w.field).collect()
}

/// `text` refused: the field named and the reason's words.
fn refused(text: &str) -> (String, String) {
    match translated(text, 4) {
        Err(Problem::Field { field, reason }) => (field, reason),
        other => panic!("{text}: expected a field's error, got {other:?}"),
    }
}

fn addr(s: &str) -> BindAddress {
    BindAddress::IpPort(s.parse().unwrap())
}

/// kubeadm's ConfigMap: its kubeconfig is used; NodePorts on every address, as
/// kube-proxy's iptables mode (the default) serves them; the cluster CIDR taken;
/// one field named as not honoured (the localhost NodePorts of iptables mode),
/// nothing else, although every field is there.
#[test]
fn kubeadms_configmap_sets_the_kubeconfig_and_nodeports_on_all_addresses() {
    let (from, warnings) = translated(KUBEADM, 4).unwrap();
    assert_eq!(
        from,
        FromFile {
            kubeconfig: Some("/var/lib/kube-proxy/kubeconfig.conf".into()),
            nodeport_addresses: Some(NodePortAddresses::parse("all").unwrap()),
            cluster_cidr: Some(crate::cmd::cli::ClusterCidrs(vec![(
                "10.244.0.0".parse().unwrap(),
                16
            )])),
            // What kubeadm writes as null keeps the flags' defaults, kube-proxy's.
            netfilter: NetfilterFromFile {
                tcp_be_liberal: Some(false),
                udp: Some(0),
                udp_stream: Some(0),
                ..NetfilterFromFile::default()
            },
            ..FromFile::default()
        }
    );
    let fields: Vec<&str> = warnings.iter().map(|w| w.field.as_str()).collect();
    assert_eq!(fields, ["iptables.localhostNodePorts"]);
}

/// kind's document: the mode and its minimum sync period are named; `maxPerCore: 0`
/// leaves the conntrack size alone. kind's own `metadata` is no field of the type.
#[test]
fn kinds_document_names_the_mode_and_leaves_conntrack_alone() {
    let (from, warnings) = translated(KIND_CLUSTER, 64).unwrap();
    assert_eq!(from.max_conntrack, None);
    assert_eq!(
        warnings
            .iter()
            .map(|w| w.field.as_str())
            .collect::<Vec<_>>(),
        [
            "mode",
            "iptables.minSyncPeriod",
            "iptables.localhostNodePorts"
        ]
    );
    assert!(
        warnings[0].reason.contains("\"iptables\""),
        "{}",
        warnings[0]
    );
    let with_metadata = KIND_CLUSTER.replace("mode:", "metadata:\n  name: config\nmode:");
    let err = decode(&with_metadata).unwrap_err().to_string();
    assert!(err.contains("unknown field `metadata`"), "{err}");
}

/// Upstream's defaulted object: kube-proxy's own defaults mean the agent's (health,
/// metrics, 24 h established), its close-wait hour is taken, conntrack grows with the
/// cores past the agent's default, and the settings of no meaning here are named.
#[test]
fn the_defaulted_object_maps_kube_proxys_defaults() {
    let (from, warnings) = translated(DEFAULTED, 2).unwrap();
    assert_eq!(from.healthz_bind_address, Some(addr("0.0.0.0:10256")));
    assert_eq!(from.metrics_bind_address, Some(addr("127.0.0.1:10249")));
    assert_eq!(
        from.conntrack_timeouts,
        ["tcp_established=86400", "tcp_fin_wait=3600"]
    );
    assert_eq!(from.logging_format, Some(Format::Text));
    assert_eq!(from.verbosity, None);
    // netfilter's table, as the flags' defaults (kube-proxy's) set it.
    let defaults = crate::kernel::netfilter::Conntrack::default();
    assert_eq!(
        from.netfilter,
        NetfilterFromFile {
            max_per_core: Some(defaults.max_per_core),
            min: Some(defaults.min),
            tcp_established: Some(defaults.tcp_established),
            tcp_close_wait: Some(defaults.tcp_close_wait),
            tcp_be_liberal: Some(false),
            udp: Some(0),
            udp_stream: Some(0),
        }
    );
    // 2 CPUs: 65,536 connections, below `min` (131,072): the agent's default already.
    assert_eq!(from.max_conntrack, None);
    // 8 CPUs: 262,144 connections, two entries each.
    let (from, _) = translated(DEFAULTED, 8).unwrap();
    assert_eq!(from.max_conntrack, Some(524_288));
    // 64 CPUs: kube-proxy's ceiling of 1,048,576 connections.
    let (from, _) = translated(DEFAULTED, 64).unwrap();
    assert_eq!(from.max_conntrack, Some(2_097_152));
    assert_eq!(
        warnings
            .iter()
            .map(|w| w.field.as_str())
            .collect::<Vec<_>>(),
        [
            "clientConnection.contentType",
            "clientConnection.qps",
            "clientConnection.burst",
            "iptables.syncPeriod",
            "iptables.minSyncPeriod",
            "iptables.localhostNodePorts",
            "oomScoreAdj",
            "configSyncPeriod",
        ]
    );
}

/// JSON is read as YAML is; `hostnameOverride` is trimmed and lowercased as
/// kube-proxy's `GetHostname` does; an IP alone gets kube-proxy's port.
#[test]
fn json_and_the_honoured_fields() {
    let json = r#"{
      "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
      "kind": "KubeProxyConfiguration",
      "hostnameOverride": " Node-A ",
      "healthzBindAddress": "10.0.0.1",
      "metricsBindAddress": "[::]:9100",
      "nodePortAddresses": ["10.0.0.0/8", "fd00::/8"],
      "logging": {"format": "json", "verbosity": 4},
      "conntrack": {"udpTimeout": "45s", "udpStreamTimeout": "2m30.5s", "min": 400000}
    }"#;
    let (from, warnings) = translated(json, 1).unwrap();
    assert_eq!(warnings, []);
    assert_eq!(
        from,
        FromFile {
            node: Some("node-a".into()),
            healthz_bind_address: Some(addr("10.0.0.1:10256")),
            metrics_bind_address: Some(addr("[::]:9100")),
            nodeport_addresses: Some(NodePortAddresses::parse("10.0.0.0/8,fd00::/8").unwrap()),
            // maxPerCore's default (32,768 on one CPU) under min: min's 400,000.
            max_conntrack: Some(800_000),
            conntrack_timeouts: vec!["udp_unreplied=45".into(), "udp_replied=151".into()],
            // netfilter's whole seconds are truncated, as kube-proxy's.
            netfilter: NetfilterFromFile {
                min: Some(400_000),
                udp: Some(45),
                udp_stream: Some(150),
                ..NetfilterFromFile::default()
            },
            logging_format: Some(Format::Json),
            verbosity: Some(4),
            ..FromFile::default()
        }
    );
}

/// `bindAddress` IPv6: the servers' defaults are IPv6's, as kube-proxy's defaulting;
/// a specific address is named (the node's primary address is its Node object's).
#[test]
fn an_ipv6_bind_address_moves_the_servers_defaults() {
    let (from, warnings) = translated(&format!("{HEAD}bindAddress: \"::\"\n"), 1).unwrap();
    assert_eq!(from.healthz_bind_address, Some(addr("[::]:10256")));
    assert_eq!(from.metrics_bind_address, Some(addr("[::1]:10249")));
    assert!(!warnings.iter().any(|w| w.field == "bindAddress"));
    assert!(warned(&format!("{HEAD}bindAddress: 10.0.0.5\n")).contains(&"bindAddress".into()));
}

/// `detectLocalMode: InterfaceNamePrefix` is how sliceway detects pods already: its
/// prefix becomes the pod-interface pattern. The other modes are named.
#[test]
fn an_interface_name_prefix_selects_the_pod_interfaces() {
    let (from, warnings) = translated(
        &format!("{HEAD}detectLocalMode: InterfaceNamePrefix\ndetectLocal:\n  interfaceNamePrefix: veth\nclusterCIDR: 10.244.0.0/16\nmode: nftables\n"),
        1,
    )
    .unwrap();
    assert_eq!(from.interfaces, Some(vec!["veth*".to_string()]));
    // nftables: `primary` by default, and no localhost NodePorts to speak of; the
    // cluster CIDR is not used by kube-proxy in this mode either.
    assert_eq!(from.nodeport_addresses, Some(NodePortAddresses::Primary));
    assert_eq!(
        warnings
            .iter()
            .map(|w| w.field.as_str())
            .collect::<Vec<_>>(),
        ["mode"]
    );
    let text =
        format!("{HEAD}detectLocalMode: BridgeInterface\ndetectLocal: {{bridgeInterface: cni0}}\n");
    assert!(warned(&text).contains(&"detectLocalMode".into()));
    // NodeCIDR is honoured: the node's pod CIDRs are read from its Node.
    let text = format!("{HEAD}detectLocalMode: NodeCIDR\n");
    assert!(!warned(&text).contains(&"detectLocalMode".into()));
}

/// Every field sliceway reads but does not honour, set: one warning each, naming it.
#[test]
fn each_field_not_honoured_gets_one_warning_naming_it() {
    let text = format!(
        "{HEAD}featureGates: {{KubeProxyNFTablesLocalhostNodePorts: true}}
clientConnection: {{acceptContentTypes: application/json, qps: 50, burst: 100}}
logging:
  vmodule: [{{filePattern: proxier, verbosity: 5}}]
  options: {{text: {{splitStream: true, infoBufferSize: 64Ki}}}}
bindAddressHardFail: true
enableProfiling: true
showHiddenMetricsForVersion: \"1.36\"
mode: ipvs
iptables: {{masqueradeAll: true, localhostNodePorts: false}}
ipvs: {{scheduler: rr, strictARP: true, tcpTimeout: 900s, excludeCIDRs: [10.0.0.0/8], syncPeriod: 30s, minSyncPeriod: 2s}}
winkernel: {{enableDSR: true}}
windowsRunAsService: true
oomScoreAdj: -999
conntrack: {{tcpBeLiberal: true}}
configSyncPeriod: 15m
portRange: 30000-32767
"
    );
    let (_, warnings) = translated(&text, 1).unwrap();
    let fields: Vec<&str> = warnings.iter().map(|w| w.field.as_str()).collect();
    assert_eq!(
        fields,
        [
            "featureGates.KubeProxyNFTablesLocalhostNodePorts",
            "clientConnection.acceptContentTypes",
            "clientConnection.qps",
            "clientConnection.burst",
            "logging.vmodule",
            "logging.options.text.splitStream",
            "logging.options.text.infoBufferSize",
            "bindAddressHardFail",
            "enableProfiling",
            "showHiddenMetricsForVersion",
            "mode",
            "ipvs.syncPeriod",
            "ipvs.minSyncPeriod",
            "ipvs.tcpTimeout",
            "ipvs.excludeCIDRs",
            "ipvs.scheduler",
            "ipvs.strictARP",
            "winkernel.enableDSR",
            "windowsRunAsService",
            "oomScoreAdj",
            "configSyncPeriod",
            "portRange",
        ]
    );
    for w in &warnings {
        let line = w.to_string();
        assert!(
            line.starts_with(&format!("{}: not honoured: ", w.field)),
            "{line}"
        );
        assert!(!line.contains('\n'), "{line}");
    }
}

/// An unknown field, at the top or in a section, is an error naming it (and where
/// it is); so is a repeated one.
#[test]
fn unknown_and_repeated_fields_are_errors_naming_the_field() {
    for (body, field, line) in [
        ("healthBindAddress: 0.0.0.0:10256", "healthBindAddress", 3),
        ("conntrack:\n  tcpTimeout: 1h", "conntrack.tcpTimeout", 4),
        (
            "logging:\n  options:\n    yaml: {}",
            "logging.options.yaml",
            5,
        ),
    ] {
        let err = decode(&format!("{HEAD}{body}\n")).unwrap_err();
        let Problem::Field { field: f, reason } = &err else {
            panic!("{body}: {err:?}")
        };
        assert_eq!(f, field, "{body}");
        let name = field.rsplit('.').next().unwrap();
        assert!(
            reason.starts_with(&format!("unknown field `{name}`, expected")),
            "{body}: {reason}"
        );
        assert!(reason.contains(&format!("line {line}")), "{body}: {reason}");
    }
    let err = decode(&format!("{HEAD}mode: iptables\nmode: nftables\n"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("duplicate") && err.contains("mode"), "{err}");
}

/// A wrong or missing `apiVersion` or `kind` is refused before any other field.
#[test]
fn the_type_must_be_kube_proxys() {
    for (text, field, words) in [
        (
            "apiVersion: kubeproxy.config.k8s.io/v1alpha2\nkind: KubeProxyConfiguration\n",
            "apiVersion",
            "\"kubeproxy.config.k8s.io/v1alpha2\": must be kubeproxy.config.k8s.io/v1alpha1",
        ),
        (
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nbogus: 1\n",
            "kind",
            "\"KubeletConfiguration\": must be KubeProxyConfiguration",
        ),
        ("kind: KubeProxyConfiguration\n", "apiVersion", "missing"),
        (
            "apiVersion: kubeproxy.config.k8s.io/v1alpha1\n",
            "kind",
            "missing",
        ),
    ] {
        match decode(text) {
            Err(Problem::Field { field: f, reason }) => {
                assert_eq!(f, field, "{text}");
                assert!(reason.contains(words), "{text}: {reason}");
            }
            other => panic!("{text}: {other:?}"),
        }
    }
    assert!(matches!(decode("[1, 2"), Err(Problem::Document(_))));
    assert!(matches!(
        decode(&format!("{HEAD}---\n{HEAD}")),
        Err(Problem::Document(_))
    ));
}

/// A malformed value, or one kube-proxy's validation refuses, is an error naming its
/// field.
#[test]
fn malformed_values_are_errors_naming_the_field() {
    for (body, field, words) in [
        (
            "healthzBindAddress: \"10256\"",
            "healthzBindAddress",
            "expected IP or IP:PORT",
        ),
        (
            "metricsBindAddress: 127.0.0.1:0",
            "metricsBindAddress",
            "port 0",
        ),
        (
            "bindAddress: localhost",
            "bindAddress",
            "not a valid IP address",
        ),
        (
            "conntrack: {udpTimeout: 5 minutes}",
            "conntrack.udpTimeout",
            "unknown unit \" minutes\" in duration",
        ),
        (
            "iptables: {syncPeriod: 1x}",
            "iptables.syncPeriod",
            "unknown unit",
        ),
        (
            "conntrack: {tcpEstablishedTimeout: 10}",
            "conntrack.tcpEstablishedTimeout",
            "missing unit",
        ),
        (
            "conntrack: {maxPerCore: -1}",
            "conntrack.maxPerCore",
            "greater than or equal to 0",
        ),
        (
            "conntrack: {tcpCloseWaitTimeout: -1s}",
            "conntrack.tcpCloseWaitTimeout",
            "greater than or equal to 0",
        ),
        (
            "conntrack: {min: 3000000000}",
            "conntrack.min",
            "invalid value",
        ),
        (
            "nodePortAddresses: [10.0.0.0/33]",
            "nodePortAddresses[0]",
            "must be a valid CIDR",
        ),
        (
            "nodePortAddresses: [all, all]",
            "nodePortAddresses",
            "given twice",
        ),
        (
            "nodePortAddresses: \"10.0.0.0/8\"",
            "nodePortAddresses",
            "invalid type",
        ),
        (
            "mode: userspace",
            "mode",
            "must be iptables, ipvs, nftables or blank",
        ),
        (
            "mode: kernelspace",
            "mode",
            "must be iptables, ipvs, nftables or blank",
        ),
        (
            "detectLocalMode: PodCIDR",
            "detectLocalMode",
            "must be ClusterCIDR",
        ),
        (
            "detectLocalMode: InterfaceNamePrefix",
            "detectLocal.interfaceNamePrefix",
            "must not be empty",
        ),
        (
            "detectLocalMode: BridgeInterface",
            "detectLocal.bridgeInterface",
            "must not be empty",
        ),
        (
            "clusterCIDR: 10.244.0.0/16,10.245.0.0/16",
            "clusterCIDR",
            "one of each family",
        ),
        (
            "clusterCIDR: 10.244.0.0",
            "clusterCIDR",
            "must be a valid CIDR block",
        ),
        ("oomScoreAdj: 2000", "oomScoreAdj", "[-1000, 1000]"),
        (
            "iptables: {masqueradeBit: 32}",
            "iptables.masqueradeBit",
            "[0, 31]",
        ),
        (
            "iptables: {syncPeriod: 1s, minSyncPeriod: 2s}",
            "iptables.syncPeriod",
            "minSyncPeriod",
        ),
        (
            "logging: {format: xml}",
            "logging.format",
            "unsupported log format",
        ),
        (
            "logging: {verbosity: high}",
            "logging.verbosity",
            "invalid type",
        ),
        (
            "clientConnection: {burst: -1}",
            "clientConnection.burst",
            "greater than or equal to 0",
        ),
        ("enableProfiling: yes", "enableProfiling", "invalid type"),
        (
            "configSyncPeriod: -1m",
            "configSyncPeriod",
            "greater than 0",
        ),
    ] {
        let (f, reason) = refused(&format!("{HEAD}{body}\n"));
        assert_eq!(f, field, "{body}: {reason}");
        assert!(reason.contains(words), "{body}: {reason}");
    }
}

/// Go's `time.ParseDuration`, as `metav1.Duration` reads durations.
#[test]
fn durations_are_read_as_go_reads_them() {
    const S: i128 = 1_000_000_000;
    for (text, ns) in [
        ("0", 0),
        ("0s", 0),
        ("1h0m0s", 3600 * S),
        ("15m0s", 900 * S),
        ("2h45m", 9900 * S),
        ("1.5s", 3 * S / 2),
        (".5s", S / 2),
        ("1.s", S),
        ("300ms", 300_000_000),
        ("1\u{b5}s", 1_000),
        ("1us", 1_000),
        ("10ns", 10),
        ("-1s", -S),
        ("+2m", 120 * S),
    ] {
        assert_eq!(parse_go_duration(text), Ok(ns), "{text}");
    }
    for text in ["", "1", "s", ".s", "1d", "1 s", "-", "9999999999999h"] {
        assert!(parse_go_duration(text).is_err(), "{text}");
    }
}

/// The kernel's CPU lists (kube-proxy's `getConntrackMax` is tested in
/// `kernel::netfilter`).
#[test]
fn cpus_are_counted_as_kube_proxy_counts_them() {
    assert_eq!(count_cpu_list("0-3,6,8-9"), Some(7));
    assert_eq!(count_cpu_list("0"), Some(1));
    assert_eq!(count_cpu_list("3-1"), None);
    assert!(online_cpus() >= 1);
}

/// `sliceway-agent ARGS` parsed as the binary parses it, then `--config`'s `text`
/// applied under it: the run arguments and the log flags.
fn run_with(args: &[&str], text: &str) -> (RunArgs, LogArgs) {
    let matches = Cli::command().try_get_matches_from(args).unwrap();
    let cli = Cli::from_arg_matches(&matches).unwrap();
    let Command::Run(mut run) = cli.command else {
        panic!("{args:?} is not run")
    };
    let mut log = cli.log;
    let (_, run_matches) = matches.subcommand().unwrap();
    let (from, _) = translated(text, 1).unwrap();
    apply(&mut run, &mut log, from, |id| {
        given(&matches, id) || given(run_matches, id)
    });
    (*run, log)
}

/// A flag given wins over the file, one setting at a time; conntrack timeouts add up
/// (a flag's state over the file's); `-v` wins wherever it is given.
#[test]
fn flags_given_win_over_the_file() {
    let file = format!(
        "{HEAD}healthzBindAddress: 127.0.0.1:30256\nmetricsBindAddress: 127.0.0.1:30249\n\
         hostnameOverride: from-file\nclientConnection: {{kubeconfig: /file/kubeconfig}}\n\
         nodePortAddresses: [10.0.0.0/8]\nlogging: {{format: json, verbosity: 5}}\n\
         conntrack: {{tcpEstablishedTimeout: 1h, udpTimeout: 10s, tcpBeLiberal: true, \
         maxPerCore: 0}}\n"
    );
    let (run, log) = run_with(&["sliceway-agent", "run"], &file);
    assert_eq!(
        (
            run.conntrack_tcp_timeout_established,
            run.conntrack_udp_timeout,
            run.conntrack_tcp_be_liberal,
            run.conntrack_max_per_core,
            run.conntrack_tcp_timeout_close_wait,
        ),
        (3600, 10, true, 0, 3600)
    );
    assert_eq!(run.healthz_addr(), Some("127.0.0.1:30256".parse().unwrap()));
    assert_eq!(run.metrics_addr(), Some("127.0.0.1:30249".parse().unwrap()));
    assert_eq!(run.node.as_deref(), Some("from-file"));
    assert_eq!(run.kubeconfig, Some("/file/kubeconfig".into()));
    assert_eq!(
        run.nodeport_addresses,
        NodePortAddresses::parse("10.0.0.0/8").unwrap()
    );
    assert_eq!((log.logging_format, log.v), (Format::Json, Some(5)));

    let (run, log) = run_with(
        &[
            "sliceway-agent",
            "-v",
            "2",
            "run",
            "--healthz-bind-address",
            "10.0.0.1:8080",
            "--hostname-override",
            "Node-1",
            "--conntrack-timeout",
            "tcp_established=60",
            "--conntrack-tcp-timeout-established",
            "2h30m",
            "--conntrack-max-per-core",
            "1000",
            "--logging-format",
            "text",
        ],
        &file,
    );
    assert_eq!(
        (
            run.conntrack_tcp_timeout_established,
            run.conntrack_max_per_core,
            run.conntrack_udp_timeout
        ),
        (9000, 1000, 10)
    );
    assert_eq!(run.healthz_addr(), Some("10.0.0.1:8080".parse().unwrap()));
    assert_eq!(run.metrics_addr(), Some("127.0.0.1:30249".parse().unwrap()));
    assert_eq!(run.node.as_deref(), Some("node-1"));
    assert_eq!((log.logging_format, log.v), (Format::Text, Some(2)));
    let timeouts = crate::writer::conntrack::Timeouts::parse(&run.conntrack_timeout).unwrap();
    use dataplane_common::ct::state;
    assert_eq!(timeouts.0[state::TCP_ESTABLISHED as usize], 60);
    assert_eq!(timeouts.0[state::UDP_UNREPLIED as usize], 10);
}

/// kube-proxy's flag names the agent takes with the same meaning.
#[test]
fn kube_proxys_flag_names_are_taken() {
    let (run, _) = run_with(
        &[
            "sliceway-agent",
            "run",
            "--config",
            "/etc/kube-proxy/config.conf",
            "--hostname-override",
            " Worker-2 ",
            "--kubeconfig",
            "/var/lib/kube-proxy/kubeconfig.conf",
            "--healthz-bind-address",
            "0.0.0.0:10256",
            "--metrics-bind-address",
            "0.0.0.0:10249",
            "--nodeport-addresses",
            "primary",
        ],
        HEAD,
    );
    assert_eq!(run.config, Some("/etc/kube-proxy/config.conf".into()));
    assert_eq!(run.node.as_deref(), Some("worker-2"));
    let err = Cli::try_parse_from(["sliceway-agent", "run", "--hostname-override", "  "])
        .err()
        .expect("a blank name")
        .to_string();
    assert!(err.contains("empty node name"), "{err}");
}

/// `load` reads the file named by `--config`; a file that is not there is an error
/// naming it.
#[test]
fn load_reads_the_named_file() {
    let dir = std::env::temp_dir().join(format!("sliceway-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("config.conf");
    std::fs::write(
        &path,
        format!("{HEAD}healthzBindAddress: 127.0.0.1:30256\nmode: nftables\n"),
    )
    .unwrap();
    let matches = Cli::command()
        .try_get_matches_from(["sliceway-agent", "run", "--config", path.to_str().unwrap()])
        .unwrap();
    let cli = Cli::from_arg_matches(&matches).unwrap();
    let Command::Run(mut run) = cli.command else {
        unreachable!()
    };
    let mut log = cli.log;
    let warnings = load(&mut run, &mut log, |_| false).unwrap();
    assert_eq!(run.healthz_addr(), Some("127.0.0.1:30256".parse().unwrap()));
    assert_eq!(warnings.len(), 1);
    run.config = Some(dir.join("missing.conf"));
    let err = load(&mut run, &mut log, |_| false).unwrap_err().to_string();
    assert!(
        err.starts_with(&format!(
            "--config {}: ",
            dir.join("missing.conf").display()
        )),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Issue 46: kube-proxy's `--masquerade-all`, `--cluster-cidr` and
/// `--detect-local-mode` (with its two companions) are taken, checked together.
#[test]
fn local_detection_flags_are_taken_as_kube_proxys() {
    let (run, _) = run_with(
        &[
            "sliceway-agent",
            "run",
            "--masquerade-all",
            "--cluster-cidr",
            "10.244.1.5/16,fd00:244::7/56",
            "--detect-local-mode",
            "ClusterCIDR",
        ],
        HEAD,
    );
    let local = run.local_detection().unwrap();
    assert!(local.masquerade_all);
    assert_eq!(
        local.local_cidrs,
        [
            ("10.244.0.0".parse().unwrap(), 16),
            ("fd00:244::".parse().unwrap(), 56)
        ]
    );
    assert_eq!(local.interfaces, None);
    // The default mode is ClusterCIDR; without --cluster-cidr nothing is local-
    // detected, and nothing is masqueraded.
    let (run, _) = run_with(&["sliceway-agent", "run"], HEAD);
    assert_eq!(run.local_detection().unwrap(), Default::default());
    // ClusterCIDR's CIDRs mean nothing in another mode.
    let (run, _) = run_with(
        &[
            "sliceway-agent",
            "run",
            "--cluster-cidr",
            "10.244.0.0/16",
            "--detect-local-mode",
            "InterfaceNamePrefix",
            "--pod-interface-name-prefix",
            "veth",
        ],
        HEAD,
    );
    let local = run.local_detection().unwrap();
    assert!(local.local_cidrs.is_empty());
    assert_eq!(local.interfaces.as_deref(), Some("veth*"));
    // --interfaces given wins over the prefix.
    let (run, _) = run_with(
        &[
            "sliceway-agent",
            "run",
            "--interfaces",
            "lxc*",
            "--detect-local-mode",
            "InterfaceNamePrefix",
            "--pod-interface-name-prefix",
            "veth",
        ],
        HEAD,
    );
    assert_eq!(run.local_detection().unwrap().interfaces, None);
    let (run, _) = run_with(
        &[
            "sliceway-agent",
            "run",
            "--detect-local-mode",
            "BridgeInterface",
            "--pod-bridge-interface",
            "cni0",
        ],
        HEAD,
    );
    let local = run.local_detection().unwrap();
    assert!(local.notes[0].contains("cni0"), "{:?}", local.notes);
}

/// Issue 46: a malformed value of a local-detection flag, or a mode without its
/// companion flag, is refused with what was wrong.
#[test]
fn local_detection_flags_refuse_invalid_values() {
    for (args, wanted) in [
        (
            &["--cluster-cidr", "10.0.0.0/8,10.1.0.0/16"][..],
            "one of each family",
        ),
        (
            &["--cluster-cidr", "10.0.0.0/8,fd00::/8,fd01::/16"][..],
            "dual-stack pair",
        ),
        (&["--cluster-cidr", "10.0.0.0/33"][..], "valid CIDR block"),
        (&["--cluster-cidr", "pods"][..], "valid CIDR block"),
        (&["--detect-local-mode", "clustercidr"][..], "invalid value"),
        (&["--detect-local-mode", "PodCIDR"][..], "invalid value"),
        (
            &["--masquerade-all", "--socket-lb-pods"][..],
            "cannot be used with",
        ),
    ] {
        let mut argv = vec!["sliceway-agent", "run"];
        argv.extend_from_slice(args);
        let err = Cli::try_parse_from(&argv)
            .err()
            .unwrap_or_else(|| panic!("{args:?} accepted"))
            .to_string();
        assert!(err.contains(wanted), "{args:?}: {err}");
    }
    for (args, wanted) in [
        (
            &["--detect-local-mode", "BridgeInterface"][..],
            "needs --pod-bridge-interface",
        ),
        (
            &["--detect-local-mode", "InterfaceNamePrefix"][..],
            "needs --pod-interface-name-prefix",
        ),
        (
            &[
                "--detect-local-mode",
                "InterfaceNamePrefix",
                "--pod-interface-name-prefix",
                "ve/th",
            ][..],
            "--pod-interface-name-prefix \"ve/th\"",
        ),
    ] {
        let mut argv = vec!["sliceway-agent", "run"];
        argv.extend_from_slice(args);
        let (run, _) = run_with(&argv, HEAD);
        let err = run.local_detection().unwrap_err();
        assert!(err.contains(wanted), "{args:?}: {err}");
    }
}

/// Issue 46: the file's `masqueradeAll`, `clusterCIDR` and `detectLocalMode` set
/// the flags of the same meaning; flags given win.
#[test]
fn the_files_local_detection_sets_the_flags() {
    let file = format!(
        "{HEAD}mode: nftables\nnftables: {{masqueradeAll: true}}\nclusterCIDR: 10.244.0.0/16\n\
         detectLocalMode: ClusterCIDR\n"
    );
    let (run, _) = run_with(&["sliceway-agent", "run"], &file);
    assert!(run.masquerade_all);
    let local = run.local_detection().unwrap();
    assert_eq!(local.local_cidrs, [("10.244.0.0".parse().unwrap(), 16)]);
    let (run, _) = run_with(
        &[
            "sliceway-agent",
            "run",
            "--cluster-cidr",
            "10.8.0.0/14",
            "--detect-local-mode",
            "NodeCIDR",
        ],
        &file,
    );
    assert_eq!(
        run.cluster_cidr.as_ref().unwrap().0,
        [("10.8.0.0".parse().unwrap(), 14)]
    );
    let local = run.local_detection().unwrap();
    assert!(local.local_cidrs.is_empty() && local.masquerade_all && local.from_node);
    assert!(local.notes.is_empty(), "{:?}", local.notes);
    // iptables' masqueradeAll is not the nftables mode's.
    let file = format!("{HEAD}mode: nftables\niptables: {{masqueradeAll: true}}\n");
    let (run, _) = run_with(&["sliceway-agent", "run"], &file);
    assert!(!run.masquerade_all);
}

/// Issue 44: what `clusterCIDR`, `nodePortAddresses` and `ipvs.excludeCIDRs` accept
/// and refuse as CIDRs, with `clusterCIDR`'s messages.
#[test]
fn config_cidrs_read_each_cidr_case_as_before() {
    let got: Vec<String> = crate::compiler::CIDR_CASES
        .iter()
        .map(|s| {
            let plain = match parse_cidr(s) {
                Ok((ip, len)) => format!("ok {ip}/{len}"),
                Err(()) => "err".to_string(),
            };
            let cluster = match parse_cluster_cidrs(s) {
                Ok(v) => format!("ok {v:?}"),
                Err(e) => format!("err {e}"),
            };
            format!("{s:?} {plain}; cluster {cluster}")
        })
        .collect();
    assert_eq!(
        got,
        [
            "\"10.0.0.0/8\" ok 10.0.0.0/8; cluster ok [(10.0.0.0, 8)]",
            "\"10.1.2.3/8\" ok 10.1.2.3/8; cluster ok [(10.0.0.0, 8)]",
            "\"10.0.0.0/+8\" ok 10.0.0.0/8; cluster ok [(10.0.0.0, 8)]",
            "\"10.0.0.0/08\" ok 10.0.0.0/8; cluster ok [(10.0.0.0, 8)]",
            "\"10.0.0.0/0\" ok 10.0.0.0/0; cluster ok [(0.0.0.0, 0)]",
            "\"10.0.0.0/00\" ok 10.0.0.0/0; cluster ok [(0.0.0.0, 0)]",
            "\"10.0.0.0/32\" ok 10.0.0.0/32; cluster ok [(10.0.0.0, 32)]",
            "\"10.0.0.0/33\" err; cluster err \"10.0.0.0/33\": must be a valid CIDR block (e.g. 10.100.0.0/16 or fde4:8dba:82e1::/48)",
            "\"10.0.0.0/256\" err; cluster err \"10.0.0.0/256\": must be a valid CIDR block (e.g. 10.100.0.0/16 or fde4:8dba:82e1::/48)",
            "\"10.0.0.0/-1\" err; cluster err \"10.0.0.0/-1\": must be a valid CIDR block (e.g. 10.100.0.0/16 or fde4:8dba:82e1::/48)",
            "\"10.0.0.0\" err; cluster err \"10.0.0.0\": must be a valid CIDR block (e.g. 10.100.0.0/16 or fde4:8dba:82e1::/48)",
            "\"10.0.0.0/\" err; cluster err \"10.0.0.0/\": must be a valid CIDR block (e.g. 10.100.0.0/16 or fde4:8dba:82e1::/48)",
            "\"/8\" err; cluster err \"/8\": must be a valid CIDR block (e.g. 10.100.0.0/16 or fde4:8dba:82e1::/48)",
            "\"010.0.0.0/8\" err; cluster err \"010.0.0.0/8\": must be a valid CIDR block (e.g. 10.100.0.0/16 or fde4:8dba:82e1::/48)",
            "\"10.0.0/8\" err; cluster err \"10.0.0/8\": must be a valid CIDR block (e.g. 10.100.0.0/16 or fde4:8dba:82e1::/48)",
            "\"x/8\" err; cluster err \"x/8\": must be a valid CIDR block (e.g. 10.100.0.0/16 or fde4:8dba:82e1::/48)",
            "\"10.0.0.0/8/9\" err; cluster err \"10.0.0.0/8/9\": must be a valid CIDR block (e.g. 10.100.0.0/16 or fde4:8dba:82e1::/48)",
            "\" 10.0.0.0/8 \" ok 10.0.0.0/8; cluster ok [(10.0.0.0, 8)]",
            "\"10.0.0.0 /8\" err; cluster err \"10.0.0.0 /8\": must be a valid CIDR block (e.g. 10.100.0.0/16 or fde4:8dba:82e1::/48)",
            "\"10.0.0.0/ 8\" err; cluster err \"10.0.0.0/ 8\": must be a valid CIDR block (e.g. 10.100.0.0/16 or fde4:8dba:82e1::/48)",
            "\"fd00::/8\" ok fd00::/8; cluster ok [(fd00::, 8)]",
            "\"fd00::1/8\" ok fd00::1/8; cluster ok [(fd00::, 8)]",
            "\"fd00::/128\" ok fd00::/128; cluster ok [(fd00::, 128)]",
            "\"fd00::/129\" err; cluster err \"fd00::/129\": must be a valid CIDR block (e.g. 10.100.0.0/16 or fde4:8dba:82e1::/48)",
            "\"fd00::/+8\" ok fd00::/8; cluster ok [(fd00::, 8)]",
            "\"fd00::/008\" ok fd00::/8; cluster ok [(fd00::, 8)]",
            "\"::/0\" ok ::/0; cluster ok [(::, 0)]",
            "\"::ffff:10.0.0.0/104\" ok ::ffff:10.0.0.0/104; cluster ok [(::ffff:10.0.0.0, 104)]",
            "\"fd00::/ 8\" err; cluster err \"fd00::/ 8\": must be a valid CIDR block (e.g. 10.100.0.0/16 or fde4:8dba:82e1::/48)",
        ]
    );
}
