// The page of `gts serve`: it polls the server once a second and redraws what changed, keeping the
// user's root, sort, filter, page, ticked runs and open run. Every value from the server is
// written as text (textContent), never as HTML.
"use strict";

const state = {
  root: 0, sort: null, desc: false, status: "", q: "", offset: 0, limit: 50,
  ticked: new Set(), open: null, tick: 0, charts: false, paramNames: [], metricNames: [], reportedNames: [],
  chosen: false, userTicked: false,  // the charts' metric was chosen for the user; the user ticked runs
};
const $ = (id) => document.getElementById(id);

function text(tag, value, cls) {
  const element = document.createElement(tag);
  element.textContent = value === null || value === undefined ? "" : String(value);
  if (cls) element.className = cls;
  return element;
}

// A report (gts report): the answers are in the page; nothing is fetched.
const REPORT = (() => {
  const element = document.getElementById("gts-report");
  return element ? JSON.parse(element.textContent) : null;
})();

function valueAt(row, key) {
  for (const name of key.startsWith("result") || key.startsWith("metrics.") ? [key] : [`result.${key}`, key, `metrics.${key}`]) {
    if (name in row) return row[name];
  }
  return undefined;
}

function compare(a, b) {
  const missing = (v) => v === null || v === undefined;
  if (missing(a) || missing(b)) return missing(a) - missing(b);
  if (typeof a === "number" && typeof b === "number") return a - b;
  return String(a) < String(b) ? -1 : String(a) > String(b) ? 1 : 0;
}

function answer(path, params) {
  const p = params || {};
  if (path === "/api/overview") return REPORT.overview;
  if (path === "/api/timeline") return REPORT.timeline;
  if (path === "/api/gpus") return { gpus: [], problem: null };
  if (path === "/api/log") throw new Error("logs are not part of a report: gts serve shows them");
  if (path === "/api/run") {
    const run = REPORT.runs.find((r) => r.name === p.name);
    return { run, config: null, metrics: {}, provenance: (REPORT.provenance || {})[p.name] || null };
  }
  if (path === "/api/runs") {
    let runs = REPORT.runs.filter((r) => (!p.status || r.status === p.status) && (!p.q || r.name.includes(p.q)));
    if (p.sort) {
      const sign = p.desc === "1" ? -1 : 1;
      runs = runs.map((r, i) => [r, i]).sort(([a, i], [b, j]) => {
        const va = valueAt(a, p.sort), vb = valueAt(b, p.sort);
        const gone = (v) => v === null || v === undefined;
        if (gone(va) || gone(vb)) return gone(va) - gone(vb) || i - j;
        return sign * compare(va, vb) || i - j;
      }).map(([r]) => r);
    }
    const offset = Number(p.offset || 0), limit = Number(p.limit || 50);
    return { total: runs.length, offset, runs: runs.slice(offset, offset + limit) };
  }
  if (path === "/api/curves") {
    const runs = p.names.split("\n").map((name) => {
      const run = REPORT.runs.find((r) => r.name === name) || { name, status: "", };
      const curve = REPORT.curves[name] || { steps: [], values: [] };
      const steps = [], values = [];
      curve.steps.forEach((step, i) => { const v = curve.values[i][p.metric]; if (typeof v === "number") { steps.push(step); values.push(v); } });
      const lineage = (REPORT.lineages || {})[name];
      return { name, status: run.status, params: paramsOf(run), steps, values, ...(lineage ? { lineage } : {}) };
    });
    if (p.over) {  // worked out when the report was written, as the server works them out
      const groups = ((REPORT.groups || {})[p.over] || {})[p.metric];
      if (groups) return { metric: p.metric, runs, over: p.over, groups };
    }
    return { metric: p.metric, runs };
  }
  if (path === "/api/pareto") return REPORT.pareto || { objectives: [], runs: [] };
  if (path === "/api/importance") {  // worked out when the report was written, for the declared metric
    const found = REPORT.importance;
    if (found && found.metric === p.metric && found.mode === p.mode) return found;
    return { metric: p.metric, mode: p.mode, problem: `a report holds the importance of the metric its config declares only; gts importance ROOT --metric ${p.metric} --${p.mode} ranks this one` };
  }
  if (path === "/api/parcoords") {
    const finished = REPORT.runs.filter((r) => r.status === "succeeded" && typeof valueAt(r, p.metric) === "number");
    finished.sort((a, b) => (p.desc === "1" ? -1 : 1) * (valueAt(a, p.metric) - valueAt(b, p.metric)));
    const names = new Set();
    const runs = finished.map((r) => { const params = paramsOf(r); Object.keys(params).forEach((k) => names.add(k)); return { name: r.name, params, value: valueAt(r, p.metric) }; });
    return { metric: p.metric, params: [...names], runs, total: runs.length };
  }
  throw new Error(`not in a report: ${path}`);
}

