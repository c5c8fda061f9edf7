//! What a KV cache stores its blocks in (`--kv-cache`): f32, f16, bf16, FP8 E4M3 or int8, the
//! narrow codes with a scale per (block, KV head) — the default — or per KV head; uniformly,
//! or progressively (the recent tokens of a sequence in one format, blocks that age past a
//! window of W tokens re-encoded in another: C20's "FP16 → FP8 → INT8 for distant tokens",
//! KIVI's full-precision residual window of recent tokens). The bytes per token of each.

use crate::codec::Code;
use kernel_common::error::Result;
use kernel_common::{DType, KernelError};
use std::fmt;

/// Which values share a scale.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ScaleScope {
    /// One scale per (block, KV head), grown as the block fills (`absmax / code max`).
    Block,
    /// One scale per KV head for the whole cache, set by the first write into the cache
    /// (vLLM's `calculate_kv_scales`: the scale of the first forward pass, then fixed); later
    /// values beyond it saturate.
    Head,
}

/// How the elements of one block are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BlockFormat {
    /// A float storage type.
    Float(DType),
    /// Narrow codes and their scales.
    Coded(Code, ScaleScope),
}

impl BlockFormat {
    /// Parses `f32`, `f16`, `bf16`, `fp8` (= `e4m3`), `int8`, with `:per_head` (or the
    /// default `:per_block`) after a narrow code.
    pub fn parse(text: &str) -> Result<BlockFormat> {
        let (base, scope) = match text.split_once(':') {
            Some((b, "per_block")) => (b, Some(ScaleScope::Block)),
            Some((b, "per_head")) => (b, Some(ScaleScope::Head)),
            Some((_, s)) => return Err(unknown(&format!("{text} (scale scope '{s}')"))),
            None => (text, None),
        };
        let code = match base {
            "fp8" | "e4m3" => Code::E4m3,
            "int8" => Code::Int8,
            _ if scope.is_none() => {
                return DType::parse(base)
                    .map(BlockFormat::Float)
                    .map_err(|_| unknown(text))
            }
            _ => return Err(unknown(text)),
        };
        Ok(BlockFormat::Coded(code, scope.unwrap_or(ScaleScope::Block)))
    }

    /// Bytes of one stored element.
    pub fn element_bytes(self) -> usize {
        match self {
            BlockFormat::Float(dt) => dt.size(),
            BlockFormat::Coded(..) => 1,
        }
    }

    /// Bytes of K and V for one token of one KV head of `head_dim` in blocks of
    /// `block_size` (per-block f32 scales amortised over the block; per-head scales, a few
    /// bytes for the whole cache, counted as 0).
    pub fn bytes_per_head_token(self, head_dim: usize, block_size: usize) -> f64 {
        let scale = match self {
            BlockFormat::Coded(_, ScaleScope::Block) => 4.0 / block_size as f64,
            _ => 0.0,
        };
        2.0 * ((head_dim * self.element_bytes()) as f64 + scale)
    }
}

impl fmt::Display for BlockFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BlockFormat::Float(dt) => write!(f, "{dt}"),
            BlockFormat::Coded(code, scope) => {
                f.write_str(match code {
                    Code::E4m3 => "fp8",
                    Code::Int8 => "int8",
                })?;
                match scope {
                    ScaleScope::Block => Ok(()),
                    ScaleScope::Head => f.write_str(":per_head"),
                }
            }
        }
    }
}

fn unknown(text: &str) -> KernelError {
    KernelError::Unsupported(format!(
        "unknown KV-cache format '{text}' (expected f32, f16, bf16, fp8, int8, fp8:per_head, \
         int8:per_head, or progressive:window=N,old=FORMAT[,recent=FORMAT])"
    ))
}

/// A whole cache's format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KvCacheFormat {
    /// Every block in one format.
    Uniform(BlockFormat),
    /// Blocks in `recent` until they lie entirely more than `window` tokens behind the end of
    /// their sequence, then re-encoded in `old`.
    Progressive {
        recent: BlockFormat,
        old: BlockFormat,
        window: usize,
    },
}

impl Default for KvCacheFormat {
    fn default() -> Self {
        KvCacheFormat::Uniform(BlockFormat::Float(DType::F32))
    }
}

impl KvCacheFormat {
    /// Parses a block format (`int8:per_head`, ...) or
    /// `progressive:window=N,old=FORMAT[,recent=FORMAT]` (recent defaults to f16).
    pub fn parse(text: &str) -> Result<KvCacheFormat> {
        let Some(params) = text.strip_prefix("progressive:") else {
            if text == "progressive" {
                return Err(KernelError::Unsupported(
                    "progressive needs its window and old format: progressive:window=N,old=FORMAT"
                        .into(),
                ));
            }
            return BlockFormat::parse(text).map(KvCacheFormat::Uniform);
        };
        let (mut window, mut old, mut recent) = (None, None, BlockFormat::Float(DType::F16));
        for kv in params.split(',') {
            let bad = || {
                KernelError::Unsupported(format!(
                    "progressive KV cache: '{kv}' is not window=N, old=FORMAT or recent=FORMAT"
                ))
            };
            let (k, v) = kv.split_once('=').ok_or_else(bad)?;
            match k {
                "window" => {
                    window = Some(v.parse::<usize>().ok().filter(|&w| w > 0).ok_or_else(|| {
                        KernelError::Unsupported(format!(
                            "progressive KV cache: window must be a positive token count, got '{v}'"
                        ))
                    })?)
                }
                "old" => old = Some(BlockFormat::parse(v)?),
                "recent" => recent = BlockFormat::parse(v)?,
                _ => return Err(bad()),
            }
        }
        let missing = |what: &str| {
            KernelError::Unsupported(format!(
                "progressive KV cache '{text}' has no {what}= (progressive:window=N,old=FORMAT)"
            ))
        };
        Ok(KvCacheFormat::Progressive {
            recent,
            old: old.ok_or_else(|| missing("old"))?,
            window: window.ok_or_else(|| missing("window"))?,
        })
    }

