//! How long a failing object waits before its next pass.

use std::time::Duration;

use crate::error::Category;

/// How long an object waits after its `n`-th failed pass in a row: `base` doubling to `max`, or to
/// `transport_max` when the API server could not be reached (that says nothing about the object,
/// and the changes an outage hid arrive when the watches resume).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    /// The wait after the first failure.
    pub base: Duration,
    /// The longest wait.
    pub max: Duration,
    /// The longest wait when the API server could not be reached.
    pub transport_max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            base: Duration::from_secs(1),
            max: Duration::from_secs(300),
            transport_max: Duration::from_secs(5),
        }
    }
}

impl Backoff {
    /// The wait after `failures` failed passes in a row, the last of `category`.
    pub fn after(&self, failures: u32, category: Category) -> Duration {
        let cap = match category {
            Category::Transport => self.transport_max,
            _ => self.max,
        };
        self.base
            .saturating_mul(2u32.saturating_pow(failures.saturating_sub(1)))
            .min(cap)
    }
}
