//! The cluster lab's keys and certificates, made with `openssl`: a CA, the API
//! server's serving certificate, client certificates for the components that
//! authenticate with one (RBAC user and groups in CN and O, as kubeadm does), the
//! service-account signing key pair, and kubeconfig files that point at them.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context, Result};

/// A client identity: RBAC user and groups.
pub struct Identity<'a> {
    pub file: &'a str,
    pub user: &'a str,
    pub groups: &'a [&'a str],
}

/// Who gets a client certificate.
pub const IDENTITIES: &[Identity] = &[
    Identity {
        file: "admin",
        user: "lab-admin",
        groups: &["system:masters"],
    },
    Identity {
        file: "controller-manager",
        user: "system:kube-controller-manager",
        groups: &[],
    },
    Identity {
        file: "scheduler",
        user: "system:kube-scheduler",
        groups: &[],
    },
    Identity {
        file: "kube-proxy",
        user: "system:kube-proxy",
        groups: &[],
    },
    // The API server's identity towards kubelets (exec, logs, port-forward), as
    // kubeadm's `apiserver-kubelet-client`.
    Identity {
        file: "apiserver-kubelet-client",
        user: "kube-apiserver-kubelet-client",
        groups: &["system:masters"],
    },
];

fn openssl(dir: &Path, args: &[&str]) -> Result<()> {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .context("running openssl (is it installed?)")?;
    if !out.status.success() {
        bail!(
            "openssl {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Makes every key and certificate under `dir` (once: existing files are kept). The
/// API server's serving certificate names `service_ip` (the `kubernetes` Service) and
/// `advertised` (its address on the node network).
pub fn make(dir: &Path, service_ip: &str, advertised: &str) -> Result<()> {
    fs::create_dir_all(dir)?;
    if dir.join("done").exists() {
        return Ok(());
    }
    openssl(dir, &["genrsa", "-out", "ca.key", "2048"])?;
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-new",
            "-key",
            "ca.key",
            "-days",
            "3650",
            "-subj",
            "/CN=sliceway-lab-ca",
            "-out",
            "ca.crt",
        ],
    )?;
    let san = format!(
        "subjectAltName=IP:127.0.0.1,IP:{service_ip},IP:{advertised},DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
    );
    sign(dir, "apiserver", "/CN=kube-apiserver", Some(&san))?;
    for id in IDENTITIES {
        client(dir, id.file, id.user, id.groups)?;
    }
    openssl(dir, &["genrsa", "-out", "sa.key", "2048"])?;
    openssl(dir, &["rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub"])?;
    fs::write(dir.join("done"), "")?;
    Ok(())
}

/// Makes the client certificate `dir/FILE.crt` (and its key) of RBAC user `user` in
/// `groups`, signed by the lab's CA (after [`make`]).
pub fn client(dir: &Path, file: &str, user: &str, groups: &[&str]) -> Result<()> {
    let mut subj = String::new();
    for g in groups {
        subj.push_str(&format!("/O={g}"));
    }
    subj.push_str(&format!("/CN={user}"));
    sign(dir, file, &subj, None)
}

fn sign(dir: &Path, name: &str, subj: &str, san: Option<&str>) -> Result<()> {
    let key = format!("{name}.key");
    let csr = format!("{name}.csr");
    let crt = format!("{name}.crt");
    openssl(dir, &["genrsa", "-out", &key, "2048"])?;
    openssl(
        dir,
        &["req", "-new", "-key", &key, "-subj", subj, "-out", &csr],
    )?;
    let ext = format!("{name}.ext");
    let usage = if san.is_some() {
        "extendedKeyUsage=serverAuth"
    } else {
        "extendedKeyUsage=clientAuth"
    };
    fs::write(
        dir.join(&ext),
        format!(
            "{usage}\nkeyUsage=digitalSignature,keyEncipherment\n{}\n",
            san.unwrap_or("")
        ),
    )?;
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "3650",
            "-extfile",
            &ext,
            "-out",
            &crt,
        ],
    )
}

/// Writes a kubeconfig for `server` that authenticates with the client certificate of
/// `identity` (a name from [`IDENTITIES`]) or with a bearer `token`.
pub fn kubeconfig(
    pki: &Path,
    path: &Path,
    server: &str,
    identity: Option<&str>,
    token: Option<&str>,
) -> Result<PathBuf> {
    let user = match (identity, token) {
        (Some(id), _) => format!(
            "    client-certificate: {}\n    client-key: {}\n",
            pki.join(format!("{id}.crt")).display(),
            pki.join(format!("{id}.key")).display()
        ),
        (None, Some(t)) => format!("    token: {t}\n"),
        (None, None) => bail!("a kubeconfig needs a certificate or a token"),
    };
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: lab\n  cluster:\n    server: {server}\n    certificate-authority: {}\nusers:\n- name: lab\n  user:\n{user}contexts:\n- name: lab\n  context: {{cluster: lab, user: lab}}\ncurrent-context: lab\n",
        pki.join("ca.crt").display()
    );
    fs::write(path, text)?;
    Ok(path.to_path_buf())
}