function paramsOf(run) {
  const params = {};
  for (const [key, value] of Object.entries(run)) {
    if (!FIRST.includes(key) && !LAST.includes(key) && !HIDDEN.has(key) && !key.startsWith("result") && !key.startsWith("metrics.")) params[key] = value;
  }
  return params;
}

// The token gts serve printed in the page's URL, kept in the page and sent with each request as a
// header: never a cookie, which the browser would send to every server on this host, whatever its port.
const TOKEN = new URLSearchParams(window.location.search).get("token");
const AUTH = { credentials: "omit", headers: TOKEN ? { "X-GTS-Token": TOKEN } : {} };

async function get(path, params) {
  if (REPORT) return answer(path, params);
  const query = new URLSearchParams({ root: String(state.root), ...(params || {}) });
  const response = await fetch(`${path}?${query}`, AUTH);
  const body = await response.json().catch(() => ({ error: `${response.status} ${response.statusText}` }));
  if (!response.ok) throw new Error(body.error || response.statusText);
  return body;
}

function clock(seconds) {
  if (seconds === null || seconds === undefined) return "";
  const s = Math.round(seconds);
  const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), r = s % 60;
  return h ? `${h}:${String(m).padStart(2, "0")}:${String(r).padStart(2, "0")}` : `${m}:${String(r).padStart(2, "0")}`;
}

function cell(value) {
  if (value === null || value === undefined) return "";
  if (typeof value === "number") return Number.isInteger(value) ? String(value) : value.toPrecision(6).replace(/\.?0+(e|$)/, "$1");
  if (typeof value === "object") return JSON.stringify(value);
  return String(value);
}

// --- the overview -------------------------------------------------------------------------------

function drawOverview(o) {
  const scheduler = $("scheduler");
  scheduler.textContent = o.scheduler.running ? "a scheduler is running" : o.scheduler.running === false ? "no scheduler is running" : "scheduler: unknown here";
  scheduler.className = o.scheduler.running ? "alive" : "gone";
  const counts = Object.entries(o.counts).filter(([, n]) => n > 0).map(([name, n]) => `${n} ${name}`);
  $("counts").textContent = counts.join(", ") || "no runs recorded";
  const total = Object.values(o.counts).reduce((a, b) => a + b, 0);
  const done = total - (o.counts.pending || 0) - (o.counts.running || 0) - (o.counts.stale || 0);
  $("progress").style.width = total ? `${(100 * done) / total}%` : "0";
  $("eta").textContent = o.eta !== null && o.scheduler.running ? `ETA ${clock(o.eta)}` : "";
  // What the runs cost, as `gts status` says it: GPU-hours over every attempt, and energy where counted.
  const energy = o.energy ? `, ${(o.energy / 3.6e6).toPrecision(4)} kWh` : "";
  $("cost").textContent = o.gpu_seconds ? `spent: ${(o.gpu_seconds / 3600).toPrecision(4)} GPU-hours${energy}`
    : o.slot_seconds ? `spent: ${(o.slot_seconds / 3600).toPrecision(4)} slot-hours (no GPU measured: the time the runs held their slots)` : "";
  // What the scheduler saw of runs that the user should know (a resume that ignored its checkpoint).
  $("notes").replaceChildren(...Object.values(o.notes || {}).map((note) => text("li", note)));
  // A Slurm pool: its allocations, their nodes, slots and runs (as `gts status` shows them).
  $("pool").replaceChildren(...(o.pool || []).map((line) => text("li", line)));
  const stages = $("stages");
  stages.replaceChildren(...Object.entries(o.stages).map(([stage, c]) =>
    text("div", `stage ${stage}: ` + Object.entries(c).map(([k, n]) => `${n} ${k}`).join(", "))));
}

// --- the runs ------------------------------------------------------------------------------------

const FIRST = ["name", "stage", "status", "attempts", "duration", "slot", "node"];
const LAST = ["cause"];
const HIDDEN = new Set(["index", "started", "gpu_peak"]);

function columnsOf(runs) {
  const seen = new Set(["name", "status"]);  // a column no run on the page has a value in is left out
  for (const run of runs) for (const [key, value] of Object.entries(run)) if (value !== null && value !== undefined) seen.add(key);
  const middle = [...seen].filter((k) => !FIRST.includes(k) && !LAST.includes(k) && !HIDDEN.has(k));
  return [...FIRST.filter((k) => seen.has(k)), ...middle, ...LAST.filter((k) => seen.has(k))];
}

