// The long-map page: one head's map browsed by zooming, from the server's tiles (api/http/routes/tiles.py).
"use strict";

const TILE = 256;
const VIEW = 1024; // canvas pixels
const $ = (id) => document.getElementById(id);
const VIRIDIS = [[68, 1, 84], [71, 45, 123], [59, 82, 139], [44, 114, 142], [33, 145, 140],
  [40, 174, 128], [94, 201, 98], [173, 220, 48], [253, 231, 37]];
const LUT = Array.from({ length: 256 }, (_, k) => {
  const x = (k / 255) * (VIRIDIS.length - 1);
  const i = Math.min(VIRIDIS.length - 2, Math.floor(x));
  const f = x - i;
  return VIRIDIS[i].map((c, j) => Math.round(c + f * (VIRIDIS[i + 1][j] - c)));
});
// The same colours as one 32-bit RGBA pixel each (little-endian, as every browser's typed arrays): one store a pixel.
const LUT32 = new Uint32Array(LUT.map(([r, g, b]) => ((255 << 24) | (b << 16) | (g << 8) | r) >>> 0));
// Saved head metrics shown beside the map when the run has them (`attnstore query NAME --run RUN --save`).
const SUMMARY = [
  ["attention_sink.position_0", "attention on the first token"],
  ["previous_token_heads.previous", "on the previous token"],
  ["streaming_heads.kept", "kept by 4 sinks + 64 recent keys"],
  ["heavy_hitters.mass_top10", "on its top 10 % of keys"],
];

const view = { run: null, example: 0, layer: 0, head: 0, length: 0, level: 0, x: 0, y: 0, tokens: [], generation: 0 };
const tiles = new Map(); // key -> ImageData
window.longMap = { view, lastDrawMs: null, draws: 0 };

function status(message, isError = false) {
  const box = $("status");
  box.textContent = message;
  box.classList.toggle("error", isError);
}

