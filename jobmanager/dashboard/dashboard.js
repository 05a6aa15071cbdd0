// copse dashboard: reads the job manager's HTTP API (docs/http-api.md) and draws it. No
// framework and no build step: the job manager serves this file as it is.
//
// What it shows stays bounded on a job of any size: a job's graph by stage (never by vertex),
// the newest spans of its timeline, vertices a page at a time. Live updates come from one
// Server-Sent Events stream (/api/v1/events); the timeline, progress and vertex page are
// fetched again at most once a second while the job runs.
"use strict";

const $ = (sel) => document.querySelector(sel);
const svgNS = "http://www.w3.org/2000/svg";
const state = {
  access: null,
  jobs: [],
  daemons: [],
  jobId: null,     // the job shown, or null
  job: null,       // its newest status
  events: null,    // the EventSource
  vertexPage: { stage: "", state: "", offset: 0, limit: 50, total: 0 },
  lastFetch: {},   // what -> ms, to fetch each at most once a second
  logVertex: null,
};

// ---- API ----------------------------------------------------------------------------------

async function api(path, options = {}) {
  // The header tells this server the request comes from its own page (docs/http-api.md).
  const res = await fetch(path, { credentials: "same-origin", ...options, headers: { "X-Copse-Request": "1", ...(options.headers || {}) } });
  if (res.status === 401) { showLogin(); throw new Error("not logged in"); }
  const body = await res.json().catch(() => ({}));
  if (!res.ok) throw new Error(body.error || res.statusText);
  return body;
}

function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") e.className = v; else if (k.startsWith("on")) e.addEventListener(k.slice(2), v); else e.setAttribute(k, v);
  }
  for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(c ?? ""));
  return e;
}

function svg(tag, attrs = {}, text) {
  const e = document.createElementNS(svgNS, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

const fmtSeconds = (s) => s < 60 ? `${s.toFixed(1)} s` : s < 3600 ? `${Math.floor(s / 60)} min ${Math.round(s % 60)} s` : `${(s / 3600).toFixed(1)} h`;
const fmtMs = (ms) => fmtSeconds(ms / 1000);
const fmtTime = (unixMs) => unixMs ? new Date(unixMs).toLocaleString() : "";
const fmtNumber = (v) => typeof v !== "number" ? String(v) : Math.abs(v) >= 1000 ? Math.round(v).toLocaleString() : Number(v.toPrecision(4)).toString();

function throttled(what, ms) {
  const now = Date.now();
  if (now - (state.lastFetch[what] || 0) < ms) return false;
  state.lastFetch[what] = now;
  return true;
}

// ---- login --------------------------------------------------------------------------------

function showLogin() {
  $("#login").hidden = false;
  $("#main").hidden = true;
  if (state.events) { state.events.close(); state.events = null; }
  setConnection("down", "logged out");
}

$("#login-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const res = await fetch("/api/v1/login", {
    method: "POST", credentials: "same-origin",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ token: $("#login-token").value.trim() }),
  });
  if (!res.ok) { $("#login-error").textContent = (await res.json().catch(() => ({}))).error || "wrong token"; return; }
  $("#login-token").value = "";
  start();
});

function setConnection(cls, text) {
  const c = $("#connection");
  c.className = "connection " + cls;
  c.textContent = text;
}

// ---- live updates -------------------------------------------------------------------------

function connect() {
  if (state.events) state.events.close();
  const url = "/api/v1/events" + (state.jobId ? `?job=${state.jobId}` : "");
  const es = new EventSource(url);
  state.events = es;
  es.onopen = () => setConnection("live", "live");
  es.onerror = () => {
    setConnection("down", "reconnecting…");
    // A dropped stream the browser retries by itself; one refused (503: too many streams; 401)
    // it gives up on: connect again in a while, if we are still logged in (a 401 shows the form).
    if (es.readyState === EventSource.CLOSED) {
      setTimeout(() => { if (state.events === es) api("/api/v1/whoami").then(connect).catch(() => {}); }, 2000);
    }
  };
  es.addEventListener("jobs", (ev) => { state.jobs = JSON.parse(ev.data).jobs; renderJobs(); });
  es.addEventListener("daemons", (ev) => { state.daemons = JSON.parse(ev.data).daemons; renderDaemons(); });
  es.addEventListener("job", (ev) => {
    const job = JSON.parse(ev.data);
    if (job.error || String(job.id) !== String(state.jobId)) return;
    state.job = job;
    renderJob();
  });
}

