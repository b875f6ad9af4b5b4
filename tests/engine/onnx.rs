//! The ONNX export against ONNX Runtime.

use super::*;

#[test]
fn onnx_export_matches_onnx_runtime_for_both_precisions_and_inputs() {
    use vramfit::export::onnx::OnnxInput;
    use vramfit::export::{ExportOptions, export_run_with};
    let Some(python) = onnx_python() else { return };
    let splits = bundled();
    let dir = tempfile::tempdir().unwrap();
    let images = bundled_test_pngs(&dir.path().join("images"), 1000);
    // Both precisions train on burn flex: 30 steps take seconds there, minutes on lavapipe.
    let device = device::select(DeviceChoice::Cpu(CpuBackend::Flex)).unwrap();
    for precision in [vramfit::config::Precision::F32, vramfit::config::Precision::F16] {
        let mut config = quickstart();
        config.train.epochs = 1;
        config.train.precision = precision;
        let run = dir.path().join(format!("run-{precision:?}"));
        let mut req = TrainRequest::new(config, &run);
        req.max_steps = Some(30);
        train::train(&req, &device, &splits, &mut |_| {}, &StopSignal::new()).unwrap();
        for onnx_input in [OnnxInput::F32Nchw, OnnxInput::U8Nhwc] {
            let export = dir.path().join(format!("export-{precision:?}-{onnx_input:?}"));
            export_run_with(&run, &export, &ExportOptions { onnx_input, ..Default::default() }).unwrap();
            let summary = ort_check(&python, &export, &images, &["--device", "cpu"]);
            assert_eq!(summary["images"], 1000);
            assert_eq!(summary["input"], onnx_input.input_name());
        }
    }
}
