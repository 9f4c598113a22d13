//! What a job may choose beyond its pods' shape, by the operator's flags:
//! the Prometheus servers it has the operator query, the ServiceAccount
//! its pods run as and the images they run. Creating a job must not grant
//! more than creating its pods would.

use heterotrain_crds::HeteroTrainingJobSpec;

use super::Problem;
use crate::names;

/// The operator's admission flags, read by [`check`](super::check).
#[derive(Clone, Copy, Debug, Default)]
pub struct Admission<'a> {
    pub prometheus: PrometheusPolicy<'a>,
    /// `--allow-service-account`: the ServiceAccounts a job's
    /// `serviceAccountName` may name (`*`: any); empty: any.
    pub service_accounts: &'a [String],
    /// `--allow-image`: image prefixes (a registry, a repository) a job's or
    /// group's `image` must start with; empty: any.
    pub images: &'a [String],
    /// `--allow-secret`: the Secrets of its namespace a job may read through
    /// `env`, `envFrom` or `volumes` (`*`: any); empty: any.
    pub secrets: &'a [String],
    /// `--no-custom-command`: jobs must run the built-in trainer (no
    /// `command` of their own).
    pub no_custom_command: bool,
}

impl Admission<'_> {
    /// Every problem of `spec` under these flags.
    pub fn problems(&self, spec: &HeteroTrainingJobSpec) -> Vec<Problem> {
        let mut out = Vec::new();
        if let Some(url) = &spec.load_balancing.prometheus_url {
            out.extend(self.prometheus.check(url));
        }
        let sas = self.service_accounts;
        if spec.service_account_name.is_some() && !sas.is_empty() {
            let sa = names::service_account(spec);
            if !sas.iter().any(|a| a == "*" || *a == sa) {
                out.push(Problem {
                    field: "spec.serviceAccountName".into(),
                    message: format!(
                        "ServiceAccount {sa:?} is not one this operator lets jobs use (allowed: {}); leave serviceAccountName unset, or ask the operator's administrator to add it to --allow-service-account (chart: operator.allowedServiceAccounts)",
                        sas.join(", ")
                    ),
                });
            }
        }
        let images = std::iter::once(("spec.image".to_string(), spec.image.as_deref())).chain(
            spec.workers
                .iter()
                .enumerate()
                .map(|(i, g)| (format!("spec.workers[{i}].image"), g.image.as_deref())),
        );
        for (field, image) in images {
            let Some(image) = image else { continue };
            if !self.images.is_empty() && !self.images.iter().any(|p| image_has_prefix(image, p)) {
                out.push(Problem {
                    field,
                    message: format!(
                        "image {image:?} is not from a source this operator allows ({}); use one of them, or ask the operator's administrator to add it to --allow-image (chart: operator.allowedImages)",
                        self.images.join(", ")
                    ),
                });
            }
        }
        out.extend(self.secret_problems(spec));
        if self.no_custom_command {
            let commands = std::iter::once(("spec.command".to_string(), &spec.command)).chain(
                spec.workers
                    .iter()
                    .enumerate()
                    .map(|(i, g)| (format!("spec.workers[{i}].command"), &g.command)),
            );
            for (field, _) in commands.filter(|(_, c)| !c.is_empty()) {
                out.push(Problem {
                    field,
                    message: "this operator runs only its built-in trainer (--no-custom-command, chart: operator.allowCustomCommands=false); remove the command".into(),
                });
            }
        }
        out
    }

    /// Secrets `spec` reads that [`Admission::secrets`] does not list.
    fn secret_problems(&self, spec: &HeteroTrainingJobSpec) -> Vec<Problem> {
        if self.secrets.is_empty() || self.secrets.iter().any(|s| s == "*") {
            return Vec::new();
        }
        let mut out = Vec::new();
        for (i, g) in spec.workers.iter().enumerate() {
            for (field, name) in secrets_read(g) {
                if !self.secrets.contains(&name) {
                    out.push(Problem {
                        field: format!("spec.workers[{i}].{field}"),
                        message: format!(
                            "Secret {name:?} is not one this operator lets jobs read (allowed: {}); use one of them, or ask the operator's administrator to add it to --allow-secret (chart: operator.allowedSecrets)",
                            self.secrets.join(", ")
                        ),
                    });
                }
            }
        }
        out
    }
}

