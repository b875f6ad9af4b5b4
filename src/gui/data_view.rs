//! The Data view: the dataset's health ([`crate::data::health`]: copies inside a class, the same
//! picture under two labels, validation copies of training images, class sizes, files the scan
//! left out) with thumbnails, each file's folder one click away. The scan and the thumbnails run
//! on the engine session ([`Job::DataHealth`], [`Job::Thumbnails`]), never on the UI thread.
//! [`Thumbnails`] also serve the evaluation view's galleries.

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;

use eframe::egui;

use super::{Command, VramfitApp};
use crate::data::dataset::{SampleSource, Splits};
use crate::data::health::DataHealth;
use crate::data::health::duplicates::DuplicateGroup;
use crate::data::split_record::Split;
use crate::engine::session::{Job, JobOutput};

/// An image of the app's dataset: its split and its index there.
pub type ImageKey = (Split, usize);

/// Side of a thumbnail in the views, in points.
const THUMB: f32 = 56.0;

/// What the Data view and the galleries ask the app to do.
#[derive(Clone, Debug, PartialEq)]
pub enum DataCommand {
    /// Scan the dataset's health (once per dataset; the Data view asks when first shown).
    CheckData,
    /// Load the thumbnails of these images.
    LoadThumbnails(Vec<ImageKey>),
    /// Open the folder holding this file in the system's file manager.
    ShowInFolder(PathBuf),
    /// Show the images of one confusion-matrix cell `(true class, predicted class)`, or none.
    SelectCell(Option<(usize, usize)>),
}

/// A data job in flight, in submission order (the session runs them in order).
#[derive(Debug)]
enum Pending {
    Health(u64),
    Thumbnails(u64, Vec<ImageKey>),
}

/// The Data view's state and the thumbnails of the app's dataset.
#[derive(Default)]
pub(super) struct DataState {
    /// The dataset's health once scanned, or why the scan failed.
    pub(super) health: Option<Result<DataHealth, String>>,
    /// The thumbnails loaded, by image.
    pub(super) thumbnails: Thumbnails,
    /// The confusion-matrix cell whose images the evaluation view shows.
    pub(super) cell: Option<(usize, usize)>,
    /// Bumped when the dataset changes: results of older jobs are dropped.
    generation: u64,
    pending: VecDeque<Pending>,
}

impl DataState {
    /// Whether a health scan is in flight.
    pub(super) fn scanning(&self) -> bool {
        self.pending.iter().any(|p| matches!(p, Pending::Health(g) if *g == self.generation))
    }

    /// Forgets the dataset's health and thumbnails (the dataset changed).
    pub(super) fn reset(&mut self) {
        *self = Self { generation: self.generation + 1, pending: std::mem::take(&mut self.pending), ..Self::default() };
    }
}

/// Thumbnails as decoded, and as textures once drawn.
#[derive(Default)]
pub(super) struct Thumbnails {
    images: HashMap<ImageKey, Option<egui::ColorImage>>,
    textures: HashMap<ImageKey, egui::TextureHandle>,
}

impl Thumbnails {
    /// Of `keys`, those neither loaded nor asked for.
    pub(super) fn missing(&self, keys: impl IntoIterator<Item = ImageKey>) -> Vec<ImageKey> {
        keys.into_iter().filter(|k| !self.images.contains_key(k)).collect()
    }

    /// Draws `key`'s thumbnail (a grey square while it loads or when it does not decode).
    pub(super) fn show(&mut self, ui: &mut egui::Ui, key: ImageKey) -> egui::Response {
        let size = egui::vec2(THUMB, THUMB);
        if let (None, Some(Some(img))) = (self.textures.get(&key), self.images.get(&key)) {
            let name = format!("thumb-{key:?}");
            self.textures.insert(key, ui.ctx().load_texture(name, img.clone(), egui::TextureOptions::LINEAR));
        }
        match self.textures.get(&key) {
            Some(t) => ui.add(egui::Image::new((t.id(), fit(t.size_vec2(), size)))),
            None => {
                let (rect, response) = ui.allocate_exact_size(size, egui::Sense::hover());
                ui.painter().rect_filled(rect, 2.0, ui.visuals().faint_bg_color);
                response
            }
        }
    }
}

/// `image` scaled to fit `bound`, keeping its aspect.
fn fit(image: egui::Vec2, bound: egui::Vec2) -> egui::Vec2 {
    image * (bound.x / image.x.max(1.0)).min(bound.y / image.y.max(1.0))
}

/// The sample `key` names in `splits`.
pub(super) fn source_of(splits: &Splits, (split, index): ImageKey) -> Option<&SampleSource> {
    let dataset = if split == Split::Train { &splits.train } else { &splits.val };
    dataset.samples.get(index).map(|s| &s.source)
}