// What the table shows: it is built again only when that changes (or the best runs were ticked for
// the user). Built anew every second, it took a keyboard user's focus, and a click that came as it
// was replaced landed on a box the page had just made.
let shownRuns = "";

function drawRuns(page, ticked = false) {
  const shown = JSON.stringify([state.root, state.sort, state.desc, page]);
  if (shown === shownRuns && !ticked) return;
  shownRuns = shown;
  const runs = page.runs;
  const columns = columnsOf(runs);
  state.paramNames = columns.filter((c) => !FIRST.includes(c) && !LAST.includes(c) && !c.startsWith("result") && !c.startsWith("metrics."));
  state.metricNames = columns.filter((c) => c.startsWith("result.") || c.startsWith("metrics.")).map((c) => c.replace(/^(result|metrics)\./, ""));
  // What runs reported as they trained (their curves): metrics.loss, not the best-of column metrics.loss.min.
  const reported = columns.filter((c) => c.startsWith("metrics.")).map((c) => c.slice("metrics.".length));
  state.reportedNames = reported.filter((name) => !/\.(min|max)$/.test(name) || !reported.includes(name.replace(/\.(min|max)$/, "")));
  fillList("param-names", state.paramNames);
  fillList("metric-names", [...new Set(state.metricNames)]);
  const head = document.createElement("tr");
  head.appendChild(text("th", ""));
  for (const column of columns) {
    const th = text("th", column);
    th.dataset.key = column;
    if (state.sort === column) th.className = state.desc ? "sorted desc" : "sorted";
    th.addEventListener("click", () => {
      if (state.sort === column) state.desc = !state.desc; else { state.sort = column; state.desc = false; }
      state.offset = 0;
      refresh();
    });
    head.appendChild(th);
  }
  $("runs").tHead.replaceChildren(head);
  const rows = runs.map((run) => {
    const tr = document.createElement("tr");
    tr.className = run.status;
    tr.dataset.name = run.name;
    const box = document.createElement("input");
    box.type = "checkbox";
    box.checked = state.ticked.has(run.name);
    box.setAttribute("aria-label", `draw ${run.name}`);
    box.addEventListener("change", () => {
      if (box.checked) state.ticked.add(run.name); else state.ticked.delete(run.name);
      state.userTicked = true;
      drawCharts(true);
    });
    const first = document.createElement("td");
    first.appendChild(box);
    tr.appendChild(first);
    for (const column of columns) {
      let value = run[column];
      if (column === "duration") value = value === null || value === undefined ? "" : `${value.toFixed(1)}s`;
      const td = text("td", column === "duration" ? value : cell(value), column);
      if (column === "name") {
        td.replaceChildren(text("a", run.name));
        td.firstChild.addEventListener("click", () => openRun(run.name));
      }
      tr.appendChild(td);
    }
    return tr;
  });
  $("runs").tBodies[0].replaceChildren(...rows);
  const end = Math.min(page.offset + runs.length, page.total);
  $("page-info").textContent = page.total ? `${page.offset + 1}–${end} of ${page.total}` : "no run matches";
  $("prev").disabled = page.offset === 0;
  $("next").disabled = end >= page.total;
}

function fillList(id, names) {
  $(id).replaceChildren(...names.map((name) => { const o = document.createElement("option"); o.value = name; return o; }));
}

// --- one run -----------------------------------------------------------------------------------

async function openRun(name) {
  state.open = name;
  $("run").hidden = false;
  $("run-name").textContent = name;
  $("run-config").textContent = "";
  $("run-log").textContent = "";
  try {
    const detail = await get("/api/run", { name });
    // What made it (records/provenance.py: commit, dirty, diff hash, Python, packages, host, seed).
    $("run-config").textContent = JSON.stringify({ config: detail.config, result: resultOf(detail.run), metrics: detail.metrics, provenance: detail.provenance }, null, 1);
  } catch (error) {
    $("run-config").textContent = String(error.message);
  }
  await drawLog();
}

function resultOf(run) {
  const result = {};
  for (const [key, value] of Object.entries(run)) if (key === "result" || key.startsWith("result.")) result[key] = value;
  return result;
}

