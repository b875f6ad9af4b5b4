// Headless browser test of the web build (web/build.sh first): serves web/, opens the page in
// Chromium with WebGPU (SwiftShader here), trains quickstart a few steps and checks that the
// loss falls, memory readings arrive, the evaluation ran, and no console error or panic
// appeared. Needs Debian's chromium (or CHROMIUM=path) and `npm install --prefix web playwright-core`.
// With WEB_TEST_EXPORT_DIR set, the page's exported files are written there and, when the native
// binary is built (VRAMFIT_BIN, default target/release/vramfit), `vramfit eval` on them must give
// the browser's image count and top-1; WEB_TEST_REQUIRE_NATIVE=1 (.ci/run) makes a missing
// binary a failure instead of a skipped comparison.
// After training, the test picks three bundled test images (written as PNG files) and a text
// file through the page's file input: each image must get a top-3, the text file an error naming
// it; with the native binary, `vramfit predict` on the exported weights must give the same top-3
// classes with probabilities within 1e-4.
// Usage: node web/test.mjs [steps] [screenshot.png, taken mid-training]; WEB_TEST_TIMEOUT_S bounds the wait (1200).
import { chromium } from "playwright-core";
import { createServer } from "node:http";
import { readFile, writeFile, mkdir, access } from "node:fs/promises";
import { execFileSync } from "node:child_process";
import { extname, join, dirname, basename } from "node:path";
import { fileURLToPath } from "node:url";
import { predictionInputs } from "./test_images.mjs";

const root = dirname(fileURLToPath(import.meta.url));

// Whether two top-k lists (native `vramfit predict` on the CPU, the page on WebGPU) agree: each
// class in both has probabilities within 1e-4, and a class in only one is a near-tie at the
// list's end (within 1e-4 of the other list's last probability), as is a different top-1 (the
// two leaders within 1e-5 of each other); rounding may order near-equal classes differently.
function sameTop(a, b) {
  if (a.length !== b.length || !a.length) return false;
  const close = (x, y, tol) => Math.abs(x - y) <= tol;
  if (a[0].index !== b[0].index && !(close(a[0].probability, b[0].probability, 1e-5) && a.length > 1 && close(a[0].probability, a[1].probability, 1e-5))) return false;
  const inB = new Map(b.map((c) => [c.index, c.probability]));
  const inA = new Map(a.map((c) => [c.index, c.probability]));
  const lastA = a[a.length - 1].probability, lastB = b[b.length - 1].probability;
  return a.every((c) => (inB.has(c.index) ? close(c.probability, inB.get(c.index), 1e-4) : close(c.probability, lastB, 1e-4)))
    && b.every((c) => (inA.has(c.index) ? close(c.probability, inA.get(c.index), 1e-4) : close(c.probability, lastA, 1e-4)));
}

