//! vramfit: train small image classifiers on any wgpu GPU with memory you can predict before
//! you press Train.
//!
//! The engine (everything here but [`cli`]) knows nothing of terminals or windows: it takes a
//! [`config::Config`], a [`dataset::Splits`] and a [`device::SelectedDevice`], reports
//! [`events::Event`]s to a callback and obeys an [`events::StopSignal`]. File access and threads
//! live at the edges ([`image_io::load_image`], [`loader`], [`checkpoint`], [`export`]).
#![deny(missing_docs)]

pub mod atomic_file;
pub mod augment;
pub mod bench;
pub mod bench_baseline;
pub mod check_data;
pub mod checkpoint;
#[cfg(not(target_arch = "wasm32"))]
pub mod cli;
pub mod config;
pub mod cpu_tensor;
pub mod dataset;
pub mod depthwise_conv;
pub mod device;
pub mod device_augment;
pub mod error;
pub mod eval;
pub mod events;
pub mod export;
pub mod fault;
pub mod fused_block;
pub mod fused_stem;
pub mod gelu;
pub mod group_norm_gelu;
pub mod gui;
pub mod idx;
pub mod image_cache;
pub mod image_io;
pub mod infer;
pub mod loader;
pub mod loader_bench;
pub mod measuring_switch;
pub mod memory;
pub mod memory_bench;
pub mod metadata;
pub mod model;
pub mod onnx;
pub mod precision;
pub mod preprocess;
pub mod presets;
pub mod run_dir;
pub mod schedule;
pub mod session;
pub mod train;
pub mod user_path;
#[cfg(target_arch = "wasm32")]
pub mod web;
pub mod wgsl_kernel;
pub mod worker_process;

pub use error::{Error, Result};
