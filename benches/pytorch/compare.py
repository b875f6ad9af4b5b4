"""Runs vramfit's `bench train` and the PyTorch reference on the same configs, same machine,
same run, and prints images/s of both and the ratio of vramfit to the fastest PyTorch form per
row: eager NCHW, eager channels_last (`--forms`; add `compile` for torch.compile, which is
reported but not taken as the bar), in `--rounds` rounds whose order rotates (vramfit's
`bench train` in its own process, the PyTorch forms in this one), then each config's range over
the rounds.

    cargo build --release && python benches/pytorch/compare.py [--configs quickstart,12gb] [--backend flex] [--rounds 3]
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
ap.add_argument("--rounds", type=int, default=1)
ap.add_argument("--forms", default="eager,channels_last", help=f"PyTorch forms, comma-separated: {','.join(reference.FORMS)}")
ap.add_argument("--batch", type=int, default=0, help="train.batch_size for both (default: the config's)")
ap.add_argument("--vramfit", default="target/release/vramfit")
ap.add_argument("--device", default="cpu", help="PyTorch device: cpu or cuda")
a = ap.parse_args()
forms = a.forms.split(",")
if a.rounds < 1 or not set(forms) <= set(reference.FORMS):
    sys.exit(f"--rounds must be 1 or more and --forms among {','.join(reference.FORMS)}")


def mib(n):
    return "-" if n is None else f"{n / 2**20:.0f} MiB"


def vramfit_row(path):
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        subprocess.run([a.vramfit, "bench", "train", "--config", path, "--backends", a.backend, "--steps", str(a.steps), "--json", f.name],
                       check=True, capture_output=True)
        measured = json.load(open(f.name))
    if not measured:
        sys.exit(f"{path}: vramfit measured no row on backend {a.backend} (see `vramfit devices`)")
    if measured[0].get("error"):
        sys.exit(f"{path}: vramfit's row failed: {measured[0]['error']}")
    return measured[0]


configs = {}
scratch = tempfile.TemporaryDirectory()
for name in a.configs.split(","):
    path = f"configs/{name}.toml"
    if a.batch:
        # The same config with its batch size replaced, for both frameworks.
        text, n = re.subn(r"(?m)^batch_size\s*=\s*\d+", f"batch_size = {a.batch}", open(path).read())
        if n != 1:
            sys.exit(f"{path}: no single batch_size line to replace")
        path = f"{scratch.name}/{name}.toml"
        open(path, "w").write(text)
    configs[name] = path
    info = subprocess.run([a.vramfit, "info", "--config", path], capture_output=True, text=True, check=True).stdout
    ours = int(re.search(r"parameters: (\d+)", info).group(1))
    theirs = reference.Classifier(reference.tomllib.load(open(path, "rb"))["model"], 10)
    n = sum(p.numel() for p in theirs.parameters())
    if n != ours:
        sys.exit(f"{name}: parameter counts differ: vramfit {ours}, pytorch {n}")

form_cols = " | ".join(f"PyTorch {f}" for f in forms)
print(f"| config | round | batch x px | vramfit backend | train img/s: vramfit | {form_cols} | ratio to the fastest "
      f"| infer img/s: vramfit | {form_cols} | ratio to the fastest | peak: vramfit measured / plan / PyTorch max_memory_allocated |")
print("|---" * (9 + 2 * len(forms)) + "|", flush=True)
ratios = {}
for r in range(a.rounds):
    for name, path in configs.items():
        # Rotate who runs first each round, so a machine that speeds up or slows down over the
        # run favours no one position.
        order = ["vramfit", *forms]
        order = order[r % len(order):] + order[:r % len(order)]
        p = {}
        for who in order:
            if who == "vramfit":
                v = vramfit_row(path)
            else:
                p[who] = reference.bench(path, a.steps, 2, 10, a.device, who)
        p = {form: p[form] for form in forms}
        plan = subprocess.run([a.vramfit, "plan", "--config", path], capture_output=True, text=True).stdout
        predicted = re.search(r"predicted peak[^0-9]*([0-9.]+ [KMG]iB)", plan)
        predicted = predicted.group(1) if predicted else "?"
        vt, vi = v["train_images_per_sec"], v["infer_images_per_sec"]
        # The bar is the faster eager form; torch.compile is reported beside it.
        bar = [x for form, x in p.items() if form != "compile"] or list(p.values())
        bt = max(x["train_images_per_sec"] for x in bar)
        bi = max(x["infer_images_per_sec"] for x in bar)
        ratios.setdefault(name, []).append((vt / bt, vi / bi))
        pts = " | ".join(f"{x['train_images_per_sec']:.1f}" for x in p.values())
        pis = " | ".join(f"{x['infer_images_per_sec']:.1f}" for x in p.values())
        peak = max((x["max_memory_allocated"] or 0) for x in p.values()) or None
        # Each row as soon as it is measured: a run cut short by a timeout keeps what it finished.
        print(f"| {name} | {r + 1} | {v['batch_size']} x {v['image_px']} | {v['backend']} | {vt:.1f} | {pts} | {vt / bt:.2f} "
              f"| {vi:.1f} | {pis} | {vi / bi:.2f} | {mib(v['peak_bytes_in_use'])} / {predicted} / {mib(peak)} |", flush=True)
bar_forms = [f for f in forms if f != "compile"] or forms
print(f"\npytorch {reference.torch.__version__}, {a.rounds} round(s); ratio = vramfit / the faster of {', '.join(bar_forms)}")
for name, rs in ratios.items():
    t = [x[0] for x in rs]
    i = [x[1] for x in rs]
    print(f"{name}: training {min(t):.2f}-{max(t):.2f}, inference {min(i):.2f}-{max(i):.2f}")
