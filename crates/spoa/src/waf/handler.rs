//! The engine's [`Handler`]: a NOTIFY's messages to their answer, the transaction id they
//! are logged under, and the messages answered without an evaluation thread.

use std::time::Instant;

use spop::frame::Message;
use spop::TypedData;

use super::{finish, Waf};
use crate::engine::{Answer, Handler, Later, Vars};
use crate::metrics::Verdict;
use lastcall_spop_proto::coraza::{self, Request, Response, REQUEST_MESSAGE, RESPONSE_MESSAGE};

impl Waf {
    /// The answer to a NOTIFY's messages, received on a connection whose frame size is
    /// `frame_size` (if known).
    fn answer(&self, messages: &[Message], frame_size: Option<u32>) -> Answer {
        let mut vars = Vars::new();
        let mut done = Vec::new();
        let mut later = Vec::new();
        for m in messages {
            let started = Instant::now();
            match m.name.as_str() {
                REQUEST_MESSAGE => {
                    let (v, more) = self.request(&Request::from_message(m), frame_size, &mut done);
                    self.metrics.request(v);
                    vars.extend(more);
                }
                RESPONSE_MESSAGE => {
                    let res = Response::from_message(m);
                    if res.detect_only {
                        match self.detect_only_response(res) {
                            Some(Ok(l)) => later.push(l),
                            Some(Err(more)) => {
                                self.metrics.response(Verdict::Error);
                                vars.extend(more);
                            }
                            None => {}
                        }
                    } else if let Some((v, more)) = self.evaluate_response(&res) {
                        self.metrics.response(v);
                        vars.extend(more);
                    }
                }
                other => {
                    tracing::debug!(message = other, "ignoring unknown SPOE message");
                }
            }
            self.metrics
                .observe_message(started.elapsed().as_secs_f64());
        }
        let later = if done.is_empty() && later.is_empty() {
            Later::none()
        } else {
            Later::new(move || {
                finish(done);
                for l in later {
                    l.run();
                }
            })
        };
        Answer { vars, later }
    }
}

impl Handler for Waf {
    fn handle(&self, messages: &[Message]) -> Answer {
        self.answer(messages, None)
    }

    fn handle_framed(&self, messages: &[Message], frame_size: u32) -> Answer {
        self.answer(messages, Some(frame_size))
    }

    /// The transaction id of the first `coraza-req` (its `id` argument, else one generated
    /// now and added to the message, so that the evaluation uses the same one), else the
    /// `id` of the first `coraza-res`.
    fn identify(&self, messages: &mut [Message]) -> Option<String> {
        let given = |m: &Message| {
            m.args
                .iter()
                .rev()
                .find_map(|(name, v)| match (name.as_str(), v) {
                    ("id", TypedData::String(s)) if !s.is_empty() => Some(s.clone()),
                    _ => None,
                })
        };
        if let Some(req) = messages.iter_mut().find(|m| m.name == REQUEST_MESSAGE) {
            if let Some(id) = given(req) {
                return Some(id);
            }
            let id = self.new_id();
            req.args.push(("id".into(), TypedData::String(id.clone())));
            return Some(id);
        }
        messages
            .iter()
            .find(|m| m.name == RESPONSE_MESSAGE)
            .and_then(given)
    }

    /// Inline when every message is a `coraza-res` of an application without response
    /// checks, or unknown: exactly the messages [`handle`](Self::handle) answers with no
    /// variables and no metric.
    fn answer_inline(&self, messages: &[Message]) -> Option<Vars> {
        let started = Instant::now();
        let mut apps = None;
        for m in messages {
            match m.name.as_str() {
                REQUEST_MESSAGE => return None,
                RESPONSE_MESSAGE => {
                    let apps = apps.get_or_insert_with(|| self.current());
                    let app = apps.find(&coraza::app_of(m))?;
                    if app.config.response_check {
                        return None;
                    }
                }
                other => {
                    tracing::debug!(message = other, "ignoring unknown SPOE message");
                }
            }
        }
        for _ in messages {
            self.metrics
                .observe_message(started.elapsed().as_secs_f64());
        }
        Some(Vars::new())
    }
}
