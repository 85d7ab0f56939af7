/* attnstore viewer and API reference: plain JavaScript, no build step, nothing loaded from outside.
 *
 * The viewer (index.html) reads the JSON API of `attnstore serve` (api/serve.py):
 *   Example tab: the head view (token-to-token lines, SVG) and the matrix view (canvas) of one layer/head, and the
 *                model view (every layer and head as a grid of small heatmaps, from one .npy request; hover a head
 *                to see it large); a sentence typed in its text box is run through the run's model (POST
 *                .../scratch) and shown in the same views;
 *   Heads tab:   a layers x heads heatmap of a per-head metric (saved, or computed on request);
 *   Search tab:  tokens by word / token / POS / relation, with where they attend in a chosen head.
 * The state (run, example, layer, head, tab) lives in the URL's hash, so a view can be linked; each choice made in the
 * page is a history entry (pushState), and the view follows the URL on Back/Forward and on a pasted or edited link
 * (popstate, hashchange: followUrl), without reloading the page.
 * Runs are named in the hash and addressed by their numeric id in API paths: a run's name may hold "/"
 * (glue/MRPC-dev-..., ud/en_ewt-dev[sample=500,seed=0]-...), which a path segment cannot carry as it is.
 * docs.html renders /openapi.json as a reference with a form to try each GET endpoint.
 */
"use strict";

const $ = (id) => document.getElementById(id);
const SVG = "http://www.w3.org/2000/svg";
const HEAD_COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
  "#bcbd22", "#17becf", "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#3182bd"];
// viridis at 9 evenly spaced stops (matplotlib's colour map, as `attnstore view` draws).
const VIRIDIS = [[68, 1, 84], [71, 45, 123], [59, 82, 139], [44, 114, 142], [33, 145, 140],
  [40, 174, 128], [94, 201, 98], [173, 220, 48], [253, 231, 37]];

function viridis(t) {
  if (!Number.isFinite(t)) return [200, 200, 200];
  const x = Math.min(1, Math.max(0, t)) * (VIRIDIS.length - 1);
  const i = Math.min(VIRIDIS.length - 2, Math.floor(x));
  const f = x - i;
  return VIRIDIS[i].map((c, k) => Math.round(c + f * (VIRIDIS[i + 1][k] - c)));
}
const rgb = (c) => `rgb(${c[0]},${c[1]},${c[2]})`;

function el(tag, attrs = {}, ...children) {
  const node = tag.startsWith("svg:") ? document.createElementNS(SVG, tag.slice(4)) : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === null || v === undefined) continue;
    if (k === "text") node.textContent = v;
    else if (k === "class") node.setAttribute("class", v);
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c);
  return node;
}

function status(message, isError = false) {
  const s = $("status");
  s.textContent = message || "";
  s.classList.toggle("error", Boolean(isError));
}

const BUSY_RETRIES = 3; // a 503 "server busy" (every heavy-request slot taken) is retried after its Retry-After

async function api(path, params = {}, options = {}) {
  const url = new URL("api/" + path, document.baseURI);
  for (const [k, v] of Object.entries(params)) {
    if (v !== null && v !== undefined && v !== "") url.searchParams.set(k, v);
  }
  const { binary, ...init } = options; // binary: answer the body as an ArrayBuffer (a .npy file)
  options = { ...init, binary };
  let response = await fetch(url, init);
  for (let attempt = 1; response.status === 503 && response.headers.has("Retry-After") && attempt <= BUSY_RETRIES; attempt++) {
    const seconds = Math.min(30, Math.max(1, parseInt(response.headers.get("Retry-After"), 10) || 1));
    status(`server busy: retrying in ${seconds} s (${attempt} of ${BUSY_RETRIES})`);
    await new Promise((resolve) => setTimeout(resolve, seconds * 1000));
    response = await fetch(url, init);
  }
  if (options.binary && response.ok) return response.arrayBuffer();
  let body;
  try {
    body = await response.json();
  } catch (e) {
    body = { error: `${response.status} ${response.statusText}` };
  }
  if (!response.ok) {
    const error = new Error(body.error || `${response.status} ${response.statusText}`);
    error.status = response.status;
    throw error;
  }
  return body;
}

/* ------------------------------------------------------------------ state in the URL hash */

const DEFAULTS = { run: null, example: null, layer: 0, head: 0, tab: "example", metric: null, compare: null };
const state = { ...DEFAULTS };
let allRuns = []; // `/api/runs`: the runs a head can be matched in (same dataset and split)
let runInfo = null; // {id, name, n_layers, n_heads, ...}
const runIds = new Map(); // run name -> run id (`/api/runs`)

// The API path of the chosen run: by its id, whatever its name holds.
const runPath = (rest = "") => `runs/${runInfo ? runInfo.id : encodeURIComponent(runIds.get(state.run) ?? state.run)}${rest}`;

// The state the URL's hash names: what it leaves out takes its default (the run: the one shown, else the first).
function readHash() {
  const h = new URLSearchParams(location.hash.slice(1));
  const int = (k) => {
    const v = parseInt(h.get(k), 10);
    return Number.isNaN(v) ? DEFAULTS[k] : v;
  };
  Object.assign(state, { ...DEFAULTS, run: h.get("run") || state.run });
  if (h.has("example")) state.example = int("example");
  if (h.has("layer")) state.layer = int("layer");
  if (h.has("head")) state.head = h.get("head") === "all" ? "all" : int("head");
  if (h.has("tab")) state.tab = h.get("tab");
  if (h.has("metric")) state.metric = h.get("metric");
  if (h.has("compare")) state.compare = h.get("compare") || null;
}

let shownHash = null; // the hash the view shows: followUrl ignores an event that names it (popstate and hashchange both fire)

// The state into the URL's hash. push: a new history entry (a choice made in the page, so Back returns to the view
// before it); else the current entry is corrected (defaults filled in, a choice completed while loading).
function writeHash(push = false) {
  const h = new URLSearchParams();
  for (const k of ["run", "example", "layer", "head", "tab", "metric", "compare"]) {
    if (state[k] !== null && state[k] !== undefined && !Number.isNaN(state[k])) h.set(k, state[k]);
  }
  const hash = "#" + h.toString();
  if (hash !== location.hash) {
    if (push) history.pushState(null, "", hash);
    else history.replaceState(null, "", hash);
  }
  shownHash = location.hash;
}

