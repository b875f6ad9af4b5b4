//! What a resumed run may change: a run continues with its stored config, changed by whatever
//! the client asks for (the CLI's flags, the app's knobs), except for the keys that shape the
//! network or what it sees.

use super::Config;
use crate::engine::error::{Error, Result};

impl Config {
    /// Keys a resumed run cannot change: they change the network, or what it sees, so its
    /// checkpoint no longer fits or its metrics stop being comparable.
    pub const FROZEN_ON_RESUME: [&'static str; 7] =
        ["model", "data.preprocess", "data.mean", "data.std", "data.alpha", "data.val_fraction", "seed"];

    /// The changes that resuming a run stored with this config under `next` makes, one line per
    /// leaf key whose value differs, `key: old -> new`, in key order. `train.epochs` extends or
    /// shortens the run (the warmup + cosine schedule is recomputed from the resume step on);
    /// batch size, accumulation, budget, precision, learning rate and the other training keys
    /// apply from the next step.
    ///
    /// # Errors
    /// [`Error::Config`] (source `--resume`) naming the first key of
    /// [`Self::FROZEN_ON_RESUME`] whose value differs: the run cannot continue under it.
    pub fn changes_on_resume(&self, next: &Config) -> Result<Vec<String>> {
        let (old, new) = (leaves(self)?, leaves(next)?);
        let differs = |key: &str| {
            let under = |(k, _): &&(String, String)| k == key || k.starts_with(&format!("{key}."));
            !old.iter().filter(under).eq(new.iter().filter(under))
        };
        if let Some(frozen) = Self::FROZEN_ON_RESUME.iter().find(|f| differs(f)) {
            return Err(Error::Config {
                source_name: "--resume".into(),
                message: format!(
                    "{frozen} cannot change on resume (the run was trained with {}): it changes the network or \
                     what it sees; start a new run with another --out",
                    value_at(self, frozen).unwrap_or_default()
                ),
            });
        }
        let mut changes = Vec::new();
        for (key, after) in &new {
            let before = old.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str());
            if before != Some(after.as_str()) {
                changes.push(format!("{key}: {} -> {after}", before.unwrap_or_default()));
            }
        }
        Ok(changes)
    }
}

/// Every leaf of `config` as (dotted key, TOML value text), in key order.
///
/// # Errors
/// [`Error::Config`] when the config has no TOML form (a value TOML cannot hold): nothing can
/// be compared, so nothing is let through.
fn leaves(config: &Config) -> Result<Vec<(String, String)>> {
    fn walk(prefix: &str, value: &toml::Value, out: &mut Vec<(String, String)>) {
        match value.as_table() {
            Some(table) => {
                for (k, v) in table {
                    let key = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
                    walk(&key, v, out);
                }
            }
            None => out.push((prefix.to_string(), value.to_string())),
        }
    }
    let root = toml::Value::try_from(config).map_err(|e| Error::Config {
        source_name: "--resume".into(),
        message: format!("the config cannot be compared: {e}"),
    })?;
    let mut out = Vec::new();
    walk("", &root, &mut out);
    Ok(out)
}

/// The value of a dotted key as TOML text (`None` when the key does not exist).
fn value_at(config: &Config, key: &str) -> Option<String> {
    let root = toml::Value::try_from(config).ok()?;
    let mut node = &root;
    for part in key.split('.') {
        node = node.get(part)?;
    }
    Some(node.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn training_keys_are_listed_as_changes_and_frozen_keys_refused() {
        let stored = Config::default();
        let mut next = stored.clone();
        next.train.epochs = stored.train.epochs + 2;
        next.optimizer.lr = 0.5;
        let changes = stored.changes_on_resume(&next).unwrap();
        assert_eq!(
            changes,
            [
                format!("optimizer.lr: {} -> 0.5", toml::Value::from(stored.optimizer.lr)),
                format!("train.epochs: {} -> {}", stored.train.epochs, stored.train.epochs + 2)
            ]
        );
        assert!(stored.changes_on_resume(&stored).unwrap().is_empty());
        let mut other_crop = stored.clone();
        other_crop.data.preprocess.crop_size -= 4;
        let err = stored.changes_on_resume(&other_crop).unwrap_err().to_string();
        assert!(err.contains("data.preprocess cannot change on resume"), "{err}");
        let mut other_seed = stored.clone();
        other_seed.seed += 1;
        assert!(stored.changes_on_resume(&other_seed).unwrap_err().to_string().contains("seed cannot change"));
        // A frozen key deep in a table is caught too.
        let mut other_mean = stored.clone();
        other_mean.data.mean[0] += 0.1;
        assert!(stored.changes_on_resume(&other_mean).unwrap_err().to_string().contains("data.mean cannot change"));
    }
}