async function drawLog() {
  if (!state.open) return;
  const pre = $("run-log");
  const atEnd = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
  try {
    const log = await get("/api/log", { name: state.open });
    pre.textContent = log.log;
    $("log-state").textContent = log.status === "running" ? "(following)" : `(${log.status})`;
  } catch (error) {
    pre.textContent = String(error.message);
  }
  if (atEnd) pre.scrollTop = pre.scrollHeight;
}

// --- charts --------------------------------------------------------------------------------------

// What the charts show on opening: the metric the config's early_stop, search or pbt declares, else
// the first one of the runs' report lines (a result, for the parallel coordinates, when none reported
// any); and, where the config says which way is better, the best finished runs by it, ticked, until
// the user ticks runs of their own (where it does not, nothing is ticked as best). A choice the user
// typed is never replaced.
const BEST_TICKED = 5;

async function chooseDefaults(overview) {
  if (!state.charts) return false;
  const declared = (overview.declared || [])[0];
  if (!state.chosen) {
    const first = overview.first_reported;
    const reported = first && state.reportedNames.includes(first) ? first : state.reportedNames[0];
    const pcMetric = declared ? declared.metric : reported || state.metricNames[0];
    if (!pcMetric) return false;  // nothing reported yet: asked again at the next refresh
    state.chosen = true;
    const curveMetric = declared && state.reportedNames.includes(declared.metric) ? declared.metric : reported;
    if (!$("curve-by").value && state.paramNames[0]) $("curve-by").value = state.paramNames[0];
    if (curveMetric && !$("curve-metric").value) $("curve-metric").value = curveMetric;
    if (!$("pc-metric").value) {
      $("pc-metric").value = pcMetric;
      if (declared) $("pc-max").checked = declared.mode === "max";
    }
  }
  if (state.userTicked || state.ticked.size || !$("pc-metric").value) return false;
  const way = (overview.declared || []).find((d) => d.metric === $("pc-metric").value.trim());
  if (!way) return false;  // which way is better is not known: nothing is "the best"
  const best = await get("/api/parcoords", { metric: $("pc-metric").value.trim(), desc: $("pc-max").checked ? "1" : "0" });
  // The user may have ticked runs while it was asked (a loaded machine answers slowly): theirs
  // stand, and no default is added to them (it was, and a box they then clicked went off).
  if (state.userTicked || state.ticked.size) return false;
  best.runs.slice(0, BEST_TICKED).forEach((run) => state.ticked.add(run.name));
  return state.ticked.size > 0;
}

async function drawCharts(now) {
  if (!state.charts) return;
  const metric = $("curve-metric").value.trim();
  const by = $("curve-by").value.trim();
  const over = $("curve-over").value.trim();
  const names = [...state.ticked];
  if (metric && names.length && (now || state.tick % 5 === 0)) {
    // Each change (a box ticked, a field edited) asks again, and the answers may come back out of
    // order: only the latest question's answer is drawn (an earlier one, slower, drew the means of
    // runs no longer ticked over the ones asked for).
    const asked = (state.curvesAsked = (state.curvesAsked || 0) + 1);
    try {
      const data = await get("/api/curves", { metric, names: names.join("\n"), over });
      if (asked !== state.curvesAsked) return;
      if (data.groups) drawGroups(data, by); else drawCurves(data, by);
    } catch (error) { showError(error); }
  } else if (!names.length) {
    window.Plotly.purge($("curves"));
    $("schedules").hidden = true;
  }
  const pcMetric = $("pc-metric").value.trim();
  if (pcMetric && (now || state.tick % 5 === 0)) {
    try {
      drawParcoords(await get("/api/parcoords", { metric: pcMetric, desc: $("pc-max").checked ? "1" : "0" }));
    } catch (error) { showError(error); }
  }
  if (now || state.tick % 10 === 0) {
    try { drawPareto(await get("/api/pareto")); } catch (error) { showError(error); }
  }
  if (pcMetric && (now || state.tick % 30 === 0)) {  // a model of every run: less often than the rest
    try {
      drawImportance(await get("/api/importance", { metric: pcMetric, mode: $("pc-max").checked ? "max" : "min" }));
    } catch (error) { showError(error); }
  }
}

// Plotly reads its strings as pseudo-HTML (<b>, <a href>, <br>): a value is written with its
// <, > and & escaped, so that it shows as the text it is and never as a link or markup.
function plain(value) {
  // (Character classes: a report inlines this script, and writes every "</" in it as "<\/".)
  return String(value).replace(/[&]/g, "&amp;").replace(/[<]/g, "&lt;").replace(/[>]/g, "&gt;");
}

