//! Range checks of every config value: each message names the key, its value and the allowed
//! range, and [`Config::validate`] adds the file or override it came from.

use super::Config;
use crate::engine::error::{Error, Result};

impl Config {
    /// Checks every value's range; `source_name` (the file or override) and the key are named.
    ///
    /// # Errors
    /// [`Error::Config`] naming the source, the key, its value and the allowed range.
    pub fn validate(&self, source_name: &str) -> Result<()> {
        self.range_problem().map_err(|message| Error::Config { source_name: source_name.to_string(), message })
    }

    /// The first value out of its range, as a one-line message naming the key.
    fn range_problem(&self) -> std::result::Result<(), String> {
        self.train_range_problem()?;
        self.model_range_problem()?;
        self.data_range_problem()?;
        let a = &self.augment;
        check((0.0..=1.0).contains(&a.color_jitter), "augment.color_jitter must be in 0..=1")?;
        check((0.0..=1.0).contains(&a.random_erasing), "augment.random_erasing must be in 0..=1")?;
        check(self.memory.memory_budget_bytes >= 1 << 20, "memory.memory_budget_bytes must be >= 1 MiB")
    }

    /// The first `[train]` or `[optimizer]` value out of its range.
    fn train_range_problem(&self) -> std::result::Result<(), String> {
        let t = &self.train;
        check(t.batch_size >= 1 && t.batch_size <= 4096, "train.batch_size must be 1..=4096")?;
        check(t.grad_accum_steps >= 1 && t.grad_accum_steps <= 1024, "train.grad_accum_steps must be 1..=1024")?;
        check(t.epochs >= 1 && t.epochs <= 10_000, "train.epochs must be 1..=10000")?;
        check(t.memory_sample_every >= 1, "train.memory_sample_every must be >= 1")?;
        check(t.max_skipped_steps >= 1, "train.max_skipped_steps must be >= 1")?;
        check(t.keep_checkpoints >= 1, "train.keep_checkpoints must be >= 1")?;
        real("train.label_smoothing", t.label_smoothing.into(), (0.0..=0.5).contains(&t.label_smoothing), "[0, 0.5]")?;
        real("train.grad_clip_norm", t.grad_clip_norm.into(), t.grad_clip_norm >= 0.0, "[0, inf) (0 = off)")?;
        let o = &self.optimizer;
        real("optimizer.lr", o.lr, o.lr > 0.0 && o.lr <= 10.0, "(0, 10]")?;
        real("optimizer.weight_decay", o.weight_decay, (0.0..=10.0).contains(&o.weight_decay), "[0, 10]")?;
        let epochs = t.epochs as f64;
        real(
            "optimizer.warmup_epochs",
            o.warmup_epochs,
            o.warmup_epochs >= 0.0 && o.warmup_epochs < epochs,
            &format!("[0, train.epochs = {epochs}) (warmup must end before the run does)"),
        )?;
        real("optimizer.min_lr_ratio", o.min_lr_ratio, (0.0..=1.0).contains(&o.min_lr_ratio), "[0, 1]")?;
        real("optimizer.beta1", o.beta1.into(), (0.0..1.0).contains(&o.beta1), "[0, 1)")?;
        real("optimizer.beta2", o.beta2.into(), (0.0..1.0).contains(&o.beta2), "[0, 1)")?;
        real("optimizer.epsilon", o.epsilon.into(), o.epsilon > 0.0 && o.epsilon <= 1.0, "(0, 1]")
    }

    /// The first `[model]` value out of its range.
    fn model_range_problem(&self) -> std::result::Result<(), String> {
        let m = &self.model;
        real("model.head_init_std", m.head_init_std, m.head_init_std > 0.0 && m.head_init_std <= 1.0, "(0, 1]")?;
        real("model.width", m.width, m.width > 0.0 && m.width <= 4.0, "(0, 4]")?;
        check((1..=1024).contains(&m.stem_channels), "model.stem_channels must be in 1..=1024")?;
        check(!m.stages.is_empty() && m.stages.len() <= 8, "model.stages must list 1 to 8 stages")?;
        // Channels are rounded up to a multiple of the groups, so more groups than the stem has
        // channels would silently widen the network.
        check(
            (1..=64).contains(&m.norm_groups) && m.norm_groups <= m.stem_channels,
            "model.norm_groups must be in 1..=64 and at most model.stem_channels",
        )?;
        for (i, s) in m.stages.iter().enumerate() {
            if !(1..=16).contains(&s.blocks) || !(1..=4096).contains(&s.channels) || !(1..=2).contains(&s.stride) {
                return Err(format!(
                    "model.stages[{i}]: channels in 1..=4096, blocks in 1..=16 and stride 1 or 2 required"
                ));
            }
        }
        Ok(())
    }

    /// The first `[data]` value out of its range, the preprocess geometry's included.
    fn data_range_problem(&self) -> std::result::Result<(), String> {
        let d = &self.data;
        for c in 0..3 {
            let (mean, std) = (d.mean[c], d.std[c]);
            real(
                &format!("data.mean[{c}]"),
                mean.into(),
                (-10.0..=10.0).contains(&mean),
                "[-10, 10] (pixels are 0..1)",
            )?;
            // Below 0.001 (a quarter of one 8-bit level) normalization turns pixels into overflow.
            real(&format!("data.std[{c}]"), std.into(), (0.001..=10.0).contains(&std), "[0.001, 10]")?;
        }
        d.preprocess.validate().map_err(|e| match e {
            Error::Preprocess(m) => m,
            other => other.to_string(),
        })?;
        let crop = d.preprocess.crop_size as u64;
        if d.max_image_pixels < crop.saturating_mul(crop) {
            return Err(format!(
                "data.max_image_pixels = {} is below one {crop}x{crop} crop ({} pixels); it must be at least that \
                 (the default is 64000000)",
                d.max_image_pixels,
                crop * crop
            ));
        }
        check((0.0..=0.5).contains(&d.val_fraction), "data.val_fraction must be in 0..=0.5")?;
        check(d.max_image_pixels >= 1, "data.max_image_pixels must be >= 1")?;
        check((1..=256).contains(&d.prefetch_batches), "data.prefetch_batches must be in 1..=256")?;
        check(
            d.cache_ram_mib <= 1 << 20,
            "data.cache_ram_mib must be at most 1048576 (1 TiB); 0 turns the RAM cache off",
        )?;
        check(
            d.cache_disk_mib <= 1 << 24,
            "data.cache_disk_mib must be at most 16777216 (16 TiB); 0 turns the disk cache off",
        )?;
        check(d.workers <= 64, "data.workers must be in 0..=64 (0: one per core, up to 4)")
    }
}

/// `msg` unless `ok`.
fn check(ok: bool, msg: &str) -> std::result::Result<(), String> {
    if ok { Ok(()) } else { Err(msg.to_string()) }
}

/// A real-valued key: finite and `ok` (inside its documented range), or a message naming the
/// key, the value and the range.
fn real(key: &str, v: f64, ok: bool, range: &str) -> std::result::Result<(), String> {
    if v.is_finite() && ok { Ok(()) } else { Err(format!("{key} = {v} is outside its range {range}")) }
}
