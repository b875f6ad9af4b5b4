//! Integration tests: the real-world cases of `tests/data/cases` (copied from shared/cases),
//! IDX parsing, and training/export/predict/resume on the wgpu adapter (lavapipe in CI) and
//! burn's CPU backends.
//!
//! One test binary (linking burn once), split into modules by subject; the helpers shared by
//! several modules are in `helpers.rs`.
#![allow(clippy::unwrap_used)] // a panic is how a test fails

use std::path::{Path, PathBuf};

use vramfit::Error;
use vramfit::config::Config;
use vramfit::data::dataset::{self, SampleSource, ScanOptions};
use vramfit::data::idx;
use vramfit::data::image_io::{LoadOptions, load_image};
use vramfit::data::pipeline::SamplePipeline;
use vramfit::data::preprocess::{PreprocessConfig, PreprocessMode};
use vramfit::device::{self, CpuBackend, DeviceChoice, SelectedDevice};
use vramfit::engine::events::{Event, StopSignal};
use vramfit::train::{self, TrainRequest};

mod app;
mod augment;
mod data_faults;
mod data_health;
mod depthwise_conv;
mod devices;
mod folders;
mod fuzz;
mod group_norm_gelu;
mod idx_files;
mod images;
mod memory;
mod onnx;
#[cfg(feature = "remote")]
mod remote;
mod runs;
mod train_in_memory;
mod training;

mod helpers;
use helpers::*;
