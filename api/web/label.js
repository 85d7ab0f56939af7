/* attnstore labelling page (label.html): plain JavaScript, no build step, nothing loaded from outside.
 *
 * Shows one attention map at a time (a grey heatmap, its tokens on both axes) with the five classes of
 * Kovaleva et al. 2019 as buttons and keys (1-5 or v d x b h; s skips). The map comes from
 * GET api/label/next (maps the rules and the CNN disagree on first), a label goes to POST api/label
 * as the labeller's (pattern_labels, source human:NAME; the server must run with --allow-save).
 * The labeller's name and the maps skipped in this tab are kept in the browser (localStorage, sessionStorage).
 */
"use strict";

const $ = (id) => document.getElementById(id);
const KEYS = { 1: "vertical", 2: "diagonal", 3: "vertical+diagonal", 4: "block", 5: "heterogeneous",
  v: "vertical", d: "diagonal", x: "vertical+diagonal", b: "block", h: "heterogeneous" };
const MAX_SKIPPED = 200;
let current = null; // the map shown: {run, run_id, example, layer, head, ...}
let busy = false;

function status(message, isError = false) {
  const s = $("status");
  s.textContent = message || "";
  s.classList.toggle("error", Boolean(isError));
}

async function api(path, params = {}, options = {}) {
  const url = new URL("api/" + path, document.baseURI);
  for (const [k, v] of Object.entries(params)) {
    if (v !== null && v !== undefined && v !== "") url.searchParams.set(k, v);
  }
  const response = await fetch(url, options);
  let body;
  try {
    body = await response.json();
  } catch (e) {
    body = { error: `${response.status} ${response.statusText}` };
  }
  if (!response.ok) throw new Error(body.error || `${response.status} ${response.statusText}`);
  return body;
}

function skipped() {
  try {
    return JSON.parse(sessionStorage.getItem("attnstore-label-skip") || "[]");
  } catch (e) {
    return [];
  }
}

function labeller() {
  return $("labeller").value.trim();
}

function draw(item) {
  const canvas = $("label-canvas");
  const n = item.length;
  const cell = Math.max(2, Math.min(22, Math.floor(640 / n)));
  const font = Math.min(12, Math.max(6, cell - 2));
  const ctx = canvas.getContext("2d");
  ctx.font = `${font}px sans-serif`;
  const showTokens = cell >= 6;
  const margin = showTokens ? Math.ceil(Math.max(...item.tokens.map((t) => ctx.measureText(t).width))) + 8 : 8;
  const ratio = window.devicePixelRatio || 1;
  const size = margin + n * cell + 4;
  canvas.width = size * ratio;
  canvas.height = size * ratio;
  canvas.style.width = `${size}px`;
  canvas.style.height = `${size}px`;
  ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
  ctx.fillStyle = "#fff";
  ctx.fillRect(0, 0, size, size);
  let max = 0;
  for (const row of item.attention) for (const v of row) max = Math.max(max, v);
  max = max || 1;
  for (let i = 0; i < n; i++) {
    for (let j = 0; j < n; j++) {
      const g = Math.round(255 * (1 - item.attention[i][j] / max)); // linear grey, darker = more
      ctx.fillStyle = `rgb(${g},${g},${g})`;
      ctx.fillRect(margin + j * cell, margin + i * cell, cell, cell);
    }
  }
  ctx.strokeStyle = "#bbb";
  ctx.strokeRect(margin - 0.5, margin - 0.5, n * cell + 1, n * cell + 1);
  ctx.font = `${font}px sans-serif`;
  for (let k = 0; k < n; k++) {
    ctx.fillStyle = item.special[k] ? "#c62828" : "#1d2430";
    if (showTokens) {
      ctx.textAlign = "right";
      ctx.textBaseline = "middle";
      ctx.fillText(item.tokens[k], margin - 4, margin + k * cell + cell / 2); // rows: queries
      ctx.save();
      ctx.translate(margin + k * cell + cell / 2, margin - 4);
      ctx.rotate(-Math.PI / 2);
      ctx.textAlign = "left";
      ctx.fillText(item.tokens[k], 0, 0); // columns: keys
      ctx.restore();
    } else if (item.special[k]) {
      ctx.fillRect(margin + k * cell, margin - 6, cell, 4);
      ctx.fillRect(margin - 6, margin + k * cell, 4, cell);
    }
  }
  const fig = $("label-map");
  fig.dataset.state = "ready";
  fig.dataset.key = `${item.run_id}.${item.example}.${item.layer}.${item.head}`;
  fig.dataset.length = String(n);
  fig.dataset.cell = String(cell);
  fig.dataset.margin = String(margin);
  fig.dataset.max = String(max);
  $("label-caption").textContent =
    `rows: query (attending), columns: key (attended to); L=${n}, max ${max.toFixed(3)}` + (showTokens ? "" : " (too long to print the tokens)");
}