/// `(field path within the group, Secret name)` for every Secret group `g`
/// reads: `env[].valueFrom.secretKeyRef`, `envFrom[].secretRef`, and
/// `volumes[]` of kind `secret` or `projected` with secret sources.
/// (`imagePullSecrets` are the kubelet's, never the trainer's, and are not
/// listed.)
pub fn secrets_read(g: &heterotrain_crds::WorkerGroup) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (j, e) in g.env.iter().enumerate() {
        if let Some(r) = e
            .value_from
            .as_ref()
            .and_then(|v| v.secret_key_ref.as_ref())
        {
            out.push((
                format!("env[{j}].valueFrom.secretKeyRef.name"),
                r.name.clone(),
            ));
        }
    }
    for (j, e) in g.env_from.iter().enumerate() {
        if let Some(r) = &e.secret_ref {
            out.push((format!("envFrom[{j}].secretRef.name"), r.name.clone()));
        }
    }
    for (j, v) in g.volumes.iter().enumerate() {
        if let Some(s) = &v.secret {
            out.push((
                format!("volumes[{j}].secret.secretName"),
                s.secret_name.clone().unwrap_or_default(),
            ));
        }
        let sources = v.projected.as_ref().and_then(|p| p.sources.as_ref());
        for (k, src) in sources.into_iter().flatten().enumerate() {
            if let Some(s) = &src.secret {
                out.push((
                    format!("volumes[{j}].projected.sources[{k}].secret.name"),
                    s.name.clone(),
                ));
            }
        }
    }
    out
}

/// Whether `image` starts with `prefix` at a boundary: the whole image, or
/// followed by `/`, `:` or `@` (or `prefix` itself ends with one), so
/// `ghcr.io/team` allows `ghcr.io/team/x:1` but not `ghcr.io/team-evil/x`.
pub fn image_has_prefix(image: &str, prefix: &str) -> bool {
    let Some(rest) = image.strip_prefix(prefix) else {
        return false;
    };
    rest.is_empty() || prefix.ends_with(['/', ':', '@']) || rest.starts_with(['/', ':', '@'])
}

/// Which Prometheus servers a job may have the operator query (the
/// operator's flags). A job's own `loadBalancing.prometheusUrl` must have
/// the origin (scheme, host, port) of `default_url` or of an `allowed`
/// entry: otherwise anyone who may create a job could make the operator
/// fetch from any address it can reach (a link-local metadata service,
/// say) and act on the answer.
#[derive(Clone, Copy, Debug, Default)]
pub struct PrometheusPolicy<'a> {
    /// `--prometheus-url`: jobs that name none use it.
    pub default_url: Option<&'a str>,
    /// `--allow-prometheus-url`: further origins a job may name.
    pub allowed: &'a [String],
}

/// `scheme://host[:port]` of an http(s) URL, lower-cased; `None` for any
/// other scheme, an empty host or user information (`user@host`).
pub fn origin(url: &str) -> Option<String> {
    let (scheme, rest) = url.trim().split_once("://")?;
    let scheme = scheme.to_ascii_lowercase();
    if scheme != "http" && scheme != "https" {
        return None;
    }
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    if authority.is_empty() || authority.contains('@') {
        return None;
    }
    Some(format!("{scheme}://{}", authority.to_ascii_lowercase()))
}

impl PrometheusPolicy<'_> {
    /// A job's own `prometheusUrl`: allowed when its origin is that of the
    /// operator's `--prometheus-url` or of an `--allow-prometheus-url` entry;
    /// otherwise the problem, with what to do.
    pub fn check(&self, url: &str) -> Option<Problem> {
        let problem = |message: String| Problem {
            field: "spec.loadBalancing.prometheusUrl".into(),
            message,
        };
        let Some(mine) = origin(url) else {
            return Some(problem(format!(
                "{url:?} is not an http(s) URL without user information, \
                 like http://prometheus.monitoring:9090"
            )));
        };
        let ok: Vec<String> = self
            .default_url
            .into_iter()
            .chain(self.allowed.iter().map(String::as_str))
            .filter_map(origin)
            .collect();
        if ok.contains(&mine) {
            return None;
        }
        let choices = if ok.is_empty() {
            "this operator allows none".to_string()
        } else {
            format!("allowed: {}", ok.join(", "))
        };
        Some(problem(format!(
            "{mine} is not a Prometheus this operator may query ({choices}); name an allowed \
             one, leave prometheusUrl unset to use the operator's --prometheus-url, or ask \
             the operator's administrator to add {mine} to --allow-prometheus-url (chart: \
             operator.allowedPrometheusUrls)"
        )))
    }
}
