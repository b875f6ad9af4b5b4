//! Terminal rendering of engine events with indicatif progress bars.

use indicatif::{ProgressBar, ProgressStyle};

use crate::engine::events::Event;
use crate::memory::human_bytes;

/// The progress bar's message until the first step ends.
const FIRST_STEP_MESSAGE: &str =
    "preparing the first step: loading data and, on a GPU, compiling every kernel (later runs reuse them)";

/// Draws one training run's events.
#[derive(Default)]
pub struct Renderer {
    bar: Option<ProgressBar>,
    steps_per_epoch: usize,
    warnings: usize,
}

impl Renderer {
    fn println(&self, line: String) {
        // A hidden bar (output not a terminal) drops println: write the line directly.
        match &self.bar {
            Some(b) if !b.is_hidden() => b.println(line),
            _ => eprintln!("{line}"),
        }
    }

    fn new_bar(&mut self, epoch: usize, epochs: usize) {
        if let Some(b) = self.bar.take() {
            b.finish_and_clear();
        }
        let bar = ProgressBar::new(self.steps_per_epoch as u64);
        let style = ProgressStyle::with_template("epoch {prefix} [{bar:30}] {pos}/{len} {elapsed} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> ");
        bar.set_style(style);
        bar.set_prefix(format!("{}/{}", epoch + 1, epochs));
        self.bar = Some(bar);
    }

    /// Renders one event.
    pub fn handle(&mut self, event: &Event, epochs: &mut usize) {
        match event {
            Event::Started { start_epoch, epochs: e, steps_per_epoch, .. } => {
                *epochs = *e;
                self.steps_per_epoch = *steps_per_epoch;
                eprintln!("{}", started_line(event));
                self.new_bar(*start_epoch, *e);
                if let Some(b) = &self.bar {
                    // Until the first step: the bar's clock ticks, so a first step that compiles
                    // every kernel (minutes on a software adapter) does not look like a hang.
                    b.set_message(FIRST_STEP_MESSAGE);
                    b.enable_steady_tick(std::time::Duration::from_secs(1));
                }
            }
            Event::Step { step, epoch, loss, accuracy, lr, images_per_sec, .. } => {
                if self.bar.is_none() {
                    self.new_bar(*epoch, *epochs);
                }
                if let Some(b) = &self.bar {
                    let pos = if self.steps_per_epoch > 0 { (*step - 1) % self.steps_per_epoch + 1 } else { *step };
                    b.set_position(pos as u64);
                    b.set_message(format!(
                        "loss {loss:.4} acc {:.1}% lr {lr:.2e} {images_per_sec:.0} img/s",
                        accuracy * 100.0
                    ));
                }
            }
            Event::Memory { bytes_in_use, bytes_reserved, peak_bytes_in_use, .. } => {
                tracing::debug!(bytes_in_use, bytes_reserved, peak_bytes_in_use, "memory sample");
            }
            Event::EpochEnd { epoch, .. } => {
                self.println(epoch_line(event));
                if epoch + 1 < *epochs {
                    self.new_bar(epoch + 1, *epochs);
                }
            }
            Event::Checkpoint { path } => tracing::info!("checkpoint {}", path.display()),
            Event::Warning(w) => self.warn(w),
            Event::SampleSkipped { source, reason } => self.warn(&format!("skipped {source}: {reason}")),
            Event::Info(s) => self.println(s.clone()),
            Event::Finished(_) => {} // the command prints its own summary
            Event::BatchAdapted { micro_batch, grad_accum_steps, reason } => {
                self.println(format!(
                    "memory: micro-batch now {micro_batch} x {grad_accum_steps} accumulation steps ({reason})"
                ));
            }
        }
    }

    /// Prints a warning; after the 20th, one line says more follow and the rest are counted only.
    fn warn(&mut self, text: &str) {
        self.warnings += 1;
        if self.warnings <= 20 {
            self.println(format!("warning: {text}"));
        } else if self.warnings == 21 {
            self.println("warning: more warnings follow; see the epoch summaries".into());
        }
    }

    /// Removes the bar.
    pub fn finish(&mut self) {
        if let Some(b) = self.bar.take() {
            b.finish_and_clear();
        }
    }
}

