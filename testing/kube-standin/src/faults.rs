//! Fault injection: a delay before every API request, and forced answers or slowness for the
//! next N requests matching a method and a path.

use std::collections::VecDeque;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Answer the next `times` matching API requests with `code` (and the `Status` body the real
/// server sends for that code), after `delay_millis`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fault {
    /// HTTP status code, e.g. 500, 429, 503, 504, 409, 403; `0` only delays and then serves
    /// the request normally.
    pub code: u16,
    /// How many requests to answer this way.
    #[serde(default = "one")]
    pub times: u32,
    /// Only requests with this HTTP method (`POST`, `DELETE`, ...); `None` = any.
    #[serde(default)]
    pub method: Option<String>,
    /// Only requests whose path contains this (e.g. `/joiningnodes`, `/secrets/`); `None` = any.
    #[serde(default)]
    pub path: Option<String>,
    /// Wait this long before answering (or serving).
    #[serde(default)]
    pub delay_millis: u64,
    /// Carry the request out first and only then answer with the fault, like an apiserver whose
    /// etcd write succeeded but whose response was lost (the client cannot tell it happened).
    #[serde(default)]
    pub after_commit: bool,
}

fn one() -> u32 {
    1
}

impl Fault {
    /// The next request (any method) answers `code`.
    pub fn once(code: u16) -> Self {
        Self {
            code,
            times: 1,
            method: None,
            path: None,
            delay_millis: 0,
            after_commit: false,
        }
    }

    /// The next request is served normally, but only after `delay`.
    pub fn slow(delay: Duration) -> Self {
        Self::once(0).delayed(delay)
    }

    /// Only requests whose path contains `part`.
    pub fn at(mut self, part: &str) -> Self {
        self.path = Some(part.to_owned());
        self
    }

    /// Wait `delay` before answering.
    pub fn delayed(mut self, delay: Duration) -> Self {
        self.delay_millis = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        self
    }

    /// Only requests with this method.
    pub fn on(mut self, method: &str) -> Self {
        self.method = Some(method.to_ascii_uppercase());
        self
    }

    /// This many requests.
    pub fn times(mut self, n: u32) -> Self {
        self.times = n;
        self
    }

    /// Apply the request, then fail.
    pub fn after_commit(mut self) -> Self {
        self.after_commit = true;
        self
    }
}

/// Pending faults and the delay.
#[derive(Debug, Default)]
pub(crate) struct Faults {
    pub delay: Duration,
    queue: VecDeque<Fault>,
}

impl Faults {
    pub(crate) fn push(&mut self, fault: Fault) {
        if fault.times > 0 {
            self.queue.push_back(fault);
        }
    }

    /// Takes one use of the first fault matching `method` and `path`.
    pub(crate) fn take(&mut self, method: &str, path: &str) -> Option<Fault> {
        let idx = self.queue.iter().position(|f| {
            f.method
                .as_deref()
                .is_none_or(|m| m.eq_ignore_ascii_case(method))
                && f.path.as_deref().is_none_or(|p| path.contains(p))
        })?;
        let fault = self.queue.get_mut(idx)?;
        fault.times -= 1;
        let taken = fault.clone();
        if fault.times == 0 {
            self.queue.remove(idx);
        }
        Some(taken)
    }
}
