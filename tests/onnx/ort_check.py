#!/usr/bin/env python3
"""Checks a vramfit model.onnx against `vramfit predict --json` on the same image files.

    python tests/onnx/ort_check.py --model EXPORT_DIR --predictions PREDICT.jsonl

1. `onnx.checker.check_model(full_check=True)` on EXPORT_DIR/model.onnx (with shape inference).
2. Runs ONNX Runtime (CPU) on every file named in PREDICT.jsonl (one JSON object per line, as
   `vramfit predict --json --top-k <classes>` prints: {"file": ..., "top": [{"index", "name",
   "probability"}, ...]}), preprocessing each image only as the model's metadata says: RGB,
   and for the f32 input (pixel / 255 - mean) / std; the u8 input takes the pixels as they are.
   The images must already have the model's input size (this checker does no resizing).
3. Prints one JSON line: images, top-1 agreement, the largest probability difference; exits 1
   when agreement is below --min-agreement or the difference above --max-diff.

Needs onnx, onnxruntime, numpy and pillow (`.ci/run` installs them into target/onnx-venv).
"""

import argparse
import json
import sys

import numpy as np
import onnx
import onnxruntime as ort
from PIL import Image


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="export folder holding model.onnx")
    ap.add_argument("--predictions", required=True, help="JSON lines from vramfit predict --json")
    ap.add_argument("--max-diff", type=float, default=1e-4)
    ap.add_argument("--min-agreement", type=float, default=1.0)
    args = ap.parse_args()

    path = f"{args.model}/model.onnx"
    onnx.checker.check_model(path, full_check=True)
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    meta = session.get_modelmeta().custom_metadata_map
    classes = json.loads(meta["class_names"])
    mean = np.array(json.loads(meta["mean"]), dtype=np.float32)
    std = np.array(json.loads(meta["std"]), dtype=np.float32)
    input_name = session.get_inputs()[0].name

    rows = [json.loads(line) for line in open(args.predictions) if line.strip()]
    if not rows:
        print(f"no predictions in {args.predictions}", file=sys.stderr)
        return 1
    pixels = np.stack([np.asarray(Image.open(r["file"]).convert("RGB"), dtype=np.uint8) for r in rows])  # [N, H, W, 3]
    if input_name == "image_u8":
        feed = pixels
    else:
        # The same order of operations as vramfit's loader: x / 255, - mean, / std.
        x = pixels.astype(np.float32) / np.float32(255.0)
        feed = np.ascontiguousarray(((x - mean) / std).transpose(0, 3, 1, 2))
    probs = np.concatenate(
        [session.run(["probabilities"], {input_name: feed[i : i + 256]})[0] for i in range(0, len(feed), 256)]
    )

    agree, max_diff = 0, 0.0
    for row, p in zip(rows, probs):
        theirs = np.zeros(len(classes), dtype=np.float64)
        for c in row["top"]:
            theirs[c["index"]] = c["probability"]
            assert classes[c["index"]] == c["name"], f"class {c['index']}: {classes[c['index']]!r} != {c['name']!r}"
        if len(row["top"]) != len(classes):
            print(f"{row['file']}: predict listed {len(row['top'])} of {len(classes)} classes; use --top-k {len(classes)}",
                  file=sys.stderr)
            return 1
        agree += int(np.argmax(theirs) == np.argmax(p))
        max_diff = max(max_diff, float(np.max(np.abs(theirs - p))))
    summary = {
        "model": path,
        "input": input_name,
        "images": len(rows),
        "top1_agreement": agree / len(rows),
        "max_probability_diff": max_diff,
        "opset": [o.version for o in onnx.load(path).opset_import],
    }
    print(json.dumps(summary))
    ok = summary["top1_agreement"] >= args.min_agreement and max_diff <= args.max_diff
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
