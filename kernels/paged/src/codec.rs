//! The element codes of a narrow KV cache: FP8 E4M3 as the OCP 8-bit floating-point
//! specification's "E4M3" (PyTorch's `float8_e4m3fn`: bias 7, no infinities, ±448 the largest
//! finite value, S.1111.111 the only NaN) and symmetric int8, each with a scale per
//! (block, KV head) or per KV head, so a stored value is `scale · decode(code)`.
//!
//! Encoding E4M3 is PyTorch's `c10::detail::fp8e4m3fn_from_fp32_value` (round to nearest,
//! ties to even) after clamping to ±448: the OCP "saturating" conversion that vLLM's and
//! Transformer Engine's FP8 casts apply (PyTorch's bare cast turns values ≥ 464 into NaN).
//! ±∞ saturate to ±448, NaN stays NaN. Int8 is `clamp(round(x / scale), −127, 127)` with
//! `scale = absmax / 127`, like the quant family's `sym8`; −128 is never written, so it marks
//! an unwritten slot (int8 has no NaN).

/// Largest finite E4M3 magnitude.
pub const E4M3_MAX: f32 = 448.0;
/// Largest int8 code magnitude the symmetric encoder writes.
pub const INT8_MAX: f32 = 127.0;
/// The E4M3 NaN (positive sign): what an unwritten FP8 slot holds.
pub const E4M3_NAN: u8 = 0x7F;
/// The int8 code the encoder never writes: what an unwritten int8 slot holds.
pub const INT8_UNWRITTEN: i8 = -128;

/// The f32 bits of E4M3 byte `b`, built from its fields (subnormals normalised).
const fn e4m3_bits(b: u8) -> u32 {
    let sign = ((b as u32) >> 7) << 31;
    let exp = ((b >> 3) & 0xF) as u32;
    let man = (b & 0x7) as u32;
    if exp == 0xF && man == 0x7 {
        return sign | 0x7FC0_0000;
    }
    if exp == 0 {
        if man == 0 {
            return sign;
        }
        // man · 2^-9 = 1.f · 2^(k − 9) with k the top set bit of man.
        let k = 31 - man.leading_zeros();
        let frac = (man - (1 << k)) << (23 - k);
        return sign | ((k + 127 - 9) << 23) | frac;
    }
    sign | ((exp + 127 - 7) << 23) | (man << 20)
}

const fn e4m3_table() -> [f32; 256] {
    let mut t = [0.0f32; 256];
    let mut b = 0;
    while b < 256 {
        t[b] = f32::from_bits(e4m3_bits(b as u8));
        b += 1;
    }
    t
}

/// Every E4M3 byte's value.
pub static E4M3_VALUES: [f32; 256] = e4m3_table();

/// The value of E4M3 byte `b`.
#[inline(always)]
pub fn e4m3_to_f32(b: u8) -> f32 {
    E4M3_VALUES[b as usize]
}

/// PyTorch's float → float8_e4m3fn conversion (`fp8e4m3fn_from_fp32_value`), bit for bit.
fn torch_e4m3(f: f32) -> u8 {
    const FP8_MAX: u32 = 1087 << 20; // 480.0: from here on, NaN
    const DENORM_MASK: u32 = 141 << 23;
    let mut bits = f.to_bits();
    let sign = bits & 0x8000_0000;
    bits ^= sign;
    let result = if bits >= FP8_MAX {
        E4M3_NAN
    } else if bits < (121 << 23) {
        // Below the smallest normal (2^-6): adding 2^14 rounds the mantissa in hardware.
        let b = (f32::from_bits(bits) + f32::from_bits(DENORM_MASK)).to_bits();
        (b - DENORM_MASK) as u8
    } else {
        let mant_odd = (bits >> 20) & 1;
        let b = bits
            .wrapping_add(((7i32 - 127) as u32) << 23)
            .wrapping_add(0x7FFFF)
            .wrapping_add(mant_odd);
        (b >> 20) as u8
    };
    result | (sign >> 24) as u8
}

/// `x` as E4M3, saturating: finite values and ±∞ beyond ±448 become ±448, NaN stays NaN.
#[inline]
pub fn e4m3_from_f32(x: f32) -> u8 {
    torch_e4m3(x.clamp(-E4M3_MAX, E4M3_MAX))
}

/// `x / scale` as a symmetric int8 code (`scale > 0`), saturating at ±127.
#[inline]
pub fn int8_from_f32(x: f32, scale: f32) -> i8 {
    (x / scale).round().clamp(-INT8_MAX, INT8_MAX) as i8
}

