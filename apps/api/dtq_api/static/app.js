// dtq dashboard: a dependency-free single page over /api/v1, live through /api/v1/events.
"use strict";

const state = {
  token: sessionStorage.getItem("dtq-token") || "",
  tp: null,          // throughput buckets {start, bucket_s, buckets, series}
  events: [],        // recent events, newest first
  sse: null,         // AbortController of the event stream
  refreshTimer: null,
  tasksCursor: null,
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
        const data = msg.split("\n").filter((l) => l.startsWith("data: ")).map((l) => l.slice(6)).join("\n");
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
  state.events.unshift(ev);
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

function scheduleRefresh() {
  if (state.refreshTimer) return;
  state.refreshTimer = setTimeout(() => {
    state.refreshTimer = null;
    const busy = $("#confirm-dialog").open || $("#token-dialog").open
      || (document.activeElement && ["INPUT", "SELECT"].includes(document.activeElement.tagName));
    if (!busy) render(true);
  }, 1000);
}

// --- charts -----------------------------------------------------------------------------------

function lineChart(series, colors, opts = {}) {
  const W = 600, H = 180, P = 28;
  const n = Math.max(...series.map((s) => s.length), 2);
  const max = opts.max ?? Math.max(1, ...series.flat());
  const x = (i) => P + (i * (W - 2 * P)) / (n - 1);
  const y = (v) => H - P + 6 - (v / max) * (H - 2 * P);
  let svg = `<svg viewBox="0 0 ${W} ${H}" role="img">`;
  svg += `<line x1="${P}" y1="${y(0)}" x2="${W - P}" y2="${y(0)}" stroke="#ccd"/>`;
  svg += `<text x="2" y="${y(max) + 4}" font-size="10" fill="#888">${opts.fmt ? opts.fmt(max) : max}</text>`;
  svg += `<text x="2" y="${y(0) + 4}" font-size="10" fill="#888">0</text>`;
  series.forEach((s, k) => {
    const pts = s.map((v, i) => `${x(i).toFixed(1)},${y(v).toFixed(1)}`).join(" ");
    svg += `<polyline fill="none" stroke="${colors[k]}" stroke-width="2" points="${pts}"/>`;
  });
  return svg + "</svg>";
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
  return `<div class="charts">
    <div class="chart" data-testid="throughput-chart"><h3>Throughput (runs/s, ${tp.bucket_s}s buckets)</h3>
      ${lineChart([per(ok), per(bad), per(retried)], ["#1a8f4c", "#c93434", "#b7791f"], { fmt: (v) => v.toFixed(1) })}
      <div class="legend"><span style="color:#1a8f4c">■ succeeded</span><span style="color:#c93434">■ failed</span><span style="color:#b7791f">■ retried</span></div></div>
    <div class="chart" data-testid="failure-chart"><h3>Failure rate (failed + retried / finished)</h3>
      ${lineChart([rate], ["#c93434"], { max: 1, fmt: (v) => (v * 100).toFixed(0) + "%" })}
      <div class="legend"><span style="color:#c93434">■ failure rate</span></div></div>
  </div>`;
}

// --- views ------------------------------------------------------------------------------------

const views = {
  async overview(quiet) {
    const [qs, ws] = await Promise.all([api("/queues"), api("/workers")]);
    if (!state.tp || !quiet) state.tp = await api("/stats/throughput?window_s=900&bucket_s=15");
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
      <table><tr><th>queue</th><th>waiting</th><th>running</th><th>scheduled</th><th>dead letters</th><th>oldest waiting</th></tr>
      ${qs.items.map((q) => `<tr><td>${esc(q.name)} ${q.paused ? badge("paused") : ""}</td><td>${q.queued}</td><td>${q.running}</td><td>${q.scheduled}</td><td>${q.dlq}</td><td>${ago(q.oldest_waiting_age_s)}</td></tr>`).join("")}
      </table>
      <h3>Recent events</h3>
      <ul class="events" data-testid="events">${state.events.slice(0, 50).map((e) =>
        `<li>${esc(new Date(e.ts_ms).toLocaleTimeString())} ${badge(e.type, e.type)} ${esc(e.task_id || e.worker || e.queue || "")}${e.attempt ? " attempt " + e.attempt : ""}</li>`).join("") || '<li class="muted">waiting for events…</li>'}</ul>`;
  },

  async queues() {
    const qs = await api("/queues");
    const rows = qs.items.map((q) => {
      const bands = Object.entries(q.depth).filter(([, n]) => n).map(([p, n]) => `p${p}:${n}`).join(" ") || "-";
      return `<tr data-queue="${esc(q.name)}"><td>${esc(q.name)}</td>
        <td>${q.paused ? badge("paused") : badge("active", "ok")}</td>
        <td>${q.queued}</td><td class="muted">${bands}</td><td>${q.running}</td><td>${q.scheduled}</td><td>${q.dlq}</td>
        <td>${ago(q.oldest_waiting_age_s)}</td>
        <td>${q.paused ? `<button data-act="resume">Resume</button>` : `<button data-act="pause">Pause</button>`}
            <button data-act="purge" class="danger">Purge</button></td></tr>`;
    }).join("");
    return `<h2>Queues</h2><table data-testid="queues-table"><tr><th>queue</th><th>state</th><th>waiting</th><th>by priority</th><th>running</th><th>scheduled</th><th>dead letters</th><th>oldest</th><th></th></tr>${rows}</table>`;
  },

  async tasks() {
    const p = new URLSearchParams(location.hash.split("?")[1] || "");
    const qs = await api("/queues");
    const params = new URLSearchParams();
    for (const k of ["queue", "status", "name"]) if (p.get(k)) params.set(k, p.get(k));
    params.set("limit", "50");
    if (p.get("cursor")) params.set("cursor", p.get("cursor"));
    const page = await fillPage("/tasks", params, 50);
    const opt = (v, cur) => `<option ${v === cur ? "selected" : ""} value="${esc(v)}">${esc(v || "any")}</option>`;
    const statuses = ["", "queued", "scheduled", "running", "succeeded", "failed", "cancelled", "expired"];
    const rows = page.items.sort((a, b) => (b.enqueued_at || "").localeCompare(a.enqueued_at || "")).map((t) =>
      `<tr class="click" data-task="${esc(t.id)}"><td><code>${esc(t.id)}</code></td><td>${esc(t.name)}</td><td>${badge(t.status)}</td>
       <td>${t.attempt}</td><td>${when(t.enqueued_at)}</td><td class="err">${esc((t.error || "").slice(0, 120))}</td></tr>`).join("");
    const next = page.next_cursor ? `<p><a data-testid="next-page" href="#tasks?${new URLSearchParams({ ...Object.fromEntries(params), cursor: page.next_cursor })}">Next page →</a></p>` : "";
    return `<h2>Tasks</h2>
      <form class="filters" id="task-filters">
        <label>queue <select name="queue">${["", ...qs.items.map((q) => q.name)].map((v) => opt(v, p.get("queue") || "")).join("")}</select></label>
        <label>status <select name="status">${statuses.map((v) => opt(v, p.get("status") || "")).join("")}</select></label>
        <label>name <input name="name" value="${esc(p.get("name") || "")}" placeholder="task name"></label>
        <button class="primary" type="submit">Filter</button>
      </form>
      <table data-testid="tasks-table"><tr><th>id</th><th>name</th><th>status</th><th>attempt</th><th>enqueued</th><th>error</th></tr>${rows || '<tr><td colspan="6" class="muted">no tasks</td></tr>'}</table>${next}`;
  },

  async task() {
    const id = decodeURIComponent(location.hash.slice("#task/".length));
    const t = await api("/tasks/" + encodeURIComponent(id) + "?history=true");
    const field = (k, v) => `<dt>${k}</dt><dd>${v}</dd>`;
    const canCancel = ["queued", "scheduled", "running"].includes(t.status);
    const canRetry = ["failed", "cancelled", "expired"].includes(t.status);
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
        ${field("args", `<pre>${esc(JSON.stringify(t.args, null, 1))}</pre>`)}
        ${field("kwargs", `<pre>${esc(JSON.stringify(t.kwargs, null, 1))}</pre>`)}
        ${field("result", `<pre data-testid="task-result">${esc(JSON.stringify(t.result, null, 1))}</pre>`)}
        ${field("error", `<span class="error" data-testid="task-error">${esc(t.error || "-")}</span>`)}
        ${t.traceback ? field("traceback", `<pre class="traceback" data-testid="task-traceback">${esc(t.traceback)}</pre>`) : ""}
      </dl>
      ${t.steps ? renderFlowTree(t) : ""}
      <h3>Attempt history</h3>
      <table data-testid="history"><tr><th>time</th><th>event</th><th>attempt</th><th>worker</th><th>detail</th></tr>
        ${(t.history || []).map((e) => `<tr><td>${when(e.ts)}</td><td>${badge(e.type, e.type)}</td><td>${e.attempt ?? ""}</td><td>${esc(e.worker || "")}</td><td class="muted">${esc(e.detail)}</td></tr>`).join("")}
      </table>`;
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
      <table data-testid="dlq-table"><tr><th>task</th><th>name</th><th>failed</th><th>attempts</th><th>last error</th><th></th></tr>${rows || '<tr><td colspan="6" class="muted">no dead letters</td></tr>'}</table>`;
  },

  async workers() {
    const ws = await api("/workers");
    const rows = ws.items.map((w) => `<tr data-worker="${esc(w.worker_id)}"><td>${esc(w.worker_id)}</td>
      <td>${w.live ? badge("live") : badge("stale")}</td><td>${esc(w.status)}</td>
      <td>${ago(w.heartbeat_age_s)}</td><td>${w.active_tasks} / ${w.concurrency ?? "?"}</td>
      <td>${esc(w.queues.join(", "))}</td><td>${esc(w.hostname)} ${w.pid ? "pid " + w.pid : ""}</td>
      <td>${w.tasks_processed ?? 0}</td><td>${w.tasks_failed ?? 0}</td></tr>`).join("");
    return `<h2>Workers</h2><p class="muted">Stale when the last heartbeat is older than 3 heartbeat intervals.</p>
      <table data-testid="workers-table"><tr><th>worker</th><th>liveness</th><th>status</th><th>heartbeat age</th><th>in flight</th><th>queues</th><th>host</th><th>done</th><th>failed</th></tr>${rows || '<tr><td colspan="9" class="muted">no workers</td></tr>'}</table>`;
  },

  async schedules() {
    const s = await api("/schedules");
    const periodic = s.schedules.map((x) => `<tr><td>${esc(x.name)}</td><td>${esc(x.queue)}</td><td>${esc(x.task)}</td>
      <td><code>${esc(x.cron || (x.every ? "every " + x.every + "s" : ""))}</code> ${esc(x.tz || "")}</td><td>${when(x.next_fire_at)}</td></tr>`).join("");
    const delayed = s.scheduled_tasks.map((d) => `<tr class="click" data-task="${esc(d.task_id)}"><td><code>${esc(d.task_id)}</code></td>
      <td>${esc(d.name)}</td><td>${badge(d.kind, "scheduled")}</td><td>${when(d.due_at)}</td></tr>`).join("");
    return `<h2>Schedules</h2>
      <h3>Periodic schedules (next fires)</h3>
      <table data-testid="periodic-table"><tr><th>schedule</th><th>queue</th><th>task</th><th>when</th><th>next fire</th></tr>${periodic || '<tr><td colspan="5" class="muted">none</td></tr>'}</table>
      <h3>Delayed tasks and retries</h3>
      <table data-testid="delayed-table"><tr><th>task</th><th>name</th><th>kind</th><th>due</th></tr>${delayed || '<tr><td colspan="4" class="muted">none</td></tr>'}</table>`;
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
  return h.startsWith("task/") ? "task" : h.split("?")[0];
}

let renderSeq = 0;
async function render(quiet) {
  const name = currentView();
  const fn = views[name] || views.overview;
  document.querySelectorAll("nav a").forEach((a) => a.classList.toggle("active", a.dataset.view === name));
  const seq = ++renderSeq;
  try {
    const html = await fn(quiet);
    if (seq === renderSeq) {
      view().innerHTML = html;
      view().dataset.view = name;
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
    const id = btn.closest("tr[data-task]")?.dataset.task || decodeURIComponent(location.hash.slice("#task/".length));
    const enc = encodeURIComponent(id);
    const filters = () => Object.fromEntries([...new FormData($("#dlq-filters"))].filter(([, v]) => v));
    const handlers = {
      pause: () => act(`Paused ${q}`, () => api(`/queues/${q}/pause`, { method: "POST" })),
      resume: () => act(`Resumed ${q}`, () => api(`/queues/${q}/resume`, { method: "POST" })),
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
    };
    ev.preventDefault();
    if (handlers[act_]) handlers[act_]();
    return;
  }
  if (row && !ev.target.closest("a")) location.hash = "#task/" + encodeURIComponent(row.dataset.task);
});

document.addEventListener("submit", (ev) => {
  const form = ev.target;
  if (form.id !== "task-filters" && form.id !== "dlq-filters") return;
  ev.preventDefault();
  const params = new URLSearchParams([...new FormData(form)].filter(([, v]) => v));
  location.hash = (form.id === "task-filters" ? "#tasks?" : "#dlq?") + params;
});

window.addEventListener("hashchange", () => render());
render().then(startEvents);
