// jobbus dashboard: plain JavaScript, no dependencies. Data comes from /api; the
// server pushes a summary (counts, workers, charts) as server-sent events at most a
// few times a second, and the page refetches what it shows when the version moves.
"use strict";

const STATES = ["SCHEDULED", "WAITING", "QUEUED", "RUNNING", "RETRY_WAIT", "COMPLETED", "FAILED", "CANCELLED"];
const ACTIVE = new Set(["SCHEDULED", "WAITING", "QUEUED", "RUNNING", "RETRY_WAIT"]);
const token = document.querySelector('meta[name="jobbus-token"]').content;
const $ = (id) => document.getElementById(id);

const ui = {
  view: "list",
  jobId: "",
  jobEndedAt: 0, // when the page first saw the job ended (0: it runs)
  state: "",
  type: "",
  cursors: [""], // the cursor of each page shown so far; the last is the current one
  next: "",
  version: -1,
  summary: null,
};

// el builds an element; children are nodes or text (never parsed as HTML).
function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else if (v !== undefined && v !== null && v !== false) e.setAttribute(k, v);
  }
  for (const c of children) {
    if (c === null || c === undefined) continue;
    e.append(c instanceof Node ? c : String(c));
  }
  return e;
}

function ago(ms, now) {
  if (!ms) return "–";
  const s = Math.max(0, Math.round(((now || Date.now()) - ms) / 1000));
  if (s < 60) return s + "s ago";
  if (s < 3600) return Math.floor(s / 60) + "m ago";
  if (s < 86400) return Math.floor(s / 3600) + "h ago";
  return new Date(ms).toLocaleString();
}

function when(ms) {
  return ms ? new Date(ms).toLocaleString() + " (" + ago(ms) + ")" : "–";
}

// due says when a SCHEDULED job is due: "due in 5m", or the time itself when far off.
function due(ms, now) {
  const s = Math.round((ms - (now || Date.now())) / 1000);
  if (s <= 0) return "due now";
  if (s < 60) return "due in " + s + "s";
  if (s < 3600) return "due in " + Math.floor(s / 60) + "m";
  if (s < 86400) return "due in " + Math.floor(s / 3600) + "h";
  return "due " + new Date(ms).toLocaleString();
}

function badge(state) {
  return el("span", { class: "state " + state }, state);
}

async function getJSON(url) {
  const r = await fetch(url, { credentials: "same-origin", cache: "no-store" });
  const body = await r.json().catch(() => ({}));
  if (!r.ok) throw new Error(body.error || r.status + " " + r.statusText);
  return body;
}

async function post(url) {
  const r = await fetch(url, {
    method: "POST",
    credentials: "same-origin",
    headers: { "X-Jobbus-Token": token, "Content-Type": "application/json" },
    body: "{}",
  });
  const body = await r.json().catch(() => ({}));
  if (!r.ok) throw new Error(body.error || r.status + " " + r.statusText);
  return body;
}

// ---- summary: counts, workers, charts ----

// renderCounts draws the count buttons once and then updates them in place (showRows
// says why).
function renderCounts(sum) {
  const box = $("counts");
  if (box.children.length !== STATES.length) {
    box.replaceChildren(...STATES.map((st) =>
      el("button", {
        type: "button",
        class: "count " + st,
        "data-state": st,
        onclick: () => setFilter(ui.state === st ? "" : st, ui.type),
      }, el("b", {}, 0), el("span", {}, st))));
  }
  for (const b of box.children) {
    const st = b.dataset.state;
    b.className = "count " + st + (ui.state === st ? " active" : "");
    b.firstChild.textContent = sum.counts[st] || 0;
  }
}

// showRows shows rows in the table body box, or the row empty when there are none.
// A row already shown under the same key (its attribute keyAttr) stays, and only its
// cells that changed are replaced: the live updates redraw these tables several times a
// second, and a button or link replaced between a press and its release loses the
// click.
function showRows(box, keyAttr, rows, empty) {
  if (!rows.length) rows = [empty];
  const shown = new Map();
  for (const r of box.children) if (r.hasAttribute(keyAttr)) shown.set(r.getAttribute(keyAttr), r);
  const next = rows.map((fresh) => {
    const row = shown.get(fresh.getAttribute(keyAttr));
    if (!row || row.cells.length !== fresh.cells.length) return fresh;
    for (const a of fresh.attributes) row.setAttribute(a.name, a.value);
    patch(row, Array.from(fresh.cells));
    return row;
  });
  if (next.length !== box.children.length || next.some((r, i) => r !== box.children[i])) box.replaceChildren(...next);
}

