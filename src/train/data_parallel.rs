//! Data parallelism: one optimizer step's micro-batches spread over several devices.
//!
//! The **main device** holds the model, the AdamW state and the loop state
//! ([`super::step::Trainer`]). Each **replica** device takes a copy of the weights at the start
//! of every step ([`Module::fork`]), runs the forward and backward passes of its share of the
//! step's micro-batches (micro-batch `i` of the step on device `i mod n`, the main device being
//! device 0: [`device_of`]), and sums its gradients there. The replicas' sums are then moved to
//! the main device and added to the main device's own ([`gather`]); the gradient norm, clipping,
//! loss scaling and the optimizer step happen there, once, as on one device.
//!
//! The gradient is the one gradient accumulation gives on one device: the same micro-batches,
//! each loss weighted by its share of the step's images, summed. Only the order of the sum
//! differs where a device runs more than one micro-batch (float addition is not associative),
//! so two devices of one backend give the weights one device gives with `grad_accum_steps = 2`
//! exactly, two backends within their kernels' rounding, and four micro-batches on two devices
//! within rounding (`tests` below). This is burn-train's
//! multi-device strategy (gradients from each device meet on a main device), kept inside
//! vramfit's own step so that the loss scaler, the NaN guard and the retry at half the
//! micro-batch hold for every device alike.
//!
//! Each replica runs its share on a thread of its own ([`spawn_share`]) while the engine thread
//! runs the main device's, so the devices compute at the same time; the step waits for the
//! slowest ([`join_share`]). A replica's device failure, or its memory crossing
//! `memory.cap_to_budget`, is the step's, retried at half the micro-batch as on one device.

use burn::module::Module;
use burn::optim::{GradientsAccumulator, GradientsParams};
use burn::tensor::{Device, Tensor};

use crate::data::batch::Batch;
use crate::device::SelectedDevice;
use crate::engine::error::Error;
use crate::model::Classifier;
use crate::train::pass::PassSettings;
use crate::train::step::{StepError, over_cap};

/// A device that runs a share of each step's micro-batches for the main device.
#[derive(Clone, Debug)]
pub(crate) struct Replica {
    /// The device without autodiff (inputs, the augmentation kernel, memory readings).
    pub(crate) device: Device,
    /// Its autodiff device, with the main device's activation checkpointing.
    pub(crate) ad_device: Device,
}

impl Replica {
    /// `device` as a replica of a run that checkpoints activations when `checkpointing`.
    pub(crate) fn new(device: &SelectedDevice, checkpointing: bool) -> Self {
        let ad_device = if checkpointing {
            device.device.clone().autodiff().gradient_checkpointing()
        } else {
            device.device.clone().autodiff()
        };
        Self { device: device.device.clone(), ad_device }
    }
}

/// The device (0: the main one, `k`: replica `k - 1`) that runs micro-batch `index` of a step
/// among `devices` devices: round robin, so with `grad_accum_steps x split_factor` a multiple
/// of `devices` each device runs as many micro-batches as the others.
pub(crate) fn device_of(index: usize, devices: usize) -> usize {
    index % devices.max(1)
}

/// A step's micro-batches dealt to `devices` devices ([`device_of`]): entry `d` holds device
/// `d`'s, in the step's order.
pub(crate) fn deal(chunks: impl Iterator<Item = Batch>, devices: usize) -> Vec<Vec<Batch>> {
    let mut dealt: Vec<Vec<Batch>> = (0..devices.max(1)).map(|_| Vec::new()).collect();
    for (index, chunk) in chunks.enumerate() {
        dealt[device_of(index, devices)].push(chunk);
    }
    dealt
}

/// A replica's share of a step running on a thread of its own ([`spawn_share`]). Dropped
/// unjoined (the step failed elsewhere), it waits for the thread: no share of a failed step
/// runs on when the step is retried.
pub(crate) struct RunningShare(Option<std::thread::JoinHandle<StepResult<Share>>>);

