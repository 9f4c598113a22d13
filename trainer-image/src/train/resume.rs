//! Resume: rank 0 finds and loads this run's newest good checkpoint; what
//! it loaded (weights, optimizer state, position) is broadcast, so ranks
//! need no shared filesystem.

use crate::checkpoint;
use crate::cli::ResumeMode;
use crate::error::{Result, TrainerError};
use crate::sampler::SamplerPosition;

use super::setup::broadcast_all;
use super::Trainer;

/// Where a resumed run starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct ResumeState {
    pub step: u64,
    pub position: SamplerPosition,
    pub optimizer_steps: u64,
}

impl ResumeState {
    /// As the five integers rank 0 broadcasts (a leading 0: no resume).
    pub fn encode(state: Option<ResumeState>) -> [i64; 5] {
        match state {
            None => [0; 5],
            Some(s) => [
                1,
                s.step as i64,
                s.position.epoch as i64,
                s.position.step_in_epoch as i64,
                s.optimizer_steps as i64,
            ],
        }
    }

    pub fn decode(v: &[i64]) -> Option<ResumeState> {
        match v {
            [1, step, epoch, in_epoch, opt] => Some(ResumeState {
                step: *step as u64,
                position: SamplerPosition {
                    epoch: *epoch as u64,
                    step_in_epoch: *in_epoch as u64,
                },
                optimizer_steps: *opt as u64,
            }),
            _ => None,
        }
    }
}

impl Trainer<'_> {
    /// Every rank: start from rank 0's checkpoint when it found one, and
    /// from rank 0's initial weights in any case.
    pub(super) fn resume(&mut self) -> Result<()> {
        let found = if self.cfg.dist.rank == 0 && self.cfg.output.resume == ResumeMode::Auto {
            self.load_checkpoint()?
        } else {
            None
        };
        let mut t = tch::Tensor::from_slice(&ResumeState::encode(found));
        if let Some(pg) = self.pg {
            pg.broadcast(&mut t, 0)?;
        }
        let state = ResumeState::decode(&Vec::<i64>::try_from(&t).unwrap_or_default());
        broadcast_all(self.pg, &self.p.all_vars)?;
        if let Some(s) = state {
            let whole = self.whole_optimizer_state(None)?;
            broadcast_all(self.pg, &whole)?;
            self.step = s.step;
            self.pos = s.position;
            self.opt.steps = s.optimizer_steps;
        }
        Ok(())
    }

    /// Rank 0: load the newest checkpoint of this run. Others are skipped,
    /// one that fails to load falls back to the next older one (each with
    /// a warning).
    fn load_checkpoint(&mut self) -> Result<Option<ResumeState>> {
        let Some(dir) = &self.cfg.output.checkpoint_dir else {
            return Ok(None);
        };
        let fingerprint = &self.p.fingerprint;
        // The optimizer is whole (replicated) until the first step, so
        // these names are views of its own state.
        let optim_state = self.whole_optimizer_state(None)?;
        let steps_per_epoch = self.p.steps_per_epoch;
        let all_vars = &self.p.all_vars;
        let load = |dir: &std::path::Path, m: &checkpoint::Manifest| {
            // A manifest from a run over more samples (version 1 has no
            // fingerprint to tell) or edited by hand: its position is not
            // one of this run's steps.
            if m.position.step_in_epoch >= steps_per_epoch {
                return Err(TrainerError::Checkpoint(format!(
                    "its position (step {} of epoch {}) is past this run's {steps_per_epoch} steps per epoch",
                    m.position.step_in_epoch, m.position.epoch
                )));
            }
            checkpoint::load_files(dir, &[(&m.weights, all_vars), (&m.optimizer, &optim_state)])
        };
        let mut found = checkpoint::resume(dir, fingerprint, |m| load(dir, m));
        if found.is_none() {
            if let Some(from) = &self.cfg.output.resume_from {
                // This run has nothing of its own yet: continue the earlier
                // run, or fail rather than quietly start over.
                found = checkpoint::resume_earlier(from, fingerprint, |m| load(from, m));
                let Some(m) = &found else {
                    return Err(TrainerError::Checkpoint(format!(
                        "--resume-from {}: no checkpoint there matches this run (model, data, batch size, optimizer and world size; the warnings above say what differs); fix checkpoint.resumeFrom or remove it to start from step 0",
                        from.display()
                    )));
                };
                eprintln!(
                    "rank 0: continuing an earlier run: its checkpoint at step {} in {}",
                    m.step,
                    from.display()
                );
            }
        }
        let Some(m) = found else {
            eprintln!(
                "rank 0: no checkpoint of this run (fingerprint {}) in {}; starting from step 0",
                fingerprint.hash(),
                dir.display()
            );
            return Ok(None);
        };
        eprintln!(
            "rank 0: resuming from checkpoint at step {} (fingerprint {})",
            m.step,
            fingerprint.hash()
        );
        if m.plan
            .validate_for(self.cfg.dist.world_size, self.cfg.optim.batch_size)
            .is_ok()
            && self.gate.below_floor(&m.plan).is_none()
            && m.plan.generation > self.plan.generation
        {
            self.plan = m.plan.clone();
        }
        Ok(Some(ResumeState {
            step: m.step,
            position: m.position,
            optimizer_steps: m.optimizer_steps,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resume_state_round_trips_and_absence_is_none() {
        let s = ResumeState {
            step: 40,
            position: SamplerPosition {
                epoch: 3,
                step_in_epoch: 7,
            },
            optimizer_steps: 39,
        };
        assert_eq!(ResumeState::decode(&ResumeState::encode(Some(s))), Some(s));
        assert_eq!(ResumeState::decode(&ResumeState::encode(None)), None);
        assert_eq!(ResumeState::decode(&[1, 2, 3]), None);
    }
}
