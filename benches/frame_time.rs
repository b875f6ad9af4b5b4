//! Frame time of the desktop app while it trains: the app renders through wgpu (headless, on the
//! default adapter: lavapipe on a machine without a GPU) at up to 60 frames/s while its engine
//! thread trains the quickstart preset on the same adapter.
//!
//! ```text
//! cargo bench --bench frame_time            # 60 s of training
//! cargo bench --bench frame_time -- 20      # 20 s
//! ```
//! A frame is the app's UI code plus tessellation and rendering (`Harness::step` + `render`).
//! The goal is no frame over 50 ms while training (`vramfit::gui::FRAME_BUDGET_MS`).

use std::time::{Duration, Instant};

use egui_kittest::kittest::Queryable;
use vramfit::gui::{FRAME_BUDGET_MS, Settings, VramfitApp};

type Harness<'a> = egui_kittest::Harness<'a, VramfitApp>;

/// Runs frames at up to 60 per second for `secs`; returns each frame's time in ms.
fn frames(harness: &mut Harness<'_>, secs: f64) -> Vec<f32> {
    let mut times = Vec::new();
    let start = Instant::now();
    while start.elapsed().as_secs_f64() < secs {
        let t = Instant::now();
        harness.step();
        harness.render().expect("rendering through wgpu");
        times.push(t.elapsed().as_secs_f32() * 1000.0);
        std::thread::sleep(Duration::from_millis(16).saturating_sub(t.elapsed()));
    }
    times
}

/// One Markdown row: frames, p50, p95, max, frames over budget.
fn row(phase: &str, times: &[f32]) -> String {
    let mut v = times.to_vec();
    v.sort_by(f32::total_cmp);
    let pct = |p: f32| v[(((p / 100.0) * v.len() as f32).ceil() as usize).clamp(1, v.len()) - 1];
    let over = v.iter().filter(|&&ms| ms > FRAME_BUDGET_MS).count();
    format!("| {phase} | {} | {:.1} | {:.1} | {:.1} | {over} |", v.len(), pct(50.0), pct(95.0), pct(100.0))
}

fn main() {
    let secs: f64 = std::env::args().skip(1).find(|a| !a.starts_with('-')).and_then(|a| a.parse().ok()).unwrap_or(60.0);
    let dir = tempfile::tempdir().expect("a temporary folder");
    let mut app = VramfitApp::new(Settings::default());
    app.runs_dir = dir.path().join("runs");
    let device = app.window_title();
    let mut harness =
        Harness::builder().with_size([1280.0, 820.0]).wgpu().build_ui_state(|ui, app: &mut VramfitApp| app.ui(ui), app);
    frames(&mut harness, 2.0); // warm-up: pipelines, fonts
    let idle = frames(&mut harness, 5.0);
    harness.get_by_label("Train").click();
    let training = frames(&mut harness, secs);
    let steps = harness.state().history.last_step;
    harness.state_mut().stop_training();
    while harness.state().training() {
        harness.step();
        std::thread::sleep(Duration::from_millis(50));
    }
    println!("{device}; 1280x820 window; quickstart preset; {secs:.0} s of training ({steps} optimizer steps)\n");
    println!("| phase | frames | p50 ms | p95 ms | max ms | frames over {FRAME_BUDGET_MS:.0} ms |");
    println!("|---|---|---|---|---|---|");
    println!("{}", row("idle", &idle));
    println!("{}", row("training", &training));
}
