//! Command-line values under arbitrary text (`workbench_tests::fuzz`), seeded from the values
//! the README and the specs use: `--set` values (parsed, applied to every experiment spec's
//! grid, expanded into points for attention specs, read as counts), variant specs (parsed,
//! looked up by every family, and each attention kernel the spec names prepared and run on a
//! tiny shape), tree shapes (parsed and built), `--prompt` text (SmolLM2's tokenizer when
//! fetched, else a small byte-level one: encoding then decoding gives the text back) and
//! `--prompt-ids` (clap's parsing, the vocabulary check, a forward pass on a preset).

use clap::Parser;
use harness::commands::generate::{prompt_ids, GenerateArgs};
use harness::run_files::GridValues;
use harness::spec::{parse_set, ExperimentSpec};
use kernel_attention::{AttentionInputs, AttentionShape};
use kernel_common::{Buffer, DType, Device};
use kernel_speculative::{DraftTree, TreeShape};
use models::{Session, TextTokenizer};
use proptest::prelude::*;
use workbench_tests::fuzz::{cases, exclusive, fuzz, gpt2_byte_chars, mutated, Bound, Case, Seed};

/// Values on a command line: no file to be proportional to; what they may build is capped
/// (grid points, tree nodes, tile sizes), so the bound is a fixed 64 MiB.
const CAPPED: Bound = Bound {
    factor: 0,
    slack: 64 << 20,
};

fn text_seeds(values: &[&str]) -> Vec<Seed> {
    values
        .iter()
        .map(|v| Seed::text(*v, v.as_bytes().to_vec()))
        .collect()
}

/// Arbitrary strings beside the mutated seeds.
fn texts(seeds: &[Seed]) -> impl Strategy<Value = Case> {
    prop_oneof![
        3 => mutated(seeds),
        1 => any::<String>().prop_map(|s| Case { seed: 0, edits: vec![], bytes: s.into_bytes() }),
    ]
}

/// A command line's value: the OS hands clap bytes; clap refuses what is not UTF-8.
fn utf8(c: &Case) -> Result<&str, String> {
    std::str::from_utf8(&c.bytes).map_err(|_| "invalid UTF-8 was detected".to_string())
}

fn specs() -> Vec<ExperimentSpec> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../experiments");
    ExperimentSpec::list(&dir).unwrap()
}

#[test]
fn set_values_apply_or_name_the_problem() {
    let _heap = exclusive();
    let specs: Vec<_> = specs()
        .into_iter()
        .map(|s| {
            let family = harness::commands::exp::family_of(&s).unwrap();
            (s, family)
        })
        .collect();
    let seeds = text_seeds(&[
        "mode=decode",
        "kv_len=4096,16384",
        "batch=8",
        "heads=32/8,mqa",
        "dtype=bf16",
        "format=f32,q4_0,sym4g32,asym3g128",
        "shape=4096x11008",
        "experts=64",
        "top_k=2",
        "capacity=1.2,dropless",
        "policy=score,order",
        "tree=static:3/2/1,dynamic:8",
        "tokens=50000000",
    ]);
    fuzz(
        "--set values",
        cases(3000),
        texts(&seeds),
        |c| c.bytes.len(),
        CAPPED,
        |_, m| !m.is_empty(),
        |c| {
            let set = parse_set(utf8(c)?).map_err(|e| e.to_string())?;
            for (spec, family) in &specs {
                let Ok(grid) =
                    spec.resolve_grid(family.grid_keys, false, std::slice::from_ref(&set))
                else {
                    continue; // a key of another family
                };
                let values = GridValues(&grid);
                for key in grid.keys() {
                    let _ = values.counts(key, &[]);
                    let _ = values.one::<f64>(key, "1", "a number", |x: f64| x.is_finite());
                }
                if spec.family == "attention" {
                    let _ = harness::families::attention::grid::points(&grid);
                }
            }
            Ok(())
        },
    );
}