// Back/Forward, or a link pasted or edited in the address bar: show what the URL names (the page is not reloaded).
async function followUrl() {
  if (location.hash === shownHash) return;
  shownHash = location.hash;
  const before = { ...state };
  readHash();
  if (!runIds.size) return; // the runs are still loading: loadRuns reads the state just set
  if (!runIds.has(state.run)) state.run = before.run;
  leaveTyped();
  if (state.run !== before.run || !runInfo) {
    $("run-select").value = state.run;
    await selectRun(state.run, true);
    return;
  }
  if (!(state.layer >= 0 && state.layer < runInfo.n_layers)) state.layer = 0;
  if (state.head !== "all" && !(state.head >= 0 && state.head < runInfo.n_heads)) state.head = 0;
  $("layer-select").value = String(state.layer);
  $("head-select").value = String(state.head);
  $("search-layer").value = String(state.layer);
  if (state.head !== "all") $("search-head").value = String(state.head);
  fillCompare(runInfo);
  if (state.metric !== before.metric) pickMetric();
  showTab(state.tab);
  if (state.example === null) await loadExamples(); // the first example of the list
  else await selectExample(state.example);
}

/* ------------------------------------------------------------------ runs and tabs */

async function loadRuns() {
  const { runs } = await api("runs");
  allRuns = runs;
  runIds.clear();
  for (const r of runs) runIds.set(r.run, r.run_id);
  const select = $("run-select");
  select.replaceChildren(...runs.map((r) => el("option", { value: r.run, text: `${r.run} (${r.model}, ${r.n_stored} ex.)` })));
  if (!runs.length) {
    status("this store has no runs yet: create one with `attnstore ingest`", true);
    return;
  }
  if (!runs.some((r) => r.run === state.run)) state.run = runs[0].run;
  select.value = state.run;
  await selectRun(state.run, true);
}

async function selectRun(name, keepPosition = false, push = false) {
  state.run = name;
  runInfo = null;
  if (!keepPosition) Object.assign(state, { example: null, layer: 0, head: 0, metric: null });
  writeHash(push);
  const { run } = await api(runPath());
  runInfo = run;
  $("run-about").textContent = `${run.model} on ${run.dataset}:${run.split}, ${run.n_layers} layers x ${run.n_heads} heads, ${run.n_stored} examples (${run.status})`;
  if (!(state.layer >= 0 && state.layer < run.n_layers)) state.layer = 0;
  if (state.head !== "all" && !(state.head >= 0 && state.head < run.n_heads)) state.head = 0;
  fillIndexSelect($("layer-select"), run.n_layers, "L");
  fillIndexSelect($("head-select"), run.n_heads, "H", true);
  fillIndexSelect($("search-layer"), run.n_layers, "L");
  fillIndexSelect($("search-head"), run.n_heads, "H");
  $("layer-select").value = String(state.layer);
  $("head-select").value = String(state.head);
  $("search-layer").value = String(state.layer);
  $("search-head").value = String(state.head === "all" ? 0 : state.head);
  fillCompare(run);
  mapsCache.clear();
  exampleCache.clear();
  fullCache.clear();
  leaveTyped();
  examplesPage.offset = 0;
  metricsLoaded = false;
  facetsLoaded = false;
  await loadExamples();
  showTab(state.tab);
}

// The other runs over the same examples (same dataset and split): a head of this run is shown beside its match there.
function fillCompare(run) {
  const others = allRuns.filter((r) => r.run !== run.name && r.dataset === run.dataset && r.split === run.split);
  $("compare-select").replaceChildren(
    el("option", { value: "", text: others.length ? "(no other run)" : "(no other run over these examples)" }),
    ...others.map((r) => el("option", { value: r.run, text: `${r.run} (${r.model})` })),
  );
  if (!others.some((r) => r.run === state.compare)) state.compare = null;
  $("compare-select").value = state.compare ?? "";
}

function fillIndexSelect(select, n, prefix, withAll = false) {
  const options = [];
  for (let i = 0; i < n; i++) options.push(el("option", { value: String(i), text: `${prefix}${i}` }));
  if (withAll) options.push(el("option", { value: "all", text: "all" }));
  select.replaceChildren(...options);
}

function showTab(tab, push = false) {
  if (!["example", "heads", "search"].includes(tab)) tab = "example";
  state.tab = tab;
  for (const name of ["example", "heads", "search"]) {
    $(`view-${name}`).hidden = name !== tab;
    $(`tab-${name}`).classList.toggle("active", name === tab);
  }
  writeHash(push);
  if (tab === "heads") loadMetrics().catch(showError);
  if (tab === "search") loadFacets().catch(showError);
}

function showError(error) {
  status(error.message || String(error), true);
}

/* ------------------------------------------------------------------ Example tab: the list */

const examplesPage = { offset: 0, limit: 25, total: 0, q: "" };

async function loadExamples() {
  const page = await api(runPath("/examples"), {
    offset: examplesPage.offset, limit: examplesPage.limit, q: examplesPage.q, skipped: false,
  });
  examplesPage.total = page.total;
  const list = $("examples");
  list.replaceChildren(...page.items.map((item) => {
    const text = item.text_a + (item.text_b ? " ‖ " + item.text_b : "");
    const li = el("li", { "data-example": item.example, title: text, onclick: () => selectExample(item.example, true) },
      el("span", { class: "pos", text: `#${item.example}` }), text.length > 110 ? text.slice(0, 110) + "…" : text);
    if (item.example === state.example) li.classList.add("selected");
    return li;
  }));
  const last = Math.min(page.total, examplesPage.offset + page.items.length);
  $("examples-page").textContent = page.total ? `${examplesPage.offset + 1}–${last} of ${page.total}` : "no examples";
  $("examples-prev").disabled = examplesPage.offset === 0;
  $("examples-next").disabled = last >= page.total;
  if (state.example === null && page.items.length) state.example = page.items[0].example;
  if (state.example !== null) await selectExample(state.example);
}

/* ------------------------------------------------------------------ Example tab: tokens and maps */

const exampleCache = new Map(); // example -> {example, tokens}
const mapsCache = new Map(); // "example|layer[|head]" -> {heads: [..], attention: heads x L x L}
let drawToken = 0;

async function getExample(example) {
  if (!exampleCache.has(example)) {
    exampleCache.set(example, await api(runPath(`/examples/${example}`)));
  }
  return exampleCache.get(example);
}

async function getMaps(example, layer, head) {
  const key = `${example}|${layer}`;
  if (mapsCache.has(key)) return mapsCache.get(key);
  if (mapsCache.has(`${key}|${head}`)) return mapsCache.get(`${key}|${head}`);
  const path = runPath(`/examples/${example}/attention`);
  let maps;
  try {
    const body = await api(path, { layer, digits: 4 });
    maps = { heads: body.heads, attention: body.attention[0] };
    mapsCache.set(key, maps);
  } catch (error) {
    if (error.status !== 413 || head === "all") throw error; // a long example: one head at a time
    const body = await api(path, { layer, head, digits: 4 });
    maps = { heads: body.heads, attention: body.attention[0] };
    mapsCache.set(`${key}|${head}`, maps);
  }
  if (mapsCache.size > 24) mapsCache.delete(mapsCache.keys().next().value);
  return maps;
}

