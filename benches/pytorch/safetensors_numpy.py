"""Reads a .safetensors file into numpy arrays (the format: an 8-byte little-endian header length,
a JSON header of name -> dtype, shape, byte offsets, then the raw little-endian data), so the
benches need no `safetensors` package for vramfit's f32 exports."""
import json
import struct

import numpy as np

DTYPES = {"F32": "<f4", "F16": "<f2", "F64": "<f8", "I64": "<i8", "I32": "<i4"}


def load_safetensors(path):
    """name -> numpy array of every tensor in `path` (the `__metadata__` entry is skipped)."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        start, end = entry["data_offsets"]
        out[name] = np.frombuffer(data[start:end], dtype=DTYPES[entry["dtype"]]).reshape(entry["shape"]).copy()
    return out
