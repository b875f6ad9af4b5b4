//! How training treats classes of unequal size (`train.class_weights`, `data.sampler`), for a
//! dataset whose imbalance [`crate::data::health::imbalance`] warns about.
//!
//! Both default to leaving the data as it is: a model then learns the classes' frequencies,
//! which is right when they are the frequencies it will meet, and accuracy is the figure it
//! is trained for. Where every class matters equally (a rare defect, a rare species), either
//! option trades some accuracy on the large classes for recall on the small ones.

use serde::{Deserialize, Serialize};

/// `train.class_weights`: how each image's loss is weighted by its class.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClassWeights {
    /// Every image weighs 1 (the default: the data's own frequencies).
    #[default]
    None,
    /// Class `c` weighs `n / (k * n_c)` (`n` training images, `k` classes, `n_c` of class `c`:
    /// scikit-learn's `class_weight="balanced"`), so each class adds the same total to the loss;
    /// the weighted mean divides by the batch's summed weights (as PyTorch's `CrossEntropyLoss`
    /// with `weight`).
    Balanced,
}

/// `data.sampler`: which images an epoch's batches draw.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Sampler {
    /// Every training image once per epoch, shuffled (the default).
    #[default]
    Shuffle,
    /// As many draws per epoch as there are training images, each a class drawn uniformly and
    /// then one of its images (with replacement, as PyTorch's `WeightedRandomSampler` with
    /// weights `1 / n_c`): small classes are seen as often as large ones, their images repeated.
    Balanced,
}

/// The weight of each class under `weights` for training class sizes `counts` (a class without
/// images weighs 0: it never occurs).
pub fn class_weights(weights: ClassWeights, counts: &[usize]) -> Vec<f32> {
    let n: usize = counts.iter().sum();
    let k = counts.iter().filter(|&&c| c > 0).count().max(1);
    counts
        .iter()
        .map(|&c| match (weights, c) {
            (_, 0) => 0.0,
            (ClassWeights::None, _) => 1.0,
            (ClassWeights::Balanced, c) => n as f32 / (k * c) as f32,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn balanced_weights_give_each_class_the_same_total() {
        let w = class_weights(ClassWeights::Balanced, &[60, 3, 0]);
        assert_eq!(w, vec![63.0 / 120.0, 63.0 / 6.0, 0.0]);
        assert!((w[0] * 60.0 - w[1] * 3.0).abs() < 1e-4);
        assert_eq!(class_weights(ClassWeights::None, &[60, 3]), vec![1.0, 1.0]);
    }
}
