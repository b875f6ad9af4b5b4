//! Frame times of the app: what the status bar shows and `benches/frame_time.rs` reports. The
//! goal is no frame over [`FRAME_BUDGET_MS`] while training, on any adapter (lavapipe included).

use std::collections::VecDeque;

/// The longest frame the app allows itself while training, in milliseconds (20 frames/s).
pub const FRAME_BUDGET_MS: f32 = 50.0;

/// Rolling frame-time statistics, in milliseconds.
#[derive(Clone, Debug, Default)]
pub struct FrameTimes {
    recent: VecDeque<f32>,
    /// Frames recorded while a run was training.
    pub frames_while_training: usize,
    /// The longest of those, ms.
    pub max_while_training_ms: f32,
    /// How many of those took longer than [`FRAME_BUDGET_MS`].
    pub over_budget_while_training: usize,
}

/// Frames kept for [`FrameTimes::percentile_ms`].
const KEPT: usize = 600;

impl FrameTimes {
    /// Records one frame of `ms` milliseconds (CPU time of the UI code and rendering).
    pub fn record(&mut self, ms: f32, training: bool) {
        if self.recent.len() == KEPT {
            self.recent.pop_front();
        }
        self.recent.push_back(ms);
        if training {
            self.frames_while_training += 1;
            self.max_while_training_ms = self.max_while_training_ms.max(ms);
            self.over_budget_while_training += usize::from(ms > FRAME_BUDGET_MS);
        }
    }

    /// The last frame, ms (0 before the first).
    pub fn last_ms(&self) -> f32 {
        self.recent.back().copied().unwrap_or(0.0)
    }

    /// The `p`-th percentile (0..=100, nearest rank) of the last 600 frames, ms (0 if none).
    pub fn percentile_ms(&self, p: f32) -> f32 {
        let mut v: Vec<f32> = self.recent.iter().copied().collect();
        if v.is_empty() {
            return 0.0;
        }
        v.sort_by(f32::total_cmp);
        let rank = ((p / 100.0) * v.len() as f32).ceil().max(1.0) as usize;
        v[rank.min(v.len()) - 1]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_and_training_maximum() {
        let mut f = FrameTimes::default();
        for ms in 1..=100 {
            f.record(ms as f32, ms > 90);
        }
        assert_eq!(f.percentile_ms(50.0), 50.0);
        assert_eq!(f.percentile_ms(95.0), 95.0);
        assert_eq!(f.percentile_ms(100.0), 100.0);
        assert_eq!(f.last_ms(), 100.0);
        assert_eq!((f.frames_while_training, f.max_while_training_ms, f.over_budget_while_training), (10, 100.0, 10));
        for _ in 0..KEPT {
            f.record(2.0, false);
        }
        assert_eq!(f.percentile_ms(100.0), 2.0, "only the last 600 frames count");
    }
}
