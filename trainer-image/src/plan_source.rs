//! Where proposed batch plans come from. Rank 0 polls a `PlanSource` at each
//! step boundary; an accepted plan is then agreed with every rank over c10d
//! (see `control.rs`). A plan file is the source for runs without
//! Kubernetes; a ConfigMap watch or a local balancer plug in the same way.

use std::path::PathBuf;
use std::time::SystemTime;

use heterotrain_crds::{BatchPlan, PlanError};

/// A producer of proposed plans.
pub trait PlanSource {
    /// A newly proposed plan, if something changed since the last poll.
    /// Parse errors are returned so the caller can count and report them.
    fn poll(&mut self) -> Option<Result<BatchPlan, PlanError>>;
}

/// Never proposes anything (fixed plan).
pub struct NoPlanSource;

impl PlanSource for NoPlanSource {
    fn poll(&mut self) -> Option<Result<BatchPlan, PlanError>> {
        None
    }
}

/// Re-reads a JSON plan file whenever its modification time or size changes.
pub struct FilePlanSource {
    path: PathBuf,
    world_size: usize,
    seen: Option<(SystemTime, u64)>,
    last_text: Option<String>,
}

impl FilePlanSource {
    pub fn new(path: PathBuf, world_size: usize) -> Self {
        FilePlanSource {
            path,
            world_size,
            seen: None,
            last_text: None,
        }
    }

    /// Read and validate the file now (used at start, where an invalid plan
    /// is fatal).
    pub fn read_now(&mut self) -> Result<BatchPlan, String> {
        let text = std::fs::read_to_string(&self.path)
            .map_err(|e| format!("cannot read plan file {}: {e}", self.path.display()))?;
        self.seen = Self::stamp(&self.path);
        self.last_text = Some(text.clone());
        BatchPlan::parse(&text, self.world_size)
            .map_err(|e| format!("plan file {}: {e}", self.path.display()))
    }

    fn stamp(path: &PathBuf) -> Option<(SystemTime, u64)> {
        let m = std::fs::metadata(path).ok()?;
        Some((m.modified().ok()?, m.len()))
    }
}

impl PlanSource for FilePlanSource {
    fn poll(&mut self) -> Option<Result<BatchPlan, PlanError>> {
        let stamp = Self::stamp(&self.path)?;
        if self.seen == Some(stamp) {
            return None;
        }
        // A missing or unreadable file is "no proposal"; a writer mid-way
        // will be seen complete at a later poll.
        let text = std::fs::read_to_string(&self.path).ok()?;
        self.seen = Some(stamp);
        if self.last_text.as_deref() == Some(text.as_str()) {
            return None;
        }
        self.last_text = Some(text.clone());
        Some(BatchPlan::parse(&text, self.world_size))
    }
}

/// Rank 0's book-keeping of proposals: accepts newer valid plans, counts
/// refused ones.
#[derive(Debug, Default)]
pub struct PlanGate {
    /// Plans refused so far (invalid, wrong global batch, old generation).
    pub invalid_plans: u64,
    /// Why the last plan was refused.
    pub last_error: Option<String>,
    /// Stable label of the last refusal (metrics).
    pub last_reason: Option<&'static str>,
    /// The current plan is the built-in equal split, not one anybody wrote:
    /// a proposal of the same generation may replace it.
    pub current_is_default: bool,
    /// Smallest local batch a plan may give any rank (2 under per-rank
    /// BatchNorm); 0 or 1: no floor beyond the plan's own rules.
    pub min_local_batch: u32,
}

impl PlanGate {
    /// Why `p` gives some training rank fewer samples than the floor, if
    /// it does (0 leaves a rank out and is not below the floor).
    pub fn below_floor(&self, p: &BatchPlan) -> Option<String> {
        let (r, b) = p
            .batch_sizes
            .iter()
            .enumerate()
            .find(|(_, &b)| b > 0 && b < self.min_local_batch)?;
        Some(format!(
            "rank {r} would get {b} sample(s), below the minimum local batch {} (per-rank BatchNorm needs at least 2; use --batch-norm sync)",
            self.min_local_batch
        ))
    }
}

