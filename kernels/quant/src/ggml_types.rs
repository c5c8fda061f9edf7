//! ggml's tensor type ids (the `enum ggml_type` of llama.cpp's `ggml.h`, which GGUF files
//! store per tensor) and their names: the ids this workbench reads as a `WeightFormat`, and a
//! name for every id ggml defines, so a loader can say which type it met and that it does
//! not read it.

use crate::format::WeightFormat;

/// The name of every id of `enum ggml_type` (ggml.h), index = id: those it marks removed
/// (Q4_2 and Q4_3 = 4, 5; the repacked Q4_0_4_4.. = 31–33 and IQ4_NL_4_4.. = 36–38) included,
/// since an old file may still carry them.
const GGML_TYPE_NAMES: [&str; 43] = [
    "F32",
    "F16",
    "Q4_0",
    "Q4_1",
    "Q4_2",
    "Q4_3",
    "Q5_0",
    "Q5_1",
    "Q8_0",
    "Q8_1",
    "Q2_K",
    "Q3_K",
    "Q4_K",
    "Q5_K",
    "Q6_K",
    "Q8_K",
    "IQ2_XXS",
    "IQ2_XS",
    "IQ3_XXS",
    "IQ1_S",
    "IQ4_NL",
    "IQ3_S",
    "IQ2_S",
    "IQ4_XS",
    "I8",
    "I16",
    "I32",
    "I64",
    "F64",
    "IQ1_M",
    "BF16",
    "Q4_0_4_4",
    "Q4_0_4_8",
    "Q4_0_8_8",
    "TQ1_0",
    "TQ2_0",
    "IQ4_NL_4_4",
    "IQ4_NL_4_8",
    "IQ4_NL_8_8",
    "MXFP4",
    "NVFP4",
    "Q1_0",
    "Q2_0",
];

/// The ggml name of type `id` (`"IQ2_XXS"` for 16) for every id below `GGML_TYPE_COUNT`
/// (43); `None` above.
pub fn ggml_type_name(id: u32) -> Option<&'static str> {
    GGML_TYPE_NAMES.get(id as usize).copied()
}

/// The formats with a ggml type id.
const FORMATS: [(u32, WeightFormat); 15] = [
    (0, WeightFormat::F32),
    (1, WeightFormat::F16),
    (2, WeightFormat::Q4_0),
    (3, WeightFormat::Q4_1),
    (6, WeightFormat::Q5_0),
    (7, WeightFormat::Q5_1),
    (8, WeightFormat::Q8_0),
    (10, WeightFormat::Q2_K),
    (11, WeightFormat::Q3_K),
    (12, WeightFormat::Q4_K),
    (13, WeightFormat::Q5_K),
    (14, WeightFormat::Q6_K),
    (15, WeightFormat::Q8_K),
    (20, WeightFormat::IQ4_NL),
    (30, WeightFormat::BF16),
];

impl WeightFormat {
    /// The format of ggml type `id`, when this workbench reads it (F32 0, F16 1, Q4_0 2,
    /// Q4_1 3, Q5_0 6, Q5_1 7, Q8_0 8, Q2_K 10 … Q8_K 15, IQ4_NL 20, BF16 30).
    pub fn from_ggml_type(id: u32) -> Option<WeightFormat> {
        FORMATS.iter().find(|(i, _)| *i == id).map(|(_, f)| *f)
    }

    /// The ggml type id of this format (`None` for the sym/asym groups, which ggml lacks).
    pub fn ggml_type(self) -> Option<u32> {
        FORMATS.iter().find(|(_, f)| *f == self).map(|(i, _)| *i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_every_id_has_a_name() {
        for (id, f) in FORMATS {
            assert_eq!(WeightFormat::from_ggml_type(id), Some(f));
            assert_eq!(f.ggml_type(), Some(id));
            // Our names are ggml's, lower-cased.
            assert_eq!(ggml_type_name(id).unwrap().to_lowercase(), f.to_string());
        }
        assert_eq!(ggml_type_name(16), Some("IQ2_XXS"));
        assert_eq!(ggml_type_name(30), Some("BF16"));
        assert_eq!(ggml_type_name(34), Some("TQ1_0"));
        assert_eq!(ggml_type_name(39), Some("MXFP4"));
        assert_eq!(ggml_type_name(42), Some("Q2_0"));
        assert_eq!(ggml_type_name(4), Some("Q4_2"));
        assert_eq!(ggml_type_name(20), Some("IQ4_NL"));
        assert_eq!(ggml_type_name(43), None);
        assert_eq!(ggml_type_name(u32::MAX), None);
        assert_eq!(WeightFormat::from_ggml_type(16), None);
        assert_eq!(WeightFormat::from_ggml_type(9), None);
        assert_eq!(WeightFormat::parse("sym4g32").unwrap().ggml_type(), None);
    }
}
