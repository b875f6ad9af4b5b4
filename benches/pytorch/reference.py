"""PyTorch reference for vramfit's network, layer for layer.

Builds the same GroupNorm + depthwise-separable classifier as `src/model/mod.rs` from a vramfit
config (`configs/*.toml`), checks that its parameter count equals `vramfit info`'s, and measures
training images/s (AdamW, label smoothing, global-norm clipping, AMP when the config says f16 and
CUDA is present) and, on CUDA, `torch.cuda.max_memory_allocated`.

    python benches/pytorch/reference.py --config configs/quickstart.toml --steps 20 [--form channels_last]
    python benches/pytorch/compare.py            # both frameworks, ratio per row
"""
import argparse
import json
import time
import tomllib

import torch
import torch.nn as nn
import torch.nn.functional as F


def scaled_channels(channels, width, groups):
    c = round(channels * width)
    return max(-(-c // groups) * groups, groups)


def gn_groups(channels, wanted):
    g = max(1, min(wanted, channels))
    while channels % g:
        g -= 1
    return g


class ConvNormAct(nn.Module):
    def __init__(self, cin, cout, kernel, stride, groups, norm_groups, act):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, kernel, stride, kernel // 2, groups=groups, bias=False)
        self.norm = nn.GroupNorm(gn_groups(cout, norm_groups), cout)
        self.act = nn.GELU() if act == "gelu" else nn.ReLU()

    def forward(self, x):
        return self.act(self.norm(self.conv(x)))


class DsBlock(nn.Module):
    def __init__(self, cin, cout, stride, g, act):
        super().__init__()
        self.dw = ConvNormAct(cin, cin, 3, stride, cin, g, act)
        self.pw = ConvNormAct(cin, cout, 1, 1, 1, g, act)
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        y = self.pw(self.dw(x))
        return y + x if self.residual else y


class Classifier(nn.Module):
    """Same layers, names and shapes as vramfit's `Classifier`."""

    def __init__(self, model_cfg, num_classes):
        super().__init__()
        g, w, act = model_cfg["norm_groups"], model_cfg["width"], model_cfg["activation"]
        c = scaled_channels(model_cfg["stem_channels"], w, g)
        self.stem = ConvNormAct(3, c, 3, 2, 1, g, act)
        blocks = []
        for stage in model_cfg["stages"]:
            out = scaled_channels(stage["channels"], w, g)
            for j in range(stage["blocks"]):
                blocks.append(DsBlock(c, out, stage["stride"] if j == 0 else 1, g, act))
                c = out
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Linear(c, num_classes)
        nn.init.normal_(self.head.weight, std=model_cfg["head_init_std"])
        nn.init.zeros_(self.head.bias)

    def forward(self, x):
        return self.head(self.blocks(self.stem(x)).mean((2, 3)))


FORMS = ("eager", "channels_last", "compile")


def bench(config_path, steps, warmup, classes, device, form="eager"):
    """Training and inference images/s of the config's network in one of `FORMS`: eager NCHW,
    eager channels_last (model and input in `torch.channels_last`, as a performance-minded
    user runs a convnet) or `torch.compile` (inductor, NCHW)."""
    if form not in FORMS:
        raise ValueError(f"form {form!r}: one of {FORMS}")
    cfg = tomllib.load(open(config_path, "rb"))
    model = Classifier(cfg["model"], classes).to(device)
    t = cfg["train"]
    b, px = t["batch_size"], cfg["data"]["preprocess"]["crop_size"]
    opt = torch.optim.AdamW(model.parameters(), lr=cfg["optimizer"]["lr"], weight_decay=cfg["optimizer"]["weight_decay"])
    amp = t["precision"] == "f16" and device == "cuda"
    scaler = torch.amp.GradScaler(enabled=amp)
    x = torch.randn(b, 3, px, px, device=device)
    if form == "channels_last":
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    forward = torch.compile(model) if form == "compile" else model
    y = torch.arange(b, device=device) % classes
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()

    def step():
        with torch.autocast(device_type=device, dtype=torch.float16, enabled=amp):
            loss = F.cross_entropy(forward(x), y, label_smoothing=t["label_smoothing"])
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        if t["grad_clip_norm"] > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), t["grad_clip_norm"])
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        return loss.item()  # one host read per step, as vramfit does

    for _ in range(warmup):
        step()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    secs = time.perf_counter() - start

    # Inference on the same batch (eval mode, no grad). vramfit's `bench train` differs: it
    # uploads the batch and reads the logits back on every repeat and always runs f32, so on a
    # GPU its inference figure includes transfers that this one does not.
    model.eval()
    with torch.no_grad(), torch.autocast(device_type=device, dtype=torch.float16, enabled=amp):
        for _ in range(warmup):
            forward(x).float().sum().item()
        start = time.perf_counter()
        for _ in range(steps):
            forward(x).float().sum().item()
        infer_secs = time.perf_counter() - start
    return {
        "config": cfg.get("name", config_path),
        "framework": f"pytorch {torch.__version__} {form} ({device}, {torch.get_num_threads()} threads)",
        "form": form,
        "batch_size": b,
        "image_px": px,
        "params": sum(p.numel() for p in model.parameters()),
        "train_images_per_sec": b * steps / secs,
        "infer_images_per_sec": b * steps / infer_secs,
        "max_memory_allocated": torch.cuda.max_memory_allocated() if device == "cuda" else None,
    }


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="configs/quickstart.toml")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--form", default="eager", choices=FORMS)
    a = ap.parse_args()
    print(json.dumps(bench(a.config, a.steps, a.warmup, a.classes, a.device, a.form)))