async function selectExample(example, push = false) {
  state.example = example;
  leaveTyped();
  for (const li of $("examples").children) li.classList.toggle("selected", Number(li.dataset.example) === example);
  writeHash(push);
  await drawExample();
}

async function drawExample() {
  if (!typed && (state.example === null || !state.run)) return;
  const token = ++drawToken;
  $("headview").dataset.state = "loading";
  $("matrix").dataset.state = "loading";
  try {
    const detail = typed ? typedDetail() : await getExample(state.example);
    const maps = typed ? layerMaps(typed.full, state.layer) : await getMaps(state.example, state.layer, state.head);
    if (token !== drawToken) return; // a newer choice was made meanwhile
    const row = detail.example;
    const label = typed ? "typed" : `#${row.example}`;
    $("example-text").replaceChildren(
      el("p", {}, el("span", { class: "seg", text: `${label} A` }), row.text_a || ""),
      ...(row.text_b ? [el("p", {}, el("span", { class: "seg", text: "B" }), row.text_b)] : []),
      el("p", { class: "muted", text: `${detail.tokens.length} tokens` + (row.label !== null ? `, label ${row.label}` : "") + (row.truncated ? ", truncated" : "") }),
    );
    const tokens = detail.tokens.map((t) => t.token);
    const special = detail.tokens.map((t) => Boolean(t.is_special));
    const heads = state.head === "all" ? maps.heads : [state.head];
    const missing = heads.filter((h) => !maps.heads.includes(h));
    if (missing.length) throw new Error("this example is too long to show every head at once: pick one head");
    const key = `${state.run}|${typed ? "typed" : state.example}|${state.layer}|${state.head}`;
    drawHeadView(tokens, special, maps, heads, key);
    drawMatrix(tokens, special, maps, heads, key);
    status(typed
      ? `typed sentence, layer ${state.layer}, ${state.head === "all" ? "every head" : "head " + state.head} (not stored${typed.body.saved ? "; saved as run " + typed.body.saved.run : ""})`
      : `example ${state.example}, layer ${state.layer}, ${state.head === "all" ? "every head" : "head " + state.head}`);
    await drawModelView(token, tokens, special);
    if (typed) {
      $("match").hidden = true;
      $("match").dataset.state = "empty";
    } else await drawMatch(token);
  } catch (error) {
    if (token === drawToken) {
      $("headview").dataset.state = "error";
      $("matrix").dataset.state = "error";
      showError(error);
    }
  }
}

/* ------------------------------------------------------------------ every map of an example: .npy, the model view */

const fullCache = new Map(); // example -> {shape: [layers, heads, L, L], data: Float32Array}
let HALF = null; // float16 bits -> value, for .npy answers of float16 runs

function halfTable() {
  if (HALF) return HALF;
  HALF = new Float32Array(65536);
  for (let i = 0; i < 65536; i++) {
    const sign = i & 0x8000 ? -1 : 1, e = (i >> 10) & 31, f = i & 1023;
    HALF[i] = e === 0 ? sign * 2 ** -14 * (f / 1024) : e === 31 ? (f ? NaN : sign * Infinity) : sign * 2 ** (e - 15) * (1 + f / 1024);
  }
  return HALF;
}

// numpy's .npy file (what the maps endpoint answers with format=npy) -> {shape, data: Float32Array, dtype}.
function parseNpy(buffer) {
  const bytes = new Uint8Array(buffer);
  if (bytes[0] !== 0x93 || String.fromCharCode(...bytes.subarray(1, 6)) !== "NUMPY") throw new Error("the answer is not a .npy file");
  const view = new DataView(buffer);
  const start = bytes[6] === 1 ? 10 : 12;
  const length = bytes[6] === 1 ? view.getUint16(8, true) : view.getUint32(8, true);
  const header = new TextDecoder("latin1").decode(bytes.subarray(start, start + length));
  const descr = /'descr':\s*'([^']+)'/.exec(header)[1];
  if (/'fortran_order':\s*True/.test(header)) throw new Error("a Fortran-ordered .npy answer is not expected");
  const shape = /'shape':\s*\(([^)]*)\)/.exec(header)[1].split(",").map((x) => x.trim()).filter(Boolean).map(Number);
  const count = shape.reduce((a, b) => a * b, 1);
  const offset = start + length;
  let data;
  if (descr === "<f2") {
    const raw = new Uint16Array(buffer.slice(offset, offset + 2 * count));
    const table = halfTable();
    data = new Float32Array(count);
    for (let i = 0; i < count; i++) data[i] = table[raw[i]];
  } else if (descr === "<f4") data = new Float32Array(buffer.slice(offset, offset + 4 * count));
  else if (descr === "<f8") data = Float32Array.from(new Float64Array(buffer.slice(offset, offset + 8 * count)));
  else throw new Error(`unexpected dtype ${descr} in a .npy answer`);
  return { shape, data, dtype: descr };
}

function base64Buffer(text) {
  const binary = atob(text);
  const bytes = new Uint8Array(binary.length);
  for (let i = 0; i < binary.length; i++) bytes[i] = binary.charCodeAt(i);
  return bytes.buffer;
}

// One head's map as rows (views into the array): a[i][j] as the JSON maps.
function headOf(full, layer, head) {
  const [, nh, n] = full.shape;
  const base = (layer * nh + head) * n * n;
  const rows = [];
  for (let i = 0; i < n; i++) rows.push(full.data.subarray(base + i * n, base + (i + 1) * n));
  return rows;
}

function layerMaps(full, layer) {
  const heads = [...Array(full.shape[1]).keys()];
  return { heads, attention: heads.map((h) => headOf(full, layer, h)) };
}

// Every map of a stored example in one request (.npy); one request per layer when the whole is over the server's cell budget.
async function getFull(example) {
  if (fullCache.has(example)) return fullCache.get(example);
  const path = runPath(`/examples/${example}/attention`);
  let full;
  try {
    full = parseNpy(await api(path, { format: "npy" }, { binary: true }));
  } catch (error) {
    if (error.status !== 413) throw error;
    const parts = [];
    for (let layer = 0; layer < runInfo.n_layers; layer++) parts.push(parseNpy(await api(path, { format: "npy", layer }, { binary: true })));
    const [, nh, n] = parts[0].shape;
    const data = new Float32Array(parts.length * nh * n * n);
    parts.forEach((p, l) => data.set(p.data, l * nh * n * n));
    full = { shape: [parts.length, nh, n, n], data, dtype: parts[0].dtype, requests: parts.length };
  }
  fullCache.set(example, full);
  if (fullCache.size > 8) fullCache.delete(fullCache.keys().next().value);
  return full;
}

