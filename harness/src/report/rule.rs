//! The number a claim states, as a rule over measured values: `>= x`, `<= x`, `> x`, `< x`,
//! `~ x` (within a relative tolerance) or `between x y`, and the direction in which
//! overshooting the claim still says what it says (`stronger`). A value classifies as
//! passing, stronger than claimed, or failing; a value with a noise interval (p10–p90, a
//! confidence interval) that reaches both a passing and a failing region is a tie — the data
//! cannot tell. Numbers are printed with as many digits as it takes never to land on the other
//! side of a threshold than the value they print.

use serde::Deserialize;

/// A parsed `expect`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Rule {
    AtLeast(f64),
    AtMost(f64),
    Above(f64),
    Below(f64),
    Near(f64, f64),
    Between(f64, f64),
}

/// The side on which a value beyond the claim's band still agrees with the claim, more so.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    Above,
    Below,
}

/// How one value compares with the rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Class {
    Pass,
    Stronger,
    Fail,
    /// Its noise interval reaches both a passing and a failing value.
    Tie,
}

impl Rule {
    /// Parses `text`; `tolerance` is `~`'s relative band (default 0.1).
    pub fn parse(text: &str, tolerance: Option<f64>) -> Result<Rule, String> {
        let words: Vec<&str> = text.split_whitespace().collect();
        let num = |s: &str| {
            s.parse::<f64>()
                .map_err(|_| format!("expect \"{text}\": {s} is not a number"))
        };
        let rule = match words.as_slice() {
            [">=", x] => Rule::AtLeast(num(x)?),
            ["<=", x] => Rule::AtMost(num(x)?),
            [">", x] => Rule::Above(num(x)?),
            ["<", x] => Rule::Below(num(x)?),
            ["~", x] => Rule::Near(num(x)?, tolerance.unwrap_or(0.1)),
            ["between", x, y] if num(x)? <= num(y)? => Rule::Between(num(x)?, num(y)?),
            ["between", ..] => return Err(format!("expect \"{text}\": between x y needs x <= y")),
            _ => {
                return Err(format!(
                    "expect \"{text}\": use >= x, <= x, > x, < x, ~ x or between x y"
                ))
            }
        };
        if tolerance.is_some() && !matches!(rule, Rule::Near(..)) {
            return Err(format!(
                "expect \"{text}\": a tolerance only applies to ~ x"
            ));
        }
        Ok(rule)
    }

    /// The passing band's ends (infinite where open).
    pub fn band(self) -> (f64, f64) {
        match self {
            Rule::AtLeast(x) | Rule::Above(x) => (x, f64::INFINITY),
            Rule::AtMost(x) | Rule::Below(x) => (f64::NEG_INFINITY, x),
            Rule::Near(x, t) => (x - t * x.abs(), x + t * x.abs()),
            Rule::Between(x, y) => (x, y),
        }
    }

    /// The thresholds a printed value must stay on the right side of.
    pub fn edges(self) -> Vec<f64> {
        let (lo, hi) = self.band();
        [lo, hi].into_iter().filter(|e| e.is_finite()).collect()
    }

    pub fn passes(self, v: f64) -> bool {
        let (lo, hi) = self.band();
        match self {
            Rule::Above(x) => v > x,
            Rule::Below(x) => v < x,
            _ => v >= lo && v <= hi,
        }
    }

    /// A point's class.
    pub fn class(self, v: f64, stronger: Option<Direction>) -> Class {
        let (lo, hi) = self.band();
        match stronger {
            _ if self.passes(v) => Class::Pass,
            Some(Direction::Above) if v > hi => Class::Stronger,
            Some(Direction::Below) if v < lo => Class::Stronger,
            _ => Class::Fail,
        }
    }

    /// The class of a value whose noise interval is `interval` (the value alone without one):
    /// a tie when the interval reaches a passing and a failing point, otherwise the class
    /// the interval shares (stronger only when all of it is).
    pub fn class_within(
        self,
        v: f64,
        interval: Option<(f64, f64)>,
        stronger: Option<Direction>,
    ) -> Class {
        let Some((a, b)) = interval else {
            return self.class(v, stronger);
        };
        let (lo, hi) = (a.min(b).min(v), a.max(b).max(v));
        let mut points = vec![lo, hi, v];
        for e in self.edges() {
            if e > lo && e < hi {
                // Both sides of an edge, and the edge itself.
                points.extend([
                    e,
                    e - 1e-12 * e.abs().max(1.0),
                    e + 1e-12 * e.abs().max(1.0),
                ]);
            }
        }
        let classes: Vec<Class> = points.iter().map(|&p| self.class(p, stronger)).collect();
        let fails = classes.contains(&Class::Fail);
        if fails && classes.iter().any(|c| *c != Class::Fail) {
            Class::Tie
        } else if fails {
            Class::Fail
        } else if classes.iter().all(|c| *c == Class::Stronger) {
            Class::Stronger
        } else {
            Class::Pass
        }
    }
}

