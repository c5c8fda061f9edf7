//! From values to verdicts, in a vocabulary that says what happened: `holds` (every value
//! passes), `holds, stronger than claimed` (every value overshoots the claim's number in the
//! direction the claim points), `refuted` (none passes), `depends` (where: the `by` columns
//! say), `tie (within noise)` (the values' noise intervals reach both sides of the rule),
//! `not in regime` (the claim is about a GPU or a 7B model: the CPU result is shown as
//! evidence, never as the verdict) and `untested` (what it needs). An existence claim
//! (`stat = "some"`) holds when one value passes. A claim's verdict combines its in-regime
//! checks; its other parts are named beside it.

use crate::report::claims::{CheckDecl, ClaimDecl, Kind};
use crate::report::evidence::{values, RunRef, Value};
use crate::report::expr::Expr;
use crate::report::rule::{num_beside, Class, Rule};
use std::collections::BTreeMap;
use std::path::Path;

/// A verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Holds,
    Stronger,
    Refuted,
    /// Where it holds and where not.
    Depends(String),
    Tie,
    /// What the CPU evidence reads, in words.
    NotInRegime(String),
    /// Why not, or what it would take.
    Untested(String),
}

impl Verdict {
    pub fn word(&self) -> &'static str {
        match self {
            Verdict::Holds => "holds",
            Verdict::Stronger => "holds, stronger than claimed",
            Verdict::Refuted => "refuted",
            Verdict::Depends(_) => "depends",
            Verdict::Tie => "tie (within noise)",
            Verdict::NotInRegime(_) => "not in regime",
            Verdict::Untested(_) => "untested",
        }
    }

    /// The verdict words in the order the counts list them.
    pub const WORDS: [&'static str; 7] = [
        "holds",
        "holds, stronger than claimed",
        "refuted",
        "depends",
        "tie (within noise)",
        "not in regime",
        "untested",
    ];

    fn tested(&self) -> bool {
        !matches!(self, Verdict::Untested(_) | Verdict::NotInRegime(_))
    }
}

/// An evaluated check.
#[derive(Debug, Clone)]
pub struct Judged {
    pub verdict: Verdict,
    /// What the values alone say (for a check not in regime, the CPU evidence's reading).
    pub reading: Verdict,
    /// The numbers, in words.
    pub measured: String,
    pub run: Option<RunRef>,
    /// The values judged (empty when untested).
    pub values: Vec<f64>,
    /// The statistic judged: `max`/`min`/`median` when the check names one, else the median.
    pub marker: Option<f64>,
}

