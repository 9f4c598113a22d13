//! How clients reach the control plane: the admin token, kubeconfigs for
//! any token (the CA inlined as base64) and clients built from them.

use std::path::PathBuf;

use anyhow::Result;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::Client;

use super::LocalCluster;

/// A fresh random bearer token (hex).
pub(super) fn random_token() -> Result<String> {
    use std::io::Read;
    let mut buf = [0u8; 16];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut buf)?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

impl LocalCluster {
    /// The admin kubeconfig (token in `system:masters`).
    pub fn kubeconfig_path(&self) -> PathBuf {
        self.state_dir.join("kubeconfig")
    }

    /// CA certificate that signed the API server's serving certificate.
    pub fn ca_path(&self) -> PathBuf {
        self.state_dir.join("pki").join("ca.crt")
    }

    /// A kubeconfig document authenticating with `token`.
    pub fn kubeconfig_yaml(&self, token: &str) -> String {
        (self.kubeconfig_renderer())(token)
    }

    /// A kubeconfig for `token` that reaches the API server through
    /// 127.0.0.1:`port` (a proxy in front of it; the server's certificate
    /// is valid for 127.0.0.1 whatever the port).
    pub fn kubeconfig_yaml_via(&self, port: u16, token: &str) -> String {
        self.kubeconfig_yaml(token).replace(
            &format!("server: {}", self.server_url()),
            &format!("server: https://127.0.0.1:{port}"),
        )
    }

    /// The API server's audit log: the operator ServiceAccounts' writes.
    pub fn audit_log_path(&self) -> std::path::PathBuf {
        self.state_dir().join("logs").join("audit.log")
    }

    /// A function rendering kubeconfigs for tokens, detached from `self`
    /// (for the node simulator, which writes one per pod).
    pub fn kubeconfig_renderer(&self) -> impl Fn(&str) -> String + Send + Sync + 'static {
        let ca = std::fs::read(self.ca_path()).unwrap_or_default();
        let ca_b64 = base64_encode(&ca);
        let server = self.server_url();
        move |token: &str| {
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: heterotrain-local\n  cluster:\n    server: {server}\n    certificate-authority-data: {ca_b64}\nusers:\n- name: user\n  user:\n    token: {token}\ncontexts:\n- name: heterotrain-local\n  context:\n    cluster: heterotrain-local\n    user: user\ncurrent-context: heterotrain-local\n"
            )
        }
    }

    /// What the node simulator hands its pods to reach this API server.
    pub fn pod_api_access(&self) -> crate::nodesim::PodApiAccess {
        crate::nodesim::PodApiAccess {
            kubeconfig_for_token: Box::new(self.kubeconfig_renderer()),
            host: "127.0.0.1".into(),
            port: self.ports.apiserver,
            ca_pem: std::fs::read(self.ca_path()).unwrap_or_default(),
        }
    }

    /// A client authenticating as the admin.
    pub async fn client(&self) -> Result<Client> {
        self.client_for_token(&self.admin_token).await
    }

    /// A client authenticating with `token` (e.g. a ServiceAccount token, so RBAC applies).
    pub async fn client_for_token(&self, token: &str) -> Result<Client> {
        let kc = Kubeconfig::from_yaml(&self.kubeconfig_yaml(token))?;
        let config =
            kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?;
        Ok(Client::try_from(config)?)
    }
}

/// Standard base64 (for kubeconfig `*-data` fields).
pub fn base64_encode(data: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        out.push(T[(n >> 18) as usize & 63] as char);
        out.push(T[(n >> 12) as usize & 63] as char);
        out.push(if chunk.len() > 1 {
            T[(n >> 6) as usize & 63] as char
        } else {
            '='
        });
        out.push(if chunk.len() > 2 {
            T[n as usize & 63] as char
        } else {
            '='
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::base64_encode;

    #[test]
    fn base64_matches_rfc4648_vectors() {
        for (i, o) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64_encode(i.as_bytes()), o);
        }
    }
}