function drawCurves(data, by) {
  // A parameter every drawn run has at one value colours nothing apart: each run its own colour then.
  if (by && new Set(data.runs.map((r) => JSON.stringify(r.params[by]))).size < 2) by = "";
  const numbers = data.runs.map((r) => r.params[by]).filter((v) => typeof v === "number");
  const low = Math.min(...numbers), high = Math.max(...numbers);
  const traces = data.runs.map((run) => {
    const value = run.params[by];
    const position = typeof value === "number" && high > low ? (value - low) / (high - low) : 0.5;
    const color = by && value !== undefined ? `hsl(${Math.round(240 - 240 * position)}, 70%, 45%)` : undefined;
    const cut = run.status !== "succeeded" && run.status !== "running";
    return {
      x: run.steps, y: run.values, type: "scatter", mode: cut ? "lines+markers" : "lines",
      name: plain(by ? `${run.name} (${by}=${cell(value)})` : run.name),
      line: { color }, marker: { symbol: "x", size: run.steps.map((_, i) => (cut && i === run.steps.length - 1 ? 10 : 0)) },
    };
  });
  // Population-based training: a ring where a member's curve goes on from another member's weights.
  data.runs.forEach((run, i) => {
    const jumps = (run.lineage || []).filter((segment) => segment.donor);
    if (!jumps.length) return;
    const at = jumps.map((segment) => run.steps.findIndex((step) => step > segment.step)).filter((index) => index >= 0);
    traces.push({
      x: at.map((index) => run.steps[index]), y: at.map((index) => run.values[index]), type: "scatter", mode: "markers",
      marker: { symbol: "circle-open", size: 9, color: traces[i].line.color }, showlegend: false,
      text: jumps.map((segment) => plain(`${run.name} copied ${segment.donor} at step ${segment.step}`)), hoverinfo: "text",
    });
  });
  window.Plotly.react($("curves"), traces, { margin: { t: 10 }, xaxis: { title: { text: "step" } }, yaxis: { title: { text: plain(data.metric) } }, height: 360 }, { displaylogo: false });
  drawSchedules(data, traces);
}

// Population-based training: each ticked member's value of every key it changes, over the steps
// (a step line: the value it trained with from each copy on).
function drawSchedules(data, curveTraces) {
  const traces = [];
  data.runs.forEach((run, i) => {
    const lineage = run.lineage || [];
    if (!lineage.length) return;
    const last = Math.max(run.steps.length ? run.steps[run.steps.length - 1] : 0, lineage[lineage.length - 1].step);
    Object.keys(lineage[0].values).forEach((key) => {
      const x = lineage.map((segment) => segment.step).concat([last]);
      const y = lineage.map((segment) => segment.values[key]).concat([lineage[lineage.length - 1].values[key]]);
      traces.push({ x, y, type: "scatter", mode: "lines", line: { shape: "hv", color: curveTraces[i].line.color }, name: plain(`${run.name} ${key}`) });
    });
  });
  const positive = traces.every((trace) => trace.y.every((v) => typeof v === "number" && v > 0));
  $("schedules").hidden = !traces.length;
  if (!traces.length) { window.Plotly.purge($("schedules")); return; }
  window.Plotly.react($("schedules"), traces, { margin: { t: 10 }, xaxis: { title: { text: "step" } }, yaxis: { title: { text: "value (population-based training)" }, type: positive ? "log" : "linear" }, height: 300 }, { displaylogo: false });
}

// Runs that differ only in one parameter (the seed), as one mean curve each group with its 95 %
// band (the server's numbers: reports/status.mean_curves, as gts plot --over draws them).
function drawGroups(data, by) {
  const traces = [];
  data.groups.forEach((group, i) => {
    const color = `hsl(${Math.round((i * 137.5) % 360)}, 65%, 42%)`;
    // by, then every other parameter that differs between the groups (reports/status.group_label)
    const keys = [...new Set(data.groups.flatMap((g) => Object.keys(g.params)))];
    const differ = keys.filter((k) => k !== by && new Set(data.groups.map((g) => JSON.stringify(g.params[k]))).size > 1);
    const shown = by ? [by, ...differ] : differ.length ? differ : Object.keys(group.params);
    const label = shown.map((k) => `${k}=${cell(group.params[k])}`).join(", ") || "all runs";
    traces.push({ x: group.steps, y: group.low, type: "scatter", mode: "lines", line: { width: 0, color }, hoverinfo: "skip", showlegend: false });
    traces.push({ x: group.steps, y: group.high, type: "scatter", mode: "lines", line: { width: 0, color }, fill: "tonexty", fillcolor: color.replace("hsl", "hsla").replace(")", ", 0.2)"), hoverinfo: "skip", showlegend: false });
    traces.push({ x: group.steps, y: group.mean, type: "scatter", mode: "lines", line: { color, width: 2 }, name: plain(`${label} (n=${group.runs})`) });
  });
  const title = `${data.metric}, mean over ${data.over} (95 % band)`;
  window.Plotly.react($("curves"), traces, { margin: { t: 10 }, xaxis: { title: { text: "step" } }, yaxis: { title: { text: plain(title) } }, height: 360 }, { displaylogo: false });
  $("schedules").hidden = true;
}

