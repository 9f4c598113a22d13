//! Plan propagation: from the operator's plan writes (its log) to the first
//! step every rank ran on the new plan (their step logs).

use super::analysis::StepRec;

/// Seconds from each plan's write (operator log) to the start of the first
/// step every rank ran on it. `patches`: (generation, Unix time written).
pub fn propagation_latencies(ranks: &[Vec<StepRec>], patches: &[(u64, f64)]) -> Vec<f64> {
    let mut out = Vec::new();
    for &(gen, at) in patches {
        let starts: Vec<Option<f64>> = ranks
            .iter()
            .map(|r| r.iter().find(|s| s.generation >= gen).map(|s| s.start()))
            .collect();
        if ranks.is_empty() || starts.iter().any(|s| s.is_none()) {
            continue;
        }
        let last = starts.into_iter().flatten().fold(0.0, f64::max);
        if last >= at {
            out.push(last - at);
        }
    }
    out
}

/// Plan writes for `job` in the operator's log: (generation, Unix time).
/// Lines look like `2026-11-22T23:40:01.123456Z  INFO …: plan generation 3:
/// batches [..]; … job=<name>` (ANSI colour codes allowed).
pub fn plan_writes(operator_log: &str, job: &str) -> Vec<(u64, f64)> {
    let mut out = Vec::new();
    for raw in operator_log.lines() {
        let line = strip_ansi(raw);
        let names_job = line.split_whitespace().any(|w| {
            w.strip_prefix("job=")
                .map(|v| v.trim_matches('"').trim_end_matches([',', '}']) == job)
                .unwrap_or(false)
        });
        if !names_job {
            continue;
        }
        let Some(rest) = line.split("plan generation ").nth(1) else {
            continue;
        };
        let Some(gen) = rest.split(':').next().and_then(|g| g.trim().parse().ok()) else {
            continue;
        };
        let Some(t) = line.split_whitespace().next().and_then(parse_rfc3339) else {
            continue;
        };
        out.push((gen, t));
    }
    out
}

fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// `YYYY-MM-DDTHH:MM:SS(.frac)Z` → Unix seconds (UTC only).
pub fn parse_rfc3339(s: &str) -> Option<f64> {
    let s = s.strip_suffix('Z')?;
    let (date, time) = s.split_once('T')?;
    let mut d = date.split('-').map(|x| x.parse::<i64>().ok());
    let (y, mo, da) = (d.next()??, d.next()??, d.next()??);
    let mut t = time.split(':');
    let h: i64 = t.next()?.parse().ok()?;
    let mi: i64 = t.next()?.parse().ok()?;
    let sec: f64 = t.next()?.parse().ok()?;
    if !(1..=12).contains(&mo) || !(1..=31).contains(&da) || h > 23 || mi > 59 {
        return None;
    }
    // Days from the civil date (proleptic Gregorian).
    let y2 = if mo <= 2 { y - 1 } else { y };
    let era = y2.div_euclid(400);
    let yoe = y2 - era * 400;
    let mp = (mo + 9) % 12;
    let doy = (153 * mp + 2) / 5 + da - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some((days * 86_400 + h * 3600 + mi * 60) as f64 + sec)
}
