//! The balancing loop of one running job: every scrape interval read each
//! rank's metrics, feed the balancer; every rebalance interval decide, and
//! when a new plan comes out write generation+1, emit `Rebalanced` and
//! record the decision and balance quality for status.

use std::collections::BTreeMap;
use std::time::Instant;

use heterotrain_crds::{
    BalanceStatus, BatchPlan, HeteroTrainingJob, MetricsSource, RebalanceStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use tracing::{info, warn};

use crate::balance::JobBalancer;
use crate::conditions::{reasons, types, Desired};
use crate::config::MetricsSourceMode;
use crate::controller::Context;
use crate::error::{Error, Result};
use crate::fetch::Observed;
use crate::lifecycle::EventSpec;
use crate::metrics::PolicyLabel;
use crate::scrape::RankMetrics;
use crate::status::Extras;
use crate::{apply, profile_cache};

/// Balancing state of one job's current gang.
pub struct JobState {
    uid: String,
    gang: u32,
    balancer: JobBalancer,
    last_scrape: Option<Instant>,
    last_decision: Option<Instant>,
    last_samples: Vec<Option<(f64, Instant)>>,
    /// Plan written and not yet reported by every rank: (generation, when).
    pending: Option<(u64, Instant)>,
    cached: Vec<bool>,
    extras: Extras,
}

impl JobState {
    /// Last measured figures, over `base` (whose plan wins).
    pub fn carry(&self, base: Extras) -> Extras {
        Extras {
            plan: base.plan.or_else(|| self.extras.plan.clone()),
            ..self.extras.clone()
        }
    }
}

fn state_key(job: &HeteroTrainingJob) -> String {
    format!("{}/{}", job.namespace().unwrap_or_default(), job.name_any())
}

/// One balancing round for a job whose ranks all run. Never fails: problems
/// are logged and counted, and the figures from before are kept.
pub async fn round(ctx: &Context, job: &HeteroTrainingJob, obs: &Observed, base: Extras) -> Extras {
    let key = state_key(job);
    let uid = job.uid().unwrap_or_default();
    let gang = job.status.as_ref().map_or(0, |s| s.restarts);
    let taken = ctx.jobs.lock().ok().and_then(|mut j| j.remove(&key));
    let mut state = match taken {
        Some(s) if s.uid == uid && s.gang == gang => s,
        _ => match JobBalancer::new(&job.spec, ctx.config.balancer_window) {
            Ok(balancer) => {
                let world = job.spec.world_size() as usize;
                JobState {
                    uid,
                    gang,
                    balancer,
                    last_scrape: None,
                    // The first decision waits one interval for live data.
                    last_decision: Some(Instant::now()),
                    last_samples: vec![None; world],
                    pending: None,
                    cached: vec![false; world],
                    extras: Extras::default(),
                }
            }
            Err(e) => {
                warn!(error = %e, "balancer refused the job's settings");
                ctx.metrics.error("balancer");
                return base;
            }
        },
    };
    let out = step(ctx, job, obs, base, &mut state).await;
    state.extras = out.clone();
    if let Ok(mut j) = ctx.jobs.lock() {
        j.insert(key, state);
    }
    out
}

async fn read_metrics(
    ctx: &Context,
    job: &HeteroTrainingJob,
    obs: &Observed,
) -> Vec<Result<RankMetrics>> {
    let spec = &job.spec;
    let world = spec.world_size() as usize;
    let gang = job.status.as_ref().map_or(0, |s| s.restarts);
    let use_prometheus = match ctx.config.metrics_source {
        MetricsSourceMode::Job => spec.load_balancing.metrics_source == MetricsSource::Prometheus,
        MetricsSourceMode::Pods => false,
        MetricsSourceMode::Prometheus => true,
    };
    if use_prometheus {
        let url = spec
            .load_balancing
            .prometheus_url
            .clone()
            .or_else(|| ctx.config.prometheus_url.clone());
        let Some(url) = url else {
            return (0..world)
                .map(|_| Err(Error::Invalid("no Prometheus URL".into())))
                .collect();
        };
        let ns = job.namespace().unwrap_or_default();
        return match ctx
            .scraper
            .query_prometheus(&url, &ns, &job.name_any(), world)
            .await
        {
            Ok(v) => v,
            Err(e) => {
                let msg = e.to_string();
                (0..world)
                    .map(|_| {
                        Err(Error::Scrape {
                            target: url.clone(),
                            message: msg.clone(),
                        })
                    })
                    .collect()
            }
        };
    }
    let targets: Vec<Option<String>> = (0..world as u32)
        .map(|r| {
            obs.pods
                .iter()
                .find(|p| p.rank == Some(r) && p.restart == Some(gang) && !p.deleting)
                .and_then(|p| p.pod_ip.clone())
        })
        .collect();
    ctx.scraper.scrape_pods(&targets, spec.metrics_port).await
}

async fn step(
    ctx: &Context,
    job: &HeteroTrainingJob,
    obs: &Observed,
    base: Extras,
    st: &mut JobState,
) -> Extras {
    let mut x = st.carry(base);
    let cfg = &ctx.config;
    let due = st
        .last_scrape
        .is_none_or(|t| t.elapsed() >= cfg.scrape_interval.mul_f64(0.8));
    if !due {
        return x;
    }
    st.last_scrape = Some(Instant::now());
    let spec = &job.spec;
    let world = spec.world_size() as usize;
    let results = read_metrics(ctx, job, obs).await;
    let mut sps: Vec<Option<f64>> = vec![None; world];
    let mut gens: Vec<Option<u64>> = vec![None; world];
    let mut new_profiles = BTreeMap::new();
    let mut sampled = 0usize;
    for (r, res) in results.iter().enumerate().take(world) {
        match res {
            Ok(m) => {
                let had_profile = st.balancer.profiles().get(r).is_some_and(Option::is_some);
                sampled += usize::from(st.balancer.observe(r, m));
                gens[r] = m.plan_generation;
                if r == 0 {
                    x.step = m.step.or(x.step);
                    x.epoch = m.epoch.or(x.epoch);
                }
                if let Some(total) = m.samples_total {
                    if let Some((prev, t)) = st.last_samples[r] {
                        let dt = t.elapsed().as_secs_f64();
                        if total >= prev && dt > 0.0 {
                            sps[r] = Some((total - prev) / dt);
                        }
                    }
                    st.last_samples[r] = Some((total, Instant::now()));
                }
                if !had_profile && cfg.profile_cache && !st.cached[r] {
                    if let Some(p) = st.balancer.profiles().get(r).cloned().flatten() {
                        new_profiles.insert(r, p);
                    }
                }
            }
            Err(e) => {
                ctx.metrics.scrape_failures.inc();
                tracing::debug!(rank = r, error = %e, "metrics not read");
                st.balancer.missing(r);
            }
        }
    }
    if sps.iter().any(Option::is_some) {
        x.rank_samples_per_second = sps.clone();
        x.cluster_samples_per_second = Some(sps.iter().flatten().sum());
    }
    let q = st.balancer.quality();
    if sampled > 0 {
        x.balance = Some(BalanceStatus {
            cv_percent: q.cv_percent,
            class: q.class.as_str().into(),
        });
    }
    if let Some((g, t)) = st.pending {
        if gens.iter().all(|v| v.is_some_and(|v| v >= g)) {
            ctx.metrics
                .plan_propagation
                .observe(t.elapsed().as_secs_f64());
            st.pending = None;
        }
    }
    store_profiles(ctx, job, obs, st, new_profiles).await;

    x.conditions.clear();
    if spec.profiling.enabled {
        let n = st
            .balancer
            .profiles()
            .iter()
            .filter(|p| p.is_some())
            .count();
        x.conditions.push(if n == world {
            Desired::yes(
                types::PROFILED,
                reasons::PROFILES_REPORTED,
                format!("all {world} ranks reported their profile"),
            )
        } else {
            Desired::no(
                types::PROFILED,
                reasons::AWAITING_PROFILES,
                format!("{n} of {world} ranks reported their profile"),
            )
        });
    }

    let decide_due = st
        .last_decision
        .is_none_or(|t| t.elapsed() >= cfg.rebalance_interval.mul_f64(0.95));
    if !decide_due {
        return x;
    }
    st.last_decision = Some(Instant::now());
    let current = x
        .plan
        .clone()
        .unwrap_or_else(|| BatchPlan::equal(0, spec.training.global_batch_size, world));
    let round = match st.balancer.decide(&current) {
        Ok(r) => r,
        Err(e) => {
            warn!(error = %e, "balancer could not decide");
            ctx.metrics.error(Error::from(e).metric_label());
            return x;
        }
    };
    let Some(new) = round.plan else {
        tracing::debug!(reason = %round.reason, "keeping the plan");
        return x;
    };
    let gain = new.gain_percent;
    let policy = new.policy;
    let plan = new.into_plan(&current);
    if let Err(e) = plan.validate_for(world, spec.training.global_batch_size) {
        warn!(error = %e, "balancer produced an invalid plan; not writing it");
        ctx.metrics.error("invalid_plan");
        return x;
    }
    if let Err(e) = apply::write_plan(&ctx.client, job, &plan).await {
        warn!(error = %e, "writing the plan failed");
        ctx.metrics.error(e.metric_label());
        st.last_decision = None;
        return x;
    }
    ctx.metrics
        .rebalances
        .get_or_create(&PolicyLabel {
            policy: policy.into(),
        })
        .inc();
    st.pending = Some((plan.generation, Instant::now()));
    let note = format!(
        "plan generation {}: batches {:?}; predicted gain {gain:.1}%; {}",
        plan.generation, plan.batch_sizes, plan.reason
    );
    info!(job = %job.name_any(), "{note}");
    ctx.event(
        job,
        &EventSpec {
            warning: false,
            reason: reasons::REBALANCED.into(),
            note: note.clone(),
        },
    )
    .await;
    x.conditions.push(Desired::yes(
        types::REBALANCED,
        reasons::REBALANCED,
        format!(
            "plan generation {} written: {:?}",
            plan.generation, plan.batch_sizes
        ),
    ));
    x.last_rebalance = Some(RebalanceStatus {
        generation: plan.generation,
        time: Some(Time(Timestamp::now())),
        reason: plan.reason.clone(),
        predicted_gain_percent: crate::status::round3(gain),
        batch_sizes: plan.batch_sizes.clone(),
    });
    x.plan = Some(plan);
    x
}

async fn store_profiles(
    ctx: &Context,
    job: &HeteroTrainingJob,
    obs: &Observed,
    st: &mut JobState,
    new: BTreeMap<usize, crate::scrape::RankProfile>,
) {
    if new.is_empty() {
        return;
    }
    let layout = job.spec.rank_layout();
    let mut entries = BTreeMap::new();
    for (r, p) in &new {
        let Some(g) = layout.get(*r).and_then(|(gi, _)| job.spec.workers.get(*gi)) else {
            continue;
        };
        let node = obs
            .pods
            .iter()
            .find(|x| x.rank == Some(*r as u32))
            .and_then(|x| x.node_name.as_deref());
        if let Some(acc) = profile_cache::accelerator_of(&ctx.client, node, g).await {
            entries.insert(
                profile_cache::key(&acc, g.device, &job.spec.model),
                p.into(),
            );
        }
        st.cached[*r] = true;
    }
    if let Err(e) =
        profile_cache::store(&ctx.client, &ctx.config.operator_namespace, &entries).await
    {
        warn!(error = %e, "storing profiles in the cache failed");
        ctx.metrics.error(e.metric_label());
    }
}
