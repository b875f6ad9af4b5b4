// Headless browser test of the egui app in a page (web/build.sh first): serves web/, opens
// app.html in Chromium with WebGPU (SwiftShader here), presses Train through the page's hook
// (window.vramfitApp.train, what the button does) with a step cap, and checks through
// window.vramfitApp.state() that steps and memory samples reached the app's plots, the loss fell,
// the run ended with an evaluation, dropped images get a top-5 and a text file an error naming
// it, Export (window.vramfitApp.export, the button in a page) downloads the four export files
// and native `vramfit eval` of the downloaded weights gives the app's top-1 (VRAMFIT_BIN, else
// target/release/vramfit; skipped without one unless WEB_TEST_REQUIRE_NATIVE is set), a folder
// of one's own images picked in the page's folder dialog (window.vramfitApp.chooseFolder, the
// dialog answered by the test) becomes the dataset (its classes, junk ignored) and trains 2
// steps, a preset
// picked afterwards survives a reload (local storage), and no console error or panic appeared.
// Usage: node web/app_test.mjs [steps] [screenshot.png, taken mid-training]; WEB_TEST_TIMEOUT_S bounds the wait (900).
import { chromium } from "playwright-core";
import { createServer } from "node:http";
import { readFile, mkdtemp, readdir, access, rm } from "node:fs/promises";
import { execFileSync } from "node:child_process";
import { tmpdir } from "node:os";
import { extname, join, dirname, basename } from "node:path";
import { fileURLToPath } from "node:url";
import { predictionInputs, classFolder } from "./test_images.mjs";

