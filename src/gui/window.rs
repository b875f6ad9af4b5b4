//! The app as an eframe window: the native one ([`run`], with the saved settings read and their
//! notices shown) and, in a browser, the canvas's hooks.

use eframe::egui;

use super::VramfitApp;
#[cfg(not(target_arch = "wasm32"))]
use super::{AppOptions, saved_settings};

impl eframe::App for VramfitApp {
    fn ui(&mut self, ui: &mut egui::Ui, frame: &mut eframe::Frame) {
        // The previous frame's CPU time, UI code and rendering (eframe measures it).
        if let Some(secs) = frame.info().cpu_usage {
            self.frame_times.record(secs * 1000.0, self.training());
        }
        VramfitApp::ui(self, ui);
    }

    fn save(&mut self, storage: &mut dyn eframe::Storage) {
        eframe::set_value(storage, eframe::APP_KEY, &self.settings);
    }

    /// In a browser the settings go to local storage within a second of a change: eframe's
    /// save on closing the page does not run in Chromium 156 (it listens for `onbeforeunload`,
    /// not `beforeunload`), so the 30 s default would lose the last changes.
    #[cfg(target_arch = "wasm32")]
    fn auto_save_interval(&self) -> std::time::Duration {
        std::time::Duration::from_secs(1)
    }

    /// The page's hooks reach the app through this (`eframe::WebRunner::app_mut`, `crate::web`).
    #[cfg(target_arch = "wasm32")]
    fn as_any_mut(&mut self) -> Option<&mut dyn std::any::Any> {
        Some(&mut *self)
    }
}

/// Opens the window (`vramfit` with no command).
///
/// # Errors
/// When no window can be created (no display).
#[cfg(not(target_arch = "wasm32"))]
pub fn run() -> anyhow::Result<()> {
    let options = eframe::NativeOptions {
        // The first frame sets the title to the selected device (`VramfitApp::window_title`).
        viewport: egui::ViewportBuilder::default().with_inner_size([1280.0, 820.0]).with_title("vramfit"),
        ..Default::default()
    };
    eframe::run_native(
        "vramfit",
        options,
        Box::new(|cc| {
            // Read here rather than through eframe, which drops what it cannot parse unsaid.
            let (saved, mut notices) = match eframe::storage_dir("vramfit") {
                Some(dir) => saved_settings::read_storage_file(&dir.join("app.ron"), eframe::APP_KEY),
                None => (None, Vec::new()),
            };
            let saved = saved.or_else(|| cc.storage.and_then(|s| s.get_string(eframe::APP_KEY)));
            let (settings, restored) = saved_settings::restore(saved.as_deref());
            notices.extend(restored);
            let mut app = VramfitApp::try_with_options(settings, AppOptions::default())
                .map_err(|e| format!("cannot start the engine thread: {e}"))?;
            if saved.is_none() {
                app.select_default_device();
            }
            app.add_notices(notices);
            Ok(Box::new(app))
        }),
    )
    .map_err(|e| {
        anyhow::anyhow!(
            "cannot open the window: {e}; use the command line (vramfit --help) on machines without a display"
        )
    })
}
