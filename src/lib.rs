//! vramfit: train small image classifiers on any wgpu GPU with memory you can predict before
//! you press Train.
//!
//! The engine (everything here but the clients [`cli`], [`gui`] and `web`) knows nothing of
//! terminals or windows: it takes a [`config::Config`], a [`data::dataset::Splits`] and a
//! [`device::SelectedDevice`], reports [`engine::events::Event`]s to a callback and obeys an
//! [`engine::events::StopSignal`]. Each folder is one concern: [`engine`] (the session, the
//! worker process, events, errors), [`config`] (with the presets), [`data`] (datasets, decoding,
//! preprocessing, augmentation, the loader), [`model`], [`kernels`] (vramfit's CPU and WGSL
//! kernels), [`train`] (the one training loop, the step, checkpoints, run folders),
//! [`inference`] (evaluation, prediction), [`export`] (with ONNX) and [`bench`]; the device
//! ([`device`]) and the memory plan ([`memory`]) sit at the root beside them.
#![deny(missing_docs)]

pub mod atomic_file;
pub mod bench;
#[cfg(not(target_arch = "wasm32"))]
pub mod cli;
pub mod config;
pub mod data;
pub mod device;
pub mod engine;
pub mod export;
pub mod fault;
pub mod gui;
pub mod inference;
pub mod kernels;
pub mod memory;
pub mod model;
pub mod train;
#[cfg(target_arch = "wasm32")]
pub mod web;

pub use engine::error::{Error, Result};