// ---- views --------------------------------------------------------------------------------

function route() {
  const m = location.hash.match(/^#\/jobs\/(\d+)/);
  const jobId = m ? m[1] : null;
  const daemons = location.hash === "#/daemons";
  $("#jobs-view").hidden = !!jobId || daemons;
  $("#daemons-view").hidden = !daemons;
  $("#job-view").hidden = !jobId;
  if (jobId !== state.jobId) {
    state.jobId = jobId;
    state.job = null;
    state.vertexPage.offset = 0;
    state.vertexPage.stage = "";
    state.logVertex = null;
    $("#log-panel").hidden = true;
    state.lastFetch = {};
    timeline.data = null;
    if (state.access) connect();
    if (jobId) api(`/api/v1/jobs/${jobId}`).then((job) => { state.job = job; renderJob(); }).catch(showError);
  }
}

function showError(e) { $("#job-failure").textContent = e.message; }

function renderJobs() {
  const body = $("#jobs tbody");
  body.replaceChildren();
  for (const j of [...state.jobs].reverse()) {
    const pct = j.total ? (100 * j.completed) / j.total : 100;
    const row = el("tr", { "data-job": j.id, onclick: () => { location.hash = `#/jobs/${j.id}`; } },
      el("td", {}, String(j.id)), el("td", {}, j.name),
      el("td", {}, el("span", { class: "state " + j.state }, j.state)),
      el("td", {}, el("span", { class: "bar" }, el("span", { style: `width:${pct}%` })), ` ${j.completed}/${j.total}`),
      el("td", {}, fmtSeconds(j.elapsed_s || 0)), el("td", {}, fmtTime(j.submitted_unix_ms)),
      el("td", {}, j.failure || j.reason || (j.forgotten ? "from history" : "")));
    body.append(row);
  }
}

function renderDaemons() {
  const body = $("#daemons tbody");
  body.replaceChildren();
  for (const d of state.daemons) {
    if (d.superseded) continue;
    const labels = Object.entries(d.labels || {}).map(([k, v]) => `${k}=${v}`).join(" ");
    const used = d.alive && d.cpus ? `${Math.round((100 * (d.cpus - d.free_cpus)) / d.cpus)} %` : "";  // a lost one: none
    body.append(el("tr", { "data-daemon": d.name },
      el("td", {}, d.name), el("td", {}, el("span", { class: "state " + (d.alive ? "completed" : "failed") }, d.state)),
      el("td", {}, String(d.cpus)), el("td", {}, used), el("td", {}, String(d.gpus)),
      el("td", {}, d.memory_mb ? `${d.memory_mb} MB` : ""), el("td", {}, String(d.running)),
      el("td", {}, labels), el("td", {}, d.data), el("td", {}, d.control)));
  }
}

function renderJob() {
  const job = state.job;
  if (!job) return;
  $("#job-title").textContent = `Job ${job.id}: ${job.name}`;
  const st = $("#job-state");
  st.textContent = job.state + (job.forgotten ? " (from history)" : "");
  st.className = "state " + job.state;
  const v = job.vertices || {};
  const progress = job.progress || {};
  const rate = Object.keys(progress).find((k) => k.endsWith("_per_s"));
  $("#job-summary").textContent = `${v.completed}/${v.total} vertices · ${fmtSeconds(job.elapsed_s || 0)}` +
    (progress.loss !== undefined ? ` · loss ${fmtNumber(progress.loss)}` : "") +
    (rate ? ` · ${fmtNumber(progress[rate])} ${rate.replace("_per_s", "")}/s` : "");
  $("#job-view").dataset.completed = v.completed;
  $("#job-view").dataset.state = job.state;
  $("#job-failure").textContent = job.failure || "";
  $("#job-cancel").hidden = !(state.access === "admin" && job.state === "running");
  $("#job-trace").href = `/api/v1/jobs/${job.id}/trace`;
  renderDag(job);
  renderFaults(job);
  // While it runs, at most once a second (the progress every two); once it ended, once more.
  const running = job.state === "running";
  const last = !running && !state.lastFetch.final;
  if (last) state.lastFetch.final = 1;
  if (!timeline.data || last || (running && throttled("timeline", 1000))) fetchTimeline();
  if (last || (running && throttled("vertices", 1000))) fetchVertices();
  if ((progress.step !== undefined || progress.loss !== undefined) && (last || (running && throttled("progress", 2000)))) fetchProgress();
  if (state.logVertex && running && throttled("log", 2000)) fetchLog();
}

$("#job-cancel").addEventListener("click", async () => {
  if (!confirm(`Cancel job ${state.jobId}?`)) return;
  await api(`/api/v1/jobs/${state.jobId}/cancel`, { method: "POST", headers: { "Content-Type": "application/json" }, body: "{}" }).catch(showError);
});

// ---- the graph, by stage ------------------------------------------------------------------

// The graph is laid out and built once per job; each status then only moves its bars and
// numbers (a job of 100 stages would otherwise rebuild hundreds of SVG nodes twice a second).
const dag = { key: null, stages: {} };

function renderDag(job) {
  const stages = job.stages || [];
  const edges = job.edges || [];
  const key = `${job.id}|${stages.map((s) => s.name).join(",")}|${JSON.stringify(edges)}`;
  if (key !== dag.key) buildDag(stages, edges, key);
  for (const s of stages) updateStage(dag.stages[s.name], s);
}

function updateStage(parts, s) {
  if (!parts) return;
  parts.group.setAttribute("class", "stage" + (s.failed_attempts ? " failing" : ""));
  parts.sub.textContent = `${s.program} · ${s.completed}/${s.total}` + (s.failed_attempts ? ` · ${s.failed_attempts} failed` : "");
  parts.title.textContent = `${s.name}: ${s.completed} completed, ${s.running} running, ${s.ready} ready, ${s.waiting} waiting`;
  // The bar: completed, running, ready, waiting, in proportion.
  let x = 8;
  for (const k of ["completed", "running", "ready", "waiting"]) {
    const n = (k === "running" ? (s.running || 0) + (s.sent_ahead || 0) : s[k]) || 0;
    const w = s.total ? (parts.width * n) / s.total : 0;
    parts.segments[k].setAttribute("x", x);
    parts.segments[k].setAttribute("width", w);
    x += w;
  }
}

function buildDag(stages, edges, key) {
  dag.key = key;
  dag.stages = {};
  // By stage, a training graph has cycles (step t's update feeds step t+1's forward): the data
  // edges a depth-first walk in the job file's order meets going back are drawn as arcs and
  // left out of the layout. Columns by longest path from a source over the rest.
  const index = Object.fromEntries(stages.map((s, i) => [s.name, i]));
  const adjacent = {};
  for (const [from, to, kind] of edges) if (from !== to && kind !== "order") (adjacent[from] ||= []).push(to);
  for (const list of Object.values(adjacent)) list.sort((a, b) => index[a] - index[b]);
  const mark = {}, back = new Set();
  const walk = (u) => {
    mark[u] = 1;
    for (const v of adjacent[u] || []) { if (mark[v] === 1) back.add(`${u}>${v}`); else if (!mark[v]) walk(v); }
    mark[u] = 2;
  };
  stages.forEach((s) => { if (!mark[s.name]) walk(s.name); });
  const depth = Object.fromEntries(stages.map((s) => [s.name, 0]));
  for (let pass = 0; pass < stages.length; ++pass) {
    let changed = false;
    for (const [from, to, kind] of edges) {
      if (from === to || kind === "order" || back.has(`${from}>${to}`) || depth[to] === undefined || depth[from] === undefined) continue;
      if (depth[to] < depth[from] + 1) { depth[to] = depth[from] + 1; changed = true; }
    }
    if (!changed) break;
  }
  const columns = [];
  for (const s of stages) (columns[depth[s.name]] ||= []).push(s);
  const W = 160, H = 58, GX = 48, GY = 22;
  const pos = {};
  columns.forEach((col, c) => col.forEach((s, r) => { pos[s.name] = { x: 10 + c * (W + GX), y: 10 + r * (H + GY) }; }));
  const width = 20 + columns.length * (W + GX) - GX;
  const height = 20 + Math.max(1, ...columns.map((c) => c.length)) * (H + GY) - GY;
  const root = svg("svg", { viewBox: `0 0 ${Math.max(width, 200)} ${height}` });
  root.style.maxWidth = `${Math.max(width, 200)}px`;
  for (const [from, to, kind] of edges) {
    const a = pos[from], b = pos[to];
    if (!a || !b || from === to) continue;
    let cls = kind === "order" ? "edge order" : ["stream", "shm", "nccl"].includes(kind) ? "edge live" : "edge";
    let d;
    if (b.x > a.x) {  // forward: right side to left side
      const x1 = a.x + W, y1 = a.y + H / 2, x2 = b.x, y2 = b.y + H / 2;
      d = `M${x1},${y1} C${x1 + GX / 2},${y1} ${x2 - GX / 2},${y2} ${x2},${y2}`;
    } else {  // back (or within a column): an arc under the boxes
      cls += " back";
      const x1 = a.x + W / 2, y1 = a.y + H, x2 = b.x + W / 2, y2 = b.y + H;
      d = `M${x1},${y1} C${x1},${y1 + GY} ${x2},${y2 + GY} ${x2},${y2}`;
    }
    const path = svg("path", { class: cls, d });
    path.append(svg("title", {}, `${from} → ${to} (${kind})`));
    root.append(path);
  }
  for (const s of stages) {
    const p = pos[s.name];
    const g = svg("g", { class: "stage", "data-stage": s.name, transform: `translate(${p.x},${p.y})` });
    g.append(svg("rect", { class: "box", width: W, height: H }));
    g.append(svg("text", { x: 8, y: 17 }, s.name));
    const parts = { group: g, sub: svg("text", { class: "sub", x: 8, y: 32 }), title: svg("title"), width: W - 16, segments: {} };
    g.append(parts.sub);
    for (const k of ["completed", "running", "ready", "waiting"]) {
      parts.segments[k] = svg("rect", { class: "seg-" + k, x: 8, y: 40, width: 0, height: 9 });
      g.append(parts.segments[k]);
    }
    g.append(parts.title);
    dag.stages[s.name] = parts;
    g.addEventListener("click", () => { state.vertexPage.stage = s.name; state.vertexPage.offset = 0; $("#vertex-stage").value = s.name; fetchVertices(); });
    root.append(g);
  }
  $("#dag").replaceChildren(root);
  // The stage filter's options follow the stages.
  const select = $("#vertex-stage");
  if (select.options.length !== stages.length + 1) {
    select.replaceChildren(el("option", { value: "" }, "every stage"), ...stages.map((s) => el("option", { value: s.name }, s.name)));
    select.value = state.vertexPage.stage;
  }
}

// ---- faults, recoveries, why things wait ----------------------------------------------------

function renderFaults(job) {
  const faults = $("#faults tbody");
  faults.replaceChildren(...(job.faults || []).map((f) => el("tr", {},
    el("td", {}, fmtMs(f.at_ms || 0)), el("td", {}, f.fault || f.action || ""),
    el("td", {}, [f.daemon && `daemon ${f.daemon}`, f.vertex].filter(Boolean).join(", ")))));
  // The newest 30 recoveries (a lost daemon can cost hundreds), and how many of each reason.
  const all = job.recoveries || [];
  const reasons = {};
  for (const r of all) reasons[r.reason] = (reasons[r.reason] || 0) + 1;
  $("#recoveries-note").textContent = all.length
    ? `${all.length} vertices run again: ` + Object.entries(reasons).map(([k, n]) => `${n} ${k}`).join(", ") + (all.length > 30 ? " (the newest 30 below)" : "")
    : "no recoveries";
  const rec = $("#recoveries tbody");
  rec.replaceChildren(...all.slice(-30).reverse().map((r) => el("tr", { class: "recovery", onclick: () => openLog(r.vertex) },
    el("td", {}, fmtMs(r.at_ms || 0)), el("td", {}, r.vertex), el("td", {}, String(r.failed_version)),
    el("td", {}, r.reason), el("td", {}, r.detail))));
  $("#waiting").replaceChildren(...(job.waiting || []).map((w) => el("li", {}, `${w.vertex}: ${w.reason}`)));
}

// ---- timeline: one band per daemon, spans packed into rows ------------------------------------

const timeline = { data: null, boxes: [] };

async function fetchTimeline() {
  if (!state.jobId) return;
  const id = state.jobId;
  const data = await api(`/api/v1/jobs/${id}/timeline?limit=5000`).catch(() => null);
  if (!data || id !== state.jobId) return;
  timeline.data = data;
  drawTimeline();
}

function drawTimeline() {
  const data = timeline.data;
  const holder = $("#timeline");
  const canvas = holder.querySelector("canvas");
  if (!data) return;
  const job = state.job || {};
  holder.dataset.spans = data.spans.length;
  holder.dataset.recoveries = (job.recoveries || []).length;
  $("#timeline-note").textContent = data.total_spans > data.spans.length
    ? `the newest ${data.spans.length} of ${data.total_spans} attempts` : `${data.spans.length} attempts`;
  const now = data.now_ms;
  const t0 = data.spans.length ? Math.min(...data.spans.map((s) => s[1])) : 0;
  const t1 = Math.max(now, t0 + 1);
  // Rows per daemon: each span goes into the first row free at its start.
  const rows = data.daemons.map(() => []);
  const placed = [];
  for (const s of [...data.spans].sort((a, b) => a[1] - b[1])) {
    const end = s[2] < 0 ? now : s[2];
    const lanes = rows[s[0]] || (rows[s[0]] = []);
    let lane = lanes.findIndex((free) => free <= s[1]);
    if (lane < 0) { lane = lanes.length; lanes.push(0); }
    lanes[lane] = end;
    placed.push({ s, lane, end });
  }
  const RH = 12, LABEL = 110, PAD = 6;
  const bandTop = [];
  let y = 16;
  data.daemons.forEach((_, d) => { bandTop[d] = y; y += Math.max(1, rows[d].length) * RH + PAD; });
  const width = holder.clientWidth || 800;
  const height = y + 4;
  const dpr = window.devicePixelRatio || 1;
  canvas.width = width * dpr; canvas.height = height * dpr;
  canvas.style.height = height + "px";
  const ctx = canvas.getContext("2d");
  ctx.scale(dpr, dpr);
  ctx.clearRect(0, 0, width, height);
  const css = getComputedStyle(document.documentElement);
  const color = (outcome) => css.getPropertyValue(outcome === "completed" ? "--completed" : outcome === "running" ? "--running"
    : outcome === "cancelled" || outcome === "superseded" ? "--cancelled" : "--failed").trim();
  const X = (t) => LABEL + ((t - t0) / (t1 - t0)) * (width - LABEL - 8);
  ctx.font = "11px system-ui, sans-serif";
  ctx.fillStyle = "#6b6b70";
  ctx.fillText(`${fmtMs(t0)}`, LABEL, 11);
  ctx.fillText(`${fmtMs(t1)}`, width - 60, 11);
  data.daemons.forEach((name, d) => {
    ctx.fillStyle = "#1d1d1f";
    ctx.fillText(name, 4, bandTop[d] + 10);
    ctx.fillStyle = "#f0f0f2";
    ctx.fillRect(LABEL, bandTop[d], width - LABEL - 8, Math.max(1, rows[d].length) * RH);
  });
  timeline.boxes = [];
  for (const { s, lane, end } of placed) {
    const outcome = s[2] < 0 ? "running" : s[3];
    const x = X(s[1]), w = Math.max(1, X(end) - x), yy = bandTop[s[0]] + lane * RH + 1;
    ctx.fillStyle = color(outcome);
    ctx.fillRect(x, yy, w, RH - 2);
    timeline.boxes.push({ x, y: yy, w, h: RH - 2, s, outcome, end });
  }
  // Faults and recoveries, as the job's status lists them, at their time.
  const mark = (t, cssVar) => {
    if (t < t0 || t > t1) return;
    ctx.strokeStyle = css.getPropertyValue(cssVar).trim();
    ctx.lineWidth = 2;
    ctx.beginPath(); ctx.moveTo(X(t), 14); ctx.lineTo(X(t), height); ctx.stroke();
  };
  for (const f of job.faults || []) mark(f.at_ms || 0, "--fault");
  for (const r of job.recoveries || []) mark(r.at_ms || 0, "--recovery");
}

$("#timeline canvas").addEventListener("mousemove", (ev) => {
  const r = ev.target.getBoundingClientRect();
  const x = ev.clientX - r.left, y = ev.clientY - r.top;
  const hit = timeline.boxes.find((b) => x >= b.x && x <= b.x + b.w && y >= b.y && y <= b.y + b.h);
  const tip = $("#timeline-tip");
  timeline.hover = hit;
  if (!hit) { tip.hidden = true; return; }
  tip.hidden = false;
  tip.textContent = `${hit.s[4]} attempt ${hit.s[5]}\n${hit.outcome}, ${fmtMs(hit.end - hit.s[1])}\n${timeline.data.daemons[hit.s[0]]}`;
  tip.style.left = Math.min(x + 12, r.width - 160) + "px";
  tip.style.top = y + 12 + "px";
});
$("#timeline canvas").addEventListener("click", () => { if (timeline.hover) openLog(timeline.hover.s[4]); });
window.addEventListener("resize", drawTimeline);

// ---- vertices, a page at a time -----------------------------------------------------------

async function fetchVertices() {
  if (!state.jobId) return;
  const id = state.jobId;
  const p = state.vertexPage;
  const q = new URLSearchParams({ offset: p.offset, limit: p.limit });
  if (p.stage) q.set("stage", p.stage);
  if (p.state) q.set("state", p.state);
  const page = await api(`/api/v1/jobs/${id}/vertices?${q}`).catch(() => null);
  if (!page || id !== state.jobId) return;
  p.total = page.total;
  $("#vertex-page").textContent = page.total ? `${p.offset + 1}–${Math.min(p.offset + p.limit, page.total)} of ${page.total}` : "none";
  $("#vertices tbody").replaceChildren(...page.vertices.map((v) => el("tr", { onclick: () => openLog(v.name) },
    el("td", {}, v.name), el("td", {}, el("span", { class: "state " + v.state }, v.state)),
    el("td", {}, String(v.version ?? "")), el("td", {}, v.daemon || ""), el("td", {}, String(v.failed_attempts ?? "")),
    el("td", {}, v.reason || ""))));
}

$("#vertex-stage").addEventListener("change", (e) => { state.vertexPage.stage = e.target.value; state.vertexPage.offset = 0; fetchVertices(); });
$("#vertex-state").addEventListener("change", (e) => { state.vertexPage.state = e.target.value; state.vertexPage.offset = 0; fetchVertices(); });
$("#vertex-prev").addEventListener("click", () => { const p = state.vertexPage; p.offset = Math.max(0, p.offset - p.limit); fetchVertices(); });
$("#vertex-next").addEventListener("click", () => { const p = state.vertexPage; if (p.offset + p.limit < p.total) p.offset += p.limit; fetchVertices(); });

// ---- a vertex's log -------------------------------------------------------------------------

// A vertex's log: its event lines, then what its newest attempt printed, read on from where the
// last read ended (`next`), so a long log is fetched once, not again every two seconds.
const printedLog = { vertex: null, attempt: 0, next: 0, records: [] };

function openLog(vertex) {
  state.logVertex = vertex;
  Object.assign(printedLog, { vertex, attempt: 0, next: 0, records: [] });
  $("#log-panel").hidden = false;
  $("#log-vertex").textContent = vertex;
  fetchLog();
}

async function fetchLog() {
  const vertex = state.logVertex;
  const q = new URLSearchParams({ vertex });
  const read = new URLSearchParams({ vertex, from: printedLog.next });
  if (printedLog.attempt) read.set("attempt", printedLog.attempt);
  const [printed, events] = await Promise.all([
    api(`/api/v1/jobs/${state.jobId}/vertex_log?${read}`).catch((e) => ({ error: e.message })),
    api(`/api/v1/jobs/${state.jobId}/logs?${q}`).catch(() => ({ lines: [] })),
  ]);
  if (vertex !== state.logVertex) return;
  if (!printed.error) {
    if (printed.attempt !== printedLog.attempt) Object.assign(printedLog, { attempt: printed.attempt, records: [] });
    printedLog.records.push(...(printed.records || []));
    printedLog.next = printed.next;
  }
  const pre = $("#log");
  pre.replaceChildren();
  for (const line of events.lines || []) pre.append(el("div", {}, line));
  if (printed.error) {
    $("#log-note").textContent = printed.error;
  } else {
    $("#log-note").textContent = `attempt ${printed.attempt} of ${printed.newest}${printed.running ? ", running" : ""}` +
      (printed.daemon ? ` on ${printed.daemon}` : "");
    for (const r of printedLog.records) pre.append(el("div", { class: r.stream }, r.text));
    // A newer attempt started since: read that one from its start next time.
    if (printed.newest > printed.attempt) Object.assign(printedLog, { attempt: 0, next: 0, records: [] });
  }
}

// ---- training progress --------------------------------------------------------------------

async function fetchProgress() {
  const id = state.jobId;
  const data = await api(`/api/v1/jobs/${id}/progress`).catch(() => null);
  if (!data || id !== state.jobId) return;
  const points = data.points.filter((p) => typeof p.loss === "number");
  $("#progress-panel").hidden = points.length === 0;
  if (!points.length) return;
  const xKey = points.every((p) => typeof p.step === "number") ? "step" : "elapsed_s";
  const xs = points.map((p) => p[xKey]), ys = points.map((p) => p.loss);
  const [x0, x1] = [Math.min(...xs), Math.max(...xs, Math.min(...xs) + 1)];
  const [y0, y1] = [Math.min(...ys), Math.max(...ys, Math.min(...ys) + 1e-9)];
  const W = 520, H = 200, L = 44, B = 22;
  const X = (x) => L + ((x - x0) / (x1 - x0)) * (W - L - 8);
  const Y = (y) => 8 + (1 - (y - y0) / (y1 - y0)) * (H - B - 8);
  const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, "data-points": points.length, "data-last-step": points[points.length - 1].step ?? "" });
  root.append(svg("line", { class: "axis", x1: L, y1: H - B, x2: W - 8, y2: H - B }), svg("line", { class: "axis", x1: L, y1: 8, x2: L, y2: H - B }));
  root.append(svg("path", { d: points.map((p, i) => `${i ? "L" : "M"}${X(p[xKey]).toFixed(1)},${Y(p.loss).toFixed(1)}`).join(" ") }));
  root.append(svg("text", { x: 2, y: 14 }, fmtNumber(y1)), svg("text", { x: 2, y: H - B }, fmtNumber(y0)));
  root.append(svg("text", { x: L, y: H - 6 }, `${xKey} ${fmtNumber(x0)}`), svg("text", { x: W - 90, y: H - 6 }, fmtNumber(x1)));
  $("#progress-chart").replaceChildren(root);
  const last = points[points.length - 1];
  $("#progress-note").textContent = `loss ${fmtNumber(last.loss)} at ${xKey} ${fmtNumber(last[xKey])}`;
}

// ---- start --------------------------------------------------------------------------------

// A link from `copse dashboard` carries its token in the fragment: log in with it, then drop it
// from the address bar and the history. True when the fragment was such a link.
async function loginFromLink() {
  const link = location.hash.match(/^#token=([0-9a-f]+)$/);
  if (!link) return false;
  history.replaceState(null, "", location.pathname + "#/");
  await fetch("/api/v1/login", {
    method: "POST", credentials: "same-origin", headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ token: link[1] }),
  });
  return true;
}

async function start() {
  await loginFromLink();
  try {
    state.access = (await api("/api/v1/whoami")).access;
  } catch (e) {
    return;
  }
  $("#login").hidden = true;
  $("#main").hidden = false;
  $("#access").textContent = state.access === "admin" ? "admin" : "read only";
  state.jobId = undefined;  // route() connects the stream
  route();
  if (!state.events) connect();
}

// The link opened in a tab that shows the page already only changes its fragment.
window.addEventListener("hashchange", async () => { if (await loginFromLink()) start(); else route(); });
start();