const root = dirname(fileURLToPath(import.meta.url));
const steps = Number(process.argv[2] || 10);
const screenshot = process.argv[3];
const types = { ".html": "text/html", ".js": "text/javascript", ".wasm": "application/wasm" };
const server = createServer(async (req, res) => {
  const path = join(root, decodeURIComponent(new URL(req.url, "http://x").pathname));
  try {
    const body = await readFile(path);
    res.writeHead(200, { "content-type": types[extname(path)] || "application/octet-stream" });
    res.end(body);
  } catch {
    res.writeHead(404);
    res.end();
  }
}).listen(0, "127.0.0.1");
await new Promise((ok) => server.on("listening", ok));

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: ["--enable-unsafe-webgpu", "--use-angle=swiftshader", "--no-sandbox"],
});
const failures = [];
const page = await browser.newPage({ viewport: { width: 1280, height: 820 } });
page.on("console", (m) => {
  console.log(`[page ${m.type()}] ${m.text()}`);
  if (m.type() === "error") failures.push(`console error: ${m.text()}`);
});
page.on("pageerror", (e) => failures.push(`page error: ${e.message}`));
const started = Date.now();
const deadline = started + Number(process.env.WEB_TEST_TIMEOUT_S || 900) * 1000;
const left = () => Math.max(1, deadline - Date.now());
const state = () => page.evaluate(() => window.vramfitApp.state());
let end = null;
let predictions = [];
const exportDir = await mkdtemp(join(tmpdir(), "vramfit-app-export-"));
const downloads = [];
page.on("download", (d) => downloads.push(d.saveAs(join(exportDir, d.suggestedFilename())).then(() => d.suggestedFilename())));
try {
  await page.goto(`http://127.0.0.1:${server.address().port}/app.html`);
  await page.waitForFunction(() => window.vramfitApp && (window.vramfitApp.started || window.vramfitApp.error), null, { timeout: left(), polling: 200 });
  const startError = await page.evaluate(() => window.vramfitApp.error);
  if (startError) throw new Error(`the app did not start: ${startError}`);
  const before = await state();
  console.log(`[app] started: ${JSON.stringify(before)}`);
  if (before.training || before.steps !== 0) failures.push(`a fresh app is training already: ${JSON.stringify(before)}`);
  if (!/WebGPU|webgpu|BrowserWebGpu|Gpu/i.test(before.device)) failures.push(`the app's device is not the page's adapter: ${before.device}`);
  await page.evaluate((n) => window.vramfitApp.train(n), steps);
  if (screenshot) {
    const half = Math.ceil(steps / 2);
    await page.waitForFunction((n) => { const s = window.vramfitApp.state(); return s.steps >= n || !s.training; }, half, { timeout: left(), polling: 200 });
    await page.screenshot({ path: screenshot });
  }
  await page.waitForFunction(() => !window.vramfitApp.state().training, null, { timeout: left(), polling: 500 });
  end = await state();
  // Dropped files: three bundled test images and a text file, as a browser's drop hands them to
  // the app (name and bytes); each image gets a top-5 from the model just trained, the text file
  // an error naming it.
  const inputs = await predictionInputs(3);
  for (const path of [...inputs.images, inputs.text]) {
    const bytes = [...(await readFile(path))];
    await page.evaluate(([name, b]) => window.vramfitApp.predict(name, new Uint8Array(b)), [basename(path), bytes]);
  }
  await page.waitForFunction(() => { const s = window.vramfitApp.state(); return s.predictions.length >= 4 && !s.predicting; }, null, { timeout: left(), polling: 200 });
  predictions = (await state()).predictions;
  // Export in a page: the model the run kept, as four downloads.
  await page.evaluate(() => window.vramfitApp.export());
  await page.waitForFunction(() => { const s = window.vramfitApp.state(); return /^downloading|failed/.test(s.status) || s.error; }, null, { timeout: left(), polling: 200 });
  const exported = await state();
  console.log(`[app export] ${exported.status}${exported.error ? ` / ${exported.error}` : ""}`);
  const until = Date.now() + 30000;
  while (downloads.length < 4 && Date.now() < until) await page.waitForTimeout(200);
  const saved = (await Promise.all(downloads)).sort();
  if (saved.join() !== "model.bpk,model.json,model.onnx,model.safetensors") failures.push(`export downloaded ${JSON.stringify(saved)}, not the four export files`);
  // A folder of one's own images through the page's folder dialog (Choose folder; the test
  // answers the dialog with a folder of two classes and OS junk): the scan takes the classes,
  // and 2 capped steps train on them on the page's adapter.
  const folder = await classFolder({ trousers: 1, bags: 8 }, 20);
  const chooser = page.waitForEvent("filechooser", { timeout: 30000 });
  await page.evaluate(() => window.vramfitApp.chooseFolder());
  await (await chooser).setFiles(folder);
  await page.waitForFunction(() => window.vramfitApp.state().dataset !== "bundled", null, { timeout: 30000, polling: 200 });
  const own = await state();
  console.log(`[app own folder] ${JSON.stringify({ dataset: own.dataset, classes: own.classes, train: own.train_images, val: own.val_images, error: own.data_error, status: own.status })}`);
  if (own.dataset !== "my-photos" || JSON.stringify(own.classes) !== '["bags","trousers"]' || own.train_images + own.val_images !== 40 || own.data_error) failures.push(`the picked folder is not the dataset: ${JSON.stringify(own)}`);
  await page.evaluate(() => window.vramfitApp.train(2));
  await page.waitForFunction(() => !window.vramfitApp.state().training, null, { timeout: left(), polling: 500 });
  const ownEnd = await state();
  console.log(`[app own folder] trained: ${ownEnd.status}, losses ${ownEnd.losses.map((l) => l.toFixed(3)).join(", ")}, top-1 ${ownEnd.val_accuracy} on ${ownEnd.eval_images}`);
  if (ownEnd.error || ownEnd.steps !== 2 || ownEnd.eval_images !== own.val_images) failures.push(`training on the picked folder: ${JSON.stringify(ownEnd)}`);
  // Settings persist in the browser's local storage: a preset picked now is the one a reload
  // opens with.
  const other = end.preset === "8gb" ? "4gb" : "8gb";
  await page.evaluate((p) => window.vramfitApp.selectPreset(p), other);
  await page.waitForTimeout(2500); // the app saves within a second of a change
  await page.reload();
  await page.waitForFunction(() => window.vramfitApp && (window.vramfitApp.started || window.vramfitApp.error), null, { timeout: left(), polling: 200 });
  const reloaded = await state();
  console.log(`[app] after a reload: preset ${reloaded.preset}, batch ${reloaded.batch_size}`);
  if (reloaded.preset !== other) failures.push(`the preset picked before the reload (${other}) did not persist: ${reloaded.preset}`);
} catch (e) {
  failures.push(`the app did not finish: ${e.message}`);
}
await browser.close();
server.close();