let VIRIDIS_LUT = null; // 256 colours, value k/255

function viridisLut() {
  if (!VIRIDIS_LUT) VIRIDIS_LUT = Array.from({ length: 256 }, (_, k) => viridis(k / 255));
  return VIRIDIS_LUT;
}

async function drawModelView(token, tokens, special) {
  const fig = $("modelview");
  fig.dataset.state = "loading";
  let full;
  const started = performance.now();
  try {
    full = typed ? typed.full : await getFull(state.example);
  } catch (error) {
    if (token === drawToken) {
      fig.dataset.state = "error";
      $("modelview-caption").textContent = `(${error.message})`;
    }
    return;
  }
  if (token !== drawToken) return;
  const [nl, nh, n] = full.shape;
  const gap = 4, left = 30, top = 18;
  const cell = Math.max(24, Math.min(72, Math.floor(760 / nh) - gap));
  const width = left + nh * (cell + gap), height = top + nl * (cell + gap);
  const canvas = $("modelview-canvas");
  const ratio = window.devicePixelRatio || 1;
  canvas.width = Math.ceil(width * ratio);
  canvas.height = Math.ceil(height * ratio);
  canvas.style.width = `${width}px`;
  canvas.style.height = `${height}px`;
  const ctx = canvas.getContext("2d");
  ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
  ctx.fillStyle = "#fff";
  ctx.fillRect(0, 0, width, height);
  ctx.font = "11px DejaVu Sans, sans-serif";
  ctx.fillStyle = "#667085";
  ctx.textBaseline = "middle";
  ctx.textAlign = "center";
  for (let h = 0; h < nh; h++) ctx.fillText(`H${h}`, left + h * (cell + gap) + cell / 2, top / 2);
  ctx.textAlign = "right";
  for (let l = 0; l < nl; l++) ctx.fillText(`L${l}`, left - 6, top + l * (cell + gap) + cell / 2);
  // each map at its own pixel size, scaled into its cell without smoothing
  const tile = document.createElement("canvas");
  tile.width = n;
  tile.height = n;
  const tctx = tile.getContext("2d");
  const image = tctx.createImageData(n, n);
  const lut = viridisLut();
  ctx.imageSmoothingEnabled = false;
  for (let l = 0; l < nl; l++) {
    for (let h = 0; h < nh; h++) {
      const base = (l * nh + h) * n * n;
      for (let k = 0; k < n * n; k++) {
        const v = full.data[base + k];
        const c = lut[Number.isFinite(v) ? Math.round(Math.min(1, Math.max(0, v)) * 255) : 0];
        image.data[4 * k] = c[0];
        image.data[4 * k + 1] = c[1];
        image.data[4 * k + 2] = c[2];
        image.data[4 * k + 3] = 255;
      }
      tctx.putImageData(image, 0, 0);
      ctx.drawImage(tile, left + h * (cell + gap), top + l * (cell + gap), cell, cell);
    }
  }
  const key = `${state.run}|${typed ? "typed" : state.example}`;
  const shown = { l: -1, h: -1 };
  const zoom = (l, h) => {
    if (l === shown.l && h === shown.h) return;
    Object.assign(shown, { l, h });
    fig.dataset.hover = `${l},${h}`;
    Object.assign($("modelview-mark").style, { left: `${left + h * (cell + gap) - 2}px`, top: `${top + l * (cell + gap) - 2}px`,
      width: `${cell + 4}px`, height: `${cell + 4}px` });
    $("modelview-mark").hidden = false;
    paintMatrix("zoom", tokens, special, headOf(full, l, h), `(layer ${l}, head ${h})`, `${key}|${l}|${h}`);
  };
  const headAt = (event) => {
    const box = canvas.getBoundingClientRect();
    const x = event.clientX - box.left - left, y = event.clientY - box.top - top;
    const h = Math.floor(x / (cell + gap)), l = Math.floor(y / (cell + gap));
    const inside = x >= 0 && y >= 0 && h < nh && l < nl && x - h * (cell + gap) < cell && y - l * (cell + gap) < cell;
    return inside ? [l, h] : null;
  };
  canvas.onmousemove = (event) => {
    const at = headAt(event);
    if (at) zoom(...at);
  };
  canvas.onclick = (event) => {
    const at = headAt(event);
    if (!at) return;
    [state.layer, state.head] = at;
    $("layer-select").value = String(state.layer);
    $("head-select").value = String(state.head);
    writeHash(true);
    drawExample();
  };
  zoom(state.layer, state.head === "all" ? 0 : state.head);
  const ms = performance.now() - started;
  $("modelview-caption").textContent = `(${nl} layers x ${nh} heads of ${typed ? "the typed sentence" : "example " + state.example}` +
    `${full.requests ? `, read in ${full.requests} requests` : ""}; rows layers, columns heads, 0-based; hover a head to see it large, click it to pick it)`;
  Object.assign(fig.dataset, { key, layers: String(nl), heads: String(nh), tokens: String(n), cell: String(cell), gap: String(gap),
    left: String(left), top: String(top), ms: ms.toFixed(1), state: "ready" });
}

/* ------------------------------------------------------------------ a typed sentence (POST .../scratch) */

let typed = null; // {body, full}: the typed sentence shown instead of a stored example

function typedDetail() {
  const b = typed.body;
  return { example: { example: null, text_a: b.text, text_b: b.text_b, label: null, truncated: b.truncated }, tokens: b.tokens };
}

function leaveTyped() {
  if (!typed) return;
  typed = null;
  $("typed-back").hidden = true;
  $("typed-form").dataset.state = "empty";
  $("typed-about").textContent = "";
}

async function runTyped() {
  const text = $("typed-text").value, textB = $("typed-text-b").value;
  const form = $("typed-form");
  if (!text.trim()) {
    status("type a sentence first", true);
    return;
  }
  form.dataset.state = "loading";
  status("running the run's model on the typed sentence… (a server's first one loads the model: seconds)");
  const started = performance.now();
  try {
    const body = await api(runPath("/scratch"), {}, {
      method: "POST", headers: { "content-type": "application/json" },
      body: JSON.stringify({ text, text_b: textB.trim() ? textB : null, maps: "npy", save: $("typed-save").checked }),
    });
    const full = parseNpy(base64Buffer(body.attention_npy));
    const ms = performance.now() - started;
    typed = { body, full };
    for (const li of $("examples").children) li.classList.remove("selected");
    $("typed-back").hidden = state.example === null;
    $("typed-about").textContent = `${body.length} tokens through ${body.model} in ${Math.round(ms)} ms` +
      (body.truncated ? `, cut to ${body.length} of ${body.full_length}` : "") +
      (body.weights_match === false ? "; these weights differ from the run's" : "") +
      (body.saved ? `; saved as run ${body.saved.run}` : "; not stored");
    Object.assign(form.dataset, { state: "ready", ms: ms.toFixed(1), tokens: String(body.length), saved: body.saved ? body.saved.run : "" });
    await drawExample();
  } catch (error) {
    form.dataset.state = "error";
    $("typed-about").textContent = error.message;
    showError(error);
  }
}