// patch makes kids node's children, keeping each child already in its place that
// equals its kid (showRows says why).
function patch(node, kids) {
  const old = node.children;
  if (old.length !== kids.length) {
    node.replaceChildren(...kids);
    return;
  }
  kids.forEach((k, i) => { if (!old[i].isEqualNode(k)) old[i].replaceWith(k); });
}

// loadBar is a bar filled to pct; its width is set through the CSSOM, which the
// page's content security policy allows (a style attribute it would refuse).
function loadBar(pct) {
  const fill = el("i", {});
  fill.style.width = pct + "%";
  return el("span", { class: "load" }, fill);
}

function renderWorkers(sum) {
  const ws = sum.workers || [];
  let cap = 0, busy = 0;
  for (const w of ws) { cap += w.capacity; busy += w.activeTasks; }
  $("workers-sum").textContent = ws.length + " live, " + busy + " of " + cap + " slots busy";
  const rows = ws.map((w) => {
    const pct = w.capacity ? Math.round((100 * w.activeTasks) / w.capacity) : 0;
    return el("tr", { "data-worker": w.workerId },
      el("td", {}, el("code", {}, w.workerId)),
      el("td", {}, loadBar(pct), w.activeTasks + " / " + w.capacity),
      el("td", {}, ago(w.lastHeartbeatMillis, sum.nowMillis)));
  });
  showRows($("workers"), "data-worker", rows, el("tr", {}, el("td", { colspan: 3, class: "empty" }, "no live workers")));
}

function renderLimits(sum) {
  const ls = sum.limits || [];
  $("limits-panel").hidden = ls.length === 0;
  $("limits").replaceChildren(...ls.map((l) =>
    el("tr", { "data-limit": l.scope + " " + l.name },
      el("td", {}, l.scope + " ", el("code", {}, l.name)),
      el("td", {}, l.rate),
      el("td", {}, String(l.burst)),
      el("td", {}, loadBar(l.burst ? Math.round((100 * l.tokens) / l.burst) : 0), l.tokens.toFixed(2)),
      el("td", {}, String(l.throttled)),
      el("td", {}, l.nextTokenMillis ? "in " + Math.max(0, l.nextTokenMillis - sum.nowMillis) + " ms" : "now"))));
}

function renderTypes(sum) {
  const sel = $("f-type");
  const have = Array.from(sel.options).map((o) => o.value).join("|");
  const want = [""].concat(sum.taskTypes || []);
  if (ui.type && !want.includes(ui.type)) want.push(ui.type);
  if (have === want.join("|")) return;
  sel.replaceChildren(...want.map((t) => el("option", { value: t }, t || "any")));
  sel.value = ui.type;
}

