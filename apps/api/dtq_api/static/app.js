// dtq dashboard: a dependency-free single page over /api/v1, live through /api/v1/events.
"use strict";

const state = {
  token: sessionStorage.getItem("dtq-token") || "",
  tp: null,          // throughput buckets {start, bucket_s, buckets, series}: the history's
  range: "hour",     // the charts' span: a key of RANGES
  events: [],        // recent events, newest first
  sse: null,         // AbortController of the event stream
  refreshTimer: null,
  edited: false,     // a form in the view holds a change not yet submitted (see busy())
  tasksCursor: null,
  names: new Map(),  // task id -> task name, from every task list seen (events carry no name)
  lastEventId: null, // the stream id of the last event seen: a reconnect resumes after it
};
const $ = (sel, root = document) => root.querySelector(sel);
const view = () => $("#view");

function esc(v) {
  return String(v ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
}
function ago(s) {
  if (s == null) return "-";
  if (s < 120) return s.toFixed(1) + "s";
  if (s < 7200) return Math.round(s / 60) + "m";
  return (s / 3600).toFixed(1) + "h";
}
function when(iso) { return iso ? new Date(iso).toLocaleString() : "-"; }
function badge(text, cls) { return `<span class="badge ${esc(cls || text)}">${esc(text)}</span>`; }
function secs(s) {
  if (s == null) return "-";
  if (s < 1) return Math.round(s * 1000) + "ms";
  return ago(s);
}
// Run time: finished (or now, while running) minus started.
function runtime(t) {
  if (!t.started_at) return null;
  const end = t.finished_at ? Date.parse(t.finished_at) : Date.now();
  return Math.max(0, (end - Date.parse(t.started_at)) / 1000);
}
// A task's last progress report as a bar (or its message alone when it gave no total).
function progressBar(p) {
  if (!p) return "";
  const msg = p.message ? ` <span class="muted">${esc(p.message)}</span>` : "";
  if (!p.total) return `<span data-testid="progress">${esc(p.current)}${msg}</span>`;
  const pct = Math.max(0, Math.min(100, (100 * p.current) / p.total));
  return `<span class="progress" data-testid="progress"><progress max="100" value="${pct.toFixed(1)}">${pct.toFixed(0)}%</progress>
    ${esc(p.current)}/${esc(p.total)}${msg}</span>`;
}
function argsText(t) {
  const parts = (t.args || []).map((a) => JSON.stringify(a));
  for (const [k, v] of Object.entries(t.kwargs || {})) parts.push(`${k}=${JSON.stringify(v)}`);
  const text = parts.join(", ");
  return text.length > 60 ? text.slice(0, 59) + "…" : text;
}
function remember(items) { for (const t of items) if (t && t.id) state.names.set(t.id, t.name); }

function flash(msg, isError) {
  const f = $("#flash");
  f.textContent = msg;
  f.className = isError ? "error" : "";
  f.hidden = false;
  clearTimeout(flash.t);
  flash.t = setTimeout(() => { f.hidden = true; }, 4000);
}

// --- API --------------------------------------------------------------------------------------

let tokenPrompt = null;
function askToken(refused) {
  if (tokenPrompt) return tokenPrompt;
  const dlg = $("#token-dialog");
  $("#token-error").hidden = !refused;
  tokenPrompt = new Promise((resolve) => {
    $("#token-form").onsubmit = (ev) => {
      ev.preventDefault();
      state.token = $("#token-input").value.trim();
      sessionStorage.setItem("dtq-token", state.token);
      dlg.close();
      tokenPrompt = null;
      resolve();
      startEvents();
    };
  });
  if (!dlg.open) dlg.showModal();
  $("#token-input").focus();
  return tokenPrompt;
}

async function api(path, opts = {}) {
  const headers = { Accept: "application/json" };
  if (opts.body !== undefined) headers["Content-Type"] = "application/json";
  if (state.token) headers.Authorization = "Bearer " + state.token;
  const r = await fetch("/api/v1" + path, {
    method: opts.method || "GET", headers,
    body: opts.body === undefined ? undefined : JSON.stringify(opts.body),
  });
  if (r.status === 401) {
    await askToken(Boolean(state.token));
    return api(path, opts);
  }
  const isJson = (r.headers.get("content-type") || "").includes("json");
  const body = isJson ? await r.json() : null;
  if (!r.ok) throw new Error((body && body.error && body.error.message) || r.statusText);
  return body;
}

// Each listing request does bounded work server-side, so a filtered page can come back short
// (even empty) with a next_cursor: follow it a few times to fill the page.
async function fillPage(path, params, limit, maxCalls = 10) {
  const q = new URLSearchParams(params);
  let page = await api(path + "?" + q);
  const items = [...page.items];
  for (let i = 1; i < maxCalls && page.next_cursor && items.length < limit; i++) {
    q.set("cursor", page.next_cursor);
    q.set("limit", String(limit - items.length));
    page = await api(path + "?" + q);
    items.push(...page.items);
  }
  return { items, next_cursor: page.next_cursor };
}

function confirmAction(text) {
  const dlg = $("#confirm-dialog");
  $("#confirm-text").textContent = text;
  return new Promise((resolve) => {
    dlg.onclose = () => resolve(dlg.returnValue === "ok");
    dlg.returnValue = "cancel";
    dlg.showModal();
  });
}

async function act(label, fn, confirmText) {
  if (confirmText && !(await confirmAction(confirmText))) return;
  try {
    await fn();
    flash(label);
  } catch (e) {
    flash(label + " failed: " + e.message, true);
  }
  await render();
}

// --- live events ------------------------------------------------------------------------------

// EventSource cannot send an Authorization header, so the stream is read with fetch.
async function startEvents() {
  if (state.sse) state.sse.abort();
  const ctl = new AbortController();
  state.sse = ctl;
  const live = $("#live");
  try {
    const headers = { Accept: "text/event-stream" };
    if (state.token) headers.Authorization = "Bearer " + state.token;
    if (state.lastEventId) headers["Last-Event-ID"] = state.lastEventId;  // resume, not restart
    const r = await fetch("/api/v1/events", { headers, signal: ctl.signal });
    if (r.status === 401) { live.className = "badge off"; live.textContent = "offline"; return; }
    live.className = "badge live"; live.textContent = "live";
    const reader = r.body.getReader();
    const dec = new TextDecoder();
    let buf = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += dec.decode(value, { stream: true });
      let cut;
      while ((cut = buf.indexOf("\n\n")) >= 0) {
        const msg = buf.slice(0, cut);
        buf = buf.slice(cut + 2);
        const lines = msg.split("\n");
        const data = lines.filter((l) => l.startsWith("data: ")).map((l) => l.slice(6)).join("\n");
        const id = lines.find((l) => l.startsWith("id: "));
        if (id) state.lastEventId = id.slice(4);
        if (data && !msg.startsWith("event: error")) onEvent(JSON.parse(data));
      }
    }
  } catch (e) {
    if (ctl.signal.aborted) return;
  }
  live.className = "badge off"; live.textContent = "offline";
  if (state.sse === ctl) setTimeout(startEvents, 3000);
}

