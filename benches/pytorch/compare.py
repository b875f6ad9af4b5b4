"""Runs vramfit's `bench train` and the PyTorch reference on the same configs, same machine,
same run, and prints images/s of both and the ratio vramfit / PyTorch per row.

    cargo build --release && python benches/pytorch/compare.py [--configs quickstart,8gb] [--backend flex]

The parameter counts of the two networks are compared first; a mismatch aborts.
"""
import argparse
import json
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import reference  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--configs", default="quickstart")
ap.add_argument("--backend", default="flex", help="vramfit backend: gpu, flex or ndarray")
ap.add_argument("--steps", type=int, default=10)
ap.add_argument("--vramfit", default="target/release/vramfit")
ap.add_argument("--device", default="cpu", help="PyTorch device: cpu or cuda")
a = ap.parse_args()

rows = []
for name in a.configs.split(","):
    path = f"configs/{name}.toml"
    info = subprocess.run([a.vramfit, "info", "--config", path], capture_output=True, text=True, check=True).stdout
    ours = int(re.search(r"parameters: (\d+)", info).group(1))
    theirs = reference.Classifier(reference.tomllib.load(open(path, "rb"))["model"], 10)
    n = sum(p.numel() for p in theirs.parameters())
    if n != ours:
        sys.exit(f"{name}: parameter counts differ: vramfit {ours}, pytorch {n}")
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        subprocess.run([a.vramfit, "bench", "train", "--config", path, "--backends", a.backend, "--steps", str(a.steps), "--json", f.name],
                       check=True, capture_output=True)
        v = json.load(open(f.name))[0]
    p = reference.bench(path, a.steps, 2, 10, a.device)
    rows.append((name, v["batch_size"], v["image_px"], n, v["backend"], v["train_images_per_sec"], p["framework"], p["train_images_per_sec"]))

print("| config | batch | px | params | vramfit backend | vramfit img/s | PyTorch | PyTorch img/s | ratio vramfit/PyTorch |")
print("|---|---|---|---|---|---|---|---|---|")
for name, b, px, n, vb, vi, pf, pi in rows:
    print(f"| {name} | {b} | {px} | {n} | {vb} | {vi:.1f} | {pf} | {pi:.1f} | {vi / pi:.2f} |")