impl PlanGate {
    /// Decide on a proposal against the current plan. Returns the plan to
    /// switch to, or None (keeping the current one, with a warning unless
    /// the proposal is the current plan again).
    pub fn consider(
        &mut self,
        proposal: Result<BatchPlan, PlanError>,
        current: &BatchPlan,
        world_size: usize,
    ) -> Option<BatchPlan> {
        let refuse = |gate: &mut PlanGate, label: &'static str, why: String| {
            eprintln!(
                "warning: ignoring proposed plan, keeping generation {}: {why}",
                current.generation
            );
            gate.invalid_plans += 1;
            gate.last_error = Some(why);
            gate.last_reason = Some(label);
            None
        };
        match proposal {
            Err(e) => refuse(self, e.metric_label(), e.to_string()),
            Ok(p) => {
                if let Err(e) = p.validate_for(world_size, current.global_batch_size) {
                    return refuse(self, e.metric_label(), e.to_string());
                }
                if p.generation == current.generation && p.batch_sizes == current.batch_sizes {
                    return None;
                }
                if let Some(why) = self.below_floor(&p) {
                    return refuse(self, "below_min_local_batch", why);
                }
                let newer = p.generation > current.generation
                    || (self.current_is_default && p.generation == current.generation);
                if !newer {
                    return refuse(
                        self,
                        "old_generation",
                        format!(
                            "generation {} is not newer than the current {}",
                            p.generation, current.generation
                        ),
                    );
                }
                self.current_is_default = false;
                Some(p)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gate_keeps_current_plan_on_bad_proposals() {
        let cur = BatchPlan::equal(1, 32, 3);
        let mut g = PlanGate::default();
        assert!(g
            .consider(BatchPlan::parse("garbage", 3), &cur, 3)
            .is_none());
        let mut old = cur.clone();
        old.batch_sizes = vec![30, 1, 1];
        assert!(g.consider(Ok(old.clone()), &cur, 3).is_none());
        let mut other_b = BatchPlan::equal(2, 33, 3);
        other_b.generation = 5;
        assert!(g.consider(Ok(other_b), &cur, 3).is_none());
        assert_eq!(g.invalid_plans, 3);
        assert_eq!(g.last_reason, Some("global_mismatch"));
        // The current plan again: no change, no complaint.
        assert!(g.consider(Ok(cur.clone()), &cur, 3).is_none());
        assert_eq!(g.invalid_plans, 3);
        old.generation = 2;
        assert_eq!(
            g.consider(Ok(old), &cur, 3).unwrap().batch_sizes,
            vec![30, 1, 1]
        );
    }

    #[test]
    fn floor_refuses_plans_below_the_minimum_local_batch() {
        let cur = BatchPlan::equal(0, 12, 3);
        let mut g = PlanGate {
            min_local_batch: 2,
            ..Default::default()
        };
        let mut p = BatchPlan::equal(1, 12, 3);
        p.batch_sizes = vec![10, 1, 1];
        assert!(g.consider(Ok(p.clone()), &cur, 3).is_none());
        assert_eq!(g.last_reason, Some("below_min_local_batch"));
        p.batch_sizes = vec![8, 2, 2];
        assert_eq!(
            g.consider(Ok(p.clone()), &cur, 3).map(|p| p.batch_sizes),
            Some(vec![8, 2, 2])
        );
        // A rank left out (0) has no BatchNorm batch: not below the floor.
        p.generation = 2;
        p.batch_sizes = vec![10, 0, 2];
        assert_eq!(
            g.consider(Ok(p), &cur, 3).map(|p| p.batch_sizes),
            Some(vec![10, 0, 2])
        );
    }

    #[test]
    fn default_plan_yields_to_same_generation() {
        let cur = BatchPlan::equal(0, 8, 2);
        let mut p = cur.clone();
        p.batch_sizes = vec![6, 2];
        let mut g = PlanGate {
            current_is_default: true,
            ..Default::default()
        };
        assert_eq!(
            g.consider(Ok(p.clone()), &cur, 2).map(|p| p.batch_sizes),
            Some(vec![6, 2])
        );
        assert!(!g.current_is_default);
        let mut g = PlanGate::default();
        assert!(g.consider(Ok(p), &cur, 2).is_none());
        assert_eq!(g.last_reason, Some("old_generation"));
    }

    #[test]
    fn file_source_reports_changes_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("plan.json");
        std::fs::write(&path, BatchPlan::equal(0, 8, 2).to_json()).unwrap();
        let mut s = FilePlanSource::new(path.clone(), 2);
        assert_eq!(s.read_now().unwrap().batch_sizes, vec![4, 4]);
        assert!(s.poll().is_none());
        std::fs::write(&path, "{oops").unwrap();
        assert!(matches!(s.poll(), Some(Err(PlanError::Parse(_)))));
        assert!(s.poll().is_none());
    }
}
