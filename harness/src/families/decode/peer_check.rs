//! The check a decode peer passes before its times are reported: llama.cpp's greedy
//! continuation of a fixed prompt (`llama-simple`, through the peer's `run`) scored by our
//! model in llama.cpp's arithmetic (`packed`: int8 activations on the same blocks). Our model
//! reads llama.cpp's text back token by token (teacher forcing, so one early near-tie does not
//! end the comparison) and at every step the token llama.cpp chose must be our top-1 or within
//! `MARGIN_LOGITS` of it; where llama.cpp stopped early (an end-of-generation token), our EOS
//! must be as close. A model that is not the one llama.cpp runs — another file, a wrong
//! dequantisation, a broken attention — misses by whole logits at a token it is sure of.

use crate::peer::PeerError;
use models::{argmax, Llama, Session, TextTokenizer};

/// The prompt both sides continue (English prose with an unambiguous start).
pub(super) const PROMPT: &str = "The capital of France is Paris. The capital of Germany is";
/// Greedy tokens llama.cpp generates after it.
pub(super) const TOKENS: usize = 32;
/// Most our top logit may exceed the logit of llama.cpp's choice at one step. Measured on this
/// prompt (2-vCPU Xeon, llama.cpp's AVX2 and AVX-512 builds, each file as shipped or
/// requantised by llama-quantize): the same file gives at most 0.31 logits (Qwen2.5-Coder-0.5B,
/// AVX-512 build; SmolLM2 Q4_0, Q4_1, Q4_K_M and Gemma-3-270M 0.00–0.12), while llama.cpp
/// on another quantisation of the same SmolLM2 than ours (Q4_0 / Q4_1 / Q4_K_M swapped) misses
/// by 1.40–5.34 and on another model by 10. 0.7 lies between, ×2.2 above the one and ×2 below
/// the other.
pub(super) const MARGIN_LOGITS: f32 = 0.7;

/// Why a peer's row has no times, or stopped: its status (`unsupported`, `unavailable`,
/// `error`, or `fail` where its tokens disagree with ours) and the reason.
#[derive(Debug, Clone)]
pub(super) struct Failure {
    pub status: &'static str,
    pub why: String,
}

impl From<PeerError> for Failure {
    fn from(e: PeerError) -> Failure {
        let (status, why) = e.status_and_why();
        Failure { status, why }
    }
}

/// What llama.cpp generated: its whole output (the prompt's pieces, then the continuation's)
/// and how many tokens it decoded (fewer than asked: it met an end-of-generation token).
pub(super) struct PeerText {
    pub text: String,
    pub decoded: usize,
}

/// The agreement of llama.cpp's continuation with our model: a note for the row, or why it
/// fails.
pub(super) fn agreement(
    m: &mut Llama,
    tok: &TextTokenizer,
    peer: &PeerText,
) -> Result<String, Failure> {
    let failed = |w: String| Failure::from(PeerError::Failed(format!("unchecked: {w}")));
    let (_, packed) =
        crate::registry::quant_variant("packed").map_err(|e| failed(e.to_string()))?;
    let before = m.matmul();
    m.set_matmul(packed).map_err(|e| failed(e.to_string()))?;
    let scored = score(m, tok, peer);
    m.set_matmul(before).map_err(|e| failed(e.to_string()))?;
    let s = scored?;
    let steps = s.margins.len();
    let top1 = s.margins.iter().filter(|&&d| d == 0.0).count();
    let worst = s.margins.iter().fold(0.0f32, |a, &d| a.max(d));
    let (at, _) = s
        .margins
        .iter()
        .enumerate()
        .fold((0, 0.0f32), |b, (i, &d)| if d > b.1 { (i, d) } else { b });
    let what = format!(
        "llama.cpp's greedy continuation ({} tokens{}) against ours (packed): {top1}/{steps} our top-1, worst margin {worst:.3} logits",
        s.tokens,
        if s.ended { " and its end" } else { "" }
    );
    if worst > MARGIN_LOGITS {
        return Err(Failure {
            status: "fail",
            why: format!(
                "{what} at step {at} (bound {MARGIN_LOGITS}); its text: {:?}",
                peer.text
            ),
        });
    }
    Ok(format!("checked: {what}"))
}

struct Scored {
    /// Per step, our top logit minus the logit of llama.cpp's choice (0: the same token).
    margins: Vec<f32>,
    tokens: usize,
    ended: bool,
}

fn score(m: &Llama, tok: &TextTokenizer, peer: &PeerText) -> Result<Scored, Failure> {
    let failed = |w: String| Failure::from(PeerError::Failed(format!("unchecked: {w}")));
    let prompt = tok.prompt_ids(PROMPT).map_err(|e| failed(e.to_string()))?;
    let echo = tok.decode(&prompt).map_err(|e| failed(e.to_string()))?;
    // llama-simple writes the prompt's pieces, then each generated piece, then a newline.
    let out = peer.text.strip_suffix('\n').unwrap_or(&peer.text);
    let Some(continuation) = out.strip_prefix(echo.as_str()) else {
        return Err(Failure {
            status: "fail",
            why: format!(
                "llama.cpp's prompt {:?} is not ours {echo:?}",
                out.get(..echo.len()).unwrap_or(out)
            ),
        });
    };
    let ids = tok
        .encode(continuation)
        .map_err(|e| failed(e.to_string()))?;
    let ended = peer.decoded < TOKENS;
    let mut s =
        Session::new(m, prompt.len() + ids.len() + 1, 16).map_err(|e| failed(e.to_string()))?;
    let mut logits = s.forward(&prompt).map_err(|e| failed(e.to_string()))?;
    let margin = |l: &[f32], chosen: u32| l[argmax(l) as usize] - l[chosen as usize];
    let mut margins = Vec::with_capacity(ids.len() + 1);
    for &t in &ids {
        margins.push(margin(&logits, t));
        logits = s.forward(&[t]).map_err(|e| failed(e.to_string()))?;
    }
    if let (true, Some(eos)) = (ended, tok.eos) {
        margins.push(margin(&logits, eos));
    }
    Ok(Scored {
        margins,
        tokens: ids.len(),
        ended,
    })
}