// Plotly draws parallel coordinates with WebGL: where the browser has none, the page says so.
const WEBGL = (() => {
  try { const canvas = document.createElement("canvas"); return !!(canvas.getContext("webgl") || canvas.getContext("experimental-webgl")); } catch (error) { return false; }
})();

function drawParcoords(data) {
  $("parcoords-note").hidden = WEBGL;
  if (!WEBGL) return;
  if (!data.runs.length) { window.Plotly.purge($("parcoords")); return; }
  const dimensions = data.params.map((param) => {
    const values = data.runs.map((run) => run.params[param]);
    if (values.every((v) => typeof v === "number")) return { label: plain(param), values };
    const levels = [...new Set(values.map((v) => cell(v)))].sort();
    // (A parcoords axis writes its tick texts as plain text, unlike its label: not escaped.)
    return { label: plain(param), values: values.map((v) => levels.indexOf(cell(v))), tickvals: levels.map((_, i) => i), ticktext: levels };
  });
  const scores = data.runs.map((run) => run.value);
  dimensions.push({ label: plain(data.metric), values: scores });
  const trace = { type: "parcoords", line: { color: scores, colorscale: "Viridis", reversescale: !$("pc-max").checked, showscale: true }, dimensions };
  window.Plotly.react($("parcoords"), [trace], { margin: { t: 40, l: 60, r: 60 }, height: 380 }, { displaylogo: false });
}

// A search of several objectives: two of them as a scatter plot with the feasible runs' front as a
// line; more, as parallel coordinates of the feasible runs coloured by non-dominated rank (0: the front).
function drawPareto(data) {
  $("pareto-section").hidden = data.objectives.length < 2;
  if (data.objectives.length < 2) return;
  const names = data.objectives.map(([name, mode]) => `${name} (${mode})`);
  const front = data.runs.filter((r) => r.rank === 0);
  $("pareto-note").textContent = `${front.length} of ${data.runs.length} runs on the front of the feasible runs (gts results ROOT --pareto lists them); ${data.runs.filter((r) => !r.feasible).length} infeasible`;
  if (data.objectives.length === 2) {
    const trace = (runs, label, extra) => ({ type: "scatter", mode: "markers", x: runs.map((r) => r.values[0]), y: runs.map((r) => r.values[1]), text: runs.map((r) => plain(r.name)), hovertemplate: "%{text}<extra></extra>", name: label, ...extra });
    const line = front.slice().sort((a, b) => a.values[0] - b.values[0]);
    window.Plotly.react($("pareto"), [
      trace(data.runs.filter((r) => r.feasible && r.rank !== 0), "feasible", { marker: { size: 7 } }),
      trace(data.runs.filter((r) => !r.feasible), "infeasible", { marker: { size: 7, symbol: "x", color: "grey" } }),
      trace(line, "front", { mode: "lines+markers", marker: { size: 9, color: "crimson" }, line: { color: "crimson" } }),
    ], { margin: { t: 10 }, height: 380, xaxis: { title: { text: plain(names[0]) } }, yaxis: { title: { text: plain(names[1]) } } }, { displaylogo: false });
    return;
  }
  const ranked = data.runs.filter((r) => r.feasible);
  const dimensions = names.map((name, i) => ({ label: plain(name), values: ranked.map((r) => r.values[i]) }));
  const rank = ranked.map((r) => r.rank);
  window.Plotly.react($("pareto"), [{ type: "parcoords", line: { color: rank, colorscale: "Viridis", reversescale: true, showscale: true, colorbar: { title: { text: "0: front" } } }, dimensions }],
    { margin: { t: 40, l: 60, r: 60 }, height: 380 }, { displaylogo: false });
}