function onEvent(ev) {
  // Progress reports of one task fold into one line: its latest report and how many came.
  let folded = 1;
  if (ev.type === "progress") {
    const i = state.events.findIndex((e) => e.type === "progress" && e.task_id === ev.task_id);
    if (i >= 0) folded += state.events.splice(i, 1)[0].folded || 1;
  }
  state.events.unshift({ ...ev, folded });
  state.events.length = Math.min(state.events.length, 200);
  const tp = state.tp;
  if (tp && tp.series[ev.type]) {
    const start = Date.parse(tp.start);
    let i = Math.floor((ev.ts_ms - start) / (tp.bucket_s * 1000));
    while (i >= tp.buckets.length) {  // time moved on: slide the window
      tp.buckets.push(new Date(start + tp.buckets.length * tp.bucket_s * 1000).toISOString());
      for (const k in tp.series) tp.series[k].push(0);
    }
    if (i >= 0) tp.series[ev.type][i] += 1;
  }
  scheduleRefresh();
}

// A live refresh waits while the user is in a dialog or a form: it would wipe what they type,
// or a filter they chose and have not applied yet (the focus may have left the form since).
function busy() {
  return state.edited || $("#confirm-dialog").open || $("#token-dialog").open
    || (document.activeElement && ["INPUT", "SELECT"].includes(document.activeElement.tagName))
    || $("details.enqueue[open]") || ($("#task-lookup input") && $("#task-lookup input").value);
}

function scheduleRefresh() {
  if (state.refreshTimer) return;
  state.refreshTimer = setTimeout(() => {
    state.refreshTimer = null;
    if (!busy()) render(true);
  }, 1000);
}

// --- charts -----------------------------------------------------------------------------------

// Hand-written on purpose: two small line charts of at most a few hundred points. The kept
// libraries that would do it (uPlot, Chart.js) are npm packages; the wheel has no build step and
// the page loads no CDN, so one would be a vendored copy to keep current for ~40 lines here.
// x axis: bucket start times (times[i], ISO); y axis: 0 and the max, formatted by opts.fmt.
function lineChart(series, colors, opts = {}) {
  const W = 600, H = 200, L = 40, R = 12, T = 10, B = 26;
  const n = Math.max(...series.map((s) => s.length), 2);
  const max = opts.max ?? Math.max(1e-9, ...series.flat());
  const x = (i) => L + (i * (W - L - R)) / (n - 1);
  const y = (v) => H - B - (v / max) * (H - B - T);
  const fmt = opts.fmt || ((v) => String(v));
  let svg = `<svg viewBox="0 0 ${W} ${H}" role="img" aria-label="${esc(opts.label || "chart")}">`;
  for (const f of [0, 0.5, 1]) {
    svg += `<line x1="${L}" y1="${y(max * f)}" x2="${W - R}" y2="${y(max * f)}" stroke="${f ? "#eef0f4" : "#ccd"}"/>`;
    svg += `<text x="${L - 4}" y="${y(max * f) + 3}" font-size="10" fill="#888" text-anchor="end">${esc(fmt(max * f))}</text>`;
  }
  const times = opts.times || [];
  const ticks = Math.min(5, times.length);
  for (let k = 0; k < ticks; k++) {
    const i = Math.round((k * (times.length - 1)) / Math.max(1, ticks - 1));
    const label = new Date(times[i]).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
    const anchor = k === 0 ? "start" : k === ticks - 1 ? "end" : "middle";
    svg += `<line x1="${x(i)}" y1="${H - B}" x2="${x(i)}" y2="${H - B + 4}" stroke="#ccd"/>`;
    svg += `<text class="tick" x="${x(i)}" y="${H - 8}" font-size="10" fill="#888" text-anchor="${anchor}">${esc(label)}</text>`;
  }
  series.forEach((s, k) => {
    const pts = s.map((v, i) => `${x(i).toFixed(1)},${y(v).toFixed(1)}`).join(" ");
    svg += `<polyline fill="none" stroke="${colors[k]}" stroke-width="2" points="${pts}"/>`;
  });
  return svg + "</svg>";
}