const seconds = ((Date.now() - started) / 1000).toFixed(1);
if (end) {
  console.log(`[app] ended: ${JSON.stringify({ ...end, losses: end.losses.map((l) => Number(l.toFixed(3))) })}`);
  if (end.error) failures.push(`the app shows an error: ${end.error}`);
  if (end.steps !== steps || end.losses.length !== steps) failures.push(`${end.steps} steps (${end.losses.length} losses) in the plots, ${steps} asked`);
  const mean = (xs) => xs.reduce((a, b) => a + b, 0) / xs.length;
  const k = Math.max(1, Math.floor(end.losses.length / 4));
  const first = mean(end.losses.slice(0, k)), last = mean(end.losses.slice(-k));
  if (!(last < first)) failures.push(`loss did not fall: first ${k} steps ${first}, last ${k} ${last}`);
  if (end.memory_points !== steps || !(end.reserved_mib > 0)) failures.push(`memory plot: ${end.memory_points} points, last reserved ${end.reserved_mib} MiB`);
  if (!(end.predicted_mib > 0)) failures.push("no predicted peak on the memory plot");
  // The plan holds in the page: its pools (exclusive pages, memory::PoolLayout) reserve at most
  // 5% above the predicted peak, and the plan is not more than 25% above what they reserve.
  else if (!(end.reserved_mib <= 1.05 * end.predicted_mib && end.predicted_mib <= 1.25 * end.reserved_mib)) failures.push(`the plan does not hold in the page: reserved ${end.reserved_mib} MiB, predicted ${end.predicted_mib} MiB`);
  if (!(end.val_accuracy >= 0 && end.val_accuracy <= 1)) failures.push(`no evaluation at the run's end: ${end.val_accuracy}`);
  if (!/^stopped at step/.test(end.status)) failures.push(`status after a capped run: ${end.status}`);
}
// The downloaded weights natively (the bundled data's test split, CPU): the app's images and
// top-1, within one borderline image (the CPU and the browser's GPU may round it differently).
const bin = process.env.VRAMFIT_BIN || join(root, "..", "target", "release", "vramfit");
const haveBin = await access(bin).then(() => true, () => false);
const files = await readdir(exportDir);
if (!haveBin && process.env.WEB_TEST_REQUIRE_NATIVE) failures.push(`no native binary at ${bin} (WEB_TEST_REQUIRE_NATIVE is set)`);
else if (!haveBin) console.log(`no native binary at ${bin}: the native comparison of the downloads is skipped`);
for (const weights of haveBin && end && files.includes("model.bpk") ? ["model.bpk", "model.safetensors"] : []) {
  try {
    const out = execFileSync(bin, ["eval", "--model", join(exportDir, weights), "--device", "cpu", "--csv", join(exportDir, "confusion.csv")], { encoding: "utf8" });
    console.log(`[native eval of the downloaded ${weights}] ${out.trim().split("\n")[0]}`);
    const [, images, top1] = /^(\d+) images on .*top-1 ([0-9.]+)%/m.exec(out) || [];
    const app = 100 * end.val_accuracy;
    if (Number(images) !== end.eval_images) failures.push(`native eval of ${weights}: ${images} images, the app's ${end.eval_images}`);
    if (!(Math.abs(Number(top1) - app) <= 100 / end.eval_images + 0.005)) failures.push(`native eval of the downloaded ${weights}: top-1 ${top1}%, the app's ${app.toFixed(2)}%`);
  } catch (e) {
    failures.push(`native eval of the downloaded ${weights} failed: ${e.message}`);
  }
}
await rm(exportDir, { recursive: true, force: true });
const byFile = Object.fromEntries(predictions.map((p) => [p.file, p]));
for (const name of ["test-0.png", "test-1.png", "test-2.png"]) {
  const p = byFile[name];
  if (!p || !p.top || p.top.length !== 5 || !(p.top[0].probability >= p.top[4].probability)) failures.push(`${name}: no top-5 from the app (${JSON.stringify(p)})`);
}
const text = byFile["notes.txt"];
console.log(`[app predict] ${predictions.map((p) => `${p.file}: ${p.top ? `${p.top[0].name} ${p.top[0].probability.toFixed(3)}` : p.error}`).join("; ")}`);
if (!text || !text.error || !text.error.includes("notes.txt")) failures.push(`a text file must give an error naming it, got ${JSON.stringify(text)}`);
if (failures.length) {
  console.error(`web app test FAILED after ${seconds} s:\n${failures.join("\n")}`);
  process.exit(1);
}
console.log(`web app test passed in ${seconds} s: ${steps} steps, loss ${end.losses[0].toFixed(3)} -> ${end.losses[end.losses.length - 1].toFixed(3)}, reserved ${end.reserved_mib.toFixed(1)} MiB (planned ${end.predicted_mib.toFixed(1)}), top-1 ${(end.val_accuracy * 100).toFixed(2)}% on the bundled test images`);
