//! Arithmetic over a row: the expressions a check's `column` or `calc` may be — numbers,
//! names (a column, or a provenance value such as `roofline.read_gbps`), `+ - * /`,
//! parentheses, unary minus and `ceil floor sqrt log2 ln min max`. Parsed once (a bad expression
//! is one line when the declarations are read), evaluated per row; a name without a number
//! evaluates to None, so the row gives no value.

/// A parsed expression.
#[derive(Debug, Clone, PartialEq)]
pub enum Expr {
    Num(f64),
    Name(String),
    Neg(Box<Expr>),
    Bin(char, Box<Expr>, Box<Expr>),
    Call(String, Vec<Expr>),
}

const FUNCTIONS: &[(&str, usize)] = &[
    ("ceil", 1),
    ("floor", 1),
    ("sqrt", 1),
    ("log2", 1),
    ("ln", 1),
    ("min", 2),
    ("max", 2),
];

struct Parser<'a> {
    text: &'a str,
    pos: usize,
}

impl Parser<'_> {
    fn skip(&mut self) {
        while self.text[self.pos..].starts_with(char::is_whitespace) {
            self.pos += 1;
        }
    }

    fn peek(&mut self) -> Option<char> {
        self.skip();
        self.text[self.pos..].chars().next()
    }

    fn eat(&mut self, c: char) -> bool {
        if self.peek() == Some(c) {
            self.pos += c.len_utf8();
            true
        } else {
            false
        }
    }

    fn err(&self, what: &str) -> String {
        format!("\"{}\": {what} at character {}", self.text, self.pos + 1)
    }

    fn expr(&mut self) -> Result<Expr, String> {
        let mut left = self.term()?;
        while let Some(op @ ('+' | '-')) = self.peek() {
            self.pos += 1;
            left = Expr::Bin(op, Box::new(left), Box::new(self.term()?));
        }
        Ok(left)
    }

    fn term(&mut self) -> Result<Expr, String> {
        let mut left = self.factor()?;
        while let Some(op @ ('*' | '/')) = self.peek() {
            self.pos += 1;
            left = Expr::Bin(op, Box::new(left), Box::new(self.factor()?));
        }
        Ok(left)
    }

    fn factor(&mut self) -> Result<Expr, String> {
        if self.eat('-') {
            return Ok(Expr::Neg(Box::new(self.factor()?)));
        }
        if self.eat('(') {
            let e = self.expr()?;
            return if self.eat(')') {
                Ok(e)
            } else {
                Err(self.err("a ')' is missing"))
            };
        }
        let rest = &self.text[self.pos..];
        let is_name = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '.';
        let len = rest.find(|c: char| !is_name(c)).unwrap_or(rest.len());
        let word = &rest[..len];
        // A number may carry an exponent sign (1.5e-9): take it with the digits.
        if word.starts_with(|c: char| c.is_ascii_digit() || c == '.') {
            let mut len = len;
            if word.ends_with(['e', 'E']) && rest[len..].starts_with(['-', '+']) {
                len += 1 + rest[len + 1..]
                    .find(|c: char| !c.is_ascii_digit())
                    .unwrap_or(rest.len() - len - 1);
            }
            let n: f64 = rest[..len]
                .parse()
                .map_err(|_| self.err(&format!("{} is not a number", &rest[..len])))?;
            self.pos += len;
            return Ok(Expr::Num(n));
        }
        if word.is_empty() {
            return Err(self.err("a number, a name or '(' is missing"));
        }
        self.pos += len;
        if self.eat('(') {
            let Some(&(_, arity)) = FUNCTIONS.iter().find(|(f, _)| *f == word) else {
                return Err(self.err(&format!(
                    "{word} is not one of ceil, floor, sqrt, log2, ln, min, max"
                )));
            };
            let mut args = vec![self.expr()?];
            while self.eat(',') {
                args.push(self.expr()?);
            }
            if !self.eat(')') || args.len() != arity {
                return Err(self.err(&format!("{word} takes {arity} argument(s) in (...)")));
            }
            return Ok(Expr::Call(word.to_string(), args));
        }
        Ok(Expr::Name(word.to_string()))
    }
}

impl Expr {
    /// Parses `text`; a bad expression is one line naming where.
    pub fn parse(text: &str) -> Result<Expr, String> {
        let mut p = Parser { text, pos: 0 };
        let e = p.expr()?;
        match p.peek() {
            None => Ok(e),
            Some(c) => Err(p.err(&format!("'{c}' is not expected"))),
        }
    }

    /// The names it reads, in order of appearance.
    pub fn names(&self) -> Vec<&str> {
        match self {
            Expr::Num(_) => vec![],
            Expr::Name(n) => vec![n.as_str()],
            Expr::Neg(e) => e.names(),
            Expr::Bin(_, a, b) => [a.names(), b.names()].concat(),
            Expr::Call(_, args) => args.iter().flat_map(Expr::names).collect(),
        }
    }

    /// The bare column it is, if it is one.
    pub fn column(&self) -> Option<&str> {
        match self {
            Expr::Name(n) => Some(n),
            _ => None,
        }
    }

    /// Its value, names looked up by `lookup`; None when a name has no number.
    pub fn eval(&self, lookup: &dyn Fn(&str) -> Option<f64>) -> Option<f64> {
        Some(match self {
            Expr::Num(n) => *n,
            Expr::Name(n) => lookup(n)?,
            Expr::Neg(e) => -e.eval(lookup)?,
            Expr::Bin(op, a, b) => {
                let (a, b) = (a.eval(lookup)?, b.eval(lookup)?);
                match op {
                    '+' => a + b,
                    '-' => a - b,
                    '*' => a * b,
                    _ => a / b,
                }
            }
            Expr::Call(f, args) => {
                let v: Vec<f64> = args.iter().map(|a| a.eval(lookup)).collect::<Option<_>>()?;
                match f.as_str() {
                    "ceil" => v[0].ceil(),
                    "floor" => v[0].floor(),
                    "sqrt" => v[0].sqrt(),
                    "log2" => v[0].log2(),
                    "ln" => v[0].ln(),
                    "min" => v[0].min(v[1]),
                    _ => v[0].max(v[1]),
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(text: &str) -> Option<f64> {
        let row = |n: &str| match n {
            "a" => Some(3.0),
            "roofline.read_gbps" => Some(20.0),
            _ => None,
        };
        Expr::parse(text).unwrap().eval(&row)
    }

    #[test]
    fn arithmetic_names_and_errors() {
        assert_eq!(
            value("14e9 / 1555e9 * 1e3").map(|v| (v * 1e3).round()),
            Some(9003.0)
        );
        assert_eq!(value("100 - a * 2"), Some(94.0));
        assert_eq!(value("-(a + 1) / 2"), Some(-2.0));
        assert_eq!(value("ceil(a / 2) + max(a, 7) + log2(8)"), Some(12.0));
        assert_eq!(value("sqrt(108 * 4 / 27)"), Some(4.0));
        assert_eq!(value("a / roofline.read_gbps"), Some(0.15));
        assert_eq!(value("1.5e-3 * 2"), Some(3e-3));
        assert_eq!(value("a + missing"), None);
        assert_eq!(Expr::parse("a").unwrap().column(), Some("a"));
        assert_eq!(Expr::parse("a + b * c").unwrap().names(), ["a", "b", "c"]);
        for (bad, says) in [
            ("a +", "missing"),
            ("(a", "')'"),
            ("a b", "'b' is not expected"),
            ("cbrt(a)", "not one of"),
            ("min(a)", "takes 2"),
            ("1.2.3", "not a number"),
        ] {
            let e = Expr::parse(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }
}
