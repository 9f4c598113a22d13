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
        out
    }
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