async function api(path, params = {}) {
  const url = new URL(path.replace(/^\//, ""), document.baseURI);
  for (const [k, v] of Object.entries(params)) url.searchParams.set(k, v);
  const response = await fetch(url);
  if (!response.ok) {
    let detail = response.statusText;
    try { detail = (await response.json()).detail || detail; } catch (_) { /* not JSON */ }
    throw new Error(`${response.status}: ${detail}`);
  }
  return response;
}

const runPath = (suffix) => `/api/runs/${encodeURIComponent(view.run)}${suffix}`;
const cellsPerPixel = () => 2 ** view.level;
const fitLevel = () => Math.max(0, Math.ceil(Math.log2(Math.max(1, view.length) / VIEW)));

function readHash() {
  const p = new URLSearchParams(location.hash.slice(1));
  if (p.has("run")) view.run = p.get("run");
  for (const k of ["example", "layer", "head", "level", "x", "y"]) if (p.has(k)) view[k] = parseInt(p.get(k), 10) || 0;
}

function writeHash() {
  const p = new URLSearchParams({ run: view.run, example: view.example, layer: view.layer, head: view.head,
    level: view.level, x: view.x, y: view.y });
  history.replaceState(null, "", `#${p}`);
}

async function tile(level, row, col) {
  const key = `${view.run}|${view.example}|${view.layer}|${view.head}|${level}|${row}|${col}`;
  if (tiles.has(key)) return tiles.get(key);
  const response = await api(runPath(`/examples/${view.example}/tile`), { layer: view.layer, head: view.head, level, row, col });
  const bytes = new Uint8Array(await response.arrayBuffer());
  const image = new ImageData(TILE, TILE);
  const pixels = new Uint32Array(image.data.buffer);
  for (let k = 0; k < bytes.length; k++) pixels[k] = LUT32[bytes[k]];
  tiles.set(key, image);
  if (tiles.size > 512) tiles.delete(tiles.keys().next().value);
  return image;
}

function clampView() {
  const span = VIEW * cellsPerPixel();
  view.x = Math.max(0, Math.min(view.x, Math.max(0, view.length - span)));
  view.y = Math.max(0, Math.min(view.y, Math.max(0, view.length - span)));
  view.x -= view.x % cellsPerPixel();
  view.y -= view.y % cellsPerPixel();
}

async function draw() {
  if (!view.run || !view.length) return;
  clampView();
  writeHash();
  const generation = ++view.generation;
  const canvas = $("long-canvas");
  canvas.dataset.state = "loading";
  const started = performance.now();
  const per = cellsPerPixel();
  const span = TILE * per; // cells per tile
  const rows = [], cols = [];
  for (let r = Math.floor(view.y / span); r * span < Math.min(view.length, view.y + VIEW * per); r++) rows.push(r);
  for (let c = Math.floor(view.x / span); c * span < Math.min(view.length, view.x + VIEW * per); c++) cols.push(c);
  const wanted = rows.flatMap((r) => cols.map((c) => [r, c]));
  const images = await Promise.all(wanted.map(([r, c]) => tile(view.level, r, c)));
  if (generation !== view.generation) return; // a newer draw started
  const ctx = canvas.getContext("2d");
  ctx.fillStyle = "#eee";
  ctx.fillRect(0, 0, VIEW, VIEW);
  wanted.forEach(([r, c], k) => {
    const px = (c * span - view.x) / per, py = (r * span - view.y) / per;
    const w = Math.min(TILE, Math.ceil((view.length - c * span) / per)), h = Math.min(TILE, Math.ceil((view.length - r * span) / per));
    ctx.putImageData(images[k], px, py, 0, 0, w, h);
  });
  window.longMap.lastDrawMs = performance.now() - started;
  window.longMap.draws += 1;
  canvas.dataset.state = "drawn";
  canvas.dataset.tiles = String(wanted.length);
  drawStrips();
  const last = Math.min(view.length, view.x + VIEW * per) - 1, lastRow = Math.min(view.length, view.y + VIEW * per) - 1;
  $("long-about").textContent = `example ${view.example}: ${view.length} tokens; layer ${view.layer}, head ${view.head}; ` +
    `rows ${view.y}-${lastRow} x keys ${view.x}-${last}; ${per} x ${per} cells a pixel (${wanted.length} tiles, ` +
    `${window.longMap.lastDrawMs.toFixed(0)} ms)`;
}

// The tokens beside the map, a label every 16 px: at one cell a pixel the tokens themselves, further out their positions.
function drawStrips() {
  const per = cellsPerPixel();
  for (const [id, first] of [["long-rows", view.y], ["long-cols", view.x]]) {
    const strip = $(id);
    strip.replaceChildren();
    const visible = Math.min(view.length - first, VIEW * per);
    const step = 16 * per;
    for (let i = first; i < first + visible; i += step) {
      const label = document.createElement("span");
      label.textContent = per === 1 && view.tokens[i] !== undefined ? view.tokens[i] : String(i);
      label.title = `token ${i}`;
      label.style[id === "long-rows" ? "top" : "left"] = `${(i - first) / per}px`;
      label.dataset.position = String(i);
      strip.append(label);
    }
  }
}

async function loadHeadSummary() {
  const box = $("long-head-summary");
  box.textContent = "";
  let saved = [];
  try {
    saved = (await (await api(runPath("/head_metrics"))).json()).metrics.filter((m) => m.source === "saved").map((m) => m.metric);
  } catch (_) { return; }
  const parts = [];
  for (const [metric, label] of SUMMARY) {
    if (!saved.includes(metric)) continue;
    const matrix = await (await api(runPath(`/head_metrics/${encodeURIComponent(metric)}`))).json();
    const value = matrix.values[view.layer] && matrix.values[view.layer][view.head];
    if (value !== null && value !== undefined) parts.push(`${label}: ${value.toFixed(3)}`);
  }
  box.textContent = parts.length
    ? `head ${view.layer}-${view.head}: ${parts.join("; ")}`
    : "no saved head metrics: `attnstore query attention_sink --run RUN --save` (and the other decoder queries) shows them here";
}

async function loadExample() {
  const detail = await (await api(runPath(`/examples/${view.example}`))).json();
  view.length = detail.example.length;
  view.tokens = detail.tokens.map((t) => t.token);
  tiles.clear();
}

async function select() {
  try {
    await loadExample();
    await draw();
    status("");
    loadHeadSummary().catch(() => {});
  } catch (error) {
    status(String(error.message || error), true);
    $("long-canvas").dataset.state = "error";
  }
}

function zoom(delta, cx = VIEW / 2, cy = VIEW / 2) {
  const before = cellsPerPixel();
  const level = Math.max(0, Math.min(fitLevel(), view.level + delta));
  if (level === view.level) return;
  const atX = view.x + cx * before, atY = view.y + cy * before; // the cell under the pointer stays under it
  view.level = level;
  view.x = Math.round(atX - cx * cellsPerPixel());
  view.y = Math.round(atY - cy * cellsPerPixel());
  draw().catch((e) => status(String(e.message || e), true));
}

async function init() {
  readHash();
  const runs = (await (await api("/api/runs")).json()).runs;
  const select_ = $("long-run");
  for (const r of runs) select_.append(new Option(r.run, r.run));
  view.run = view.run || (runs[0] && runs[0].run);
  select_.value = view.run;
  for (const k of ["example", "layer", "head"]) $(`long-${k}`).value = view[k];
  select_.addEventListener("change", () => { view.run = select_.value; view.level = 0; select(); });
  for (const k of ["example", "layer", "head"]) {
    $(`long-${k}`).addEventListener("change", (e) => { view[k] = parseInt(e.target.value, 10) || 0; tiles.clear(); select(); });
  }
  $("long-in").addEventListener("click", () => zoom(-1));
  $("long-out").addEventListener("click", () => zoom(1));
  $("long-fit").addEventListener("click", () => { view.level = fitLevel(); view.x = view.y = 0; draw(); });
  const canvas = $("long-canvas");
  canvas.addEventListener("wheel", (e) => {
    e.preventDefault();
    const box = canvas.getBoundingClientRect();
    zoom(e.deltaY > 0 ? 1 : -1, (e.clientX - box.left) * (VIEW / box.width), (e.clientY - box.top) * (VIEW / box.height));
  }, { passive: false });
  let drag = null;
  canvas.addEventListener("pointerdown", (e) => { drag = { x: e.clientX, y: e.clientY, vx: view.x, vy: view.y }; });
  window.addEventListener("pointerup", () => { drag = null; });
  canvas.addEventListener("pointermove", (e) => {
    if (!drag) return;
    view.x = drag.vx - Math.round((e.clientX - drag.x) * cellsPerPixel());
    view.y = drag.vy - Math.round((e.clientY - drag.y) * cellsPerPixel());
    draw();
  });
  if (view.run) await select();
}

init().catch((error) => status(String(error.message || error), true));