const steps = Number(process.argv[2] || 30);
const screenshot = process.argv[3];
const types = { ".html": "text/html", ".js": "text/javascript", ".wasm": "application/wasm" };
const server = createServer(async (req, res) => {
  const path = join(root, decodeURIComponent(new URL(req.url, "http://x").pathname).replace(/\/$/, "/index.html"));
  try {
    const body = await readFile(path);
    res.writeHead(200, { "content-type": types[extname(path)] || "application/octet-stream" });
    res.end(body);
  } catch {
    console.log(`[server] 404 ${req.url}`);
    res.writeHead(404);
    res.end();
  }
}).listen(0, "127.0.0.1");
await new Promise((ok) => server.on("listening", ok));
const url = `http://127.0.0.1:${server.address().port}/?autostart&steps=${steps}`;

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: ["--enable-unsafe-webgpu", "--use-angle=swiftshader", "--no-sandbox"],
});
const failures = [];
const page = await browser.newPage();
page.on("console", (m) => {
  console.log(`[page ${m.type()}] ${m.text()}`);
  if (m.type() === "error") failures.push(`console error: ${m.text()}`);
});
page.on("pageerror", (e) => failures.push(`page error: ${e.message}`));
const started = Date.now();
await page.goto(url);
try {
  const errored = new Promise((_, fail) => page.on("pageerror", (e) => fail(new Error(`page error: ${e.message}`))));
  errored.catch(() => {}); // a page error after the waits is in `failures` (the listener above)
  // One deadline for the whole run, the screenshot's wait included.
  const deadline = Date.now() + Number(process.env.WEB_TEST_TIMEOUT_S || 1200) * 1000;
  const left = () => Math.max(1, deadline - Date.now());
  if (screenshot) {
    // Mid-training: half the steps done (or the run over, if it failed before that).
    const half = Math.ceil(steps / 2);
    const midway = page.waitForFunction((n) => window.vramfit && (window.vramfit.steps.length >= n || window.vramfit.done), half, { timeout: left(), polling: 200 });
    await Promise.race([midway, errored]);
    await page.screenshot({ path: screenshot });
  }
  const done = page.waitForFunction(() => window.vramfit && window.vramfit.done, null, { timeout: left(), polling: 1000 });
  await Promise.race([done, errored]);
} catch (e) {
  console.error(`the page did not finish: ${e.message}; it shows: ${await page.evaluate(() => document.getElementById("status").textContent)}`);
  console.error(failures.join("\n"));
  await browser.close();
  process.exit(1);
}
const inputs = await predictionInputs(3);
const picked = [...inputs.images, inputs.text];
if (await page.evaluate(() => !window.vramfit.error)) {
  try {
    await page.setInputFiles("#predict-files", picked);
    await page.waitForFunction((n) => window.vramfit.predictions.length >= n, picked.length, { timeout: 120000, polling: 200 });
  } catch (e) {
    failures.push(`the page did not classify the picked files: ${e.message}`);
  }
}
const state = await page.evaluate(() => ({ ...window.vramfit, files: Object.keys(window.vramfit.files || {}) }));
const exportDir = process.env.WEB_TEST_EXPORT_DIR;
if (exportDir && state.files.length) {
  await mkdir(exportDir, { recursive: true });
  for (const name of state.files) {
    // Base64 through the page: a Uint8Array does not cross page.evaluate as bytes.
    const b64 = await page.evaluate((n) => {
      const bytes = window.vramfit.files[n];
      let s = "";
      for (let i = 0; i < bytes.length; i += 0x8000) s += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
      return btoa(s);
    }, name);
    await writeFile(join(exportDir, name), Buffer.from(b64, "base64"));
  }
}
await browser.close();
server.close();

