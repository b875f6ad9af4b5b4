//! Dynamic loss scaling for f16 training (Micikevicius et al. 2018; PyTorch `GradScaler` defaults).
//!
//! The loss is multiplied by `scale` before backward so small f16 gradients do not flush to
//! zero; gradients are divided by it before clipping and the optimizer step. A step whose
//! gradients are not finite is skipped and the scale halved; after `growth_interval` good steps
//! in a row the scale doubles.

use serde::{Deserialize, Serialize};

/// Loss-scale state (saved in checkpoints).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct LossScaler {
    /// Current scale.
    pub scale: f32,
    /// Good steps since the last change.
    pub good_steps: usize,
    /// Consecutive skipped steps.
    pub skipped_in_a_row: usize,
    /// Good steps before doubling.
    pub growth_interval: usize,
}

impl LossScaler {
    /// Starts at 65536, doubles after 2000 good steps.
    pub fn new() -> Self {
        Self { scale: 65536.0, good_steps: 0, skipped_in_a_row: 0, growth_interval: 2000 }
    }

    /// A scaler that never scales (f32 runs).
    pub fn disabled() -> Self {
        Self { scale: 1.0, good_steps: 0, skipped_in_a_row: 0, growth_interval: usize::MAX }
    }

    /// Records a step; returns whether to apply it (false: gradients overflowed, skip it).
    pub fn update(&mut self, grads_finite: bool) -> bool {
        if !grads_finite {
            self.scale = (self.scale / 2.0).max(1.0 / 65536.0);
            self.good_steps = 0;
            self.skipped_in_a_row += 1;
            return false;
        }
        self.skipped_in_a_row = 0;
        self.good_steps += 1;
        if self.good_steps >= self.growth_interval {
            self.scale = (self.scale * 2.0).min(f32::MAX / 2.0);
            self.good_steps = 0;
        }
        true
    }
}

impl Default for LossScaler {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overflow_halves_and_skips_then_growth_doubles() {
        let mut s = LossScaler { growth_interval: 3, ..LossScaler::new() };
        assert!(!s.update(false));
        assert_eq!(s.scale, 32768.0);
        assert_eq!(s.skipped_in_a_row, 1);
        assert!(s.update(true) && s.update(true));
        assert_eq!(s.scale, 32768.0);
        assert!(s.update(true));
        assert_eq!(s.scale, 65536.0);
        assert_eq!(s.skipped_in_a_row, 0);
    }
}
