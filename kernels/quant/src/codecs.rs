//! The table of the formats with a `crate::unpack::Codec` (Q5_0, Q5_1, IQ4_NL, Q2_K..Q8_K):
//! `with_codec!` binds a format's codec type, for the code that is generic over codecs
//! (`matrix`, `codec_kernels`); kept apart from `unpack` so the codecs, which implement its
//! trait, and the table, which names them, do not import each other.

use crate::codec_kernels::prims::Plain;
use crate::format::WeightFormat;
use crate::unpack::{Codec, Unpacked};

/// Calls `$body` with `$c` bound to the codec type of `$format` (one of the formats with a
/// `Codec`), or evaluates `$other` for every other format.
macro_rules! with_codec {
    ($format:expr, $c:ident => $body:expr, _ => $other:expr) => {{
        use crate::format::WeightFormat as F;
        match $format {
            F::Q5_0 => {
                type $c = crate::ggml::Q50;
                $body
            }
            F::Q5_1 => {
                type $c = crate::ggml::Q51;
                $body
            }
            F::IQ4_NL => {
                type $c = crate::iq4nl::Iq4Nl;
                $body
            }
            F::Q2_K => {
                type $c = crate::kquants::q2_k::Q2K;
                $body
            }
            F::Q3_K => {
                type $c = crate::kquants::q3_k::Q3K;
                $body
            }
            F::Q4_K => {
                type $c = crate::kquants::q4_k::Q4K;
                $body
            }
            F::Q5_K => {
                type $c = crate::kquants::q4_k::Q5K;
                $body
            }
            F::Q6_K => {
                type $c = crate::kquants::q6_k::Q6K;
                $body
            }
            F::Q8_K => {
                type $c = crate::kquants::q8_k::Q8K;
                $body
            }
            _ => $other,
        }
    }};
}
pub(crate) use with_codec;

/// Whether `format` has a `Codec` (and so the unpacked products).
pub fn has_codec(format: WeightFormat) -> bool {
    with_codec!(format, C => { let _ = C::HAS_B; true }, _ => false)
}

/// The unpacked form of block `b` of `format`, for the formats with a `Codec`.
pub fn unpack_block(format: WeightFormat, b: &[u8]) -> Option<Unpacked> {
    with_codec!(format, C => {
        let mut u = Unpacked::default();
        C::unpack::<Plain>(b, &mut u);
        Some(u)
    }, _ => None)
}