// The charts' spans: [minutes, minutes per bucket] of GET /api/v1/stats (the history kept in
// Redis, so the charts survive restarts of the API, the workers and the browser).
const RANGES = { hour: [60, 1], day: [1440, 15], week: [10080, 60] };

async function loadHistory() {
  const [minutes, step] = RANGES[state.range];
  const rows = await api(`/stats?minutes=${minutes}&step=${step}`);
  const series = {};
  for (const k of ["succeeded", "failed", "retried", "enqueued", "p95"]) series[k] = rows.map((r) => r[k] ?? 0);
  state.tp = { start: rows.length ? rows[0].minute : new Date().toISOString(), bucket_s: step * 60, buckets: rows.map((r) => r.minute), series };
}

function charts() {
  const tp = state.tp;
  if (!tp) return "";
  const ok = tp.series.succeeded, bad = tp.series.failed, retried = tp.series.retried;
  const rate = ok.map((v, i) => {
    const total = v + bad[i] + retried[i];
    return total ? (bad[i] + retried[i]) / total : 0;
  });
  const per = (xs) => xs.map((v) => v / tp.bucket_s);
  const range = Object.keys(RANGES).map((r) => `<button data-act="range" data-range="${r}" class="${r === state.range ? "primary" : ""}">last ${r}</button>`).join(" ");
  return `<div class="range" data-testid="chart-range">${range}</div>
  <div class="charts">
    <div class="chart" data-testid="throughput-chart"><h3>Throughput (runs/s, ${tp.bucket_s / 60} min buckets)</h3>
      ${lineChart([per(ok), per(bad), per(retried)], ["#1a8f4c", "#c93434", "#b7791f"], { fmt: (v) => v.toFixed(1), times: tp.buckets, label: "throughput" })}
      <div class="legend"><span style="color:#1a8f4c">■ succeeded</span><span style="color:#c93434">■ failed</span><span style="color:#b7791f">■ retried</span></div></div>
    <div class="chart" data-testid="failure-chart"><h3>Failure rate (failed + retried / finished)</h3>
      ${lineChart([rate], ["#c93434"], { max: 1, fmt: (v) => (v * 100).toFixed(0) + "%", times: tp.buckets, label: "failure rate" })}
      <div class="legend"><span style="color:#c93434">■ failure rate</span></div></div>
    <div class="chart" data-testid="runtime-chart"><h3>Run time p95 (s, at most)</h3>
      ${lineChart([tp.series.p95], ["#3559b7"], { fmt: (v) => v.toPrecision(2), times: tp.buckets, label: "run time p95" })}
      <div class="legend"><span style="color:#3559b7">■ p95</span></div></div>
  </div>`;
}

// --- views ------------------------------------------------------------------------------------

// Sections appended to the task detail, each a function (task) -> HTML: a flow tree view, for
// one, registers itself here (taskDetailExtras.push(renderFlowTree)).
const taskDetailExtras = [];

function enqueueForm(queues) {
  const names = [...new Set([...state.names.values()])].sort();
  return `<form id="enqueue-form" class="stack">
    <label>task name <input name="name" list="task-names" required placeholder="e.g. reports.build"></label>
    <datalist id="task-names">${names.map((n) => `<option value="${esc(n)}">`).join("")}</datalist>
    <label>queue <input name="queue" list="queue-names" placeholder="the task's own"></label>
    <datalist id="queue-names">${queues.map((q) => `<option value="${esc(q.name)}">`).join("")}</datalist>
    <label>args (JSON list) <input name="args" value="[]"></label>
    <label>kwargs (JSON object) <input name="kwargs" value="{}"></label>
    <label>priority (0-9) <input name="priority" type="number" min="0" max="9"></label>
    <label>delay (s) <input name="delay" type="number" min="0" step="any"></label>
    <p class="error" id="enqueue-error" hidden></p>
    <button class="primary" type="submit">Enqueue</button>
  </form>`;
}

