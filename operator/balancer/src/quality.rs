//! Balance quality: the coefficient of variation (CV) of per-rank compute
//! time in one step, and its class.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Class of a CV: Excellent < 5%, Good 5–10%, Fair 10–20%, Poor ≥ 20%.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum QualityClass {
    /// CV below 5%.
    Excellent,
    /// CV from 5% to below 10%.
    Good,
    /// CV from 10% to below 20%.
    Fair,
    /// CV of 20% or more.
    Poor,
}

impl QualityClass {
    /// The class of a CV given in percent (NaN counts as Poor).
    pub fn from_cv_percent(cv: f64) -> Self {
        if cv < 5.0 {
            QualityClass::Excellent
        } else if cv < 10.0 {
            QualityClass::Good
        } else if cv < 20.0 {
            QualityClass::Fair
        } else {
            QualityClass::Poor
        }
    }

    /// The class name: "Excellent", "Good", "Fair" or "Poor".
    pub fn as_str(&self) -> &'static str {
        match self {
            QualityClass::Excellent => "Excellent",
            QualityClass::Good => "Good",
            QualityClass::Fair => "Fair",
            QualityClass::Poor => "Poor",
        }
    }
}

impl fmt::Display for QualityClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Balance quality of one step.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Quality {
    /// Population standard deviation over mean of the compute times, percent.
    pub cv_percent: f64,
    /// Its class.
    pub class: QualityClass,
}

/// CV of per-rank compute seconds. Non-finite and negative values are
/// ignored; fewer than two usable values, or a zero mean, give CV 0.
pub fn balance_quality(compute_seconds: &[f64]) -> Quality {
    let (n, sum) = compute_seconds
        .iter()
        .filter(|x| x.is_finite() && **x >= 0.0)
        .fold((0usize, 0.0), |(n, s), x| (n + 1, s + x));
    let cv_percent = if n < 2 || sum <= 0.0 {
        0.0
    } else {
        let mean = sum / n as f64;
        let var = compute_seconds
            .iter()
            .filter(|x| x.is_finite() && **x >= 0.0)
            .map(|x| (x - mean) * (x - mean))
            .sum::<f64>()
            / n as f64;
        100.0 * var.sqrt() / mean
    };
    Quality {
        cv_percent,
        class: QualityClass::from_cv_percent(cv_percent),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cv_and_classes() {
        let q = balance_quality(&[1.0, 1.0, 1.0]);
        assert_eq!(q.cv_percent, 0.0);
        assert_eq!(q.class, QualityClass::Excellent);
        // mean 1, population sd 0.1 → 10% → Fair boundary (Good is < 10).
        let q = balance_quality(&[0.9, 1.1]);
        assert!((q.cv_percent - 10.0).abs() < 1e-9);
        assert_eq!(QualityClass::from_cv_percent(9.99), QualityClass::Good);
        assert_eq!(QualityClass::from_cv_percent(5.0), QualityClass::Good);
        assert_eq!(QualityClass::from_cv_percent(4.99), QualityClass::Excellent);
        assert_eq!(QualityClass::from_cv_percent(19.9).to_string(), "Fair");
        assert_eq!(QualityClass::from_cv_percent(20.0).to_string(), "Poor");
        let q = balance_quality(&[1.0, 3.0]);
        assert!((q.cv_percent - 50.0).abs() < 1e-9);
        assert_eq!(q.class.to_string(), "Poor");
    }

    #[test]
    fn bad_values_are_ignored() {
        assert_eq!(balance_quality(&[]).cv_percent, 0.0);
        assert_eq!(balance_quality(&[0.0, 0.0]).cv_percent, 0.0);
        let q = balance_quality(&[1.0, f64::NAN, -3.0, f64::INFINITY, 1.0]);
        assert_eq!(q.cv_percent, 0.0);
    }
}
