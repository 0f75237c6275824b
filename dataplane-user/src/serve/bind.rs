//! Where the health and metrics servers listen, from kube-proxy's flags:
//! `--healthz-bind-address` and `--metrics-bind-address` take an IP or IP:PORT
//! ([`BindAddress`]), and the older `--healthz-port` and `--metrics-port` give the
//! port of an address without one, or 0 to serve nothing ([`BindAddress::resolve`]).
//!
//! Upstream: the flags in
//! <https://github.com/kubernetes/kubernetes/blob/v1.37.2/cmd/kube-proxy/app/options.go>
//! (`IPPortVar` in
//! <https://github.com/kubernetes/kubernetes/blob/v1.37.2/pkg/util/flag/flags.go>,
//! `addressFromDeprecatedFlags`), the defaults in
//! <https://github.com/kubernetes/kubernetes/blob/v1.37.2/pkg/proxy/apis/config/v1alpha1/defaults.go>
//! and the check of the result (`validateHostPort`) in
//! <https://github.com/kubernetes/kubernetes/blob/v1.37.2/pkg/proxy/apis/config/validation/validation.go>.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

/// kube-proxy's health port (`ports.ProxyHealthzPort`).
pub const HEALTHZ_PORT: u16 = 10256;
/// kube-proxy's metrics port (`ports.ProxyStatusPort`).
pub const METRICS_PORT: u16 = 10249;
/// `--healthz-bind-address`'s default: every address, so that load balancers and
/// probes from other hosts reach it.
pub const DEFAULT_HEALTHZ: SocketAddr =
    SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), HEALTHZ_PORT);
/// `--metrics-bind-address`'s default: loopback only.
pub const DEFAULT_METRICS: SocketAddr =
    SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), METRICS_PORT);

/// A bind address as kube-proxy's flags take it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BindAddress {
    /// An IP alone: the port comes from `--healthz-port` or `--metrics-port`.
    Ip(IpAddr),
    /// IP:PORT (`[IPv6]:PORT`); the port flag does not change it.
    IpPort(SocketAddr),
}

impl BindAddress {
    /// Parses `s` as `IPPortVar.Set` does: an IP, else IP:PORT. An empty value
    /// leaves the flag at `default`, as kube-proxy's does. Port 0 is refused here,
    /// where kube-proxy's validation refuses it later (`must be a valid port`).
    pub fn parse(s: &str, default: SocketAddr) -> Result<Self, String> {
        let s = s.trim();
        if s.is_empty() {
            return Ok(BindAddress::IpPort(default));
        }
        if let Ok(ip) = s.parse::<IpAddr>() {
            return Ok(BindAddress::Ip(ip));
        }
        match s.parse::<SocketAddr>() {
            Ok(a) if a.port() == 0 => Err(format!(
                "{s:?}: port 0 is not a port to serve on (the port flag set to 0 serves \
                 nothing)"
            )),
            Ok(a) => Ok(BindAddress::IpPort(a)),
            Err(_) => Err(format!(
                "{s:?} is not in a valid format: expected IP or IP:PORT, such as \
                 0.0.0.0:10256, 127.0.0.1, [::]:10256 or ::1"
            )),
        }
    }

    /// The address to listen on, with the port flag's value: `None` when the port
    /// flag is 0 (`addressFromDeprecatedFlags`: the server is off); else the
    /// address, with `port` when it has none (`AppendPortIfNeeded`).
    pub fn resolve(self, port: u16) -> Option<SocketAddr> {
        if port == 0 {
            return None;
        }
        Some(match self {
            BindAddress::Ip(ip) => SocketAddr::new(ip, port),
            BindAddress::IpPort(addr) => addr,
        })
    }
}

impl std::fmt::Display for BindAddress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BindAddress::Ip(ip) => ip.fmt(f),
            BindAddress::IpPort(addr) => addr.fmt(f),
        }
    }
}

/// `--healthz-bind-address`.
pub fn healthz(s: &str) -> Result<BindAddress, String> {
    BindAddress::parse(s, DEFAULT_HEALTHZ)
}

/// `--metrics-bind-address`.
pub fn metrics(s: &str) -> Result<BindAddress, String> {
    BindAddress::parse(s, DEFAULT_METRICS)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    /// Each form kube-proxy's flags take, and what it listens on.
    #[test]
    fn takes_kube_proxy_forms() {
        for (flag, port, wanted) in [
            ("0.0.0.0:10256", HEALTHZ_PORT, Some(addr("0.0.0.0:10256"))),
            // An IP alone takes the port flag's value.
            ("10.0.0.1", HEALTHZ_PORT, Some(addr("10.0.0.1:10256"))),
            ("10.0.0.1", 8080, Some(addr("10.0.0.1:8080"))),
            ("::", HEALTHZ_PORT, Some(addr("[::]:10256"))),
            ("[::1]:9000", 8080, Some(addr("[::1]:9000"))),
            // The port flag does not change an address that has a port.
            ("127.0.0.1:10249", 9999, Some(addr("127.0.0.1:10249"))),
            // Port 0: no server.
            ("0.0.0.0:10256", 0, None),
            // Empty: the default.
            ("", HEALTHZ_PORT, Some(DEFAULT_HEALTHZ)),
        ] {
            assert_eq!(
                healthz(flag).unwrap().resolve(port),
                wanted,
                "{flag} {port}"
            );
        }
        assert_eq!(
            metrics("").unwrap().resolve(METRICS_PORT),
            Some(DEFAULT_METRICS)
        );
    }

    /// What kube-proxy refuses is refused, with the forms it takes.
    #[test]
    fn refuses_what_kube_proxy_refuses() {
        for flag in [
            "10256",
            ":10256",
            "localhost:10256",
            "0.0.0.0:",
            "0.0.0.0:65536",
        ] {
            let err = healthz(flag).unwrap_err();
            assert!(err.contains("expected IP or IP:PORT"), "{flag}: {err}");
        }
        let err = healthz("0.0.0.0:0").unwrap_err();
        assert!(err.contains("port 0"), "{err}");
    }
}
