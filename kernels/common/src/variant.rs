//! Variant specs as the CLI and experiment files write them: `name` or `name:key=value,...`
//! (e.g. `flash2:br=64,bc=32`, `paged:bs=16,split=512`). Each family parses its own keys.

use crate::error::{KernelError, Result};
use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

/// Where a variant runs: an explicit field of every variant, not inferred from its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Runs {
    Cpu,
    Cuda,
}

impl Runs {
    /// `cpu` or `cuda`.
    pub fn as_str(self) -> &'static str {
        match self {
            Runs::Cpu => "cpu",
            Runs::Cuda => "cuda",
        }
    }
}

/// A variant as a family crate lists it in its `VARIANTS` table: the name its spec starts
/// with, where it runs, and one line on what it is (its parameters included).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VariantInfo {
    pub name: &'static str,
    pub device: Runs,
    pub about: &'static str,
}

impl VariantInfo {
    /// A CPU variant.
    pub const fn cpu(name: &'static str, about: &'static str) -> VariantInfo {
        VariantInfo {
            name,
            device: Runs::Cpu,
            about,
        }
    }

    /// A CUDA variant (`--device cuda`).
    pub const fn cuda(name: &'static str, about: &'static str) -> VariantInfo {
        VariantInfo {
            name,
            device: Runs::Cuda,
            about,
        }
    }
}

/// A variant name with its parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VariantSpec {
    /// The variant's base name (`flash2`).
    pub name: String,
    /// Parameters in key order.
    pub params: BTreeMap<String, String>,
}

impl VariantSpec {
    /// Parses `name[:k=v,k=v]`.
    pub fn parse(text: &str) -> Result<VariantSpec> {
        let bad = |why: &str| KernelError::Unsupported(format!("bad variant '{text}': {why}"));
        let (name, rest) = match text.split_once(':') {
            Some((n, r)) => (n, Some(r)),
            None => (text, None),
        };
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(bad("the name must be letters, digits or _"));
        }
        let mut params = BTreeMap::new();
        for pair in rest.into_iter().flat_map(|r| r.split(',')) {
            let (k, v) = pair
                .split_once('=')
                .ok_or_else(|| bad("parameters are key=value"))?;
            if k.is_empty() || v.is_empty() {
                return Err(bad("empty key or value"));
            }
            if params.insert(k.to_string(), v.to_string()).is_some() {
                return Err(bad(&format!("parameter '{k}' given twice")));
            }
        }
        Ok(VariantSpec {
            name: name.to_string(),
            params,
        })
    }

    /// Fails when a parameter other than `allowed` is present.
    pub fn only(&self, allowed: &[&str]) -> Result<()> {
        match self.params.keys().find(|k| !allowed.contains(&k.as_str())) {
            Some(k) => Err(KernelError::Unsupported(format!(
                "variant '{}' has no parameter '{k}' (it takes: {})",
                self.name,
                if allowed.is_empty() {
                    "none".to_string()
                } else {
                    allowed.join(", ")
                }
            ))),
            None => Ok(()),
        }
    }

    /// Parameter `key` parsed as `T`, or `default` when absent.
    pub fn get<T: FromStr>(&self, key: &str, default: T) -> Result<T> {
        match self.params.get(key) {
            None => Ok(default),
            Some(v) => v.parse().map_err(|_| {
                KernelError::Unsupported(format!(
                    "variant '{}': parameter {key}='{v}' is not a valid value",
                    self.name
                ))
            }),
        }
    }
}

impl fmt::Display for VariantSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)?;
        for (i, (k, v)) in self.params.iter().enumerate() {
            write!(f, "{}{k}={v}", if i == 0 { ':' } else { ',' })?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints() {
        let s = VariantSpec::parse("paged:split=512,bs=16").unwrap();
        assert_eq!(s.name, "paged");
        assert_eq!(s.get::<usize>("bs", 0).unwrap(), 16);
        assert_eq!(s.get::<usize>("missing", 7).unwrap(), 7);
        assert_eq!(s.to_string(), "paged:bs=16,split=512");
        assert!(s.only(&["bs"]).is_err());
        assert!(s.only(&["bs", "split"]).is_ok());
        assert!(VariantSpec::parse("flash2").unwrap().params.is_empty());
    }

    #[test]
    fn rejects_malformed() {
        for bad in ["", ":x=1", "a:b", "a:=1", "a:b=", "a:b=1,b=2", "a b"] {
            assert!(VariantSpec::parse(bad).is_err(), "{bad}");
        }
        let s = VariantSpec::parse("flash2:br=x").unwrap();
        assert!(s.get::<usize>("br", 64).is_err());
    }
}