impl VramfitApp {
    /// The dataset's health, once the Data view had it scanned (or why the scan failed).
    pub fn data_health(&self) -> Option<Result<&DataHealth, &str>> {
        self.data_state.health.as_ref().map(|h| h.as_ref().map_err(String::as_str))
    }

    /// Whether a health scan or thumbnails are being made.
    pub fn data_busy(&self) -> bool {
        !self.data_state.pending.is_empty()
    }

    /// Applies a [`DataCommand`].
    pub(super) fn apply_data(&mut self, command: DataCommand) {
        match command {
            DataCommand::CheckData => self.check_data(),
            DataCommand::LoadThumbnails(keys) => self.load_thumbnails(keys),
            DataCommand::ShowInFolder(folder) => self.show_in_folder(folder),
            DataCommand::SelectCell(cell) => self.data_state.cell = cell,
        }
    }

    /// Submits the health scan of the dataset, unless one is in flight or done.
    fn check_data(&mut self) {
        let state = &self.data_state;
        if state.health.is_some() || state.scanning() {
            return;
        }
        let Ok(splits) = &self.data else { return };
        let job =
            Job::DataHealth { splits: Box::new(splits.clone()), data: Box::new(self.settings.config.data.clone()) };
        if self.submit(job) {
            self.data_state.pending.push_back(Pending::Health(self.data_state.generation));
        }
    }

    /// Submits the thumbnails of `keys` not yet loaded or asked for.
    fn load_thumbnails(&mut self, keys: Vec<ImageKey>) {
        let Ok(splits) = &self.data else { return };
        let keys = self.data_state.thumbnails.missing(keys);
        let sources: Vec<SampleSource> = keys.iter().filter_map(|&k| source_of(splits, k).cloned()).collect();
        if sources.len() != keys.len() || keys.is_empty() {
            return;
        }
        if self.submit(Job::Thumbnails { sources }) {
            for &k in &keys {
                self.data_state.thumbnails.images.insert(k, None);
            }
            self.data_state.pending.push_back(Pending::Thumbnails(self.data_state.generation, keys));
        }
    }

    /// Opens `folder` in the system's file manager (a page has none: the error line says so).
    fn show_in_folder(&mut self, folder: PathBuf) {
        #[cfg(not(target_arch = "wasm32"))]
        if let Err(e) = open::that_detached(&folder) {
            self.error = Some(format!("cannot open {}: {e}", folder.display()));
        }
        #[cfg(target_arch = "wasm32")]
        {
            self.error = Some(format!("a browser cannot open folders ({})", folder.display()));
        }
    }

    /// A [`Job::DataHealth`] or [`Job::Thumbnails`] ended (in the order they were submitted).
    pub(super) fn data_job_finished(&mut self, result: crate::Result<JobOutput>) {
        let state = &mut self.data_state;
        let current = |g: u64| g == state.generation;
        match (state.pending.pop_front(), result) {
            (Some(Pending::Health(g)), Ok(JobOutput::DataHealth(health))) if current(g) => {
                state.health = Some(Ok(*health));
            }
            (Some(Pending::Health(g)), Err(e)) if current(g) => state.health = Some(Err(e.to_string())),
            (Some(Pending::Thumbnails(g, keys)), Ok(JobOutput::Thumbnails(images))) if current(g) => {
                for (key, img) in keys.into_iter().zip(images) {
                    let color =
                        img.map(|t| egui::ColorImage::from_rgb([t.width() as usize, t.height() as usize], t.as_raw()));
                    state.thumbnails.images.insert(key, color);
                }
            }
            _ => {} // a stale result, or a failed thumbnail job (its images stay grey)
        }
    }

    /// Draws the Data view; asks for the scan and the thumbnails it shows.
    pub(super) fn data_ui(&mut self, ui: &mut egui::Ui, commands: &mut Vec<Command>) {
        let splits = match &self.data {
            Ok(s) => s,
            Err(e) => {
                ui.label(format!("No dataset to check: {e}"));
                return;
            }
        };
        let health = match &self.data_state.health {
            None => {
                if !self.data_state.scanning() {
                    commands.push(Command::Data(DataCommand::CheckData));
                }
                ui.horizontal(|ui| {
                    ui.spinner();
                    ui.label(format!(
                        "Looking for copies among {} images…",
                        splits.train.samples.len() + splits.val.samples.len()
                    ));
                });
                return;
            }
            Some(Err(e)) => {
                ui.colored_label(ui.visuals().error_fg_color, format!("The data check failed: {e}"));
                return;
            }
            Some(Ok(h)) => h,
        };
        let mut wanted = Vec::new();
        egui::ScrollArea::vertical().auto_shrink([false, false]).show(ui, |ui| {
            health_ui(ui, health, splits, &mut self.data_state.thumbnails, &mut wanted, commands);
        });
        let missing = self.data_state.thumbnails.missing(wanted);
        if !missing.is_empty() {
            commands.push(Command::Data(DataCommand::LoadThumbnails(missing)));
        }
    }
}

