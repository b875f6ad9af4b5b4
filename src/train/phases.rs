//! The phases of a training run, in order, for both stores: claim the run folder (0, before
//! anything in it is read: [`super::run_folder::claim`]), check the data and the precision
//! (1), plan the memory (2), open the store (3, [`super::run_folder`]), the epochs (5,
//! [`super::epoch`]), the end of each (6) and the finish (7, [`super::run`]: the label-issue
//! ranking of a run trained to its end, the export). One async function, [`run`].

use web_time::Instant;

use super::epoch_data::EpochData;
use super::run::{Ended, Run};
use super::run_folder;
use super::step::precision_on;
use super::store::{RunOptions, Store};
use crate::config::Config;
use crate::data::dataset::Splits;
use crate::data::loader;
use crate::data::pipeline::SamplePipeline;
use crate::device::SelectedDevice;
use crate::engine::error::{Error, Result};
use crate::engine::events::{Event, EventSink, StopSignal};
use crate::memory::{self, human_bytes};

/// Runs the phases of a training run on `device` over `splits`, sending [`Event`]s to `sink`:
/// [`Event::Started`], per step [`Event::Step`] (and [`Event::Memory`] where sampled), per epoch
/// [`Event::EpochEnd`], and [`Event::Finished`] last. Stop is honoured before each step; the
/// step cap after the step that reaches it; either one falling on an epoch's last step still
/// ends that epoch (evaluated, counted as completed).
///
/// # Errors
/// As [`super::train`]; [`Store::Memory`] writes nothing, so it has no I/O errors of its own.
pub(super) async fn run(
    options: RunOptions<'_>,
    device: &SelectedDevice,
    splits: &Splits,
    sink: EventSink<'_>,
    stop: &StopSignal,
) -> Result<Ended> {
    let started = Instant::now();
    let (claimed, restored) = match options.store {
        Store::Folder { out, resume, .. } => {
            let claimed = run_folder::claim(out, resume, &splits.root, options.config, sink)?;
            let val_fraction = options.config.data.val_fraction;
            (Some(claimed), run_folder::data_of_run(out, resume, splits, val_fraction, sink)?)
        }
        Store::Memory => (None, None),
    };
    // On resume: the scan put back into the split the run recorded.
    let splits = restored.as_ref().map_or(splits, |r| &r.splits);
    let config = check_data_and_precision(&options, device, splits, sink)?;
    let leaked_val = data_health(&options, splits, &config, sink);
    let (config, plan) = plan_memory(&options, device, splits, config, sink)?;
    let mut run = Run::new(options, device, splits, config, plan);
    let record = restored.as_ref().map(|r| &r.record);
    run.open_store(claimed.as_ref().and_then(|c| c.stored.as_ref()), splits, record, sink)?;
    sink(run.started_event(splits));
    crate::fault::at_start();
    let nothing = run.nothing_to_train();
    if let Some(why) = &nothing {
        // Nothing to train: leave the run's export as it is.
        sink(Event::Warning(format!("nothing to train: {why}")));
        run.summary.stopped = run.trainer.state.epoch < run.config.train.epochs;
    } else {
        let data = EpochData::new(splits, &run.config, run.augments_on_device(), run.options.store, &leaked_val);
        while run.trainer.state.epoch < run.config.train.epochs {
            let epoch_start = Instant::now();
            let totals = run.train_epoch(&data, sink, stop).await?;
            if run.summary.stopped {
                break;
            }
            run.end_epoch(&data, &totals, epoch_start, sink).await?;
            let more = run.trainer.state.epoch < run.config.train.epochs;
            if more && (stop.is_set() || run.capped()) {
                run.summary.stopped = true;
                break;
            }
        }
        if run.summary.stopped && matches!(run.options.store, Store::Memory) {
            // A model handed back cut short: the end's accuracy is of the model as it is now.
            run.summary.val = Some(run.evaluate(&data).await?);
        }
        if !run.summary.stopped {
            run.rank_label_issues(&data, splits, sink).await?;
        }
    }
    let ended = run.finish(started, nothing.is_none())?;
    sink(Event::Finished(ended.summary.run_end()));
    Ok(ended)
}