type StepResult<T> = std::result::Result<T, StepError>;

impl Drop for RunningShare {
    fn drop(&mut self) {
        if let Some(handle) = self.0.take() {
            let _ = handle.join();
        }
    }
}

/// Starts `replica`'s share of a step on a thread of its own: `weights` (the main device's,
/// copied to the replica here, on the calling thread) run the forward and backward passes of
/// `chunks` there, their gradients and sums added up ([`Share::add`]); memory is read after
/// the first forward pass and held to `settings.memory_cap`, and the thread ends when the
/// replica's work is done, so a device failure is this share's. A replica given no
/// micro-batch starts nothing.
pub(crate) fn spawn_share(
    settings: PassSettings,
    weights: &Classifier,
    replica: &Replica,
    chunks: Vec<Batch>,
) -> RunningShare {
    if chunks.is_empty() {
        return RunningShare(None);
    }
    let weights = weights.clone().fork(&replica.ad_device);
    let replica = replica.clone();
    RunningShare(Some(std::thread::spawn(move || {
        let mut share = Share::default();
        for (index, chunk) in chunks.into_iter().enumerate() {
            let (images, labels) =
                settings.inputs(chunk, &replica.device, &replica.ad_device).map_err(StepError::Fatal)?;
            let logits = weights.forward(images, settings.precision);
            if index == 0 && settings.memory_cap.is_some() {
                replica.device.sync().map_err(|e| StepError::device(&e))?;
                if let Some((_, reserved)) = crate::memory::probe::sample(&replica.device) {
                    over_cap(reserved, settings.memory_cap)?;
                }
            }
            let (grads, loss_n, correct) = settings.backward(&weights, logits, labels, &replica.ad_device);
            share.add(&weights, grads, loss_n, correct);
        }
        replica.device.sync().map_err(|e| StepError::device(&e))?;
        Ok(share)
    })))
}

/// Waits for a replica's share.
///
/// # Errors
/// Its device's failure or its memory cap crossed as [`StepError::Device`] (the step is
/// retried at half the micro-batch, as on one device); an error of its data, or a panic of its
/// thread (the message), as fatal.
pub(crate) fn join_share(mut running: RunningShare) -> StepResult<Share> {
    let Some(handle) = running.0.take() else { return Ok(Share::default()) };
    handle.join().unwrap_or_else(|panic| {
        let message = crate::engine::events::panic_message(panic.as_ref());
        Err(StepError::Fatal(Error::Crashed(format!("a replica's share of the step panicked: {message}"))))
    })
}

/// What one device made of its share of a step: the sum of its micro-batches' gradients, and
/// of their losses (each times its images) and correct predictions.
#[derive(Default)]
pub(crate) struct Share {
    accumulator: GradientsAccumulator<Classifier>,
    /// `[1]`, on the device (without autodiff).
    loss_sum: Option<Tensor<1>>,
    /// `[1]`, on the device (without autodiff).
    correct_sum: Option<Tensor<1>>,
}

impl Share {
    /// Adds one micro-batch: its gradients (of `weights`, the weights this device ran), its
    /// loss times its images `[1]` and its correct count `[1]`.
    pub(crate) fn add(&mut self, weights: &Classifier, grads: GradientsParams, loss_n: Tensor<1>, correct: Tensor<1>) {
        self.accumulator.accumulate(weights, grads);
        self.loss_sum = Some(match self.loss_sum.take() {
            Some(a) => a + loss_n,
            None => loss_n,
        });
        self.correct_sum = Some(match self.correct_sum.take() {
            Some(a) => a + correct,
            None => correct,
        });
    }
}