function eventLine(e) {
  const name = e.task_id && state.names.get(e.task_id);
  const who = e.task_id
    ? `<a href="#task/${encodeURIComponent(e.task_id)}">${name ? `<b>${esc(name)}</b> ` : ""}<code>${esc(e.task_id)}</code></a>`
    : esc(e.worker || e.queue || "");
  let detail = "";
  if (e.type === "progress") {
    try { detail = " " + progressBar(JSON.parse(e.detail)); } catch { detail = ""; }
    if (e.folded > 1) detail += ` <span class="muted" data-testid="folded">×${e.folded}</span>`;
  }
  return `<li>${esc(new Date(e.ts_ms).toLocaleTimeString())} ${badge(e.type, e.type)} ${who}${e.attempt ? " attempt " + e.attempt : ""}${detail}</li>`;
}

const views = {
  async overview(quiet) {
    const [qs, ws, recent] = await Promise.all([api("/queues"), api("/workers"), api("/tasks?limit=200")]);
    remember(recent.items); remember(recent.running);
    if (!state.tp || !quiet) await loadHistory();
    const sum = (k) => qs.items.reduce((a, q) => a + q[k], 0);
    const live = ws.items.filter((w) => w.live).length;
    const card = (n, l, id) => `<div class="card" data-testid="${id}"><div class="num">${n}</div><div class="lbl">${l}</div></div>`;
    return `<h2>Overview</h2>
      <div class="cards">
        ${card(sum("queued"), "waiting", "stat-queued")}${card(sum("running"), "running", "stat-running")}
        ${card(sum("scheduled"), "scheduled", "stat-scheduled")}${card(sum("dlq"), "dead letters", "stat-dlq")}
        ${card(live, "live workers", "stat-live")}${card(ws.items.length - live, "stale workers", "stat-stale")}
      </div>
      ${charts()}
      <h3>Queue depths</h3>
      <div class="scroll"><table><tr><th>queue</th><th>waiting</th><th>running</th><th>scheduled</th><th>dead letters</th><th>oldest waiting</th></tr>
      ${qs.items.map((q) => `<tr><td>${esc(q.name)} ${q.paused ? badge("paused") : ""}</td><td>${q.queued}</td><td>${q.running}</td><td>${q.scheduled}</td><td>${q.dlq}</td><td>${ago(q.oldest_waiting_age_s)}</td></tr>`).join("")}
      </table></div>
      <h3>Recent events</h3>
      <ul class="events" data-testid="events">${state.events.slice(0, 50).map(eventLine).join("") || '<li class="muted">waiting for events…</li>'}</ul>`;
  },

  async queues() {
    const qs = await api("/queues");
    const rows = qs.items.map((q) => {
      const bands = Object.entries(q.depth).filter(([, n]) => n).map(([p, n]) => `p${p}:${n}`).join(" ") || "-";
      return `<tr data-queue="${esc(q.name)}"><td>${esc(q.name)}</td>
        <td>${q.paused ? badge("paused") : badge("active", "ok")}</td>
        <td>${q.queued}</td><td class="muted">${bands}</td><td>${q.running}</td><td>${q.scheduled}</td><td>${q.dlq}</td>
        <td>${ago(q.oldest_waiting_age_s)}</td>
        <td><a href="#groups/${encodeURIComponent(q.name)}" data-testid="groups-link">${q.active_groups ?? 0}</a></td>
        <td>${q.paused ? `<button data-act="resume">Resume</button>` : `<button data-act="pause">Pause</button>`}
            <button data-act="purge" class="danger">Purge</button></td></tr>`;
    }).join("");
    return `<h2>Queues</h2><div class="scroll"><table data-testid="queues-table"><tr><th>queue</th><th>state</th><th>waiting</th><th>by priority</th><th>running</th><th>scheduled</th><th>dead letters</th><th>oldest</th><th>groups</th><th></th></tr>${rows}</table></div>`;
  },

  // One queue's fair groups (docs/groups.md): #groups/<queue>[?cursor=...], a page at a time.
  async groups() {
    const [path, query] = location.hash.slice("#groups/".length).split("?");
    const q = decodeURIComponent(path);
    const cursor = new URLSearchParams(query || "").get("cursor");
    const page = await api(`/queues/${encodeURIComponent(q)}/groups?limit=100`
      + (cursor ? "&cursor=" + encodeURIComponent(cursor) : ""));
    const rows = page.items.map((g) => `<tr data-group="${esc(g.group)}">
        <td>${g.group ? esc(g.group) : '<span class="muted">(ungrouped)</span>'}</td>
        <td>${g.paused ? badge("paused") : badge("active", "ok")}</td>
        <td>${g.waiting}</td><td>${g.running}</td><td>${ago(g.oldest_waiting_s)}</td>
        <td>${!g.group ? "" : g.paused ? `<button data-act="resume-group">Resume</button>` : `<button data-act="pause-group">Pause</button>`}</td></tr>`).join("");
    const more = page.next_cursor
      ? `<p><a href="#groups/${encodeURIComponent(q)}?cursor=${encodeURIComponent(page.next_cursor)}" data-testid="groups-next">next page</a></p>` : "";
    return `<h2>Groups of ${esc(q)}</h2><p><a href="#queues">All queues</a></p>
      <div class="scroll"><table data-testid="groups-table" data-gqueue="${esc(q)}"><tr><th>group</th><th>state</th><th>waiting</th><th>running</th><th>oldest waiting</th><th></th></tr>
      ${rows || '<tr><td colspan="6" class="muted">no active or paused group</td></tr>'}</table></div>${more}`;
  },

  async tasks() {
    const p = new URLSearchParams(location.hash.split("?")[1] || "");
    const qs = await api("/queues");
    const params = new URLSearchParams();
    for (const k of ["queue", "status", "name"]) if (p.get(k)) params.set(k, p.get(k));
    params.set("limit", "50");
    if (p.get("cursor")) params.set("cursor", p.get("cursor"));
    // Newest first from the server's index; the first page also lists every running task.
    const first = await api("/tasks?" + params);
    const page = first.items.length < 50 && first.next_cursor
      ? await fillPage("/tasks", new URLSearchParams({ ...Object.fromEntries(params), cursor: first.next_cursor }), 50 - first.items.length)
      : { items: [], next_cursor: first.next_cursor };
    const items = [...first.items, ...page.items];
    remember(items); remember(first.running || []);
    const opt = (v, cur) => `<option ${v === cur ? "selected" : ""} value="${esc(v)}">${esc(v || "any")}</option>`;
    const statuses = ["", "queued", "scheduled", "running", "succeeded", "failed", "cancelled", "expired"];
    const row = (t) => `<tr class="click" data-task="${esc(t.id)}"><td class="hide-narrow"><code>${esc(t.id)}</code></td><td>${esc(t.name)}</td>
       <td>${badge(t.status)} ${progressBar(t.status === "running" ? t.progress : null)}</td>
       <td class="hide-narrow"><code>${esc(argsText(t))}</code></td><td>${t.attempt}</td>
       <td class="hide-narrow">${when(t.enqueued_at)}</td><td>${secs(runtime(t))}</td>
       <td class="err hide-narrow">${esc((t.error || "").slice(0, 120))}</td></tr>`;
    const head = `<tr><th class="hide-narrow">id</th><th>name</th><th>status</th><th class="hide-narrow">args</th><th>attempt</th><th class="hide-narrow">enqueued</th><th>runtime</th><th class="hide-narrow">error</th></tr>`;
    const running = (first.running || []);
    const runningTable = p.get("cursor") ? "" : `<h3>Running now (${running.length})</h3>
      <div class="scroll"><table data-testid="running-table">${head}${running.map(row).join("") || '<tr><td colspan="8" class="muted">nothing running</td></tr>'}</table></div>`;
    const next = page.next_cursor ? `<p><a data-testid="next-page" href="#tasks?${new URLSearchParams({ ...Object.fromEntries(params), cursor: page.next_cursor })}">Older →</a></p>` : "";
    return `<h2>Tasks</h2>
      <div class="toolbar">
        <form class="filters" id="task-lookup">
          <label>task id <input name="task_id" placeholder="queue:id" required></label>
          <button type="submit">Open</button>
        </form>
        <details class="enqueue"><summary>Enqueue a task</summary>${enqueueForm(qs.items)}</details>
      </div>
      <form class="filters" id="task-filters">
        <label>queue <select name="queue">${["", ...qs.items.map((q) => q.name)].map((v) => opt(v, p.get("queue") || "")).join("")}</select></label>
        <label>status <select name="status">${statuses.map((v) => opt(v, p.get("status") || "")).join("")}</select></label>
        <label>name <input name="name" value="${esc(p.get("name") || "")}" placeholder="task name"></label>
        <button class="primary" type="submit">Filter</button>
      </form>
      ${runningTable}
      <h3>Newest first</h3>
      <div class="scroll"><table data-testid="tasks-table">${head}${items.map(row).join("") || '<tr><td colspan="8" class="muted">no tasks</td></tr>'}</table></div>${next}`;
  },

  async task() {
    const id = decodeURIComponent(location.hash.slice("#task/".length));
    const t = await api("/tasks/" + encodeURIComponent(id) + "?history=true");
    const field = (k, v) => `<dt>${k}</dt><dd>${v}</dd>`;
    const canCancel = ["queued", "scheduled", "running"].includes(t.status);
    const canRetry = ["failed", "cancelled", "expired"].includes(t.status);
    remember([t]);
    return `<h2>Task <code>${esc(t.id)}</code> ${badge(t.status)}</h2>
      <div class="actions">
        ${canCancel ? '<button data-act="cancel" class="danger">Cancel</button>' : ""}
        ${canRetry ? '<button data-act="retry" class="primary">Retry</button>' : ""}
        <a href="#tasks">← all tasks</a>
      </div>
      <dl class="fields" data-testid="task-fields">
        ${field("name", esc(t.name))}${field("queue", esc(t.queue))}${field("status", badge(t.status))}
        ${field("priority", t.priority)}${field("attempt", t.attempt)}${field("failures", t.failures ?? t.retries)}${field("retries left", `${t.retries_left ?? Math.max(0, t.max_retries - t.retries)} of ${t.max_retries}`)}
        ${field("requeues", t.requeues ?? 0)}${field("worker", esc(t.worker_id || "-"))}
        ${field("enqueued", when(t.enqueued_at))}${field("started", when(t.started_at))}${field("finished", when(t.finished_at))}
        ${field("runtime", `<span data-testid="task-runtime">${secs(runtime(t))}</span>`)}
        ${t.progress ? field("progress", progressBar(t.progress)) : ""}
        ${field("args", `<pre>${esc(JSON.stringify(t.args, null, 1))}</pre>`)}
        ${field("kwargs", `<pre>${esc(JSON.stringify(t.kwargs, null, 1))}</pre>`)}
        ${field("result", `<pre data-testid="task-result">${esc(JSON.stringify(t.result, null, 1))}</pre>`)}
        ${field("error", `<span class="error" data-testid="task-error">${esc(t.error || "-")}</span>`)}
        ${t.traceback ? field("traceback", `<pre class="traceback" data-testid="task-traceback">${esc(t.traceback)}</pre>`) : ""}
      </dl>
      ${t.steps ? renderFlowTree(t) : ""}
      <h3>Attempt history</h3>
      <div class="scroll"><table data-testid="history"><tr><th>time</th><th>event</th><th>attempt</th><th>worker</th><th>detail</th></tr>
        ${(t.history || []).map((e) => `<tr><td>${when(e.ts)}</td><td>${badge(e.type, e.type)}</td><td>${e.attempt ?? ""}</td><td>${esc(e.worker || "")}</td><td class="muted">${esc(e.detail)}</td></tr>`).join("")}
      </table></div>
      ${taskDetailExtras.map((f) => f(t)).join("")}`;
  },

  async dlq() {
    const p = new URLSearchParams(location.hash.split("?")[1] || "");
    const params = new URLSearchParams({ limit: "100" });
    for (const k of ["queue", "name", "error"]) if (p.get(k)) params.set(k, p.get(k));
    const page = await fillPage("/dlq", params, 100);
    const rows = page.items.map((d) => `<tr data-task="${esc(d.task_id)}">
      <td><a href="#task/${encodeURIComponent(d.task_id)}"><code>${esc(d.task_id)}</code></a></td><td>${esc(d.name)}</td>
      <td>${when(d.failed_at)}</td><td>${d.attempt}</td><td class="err">${esc(d.error || "")}</td>
      <td><button data-act="requeue" class="primary">Requeue</button> <button data-act="discard" class="danger">Discard</button></td></tr>`).join("");
    return `<h2>Dead letters</h2>
      <form class="filters" id="dlq-filters">
        <label>queue <input name="queue" value="${esc(p.get("queue") || "")}"></label>
        <label>name <input name="name" value="${esc(p.get("name") || "")}"></label>
        <label>error contains <input name="error" value="${esc(p.get("error") || "")}"></label>
        <button class="primary" type="submit">Filter</button>
        <button type="button" data-act="requeue-all">Requeue all matching</button>
        <button type="button" data-act="discard-all" class="danger">Discard all matching</button>
      </form>
      <div class="scroll"><table data-testid="dlq-table"><tr><th>task</th><th>name</th><th>failed</th><th>attempts</th><th>last error</th><th></th></tr>${rows || '<tr><td colspan="6" class="muted">no dead letters</td></tr>'}</table></div>`;
  },

  async workers() {
    const [ws, tasks] = await Promise.all([api("/workers"), api("/tasks?status=running&limit=1")]);
    const byWorker = new Map();
    for (const t of tasks.running || []) {
      if (!byWorker.has(t.worker_id)) byWorker.set(t.worker_id, []);
      byWorker.get(t.worker_id).push(t);
    }
    const inflight = (w) => (byWorker.get(w.worker_id) || []).map((t) =>
      `<li data-inflight="${esc(t.id)}"><a href="#task/${encodeURIComponent(t.id)}"><b>${esc(t.name)}</b> <code>${esc(t.id)}</code></a> ${secs(runtime(t))} ${progressBar(t.progress)}</li>`).join("");
    const uptime = (w) => w.started_at ? ago((Date.now() - Date.parse(w.started_at)) / 1000) : "-";
    const rows = ws.items.map((w) => `<tr data-worker="${esc(w.worker_id)}"><td>${esc(w.worker_id)}</td>
      <td>${w.live ? badge("live") : badge("stale")}</td><td>${esc(w.status)}</td>
      <td data-testid="uptime">${uptime(w)}</td>
      <td>${ago(w.heartbeat_age_s)}</td><td>${w.active_tasks} / ${w.concurrency ?? "?"}
        <ul class="inflight" data-testid="inflight">${inflight(w)}</ul></td>
      <td class="hide-narrow">${esc(w.queues.join(", "))}</td><td class="hide-narrow">${esc(w.hostname)} ${w.pid ? "pid " + w.pid : ""}</td>
      <td>${w.tasks_processed ?? 0}</td><td>${w.tasks_failed ?? 0}</td></tr>`).join("");
    return `<h2>Workers</h2><p class="muted">Stale when the last heartbeat is older than 3 heartbeat intervals.</p>
      <div class="scroll"><table data-testid="workers-table"><tr><th>worker</th><th>liveness</th><th>status</th><th>uptime</th><th>heartbeat age</th><th>in flight</th><th class="hide-narrow">queues</th><th class="hide-narrow">host</th><th>done</th><th>failed</th></tr>${rows || '<tr><td colspan="10" class="muted">no workers</td></tr>'}</table></div>`;
  },

  async schedules() {
    const s = await api("/schedules");
    const periodic = s.schedules.map((x) => `<tr data-schedule="${esc(x.name)}" data-squeue="${esc(x.queue)}"><td>${esc(x.name)}</td><td>${esc(x.queue)}</td><td>${esc(x.task)}</td>
      <td><code>${esc(x.cron || (x.every ? "every " + x.every + "s" : ""))}</code> ${esc(x.tz || "")}</td>
      <td>${x.enabled === false ? badge("disabled", "paused") : when(x.next_fire_at)}</td>
      <td>${x.last_task_id ? `<a href="#task/${encodeURIComponent(x.last_task_id)}"><code>${esc(x.last_task_id)}</code></a>` : "-"}</td>
      <td><button data-act="run-schedule" class="primary">Run now</button>
        ${x.enabled === false ? '<button data-act="enable-schedule">Enable</button>' : '<button data-act="disable-schedule">Disable</button>'}</td></tr>`).join("");
    const delayed = s.scheduled_tasks.map((d) => `<tr class="click" data-task="${esc(d.task_id)}"><td><code>${esc(d.task_id)}</code></td>
      <td>${esc(d.name)}</td><td>${badge(d.kind, "scheduled")}</td><td>${when(d.due_at)}</td></tr>`).join("");
    return `<h2>Schedules</h2>
      <h3>Periodic schedules (next fires)</h3>
      <div class="scroll"><table data-testid="periodic-table"><tr><th>schedule</th><th>queue</th><th>task</th><th>when</th><th>next fire</th><th>last task</th><th></th></tr>${periodic || '<tr><td colspan="7" class="muted">none</td></tr>'}</table></div>
      <h3>Delayed tasks and retries</h3>
      <div class="scroll"><table data-testid="delayed-table"><tr><th>task</th><th>name</th><th>kind</th><th>due</th></tr>${delayed || '<tr><td colspan="4" class="muted">none</td></tr>'}</table></div>`;
  },
};