/// Phase 1: the data can train (warnings sent), and the precision every device of the run can
/// compute in (f16 falls back to f32 where one has none, with a warning).
fn check_data_and_precision(
    options: &RunOptions<'_>,
    device: &SelectedDevice,
    splits: &Splits,
    sink: EventSink,
) -> Result<Config> {
    let mut config = options.config.clone();
    if splits.train.samples.is_empty() {
        let path = match options.store {
            Store::Folder { out, .. } => out.to_path_buf(),
            Store::Memory => splits.root.clone(),
        };
        return Err(Error::Dataset { path, message: "no training samples".into() });
    }
    let resumed = matches!(options.store, Store::Folder { resume: true, .. });
    fit_batch_to_data(&mut config, splits.train.samples.len(), resumed, sink);
    let probe = SamplePipeline::from_config(&config, false);
    for warning in
        splits.report.warnings().into_iter().chain(splits.check_trainable(|source| probe.decode(source).is_ok())?)
    {
        sink(Event::Warning(warning));
    }
    let without_f16 = options.devices(device).find(|d| precision_on(&config, d) != config.train.precision);
    if let Some(d) = without_f16 {
        sink(Event::Warning(format!("{} has no shader f16: training in f32", d.name)));
        config.train.precision = crate::config::Precision::F32;
    } else if let Some(cpu) =
        options.devices(device).find(|d| config.train.precision == crate::config::Precision::F16 && !d.is_gpu())
    {
        // f16 saves device memory; a CPU backend has none to save and computes f16 slower
        // (6gb's recipe on flex: 8.6 s an epoch in f16 against 0.9 s in f32, a trial's figures).
        sink(Event::Warning(format!(
            "train.precision = \"f16\" on {}: about 10x slower than f32 there and nothing to save (the CPU has no \
             device memory budget); --precision f32 trains the same recipe faster",
            cpu.name
        )));
    }
    Ok(config)
}

/// Phase 1: the data's health ([`crate::data::health`]): with `data.find_duplicates` every image
/// is hashed and compared and one line of the report goes to `sink`, the whole into a run folder
/// ([`crate::data::health::REPORT_FILE`]); without it only the imbalance is warned. Returns the
/// validation images to leave out of evaluation (`data.drop_leaked_val`), indices into
/// `splits.val`.
fn data_health(options: &RunOptions<'_>, splits: &Splits, config: &Config, sink: EventSink) -> Vec<usize> {
    use crate::data::health;
    let remedies = health::Remedies::of(config);
    if !config.data.find_duplicates {
        if let Some(w) = health::imbalance_of(splits).warning().filter(|_| !remedies.balanced) {
            sink(Event::Warning(w));
        }
        return vec![];
    }
    let report = health::scan(splits, &config.data);
    let whole = match options.store {
        Store::Folder { out, .. } => {
            let file = out.join(health::REPORT_FILE);
            if let Err(e) = crate::atomic_file::write_atomic(&file, report.report().as_bytes()) {
                sink(Event::Warning(format!("the data health report was not written: {e}")));
            }
            file.display().to_string()
        }
        Store::Memory => "`vramfit check-data` on the dataset".to_string(),
    };
    if let Some((line, warn)) = report.summary_line(&whole, remedies) {
        sink(if warn { Event::Warning(line) } else { Event::Info(line) });
    }
    let leaked = report.leaked_val_indices();
    if config.data.drop_leaked_val && !leaked.is_empty() {
        sink(Event::Info(format!(
            "data.drop_leaked_val: validation leaves out its {} that copy training images ({} evaluated)",
            crate::engine::words::count(leaked.len(), "image"),
            splits.val.samples.len() - leaked.len()
        )));
        return leaked;
    }
    vec![]
}

