"""ONNX Runtime on vramfit's `model.onnx` against ONNX Runtime on PyTorch's own export of the
same network with the same weights, timed in one process, alternated.

    cargo build --release && python benches/pytorch/onnx_export.py [--configs quickstart,12gb]

For each config: `vramfit train --max-steps 1 --device cpu` makes a run (the bundled data) and
`vramfit export` writes its model.onnx and model.safetensors (PyTorch's names and layouts);
`reference.Classifier` loads those weights and `torch.onnx.export` (the TorchScript exporter,
opset 17, as the issue measured it: GroupNorm as Reshape + InstanceNormalization + Reshape +
affine) writes the peer file. Both files get the same random normalized batch; their logits
must agree within 1e-4 before anything is timed. Then `--rounds` rounds alternate the two
sessions (each timed over `--repeats` runs and at least `--seconds`), and the script prints images/s per round and the ratio
vramfit / PyTorch export per round, and its range.

Needs torch, onnx and onnxruntime (tests/onnx/requirements.txt has the versions the tests use).
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnx
import onnxruntime as ort
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference  # noqa: E402
from safetensors_numpy import load_safetensors  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--configs", default="quickstart,12gb")
ap.add_argument("--vramfit", default="target/release/vramfit")
ap.add_argument("--batch", type=int, default=32, help="images per session run")
ap.add_argument("--rounds", type=int, default=3)
ap.add_argument("--repeats", type=int, default=5, help="at least this many session runs per round and file")
ap.add_argument("--seconds", type=float, default=3.0, help="and at least this long")
ap.add_argument("--threads", type=int, default=2, help="ONNX Runtime intra-op threads")
ap.add_argument("--keep", help="folder to keep both .onnx files in (default: a temporary one)")
a = ap.parse_args()


def session(path):
    options = ort.SessionOptions()
    options.intra_op_num_threads = a.threads
    options.inter_op_num_threads = 1
    return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])


def images_per_sec(sess, feed, n):
    for _ in range(2):  # warm: ONNX Runtime's arena and thread pool
        sess.run(None, feed)
    runs, start = 0, time.perf_counter()
    while runs < a.repeats or time.perf_counter() - start < a.seconds:
        sess.run(None, feed)
        runs += 1
    return n * runs / (time.perf_counter() - start)


print(f"onnxruntime {ort.__version__}, torch {torch.__version__}, onnx {onnx.__version__}, {a.threads} threads")
print("| config | batch x px | round | vramfit model.onnx img/s | torch.onnx.export img/s | ratio |")
print("|---|---|---|---|---|---|", flush=True)
with tempfile.TemporaryDirectory() as tmp:
    out = a.keep or tmp
    os.makedirs(out, exist_ok=True)
    for name in a.configs.split(","):
        config = f"configs/{name}.toml"
        run = os.path.join(tmp, name)
        subprocess.run([a.vramfit, "train", "-c", config, "--max-steps", "1", "--device", "cpu", "--out", run],
                       check=True, capture_output=True)
        subprocess.run([a.vramfit, "export", "--run", run], check=True, capture_output=True)
        ours = os.path.join(run, "export", "model.onnx")
        weights = load_safetensors(os.path.join(run, "export", "model.safetensors"))
        cfg = reference.tomllib.load(open(config, "rb"))
        classes = weights["head.bias"].shape[0]
        model = reference.Classifier(cfg["model"], classes).eval()
        model.load_state_dict({k: torch.from_numpy(v) for k, v in weights.items()}, strict=True)
        px = cfg["data"]["preprocess"]["crop_size"]
        batch = a.batch
        x = np.random.default_rng(0).standard_normal((batch, 3, px, px), dtype=np.float32)
        theirs = os.path.join(out, f"{name}.torch.onnx")
        torch.onnx.export(model, torch.from_numpy(x), theirs, opset_version=17, dynamo=False,
                          input_names=["image"], output_names=["logits"],
                          dynamic_axes={"image": {0: "batch"}, "logits": {0: "batch"}})
        if a.keep:
            import shutil
            shutil.copy(ours, os.path.join(out, f"{name}.vramfit.onnx"))
        s_ours, s_theirs = session(ours), session(theirs)
        logits_ours = s_ours.run(["logits"], {"image": x})[0]
        logits_theirs = s_theirs.run(["logits"], {"image": x})[0]
        worst = float(np.abs(logits_ours - logits_theirs).max())
        if worst > 1e-4:
            sys.exit(f"{name}: the two files disagree: max |logit difference| {worst:.2e}")
        ratios = []
        for r in range(a.rounds):
            # Alternate which file runs first, so a warming or throttling machine favours neither.
            order = [("ours", s_ours), ("theirs", s_theirs)] if r % 2 == 0 else [("theirs", s_theirs), ("ours", s_ours)]
            measured = {who: images_per_sec(s, {"image": x}, batch) for who, s in order}
            ratios.append(measured["ours"] / measured["theirs"])
            print(f"| {name} | {batch} x {px} | {r + 1} | {measured['ours']:.1f} | {measured['theirs']:.1f} | {ratios[-1]:.2f} |",
                  flush=True)
        print(f"| {name} | {batch} x {px} | range | | | {min(ratios):.2f}-{max(ratios):.2f} (max logit diff {worst:.1e}) |",
              flush=True)