/// Every lookup of a variant spec, and each attention kernel it names run on a tiny shape.
fn variant(text: &str) -> Result<(), String> {
    kernel_common::VariantSpec::parse(text).map_err(|e| e.to_string())?;
    for f in harness::families::FAMILIES.iter() {
        if let Some(e) = &f.exp {
            let _ = (e.variant)(text);
        }
    }
    let _ = harness::registry::quant_variant(text);
    let _ = harness::registry::moe_variant(text);
    let kernel = harness::registry::attention_kernel(text).map_err(|e| e.to_string())?;
    let shape = AttentionShape::new(1, 2, 1, 3, 5, 8, true);
    if kernel.supports(&shape, DType::F32, Device::Cpu).is_ok() {
        let inputs = AttentionInputs::random(&shape, DType::F32, 1);
        let mut out = Buffer::poisoned(DType::F32, shape.q_elems());
        if let Ok(mut p) = kernel.prepare(&shape, &inputs) {
            let _ = p.run(&mut out);
        };
    }
    Ok(())
}

#[test]
fn variant_specs_resolve_or_name_the_problem() {
    let _heap = exclusive();
    let mut values: Vec<String> = harness::families::all_variants()
        .iter()
        .map(|v| v.name.to_string())
        .collect();
    values.extend(
        [
            "flash2:br=64,bc=32",
            "flash2:br=7,bc=5,gemm=mm",
            "paged:bs=16,split=512",
            "paged:bs=32,split=auto",
            "paged:split=off",
            "fused:isa=avx2",
            "fused:act=q8",
            "packed:isa=portable",
            "cuda_paged:bs=16,split=auto,unroll=2",
        ]
        .map(String::from),
    );
    let seeds: Vec<Seed> = values
        .iter()
        .map(|v| Seed::text(v.clone(), v.as_bytes().to_vec()))
        .collect();
    fuzz(
        "variant specs",
        cases(3000),
        texts(&seeds),
        |c| c.bytes.len(),
        CAPPED,
        // A refusal names the variant, or the parameter or value at fault.
        |c, m| {
            let text = String::from_utf8_lossy(&c.bytes);
            let (name, params) = text.split_once(':').unwrap_or((&text, ""));
            let keys = params.split([',', '=']);
            m.contains("UTF-8")
                || m.contains("variant")
                || std::iter::once(name)
                    .chain(keys)
                    .any(|k| !k.is_empty() && m.contains(&harness::error::one_line(k)))
        },
        |c| variant(utf8(c)?),
    );
}

#[test]
fn tree_shapes_parse_and_build_or_name_the_problem() {
    let _heap = exclusive();
    let seeds = text_seeds(&[
        "chain:4",
        "static:3,2,1",
        "static:2/2/1",
        "static:4,2,2,1",
        "dynamic:16",
    ]);
    fuzz(
        "tree shapes",
        cases(3000),
        texts(&seeds),
        |c| c.bytes.len(),
        CAPPED,
        |_, m| m.contains("tree shape '") || m.contains("UTF-8"),
        |c| {
            let shape = TreeShape::parse(utf8(c)?).map_err(|e| e.to_string())?;
            let tree = match &shape {
                TreeShape::Static(b) => DraftTree::static_shape(b).map_err(|e| e.to_string())?,
                TreeShape::Chain(k) | TreeShape::Dynamic(k) => DraftTree::chain(*k),
            };
            assert_eq!(tree.len(), shape.max_nodes() + 1, "{shape:?}");
            assert_eq!(tree.height(), shape.max_depth(), "{shape:?}");
            Ok(())
        },
    );
}