// Whether this server runs models on typed text (GET /api/info), and may save it as a run.
async function setupTyped() {
  const info = await api("info");
  const scratch = info.scratch || { available: false, why: "this server does not run models on typed text" };
  $("typed-save-label").hidden = info.read_only || !scratch.available;
  for (const id of ["typed-text", "typed-text-b", "typed-go"]) $(id).disabled = !scratch.available;
  $("typed-form").dataset.available = String(scratch.available);
  if (!scratch.available) $("typed-about").textContent = `typing a sentence is not available: ${scratch.why}`;
  else $("typed-text").title = `at most ${scratch.max_tokens} tokens`;
}

/* ------------------------------------------------------------------ the matched head in another run (head_match) */

const matchCache = new Map(); // "run|other" -> Map "layer,head" -> its head_match row

async function getMatches(other, scan = false) {
  const key = `${state.run}|${other}`;
  if (!matchCache.has(key)) {
    const body = await api(runPath("/queries/head_match"), { other, scan: scan ? 1 : null });
    const rows = new Map();
    for (const r of body.rows) {
      const row = Object.fromEntries(body.columns.map((c, k) => [c, r[k]]));
      rows.set(`${row.layer},${row.head}`, row);
    }
    matchCache.set(key, rows);
  }
  return matchCache.get(key);
}

async function drawMatch(token, scan = false) {
  const fig = $("match");
  if (!state.compare || state.head === "all") {
    fig.hidden = true;
    fig.dataset.state = "empty";
    return;
  }
  fig.hidden = false;
  fig.dataset.state = "loading";
  try {
    const match = (await getMatches(state.compare, scan)).get(`${state.layer},${state.head}`);
    if (token !== drawToken) return;
    if (!match || match.match_layer === null) {
      $("match-caption").textContent = `(head ${state.layer}-${state.head} has no one-to-one match in ${state.compare})`;
      fig.dataset.state = "unmatched";
      return;
    }
    const other = `runs/${runIds.get(state.compare)}`;
    const detail = await api(`${other}/examples/${state.example}`);
    const body = await api(`${other}/examples/${state.example}/attention`, { layer: match.match_layer, head: match.match_head, digits: 4 });
    if (token !== drawToken) return;
    const tokens = detail.tokens.map((t) => t.token);
    const special = detail.tokens.map((t) => Boolean(t.is_special));
    const caption = `(${state.compare}: layer ${match.match_layer}, head ${match.match_head}; distance ${match.distance.toFixed(3)}` +
      (match.p_value === null ? ")" : `, p ${match.p_value.toExponential(1)})`);
    const key = `${state.compare}|${state.example}|${match.match_layer}|${match.match_head}`;
    paintMatrix("match", tokens, special, body.attention[0][0], caption, key);
  } catch (error) {
    if (token === drawToken) {
      fig.dataset.state = "error";
      showError(error);
      if (error.status === 409) { // the pair's matching is not kept and this server cannot keep it: offer to compute it now
        $("match-caption").replaceChildren(`(not computed for ${state.compare} yet) `,
          el("button", { type: "button", id: "match-scan", text: "read the maps now", onclick: () => drawMatch(drawToken, true) }));
      }
    }
  }
}

function headMatrix(maps, head) {
  return maps.attention[maps.heads.indexOf(head)];
}

function drawHeadView(tokens, special, maps, heads, key) {
  const svg = $("headview-svg");
  const n = tokens.length;
  const rowH = Math.max(11, Math.min(18, Math.floor(640 / Math.max(n, 1))));
  const textW = Math.min(170, 12 + 7.5 * Math.max(...tokens.map((t) => t.length), 3));
  const gap = 150;
  const width = 2 * textW + gap;
  const height = n * rowH + 10;
  svg.setAttribute("width", width);
  svg.setAttribute("height", height);
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  svg.classList.remove("focused");
  const minWeight = Math.max(0, parseFloat($("min-weight").value) || 0);
  const y = (i) => 5 + i * rowH + rowH / 2;
  const lines = el("svg:g", { class: "lines" });
  for (const h of heads) {
    const a = headMatrix(maps, h);
    const color = heads.length === 1 ? HEAD_COLORS[0] : HEAD_COLORS[h % HEAD_COLORS.length];
    for (let i = 0; i < n; i++) {
      for (let j = 0; j < n; j++) {
        const w = a[i][j];
        if (w < minWeight || w <= 0) continue;
        lines.append(el("svg:line", {
          class: "attn", x1: textW + 4, y1: y(i), x2: textW + gap - 4, y2: y(j), stroke: color,
          "stroke-width": 2, "stroke-opacity": Math.min(1, w).toFixed(3), "data-i": i, "data-j": j, "data-head": h,
        }));
      }
    }
  }
  const left = el("svg:g", { class: "left" });
  const right = el("svg:g", { class: "right" });
  tokens.forEach((t, i) => {
    const cls = special[i] ? "special" : "";
    const l = el("svg:text", { class: `tok-left ${cls}`, x: textW, y: y(i), "text-anchor": "end", "dominant-baseline": "middle", "data-i": i, text: t });
    l.addEventListener("mouseenter", () => focusToken(svg, i));
    l.addEventListener("mouseleave", () => focusToken(svg, null));
    left.append(l);
    right.append(el("svg:text", { class: `tok-right ${cls}`, x: textW + gap, y: y(i), "dominant-baseline": "middle", "data-j": i, text: t }));
  });
  svg.replaceChildren(lines, left, right);
  const fig = $("headview");
  fig.dataset.key = key;
  fig.dataset.lines = String(lines.childElementCount);
  fig.dataset.state = "ready";
}

function focusToken(svg, i) {
  svg.classList.toggle("focused", i !== null);
  for (const line of svg.querySelectorAll("line.attn")) line.classList.toggle("on", i !== null && Number(line.dataset.i) === i);
  for (const text of svg.querySelectorAll("text.tok-left")) text.classList.toggle("dim", i !== null && Number(text.dataset.i) !== i);
}