// --- wiring -----------------------------------------------------------------------------------

// --- workflows (docs/workflows.md): a flow's shape with each step's status -----------------
// `t.tree` is {"chain"|"group"|"chord": [...]} with step indices at the leaves; `t.steps[i]`
// is {index, id, name, status}. Each step links to its own task page.
function renderFlowTree(t) {
  const steps = t.steps || [];
  const leaf = (i) => {
    const s = steps[i] || { index: i, id: "", name: "?", status: "waiting" };
    const link = s.id ? `<a href="#task/${encodeURIComponent(s.id)}"><code>${esc(s.id)}</code></a>` : "";
    return `<li class="flow-step" data-step="${esc(s.index)}" data-status="${esc(s.status)}">
      <span class="muted">[${esc(s.index)}]</span> <b>${esc(s.name)}</b> ${badge(s.status)} ${link}</li>`;
  };
  const node = (n) => {
    if (typeof n === "number") return leaf(n);
    if (!n || typeof n !== "object") return "";
    const kind = Object.keys(n)[0];
    const kids = Array.isArray(n[kind]) ? n[kind] : [];
    return `<li class="flow-node"><span class="flow-kind">${esc(kind)}</span>
      <ul>${kids.map(node).join("")}</ul></li>`;
  };
  const tree = t.tree != null ? t.tree : { chain: steps.map((s) => s.index) };
  return `<h3>Workflow steps</h3>
    <ul class="flow-tree" data-testid="flow-tree">${node(tree)}</ul>`;
}

