//! Events for a plan that changes which ranks train: `RanksLeftOut` when it
//! gives ranks a local batch of 0, `RanksReadmitted` when it brings
//! left-out ranks back. Pure; the caller publishes them.

use heterotrain_crds::BatchPlan;

use crate::conditions::reasons;
use crate::events::EventSpec;

/// The membership Events of switching from `previous` to `next` (Normal;
/// none when the same ranks train). Each note names the ranks and carries
/// the plan's reason, which says why.
pub fn events(previous: &BatchPlan, next: &BatchPlan) -> Vec<EventSpec> {
    let was_out = previous.left_out();
    let now_out = next.left_out();
    let left: Vec<usize> = now_out
        .iter()
        .copied()
        .filter(|r| !was_out.contains(r))
        .collect();
    let back: Vec<usize> = was_out
        .iter()
        .copied()
        .filter(|&r| r < next.batch_sizes.len() && !now_out.contains(&r))
        .collect();
    let mut out = Vec::new();
    if !left.is_empty() {
        out.push(EventSpec {
            warning: false,
            reason: reasons::RANKS_LEFT_OUT.into(),
            note: format!(
                "plan generation {} leaves out {} (local batch 0: no samples, no part in the gradient exchange until re-admitted): {}",
                next.generation,
                named(&left),
                next.reason
            ),
        });
    }
    if !back.is_empty() {
        let batches: Vec<String> = back
            .iter()
            .map(|&r| format!("rank {r}: {}", next.batch_sizes[r]))
            .collect();
        out.push(EventSpec {
            warning: false,
            reason: reasons::RANKS_READMITTED.into(),
            note: format!(
                "plan generation {} re-admits {} ({}): {}",
                next.generation,
                named(&back),
                batches.join(", "),
                next.reason
            ),
        });
    }
    out
}

/// "rank 3" or "ranks 3, 5".
fn named(ranks: &[usize]) -> String {
    let list: Vec<String> = ranks.iter().map(usize::to_string).collect();
    if ranks.len() == 1 {
        format!("rank {}", list[0])
    } else {
        format!("ranks {}", list.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(generation: u64, batch_sizes: &[u32], reason: &str) -> BatchPlan {
        BatchPlan {
            generation,
            global_batch_size: batch_sizes.iter().sum(),
            batch_sizes: batch_sizes.to_vec(),
            policy: "dynamic".into(),
            reason: reason.into(),
            predicted_step_seconds: None,
            predicted_communication_seconds: None,
        }
    }

    #[test]
    fn leaving_out_and_readmitting_ranks_are_reported() {
        let all = plan(4, &[30, 30, 30, 30], "r4");
        let out = plan(5, &[40, 40, 40, 0], "rank 3 left out: its fixed cost 0.400 s/step exceeds the 0.0500 s step the others reach without it");
        let e = events(&all, &out);
        assert_eq!(e.len(), 1);
        assert!(!e[0].warning);
        assert_eq!(e[0].reason, "RanksLeftOut");
        assert!(
            e[0].note
                .starts_with("plan generation 5 leaves out rank 3 (local batch 0"),
            "{}",
            e[0].note
        );
        assert!(
            e[0].note.ends_with("the others reach without it"),
            "{}",
            e[0].note
        );

        let back = plan(6, &[39, 40, 40, 1], "rank 3 re-admitted with batch 1");
        let e = events(&out, &back);
        assert_eq!(e.len(), 1);
        assert_eq!(e[0].reason, "RanksReadmitted");
        assert_eq!(
            e[0].note,
            "plan generation 6 re-admits rank 3 (rank 3: 1): rank 3 re-admitted with batch 1"
        );
    }

    #[test]
    fn both_at_once_and_nothing_when_membership_is_unchanged() {
        let a = plan(1, &[40, 0, 40, 40], "a");
        let b = plan(2, &[40, 40, 0, 0], "b");
        let e = events(&a, &b);
        let reasons: Vec<&str> = e.iter().map(|x| x.reason.as_str()).collect();
        assert_eq!(reasons, ["RanksLeftOut", "RanksReadmitted"]);
        assert!(e[0].note.contains("leaves out ranks 2, 3"), "{}", e[0].note);
        assert!(
            e[1].note.contains("re-admits rank 1 (rank 1: 40)"),
            "{}",
            e[1].note
        );
        assert!(events(&a, &plan(3, &[50, 0, 30, 40], "c")).is_empty());
        assert!(events(&plan(1, &[60, 60], "x"), &plan(2, &[70, 50], "y")).is_empty());
    }
}
