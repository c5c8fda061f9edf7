//! The formats of each accuracy measurement: one layer (or one projection kind across every
//! layer) quantised and dequantised back to f32 while the rest stays f32 — the per-layer
//! sensitivity scan of mixed-precision work such as HAWQ (Dong et al. 2019) and llama.cpp's
//! `--tensor-type` overrides, measured by the KL divergence it adds — the ranking of those
//! scans, and the mixed-precision plan built from it: the most sensitive layers in the high
//! format, every other matrix in the low one, both as real packed formats.

use super::bench::Formats;
use kernel_quant::WeightFormat;
use models::{Proj, WeightOverride};

/// f32 weights with layer `layer` (every projection) quantised to `f`, simulated.
pub fn one_layer(layer: usize, f: WeightFormat) -> Formats {
    Formats {
        weights: WeightFormat::F32,
        overrides: vec![WeightOverride {
            layer: Some(layer),
            proj: None,
            format: f,
            simulate: true,
        }],
    }
}

/// f32 weights with projection kind `proj` of every layer quantised to `f`, simulated.
pub fn one_projection(proj: Proj, f: WeightFormat) -> Formats {
    Formats {
        weights: WeightFormat::F32,
        overrides: vec![WeightOverride {
            layer: None,
            proj: Some(proj),
            format: f,
            simulate: true,
        }],
    }
}

/// Positions of `kls` from the largest KL to the smallest (ties: the earlier first).
pub fn rank_by_kl(kls: &[f64]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..kls.len()).collect();
    order.sort_by(|&a, &b| kls[b].total_cmp(&kls[a]).then(a.cmp(&b)));
    order
}

/// The rank (1 = the most sensitive) of each position of `kls`.
pub fn ranks(kls: &[f64]) -> Vec<usize> {
    let mut r = vec![0; kls.len()];
    for (place, i) in rank_by_kl(kls).into_iter().enumerate() {
        r[i] = place + 1;
    }
    r
}

/// The mixed plan: the first `top` layers of `ranked` (layer indices, most sensitive first)
/// in `high`, everything else in `low`; real formats. Returns the formats and the layers kept
/// high, in layer order.
pub fn mixed(
    ranked: &[usize],
    top: usize,
    low: WeightFormat,
    high: WeightFormat,
) -> (Formats, Vec<usize>) {
    let mut kept: Vec<usize> = ranked.iter().take(top).copied().collect();
    kept.sort_unstable();
    let overrides = kept
        .iter()
        .map(|&l| WeightOverride {
            layer: Some(l),
            proj: None,
            format: high,
            simulate: false,
        })
        .collect();
    (
        Formats {
            weights: low,
            overrides,
        },
        kept,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranking_puts_the_largest_kl_first_and_keeps_ties_in_order() {
        let kls = [0.1, 0.5, 0.0, 0.5, 0.2];
        assert_eq!(rank_by_kl(&kls), vec![1, 3, 4, 0, 2]);
        assert_eq!(ranks(&kls), vec![4, 1, 5, 2, 3]);
        assert!(rank_by_kl(&[]).is_empty());
    }

    #[test]
    fn the_plan_keeps_the_top_layers_high_and_the_rest_low() {
        let low = WeightFormat::parse("sym4g32").unwrap();
        let high = WeightFormat::parse("sym8g32").unwrap();
        let (f, kept) = mixed(&[7, 2, 9, 0], 2, low, high);
        assert_eq!(kept, vec![2, 7]);
        assert_eq!(f.weights, low);
        assert_eq!(f.overrides.len(), 2);
        assert!(f
            .overrides
            .iter()
            .all(|o| o.format == high && !o.simulate && o.proj.is_none()));
        assert_eq!(f.overrides[0].layer, Some(2));
        // More layers asked for than ranked: every ranked layer, no more.
        assert_eq!(mixed(&[1, 0], 5, low, high).1, vec![0, 1]);
        assert!(mixed(&[1, 0], 0, low, high).0.overrides.is_empty());
    }

    #[test]
    fn scans_override_one_layer_or_one_projection_simulated_over_f32() {
        let f = WeightFormat::parse("sym3g32").unwrap();
        let l = one_layer(4, f);
        assert_eq!(l.weights, WeightFormat::F32);
        assert_eq!(l.overrides[0].layer, Some(4));
        assert!(l.overrides[0].simulate && l.overrides[0].proj.is_none());
        let p = one_projection(Proj::Down, f);
        assert_eq!(p.overrides[0].proj, Some(Proj::Down));
        assert!(p.overrides[0].layer.is_none());
    }
}
