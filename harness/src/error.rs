//! The harness's error type: every variant becomes one line on stderr and exit code 2.

use kernel_common::KernelError;
use thiserror::Error;

/// What stops a harness command before or while it runs.
#[derive(Debug, Error)]
pub enum HarnessError {
    /// Bad flags, unknown experiment, bad spec or `--set` value.
    #[error("{0}")]
    Usage(String),
    /// A kernel refused the case (shape, device, buffer).
    #[error("{0}")]
    Kernel(#[from] KernelError),
    /// Reading or writing results failed.
    #[error("{context}: {source}")]
    Io {
        context: String,
        source: std::io::Error,
    },
}

impl HarnessError {
    /// The message as the one line `main` prints: control characters that came from an input
    /// (a key, a tensor name or a value that holds a newline) are escaped, not printed.
    pub fn one_line(&self) -> String {
        one_line(&self.to_string())
    }

    /// Wraps an I/O error with what was being done.
    pub fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> HarnessError {
        let context = context.into();
        move |source| HarnessError::Io { context, source }
    }
}

impl From<csv::Error> for HarnessError {
    fn from(e: csv::Error) -> HarnessError {
        HarnessError::Usage(format!("csv: {e}"))
    }
}

impl From<serde_json::Error> for HarnessError {
    fn from(e: serde_json::Error) -> HarnessError {
        HarnessError::Usage(format!("json: {e}"))
    }
}

/// `text` with its control characters escaped (`\n` → `\\n`): what goes on the one line of
/// stderr a refusal gets, whatever the input it quotes holds.
pub fn one_line(text: &str) -> String {
    let mut line = String::new();
    for c in text.chars() {
        if c.is_control() {
            line.extend(c.escape_default());
        } else {
            line.push(c);
        }
    }
    line
}

/// The first line of a command-line error of clap's, without its `error: ` prefix, escaped.
pub fn clap_line(e: &clap::Error) -> String {
    let text = e.to_string();
    let first = text.lines().next().unwrap_or("bad command line");
    one_line(first.trim_start_matches("error: "))
}

/// Shorthand for harness results.
pub type Result<T> = std::result::Result<T, HarnessError>;