/// The narrow codes a KV cache can hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Code {
    /// FP8 E4M3 (`float8_e4m3fn`).
    E4m3,
    /// Symmetric int8.
    Int8,
}

impl Code {
    /// The code magnitude that `absmax` maps to.
    pub fn max(self) -> f32 {
        match self {
            Code::E4m3 => E4M3_MAX,
            Code::Int8 => INT8_MAX,
        }
    }

    /// The scale of a group whose largest magnitude is `absmax`: `absmax / max` (0 for an
    /// all-zero group, whose codes are then 0; NaN when a value is not finite, so every read
    /// of the group is NaN as an f32 cache's would be).
    pub fn scale_for(self, absmax: f32) -> f32 {
        if !absmax.is_finite() {
            f32::NAN
        } else {
            absmax / self.max()
        }
    }

    /// The byte an unwritten slot holds.
    pub fn unwritten(self) -> u8 {
        match self {
            Code::E4m3 => E4M3_NAN,
            Code::Int8 => INT8_UNWRITTEN as u8,
        }
    }

    /// The byte of `x` under `scale` (0 when the scale is 0 or NaN: the scale carries the
    /// group's value then).
    #[inline]
    pub fn encode(self, x: f32, scale: f32) -> u8 {
        if scale.is_nan() || scale <= 0.0 {
            return 0;
        }
        match self {
            Code::E4m3 => e4m3_from_f32(x / scale),
            Code::Int8 => int8_from_f32(x, scale) as u8,
        }
    }

    /// The code's value before scaling.
    #[inline(always)]
    pub fn value(self, b: u8) -> f32 {
        match self {
            Code::E4m3 => e4m3_to_f32(b),
            Code::Int8 => b as i8 as f32,
        }
    }

    /// The stored value of byte `b` under `scale`.
    #[inline(always)]
    pub fn decode(self, b: u8, scale: f32) -> f32 {
        self.value(b) * scale
    }
}

/// The larger of two magnitudes, NaN if either is (`f32::max` would drop a NaN).
pub fn max_nan(a: f32, b: f32) -> f32 {
    if a.is_nan() || b.is_nan() {
        f32::NAN
    } else {
        a.max(b)
    }
}

/// Largest magnitude of `x` (NaN if any element is NaN; ∞ if any is infinite).
pub fn absmax(x: &[f32]) -> f32 {
    x.iter().fold(0.0f32, |m, &v| max_nan(m, v.abs()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_give_the_specification_values() {
        assert_eq!(e4m3_to_f32(0x00), 0.0);
        assert!(e4m3_to_f32(0x80).is_sign_negative() && e4m3_to_f32(0x80) == 0.0);
        // Exact literals: `powi`'s precision is unspecified (Miri perturbs it, and so may a
        // platform's libm), and these are the specification's exact values.
        assert_eq!(e4m3_to_f32(0x01), 1.0 / 512.0); // smallest subnormal, 2^-9
        assert_eq!(e4m3_to_f32(0x07), 7.0 / 512.0); // largest subnormal
        assert_eq!(e4m3_to_f32(0x08), 1.0 / 64.0); // smallest normal, 2^-6
        assert_eq!(e4m3_to_f32(0x38), 1.0);
        assert_eq!(e4m3_to_f32(0x7E), 448.0);
        assert_eq!(e4m3_to_f32(0xFE), -448.0);
        assert!(e4m3_to_f32(0x7F).is_nan() && e4m3_to_f32(0xFF).is_nan());
        assert_eq!(e4m3_to_f32(0x78), 256.0); // exponent 15 is a normal binade
    }

    #[test]
    fn int8_scale_edges() {
        assert_eq!(Code::Int8.scale_for(0.0), 0.0);
        assert_eq!(Code::Int8.encode(0.0, 0.0), 0);
        assert!(Code::E4m3.scale_for(f32::INFINITY).is_nan());
        assert!(Code::Int8.scale_for(f32::NAN).is_nan());
        assert_eq!(Code::Int8.encode(5.0, f32::NAN), 0);
        let s = Code::Int8.scale_for(2.54);
        assert_eq!(Code::Int8.encode(2.54, s) as i8, 127);
        assert_eq!(Code::Int8.encode(-2.54, s) as i8, -127);
        assert_eq!(Code::Int8.encode(1e9, s) as i8, 127);
        assert_eq!(absmax(&[1.0, -3.0, 2.0]), 3.0);
        assert!(absmax(&[1.0, f32::NAN]).is_nan());
        assert_eq!(absmax(&[]), 0.0);
    }
}