function drawMatrix(tokens, special, maps, heads, key) {
  let a;
  let caption;
  if (heads.length === 1) {
    a = headMatrix(maps, heads[0]);
    caption = `(layer ${state.layer}, head ${heads[0]})`;
  } else {
    a = tokens.map((_, i) => tokens.map((_, j) => heads.reduce((s, h) => s + headMatrix(maps, h)[i][j], 0) / heads.length));
    caption = `(layer ${state.layer}, mean of its ${heads.length} heads)`;
  }
  paintMatrix("matrix", tokens, special, a, caption, key);
}

// One map as a heatmap on the canvas of figure `id` (id-canvas, id-caption, id-hover), token labels on both axes.
function paintMatrix(id, tokens, special, a, caption, key) {
  const canvas = $(`${id}-canvas`);
  const n = tokens.length;
  $(`${id}-caption`).textContent = caption;
  const cell = Math.max(2, Math.min(22, Math.floor(560 / Math.max(n, 1))));
  const margin = cell >= 8 ? Math.min(120, 10 + 6.5 * Math.max(...tokens.map((t) => t.length), 3)) : 0;
  const ratio = window.devicePixelRatio || 1;
  const size = margin + n * cell;
  canvas.width = Math.ceil(size * ratio);
  canvas.height = Math.ceil(size * ratio);
  canvas.style.width = `${size}px`;
  canvas.style.height = `${size}px`;
  const ctx = canvas.getContext("2d");
  ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
  ctx.fillStyle = "#fff";
  ctx.fillRect(0, 0, size, size);
  for (let i = 0; i < n; i++) {
    for (let j = 0; j < n; j++) {
      ctx.fillStyle = rgb(viridis(a[i][j]));
      ctx.fillRect(margin + j * cell, margin + i * cell, cell, cell);
    }
  }
  if (margin) {
    ctx.font = `${Math.min(12, cell)}px DejaVu Sans Mono, monospace`;
    ctx.textBaseline = "middle";
    tokens.forEach((t, i) => {
      ctx.fillStyle = special[i] ? "#c62828" : "#1d2430";
      ctx.textAlign = "right";
      ctx.fillText(t, margin - 4, margin + i * cell + cell / 2); // query rows
      ctx.save();
      ctx.translate(margin + i * cell + cell / 2, margin - 4);
      ctx.rotate(-Math.PI / 2);
      ctx.textAlign = "left";
      ctx.fillText(t, 0, 0); // key columns
      ctx.restore();
    });
  }
  drawColorbar($(`${id}-colorbar`), margin, Math.max(n * cell, 80));
  canvas.onmousemove = (event) => {
    const box = canvas.getBoundingClientRect();
    const j = Math.floor((event.clientX - box.left - margin) / cell);
    const i = Math.floor((event.clientY - box.top - margin) / cell);
    $(`${id}-hover`).textContent = i >= 0 && j >= 0 && i < n && j < n
      ? `query ${i} "${tokens[i]}" → key ${j} "${tokens[j]}": ${a[i][j].toFixed(4)}` : " ";
  };
  const fig = $(id);
  Object.assign(fig.dataset, { key, cells: String(n * n), cell: String(cell), margin: String(margin), state: "ready" });
}

const COLORBAR_TICKS = [0, 0.2, 0.4, 0.6, 0.8, 1];

// The colour scale of the heatmaps beside them: viridis from 0 (bottom) to 1 (top), ticked, labelled "attention weight";
// `top` and `height`: where the heatmap's cells are, so the bar runs beside them.
function drawColorbar(svg, top, height) {
  if (!svg) return;
  const barW = 12, tickW = 4, width = barW + tickW + 30 + 16, total = top + height + 8;
  svg.setAttribute("width", width);
  svg.setAttribute("height", total);
  svg.setAttribute("viewBox", `0 0 ${width} ${total}`);
  const gradientId = `${svg.id}-gradient`;
  const gradient = el("svg:linearGradient", { id: gradientId, x1: 0, y1: 1, x2: 0, y2: 0 },
    ...VIRIDIS.map((c, i) => el("svg:stop", { offset: `${(100 * i) / (VIRIDIS.length - 1)}%`, "stop-color": rgb(c) })));
  const y = (v) => top + (1 - v) * height;
  const parts = [el("svg:defs", {}, gradient),
    el("svg:rect", { class: "bar", x: 0.5, y: top, width: barW, height, fill: `url(#${gradientId})`, stroke: "#667085", "stroke-width": 0.5 })];
  for (const v of COLORBAR_TICKS) {
    parts.push(el("svg:line", { x1: barW + 0.5, x2: barW + 0.5 + tickW, y1: y(v), y2: y(v), stroke: "#667085" }),
      el("svg:text", { class: "tick", x: barW + tickW + 3, y: y(v), "dominant-baseline": "middle", text: String(v) }));
  }
  parts.push(el("svg:text", { class: "label", x: 0, y: 0, "text-anchor": "middle", "dominant-baseline": "middle",
    transform: `translate(${width - 6} ${top + height / 2}) rotate(-90)`, text: "attention weight" }));
  svg.replaceChildren(...parts);
  Object.assign(svg.dataset, { top: String(top), height: String(height) });
}

/* ------------------------------------------------------------------ Heads tab: per-head summary heatmaps */

let metricsLoaded = false;

async function loadMetrics() {
  if (!metricsLoaded) {
    const { metrics } = await api(runPath("/head_metrics"));
    const select = $("metric-select");
    const groups = [["saved", "saved results"], ["on request", "computed on request"]].map(([source, label]) => {
      const options = metrics.filter((m) => m.source === source).map((m) => el("option", {
        value: JSON.stringify([m.metric, m.params]),
        text: m.params && m.params !== "{}" ? `${m.metric} ${m.params}` : m.metric,
      }));
      return options.length ? el("optgroup", { label }, ...options) : null;
    }).filter(Boolean);
    select.replaceChildren(...groups);
    metricsLoaded = true;
    pickMetric();
  }
  await drawSummary();
}

// The metric select's option for state.metric (else entropy, else the first); its heatmap is drawn by drawSummary.
function pickMetric() {
  const select = $("metric-select");
  const values = [...select.options].map((o) => o.value);
  const wanted = values.find((v) => JSON.parse(v)[0] === state.metric) || values.find((v) => JSON.parse(v)[0] === "entropy.entropy") || values[0];
  if (wanted) select.value = wanted;
}