// The importance of each parameter (bars), and the metric over the two most important (a contour
// with each run as a dot) and along each (slices).
function drawImportance(data) {
  const charts = ["importance", "contour", "slices"].map((id) => $(id));
  if (data.problem) {
    $("importance-note").textContent = data.problem;
    charts.forEach((chart) => window.Plotly.purge(chart));
    return;
  }
  const constant = data.constant.length ? `; at one value in every run: ${data.constant.join(", ")}` : "";
  $("importance-note").textContent = `${data.evaluator === "fanova" ? "fANOVA" : "PED-ANOVA"} on ${data.runs} succeeded runs, ${data.metric} (${data.mode})${constant}`;
  const ranked = data.parameters.slice().reverse();
  window.Plotly.react(charts[0], [{ type: "bar", orientation: "h", x: ranked.map((p) => p.importance), y: ranked.map((p) => plain(p.name)), hovertemplate: "%{y}: %{x:.3f}<extra></extra>" }],
    // Every bar named: a category axis with a label at each (Plotly thins labels it finds crowded).
    { margin: { t: 10, l: 120 }, height: Math.max(140, 60 + 28 * ranked.length), xaxis: { title: { text: "importance" }, range: [0, 1] },
      yaxis: { type: "category", dtick: 1, automargin: true } }, { displaylogo: false });
  if (data.names.length < 2) { window.Plotly.purge(charts[1]); window.Plotly.purge(charts[2]); return; }
  const kinds = data.names.map((name) => (data.parameters.find((p) => p.name === name) || {}).kind || "");
  const axis = (i) => ({ title: { text: plain(data.names[i]) }, type: kinds[i] === "category" ? "category" : kinds[i].startsWith("log") ? "log" : "linear" });
  const shown = (v) => (typeof v === "string" ? plain(v) : v);
  const xs = data.points.map(([values]) => shown(values[0]));
  const ys = data.points.map(([values]) => shown(values[1]));
  const zs = data.points.map(([, value]) => value);
  const colours = { colorscale: "Viridis", reversescale: data.mode === "max" };
  window.Plotly.react(charts[1], [
    { type: "contour", x: xs, y: ys, z: zs, connectgaps: true, ...colours, colorbar: { title: { text: plain(data.metric) } }, hoverinfo: "skip" },
    { type: "scatter", mode: "markers", x: xs, y: ys, marker: { size: 6, color: "white", line: { width: 1, color: "black" } }, text: zs.map((z) => cell(z)), hovertemplate: "%{text}<extra></extra>", showlegend: false },
  ], { margin: { t: 10 }, height: 420, xaxis: axis(0), yaxis: axis(1) }, { displaylogo: false });
  window.Plotly.react(charts[2], [
    { type: "scatter", mode: "markers", x: xs, y: zs, marker: { size: 6 }, showlegend: false, xaxis: "x", yaxis: "y" },
    { type: "scatter", mode: "markers", x: ys, y: zs, marker: { size: 6 }, showlegend: false, xaxis: "x2", yaxis: "y2" },
  ], { margin: { t: 10 }, height: 320, xaxis: { ...axis(0), domain: [0, 0.45] }, xaxis2: { ...axis(1), domain: [0.55, 1], anchor: "y2" },
    yaxis: { title: { text: plain(data.metric) } }, yaxis2: { anchor: "x2" } }, { displaylogo: false });
}

// --- slots and GPUs ---------------------------------------------------------------------------

const COLOURS = { succeeded: "#2a9d4b", failed: "#c0392b", timed_out: "#e67e22", interrupted: "#888", pruned: "#7d3c98", paused: "#b7950b", running: "#1f6fb2", stale: "#bbb", blocked: "#555" };

function drawTimeline(data) {
  if (!state.charts) return;
  if (!data.runs.length) { window.Plotly.purge($("timeline")); return; }
  const lane = (run) => (run.node ? `${run.node} ${run.slot}` : run.slot);
  const byStatus = {};
  for (const run of data.runs) (byStatus[run.status] = byStatus[run.status] || []).push(run);
  const traces = Object.entries(byStatus).map(([status, runs]) => ({
    type: "bar", orientation: "h", name: plain(status), marker: { color: COLOURS[status] || "#999" },
    y: runs.map((r) => plain(lane(r))), base: runs.map((r) => r.start), x: runs.map((r) => Math.max(r.end - r.start, 0.001)),
    // A name is drawn inside its bar only where it fits (uniformtext below hides the others); every
    // bar names its run on hover.
    text: runs.map((r) => plain(r.name)), textposition: "inside", insidetextanchor: "middle",
    hovertemplate: "%{text}<br>%{base:.1f}s + %{x:.1f}s<extra>" + plain(status) + "</extra>",
  }));
  const lanes = new Set(data.runs.map(lane)).size;
  window.Plotly.react($("timeline"), traces, {
    barmode: "overlay", height: 80 + 28 * lanes, uniformtext: { mode: "hide", minsize: 9 }, margin: { t: 10, l: 110 }, xaxis: { title: { text: "seconds since the first of these runs started" } },
    yaxis: { type: "category", automargin: true }, showlegend: true,
  }, { displaylogo: false });
}

