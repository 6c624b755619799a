//! The dynamic batcher's configuration, resolved once at load time from
//! `dynamic_batching { ... }`.

use std::{collections::HashMap, time::Duration};

use crate::{
    proto::inference::{model_queue_policy::TimeoutAction, ModelDynamicBatching, ModelQueuePolicy},
    scheduler::timeout::requested_timeout,
    types::{InferError, InferResult, ParamValue, Parameters},
};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnTimeout {
    /// Answer the request with an error once its timeout passes.
    Reject,
    /// Keep it, behind every request of its level that has not timed out.
    Delay,
}

/// Queue policy of one priority level.
#[derive(Debug, Clone)]
pub struct QueuePolicy {
    pub on_timeout: OnTimeout,
    pub default_timeout: Option<Duration>,
    pub allow_timeout_override: bool,
    /// 0 = unbounded (Triton's default).
    pub max_queue_size: usize,
}

impl QueuePolicy {
    fn from_config(p: Option<&ModelQueuePolicy>) -> Self {
        let Some(p) = p else {
            return Self {
                on_timeout: OnTimeout::Reject,
                default_timeout: None,
                allow_timeout_override: false,
                max_queue_size: 0,
            };
        };
        Self {
            on_timeout: if p.timeout_action == TimeoutAction::Delay as i32 {
                OnTimeout::Delay
            } else {
                OnTimeout::Reject
            },
            default_timeout: (p.default_timeout_microseconds > 0)
                .then(|| Duration::from_micros(p.default_timeout_microseconds)),
            allow_timeout_override: p.allow_timeout_override,
            max_queue_size: p.max_queue_size as usize,
        }
    }
}

#[derive(Debug, Clone)]
pub struct BatcherPolicy {
    pub max_batch_size: i64,
    /// Ascending.
    pub preferred: Vec<i64>,
    pub max_queue_delay: Duration,
    pub preserve_ordering: bool,
    /// Index 0 is priority level 1 (the highest); at least one level.
    pub levels: Vec<QueuePolicy>,
    /// Level used when a request names none (1-based).
    pub default_level: usize,
}

impl BatcherPolicy {
    pub fn from_config(max_batch_size: i32, db: &ModelDynamicBatching) -> Self {
        let level_count = db.priority_levels.max(1) as usize;
        let overrides: HashMap<u64, &ModelQueuePolicy> = db
            .priority_queue_policy
            .iter()
            .map(|(k, v)| (*k, v))
            .collect();
        let levels = (1..=level_count as u64)
            .map(|l| {
                QueuePolicy::from_config(
                    overrides
                        .get(&l)
                        .copied()
                        .or(db.default_queue_policy.as_ref()),
                )
            })
            .collect();
        let mut preferred: Vec<i64> = db
            .preferred_batch_size
            .iter()
            .map(|&p| i64::from(p))
            .filter(|&p| p > 0 && p <= i64::from(max_batch_size.max(1)))
            .collect();
        preferred.sort_unstable();
        preferred.dedup();
        let default_level = if db.default_priority_level == 0 {
            // Triton: with priorities, an unset default means the lowest level.
            level_count
        } else {
            (db.default_priority_level as usize).clamp(1, level_count)
        };
        Self {
            max_batch_size: i64::from(max_batch_size.max(1)),
            preferred,
            max_queue_delay: Duration::from_micros(db.max_queue_delay_microseconds),
            preserve_ordering: db.preserve_ordering,
            levels,
            default_level,
        }
    }

    /// The 0-based level index and timeout of a request, from its
    /// `priority` and `timeout` (µs, [`requested_timeout`]) parameters.
    pub fn classify(&self, params: &Parameters) -> InferResult<(usize, Option<Duration>)> {
        let level = match params.get("priority") {
            None => self.default_level,
            Some(v) => match as_u64(v) {
                Some(0) => self.default_level,
                Some(p) if (p as usize) <= self.levels.len() => p as usize,
                _ => {
                    return Err(InferError::invalid(format!(
                        "priority must be between 0 and {} for this model, got {v:?}",
                        self.levels.len()
                    )))
                }
            },
        };
        let policy = &self.levels[level - 1];
        // Parsed (and a bad value refused) whether or not the level lets
        // it override its default: one answer for every model.
        let timeout = match requested_timeout(params)? {
            Some(own) if policy.allow_timeout_override => Some(own),
            _ => policy.default_timeout,
        };
        Ok((level - 1, timeout))
    }
}

fn as_u64(v: &ParamValue) -> Option<u64> {
    match v {
        ParamValue::Int(i) => u64::try_from(*i).ok(),
        ParamValue::Uint(u) => Some(*u),
        ParamValue::String(s) => s.parse().ok(),
        _ => None,
    }
}