async function drawSummary(scan = false, push = false) {
  const value = $("metric-select").value;
  if (!value) return;
  const [metric, params] = JSON.parse(value);
  state.metric = metric;
  writeHash(push);
  const fig = $("summary");
  fig.dataset.state = "loading";
  status(`loading ${metric}…`);
  try {
    const m = await api(runPath(`/head_metrics/${encodeURIComponent(metric)}`), { params, scan: scan ? 1 : null });
    const cw = 40, ch = 26, left = 36, top = 24, legendH = 40;
    const width = left + m.n_heads * cw + 10;
    const height = top + m.n_layers * ch + legendH;
    const svg = $("summary-svg");
    svg.setAttribute("width", width);
    svg.setAttribute("height", height);
    svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
    const lo = m.min ?? 0, hi = m.max ?? 1;
    const scale = (v) => (hi > lo ? (v - lo) / (hi - lo) : 0.5);
    const parts = [];
    for (let h = 0; h < m.n_heads; h++) parts.push(el("svg:text", { x: left + h * cw + cw / 2, y: top - 8, "text-anchor": "middle", text: `H${h}` }));
    for (let l = 0; l < m.n_layers; l++) {
      parts.push(el("svg:text", { x: left - 6, y: top + l * ch + ch / 2, "text-anchor": "end", "dominant-baseline": "middle", text: `L${l}` }));
      for (let h = 0; h < m.n_heads; h++) {
        const v = m.values[l][h];
        const color = v === null ? [220, 220, 220] : viridis(scale(v));
        const rect = el("svg:rect", {
          class: "hcell", x: left + h * cw, y: top + l * ch, width: cw, height: ch, fill: rgb(color),
          "data-layer": l, "data-head": h, "data-value": v === null ? "" : v,
          onclick: () => openHead(l, h),
        }, el("svg:title", { text: `layer ${l}, head ${h}: ${v === null ? "no value" : v.toFixed(4)}` }));
        parts.push(rect);
        if (v !== null) {
          const dark = scale(v) < 0.6;
          parts.push(el("svg:text", {
            x: left + h * cw + cw / 2, y: top + l * ch + ch / 2, "text-anchor": "middle", "dominant-baseline": "middle",
            fill: dark ? "#fff" : "#000", "pointer-events": "none", text: Math.abs(v) >= 100 ? v.toFixed(0) : v.toFixed(2),
          }));
        }
      }
    }
    const gradient = el("svg:linearGradient", { id: "legend-gradient" },
      ...VIRIDIS.map((c, i) => el("svg:stop", { offset: `${(100 * i) / (VIRIDIS.length - 1)}%`, "stop-color": rgb(c) })));
    const ly = top + m.n_layers * ch + 14;
    parts.push(el("svg:defs", {}, gradient),
      el("svg:rect", { x: left, y: ly, width: Math.min(240, m.n_heads * cw), height: 10, fill: "url(#legend-gradient)" }),
      el("svg:text", { x: left, y: ly + 24, text: lo.toFixed(3), class: "legend-min" }),
      el("svg:text", { x: left + Math.min(240, m.n_heads * cw), y: ly + 24, "text-anchor": "end", text: hi.toFixed(3), class: "legend-max" }));
    svg.replaceChildren(...parts);
    $("metric-about").textContent = `${m.source === "saved" ? "saved" : m.note}${m.params && m.params !== "{}" ? ", params " + m.params : ""}; ` +
      `min ${lo.toFixed(4)}, max ${hi.toFixed(4)}`;
    fig.dataset.metric = metric;
    fig.dataset.source = m.source;
    fig.dataset.state = "ready";
    status(`${metric} of ${state.run}`);
  } catch (error) {
    fig.dataset.state = "error";
    showError(error);
    if (error.status === 409) { // it must read maps this server cannot keep: say so, and offer to read them now
      $("metric-about").replaceChildren(`${metric}: not summarised for this run `,
        el("button", { type: "button", id: "metric-scan", text: "read the maps now", onclick: () => drawSummary(true) }));
    }
  }
}

function openHead(layer, head) {
  state.layer = layer;
  state.head = head;
  $("layer-select").value = String(layer);
  $("head-select").value = String(head);
  showTab("example", true);
  drawExample();
}

/* ------------------------------------------------------------------ Search tab */

let facetsLoaded = false;
const searchPage = { offset: 0, limit: 20, total: 0 };

async function loadFacets() {
  if (facetsLoaded) return;
  const facets = await api(runPath("/annotations"));
  for (const [id, key] of [["search-upos", "upos"], ["search-deprel", "deprel"]]) {
    $(id).replaceChildren(el("option", { value: "", text: "any" }),
      ...facets[key].map((f) => el("option", { value: f.value, text: `${f.value} (${f.n})` })));
  }
  facetsLoaded = true;
}

async function runSearch() {
  const form = $("search-form");
  const params = Object.fromEntries(new FormData(form).entries());
  const results = $("search-results");
  results.dataset.state = "loading";
  status("searching…");
  try {
    const found = await api(runPath("/search"), { ...params, offset: searchPage.offset, limit: searchPage.limit });
    searchPage.total = found.total;
    const last = found.offset + found.hits.length;
    $("search-about").textContent = found.total
      ? `${found.total} hits; ${found.offset + 1}–${last} shown; shading: attention from the hit in layer ${found.layer}, head ${found.head}; outlined: the hit; underlined: its dependency head`
      : "no hits";
    $("search-prev").disabled = found.offset === 0;
    $("search-next").disabled = last >= found.total;
    const byExample = new Map();
    for (const hit of found.hits) {
      if (!byExample.has(hit.example)) byExample.set(hit.example, []);
      byExample.get(hit.example).push(hit);
    }
    const blocks = [];
    for (const [example, hits] of byExample) {
      const context = found.examples[String(example)];
      blocks.push(el("div", { class: "hit-example", "data-example": example },
        el("h3", { text: `example ${example} (${hits.length} hit${hits.length > 1 ? "s" : ""})` }),
        ...hits.map((hit) => renderHit(hit, context, found))));
    }
    results.replaceChildren(...blocks);
    results.dataset.total = String(found.total);
    results.dataset.state = "ready";
    status(`search: ${found.total} hits`);
  } catch (error) {
    results.dataset.state = "error";
    showError(error);
  }
}

