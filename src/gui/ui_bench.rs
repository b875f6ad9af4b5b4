//! `vramfit bench ui`: the app trains for a while and reports its frame times (outside the app state).

use eframe::egui;

use super::{AppOptions, Command, FRAME_BUDGET_MS, FrameSummary, Settings, VramfitApp};

/// What `vramfit bench ui` measured.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct UiBenchResult {
    /// The device the app trained on.
    pub device: String,
    /// Frames drawn while training (eframe's CPU time per frame: UI code and rendering).
    pub training: FrameSummary,
    /// Optimizer steps taken meanwhile.
    pub steps: usize,
    /// Seconds from Train to the first step's point on the loss plot (the first step loads the
    /// data and, on a GPU, compiles every kernel); `None` when no step came.
    pub first_step_secs: Option<f64>,
    /// Why training did not start or failed, if it did.
    pub error: Option<String>,
}

/// The app in bench mode: it trains for `seconds`, stops, records what it measured and closes
/// the window. It wraps the app, which knows nothing of the bench.
struct BenchedApp {
    app: VramfitApp,
    seconds: f64,
    /// When training is stopped; set on the first frame, which starts it.
    deadline: Option<std::time::Instant>,
    /// When Train was pressed.
    pressed: Option<std::time::Instant>,
    /// Seconds from Train until the first step reached the app.
    first_step_secs: Option<f64>,
    result: std::sync::Arc<std::sync::Mutex<Option<UiBenchResult>>>,
}

impl BenchedApp {
    fn tick(&mut self, ctx: &egui::Context) {
        let Some(deadline) = self.deadline else {
            self.deadline = Some(std::time::Instant::now() + std::time::Duration::from_secs_f64(self.seconds));
            self.pressed = Some(std::time::Instant::now());
            self.app.apply(Command::Train);
            return;
        };
        if self.first_step_secs.is_none() && self.app.history().last_step > 0 {
            self.first_step_secs = self.pressed.map(|p| p.elapsed().as_secs_f64());
        }
        if self.app.training() {
            if std::time::Instant::now() >= deadline {
                self.app.apply(Command::Stop);
            }
            return;
        }
        let result = UiBenchResult {
            device: self.app.device_label(),
            training: self.app.frame_times().while_training(),
            steps: self.app.history().last_step,
            first_step_secs: self.first_step_secs,
            error: self.app.error().map(str::to_string),
        };
        if let Ok(mut slot) = self.result.lock() {
            *slot = Some(result);
        }
        ctx.send_viewport_cmd(egui::ViewportCommand::Close);
    }
}

impl eframe::App for BenchedApp {
    fn ui(&mut self, ui: &mut egui::Ui, frame: &mut eframe::Frame) {
        eframe::App::ui(&mut self.app, ui, frame);
        self.tick(ui.ctx());
    }
}

/// `vramfit bench ui`: opens the window as a first start does (the default settings, quickstart,
/// on the default device: [`VramfitApp::select_default_device`]), presses Train, trains for
/// `seconds`, stops, closes, and returns the frame times it drew meanwhile and how long the
/// first step took to reach the plots.
///
/// # Errors
/// When no window can be created (no display: run it under `xvfb-run`).
pub fn bench_ui(seconds: f64) -> anyhow::Result<UiBenchResult> {
    let result = std::sync::Arc::new(std::sync::Mutex::new(None));
    let slot = result.clone();
    let runs_dir = std::env::temp_dir().join(format!("vramfit-bench-ui-{}", std::process::id()));
    let options = eframe::NativeOptions {
        viewport: egui::ViewportBuilder::default().with_inner_size([1280.0, 820.0]).with_title("vramfit"),
        persist_window: false,
        ..Default::default()
    };
    let dir = runs_dir.clone();
    eframe::run_native(
        "vramfit-bench-ui",
        options,
        Box::new(move |_cc| {
            let options = AppOptions { runs_dir: dir, ..AppOptions::default() };
            let mut app = VramfitApp::try_with_options(Settings::default(), options)
                .map_err(|e| format!("cannot start the engine thread: {e}"))?;
            app.select_default_device();
            let (deadline, pressed, first_step_secs) = (None, None, None);
            Ok(Box::new(BenchedApp { app, seconds, deadline, pressed, first_step_secs, result: slot }))
        }),
    )
    .map_err(|e| anyhow::anyhow!("cannot open the window: {e}; on a machine without a display use xvfb-run"))?;
    let _ = std::fs::remove_dir_all(&runs_dir);
    let r = result.lock().map_err(|_| anyhow::anyhow!("the app thread panicked"))?.take();
    r.ok_or_else(|| anyhow::anyhow!("the window closed before the benchmark ended"))
}

/// [`bench_ui`] as `vramfit bench ui` prints it: a Markdown table of the frame times, and the
/// result's JSON.
///
/// # Errors
/// As [`bench_ui`]; also when training did not run.
pub fn bench_ui_report(seconds: f64) -> anyhow::Result<(String, String)> {
    let r = bench_ui(seconds)?;
    if let Some(e) = &r.error {
        anyhow::bail!("training did not run: {e}");
    }
    let t = &r.training;
    let table = format!(
        "{}; quickstart; {seconds:.0} s of training, {} optimizer steps; the first step reached the plots {} after Train\n\n| frames while training | p50 ms | p95 ms | longest ms | over {FRAME_BUDGET_MS} ms |\n|---|---|---|---|---|\n| {} | {:.1} | {:.1} | {:.1} | {} |",
        r.device,
        r.steps,
        r.first_step_secs.map_or("never".to_string(), |s| format!("{s:.1} s")),
        t.frames,
        t.p50_ms,
        t.p95_ms,
        t.max_ms,
        t.over_budget
    );
    Ok((table, serde_json::to_string_pretty(&r)?))
}