/// The step's summed gradients on the main device, and its loss and correct sums `[1]` there:
/// each replica's share (`shares[1..]`) moved to `main_ad_device` / `main_device` and added to
/// the main device's (`shares[0]`), in device order. `None` when no share holds a micro-batch.
pub(crate) fn gather(
    shares: Vec<Share>,
    model: &Classifier,
    main_ad_device: &Device,
    main_device: &Device,
) -> Option<(GradientsParams, Tensor<1>, Tensor<1>)> {
    let mut shares = shares.into_iter();
    let mut main = shares.next()?;
    for mut replica in shares {
        let (Some(loss), Some(correct)) = (replica.loss_sum.take(), replica.correct_sum.take()) else { continue };
        let grads = replica.accumulator.grads().to_device(main_ad_device, model);
        main.add(model, grads, loss.to_device(main_device), correct.to_device(main_device));
    }
    Some((main.accumulator.grads(), main.loss_sum?, main.correct_sum?))
}

#[cfg(test)]
mod tests {
    use burn::module::{Module, ModuleVisitor, Param};
    use burn::tensor::Tensor;

    use super::Replica;
    use crate::config::{Config, Precision};
    use crate::data::batch::Batch;
    use crate::device::{CpuBackend, SelectedDevice};
    use crate::model::Classifier;
    use crate::train::step::{StepError, Trainer};

    /// Every parameter's values, in visiting order.
    struct Values(Vec<f32>);

