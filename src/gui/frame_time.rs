//! Frame times of the app: what the status bar shows and `vramfit bench ui` reports. The goal is
//! no frame over [`FRAME_BUDGET_MS`] while training, on any adapter (lavapipe included).

/// The longest frame the app allows itself while training, in milliseconds (20 frames/s).
pub const FRAME_BUDGET_MS: f32 = 50.0;

/// Frame times in milliseconds: the last frame, and every frame drawn while training.
#[derive(Clone, Debug, Default)]
pub struct FrameTimes {
    last: f32,
    training: Vec<f32>,
}

/// Statistics of a set of frames, in milliseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct FrameSummary {
    /// Frames counted.
    pub frames: usize,
    /// Median.
    pub p50_ms: f32,
    /// 95th percentile (nearest rank).
    pub p95_ms: f32,
    /// Longest.
    pub max_ms: f32,
    /// Frames longer than [`FRAME_BUDGET_MS`].
    pub over_budget: usize,
}

impl FrameSummary {
    /// Statistics of `times` (ms); all zero when empty.
    pub fn of(times: &[f32]) -> Self {
        if times.is_empty() {
            return Self::default();
        }
        let mut v = times.to_vec();
        v.sort_by(f32::total_cmp);
        let pct = |p: f32| v[((p / 100.0 * v.len() as f32).ceil() as usize).clamp(1, v.len()) - 1];
        Self {
            frames: v.len(),
            p50_ms: pct(50.0),
            p95_ms: pct(95.0),
            max_ms: v[v.len() - 1],
            over_budget: v.iter().filter(|&&ms| ms > FRAME_BUDGET_MS).count(),
        }
    }
}

impl FrameTimes {
    /// Records one frame of `ms` milliseconds (CPU time of the UI code and rendering).
    pub fn record(&mut self, ms: f32, training: bool) {
        self.last = ms;
        if training {
            self.training.push(ms);
        }
    }

    /// The last frame, ms (0 before the first).
    pub fn last_ms(&self) -> f32 {
        self.last
    }

    /// Every frame drawn while a run was training.
    pub fn while_training(&self) -> FrameSummary {
        FrameSummary::of(&self.training)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_and_training_frames() {
        let mut f = FrameTimes::default();
        let times: Vec<f32> = (1..=100).map(|ms| ms as f32).collect();
        for &ms in &times {
            f.record(ms, ms > 90.0);
        }
        let all = FrameSummary::of(&times);
        assert_eq!((all.frames, all.p50_ms, all.p95_ms, all.max_ms, all.over_budget), (100, 50.0, 95.0, 100.0, 50));
        assert_eq!(f.last_ms(), 100.0);
        let t = f.while_training();
        assert_eq!((t.frames, t.p50_ms, t.max_ms, t.over_budget), (10, 95.0, 100.0, 10));
        f.record(2.0, false);
        assert_eq!(f.last_ms(), 2.0);
        assert_eq!(f.while_training().frames, 10, "idle frames do not count");
        assert_eq!(FrameSummary::of(&[]), FrameSummary::default());
    }
}