/// The line printed when a run starts (empty for other events).
fn started_line(event: &Event) -> String {
    let Event::Started {
        device,
        out_dir,
        steps_per_epoch,
        samples,
        plan,
        micro_batch: (batch, accum),
        augment_on_device,
        ..
    } = event
    else {
        return String::new();
    };
    let augment = if *augment_on_device { "on the device" } else { "on the CPU" };
    format!(
        "training on {device}: {} train / {} val images, {} per epoch of micro-batch {batch} x {accum}, augmentation {augment}, predicted peak {}, run folder {}",
        samples.0,
        samples.1,
        crate::engine::words::count(*steps_per_epoch, "step"),
        human_bytes(plan.estimate.total),
        out_dir.display()
    )
}

/// The line printed at the end of an epoch (empty for other events).
fn epoch_line(event: &Event) -> String {
    let (Some(metrics), Event::EpochEnd { secs, skipped, data_wait_secs, .. }) = (event.epoch_metrics_line(), event)
    else {
        return String::new();
    };
    let skipped = if *skipped > 0 { format!(", {skipped} files skipped") } else { String::new() };
    format!("{metrics} | {secs:.1} s ({data_wait_secs:.1} s waiting for data){skipped}")
}

/// Classes up to which `eval` prints every class and the whole confusion matrix; above it, the
/// classes and confusions that matter, and the matrix goes to its CSV file only.
pub(super) const EVAL_FULL_REPORT_CLASSES: usize = 20;

/// `eval`'s report after its headline: per-class recall (accuracy), precision and images, and the confusion matrix for up to
/// [`EVAL_FULL_REPORT_CLASSES`] classes; above, the 10 least accurate classes and the 10
/// largest confusions (true -> predicted), so 1000 classes print 25 lines, not 2000.
pub(super) fn eval_report(r: &crate::inference::eval::EvalResult) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let width = r.class_names.iter().map(|c| c.chars().count()).max().unwrap_or(5).max(5);
    let accuracy = r.per_class_accuracy();
    let precision = r.per_class_precision();
    let support = |c: usize| r.confusion[c].iter().sum::<u64>();
    let pct = |v: f32| if v.is_finite() { format!("{:.1}%", v * 100.0) } else { "n/a".into() };
    if r.class_names.len() <= EVAL_FULL_REPORT_CLASSES {
        let _ = writeln!(s, "\n{:width$}  {:>7}  {:>9}  {:>6}", "class", "recall", "precision", "images");
        for (c, name) in r.class_names.iter().enumerate() {
            let _ = writeln!(s, "{name:width$}  {:>7}  {:>9}  {:>6}", pct(accuracy[c]), pct(precision[c]), support(c));
        }
        let _ = writeln!(s, "\nconfusion matrix (rows: true class, columns: predicted, in class order)");
        for (name, row) in r.class_names.iter().zip(&r.confusion) {
            let cells: Vec<String> = row.iter().map(|v| format!("{v:5}")).collect();
            let _ = writeln!(s, "{name:width$} {}", cells.join(""));
        }
        return s;
    }
    let mut worst: Vec<usize> = (0..accuracy.len()).filter(|&c| support(c) > 0).collect();
    worst.sort_by(|&a, &b| accuracy[a].total_cmp(&accuracy[b]).then(support(b).cmp(&support(a))));
    let _ = writeln!(s, "\nthe 10 least accurate of {} classes (images):", r.class_names.len());
    for &c in worst.iter().take(10) {
        let _ = writeln!(s, "  {:width$}  {:5.1}%  ({})", r.class_names[c], accuracy[c] * 100.0, support(c));
    }
    let mut confusions: Vec<(u64, usize, usize)> = Vec::new();
    for (t, row) in r.confusion.iter().enumerate() {
        confusions.extend(row.iter().enumerate().filter(|&(p, &n)| p != t && n > 0).map(|(p, &n)| (n, t, p)));
    }
    confusions.sort_by(|a, b| b.0.cmp(&a.0).then((a.1, a.2).cmp(&(b.1, b.2))));
    let _ = writeln!(s, "\nthe 10 largest confusions (true -> predicted: images):");
    for &(n, t, p) in confusions.iter().take(10) {
        let _ = writeln!(s, "  {} -> {}: {n}", r.class_names[t], r.class_names[p]);
    }
    s
}
