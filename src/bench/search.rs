//! Which loads a sweep measures: every step in order, or, with
//! `-l/--latency-threshold`, up to the first step over the threshold, or
//! with `--binary-search` a bisection of the steps for the highest load
//! whose latency stays under it (perf_analyzer's search modes).

use super::cli::Load;

/// The step order of one sweep.
#[derive(Debug)]
pub struct Search {
    steps: Vec<Load>,
    threshold_us: Option<f64>,
    binary: bool,
    state: State,
    /// The highest load measured under the threshold so far.
    best: Option<Load>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum State {
    /// Linear: the next step's index.
    Linear(usize),
    /// Binary: the first and last steps not measured yet.
    Ends {
        first_done: bool,
    },
    /// Binary: under the threshold at `lo`, over it at `hi`; measuring the middle.
    Bisect {
        lo: usize,
        hi: usize,
    },
    Done,
}

impl Search {
    /// `threshold_us`: the latency limit; `binary` needs it.
    pub fn new(steps: Vec<Load>, threshold_us: Option<f64>, binary: bool) -> Self {
        let state = if steps.is_empty() {
            State::Done
        } else if binary && threshold_us.is_some() {
            State::Ends { first_done: false }
        } else {
            State::Linear(0)
        };
        Self {
            steps,
            threshold_us,
            binary,
            state,
            best: None,
        }
    }

    /// The load to measure next, or `None` when the sweep is over.
    pub fn next(&self) -> Option<Load> {
        match self.state {
            State::Linear(i) => self.steps.get(i).copied(),
            State::Ends { first_done: false } => self.steps.first().copied(),
            State::Ends { first_done: true } => self.steps.last().copied(),
            State::Bisect { lo, hi } => self.steps.get(lo + (hi - lo) / 2).copied(),
            State::Done => None,
        }
    }

    /// Records the latency (µs: the --percentile value, or the average) the
    /// load `next()` gave measured at.
    pub fn record(&mut self, latency_us: f64) {
        let Some(load) = self.next() else { return };
        let under = self.threshold_us.is_none_or(|t| latency_us <= t);
        if under {
            self.best = Some(load);
        }
        let last = self.steps.len() - 1;
        self.state = match self.state {
            State::Linear(i) if under && i < last => State::Linear(i + 1),
            State::Linear(_) => State::Done,
            // Over at the lowest load: nothing meets the threshold.
            State::Ends { first_done: false } if !under || last == 0 => State::Done,
            State::Ends { first_done: false } => State::Ends { first_done: true },
            // Under at the highest load: it is the answer.
            State::Ends { first_done: true } if under => State::Done,
            State::Ends { first_done: true } if last > 1 => State::Bisect { lo: 0, hi: last },
            State::Ends { first_done: true } => State::Done,
            State::Bisect { lo, hi } => {
                let mid = lo + (hi - lo) / 2;
                let (lo, hi) = if under { (mid, hi) } else { (lo, mid) };
                if hi - lo > 1 {
                    State::Bisect { lo, hi }
                } else {
                    State::Done
                }
            }
            State::Done => State::Done,
        };
    }

    /// The highest load measured under the threshold (with a threshold).
    pub fn best(&self) -> Option<Load> {
        self.threshold_us.and(self.best)
    }

    pub fn is_binary(&self) -> bool {
        self.binary
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Drives a search against a latency that grows with the load.
    fn walk(steps: &[u32], threshold: Option<f64>, binary: bool) -> (Vec<u32>, Option<Load>) {
        let mut s = Search::new(
            steps.iter().map(|&c| Load::Concurrency(c)).collect(),
            threshold,
            binary,
        );
        let mut seen = Vec::new();
        while let Some(load) = s.next() {
            seen.push(load.value() as u32);
            s.record(load.value() * 10.0);
            assert!(seen.len() <= steps.len(), "the search does not end");
        }
        (seen, s.best())
    }

    #[test]
    fn search_modes() {
        let steps: Vec<u32> = (1..=10).collect();
        assert_eq!(walk(&steps, None, false), (steps.clone(), None));
        // Linear: stops after the first step over 65 µs.
        assert_eq!(
            walk(&steps, Some(65.0), false),
            (vec![1, 2, 3, 4, 5, 6, 7], Some(Load::Concurrency(6)))
        );
        // Binary: both ends, then bisection to 6.
        assert_eq!(
            walk(&steps, Some(65.0), true),
            (vec![1, 10, 5, 7, 6], Some(Load::Concurrency(6)))
        );
        assert_eq!(walk(&steps, Some(5.0), true), (vec![1], None));
        assert_eq!(
            walk(&steps, Some(1000.0), true),
            (vec![1, 10], Some(Load::Concurrency(10)))
        );
        assert_eq!(
            walk(&[1, 2], Some(15.0), true),
            (vec![1, 2], Some(Load::Concurrency(1)))
        );
        assert_eq!(walk(&[3], Some(15.0), true), (vec![3], None));
    }
}