    /// The format new tokens are written in.
    pub fn recent(&self) -> BlockFormat {
        match *self {
            KvCacheFormat::Uniform(f) => f,
            KvCacheFormat::Progressive { recent, .. } => recent,
        }
    }

    /// The f32 format: what an unquantised cache is.
    pub fn is_f32(&self) -> bool {
        *self == KvCacheFormat::default()
    }

    /// Tokens of a `tokens`-long sequence held in the old format (whole blocks that lie
    /// entirely more than the window behind its end).
    pub fn old_tokens(&self, tokens: usize, block_size: usize) -> usize {
        match *self {
            KvCacheFormat::Uniform(_) => 0,
            KvCacheFormat::Progressive { window, .. } => {
                tokens.saturating_sub(window) / block_size * block_size
            }
        }
    }

    /// Mean bytes per token of one layer's K and V over a `tokens`-long sequence.
    pub fn bytes_per_token(
        &self,
        tokens: usize,
        kv_heads: usize,
        head_dim: usize,
        block_size: usize,
    ) -> f64 {
        let per = |f: BlockFormat| kv_heads as f64 * f.bytes_per_head_token(head_dim, block_size);
        match *self {
            KvCacheFormat::Uniform(f) => per(f),
            KvCacheFormat::Progressive { recent, old, .. } => {
                let n = tokens.max(1);
                let aged = self.old_tokens(n, block_size);
                (aged as f64 * per(old) + (n - aged) as f64 * per(recent)) / n as f64
            }
        }
    }
}

impl fmt::Display for KvCacheFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KvCacheFormat::Uniform(b) => write!(f, "{b}"),
            KvCacheFormat::Progressive {
                recent,
                old,
                window,
            } => {
                write!(f, "progressive:window={window},old={old}")?;
                if *recent != BlockFormat::Float(DType::F16) {
                    write!(f, ",recent={recent}")?;
                }
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_parse_and_print_back() {
        for text in [
            "f32",
            "f16",
            "bf16",
            "fp8",
            "int8",
            "int8:per_head",
            "fp8:per_head",
            "progressive:window=256,old=int8",
            "progressive:window=64,old=fp8:per_head,recent=bf16",
        ] {
            let f = KvCacheFormat::parse(text).unwrap();
            assert_eq!(f.to_string(), text);
            assert_eq!(KvCacheFormat::parse(&f.to_string()).unwrap(), f);
        }
        assert_eq!(
            KvCacheFormat::parse("e4m3:per_block").unwrap().to_string(),
            "fp8"
        );
        assert!(KvCacheFormat::default().is_f32());
    }

    #[test]
    fn bad_formats_are_one_line_errors() {
        for (text, says) in [
            ("int9", "unknown KV-cache format 'int9'"),
            ("f16:per_head", "unknown KV-cache format"),
            ("int8:per_row", "scale scope 'per_row'"),
            ("progressive", "needs its window"),
            ("progressive:window=0,old=int8", "window must be a positive"),
            ("progressive:window=x,old=int8", "window must be a positive"),
            ("progressive:old=int8", "has no window="),
            ("progressive:window=8", "has no old="),
            (
                "progressive:window=8,old=q4",
                "unknown KV-cache format 'q4'",
            ),
            ("progressive:window=8,old=int8,depth=2", "'depth=2'"),
        ] {
            let err = KvCacheFormat::parse(text).unwrap_err().to_string();
            assert!(err.contains(says), "{text}: {err}");
            assert!(!err.contains('\n'));
        }
    }

    #[test]
    fn bytes_per_token() {
        let f = |t: &str| KvCacheFormat::parse(t).unwrap();
        // SmolLM2: 3 KV heads of 64, blocks of 16.
        assert_eq!(f("f32").bytes_per_token(512, 3, 64, 16), 2.0 * 3.0 * 256.0);
        assert_eq!(f("f16").bytes_per_token(512, 3, 64, 16), 2.0 * 3.0 * 128.0);
        assert_eq!(f("int8").bytes_per_token(512, 3, 64, 16), 2.0 * 3.0 * 64.25);
        assert_eq!(f("fp8:per_head").bytes_per_token(512, 3, 64, 16), 384.0);
        let p = f("progressive:window=256,old=int8");
        assert_eq!(p.old_tokens(512, 16), 256);
        assert_eq!(p.old_tokens(270, 16), 0);
        assert_eq!(p.old_tokens(300, 16), 32);
        let want = (256.0 * 2.0 * 3.0 * 64.25 + 256.0 * 2.0 * 3.0 * 128.0) / 512.0;
        assert_eq!(p.bytes_per_token(512, 3, 64, 16), want);
    }
}
