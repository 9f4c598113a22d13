//! Newly reported rank profiles go to the profile cache, keyed by the
//! hardware class of the node each rank ran on, so the next job on the same
//! hardware starts from a balanced plan.

use std::collections::BTreeMap;

use tracing::warn;

use super::state::JobState;
use super::Deps;
use crate::fetch::Observed;
use crate::profile_cache;
use crate::scrape::RankProfile;
use crate::validate::ValidatedJob;

/// Store `new` (rank → profile) in the cache and mark those ranks cached.
/// Failures are logged and counted.
pub async fn store(
    deps: &Deps<'_>,
    v: &ValidatedJob<'_>,
    obs: &Observed,
    st: &mut JobState,
    new: BTreeMap<usize, RankProfile>,
) {
    if new.is_empty() {
        return;
    }
    let spec = v.spec();
    let mut entries = BTreeMap::new();
    for (r, p) in &new {
        let Some(g) = v.layout.get(*r).and_then(|(gi, _)| spec.workers.get(*gi)) else {
            continue;
        };
        let node = obs
            .pods
            .iter()
            .find(|x| x.rank == Some(*r as u32))
            .and_then(|x| x.node_name.as_deref());
        if let Some(hw) = profile_cache::hardware_of(deps.client, node, g).await {
            entries.insert(
                profile_cache::key(&v.namespace, &hw, g, spec.model.as_ref()),
                p.into(),
            );
        }
        st.cached[*r] = true;
    }
    if let Err(e) =
        profile_cache::store(deps.client, &deps.config.operator_namespace, &entries).await
    {
        warn!(error = %e, "storing profiles in the cache failed");
        deps.metrics.error(e.metric_label());
    }
}