function currentView() {
  const h = location.hash.slice(1) || "overview";
  if (h.startsWith("groups/")) return "groups";
  return h.startsWith("task/") ? "task" : h.split("?")[0];
}

let renderSeq = 0;
async function render(quiet) {
  const name = currentView();
  const fn = views[name] || views.overview;
  const tab = name === "groups" ? "queues" : name;  // a queue's groups: under Queues
  document.querySelectorAll("nav a").forEach((a) => a.classList.toggle("active", a.dataset.view === tab));
  const seq = ++renderSeq;
  const hash = location.hash.slice(1) || "overview";
  try {
    const html = await fn(quiet);
    if (quiet && busy()) return;  // checked again: the user may have started typing meanwhile
    if (seq === renderSeq) {
      view().innerHTML = html;
      if (!quiet) state.edited = false;  // the user's move (a submit, a link): a fresh form
      view().dataset.view = name;
      view().dataset.rendered = hash;  // the state a test waits on, instead of a time
    }
  } catch (e) {
    if (seq === renderSeq) view().innerHTML = `<p class="error">Could not load: ${esc(e.message)}</p>`;
  }
}

document.addEventListener("click", (ev) => {
  const btn = ev.target.closest("button[data-act]");
  const row = ev.target.closest("tr[data-task]");
  if (btn) {
    const act_ = btn.dataset.act;
    const q = btn.closest("tr[data-queue]")?.dataset.queue;
    const grow = btn.closest("tr[data-group]");
    const gpath = grow ? `/queues/${encodeURIComponent(btn.closest("table[data-gqueue]").dataset.gqueue)}/groups/${encodeURIComponent(grow.dataset.group)}` : "";
    const id = btn.closest("tr[data-task]")?.dataset.task || decodeURIComponent(location.hash.slice("#task/".length));
    const enc = encodeURIComponent(id);
    const filters = () => Object.fromEntries([...new FormData($("#dlq-filters"))].filter(([, v]) => v));
    const srow = btn.closest("tr[data-schedule]");
    const sched = srow ? `/schedules/${encodeURIComponent(srow.dataset.squeue)}/${encodeURIComponent(srow.dataset.schedule)}` : "";
    const handlers = {
      pause: () => act(`Paused ${q}`, () => api(`/queues/${q}/pause`, { method: "POST" })),
      resume: () => act(`Resumed ${q}`, () => api(`/queues/${q}/resume`, { method: "POST" })),
      "pause-group": () => act(`Paused group ${grow.dataset.group}`, () => api(gpath + "/pause", { method: "POST" })),
      "resume-group": () => act(`Resumed group ${grow.dataset.group}`, () => api(gpath + "/resume", { method: "POST" })),
      purge: () => act(`Purged ${q}`, () => api(`/queues/${q}/purge`, { method: "POST" }),
        `Delete every waiting (queued and scheduled) task of queue "${q}"? Running tasks finish.`),
      cancel: () => act(`Cancel sent for ${id}`, () => api(`/tasks/${enc}/cancel`, { method: "POST" }), `Cancel task ${id}?`),
      retry: () => act(`Retrying ${id}`, () => api(`/tasks/${enc}/retry`, { method: "POST", body: {} })),
      requeue: () => act(`Requeued ${id}`, () => api(`/dlq/${enc}/requeue`, { method: "POST", body: {} })),
      discard: () => act(`Discarded ${id}`, () => api(`/dlq/${enc}`, { method: "DELETE" }), `Delete dead letter ${id} for good?`),
      "requeue-all": () => act("Requeued matching dead letters", () => api("/dlq/requeue", { method: "POST", body: filters() }),
        "Requeue every dead letter matching the filters?"),
      "discard-all": () => act("Discarded matching dead letters", () => api("/dlq/discard", { method: "POST", body: filters() }),
        "Delete every dead letter matching the filters for good?"),
      "run-schedule": () => act(`Ran ${srow.dataset.schedule} now`, () => api(sched + "/run", { method: "POST" })),
      "disable-schedule": () => act(`Disabled ${srow.dataset.schedule}`, () => api(sched + "/disable", { method: "POST" })),
      "enable-schedule": () => act(`Enabled ${srow.dataset.schedule}`, () => api(sched + "/enable", { method: "POST" })),
      range: () => { state.range = btn.dataset.range; state.tp = null; render(); },
    };
    ev.preventDefault();
    if (handlers[act_]) handlers[act_]();
    return;
  }
  if (row && !ev.target.closest("a")) location.hash = "#task/" + encodeURIComponent(row.dataset.task);
});

