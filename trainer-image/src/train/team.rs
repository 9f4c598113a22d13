//! Who trains under the current plan. A plan may give a rank other than 0
//! no samples: that rank is left out of the gradient exchange. The members
//! (local batch ≥ 1) run the Reducer and synchronised BatchNorm on a
//! sub-group of their own, built once per membership and kept for the run;
//! the step-boundary agreement, the loss, the optimizer state's moves,
//! evaluation and checkpoints stay on the whole group. A left-out rank's
//! parameters go stale: it catches up from rank 0 (always a member) when
//! it comes back and at the end of the run (it evaluates nothing: the
//! held-out split is shared in proportion to the local batches).

use typed_arena::Arena;

use crate::c10d::ProcessGroup;
use crate::error::Result;

/// The members of the current plan and this rank's group among them.
pub(super) struct Team<'a> {
    /// The whole job's group (none: one process).
    full: Option<&'a ProcessGroup>,
    /// Where sub-groups live for the rest of the run.
    arena: &'a Arena<ProcessGroup>,
    /// Sub-groups built so far, by membership (this rank's only).
    built: Vec<(Vec<usize>, &'a ProcessGroup)>,
    world: usize,
    /// The ranks that train, ascending.
    members: Vec<usize>,
    /// This rank's group among the members (none: left out, the only
    /// member, or one process).
    group: Option<&'a ProcessGroup>,
}

impl<'a> Team<'a> {
    /// Every rank a member, on the whole group.
    pub fn new(
        full: Option<&'a ProcessGroup>,
        arena: &'a Arena<ProcessGroup>,
        world: usize,
    ) -> Self {
        Team {
            full,
            arena,
            built: Vec::new(),
            world,
            members: (0..world).collect(),
            group: full,
        }
    }

    pub fn members(&self) -> &[usize] {
        &self.members
    }

    /// This rank's group among the members, if it is one (and not alone).
    pub fn group(&self) -> Option<&'a ProcessGroup> {
        self.group
    }

    /// Whether every rank trains.
    pub fn everyone(&self) -> bool {
        self.members.len() == self.world
    }

    /// Switch to `members` (ascending). Members of a new membership build
    /// its group together the first time; the others take no part.
    pub fn switch(&mut self, rank: usize, members: Vec<usize>) -> Result<()> {
        self.group = match self.full {
            None => None,
            Some(full) if members.len() == self.world => Some(full),
            Some(_) if !members.contains(&rank) => None,
            // Alone: its gradients are already the sum; nothing to exchange.
            Some(_) if members.len() == 1 => None,
            Some(full) => Some(match self.built.iter().find(|(m, _)| *m == members) {
                Some(&(_, g)) => g,
                None => {
                    let g: &'a ProcessGroup = self.arena.alloc(full.subgroup(&members)?);
                    self.built.push((members.clone(), g));
                    g
                }
            }),
        };
        self.members = members;
        Ok(())
    }
}
