//! Reason text shared by the decision's stages: seconds, rank lists and
//! notes (a leaf module).

use std::fmt::Write as _;

/// "0.412 s": 3 significant digits.
pub(crate) fn secs(x: f64) -> String {
    if !(x.is_finite() && x > 0.0) {
        return format!("{x} s");
    }
    let decimals = (2 - x.log10().floor() as i32).clamp(0, 9) as usize;
    format!("{x:.decimals$} s")
}

/// Appends `; note` unless `note` is empty.
pub(crate) fn push_note(reason: &mut String, note: &str) {
    if !note.is_empty() {
        reason.push_str("; ");
        reason.push_str(note);
    }
}

/// "1, 2, 3" (at most 8, then "+N more").
pub(crate) fn list(ranks: &[usize]) -> String {
    let mut s = ranks
        .iter()
        .take(8)
        .map(|r| r.to_string())
        .collect::<Vec<_>>()
        .join(", ");
    if ranks.len() > 8 {
        let _ = write!(s, " +{} more", ranks.len() - 8);
    }
    s
}

/// "rank 3" or "ranks 3, 5".
pub(crate) fn ranks_named(ranks: &[usize]) -> String {
    if ranks.len() == 1 {
        format!("rank {}", ranks[0])
    } else {
        format!("ranks {}", list(ranks))
    }
}
