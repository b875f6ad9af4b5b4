//! The input side: datasets ([`dataset`]: folders, IDX files, files handed over in memory, the
//! bundled subset), decoding ([`image_io`], [`idx`]), the decoded-image cache ([`image_cache`]),
//! the preprocess modes ([`preprocess`]), augmentation on the CPU ([`augment`]), host batches
//! and their upload ([`batch`]) from worker threads ([`loader`]) from each sample's [`pipeline`], the data report
//! ([`check_data`]), what a run was trained on ([`split_record`]) and paths as users type them
//! ([`user_path`]).

pub mod augment;
pub mod batch;
pub mod check_data;
pub mod dataset;
pub mod health;
pub mod idx;
pub mod image_cache;
pub mod image_io;
pub mod loader;
pub mod pipeline;
pub mod preprocess;
pub mod split_record;
pub mod user_path;
