//! The one error every decoder of peer bytes returns: what the peer did wrong, as the
//! status code SPOE.txt (section 3.5) assigns to it and a reason, so that the connection can
//! answer with the right AGENT-DISCONNECT. [`super::frame`] and [`super::payload`] both use
//! it; it uses neither.

use spop::StatusCode;

/// A protocol violation by the peer: the status code to put in AGENT-DISCONNECT and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason} (status {})", status.to_u32())]
pub struct ProtocolError {
    /// Status code for the AGENT-DISCONNECT frame.
    pub status: StatusCode,
    /// Human-readable reason, sent as the DISCONNECT message.
    pub reason: String,
}

impl ProtocolError {
    /// Builds an error with the given status.
    pub fn new(status: StatusCode, reason: impl Into<String>) -> Self {
        Self {
            status,
            reason: reason.into(),
        }
    }

    /// A malformed frame or payload (status 4, `invalid frame received`).
    pub fn invalid(reason: impl Into<String>) -> Self {
        Self::new(StatusCode::Invalid, reason)
    }

    /// A short label for metrics (`spoa_frames_rejected_total{reason}`).
    pub fn metric_reason(&self) -> &'static str {
        match self.status {
            StatusCode::TooBig => "too_big",
            StatusCode::Invalid => "invalid",
            StatusCode::NoVersion
            | StatusCode::NoFrameSize
            | StatusCode::NoCapabilities
            | StatusCode::BadVersion
            | StatusCode::BadFrameSize => "bad_hello",
            StatusCode::FragmentationNotSupported => "fragmented",
            StatusCode::Timeout => "timeout",
            StatusCode::Resource => "resource",
            _ => "other",
        }
    }
}
