"""Runs vramfit's `bench train` and the PyTorch reference on the same configs, same machine,
same run, and prints images/s of both and the ratio vramfit / PyTorch per row.

    cargo build --release && python benches/pytorch/compare.py [--configs quickstart,8gb] [--backend flex]
    (on a GPU machine: benches/gpu/run.sh)

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


def mib(n):
    return "-" if n is None else f"{n / 2**20:.0f} MiB"


print("| config | batch | px | params | vramfit backend | PyTorch | train img/s vramfit / PyTorch | ratio | infer img/s vramfit / PyTorch | ratio | peak: vramfit measured / plan / PyTorch max_memory_allocated |")
print("|---|---|---|---|---|---|---|---|---|---|---|", flush=True)
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
        measured = json.load(open(f.name))
        if not measured:
            sys.exit(f"{name}: vramfit measured no row on backend {a.backend} (see `vramfit devices`)")
        v = measured[0]
        if v.get("error"):
            sys.exit(f"{name}: vramfit's row failed: {v['error']}")
    p = reference.bench(path, a.steps, 2, 10, a.device)
    plan = subprocess.run([a.vramfit, "plan", "--config", path], capture_output=True, text=True).stdout
    predicted = re.search(r"predicted peak[^0-9]*([0-9.]+ [KMG]iB)", plan)
    predicted = predicted.group(1) if predicted else "?"
    vt, pt, vi, pi = v["train_images_per_sec"], p["train_images_per_sec"], v["infer_images_per_sec"], p["infer_images_per_sec"]
    # Each row as soon as it is measured: a run cut short by a timeout keeps what it finished.
    print(f"| {name} | {v['batch_size']} | {v['image_px']} | {n} | {v['backend']} | {p['framework']} | {vt:.1f} / {pt:.1f} | {vt / pt:.2f} "
          f"| {vi:.1f} / {pi:.1f} | {vi / pi:.2f} | {mib(v['peak_bytes_in_use'])} / {predicted} / {mib(p['max_memory_allocated'])} |", flush=True)