async function enqueueFromForm(form) {
  const f = Object.fromEntries([...new FormData(form)].filter(([, v]) => v !== ""));
  const err = $("#enqueue-error");
  try {
    const body = { name: f.name, args: JSON.parse(f.args || "[]"), kwargs: JSON.parse(f.kwargs || "{}") };
    if (f.queue) body.queue = f.queue;
    if (f.priority) body.priority = Number(f.priority);
    if (f.delay) body.delay = Number(f.delay);
    const t = await api("/tasks", { method: "POST", body });
    flash(`Enqueued ${t.id}`);
    location.hash = "#task/" + encodeURIComponent(t.id);
  } catch (e) {
    err.textContent = e.message;
    err.hidden = false;
  }
}

document.addEventListener("submit", (ev) => {
  const form = ev.target;
  if (form.id === "enqueue-form") { ev.preventDefault(); enqueueFromForm(form); return; }
  if (form.id === "task-lookup") {
    ev.preventDefault();
    // (the input is not named "id": form.id would then be the input, not the form's id)
    location.hash = "#task/" + encodeURIComponent(new FormData(form).get("task_id").trim());
    return;
  }
  if (form.id !== "task-filters" && form.id !== "dlq-filters") return;
  ev.preventDefault();
  const params = new URLSearchParams([...new FormData(form)].filter(([, v]) => v));
  const hash = (form.id === "task-filters" ? "#tasks?" : "#dlq?") + params;
  // The same filters again fire no hashchange: render here, which also ends state.edited.
  if (location.hash === hash) render(); else location.hash = hash;
});

for (const type of ["input", "change"]) {
  document.addEventListener(type, (ev) => {
    if (ev.target.closest && ev.target.closest("#view form")) state.edited = true;
  });
}

window.addEventListener("hashchange", () => render());
render().then(startEvents);