function bytes(n) {
  if (n === null || n === undefined) return "";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i += 1; }
  return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
}

function drawGpus(report) {
  $("gpus-note").textContent = report.problem ? `GPUs of this machine: ${report.problem}` : "";
  const head = document.createElement("tr");
  for (const name of ["GPU", "name", "used", "free", "total", "utilisation", "reserved by sweeps", "processes"]) head.appendChild(text("th", name));
  $("gpus").tHead.replaceChildren(...(report.gpus.length ? [head] : []));
  $("gpus").tBodies[0].replaceChildren(...report.gpus.map((gpu) => {
    const tr = document.createElement("tr");
    const processes = (gpu.processes || []).map((p) => `${p.pid} ${p.user || ""} ${bytes(p.used_memory)}${p.sweep ? ` (${p.sweep.run} of ${p.sweep.root})` : ""}`).join("; ");
    for (const value of [gpu.index, gpu.name, bytes(gpu.memory_used), bytes(gpu.memory_free), bytes(gpu.memory_total),
      gpu.utilization === null || gpu.utilization === undefined ? "" : `${gpu.utilization}%`, bytes(gpu.reserved_not_allocated), processes]) tr.appendChild(text("td", value));
    return tr;
  }));
}

// --- the loop --------------------------------------------------------------------------------

function showError(error) { $("error").textContent = error ? String(error.message || error) : ""; }

let busy = false;
async function refresh() {
  if (busy) return;
  busy = true;
  try {
    const overview = await get("/api/overview");
    drawOverview(overview);
    const params = { offset: String(state.offset), limit: String(state.limit), q: state.q, status: state.status };
    if (state.sort) { params.sort = state.sort; params.desc = state.desc ? "1" : "0"; }
    const page = await get("/api/runs", params);
    drawRuns(page);
    const ticked = await chooseDefaults(overview);
    if (ticked) drawRuns(page, true);  // the best runs' boxes, ticked
    await drawLog();
    await drawCharts(ticked);
    if (state.tick % 2 === 0) drawTimeline(await get("/api/timeline"));
    if (state.tick % 5 === 0) drawGpus(await get("/api/gpus"));
    if (!REPORT) $("updated").textContent = `updated ${new Date().toLocaleTimeString()}`;
    showError(null);
  } catch (error) {
    showError(error);
  } finally {
    busy = false;
    state.tick += 1;
  }
}

async function start() {
  const roots = REPORT ? { roots: [REPORT.root], charts: true } : await (await fetch("/api/roots", AUTH)).json();
  state.charts = Boolean(roots.charts && window.Plotly);
  $("no-charts").hidden = state.charts;
  $("root").replaceChildren(...roots.roots.map((root, i) => { const o = text("option", root); o.value = String(i); return o; }));
  $("root").addEventListener("change", () => {
    state.root = Number($("root").value); state.offset = 0; state.ticked.clear(); state.open = null; $("run").hidden = true;
    state.chosen = false; state.userTicked = false;
    for (const id of ["curve-metric", "curve-by", "curve-over", "pc-metric"]) $(id).value = "";
    refresh();
  });
  $("filter").addEventListener("input", () => { state.q = $("filter").value; state.offset = 0; refresh(); });
  $("status").addEventListener("change", () => { state.status = $("status").value; state.offset = 0; refresh(); });
  $("prev").addEventListener("click", () => { state.offset = Math.max(0, state.offset - state.limit); refresh(); });
  $("next").addEventListener("click", () => { state.offset += state.limit; refresh(); });
  $("close-run").addEventListener("click", () => { state.open = null; $("run").hidden = true; });
  for (const id of ["curve-metric", "curve-by", "curve-over", "pc-metric", "pc-max"]) $(id).addEventListener("change", () => drawCharts(true));
  if (REPORT) {  // drawn once, from the data in the page
    $("gpus").hidden = true;
    await refresh();
    const cut = REPORT.total > REPORT.runs.length ? ` (the first ${REPORT.runs.length} of ${REPORT.total} runs)` : "";
    $("updated").textContent = `report of ${REPORT.made}${cut}`;
    return;
  }
  await refresh();
  setInterval(refresh, 1000);
}

document.addEventListener("DOMContentLoaded", start);
