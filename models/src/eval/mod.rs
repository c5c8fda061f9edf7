//! Evaluating a model's quality: perplexity over a text in llama.cpp's and transformers'
//! conventions, KL divergence and top-1 agreement against a reference run.

/// Windows, negative log-likelihood, perplexity and KL statistics.
pub mod perplexity;
