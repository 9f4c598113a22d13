//! Who may read the operator's `/metrics`, the Kubernetes way (as
//! kube-rbac-proxy and controller-runtime's filter do): the request's
//! bearer token is checked with a TokenReview, and the user it names must
//! be allowed `get` on the non-resource URL `/metrics` (a
//! SubjectAccessReview; the chart's `<release>-metrics-reader` ClusterRole
//! grants it). Answers are cached for a short while by a keyed hash of the
//! token (never the token itself). `/healthz` and `/readyz` stay open for
//! the kubelet's probes.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};
use kube::Client;

/// How long an allowed token stays allowed without asking again.
const ALLOWED_FOR: Duration = Duration::from_secs(60);
/// How long a refused token stays refused.
const REFUSED_FOR: Duration = Duration::from_secs(10);
/// The most tokens remembered (the cache is emptied when full).
const CACHE_MAX: usize = 1024;

/// Why a request is refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// No usable bearer token, or one the API server does not accept (401).
    Unauthenticated(String),
    /// A valid token whose user may not read `/metrics` (403).
    Forbidden(String),
}

/// Answers by token hash, with when each was given.
type Answers = HashMap<u64, (Instant, Result<(), Refusal>)>;

/// The check of `/metrics` requests.
pub struct MetricsAuth {
    client: Client,
    keys: std::collections::hash_map::RandomState,
    cache: Mutex<Answers>,
}

impl std::fmt::Debug for MetricsAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MetricsAuth")
    }
}

/// The token of an `Authorization: Bearer <token>` header.
pub fn bearer(header: Option<&str>) -> Option<&str> {
    let v = header?.trim();
    let (scheme, token) = v.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

impl MetricsAuth {
    /// Check tokens against the API server `client` reaches (as the
    /// operator: it needs `create` on tokenreviews and subjectaccessreviews).
    pub fn new(client: Client) -> MetricsAuth {
        MetricsAuth {
            client,
            keys: Default::default(),
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// Whether the request with `authorization` header may read `/metrics`.
    pub async fn check(&self, authorization: Option<&str>) -> Result<(), Refusal> {
        let Some(token) = bearer(authorization) else {
            return Err(Refusal::Unauthenticated(
                "send a ServiceAccount token: Authorization: Bearer <token>".into(),
            ));
        };
        let key = self.keys.hash_one(token);
        let now = Instant::now();
        if let Some((at, answer)) = self.cache.lock().ok().and_then(|c| c.get(&key).cloned()) {
            let ttl = if answer.is_ok() {
                ALLOWED_FOR
            } else {
                REFUSED_FOR
            };
            if now.duration_since(at) < ttl {
                return answer;
            }
        }
        let answer = self.ask(token).await;
        if let Ok(mut c) = self.cache.lock() {
            if c.len() >= CACHE_MAX {
                c.clear();
            }
            c.insert(key, (now, answer.clone()));
        }
        answer
    }

    async fn ask(&self, token: &str) -> Result<(), Refusal> {
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: token.to_string(),
                audiences: None,
            },
            ..Default::default()
        };
        let reviewed = Api::<TokenReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| {
                tracing::warn!(error = %e, "/metrics: the TokenReview failed");
                Refusal::Unauthenticated("the token could not be reviewed".into())
            })?;
        let status = reviewed.status.unwrap_or_default();
        let user = match (status.authenticated, status.user) {
            (Some(true), Some(u)) => u,
            _ => {
                return Err(Refusal::Unauthenticated(
                    "the API server does not accept this token".into(),
                ))
            }
        };
        let name = user.username.clone().unwrap_or_default();
        let access = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: user.username,
                groups: user.groups,
                uid: user.uid,
                extra: user.extra,
                non_resource_attributes: Some(NonResourceAttributes {
                    path: Some("/metrics".into()),
                    verb: Some("get".into()),
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let answer = Api::<SubjectAccessReview>::all(self.client.clone())
            .create(&PostParams::default(), &access)
            .await
            .map_err(|e| {
                tracing::warn!(error = %e, "/metrics: the SubjectAccessReview failed");
                Refusal::Forbidden("access could not be reviewed".into())
            })?;
        if answer.status.is_some_and(|s| s.allowed) {
            Ok(())
        } else {
            Err(Refusal::Forbidden(format!(
                "{name} may not get /metrics (bind it to the chart's metrics-reader ClusterRole)"
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::bearer;

    #[test]
    fn only_a_bearer_token_is_taken() {
        assert_eq!(bearer(Some("Bearer abc")), Some("abc"));
        assert_eq!(bearer(Some("bearer  abc ")), Some("abc"));
        assert_eq!(bearer(Some("Basic dXNlcjpw")), None);
        assert_eq!(bearer(Some("Bearer ")), None);
        assert_eq!(bearer(Some("Bearer")), None);
        assert_eq!(bearer(None), None);
    }
}