/// The health report: a summary, the three kinds of group with thumbnails, class sizes and the
/// files the scan left out. The images drawn are added to `wanted`.
fn health_ui(
    ui: &mut egui::Ui,
    health: &DataHealth,
    splits: &Splits,
    thumbnails: &mut Thumbnails,
    wanted: &mut Vec<ImageKey>,
    commands: &mut Vec<Command>,
) {
    let d = &health.duplicates;
    ui.label(format!(
        "{} images: {} groups of copies ({} extra copies), compared by file bytes, decoded pixels and a perceptual \
         hash (resized, re-compressed and mirrored copies; not crops).",
        health.images,
        d.groups.len(),
        d.extra_copies()
    ));
    for warning in health.warnings() {
        ui.colored_label(ui.visuals().warn_fg_color, warning);
    }
    let conflicts: Vec<&DuplicateGroup> = d.conflicts().collect();
    let leaking: Vec<&DuplicateGroup> = d.groups.iter().filter(|g| !g.leaked().is_empty()).collect();
    let within: Vec<&DuplicateGroup> = d.within_class().collect();
    let mut section = |ui: &mut egui::Ui, title: &str, groups: &[&DuplicateGroup]| {
        egui::CollapsingHeader::new(format!("{title}: {}", groups.len())).default_open(!groups.is_empty()).show(
            ui,
            |ui| {
                for g in groups.iter().take(10) {
                    group_ui(ui, g, splits, thumbnails, wanted, commands);
                }
                if groups.len() > 10 {
                    ui.small(format!("… and {} more groups (vramfit check-data lists them)", groups.len() - 10));
                }
            },
        );
    };
    section(ui, "The same picture under two labels (one label is wrong)", &conflicts);
    section(ui, "Validation images that copy training images (validation accuracy is inflated)", &leaking);
    section(ui, "Copies inside one class (harmless, but the picture weighs more)", &within);
    classes_ui(ui, health);
    if !splits.report.ignored.is_empty() {
        egui::CollapsingHeader::new(format!("Files the scan left out: {}", splits.report.ignored.len())).show(
            ui,
            |ui| {
                for (file, why) in splits.report.ignored.iter().take(50) {
                    ui.small(format!("{}: {why}", file.display()));
                }
            },
        );
    }
}

/// One group: each image's thumbnail, path, class and split, and a button opening its folder.
fn group_ui(
    ui: &mut egui::Ui,
    group: &DuplicateGroup,
    splits: &Splits,
    thumbnails: &mut Thumbnails,
    wanted: &mut Vec<ImageKey>,
    commands: &mut Vec<Command>,
) {
    ui.horizontal_wrapped(|ui| {
        ui.small(group.kind.describe());
        for m in group.for_display().into_iter().take(4) {
            let key = (m.split, m.index);
            wanted.push(key);
            ui.vertical(|ui| {
                thumbnails.show(ui, key).on_hover_text(&m.path);
                ui.small(format!("{} [{}, {}]", short(&m.path), m.class, crate::data::health::split_name(m.split)));
                if let Some(SampleSource::File(path)) = source_of(splits, key)
                    && let Some(folder) = path.parent()
                    && ui.small_button("Show in folder").clicked()
                {
                    commands.push(Command::Data(DataCommand::ShowInFolder(folder.to_path_buf())));
                }
            });
        }
        if group.members.len() > 4 {
            ui.small(format!("and {} more", group.members.len() - 4));
        }
    });
    ui.separator();
}

/// The last 28 characters of a path (the file name and its folder, as a caption fits).
fn short(path: &str) -> String {
    let chars: Vec<char> = path.chars().collect();
    if chars.len() <= 28 {
        path.to_string()
    } else {
        format!("…{}", chars[chars.len() - 27..].iter().collect::<String>())
    }
}

/// Each class's images as a bar against the largest, with the imbalance ratio.
fn classes_ui(ui: &mut egui::Ui, health: &DataHealth) {
    let imbalance = &health.imbalance;
    let largest = imbalance.counts.iter().max().copied().unwrap_or(1).max(1);
    egui::CollapsingHeader::new(format!("Class sizes (largest/smallest {:.1})", imbalance.ratio())).show(ui, |ui| {
        egui::Grid::new("class_sizes").striped(true).show(ui, |ui| {
            for (name, &n) in imbalance.class_names.iter().zip(&imbalance.counts).take(100) {
                ui.label(name);
                ui.add(egui::ProgressBar::new(n as f32 / largest as f32).text(n.to_string()).desired_width(200.0));
                ui.end_row();
            }
        });
    });
}