/// The median of the values.
pub fn median(values: &[Value]) -> f64 {
    let mut v: Vec<f64> = values.iter().map(|x| x.value).collect();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// min–max over the values, with their count, each printed on its own side of `edges`.
pub fn range(values: &[Value], unit: &str, edges: &[f64]) -> String {
    let lo = values.iter().map(|v| v.value).fold(f64::INFINITY, f64::min);
    let hi = values
        .iter()
        .map(|v| v.value)
        .fold(f64::NEG_INFINITY, f64::max);
    let unit = if unit.is_empty() {
        String::new()
    } else {
        format!(" {unit}")
    };
    if values.len() == 1 {
        format!("{}{unit} (1 row)", num_beside(lo, edges))
    } else {
        format!(
            "{}–{}{unit} ({} rows)",
            num_beside(lo, edges),
            num_beside(hi, edges),
            values.len()
        )
    }
}

fn untested(reason: String) -> Judged {
    Judged {
        verdict: Verdict::Untested(reason.clone()),
        reading: Verdict::Untested(reason),
        measured: String::new(),
        run: None,
        values: vec![],
        marker: None,
    }
}

/// The verdict of a set of classes (every value's), `where` naming the groups.
fn verdict_of(classes: &[Class], existence: bool, place: impl Fn() -> String) -> Verdict {
    let any = |c: Class| classes.contains(&c);
    let all = |f: &dyn Fn(Class) -> bool| classes.iter().all(|&c| f(c));
    if existence {
        return if any(Class::Pass) || any(Class::Stronger) {
            Verdict::Holds
        } else if any(Class::Tie) {
            Verdict::Tie
        } else {
            Verdict::Refuted
        };
    }
    if all(&|c| c == Class::Stronger) {
        Verdict::Stronger
    } else if all(&|c| matches!(c, Class::Pass | Class::Stronger)) {
        Verdict::Holds
    } else if all(&|c| c == Class::Fail) {
        Verdict::Refuted
    } else if all(&|c| c == Class::Tie) {
        Verdict::Tie
    } else {
        Verdict::Depends(place())
    }
}

/// Judges one check against `results`.
pub fn judge(results: &Path, check: &CheckDecl) -> Judged {
    let rule = check.rule();
    let unit = &check.evidence.unit;
    let (run, values) = match &check.calc {
        Some(calc) => {
            let v = Expr::parse(calc)
                .ok()
                .and_then(|e| e.eval(&|_| None))
                .filter(|v| v.is_finite());
            let Some(v) = v else {
                return untested(format!("calc \"{calc}\" gives no finite number"));
            };
            let value = Value {
                group: String::new(),
                condition: format!("calc {calc}"),
                value: v,
                interval: None,
            };
            (None, vec![value])
        }
        None => match values(results, &check.evidence) {
            Ok((run, v)) => (Some(run), v),
            Err(reason) => return untested(reason),
        },
    };
    let edges = rule.edges();
    let stat = check.stat.as_deref().unwrap_or("each");
    let class = |v: &Value| rule.class_within(v.value, v.interval, check.stronger);
    let (reading, measured, marker) = match stat {
        "max" | "min" | "median" => {
            let mut sorted: Vec<&Value> = values.iter().collect();
            sorted.sort_by(|a, b| a.value.total_cmp(&b.value));
            let pick = match stat {
                "max" => sorted[sorted.len() - 1],
                "min" => sorted[0],
                _ => sorted[(sorted.len() - 1) / 2],
            };
            let reading = verdict_of(&[class(pick)], false, String::new);
            let at = if pick.condition.is_empty() {
                String::new()
            } else {
                format!(" at {}", pick.condition)
            };
            let measured = format!(
                "{stat} {}{at}, over {}",
                num_beside(pick.value, &edges),
                range(&values, unit, &edges)
            );
            (reading, measured, Some(pick.value))
        }
        _ => {
            let classes: Vec<Class> = values.iter().map(class).collect();
            let reading = verdict_of(&classes, stat == "some", || {
                where_it_holds(&values, &classes, &check.evidence.by)
            });
            let ties = classes.iter().filter(|c| **c == Class::Tie).count();
            let mut measured = range(&values, unit, &edges);
            if ties > 0 {
                measured += &format!("; {ties} within noise of the rule");
            }
            (reading, measured, Some(median(&values)))
        }
    };
    let verdict = match check.kind {
        Kind::NotInRegime => {
            Verdict::NotInRegime(format!("on this CPU it would read {}", describe(&reading)))
        }
        _ => reading.clone(),
    };
    Judged {
        verdict,
        reading,
        measured,
        run,
        values: values.iter().map(|v| v.value).collect(),
        marker,
    }
}

/// A verdict in words, with its place.
pub fn describe(v: &Verdict) -> String {
    match v {
        Verdict::Depends(w) | Verdict::NotInRegime(w) | Verdict::Untested(w) => {
            format!("{} ({w})", v.word())
        }
        _ => v.word().to_string(),
    }
}

/// "holds at a=1; stronger at a=2; tie at a=3; not at a=4" over the `by` columns (the row
/// count without them).
fn where_it_holds(values: &[Value], classes: &[Class], by: &[String]) -> String {
    if by.is_empty() {
        let count = |c: Class| classes.iter().filter(|&&x| x == c).count();
        let mut parts = vec![format!(
            "holds on {} of {} rows",
            count(Class::Pass) + count(Class::Stronger),
            values.len()
        )];
        if count(Class::Tie) > 0 {
            parts.push(format!("{} within noise", count(Class::Tie)));
        }
        return parts.join(", ");
    }
    // Per group: the verdict of its values.
    let mut groups: BTreeMap<&str, Vec<Class>> = BTreeMap::new();
    for (v, c) in values.iter().zip(classes) {
        groups.entry(v.group.as_str()).or_default().push(*c);
    }
    let mut by_word: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (g, cs) in &groups {
        let word = match verdict_of(cs, false, String::new) {
            Verdict::Holds => "holds at",
            Verdict::Stronger => "stronger than claimed at",
            Verdict::Refuted => "not at",
            Verdict::Tie => "within noise at",
            _ => "partly at",
        };
        by_word.entry(word).or_default().push(g);
    }
    let order = [
        "holds at",
        "stronger than claimed at",
        "partly at",
        "within noise at",
        "not at",
    ];
    order
        .iter()
        .filter_map(|w| by_word.get(w).map(|gs| format!("{w} {}", gs.join("; "))))
        .collect::<Vec<_>>()
        .join("; ")
}

/// The verdict of a claim: its in-regime checks combined (untested when none has values; not
/// in regime when all that do are).
pub fn combine(claim: &ClaimDecl, judged: &[Judged]) -> Verdict {
    let tested: Vec<(&CheckDecl, &Judged)> = claim
        .check
        .iter()
        .zip(judged)
        .filter(|(_, j)| j.verdict.tested())
        .collect();
    if tested.is_empty() {
        let out_of_regime: Vec<String> = claim
            .check
            .iter()
            .zip(judged)
            .filter(|(_, j)| matches!(j.verdict, Verdict::NotInRegime(_)))
            .map(|(c, j)| format!("{}: {}", c.part, describe(&j.reading)))
            .collect();
        if !out_of_regime.is_empty() {
            return Verdict::NotInRegime(out_of_regime.join("; "));
        }
        let mut reasons: Vec<String> = judged
            .iter()
            .filter_map(|j| match &j.verdict {
                Verdict::Untested(r) => Some(r.clone()),
                _ => None,
            })
            .collect();
        reasons.extend(
            claim
                .untested
                .iter()
                .map(|u| format!("{}: {}", u.part, u.needs)),
        );
        let mut seen = std::collections::BTreeSet::new();
        reasons.retain(|r| seen.insert(r.clone()));
        return Verdict::Untested(reasons.join("; "));
    }
    let all = |f: &dyn Fn(&Verdict) -> bool| tested.iter().all(|(_, j)| f(&j.verdict));
    if all(&|v| *v == Verdict::Stronger) {
        Verdict::Stronger
    } else if all(&|v| matches!(v, Verdict::Holds | Verdict::Stronger)) {
        Verdict::Holds
    } else if all(&|v| *v == Verdict::Refuted) {
        Verdict::Refuted
    } else if all(&|v| *v == Verdict::Tie) {
        Verdict::Tie
    } else {
        Verdict::Depends(
            tested
                .iter()
                .map(|(c, j)| format!("{}: {}", c.part, describe(&j.verdict)))
                .collect::<Vec<_>>()
                .join("; "),
        )
    }
}

/// The number a check's rule states and the band that passes, in units of that number
/// (`>= x`: (1, 1); `~ x` within t: (1 − t, 1 + t); `between x y`: (1, y / x)).
pub fn claimed(rule: Rule) -> (f64, (f64, f64)) {
    match rule {
        Rule::AtLeast(x) | Rule::AtMost(x) | Rule::Above(x) | Rule::Below(x) => (x, (1.0, 1.0)),
        Rule::Near(x, t) => (x, (1.0 - t, 1.0 + t)),
        Rule::Between(x, y) => (x, (1.0, y / x)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(group: &str, v: f64, interval: Option<(f64, f64)>) -> Value {
        Value {
            group: group.into(),
            condition: group.into(),
            value: v,
            interval,
        }
    }

    #[test]
    fn classes_make_verdicts() {
        use Class::*;
        let nowhere = String::new;
        assert_eq!(
            verdict_of(&[Pass, Stronger], false, nowhere),
            Verdict::Holds
        );
        assert_eq!(
            verdict_of(&[Stronger, Stronger], false, nowhere),
            Verdict::Stronger
        );
        assert_eq!(verdict_of(&[Fail, Fail], false, nowhere), Verdict::Refuted);
        assert_eq!(verdict_of(&[Tie, Tie], false, nowhere), Verdict::Tie);
        assert_eq!(
            verdict_of(&[Pass, Fail], false, || "here".into()),
            Verdict::Depends("here".into())
        );
        // An existence claim: one passing value suffices; a tie without one is a tie.
        assert_eq!(
            verdict_of(&[Fail, Pass, Fail], true, nowhere),
            Verdict::Holds
        );
        assert_eq!(verdict_of(&[Fail, Tie], true, nowhere), Verdict::Tie);
        assert_eq!(verdict_of(&[Fail], true, nowhere), Verdict::Refuted);
    }

    #[test]
    fn places_and_ranges_say_where_and_stay_beside_the_threshold() {
        let rule = Rule::parse("> 1", None).unwrap();
        let vals = [
            value("causal=true", 1.4, Some((1.2, 1.6))),
            value("causal=false", 1.02, Some((0.95, 1.1))),
            value("causal=false", 1.01, Some((0.9, 1.1))),
            value("kv_len=64", 0.8, Some((0.7, 0.9))),
        ];
        let classes: Vec<Class> = vals
            .iter()
            .map(|v| rule.class_within(v.value, v.interval, None))
            .collect();
        let place = where_it_holds(&vals, &classes, &["g".into()]);
        assert_eq!(
            place,
            "holds at causal=true; within noise at causal=false; not at kv_len=64"
        );
        assert_eq!(
            range(&vals[1..3], "x", &rule.edges()),
            "1.01–1.02 x (2 rows)"
        );
        let below = [value("", 0.99996, None)];
        assert_eq!(range(&below, "", &[1.0]), "0.99996 (1 row)");
    }

    /// A results/ folder with one finished run `exp/r1` of these rows.
    fn results_with(test: &str, exp: &str, csv: &str) -> std::path::PathBuf {
        let dir =
            std::env::temp_dir().join(format!("harness-verdict-{}-{test}", std::process::id()));
        std::fs::create_dir_all(dir.join(exp)).unwrap();
        std::fs::write(dir.join(exp).join("r1.csv"), csv).unwrap();
        let prov = r#"{"run_id": "r1", "status": "finished", "git_dirty": false,
            "cpu_model": "Test CPU", "logical_cores": 2, "threads": 2, "isa": "avx2",
            "isa_detected": "avx2", "roofline": {"read_gbps": 20.0}}"#;
        std::fs::write(dir.join(exp).join("r1.json"), prov).unwrap();
        dir
    }

    fn check(extra: &str) -> CheckDecl {
        let text = format!(
            "part = \"p\"\nkind = \"analogue\"\nstates = \"s\"\nmeasures = \"m\"\nwhy = \"w\"\n{extra}"
        );
        toml::from_str(&text).unwrap()
    }

    const ROWS: &str = "run_id,variant,kv_len,status,median_ms,p10_ms,p90_ms,gbps\n\
        r1,naive,64,ok,1.00,0.90,1.10,2.0\n\
        r1,flash2,64,ok,1.02,0.95,1.05,1.0\n\
        r1,naive,4096,ok,4.0,3.9,4.1,2.0\n\
        r1,flash2,4096,ok,1.5,1.45,1.55,1.0\n";

    const RATIO: &str = "experiment = \"att\"\ncolumn = \"median_ms\"\n\
        ratio = { of = { variant = \"naive\" }, over = { variant = \"flash2\" }, on = [\"kv_len\"] }\n\
        by = [\"kv_len\"]\n";

    #[test]
    fn overlapping_p10_p90_is_a_tie_and_an_empty_filter_is_untested() {
        let results = results_with("tie", "att", ROWS);
        let j = judge(
            &results,
            &check(&format!("{RATIO}expect = \"> 1\"\nnoise = \"timing\"")),
        );
        assert_eq!(
            j.verdict,
            Verdict::Depends("holds at kv_len=4096; within noise at kv_len=64".into())
        );
        assert!(j.measured.contains("1 within noise"), "{}", j.measured);
        // Without the noise the short row is a plain failure.
        let j = judge(&results, &check(&format!("{RATIO}expect = \"> 1\"")));
        assert_eq!(
            j.verdict,
            Verdict::Depends("holds at kv_len=4096; not at kv_len=64".into())
        );
        let j = judge(
            &results,
            &check("experiment = \"att\"\ncolumn = \"gbps\"\nfilter = { kv_len = \"999\" }\nexpect = \"> 1\""),
        );
        assert_eq!(
            j.verdict,
            Verdict::Untested("no row of run att/r1 matches kv_len=999".into())
        );
        let j = judge(
            &results,
            &check("experiment = \"att\"\ncolumn = \"gbps + missing\"\nexpect = \"> 1\""),
        );
        assert_eq!(
            j.verdict,
            Verdict::Untested("run att/r1 has no column missing".into())
        );
        let j = judge(
            &results,
            &check("experiment = \"none\"\ncolumn = \"x\"\nexpect = \"> 1\""),
        );
        assert_eq!(
            j.verdict,
            Verdict::Untested("no run of none on cpu in results/ yet".into())
        );
    }

    #[test]
    fn existence_overshoot_provenance_calc_and_regime() {
        let results = results_with("existence", "att", ROWS);
        // An existence claim: one row over 1.5 GB/s suffices; "each" would be depends.
        let some = "experiment = \"att\"\ncolumn = \"gbps\"\nexpect = \"> 1.5\"\n";
        assert_eq!(
            judge(&results, &check(&format!("{some}stat = \"some\""))).verdict,
            Verdict::Holds
        );
        let each = judge(&results, &check(some)).verdict;
        assert!(matches!(each, Verdict::Depends(_)), "{each:?}");
        // A provenance number in the expression: 2 GB/s of 20 is 10%.
        let share = "experiment = \"att\"\ncolumn = \"100 * gbps / roofline.read_gbps\"\nfilter = { variant = \"naive\" }\nexpect = \"~ 10\"\n";
        assert_eq!(judge(&results, &check(share)).verdict, Verdict::Holds);
        // Beyond the band in the claimed direction: stronger than claimed.
        let far = format!(
            "{RATIO}filter = {{ kv_len = \"4096\" }}\nexpect = \"~ 1.5\"\nstronger = \"above\"\n"
        );
        assert_eq!(judge(&results, &check(&far)).verdict, Verdict::Stronger);
        let calc: CheckDecl = toml::from_str(
            "part = \"p\"\nkind = \"arithmetic\"\nstates = \"s\"\nmeasures = \"m\"\nwhy = \"w\"\n\
             calc = \"2 * 7e9 / 312e12 * 1e3\"\nexpect = \"between 1 2\"\nstronger = \"below\"",
        )
        .unwrap();
        let j = judge(&results, &calc);
        assert_eq!(j.verdict, Verdict::Stronger);
        assert!(
            j.run.is_none() && j.measured.starts_with("0.0449"),
            "{}",
            j.measured
        );
        // Not in regime: the CPU reading is kept, the verdict is not the claim's.
        let mut out = check(&far);
        out.kind = Kind::NotInRegime;
        let j = judge(&results, &out);
        assert_eq!(j.reading, Verdict::Stronger);
        assert_eq!(
            j.verdict,
            Verdict::NotInRegime("on this CPU it would read holds, stronger than claimed".into())
        );
        // With several partners, a stat picks one; without one, no value.
        let best = "experiment = \"att\"\ncolumn = \"median_ms\"\nfilter = { kv_len = \"4096\" }\n\
            ratio = { of = { variant = \"flash2\" }, over = { kv_len = \"4096\" }, on = [\"kv_len\"], over_stat = \"max\" }\n\
            expect = \"< 1\"\n";
        let j = judge(&results, &check(best));
        assert_eq!(
            (j.verdict, j.values.clone()),
            (Verdict::Holds, vec![1.5 / 4.0])
        );
        let picked = "experiment = \"att\"\ncolumn = \"kv_len\"\nbest = { max = \"median_ms\", per = [\"variant\"] }\nexpect = \"~ 4096\"\n";
        assert_eq!(judge(&results, &check(picked)).values, vec![4096.0, 4096.0]);
    }

    #[test]
    fn a_claim_combines_its_regime_checks_and_names_the_rest() {
        let results = results_with("combine", "att", ROWS);
        let claim: ClaimDecl = toml::from_str(&format!(
            "id = \"C0\"\nclaim = \"c\"\nseed = \"000 §1\"\nsource = \"s\"\nregime = \"r\"\nobjection = \"o\"\n\
             [[check]]\npart = \"a\"\nkind = \"arithmetic\"\nstates = \"s\"\nmeasures = \"m\"\nwhy = \"w\"\ncalc = \"1 + 1\"\nexpect = \"~ 2\"\n\
             [[check]]\npart = \"b\"\nkind = \"not-in-regime\"\nstates = \"s\"\nmeasures = \"m\"\nwhy = \"w\"\n{RATIO}expect = \"< 1\"\n\
             [[untested]]\npart = \"c\"\nneeds = \"a GPU\"\n"
        ))
        .unwrap();
        let judged: Vec<Judged> = claim.check.iter().map(|k| judge(&results, k)).collect();
        assert_eq!(combine(&claim, &judged), Verdict::Holds);
        let only_cpu = ClaimDecl {
            check: claim.check[1..].to_vec(),
            ..claim.clone()
        };
        let judged: Vec<Judged> = only_cpu.check.iter().map(|k| judge(&results, k)).collect();
        assert_eq!(
            combine(&only_cpu, &judged),
            Verdict::NotInRegime("b: depends (holds at kv_len=64; not at kv_len=4096)".into())
        );
        let nothing = ClaimDecl {
            check: vec![],
            ..claim
        };
        assert_eq!(combine(&nothing, &[]), Verdict::Untested("c: a GPU".into()));
    }
}