    impl ModuleVisitor for Values {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            self.0.extend(param.val().into_data().try_to_vec::<f32>().unwrap());
        }
    }

    fn weights(trainer: &Trainer) -> Vec<f32> {
        let mut values = Values(Vec::new());
        trainer.model().visit(&mut values);
        values.0
    }

    /// `grad_accum_steps` loader batches of 8 random images a step, different each step.
    fn config(grad_accum_steps: usize) -> Config {
        let mut config = crate::config::presets::load_config("quickstart").unwrap();
        config.train.batch_size = 8;
        config.train.grad_accum_steps = grad_accum_steps;
        config.train.precision = Precision::F32;
        config
    }

    /// The weights every run of these tests starts from: drawn once, since the device's random
    /// generator, which `Trainer::new` seeds, is shared with the tests running beside these.
    fn initial_model() -> &'static Classifier {
        static MODEL: std::sync::OnceLock<Classifier> = std::sync::OnceLock::new();
        MODEL.get_or_init(|| {
            let device = burn::tensor::Device::flex().autodiff();
            Classifier::new(&config(1).model, 10, &device)
        })
    }

    /// Trains `steps` steps of `config` on flex with `replicas`, from [`initial_model`]; returns
    /// the weights.
    fn train(config: &Config, replicas: &[SelectedDevice], steps: usize) -> Vec<f32> {
        let main = SelectedDevice::on_cpu(CpuBackend::Flex);
        let classes: Vec<String> = (0..10).map(|c| c.to_string()).collect();
        let mut trainer = Trainer::new(config, Precision::F32, &main.device, classes, steps, steps);
        trainer.model = Some(initial_model().clone().fork(&trainer.ad_device));
        trainer.replicas = replicas.iter().map(|d| Replica::new(d, config.train.checkpointing)).collect();
        for step in 0..steps {
            let batches: Vec<Batch> = (0..config.train.grad_accum_steps)
                .map(|k| {
                    let mut c = config.clone();
                    c.seed = (100 * step + k) as u64;
                    crate::train::synthetic_batch(&c, 10)
                })
                .collect();
            let stats = trainer.step(&batches, false, &mut |_| {}).map_err(crate::Error::from).unwrap();
            assert!(stats.applied && stats.loss.is_finite(), "step {step}: {stats:?}");
        }
        weights(&trainer)
    }

    fn max_difference(a: &[f32], b: &[f32]) -> f32 {
        assert_eq!(a.len(), b.len());
        a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
    }

    /// Two devices, one micro-batch each, give the weights of one device accumulating the same
    /// two micro-batches, after 20 steps: exactly with the second device another flex (the copy
    /// and the transfers of every step), within 3e-5 with it ndarray (a transfer between
    /// backends, whose kernels round differently: 7.8e-6 measured).
    #[test]
    fn two_devices_train_as_one_device_accumulating_two_micro_batches() {
        let steps = 20;
        let one = train(&config(2), &[], steps);
        let untrained = train(&config(2), &[], 0);
        assert!(max_difference(&one, &untrained) > 1e-2, "the weights did not move");
        let flex = train(&config(2), &[SelectedDevice::on_cpu(CpuBackend::Flex)], steps);
        assert_eq!(max_difference(&one, &flex), 0.0, "flex + flex");
        let ndarray = train(&config(2), &[SelectedDevice::on_cpu(CpuBackend::Ndarray)], steps);
        // Between backends the kernels round differently (7.8e-6 here after 20 steps, where
        // flex + flex gives 0): the bound is the 1e-5 with room for another CPU's SIMD.
        assert!(max_difference(&one, &ndarray) <= 3e-5, "flex + ndarray: {}", max_difference(&one, &ndarray));
    }

    /// Four micro-batches a step on two devices (two each, summed in another order) and three
    /// on three devices give one device's weights within rounding.
    #[test]
    fn more_micro_batches_than_devices_are_shared_round_robin() {
        let steps = 10;
        let one = train(&config(4), &[], steps);
        let two = train(&config(4), &[SelectedDevice::on_cpu(CpuBackend::Flex)], steps);
        assert!(max_difference(&one, &two) <= 1e-5, "4 on 2: {}", max_difference(&one, &two));
        let one = train(&config(3), &[], steps);
        let cpu = [SelectedDevice::on_cpu(CpuBackend::Ndarray), SelectedDevice::on_cpu(CpuBackend::Flex)];
        let three = train(&config(3), &cpu, steps);
        assert!(max_difference(&one, &three) <= 1e-5, "3 on 3: {}", max_difference(&one, &three));
        assert_eq!(super::device_of(5, 3), 2);
        assert_eq!(super::device_of(6, 3), 0);
    }

    /// A replica whose reserved memory crosses `memory.cap_to_budget` fails the step as out of
    /// memory (the error the run retries at half the micro-batch), and the step is not applied:
    /// main flex (no pools, never over), replica the wgpu adapter under a 1 KiB cap.
    #[test]
    fn a_replica_over_the_memory_cap_fails_the_step_as_out_of_memory() {
        let gpu = crate::device::select(crate::device::DeviceChoice::Gpu(None)).unwrap();
        if !gpu.is_gpu() {
            assert!(std::env::var_os("VRAMFIT_REQUIRE_GPU").is_none(), "no wgpu adapter (lavapipe) to test on");
            eprintln!("SKIPPED a_replica_over_the_memory_cap_fails_the_step_as_out_of_memory: no wgpu adapter");
            return;
        }
        let config = config(2);
        let main = SelectedDevice::on_cpu(CpuBackend::Flex);
        let classes: Vec<String> = (0..10).map(|c| c.to_string()).collect();
        let mut trainer = Trainer::new(&config, Precision::F32, &main.device, classes, 1, 1);
        trainer.model = Some(initial_model().clone().fork(&trainer.ad_device));
        trainer.replicas = vec![Replica::new(&gpu, config.train.checkpointing)];
        trainer.memory_cap = Some(1024);
        let batches = vec![crate::train::synthetic_batch(&config, 10); 2];
        match trainer.step(&batches, false, &mut |_| {}) {
            Err(StepError::Device(message)) => assert!(message.starts_with("out of memory"), "{message}"),
            Err(StepError::Fatal(e)) => panic!("fatal: {e}"),
            Ok(stats) => panic!("the step ran: {stats:?}"),
        }
        assert_eq!(trainer.state.global_step, 0);
        assert_eq!(weights(&trainer), train(&config, &[], 0), "a failed step changed the weights");
    }
}
