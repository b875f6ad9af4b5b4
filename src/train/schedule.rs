//! Learning-rate schedule: linear warmup from 0 to the peak, then cosine decay to
//! `min_lr_ratio x peak` (Loshchilov & Hutter, SGDR, 2017; warmup as Goyal et al. 2017).

/// Optimizer steps in one epoch of `samples` training images: `ceil(ceil(samples / batch_size)
/// / grad_accum_steps)` (the last loader batch and the last accumulation group may be short).
pub fn steps_per_epoch(samples: usize, train: &crate::config::TrainConfig) -> usize {
    samples.div_ceil(train.batch_size.max(1)).div_ceil(train.grad_accum_steps.max(1))
}

/// The schedule over a whole run, in optimizer steps.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WarmupCosine {
    /// Peak learning rate.
    pub peak_lr: f64,
    /// Steps of linear warmup.
    pub warmup_steps: usize,
    /// Total steps of the run.
    pub total_steps: usize,
    /// Final learning rate as a fraction of the peak.
    pub min_lr_ratio: f64,
}

impl WarmupCosine {
    /// Learning rate for optimizer step `step` (0-based).
    ///
    /// Warmup: `peak * (step + 1) / warmup_steps`. Then with `t` the fraction of the remaining
    /// steps done: `min + (peak - min) * (1 + cos(pi t)) / 2`.
    pub fn lr(&self, step: usize) -> f64 {
        if step < self.warmup_steps {
            return self.peak_lr * (step + 1) as f64 / self.warmup_steps as f64;
        }
        let decay_steps = self.total_steps.saturating_sub(self.warmup_steps).max(1);
        let t = ((step - self.warmup_steps) as f64 / decay_steps as f64).min(1.0);
        let min = self.peak_lr * self.min_lr_ratio;
        min + (self.peak_lr - min) * 0.5 * (1.0 + (std::f64::consts::PI * t).cos())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warmup_then_cosine() {
        let s = WarmupCosine { peak_lr: 1.0, warmup_steps: 10, total_steps: 110, min_lr_ratio: 0.0 };
        assert!((s.lr(0) - 0.1).abs() < 1e-12);
        assert!((s.lr(9) - 1.0).abs() < 1e-12);
        assert!((s.lr(10) - 1.0).abs() < 1e-12);
        assert!((s.lr(60) - 0.5).abs() < 1e-12);
        assert!(s.lr(110).abs() < 1e-12);
    }
}