/// A number for a table: 3 significant digits, no exponent for ordinary magnitudes.
pub fn num(v: f64) -> String {
    num_digits(v, 3)
}

fn num_digits(v: f64, sig: i32) -> String {
    if v == 0.0 || !v.is_finite() {
        return format!("{v}");
    }
    let mag = v.abs().log10().floor() as i32;
    if !(-3..6).contains(&mag) {
        let p = (sig - 1).max(0) as usize;
        return format!("{v:.p$e}");
    }
    let digits = (sig - 1 - mag).max(0) as usize;
    format!("{v:.digits$}")
}

/// `v` with the fewest digits (3 at least) whose printed value lies on the same side of
/// every edge as `v` itself, and equals an edge only if `v` does.
pub fn num_beside(v: f64, edges: &[f64]) -> String {
    for sig in 3..=12 {
        let text = num_digits(v, sig);
        let Ok(shown) = text.parse::<f64>() else {
            return text;
        };
        let same_side = edges
            .iter()
            .all(|&e| v.partial_cmp(&e) == shown.partial_cmp(&e));
        if same_side {
            return text;
        }
    }
    format!("{v}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_parse_and_classify() {
        assert!(Rule::parse(">= 2", None).unwrap().passes(2.0));
        assert!(!Rule::parse("< 2", None).unwrap().passes(2.0));
        assert!(Rule::parse("~ 40", Some(0.05)).unwrap().passes(41.9));
        assert!(!Rule::parse("~ 40", Some(0.05)).unwrap().passes(42.1));
        assert!(Rule::parse("between 2 3", None).unwrap().passes(2.5));
        assert!(Rule::parse("between 3 2", None).is_err());
        assert!(Rule::parse("= 2", None).is_err());
        assert!(Rule::parse(">= two", None).is_err());
        assert!(Rule::parse(">= 2", Some(0.1)).is_err(), "a tolerance on >=");
        let near = Rule::parse("~ 1.71", Some(0.2)).unwrap();
        let up = Some(Direction::Above);
        assert_eq!(near.class(1.8, up), Class::Pass);
        assert_eq!(near.class(2.77, up), Class::Stronger);
        assert_eq!(near.class(2.77, None), Class::Fail);
        assert_eq!(near.class(1.0, up), Class::Fail);
        let between = Rule::parse("between 1 2", None).unwrap();
        assert_eq!(
            between.class(0.045, Some(Direction::Below)),
            Class::Stronger
        );
        assert_eq!(between.class(5.0, Some(Direction::Below)), Class::Fail);
    }

    #[test]
    fn an_interval_across_a_threshold_is_a_tie() {
        let faster = Rule::parse("> 1", None).unwrap();
        // p10–p90 ranges overlap: the ratio's interval reaches 1.
        assert_eq!(
            faster.class_within(1.05, Some((0.93, 1.12)), None),
            Class::Tie
        );
        assert_eq!(
            faster.class_within(1.05, Some((1.01, 1.12)), None),
            Class::Pass
        );
        assert_eq!(
            faster.class_within(0.95, Some((0.90, 0.99)), None),
            Class::Fail
        );
        assert_eq!(faster.class_within(0.95, None, None), Class::Fail);
        let near = Rule::parse("~ 2", Some(0.1)).unwrap();
        assert_eq!(
            near.class_within(3.0, Some((2.5, 3.5)), Some(Direction::Above)),
            Class::Stronger
        );
        assert_eq!(
            near.class_within(2.0, Some((1.5, 2.5)), Some(Direction::Above)),
            Class::Tie
        );
        assert_eq!(
            near.class_within(2.3, Some((2.05, 2.6)), Some(Direction::Above)),
            Class::Pass
        );
    }

    #[test]
    fn printed_values_never_cross_a_threshold() {
        assert_eq!(num(2.0938), "2.09");
        assert_eq!(num(1234.5), "1234");
        assert_eq!(num(0.000123), "1.23e-4");
        // 1.0114 against "< 1.01": "1.01" would read as passing.
        assert_eq!(num_beside(1.0114, &[1.01]), "1.011");
        assert_eq!(num_beside(0.99996, &[1.0]), "0.99996");
        assert_eq!(num_beside(1.0, &[1.0]), "1.00");
        assert_eq!(num_beside(2.77, &[1.368, 2.052]), "2.77");
        assert_eq!(num_beside(84.96, &[85.0]), "84.96");
    }
}