async function next() {
  const name = labeller();
  current = null;
  $("label-map").dataset.state = "loading";
  if (!name) {
    $("label-map").dataset.state = "empty";
    status("type your name as labeller first");
    return;
  }
  localStorage.setItem("attnstore-labeller", name);
  status("loading the next map...");
  try {
    const body = await api("label/next", { labeller: name, run: $("label-run").value, skip: skipped().join(",") });
    $("label-count").textContent = `${body.labelled} labelled by ${body.labeller}`;
    if (!body.map) {
      $("label-map").dataset.state = "done";
      $("label-about").textContent = "";
      status("nothing left to label here");
      return;
    }
    current = body.map;
    draw(current);
    // the classifiers' classes are not shown: labels given blind to them stay an independent check
    $("label-about").textContent =
      `${current.run}, example ${current.example}, layer ${current.layer}, head ${current.head} (0-based): ${current.why}`;
    status(body.writable === false ? "read-only server: labels will not be saved (start it with --allow-save)" : "");
  } catch (e) {
    $("label-map").dataset.state = "error";
    status(e.message, true);
  }
}

async function give(label) {
  if (!current || busy) return;
  busy = true;
  const shown = current;
  try {
    const body = await api("label", {}, {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ labeller: labeller(), run: String(shown.run_id), example: shown.example, layer: shown.layer, head: shown.head, label }),
    });
    $("label-count").textContent = `${body.labelled} labelled by ${labeller()}`;
    $("label-map").dataset.last = `${shown.run_id}.${shown.example}.${shown.layer}.${shown.head}=${label}`;
    await next();
    status(`saved: ${label}`);
  } catch (e) {
    status(e.message, true);
  } finally {
    busy = false;
  }
}

function skip() {
  if (!current || busy) return;
  const list = skipped();
  list.push(`${current.run_id}.${current.example}.${current.layer}.${current.head}`);
  sessionStorage.setItem("attnstore-label-skip", JSON.stringify(list.slice(-MAX_SKIPPED)));
  next();
}

async function init() {
  $("labeller").value = localStorage.getItem("attnstore-labeller") || "";
  try {
    const body = await api("runs");
    for (const run of body.runs) {
      const option = document.createElement("option");
      option.value = String(run.run_id);
      option.textContent = run.run;
      $("label-run").append(option);
    }
  } catch (e) {
    status(e.message, true);
  }
  for (const button of document.querySelectorAll(".label-button")) {
    button.addEventListener("click", () => give(button.dataset.label));
  }
  $("label-skip").addEventListener("click", skip);
  $("labeller").addEventListener("change", next);
  $("label-run").addEventListener("change", next);
  document.addEventListener("keydown", (event) => {
    if (event.target instanceof HTMLInputElement || event.target instanceof HTMLSelectElement) return;
    if (event.ctrlKey || event.metaKey || event.altKey) return;
    const key = event.key.toLowerCase();
    if (key === "s") skip();
    else if (KEYS[key]) give(KEYS[key]);
    else return;
    event.preventDefault();
  });
  next();
}

init();