const SVGNS = "http://www.w3.org/2000/svg";
function svg(tag, attrs) {
  const e = document.createElementNS(SVGNS, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  return e;
}

// drawChart draws series (arrays of numbers over the same x) into an svg, whose
// viewBox gives its size (600x160 for the big charts).
function drawChart(node, series, unit) {
  const vb = node.viewBox.baseVal;
  const W = vb.width, H = vb.height, top = 14;
  let max = 0;
  for (const s of series) for (const v of s.values) max = Math.max(max, v);
  max = max > 0 ? max * 1.1 : 1;
  const kids = [
    svg("line", { class: "axis", x1: 0, y1: H - 1, x2: W, y2: H - 1 }),
    svg("line", { class: "axis", x1: 0, y1: top, x2: W, y2: top }),
  ];
  const label = svg("text", { x: 4, y: 10 });
  label.textContent = (max >= 10 ? Math.round(max) : max.toFixed(1)) + " " + unit;
  kids.push(label);
  for (const s of series) {
    const n = s.values.length;
    const pts = s.values.map((v, i) =>
      ((i * W) / Math.max(1, n - 1)).toFixed(1) + "," + (H - 1 - ((H - 1 - top) * v) / max).toFixed(1));
    kids.push(svg("polyline", { class: "s-" + s.name, points: pts.join(" ") }));
  }
  node.replaceChildren(...kids);
}

function renderCharts(sum) {
  const c = sum.chart || [];
  drawChart($("chart-throughput"), [
    { name: "submitted", values: c.map((p) => p.submitted) },
    { name: "failed", values: c.map((p) => p.failed) },
    { name: "completed", values: c.map((p) => p.completed) },
  ], "jobs/s");
  drawChart($("chart-latency"), [
    { name: "p95", values: c.map((p) => p.p95Millis) },
    { name: "p50", values: c.map((p) => p.p50Millis) },
  ], "ms");
  const last = c.length > 1 ? c[c.length - 2] : null; // the last complete bucket
  $("tp-now").textContent = last ? "now " + last.completed.toFixed(1) + "/s" : "";
  $("lat-now").textContent = last && last.p50Millis ? "now p50 " + Math.round(last.p50Millis) + " ms" : "";
}

// ---- the queues page ----

function queueRow(q) {
  const spark = svg("svg", { class: "spark", viewBox: "0 0 200 40", preserveAspectRatio: "none", role: "img", "aria-label": "depth of " + q.name });
  drawChart(spark, [{ name: "depth", values: (q.history || []).map((p) => p.depth) }], "queued");
  const limits = [];
  if (q.maxRunning) limits.push("max running " + q.maxRunning);
  if (q.keyConcurrency) limits.push("per key " + q.keyConcurrency);
  const lat = q.latencyMillis ? (q.latencyMillis < 1000 ? q.latencyMillis + " ms" : Math.round(q.latencyMillis / 1000) + " s") : "–";
  const action = q.paused
    ? el("button", { type: "button", class: "small", "data-resume": q.name, onclick: (ev) => changeQueue(q.name, "resume", ev.target) }, "resume")
    : el("button", { type: "button", class: "small danger", "data-pause": q.name, onclick: (ev) => changeQueue(q.name, "pause", ev.target) }, "pause");
  return el("tr", { "data-queue": q.name, "data-paused": q.paused ? "yes" : "no" },
    el("td", { "data-k": "name" }, el("code", {}, q.name)),
    el("td", { "data-k": "state" }, el("span", { class: "state " + (q.paused ? "paused" : "active-q") }, q.paused ? "paused" : "running")),
    el("td", { "data-k": "queued" }, q.queued),
    el("td", { "data-k": "running" }, q.running),
    el("td", { "data-k": "unfinished", title: "jobs not yet finished, in any state: later ones (scheduled, waiting, retrying) too" }, q.unfinished || 0),
    el("td", { "data-k": "rate" }, q.startedPerMinute),
    el("td", { "data-k": "latency" }, lat),
    el("td", { "data-k": "workers" }, q.workers),
    el("td", { "data-k": "limits" }, limits.join(", ") || "–"),
    el("td", { "data-k": "depth" }, spark),
    el("td", { "data-k": "actions" }, action));
}

function renderQueues(sum) {
  showRows($("queues"), "data-queue", (sum.queues || []).map(queueRow), el("tr", {}, el("td", { colspan: 11, class: "empty" }, "no queues yet")));
}

async function changeQueue(name, what, button) {
  if (button) button.disabled = true;
  try {
    const q = await post("/api/queues/" + encodeURIComponent(name) + "/" + what);
    $("q-msg").textContent = "queue " + q.name + (q.paused ? " paused" : " resumed");
    if (ui.summary) { // show it at once; the next summary confirms it
      ui.summary.queues = (ui.summary.queues || []).map((x) => x.name === q.name ? Object.assign({}, x, q) : x);
      renderQueues(ui.summary);
    }
  } catch (e) {
    $("q-msg").textContent = what + " failed: " + e.message;
    if (button) button.disabled = false;
  }
}

function renderSummary(sum) {
  ui.summary = sum;
  const p = $("problem");
  p.hidden = !sum.problem;
  p.textContent = sum.problem || "";
  renderCounts(sum);
  renderWorkers(sum);
  renderLimits(sum);
  renderTypes(sum);
  renderCharts(sum);
  renderQueues(sum);
  maybeLoadSchedules();
  if (sum.version !== ui.version) {
    ui.version = sum.version;
    refresh();
  }
}

// ---- schedules ----

// The schedules are asked for with the summary, at most every 2 s: a list costs the
// coordinator little, but it is one request per look.
let schedulesAt = 0;

function maybeLoadSchedules() {
  if (Date.now() - schedulesAt < 2000) return;
  schedulesAt = Date.now();
  loadSchedules();
}

function scheduleWhen(sc) {
  if (sc.everyMillis) return "every " + (sc.everyMillis % 1000 ? sc.everyMillis + " ms" : sc.everyMillis / 1000 + " s");
  return "cron " + sc.cron + " " + (sc.timeZone || "UTC");
}

function scheduleState(sc) {
  if (sc.paused) return "paused";
  return sc.failures ? "failing" : "active";
}

function inFuture(ms, now) {
  if (!ms) return "–";
  const s = Math.max(0, Math.round((ms - now) / 1000));
  const rel = s < 60 ? s + "s" : s < 3600 ? Math.floor(s / 60) + "m" : s < 86400 ? Math.floor(s / 3600) + "h" : Math.floor(s / 86400) + "d";
  return "in " + rel;
}

async function loadSchedules() {
  let page;
  try {
    page = await getJSON("/api/schedules");
  } catch (e) {
    $("schedules-sum").textContent = "unavailable: " + e.message;
    return;
  }
  const now = page.nowMillis;
  const scs = page.schedules || [];
  const failing = scs.filter((sc) => sc.failures).length;
  $("schedules-sum").textContent = scs.length + " schedules" + (failing ? ", " + failing + " failing" : "");
  const rows = scs.map((sc) => {
    const st = scheduleState(sc);
    const btn = el("button", {
      type: "button", class: "small", "data-schedule-action": sc.paused ? "resume" : "pause",
      onclick: (ev) => { ev.preventDefault(); changeSchedule(sc.name, sc.paused ? "resume" : "pause", ev.target); },
    }, sc.paused ? "resume" : "pause");
    const last = sc.lastJobId
      ? el("span", {}, ago(sc.lastRunMillis, now) + " ", el("a", { href: "#/job/" + encodeURIComponent(sc.lastJobId), title: sc.lastJobId }, sc.lastJobId.slice(0, 8)))
      : "–";
    const err = sc.lastError ? sc.lastError + " (" + ago(sc.lastErrorMillis, now) + ", " + sc.failures + " in a row)" : "";
    return el("tr", { "data-schedule": sc.name, "data-state": st },
      el("td", { "data-k": "name" }, el("code", {}, sc.name)),
      el("td", { "data-k": "when" }, scheduleWhen(sc)),
      el("td", { "data-k": "task" }, sc.taskType),
      el("td", { "data-k": "state" }, el("span", { class: "sched " + st }, st)),
      el("td", { "data-k": "next", title: sc.nextTickMillis ? new Date(sc.nextTickMillis).toLocaleString() : "" }, sc.paused ? "–" : inFuture(sc.nextTickMillis, now)),
      el("td", { "data-k": "last" }, last),
      el("td", { "data-k": "error", class: "error-text" }, err),
      el("td", { "data-k": "actions" }, btn));
  });
  showRows($("schedules"), "data-schedule", rows, el("tr", {}, el("td", { colspan: 8, class: "empty" }, "no schedules (jobbus schedule add)")));
}

async function changeSchedule(name, action, button) {
  if (button) button.disabled = true;
  try {
    await post("/api/schedules/" + encodeURIComponent(name) + "/" + action);
    $("s-msg").textContent = "schedule " + name + (action === "pause" ? " paused" : " resumed");
  } catch (e) {
    $("s-msg").textContent = action + " failed: " + e.message;
  }
  schedulesAt = 0;
  maybeLoadSchedules();
}

// ---- the job table ----

function setFilter(state, type) {
  ui.state = state;
  ui.type = type;
  ui.cursors = [""];
  $("f-state").value = state;
  $("f-type").value = type;
  if (ui.summary) renderCounts(ui.summary);
  if (ui.view !== "list") location.hash = "#/";
  else refresh();
}

function jobRow(j, now) {
  const cancel = ACTIVE.has(j.state)
    ? el("button", { type: "button", class: "small danger", "data-cancel": j.jobId, onclick: (ev) => { ev.preventDefault(); cancelJob(j.jobId, ev.target); } }, "cancel")
    : null;
  return el("tr", { "data-job": j.jobId, "data-state": j.state },
    el("td", { "data-k": "id" }, el("a", { href: "#/job/" + encodeURIComponent(j.jobId), title: j.jobId }, j.jobId.slice(0, 8))),
    el("td", { "data-k": "type" }, j.taskType),
    el("td", { "data-k": "state" }, badge(j.state)),
    el("td", { "data-k": "attempts" }, j.attempts + "/" + j.maxAttempts),
    el("td", { "data-k": "worker" }, j.workerId || ""),
    j.runAtMillis
      ? el("td", { "data-k": "updated", title: "due " + new Date(j.runAtMillis).toLocaleString() }, due(j.runAtMillis, now))
      : el("td", { "data-k": "updated", title: new Date(j.updatedAtMillis).toLocaleString() }, ago(j.updatedAtMillis, now)),
    el("td", { "data-k": "actions" }, cancel));
}

async function loadList() {
  const q = new URLSearchParams({ limit: "50" });
  if (ui.state) q.set("state", ui.state);
  if (ui.type) q.set("type", ui.type);
  const cur = ui.cursors[ui.cursors.length - 1];
  if (cur) q.set("cursor", cur);
  const page = await getJSON("/api/jobs?" + q);
  const now = ui.summary ? ui.summary.nowMillis : Date.now();
  showRows($("jobs"), "data-job", page.jobs.map((j) => jobRow(j, now)), el("tr", {}, el("td", { colspan: 7, class: "empty" }, page.loaded ? "no jobs" : "loading…")));
  ui.next = page.nextCursor || "";
  $("p-newer").disabled = ui.cursors.length <= 1;
  $("p-older").disabled = !ui.next;
  $("p-info").textContent = "page " + ui.cursors.length;
}

// ---- one job ----

async function loadJob() {
  const id = ui.jobId;
  let j;
  try {
    j = await getJSON("/api/jobs/" + encodeURIComponent(id));
  } catch (e) {
    $("j-id").textContent = id;
    $("j-fields").replaceChildren(el("dt", {}, "error"), el("dd", {}, e.message));
    return;
  }
  if (id !== ui.jobId) return;
  $("j-id").textContent = j.jobId;
  const f = [
    ["state", badge(j.state)],
    ["task type", j.taskType],
    ["priority", j.priority || "NORMAL"],
    ["attempts", j.attempts + " of " + j.maxAttempts],
    ["worker", j.workerId || j.lastWorkerId || "–"],
    ["submitted", when(j.createdAtMillis)],
    ["updated", when(j.updatedAtMillis)],
  ];
  if (j.retryAtMillis) f.push(["next retry", when(j.retryAtMillis)]);
  if (j.runAtMillis) f.push([j.state === "SCHEDULED" ? "due" : "was due", when(j.runAtMillis)]);
  if (j.snoozes) f.push(["snoozes", j.snoozes]);
  const group = j.workflowId || j.batchId;
  if (group) {
    f.push([j.workflowId ? "workflow" : "batch",
      el("span", {}, el("a", { href: "#/workflow/" + encodeURIComponent(group), "data-workflow": group }, group), " (step " + (j.step || "?") + ")")]);
  }
  if (j.after && j.after.length) {
    f.push(["after", el("span", {}, ...j.after.flatMap((p, i) => [i ? ", " : "", el("a", { href: "#/job/" + encodeURIComponent(p) }, p.slice(0, 8))]))]);
  }
  if (j.schedule) f.push(["schedule", j.schedule]);
  f.push(["sequence", j.seq]);
  patch($("j-fields"), f.flatMap(([k, v]) => [el("dt", {}, k), el("dd", { "data-field": k }, v)]));
  renderProgress(j);
  ui.jobActive = ACTIVE.has(j.state);
  if (ui.jobActive) ui.jobEndedAt = 0;
  else if (!ui.jobEndedAt) ui.jobEndedAt = Date.now(); // when the page saw the end
  loadLogs(); // its last records too, once it ended
  $("j-error").textContent = j.error || "–";
  $("j-result").textContent = j.result == null ? "–" : j.result;
  let payload = "";
  try { payload = JSON.stringify(j.payload, null, 2); } catch (e) { payload = String(j.payload); }
  $("j-payload").textContent = payload;
  $("j-cancel").disabled = !ACTIVE.has(j.state);
  const hist = (j.history || []).slice().reverse().map((h) =>
    el("tr", {},
      el("td", {}, new Date(h.atMillis).toLocaleTimeString()),
      el("td", {}, badge(h.state)),
      el("td", {}, h.attempts),
      el("td", {}, h.workerId || ""),
      el("td", { class: "error-text" }, h.error || (h.runAtMillis ? (h.snoozes ? "snoozed (" + h.snoozes + "), " : "") + "due " + new Date(h.runAtMillis).toLocaleString() : ""))));
  if (!hist.length) hist.push(el("tr", {}, el("td", { colspan: 5, class: "empty" }, "no changes seen yet")));
  patch($("j-history"), hist);
}

// renderProgress shows the latest progress a handler reported (worker.Progress).
function renderProgress(j) {
  const box = $("j-progress");
  if (j.progress === undefined || j.progress === null) { box.hidden = true; return; }
  const pct = Math.max(0, Math.min(100, Math.round(j.progress * 100)));
  box.hidden = false;
  box.classList.toggle("done", pct >= 100);
  box.querySelector(".bar").setAttribute("aria-valuenow", pct);
  $("j-progress-fill").style.width = pct + "%";
  $("j-progress-text").textContent = pct + "%" + (j.progressMessage ? " — " + j.progressMessage : "");
}

// ---- the job's log: polled while the job page shows an active job, and after ----

const LOG_LINES = 5000; // the page keeps the newest this many
// LOG_GRACE is how long after a job ended its log is polled for an attempt's last
// chunk, as `jobbus logs --follow` waits (client's logGrace): a cancelled handler
// logs as it stops, and a worker gone never ships that chunk.
const LOG_GRACE = 2000;
// again: a load was asked for while one was in flight, whose answer may be older than
// what the caller saw (the job's end): it runs once that one is done, or a finished
// job, no longer polled, would miss its last records. open: the attempts read without
// their last chunk. sentAt: when the last load was sent.
const log = { jobId: "", next: 0, chunks: new Map(), open: new Set(), busy: false, again: false, sentAt: 0 };

function logLine(rec, attempt) {
  const t = rec.time ? new Date(rec.time).toLocaleTimeString([], { hour12: false }) + "." + String(new Date(rec.time).getMilliseconds()).padStart(3, "0") : "            ";
  const level = rec.level || "";
  const rest = Object.entries(rec).filter(([k]) => !["time", "level", "msg", "attempt"].includes(k))
    .map(([k, v]) => k + "=" + (typeof v === "string" ? v : JSON.stringify(v))).join(" ");
  return el("span", { class: level }, t + " " + level.padEnd(5) + " #" + attempt + " " + (rec.msg || "") + (rest ? " " + rest : "") + "\n");
}

async function loadLogs() {
  const id = ui.jobId;
  if (log.busy) { log.again = true; return; }
  if (log.jobId !== id) {
    log.jobId = id; log.next = 0; log.chunks = new Map(); log.open = new Set();
    $("j-log").replaceChildren(el("span", { class: "muted" }, "no log records\n"));
  }
  log.busy = true;
  log.sentAt = Date.now();
  try {
    const page = await getJSON("/api/jobs/" + encodeURIComponent(id) + "/logs?after=" + log.next);
    if (id !== log.jobId) return;
    const pre = $("j-log");
    const atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
    if (page.records.length && log.next === 0) pre.replaceChildren();
    for (const r of page.records) {
      const want = log.chunks.has(r.attempt) ? log.chunks.get(r.attempt) : 0;
      if (r.chunk > want) {
        pre.append(el("span", { class: "marker" }, "… " + (r.chunk - want) + " older log chunks of attempt " + r.attempt + " dropped (a job keeps its last 64 chunks, at most 1 MiB)\n"));
      }
      log.chunks.set(r.attempt, Math.max(want, r.chunk + 1));
      pre.append(logLine(r.record, r.attempt));
    }
    while (pre.childNodes.length > LOG_LINES) pre.firstChild.remove();
    log.next = page.next;
    for (const [attempt, final] of Object.entries(page.final || {})) {
      if (final) log.open.delete(attempt); else log.open.add(attempt);
    }
    if (atBottom) pre.scrollTop = pre.scrollHeight;
  } catch (e) {
    $("j-log-note").textContent = "(log unavailable: " + e.message + ")";
  } finally {
    log.busy = false;
    if (log.again) { log.again = false; loadLogs(); }
  }
}

// logFollowed: the job runs, or it ended with an attempt's last chunk unread and the
// last load was sent within LOG_GRACE of the end, so one more load comes after it.
function logFollowed() {
  if (ui.jobActive) return true;
  return log.jobId === ui.jobId && log.open.size > 0 && ui.jobEndedAt > 0 && log.sentAt - ui.jobEndedAt < LOG_GRACE;
}

setInterval(() => { if (ui.view === "job" && logFollowed()) loadLogs(); }, 1000);

async function cancelJob(id, button) {
  if (button) button.disabled = true;
  try {
    const r = await post("/api/jobs/" + encodeURIComponent(id) + "/cancel");
    say(r.cancelled ? "cancelled" : "not cancelled: the job is " + r.job.state);
  } catch (e) {
    say("cancel failed: " + e.message);
    if (button) button.disabled = false;
  }
  refresh();
}

async function resubmitJob(id) {
  $("j-resubmit").disabled = true;
  try {
    const r = await post("/api/jobs/" + encodeURIComponent(id) + "/resubmit");
    location.hash = "#/job/" + encodeURIComponent(r.jobId);
    say("resubmitted as a new job (from " + id.slice(0, 8) + ")");
  } catch (e) {
    say("resubmit failed: " + e.message);
  } finally {
    $("j-resubmit").disabled = false;
  }
}

function say(text) {
  $("j-msg").textContent = text;
}

// ---- a workflow as a graph ----

// layers places each step in the column after its deepest parent (the longest path
// from a root), and orders a column by the mean row of its parents, so that edges
// mostly run straight.
function layers(steps) {
  const index = new Map(steps.map((s, i) => [s.name, i]));
  const depth = new Array(steps.length).fill(-1);
  const visit = (i, seen) => {
    if (depth[i] >= 0) return depth[i];
    if (seen.has(i)) return 0; // a cycle cannot be stored; never loop on one
    seen.add(i);
    let d = 0;
    for (const p of steps[i].after || []) {
      const pi = index.get(p);
      if (pi !== undefined) d = Math.max(d, visit(pi, seen) + 1);
    }
    depth[i] = d;
    return d;
  };
  steps.forEach((_, i) => visit(i, new Set()));
  const cols = [];
  steps.forEach((_, i) => { (cols[depth[i]] = cols[depth[i]] || []).push(i); });
  const row = new Array(steps.length).fill(0);
  cols.forEach((col, c) => {
    if (c > 0) {
      const key = (i) => {
        const ps = (steps[i].after || []).map((p) => index.get(p)).filter((x) => x !== undefined);
        return ps.length ? ps.reduce((a, p) => a + row[p], 0) / ps.length : 0;
      };
      col.sort((a, b) => key(a) - key(b) || a - b);
    }
    col.forEach((i, r) => { row[i] = r; });
  });
  return { index, depth, row, cols };
}

// drawGraph draws steps as boxes coloured by state (links to their job pages) and
// their edges as arrows from parent to child.
function drawGraph(node, steps) {
  const BW = 150, BH = 38, GX = 60, GY = 14, PAD = 12;
  const { index, depth, row, cols } = layers(steps);
  const rows = Math.max(1, ...cols.map((c) => c.length));
  const W = PAD * 2 + cols.length * BW + Math.max(0, cols.length - 1) * GX;
  const H = PAD * 2 + rows * BH + (rows - 1) * GY;
  node.setAttribute("viewBox", "0 0 " + W + " " + H);
  node.setAttribute("width", W);
  node.setAttribute("height", H);
  const x = (i) => PAD + depth[i] * (BW + GX);
  const y = (i) => PAD + row[i] * (BH + GY);
  const defs = svg("defs", {});
  const marker = svg("marker", { id: "arrow", viewBox: "0 0 10 10", refX: "10", refY: "5", markerWidth: "7", markerHeight: "7", orient: "auto-start-reverse" });
  marker.append(svg("path", { d: "M 0 0 L 10 5 L 0 10 z" }));
  defs.append(marker);
  const kids = [defs];
  steps.forEach((s, i) => {
    for (const p of s.after || []) {
      const pi = index.get(p);
      if (pi === undefined) continue;
      const x1 = x(pi) + BW, y1 = y(pi) + BH / 2, x2 = x(i), y2 = y(i) + BH / 2, mx = (x1 + x2) / 2;
      kids.push(svg("path", {
        class: "edge" + (steps[pi].state === "COMPLETED" ? " done" : ""), "data-from": p, "data-to": s.name,
        d: "M" + x1 + "," + y1 + " C" + mx + "," + y1 + " " + mx + "," + y2 + " " + x2 + "," + y2, "marker-end": "url(#arrow)",
      }));
    }
  });
  steps.forEach((s, i) => {
    const a = svg("a", { href: "#/job/" + encodeURIComponent(s.jobId), class: "step " + s.state, "data-step": s.name, "data-state": s.state });
    const title = svg("title", {});
    title.textContent = s.name + ": " + s.state + (s.error ? " — " + s.error : "");
    a.append(title);
    a.append(svg("rect", { x: x(i), y: y(i), width: BW, height: BH, rx: 6 }));
    const name = svg("text", { x: x(i) + 8, y: y(i) + 16 });
    name.textContent = s.name.length > 20 ? s.name.slice(0, 19) + "…" : s.name;
    const sub = svg("text", { x: x(i) + 8, y: y(i) + 30, class: "sub" });
    sub.textContent = s.state;
    a.append(name, sub);
    kids.push(a);
  });
  patch(node, kids); // a step's link stays while only others change
}

// MAX_DRAWN bounds the steps drawn: beyond it the page lists counts only.
const MAX_DRAWN = 2000;

async function loadWorkflow() {
  const id = ui.workflowId;
  let w;
  try {
    w = await getJSON("/api/workflows/" + encodeURIComponent(id));
  } catch (e) {
    $("w-id").textContent = id;
    $("w-state").replaceChildren();
    $("w-note").textContent = e.message;
    $("w-graph").replaceChildren();
    return;
  }
  if (id !== ui.workflowId) return;
  $("w-kind").textContent = w.kind === "batch" ? "Batch" : "Workflow";
  $("w-id").textContent = w.workflowId;
  $("w-state").replaceChildren(badge(w.state));
  $("w-counts").replaceChildren(...Object.entries(w.counts || {}).map(([st, n]) => el("span", { "data-count": st }, badge(st), " " + n)));
  const steps = w.steps.slice(0, MAX_DRAWN);
  drawGraph($("w-graph"), steps);
  $("w-note").textContent = (w.truncated || w.steps.length > MAX_DRAWN)
    ? "Only the first " + steps.length + " steps are drawn; the counts above cover them all."
    : steps.length + " steps; click one for its job.";
}

// ---- refresh and routing ----

// A view that failed to load is asked for again a second later: on a quiet system the
// next change, which would refresh it, may be long in coming.
let busy = false, again = false, retry = 0;
async function refresh() {
  if (busy) { again = true; return; }
  busy = true;
  try {
    if (ui.view === "job") await loadJob();
    else if (ui.view === "workflow") await loadWorkflow();
    else if (ui.view === "list") await loadList();
  } catch (e) {
    $("problem").hidden = false;
    $("problem").textContent = e.message;
    if (!retry) retry = setTimeout(() => { retry = 0; refresh(); }, 1000);
  } finally {
    busy = false;
    if (again) { again = false; refresh(); }
  }
}

function route() {
  const m = location.hash.match(/^#\/job\/(.+)$/);
  const wm = location.hash.match(/^#\/workflow\/(.+)$/);
  const job = !!m;
  const queues = location.hash === "#/queues";
  ui.view = job ? "job" : wm ? "workflow" : queues ? "queues" : "list";
  $("overview").hidden = ui.view !== "list";
  $("jobs-view").hidden = ui.view !== "list";
  $("job-view").hidden = !job;
  $("workflow-view").hidden = ui.view !== "workflow";
  $("queues-view").hidden = !queues;
  $("nav-jobs").className = ui.view === "queues" ? "" : "active";
  $("nav-queues").className = ui.view === "queues" ? "active" : "";
  if (wm) ui.workflowId = decodeURIComponent(wm[1]);
  if (job) {
    const id = decodeURIComponent(m[1]);
    if (id !== ui.jobId) { say(""); ui.jobEndedAt = 0; }
    ui.jobId = id;
  }
  window.scrollTo(0, 0);
  refresh();
}

function connect() {
  const conn = $("conn");
  const es = new EventSource("/api/events");
  es.addEventListener("open", () => { conn.textContent = "live"; conn.className = "conn live"; });
  es.addEventListener("error", () => { conn.textContent = "reconnecting…"; conn.className = "conn down"; });
  es.addEventListener("summary", (ev) => renderSummary(JSON.parse(ev.data)));
}

function init() {
  const fs = $("f-state");
  for (const st of STATES) fs.append(el("option", { value: st }, st));
  fs.addEventListener("change", () => setFilter(fs.value, ui.type));
  $("f-type").addEventListener("change", (ev) => setFilter(ui.state, ev.target.value));
  $("p-older").addEventListener("click", () => { if (ui.next) { ui.cursors.push(ui.next); refresh(); } });
  $("p-newer").addEventListener("click", () => { if (ui.cursors.length > 1) { ui.cursors.pop(); refresh(); } });
  $("j-cancel").addEventListener("click", (ev) => cancelJob(ui.jobId, ev.target));
  $("j-resubmit").addEventListener("click", () => resubmitJob(ui.jobId));
  window.addEventListener("hashchange", route);
  route();
  connect();
}

init();
