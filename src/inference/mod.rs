//! Using a trained model: evaluation ([`eval`]: loss, top-1/top-5, per-class accuracy, the
//! confusion matrix) and prediction ([`predict`]: top-k classes of images, with the model's own
//! preprocessing).

pub mod eval;
pub mod predict;
