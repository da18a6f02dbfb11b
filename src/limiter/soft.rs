//! Soft limits: the share of a limit past which an admitted request is
//! warned (`soft_ratio` in rules and settings) before it is ever refused.
//!
//! The share is kept in millionths, not as a float: `used > ratio ×
//! capacity` is then exact integer arithmetic, so `0.29` of 100 means
//! "past 29", never "past 28.999999999999996".

use std::fmt;

/// Millionths in one whole.
const WHOLE: u32 = 1_000_000;

/// A share of a limit, above 0 and at most 1, to a millionth.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SoftRatio {
    /// 1 ..= 1,000,000.
    millionths: u32,
}

impl SoftRatio {
    /// The share `ratio`, rounded to a millionth (and at least one).
    /// Refused, with the reason, unless `0 < ratio ≤ 1`.
    pub fn new(ratio: f64) -> Result<Self, &'static str> {
        if ratio.is_nan() || ratio <= 0.0 || ratio > 1.0 {
            return Err("must be a number above 0 and at most 1, e.g. 0.8");
        }
        // In (0, 1e6]: the cast cannot truncate.
        let millionths = ((ratio * f64::from(WHOLE)).round() as u32).clamp(1, WHOLE);
        Ok(Self { millionths })
    }

    /// The share as a number.
    pub fn get(self) -> f64 {
        f64::from(self.millionths) / f64::from(WHOLE)
    }

    /// Whether `used` of a limit holding `capacity` is past this share of it.
    pub fn breached(self, used: u64, capacity: u64) -> bool {
        u128::from(used) * u128::from(WHOLE) > u128::from(self.millionths) * u128::from(capacity)
    }
}

/// The shortest decimal: `0.8`, `1`, `0.000001`.
impl fmt::Display for SoftRatio {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.millionths == WHOLE {
            return f.write_str("1");
        }
        let digits = format!("{:06}", self.millionths);
        write!(f, "0.{}", digits.trim_end_matches('0'))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_shares_above_zero_and_at_most_one_are_ratios() {
        for bad in [0.0, -0.5, 1.000_001, 2.0, f64::NAN, f64::INFINITY] {
            assert!(SoftRatio::new(bad).is_err(), "{bad}");
        }
        for good in [1e-9, 0.000_001, 0.5, 0.8, 1.0] {
            assert!(SoftRatio::new(good).is_ok(), "{good}");
        }
    }

    #[test]
    fn breached_means_strictly_past_the_share_without_float_error() {
        // 0.29 × 100 is 28.999999999999996 in doubles.
        let r = SoftRatio::new(0.29).unwrap();
        assert!(!r.breached(29, 100));
        assert!(r.breached(30, 100));
        let r = SoftRatio::new(0.8).unwrap();
        assert!(!r.breached(80, 100));
        assert!(r.breached(81, 100));
        // A share of a small limit: 0.5 of 3 is 1.5, so 2 is past it.
        let r = SoftRatio::new(0.5).unwrap();
        assert!(!r.breached(1, 3));
        assert!(r.breached(2, 3));
        // 1: only a count past the limit itself (a `counting: always` debit).
        let one = SoftRatio::new(1.0).unwrap();
        assert!(!one.breached(100, 100));
        assert!(one.breached(101, 100));
        // A limit of 0 holds nothing: any use is past any share of it.
        assert!(!r.breached(0, 0));
        assert!(r.breached(1, 0));
        // No overflow at the largest counts.
        assert!(one.breached(u64::MAX, u64::MAX - 1));
    }

    #[test]
    fn shown_as_the_shortest_decimal() {
        let shown = |r: f64| SoftRatio::new(r).unwrap().to_string();
        assert_eq!(shown(0.8), "0.8");
        assert_eq!(shown(1.0), "1");
        assert_eq!(shown(0.125), "0.125");
        assert_eq!(shown(1e-9), "0.000001");
        assert_eq!(SoftRatio::new(0.75).unwrap().get(), 0.75);
    }
}
