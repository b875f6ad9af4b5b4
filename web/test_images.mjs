// Test inputs the two browser tests share: bundled test images written as PNG files.
import { readFile, writeFile, mkdtemp, mkdir } from "node:fs/promises";
import { tmpdir } from "node:os";
import { gunzipSync, deflateSync } from "node:zlib";
import { join, dirname } from "node:path";
import { fileURLToPath } from "node:url";

const root = dirname(fileURLToPath(import.meta.url));

// An 8-bit greyscale PNG of `pixels` (row-major, width x height).
export function png(pixels, width, height) {
  const crc32 = (bytes) => {
    let crc = 0xffffffff;
    for (const b of bytes) {
      crc ^= b;
      for (let k = 0; k < 8; k++) crc = crc & 1 ? 0xedb88320 ^ (crc >>> 1) : crc >>> 1;
    }
    return (crc ^ 0xffffffff) >>> 0;
  };
  const chunk = (type, data) => {
    const body = Buffer.concat([Buffer.from(type, "ascii"), data]);
    const out = Buffer.alloc(body.length + 8);
    out.writeUInt32BE(data.length, 0);
    body.copy(out, 4);
    out.writeUInt32BE(crc32(body), body.length + 4);
    return out;
  };
  const header = Buffer.alloc(13);
  header.writeUInt32BE(width, 0);
  header.writeUInt32BE(height, 4);
  header.set([8, 0, 0, 0, 0], 8); // 8 bits, greyscale, deflate, no filter, no interlace
  const rows = [];
  for (let y = 0; y < height; y++) rows.push(Buffer.from([0]), pixels.subarray(y * width, (y + 1) * width));
  return Buffer.concat([
    Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]),
    chunk("IHDR", header),
    chunk("IDAT", deflateSync(Buffer.concat(rows))),
    chunk("IEND", Buffer.alloc(0)),
  ]);
}

// The first `n` bundled test images as PNG files in a new folder, and a text file beside them.
export async function predictionInputs(n) {
  const idx = gunzipSync(await readFile(join(root, "..", "assets", "fashion-mnist-subset", "t10k-images-idx3-ubyte.gz")));
  const [rows, cols] = [idx.readUInt32BE(8), idx.readUInt32BE(12)];
  const dir = await mkdtemp(join(tmpdir(), "vramfit-web-"));
  const images = [];
  for (let i = 0; i < n; i++) {
    const path = join(dir, `test-${i}.png`);
    await writeFile(path, png(idx.subarray(16 + i * rows * cols, 16 + (i + 1) * rows * cols), cols, rows));
    images.push(path);
  }
  const text = join(dir, "notes.txt");
  await writeFile(text, "not an image\n");
  return { images, text };
}

// A folder of one's own images in a new temporary folder: `perClass` bundled test images of
// each of `classes` (`{ name: label }`) as PNG files under `<name>/`, plus OS junk the scan must
// ignore. Returns the folder's path.
export async function classFolder(classes, perClass) {
  const dir = join(root, "..", "assets", "fashion-mnist-subset");
  const idx = gunzipSync(await readFile(join(dir, "t10k-images-idx3-ubyte.gz")));
  const labels = gunzipSync(await readFile(join(dir, "t10k-labels-idx1-ubyte.gz"))).subarray(8);
  const [rows, cols] = [idx.readUInt32BE(8), idx.readUInt32BE(12)];
  const out = join(await mkdtemp(join(tmpdir(), "vramfit-web-")), "my-photos");
  for (const [name, label] of Object.entries(classes)) {
    await mkdir(join(out, name), { recursive: true });
    let taken = 0;
    for (let i = 0; i < labels.length && taken < perClass; i++) {
      if (labels[i] !== label) continue;
      const image = png(idx.subarray(16 + i * rows * cols, 16 + (i + 1) * rows * cols), cols, rows);
      await writeFile(join(out, name, `${String(taken++).padStart(3, "0")}.png`), image);
    }
  }
  await writeFile(join(out, Object.keys(classes)[0], ".DS_Store"), "junk");
  return out;
}