/// Phase 1: numbers typed for another dataset size, made sense of: a batch larger than the
/// training set is clamped to it (a note: the plan is then of the batch that really trains);
/// accumulating over more batches than an epoch has, and a warmup under one optimizer step, are
/// pointed out (the warmup once, when the run begins: not again on each of its resumes).
fn fit_batch_to_data(config: &mut Config, images: usize, resumed: bool, sink: EventSink) {
    let train = &mut config.train;
    if train.batch_size > images {
        sink(Event::Info(format!(
            "train.batch_size = {} is more than the {images} training images: batches of {images} (one per epoch)",
            train.batch_size
        )));
        train.batch_size = images;
    }
    let batches = images.div_ceil(train.batch_size.max(1));
    if train.grad_accum_steps > batches {
        let fix = if batches == 1 { "set it to 1".to_string() } else { format!("lower it to {batches} or less") };
        sink(Event::Warning(format!(
            "train.grad_accum_steps = {} is more than the {batches} batches of an epoch: each epoch ends its \
             accumulation early, one optimizer step per epoch; {fix} (a dataset this small trains better with a \
             small batch: --batch-size 32 --grad-accum-steps 1)",
            train.grad_accum_steps
        )));
    }
    let warmup_steps = config.optimizer.warmup_epochs * crate::train::schedule::steps_per_epoch(images, train) as f64;
    // The run began with this note; its resumes do not repeat it.
    if warmup_steps > 0.0 && warmup_steps < 1.0 && !resumed {
        sink(Event::Info(format!(
            "optimizer.warmup_epochs = {} is under one optimizer step here ({warmup_steps:.2}): no warmup, the \
             first step runs at the full learning rate",
            config.optimizer.warmup_epochs
        )));
    }
}

/// Phase 2: the predicted peak fits the budget (or `auto_fit` makes it fit) and one
/// micro-batch's largest tensor fits every adapter's buffer limit, before anything is allocated.
/// With replicas the main device's plan is checked: it holds the most (the AdamW moments, and
/// at least as many micro-batches as any replica), and is planned as if it ran them all.
/// Returns the config to train and its plan (the predicted peak, `estimate.total`, in bytes
/// reserved): the run's one plan.
fn plan_memory(
    options: &RunOptions<'_>,
    device: &SelectedDevice,
    splits: &Splits,
    mut config: Config,
    sink: EventSink,
) -> Result<(Config, memory::Plan)> {
    let classes = splits.train.class_names.len();
    let px = config.image_size_px();
    let image_hw = loader::check_sizes_agree(&splits.train, &config.data.preprocess)?.unwrap_or((px, px));
    let plan = memory::plan(&config, classes);
    if !plan.fits {
        if plan.fit_batch_size == 0 {
            return Err(Error::Memory(format!(
                "predicted peak {} {} of the {} budget (memory.memory_budget_bytes), and not even batch 1 fits: \
                 lower data.preprocess.crop_size or the model's width, turn on f16 or checkpointing, or raise the budget",
                human_bytes(plan.estimate.total),
                plan.verdict(),
                human_bytes(plan.budget_bytes),
            )));
        }
        if !options.auto_fit {
            return Err(Error::Memory(format!(
                "predicted peak {} {} of the {} budget (memory.memory_budget_bytes); set train.batch_size = {} with \
                 train.grad_accum_steps = {} to keep the effective batch, turn on checkpointing or f16, or pass --auto-fit",
                human_bytes(plan.estimate.total),
                plan.verdict(),
                human_bytes(plan.budget_bytes),
                plan.fit_batch_size,
                plan.fit_grad_accum_steps
            )));
        }
        sink(Event::BatchAdapted {
            micro_batch: plan.fit_batch_size,
            grad_accum_steps: plan.fit_grad_accum_steps,
            reason: format!("--auto-fit: batch {} {}", config.train.batch_size, plan.verdict()),
        });
        config.train.batch_size = plan.fit_batch_size;
        config.train.grad_accum_steps = plan.fit_grad_accum_steps;
    }
    for d in options.devices(device) {
        if let Some(limit) = d.buffer_limit() {
            memory::check_buffer_limit(&config.model, classes, image_hw, config.train.batch_size, limit, &d.name)?;
        }
    }
    let devices = 1 + options.replicas.len();
    let micro_batches = config.train.grad_accum_steps.max(1);
    if devices > micro_batches {
        sink(Event::Warning(format!(
            "{devices} devices and {micro_batches} micro-batch(es) a step: the last {} device(s) get none and idle; \
             set train.grad_accum_steps to a multiple of {devices}",
            devices - micro_batches
        )));
    }
    // After --auto-fit the config trained is another: its plan, made once.
    let plan = if plan.fits { plan } else { memory::plan(&config, classes) };
    Ok((config, plan))
}
