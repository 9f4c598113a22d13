//! What holds a leave-out trial back before its candidate is weighed: a
//! rank whose compute ran over its model ([`compute_outrun`]), a step not
//! yet steady ([`steady`]).

use crate::rank::RankState;
use crate::text::secs;
use crate::StepModel;

/// A training rank whose compute over the interval that ran `current`
/// ran more than `margin`% over what its model predicts at its batch: the
/// one that ran furthest over, with its measured mean and its prediction.
/// A slowdown (a throttle, a busy neighbour) shows there a decision or two
/// before the live model re-fits; until then the measured step runs over
/// the predicted compute step because of compute, not of time the models
/// cannot see, and a leave-out trial would test the wrong rank.
pub(crate) fn compute_outrun(
    ranks: &[RankState],
    predict: &[StepModel],
    current: &[u32],
    margin: u32,
) -> Option<(usize, f64, f64)> {
    let over = 1.0 + f64::from(margin.min(100)) / 100.0;
    ranks
        .iter()
        .zip(predict)
        .zip(current)
        .enumerate()
        .filter(|(_, ((r, _), &b))| b > 0 && r.compute_time.1 > 0)
        .filter_map(|(i, ((r, model), &b))| {
            let measured = r.compute_time.0 / f64::from(r.compute_time.1);
            let predicted = model.predict(b);
            (measured.is_finite() && predicted > 0.0 && measured > over * predicted)
                .then_some((i, measured, predicted))
        })
        .max_by(|p, q| (p.1 / p.2).total_cmp(&(q.1 / q.2)))
}

/// The note for a trial held back by [`compute_outrun`].
pub(crate) fn outrun_note((rank, measured, predicted): (usize, f64, f64), margin: u32) -> String {
    format!(
        "leave-out trials wait: rank {rank}'s compute over the interval, {}, is {:.2}× its model's {} (more than leaveOutMarginPercent {margin}% over), so the step ran long on compute the models have not caught up with yet",
        secs(measured),
        measured / predicted,
        secs(predicted)
    )
}

/// Whether the step `w` measured over the interval that ran `current` is
/// within `margin`% of the step measured over the interval before it, at
/// the same plan (`previous`). A slowdown that began within this interval
/// (a throttle, a busy neighbour) moves the step before the models catch
/// up; only an excess seen twice in a row is the steady cost a leave-out
/// trial tests. `Err` says why not: no previous interval at this plan
/// (`None`), or the step it measured.
pub(crate) fn steady(
    previous: Option<&(Vec<u32>, f64)>,
    current: &[u32],
    w: f64,
    margin: u32,
) -> Result<(), Option<f64>> {
    match previous {
        Some((plan, before)) if plan.as_slice() == current => {
            if (w - before).abs() <= f64::from(margin.min(100)) / 100.0 * before {
                Ok(())
            } else {
                Err(Some(*before))
            }
        }
        _ => Err(None),
    }
}

/// The note for a trial of `rank` held back by [`steady`].
pub(crate) fn unsteady_note(rank: usize, w: f64, why: Option<f64>, margin: u32) -> String {
    match why {
        None => format!(
            "leave-out trial of rank {rank} waits for a second interval at this plan (the step measured over this one, {}, is the first)",
            secs(w)
        ),
        Some(before) => format!(
            "leave-out trial of rank {rank} waits: the step measured over this interval, {}, moved more than leaveOutMarginPercent {margin}% from the {} of the interval before at the same plan",
            secs(w),
            secs(before)
        ),
    }
}