const seconds = ((Date.now() - started) / 1000).toFixed(1);
if (state.error) failures.push(`training failed: ${state.error}`);
const losses = state.steps.map((s) => s.loss);
if (state.steps.length !== steps) failures.push(`${state.steps.length} steps reported, ${steps} asked`);
const mean = (xs) => xs.reduce((a, b) => a + b, 0) / xs.length;
const k = Math.max(1, Math.floor(losses.length / 4));
const first = mean(losses.slice(0, k)), last = mean(losses.slice(-k));
if (!(last < first)) failures.push(`loss did not fall: first ${k} steps ${first}, last ${k} ${last}`);
if (!state.steps.every((s) => s.reserved > 0 && s.inUse > 0)) failures.push("a step reported no device memory");
if (!state.result || !(state.result.eval_images > 0)) failures.push("no evaluation result");
// The plan the page showed before training: the adapter's limits as the browser reports them.
const plan = state.plan;
if (!plan || !(plan.adapter.max_storage_buffer_binding_size > 0) || plan.buffer_check !== "ok" || !(plan.predicted_peak_bytes > 0)) {
  failures.push(`no plan with the adapter's limits before training: ${JSON.stringify(plan)}`);
} else {
  const reserved = state.steps.slice(1).map((s) => s.reserved); // after the first step's pages went back
  console.log(`[plan] adapter ${plan.adapter.name} (${plan.adapter.backend}): max buffer ${plan.adapter.max_buffer_size}, max storage binding ${plan.adapter.max_storage_buffer_binding_size}; predicted peak ${(plan.predicted_peak_bytes / 2 ** 20).toFixed(1)} MiB, reserved after step 1: ${reserved.map((r) => (r / 2 ** 20).toFixed(1)).join(", ")} MiB`);
}
for (const name of ["model.bpk", "model.safetensors", "model.onnx", "model.json"]) {
  if (!state.files.includes(name)) failures.push(`the export has no ${name} (it has: ${state.files.join(", ")})`);
}
const byFile = Object.fromEntries(state.predictions.map((p) => [p.file, p]));
for (const path of inputs.images) {
  const name = basename(path);
  const p = byFile[name];
  if (!p || !p.top || p.top.length !== 3) failures.push(`${name}: no top-3 from the page (${JSON.stringify(p)})`);
}
const textResult = byFile["notes.txt"];
console.log(`[page predict] notes.txt: ${textResult && textResult.error}`);
if (!textResult || !textResult.error || !textResult.error.includes("notes.txt")) {
  failures.push(`a text file must give an error naming it, got ${JSON.stringify(textResult)}`);
}
if (exportDir && state.result) {
  const bin = process.env.VRAMFIT_BIN || join(root, "..", "target", "release", "vramfit");
  const haveBin = await access(bin).then(() => true, () => false);
  if (!haveBin && process.env.WEB_TEST_REQUIRE_NATIVE) failures.push(`no native binary at ${bin} (WEB_TEST_REQUIRE_NATIVE is set)`);
  else if (!haveBin) console.log(`no native binary at ${bin}: the native comparison is skipped`);
  // The same weights natively (the bundled data's test split, CPU): the browser's images and top-1.
  for (const weights of haveBin ? ["model.bpk", "model.safetensors"] : []) {
    try {
      const out = execFileSync(bin, ["eval", "--model", join(exportDir, weights), "--device", "cpu", "--csv", join(exportDir, "confusion.csv")], { encoding: "utf8" });
      console.log(`[native eval ${weights}] ${out.trim().split("\n")[0]}`);
      const [, images, top1] = /^(\d+) images on .*top-1 ([0-9.]+)%/m.exec(out) || [];
      const browser = 100 * state.result.top1;
      // The CPU and the browser's GPU may round one borderline image differently: one image's
      // worth, plus the 2-decimal rounding of the native output.
      const oneImage = 100 / state.result.eval_images;
      if (Number(images) !== state.result.eval_images) failures.push(`native eval of ${weights}: ${images} images, the browser's ${state.result.eval_images}`);
      if (!(Math.abs(Number(top1) - browser) <= oneImage + 0.005)) failures.push(`native eval of ${weights}: top-1 ${top1}%, the browser's ${browser.toFixed(2)}%`);
    } catch (e) {
      failures.push(`native eval of ${weights} failed: ${e.message}`);
    }
  }
  // The page's predictions against native `vramfit predict` on the downloaded weights.
  if (haveBin) {
    try {
      const out = execFileSync(bin, ["predict", ...inputs.images, "--model", exportDir, "--device", "cpu", "--json", "--top-k", "3"], { encoding: "utf8" });
      const lines = out.trim().split("\n");
      if (lines.length !== inputs.images.length) failures.push(`native predict gave ${lines.length} lines for ${inputs.images.length} images`);
      for (const line of lines) {
        const native = JSON.parse(line);
        const name = basename(native.file);
        const page = (byFile[name] || {}).top || [];
        const same = sameTop(native.top, page);
        console.log(`[native predict] ${name}: ${native.top.map((c) => `${c.name} ${c.probability.toFixed(6)}`).join(", ")}; page: ${page.map((c) => `${c.name} ${c.probability.toFixed(6)}`).join(", ")}`);
        if (!same) failures.push(`${name}: the page's top-3 differs from native vramfit predict's`);
      }
    } catch (e) {
      failures.push(`native predict failed: ${e.message}`);
    }
  }
}
console.log(JSON.stringify({ seconds, first_loss: first, last_loss: last, result: state.result }));
if (failures.length) {
  console.error(failures.join("\n"));
  process.exit(1);
}
console.log(`web test passed in ${seconds} s`);