/// SmolLM2's tokenizer, or the small byte-level one of a preset-shaped GGUF.
fn tokenizer() -> TextTokenizer {
    let path = "models/cache/SmolLM2-135M-Instruct.Q4_1.gguf";
    if let Some(bytes) = workbench_tests::fuzz::workspace_file(path) {
        let g = models::Gguf::parse(std::path::Path::new(path), bytes).unwrap();
        return TextTokenizer::from_gguf(&g).unwrap();
    }
    println!("SKIPPED SmolLM2's tokenizer: prompts go through a 256-token byte-level one");
    let vocab: Vec<(String, u32)> = gpt2_byte_chars()
        .into_iter()
        .zip(0u32..)
        .map(|(c, id)| (c.to_string(), id))
        .collect();
    let bpe = tokenizers::models::bpe::BPE::builder()
        .vocab_and_merges(
            vocab
                .into_iter()
                .collect::<tokenizers::models::bpe::Vocab>(),
            vec![],
        )
        .build()
        .unwrap();
    let mut inner = tokenizers::Tokenizer::new(bpe);
    inner.with_pre_tokenizer(Some(
        tokenizers::pre_tokenizers::byte_level::ByteLevel::new(false, true, true),
    ));
    inner.with_decoder(Some(tokenizers::decoders::byte_level::ByteLevel::default()));
    TextTokenizer::from_tokenizers(inner, 256, None, None, true)
}

#[test]
fn prompts_encode_and_decode_back() {
    let _heap = exclusive();
    let tok = tokenizer();
    let chars = gpt2_byte_chars();
    let seeds = text_seeds(&[
        "The capital of France is",
        "def f(x):\n    return x * 2  # 123456",
        "<|im_start|>user\nHi<|im_end|>",
        "Once upon a time, naïve café 東京 🙂",
    ]);
    fuzz(
        "--prompt text (tokenizer)",
        cases(3000),
        prop_oneof![
            3 => mutated(&seeds),
            1 => any::<String>().prop_map(|s| Case { seed: 0, edits: vec![], bytes: s.into_bytes() }),
        ],
        |c| c.bytes.len(),
        Bound {
            factor: 64,
            slack: 64 << 20,
        },
        |_, m| m.contains("tokeniz") || m.contains("UTF-8"),
        |c| {
            let text = utf8(c)?;
            // Independently of the tokenizer: does every byte of the text have its token?
            let holdable = text
                .bytes()
                .all(|b| tok.token_id(&chars[b as usize].to_string()).is_some());
            match tok.encode(text) {
                Ok(ids) => {
                    assert!(holdable, "{text:?} has a byte without a token, yet encoded");
                    assert!(
                        ids.iter().all(|&t| (t as usize) < tok.vocab_size),
                        "{ids:?}"
                    );
                    assert_eq!(tok.decode(&ids).unwrap(), text, "the prompt comes back");
                    Ok(())
                }
                Err(e) => {
                    assert!(
                        !holdable,
                        "{text:?} was refused ({e}) though every byte has a token"
                    );
                    Err(e.to_string())
                }
            }
        },
    );
}

/// `harness generate`'s own flags, parsed as its command line parses them.
#[derive(Parser)]
struct Generate {
    #[command(flatten)]
    args: GenerateArgs,
}

#[test]
fn prompt_ids_parse_and_run_or_name_the_problem() {
    let _heap = exclusive();
    let model = models::load("tiny-gqa", &models::LoadOptions::default())
        .unwrap()
        .model;
    let seeds = text_seeds(&["1,4093,198", "5,9,5,9,5", "511", "0,1,2,3,4,5,6,7"]);
    fuzz(
        "--prompt-ids",
        cases(2000),
        texts(&seeds),
        |c| c.bytes.len(),
        CAPPED,
        |_, m| !m.is_empty(),
        |c| {
            let ids = utf8(c)?;
            let parsed =
                Generate::try_parse_from(["generate", "--model", "tiny-gqa", "--prompt-ids", ids])
                    .map_err(|e| harness::error::clap_line(&e))?;
            let ids =
                prompt_ids(&parsed.args, None, None, model.cfg.vocab).map_err(|e| e.one_line())?;
            if ids.len() < model.cfg.context {
                let logits = Session::new(&model, ids.len(), 16)
                    .and_then(|mut s| s.forward(&ids))
                    .map_err(|e| e.to_string())?;
                assert_eq!(logits.len(), model.cfg.vocab);
            }
            Ok(())
        },
    );
}