function renderHit(hit, context, found) {
  const peak = hit.attention ? Math.max(...hit.attention, 1e-9) : 1;
  const spans = context.tokens.map((t, j) => {
    const classes = ["tok"];
    if (context.is_special[j]) classes.push("special");
    if (j === hit.position) classes.push("hit-token");
    if (hit.head_positions.includes(j)) classes.push("gold-head");
    const attrs = { class: classes.join(" "), "data-j": j, text: t };
    if (hit.attention) {
      const w = hit.attention[j];
      attrs.style = `background: rgba(31, 111, 235, ${(0.85 * w / peak).toFixed(3)})`;
      attrs.title = `attention from "${hit.token}": ${w.toFixed(4)}`;
    }
    return el("span", attrs);
  });
  const about = `${hit.word ?? hit.token}` + (hit.upos ? ` ${hit.upos}` : "") + (hit.deprel ? ` ${hit.deprel}` : "");
  const top = hit.top ? el("div", { class: "top", text: "attends most to: " + hit.top.map((t) => `${t.token} (${t.weight.toFixed(2)})`).join(" · ") }) : "";
  const open = el("button", {
    type: "button", class: "open", text: "open",
    onclick: () => {
      if (found.layer !== null) { state.layer = found.layer; state.head = found.head; }
      $("layer-select").value = String(state.layer);
      $("head-select").value = String(state.head);
      showTab("example", true);
      selectExample(hit.example);
    },
  });
  return el("div", { class: "hit", "data-example": hit.example, "data-position": hit.position },
    el("div", { class: "muted" }, `token ${hit.position} “${hit.token}” — ${about}`, open),
    el("div", { class: "context" }, ...spans.flatMap((s) => [s, " "])), top);
}

/* ------------------------------------------------------------------ wiring */

function initViewer() {
  readHash();
  const follow = () => followUrl().catch(showError);
  window.addEventListener("popstate", follow);
  window.addEventListener("hashchange", follow);
  for (const name of ["example", "heads", "search"]) $(`tab-${name}`).addEventListener("click", () => showTab(name, true));
  $("run-select").addEventListener("change", (e) => selectRun(e.target.value, false, true).catch(showError));
  $("layer-select").addEventListener("change", (e) => {
    state.layer = parseInt(e.target.value, 10);
    $("search-layer").value = e.target.value;
    writeHash(true);
    drawExample();
  });
  $("head-select").addEventListener("change", (e) => {
    state.head = e.target.value === "all" ? "all" : parseInt(e.target.value, 10);
    if (state.head !== "all") $("search-head").value = e.target.value;
    writeHash(true);
    drawExample();
  });
  $("min-weight").addEventListener("change", () => drawExample());
  $("compare-select").addEventListener("change", (e) => {
    state.compare = e.target.value || null;
    writeHash(true);
    drawExample();
  });
  let filterTimer = null;
  $("example-filter").addEventListener("input", (e) => {
    clearTimeout(filterTimer);
    filterTimer = setTimeout(() => {
      examplesPage.q = e.target.value;
      examplesPage.offset = 0;
      state.example = null;
      loadExamples().catch(showError);
    }, 250);
  });
  $("examples-prev").addEventListener("click", () => {
    examplesPage.offset = Math.max(0, examplesPage.offset - examplesPage.limit);
    loadExamples().catch(showError);
  });
  $("examples-next").addEventListener("click", () => {
    examplesPage.offset += examplesPage.limit;
    loadExamples().catch(showError);
  });
  $("typed-form").addEventListener("submit", (e) => {
    e.preventDefault();
    runTyped();
  });
  $("typed-back").addEventListener("click", () => {
    leaveTyped();
    if (state.example !== null) selectExample(state.example).catch(showError);
  });
  setupTyped().catch(showError);
  $("metric-select").addEventListener("change", () => drawSummary(false, true));
  $("search-form").addEventListener("submit", (e) => {
    e.preventDefault();
    searchPage.offset = 0;
    runSearch();
  });
  $("search-prev").addEventListener("click", () => {
    searchPage.offset = Math.max(0, searchPage.offset - searchPage.limit);
    runSearch();
  });
  $("search-next").addEventListener("click", () => {
    searchPage.offset += searchPage.limit;
    runSearch();
  });
  loadRuns().catch(showError);
}

/* ------------------------------------------------------------------ API reference (docs.html) */

async function initDocs() {
  const response = await fetch(new URL("openapi.json", document.baseURI));
  const spec = await response.json();
  $("api-about").textContent = `${spec.info.title} ${spec.info.version}: ${spec.info.summary || ""}`;
  const main = $("docs");
  const refs = (schema) => {
    if (!schema) return "";
    if (schema.anyOf) return schema.anyOf.map(refs).filter((t) => t !== "null").join(" | ");
    return schema.type || (schema.$ref ? schema.$ref.split("/").pop() : "");
  };
  for (const [path, methods] of Object.entries(spec.paths)) {
    for (const [method, op] of Object.entries(methods)) {
      const params = op.parameters || [];
      const rows = params.map((p) => el("tr", {},
        el("td", { text: p.name }), el("td", { text: p.in }), el("td", { text: p.required ? "yes" : "" }),
        el("td", { text: refs(p.schema) }), el("td", { text: p.schema && p.schema.default !== undefined ? JSON.stringify(p.schema.default) : "" }),
        el("td", { text: p.description || "" })));
      const section = el("section", { class: "endpoint", id: op.operationId || "" },
        el("h2", {}, el("span", { class: `method ${method}`, text: method.toUpperCase() }), path),
        el("p", { text: op.description || op.summary || "" }));
      if (rows.length) {
        section.append(el("table", {}, el("tr", {}, ...["parameter", "in", "required", "type", "default", ""].map((t) => el("th", { text: t }))), ...rows));
      }
      if (op.requestBody) {
        section.append(el("p", { class: "muted", text: "JSON body: " + JSON.stringify(Object.keys(
          ((op.requestBody.content["application/json"] || {}).schema || {}).properties || {})) }));
      }
      if (method === "get") section.append(tryForm(path, params));
      main.append(section);
    }
  }
}

function tryForm(path, params) {
  const inputs = params.map((p) => el("label", {}, `${p.name} `, el("input", { name: p.name, "data-in": p.in, size: 10 })));
  const out = el("pre", { hidden: "" });
  const form = el("form", { class: "controls" }, ...inputs, el("button", { type: "submit", text: "Try" }));
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    let url = path;
    const query = new URLSearchParams();
    for (const input of form.querySelectorAll("input")) {
      if (input.dataset.in === "path") url = url.replace(`{${input.name}}`, encodeURIComponent(input.value));
      else if (input.value !== "") query.set(input.name, input.value);
    }
    const full = new URL(url.replace(/^\//, "") + (query.toString() ? "?" + query : ""), document.baseURI);
    out.hidden = false;
    const r = await fetch(full);
    const type = r.headers.get("content-type") || "";
    const body = type.includes("json") ? JSON.stringify(await r.json(), null, 1) : `(${type}, ${(await r.arrayBuffer()).byteLength} bytes)`;
    out.textContent = `GET ${full.pathname}${full.search}\n${r.status}\n` + (body.length > 20000 ? body.slice(0, 20000) + "\n…" : body);
  });
  return el("div", {}, form, out);
}

if (document.body.dataset.page === "docs") initDocs().catch(showError);
else initViewer();
