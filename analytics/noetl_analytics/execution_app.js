// The execution pages (issue 36): /executions/<id> (timeline, token-flow graph, step details)
// and /diff?a=&b= (the first divergence). Data comes as JSON from the server; every string is
// text: DOM nodes get it through textContent, Plotly labels through esc(). No innerHTML.
"use strict";
const $ = (id) => document.getElementById(id);
const esc = (v) => String(v).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
const COLOR = {success: "#2ca02c", error: "#d62728", running: "#1f77b4", skipped: "#aaaaaa"};
const S = {data: null, id: "", t: Infinity, expanded: new Set()};

function showError(m) { $("error").textContent = m; $("error").hidden = !m; }
async function getJSON(path, params) {
  const r = await fetch(path + "?" + new URLSearchParams(params), {credentials: "same-origin"});
  const body = await r.json().catch(() => ({}));
  if (!r.ok) throw new Error(body.error || r.statusText);
  return body;
}
function el(tag, text, cls) { const e = document.createElement(tag); if (text !== undefined) e.textContent = text; if (cls) e.className = cls; return e; }
const ms = (v) => v >= 1000 ? (v / 1000).toFixed(3) + " s" : v.toFixed(1) + " ms";
const money = (v) => v === 0 || v >= 1e-3 ? v.toFixed(6) : v.toExponential(2);

// ------------------------------------------------------------------ execution page
function summary(d) {
  const ex = d.execution, t = d.totals;
  const parts = [`${ex.playbook || ""}`, `status ${ex.status}`, `${ms(ex.duration_ms)}`, `tenant ${ex.tenant}/${ex.project}`,
    `${t.step_runs} step runs`, `${t.failed_runs} failed`, `${t.retries} retries`, `${t.iterations} loop iterations`,
    `${t.sub_executions} sub-playbooks`, `cpu ${t.cpu_s.toFixed(3)} s`, `cost ${money(t.cost)} ${d.currency}`];
  $("summary").replaceChildren(...parts.map((p) => el("span", p)));
  if (d.playbook_missing) $("summary").append(el("span", `(playbook: ${d.playbook_missing})`));
  // back to Dagster ($NOETL_DAGSTER_WEBSERVER_URL): the run that requested it, and every run tagged with it
  for (const [key, text] of [["run", "Dagster run"], ["runs", "its Dagster runs"]]) {
    if (!d.dagster || !d.dagster[key]) continue;
    const a = el("a", text, "dagster-" + key); a.href = d.dagster[key]; a.target = "_blank"; a.rel = "noopener";
    $("summary").append(a);
  }
}

function lanes(d) {
  const order = [];
  for (const r of d.runs) {
    if (!order.includes(r.step)) order.push(r.step);
    if (r.loop && !order.includes(r.step + " [loop]")) order.push(r.step + " [loop]");
  }
  return order;
}

function timelineTraces(d) {
  const span = Math.max(d.execution.duration_ms, 1), minw = span / 400;
  const traces = [];
  for (const status of Object.keys(COLOR)) {
    const rs = d.runs.map((r, i) => [r, i]).filter(([r]) => r.status === status);
    if (!rs.length) continue;
    traces.push({type: "bar", orientation: "h", name: "step run: " + status, marker: {color: COLOR[status]},
      base: rs.map(([r]) => r.start_ms), x: rs.map(([r]) => Math.max(r.duration_ms, minw)), y: rs.map(([r]) => esc(r.step)),
      customdata: rs.map(([, i]) => ["run", i]),
      hovertext: rs.map(([r]) => esc(`${r.step}: ${r.status}, ${ms(r.duration_ms)}, retries ${r.retries}, cost ${money(r.cost)} ${d.currency}`)),
      hoverinfo: "text"});
  }
  // task attempts: thin bars inside their run's bar (a retry shows as a second one)
  const at = [];
  d.runs.forEach((r) => r.attempts.forEach((a) => at.push([r, a])));
  if (at.length) {
    traces.push({type: "bar", orientation: "h", name: "task attempt", width: 0.3, opacity: 0.9,
      marker: {color: at.map(([, a]) => a.status === "error" ? "#7f0000" : "#0b5d1e")},
      base: at.map(([, a]) => a.start_ms), x: at.map(([, a]) => Math.max(a.end_ms - a.start_ms, minw)), y: at.map(([r]) => esc(r.step)),
      customdata: at.map(([r]) => ["run", d.runs.indexOf(r)]),
      hovertext: at.map(([r, a]) => esc(`${r.step} / ${a.task} attempt ${a.attempt}: ${a.status} (${a.directive || ""})`)), hoverinfo: "text"});
  }
  // loops: one bar per bucket of iterations (expand a bucket by clicking it)
  const bk = [];
  d.runs.forEach((r, i) => (r.loop ? r.loop.buckets : []).forEach((b) => bk.push([r, i, b])));
  if (bk.length) {
    traces.push({type: "bar", orientation: "h", name: "loop iterations", width: 0.6,
      marker: {color: bk.map(([, , b]) => b.failed ? COLOR.error : "#98df8a")},
      base: bk.map(([, , b]) => b.start_ms), x: bk.map(([, , b]) => Math.max(b.end_ms - b.start_ms, minw)),
      y: bk.map(([r]) => esc(r.step + " [loop]")), customdata: bk.map(([, i, b]) => ["bucket", i, b.first, b.last]),
      hovertext: bk.map(([r, , b]) => esc(`${r.step} iterations ${b.first}..${b.last}: ${b.ok} ok, ${b.failed} failed, ${b.retries} retries (click to expand)`)),
      hoverinfo: "text"});
  }
  return traces;
}

function drawTimeline() {
  const d = S.data;
  const shapes = Number.isFinite(S.t) ? [{type: "line", x0: S.t, x1: S.t, yref: "paper", y0: 0, y1: 1, line: {color: "#333", dash: "dot"}}] : [];
  Plotly.react("timeline", [...timelineTraces(d), ...S.extra || []], {
    title: {text: "timeline (ms from the first event)", font: {size: 14}}, barmode: "overlay", showlegend: true,
    legend: {orientation: "h", y: -0.18}, margin: {l: 120, r: 10, t: 36, b: 40}, shapes,
    yaxis: {type: "category", categoryorder: "array", categoryarray: lanes(d).map(esc).reverse(), automargin: true},
    xaxis: {title: {text: "ms"}, rangeslider: {visible: false}},
  }, {displaylogo: false});
}

function stepStatus(d, step, t) {
  const rs = d.runs.filter((r) => r.step === step && r.start_ms <= t);
  if (!rs.length) return "none";
  if (rs.some((r) => r.status === "error" && r.end_ms <= t)) return "error";
  return rs.some((r) => r.end_ms > t) ? "running" : "success";
}

function drawGraph() {
  const d = S.data, g = d.graph, pos = g.positions, t = S.t;
  // tokens per arc up to the scrubbed time: the fired arcs of runs decided by then
  const tokens = new Map();
  for (const r of d.runs) if (r.end_ms <= t) for (const f of r.fired) { const k = JSON.stringify([r.step, f.step]); tokens.set(k, (tokens.get(k) || 0) + 1); }
  const ann = [];
  for (const e of g.edges) {
    const a = pos[e.from], b = pos[e.to];
    if (!a || !b) continue;
    const n = tokens.get(JSON.stringify([e.from, e.to])) || 0;
    if (e.from === e.to) {
      ann.push({x: a[0], y: a[1], text: esc(`↻ ${n}`), showarrow: false, xshift: 22, yshift: 16, font: {color: n ? "#000" : "#999"}});
      continue;
    }
    ann.push({x: b[0], y: b[1], ax: a[0], ay: a[1], xref: "x", yref: "y", axref: "x", ayref: "y", text: "", showarrow: true,
      arrowhead: 3, arrowsize: 1.2, standoff: 14, startstandoff: 14, arrowwidth: n ? 2 : 1, arrowcolor: n ? "#444" : "#ccc"});
    ann.push({x: (a[0] + b[0]) / 2, y: (a[1] + b[1]) / 2, text: esc(String(n)), showarrow: false, bgcolor: "#fff",
      font: {size: 11, color: n ? "#000" : "#999"}});
  }
  const steps = g.steps.filter((s) => pos[s]);
  const fill = {none: "#dddddd", running: COLOR.running, success: COLOR.success, error: COLOR.error};
  Plotly.react("graph", [{type: "scatter", mode: "markers+text", x: steps.map((s) => pos[s][0]), y: steps.map((s) => pos[s][1]),
    // long names: cut (the hover has them whole), above and below in turn so neighbours do not overlap
    text: steps.map((s) => esc(s.length > 60 ? s.slice(0, 59) + "…" : s)),
    textposition: steps.map((s, i) => i % 2 ? "top center" : "bottom center"), customdata: steps, hoverinfo: "text",
    hovertext: steps.map((s) => esc(`${s}${g.joins.includes(s) ? " (join)" : ""}${g.cyclic.includes(s) ? " (in a cycle)" : ""}`)),
    marker: {size: 22, color: steps.map((s) => fill[stepStatus(d, s, t)]),
      symbol: steps.map((s) => g.joins.includes(s) ? "diamond" : g.cyclic.includes(s) ? "square" : "circle"),
      line: {width: 1, color: "#333"}}}], {
    title: {text: "playbook graph: tokens per arc (diamond: join, square: in a cycle)", font: {size: 13}},
    annotations: ann, showlegend: false, margin: {l: 10, r: 10, t: 36, b: 10},
    xaxis: {visible: false, range: [-1.3, 1.3]}, yaxis: {visible: false, range: [-1.3, 1.3]},
  }, {displaylogo: false});
}

function details(run) {
  const d = S.data, box = $("details");
  const rows = [el("div", `${run.step}  (step run ${run.step_run_id}, #${run.sequence})`)];
  rows[0].style.fontWeight = "600";
  if (run.line) rows.push(el("div", `playbook line: ${d.execution.file || ""}:${run.line}`, "line"));
  rows.push(el("div", `status ${run.status}, ${ms(run.duration_ms)}, ${run.tokens} token(s), retries ${run.retries}, cost ${money(run.cost)} ${d.currency}`));
  rows.push(el("div", `input: ${run.args.preview !== undefined ? run.args.preview : JSON.stringify(run.args.ref)}`));
  if (run.result) rows.push(el("div", run.result.ref ? `result reference: ${run.result.ref.uri} (${run.result.ref.size} bytes, checksum ${run.result.checksum})`
    : `result: ${run.result.preview}${run.result.truncated ? " …" : ""} (checksum ${run.result.checksum})`));
  const at = run.error_line || run.line;  // the raising line (engine/error_location.py), else the step's
  if (run.error) rows.push(el("div", `error: ${run.error.message || JSON.stringify(run.error)}` + (at ? `  at ${d.execution.file || ""}:${at}` : ""), "err"));
  if (run.fired.length) rows.push(el("div", "fired: " + run.fired.map((f) => `arc ${f.arc} -> ${f.step}`).join(", ")));
  if (run.sub_executions.length) {
    const p = el("div", "sub-playbooks: ");
    for (const sid of run.sub_executions) { const a = el("a", sid); a.href = "/executions/" + encodeURIComponent(sid); p.append(a, " "); }
    rows.push(p);
  }
  if (run.attempts.length) {
    const tb = el("table");
    tb.append(...[["task", "attempt", "status", "directive", "ms", "error"], ...run.attempts.map((a) => [a.task, a.attempt, a.status, a.directive || "",
      a.duration_ms == null ? "" : a.duration_ms.toFixed(2), a.error ? a.error.message || "" : ""])].map((cells, i) => {
      const tr = el("tr"); tr.append(...cells.map((c) => el(i ? "td" : "th", String(c)))); return tr; }));
    rows.push(tb);
  }
  box.replaceChildren(...rows);
  box.dataset.step = run.step;
}

async function expand(runIndex, first, last) {
  const r = S.data.runs[runIndex], key = `${runIndex}:${first}`;
  if (S.expanded.has(key)) return;
  S.expanded.add(key);
  const page = await getJSON("/api/execution/iterations", {id: S.id, run: r.step_run_id, offset: first, limit: Math.min(last - first + 1, 1000)});
  const its = page.iterations, lane = esc(`${r.step} [${first}..${last}]`);
  S.extra = S.extra || [];
  S.extra.push({type: "bar", orientation: "h", name: `iterations ${first}..${last}`, width: 0.5, y: its.map(() => lane),
    base: its.map((i) => i.start_ms), x: its.map((i) => Math.max(i.end_ms - i.start_ms, S.data.execution.duration_ms / 2000)),
    marker: {color: its.map((i) => COLOR[i.status] || "#999")}, hoverinfo: "text",
    hovertext: its.map((i) => esc(`iteration ${i.index}: ${i.status}, retries ${i.retries}${i.error ? ", " + (i.error.message || "") : ""}`))});
  drawTimeline();
}

function scrub() {
  const d = S.data, v = +$("scrub").value, span = Math.max(d.execution.duration_ms, 1);
  S.t = v >= 1000 ? Infinity : (v / 1000) * span;
  const done = d.runs.filter((r) => r.end_ms <= S.t).length;
  $("scrub-label").textContent = Number.isFinite(S.t) ? `${ms(S.t)}: ${done} of ${d.runs.length} step runs finished` : `end: all ${d.runs.length} step runs`;
  drawGraph();
  drawTimeline();
}

async function executionPage() {
  S.id = decodeURIComponent(location.pathname.slice("/executions/".length));
  S.data = await getJSON("/api/execution", {id: S.id});
  $("execution-view").hidden = false;
  summary(S.data);
  scrub();
  $("scrub").addEventListener("input", scrub);
  $("timeline").on("plotly_click", (ev) => {
    const cd = ev.points[0].customdata;
    if (cd[0] === "run") details(S.data.runs[cd[1]]);
    else if (cd[0] === "bucket") expand(cd[1], cd[2], cd[3]).catch((e) => showError(e.message));
  });
  $("graph").on("plotly_click", (ev) => {
    const step = ev.points[0].customdata, rs = S.data.runs.filter((r) => r.step === step);
    if (rs.length) details(rs.find((r) => r.status === "error") || rs[rs.length - 1]);
  });
}

// ------------------------------------------------------------------ diff page
function kv(table, label, diffs) {
  for (const [k, v] of Object.entries(diffs || {})) {
    const tr = el("tr");
    tr.append(el("td", `${label}.${k}`), el("td", JSON.stringify(v.a)), el("td", JSON.stringify(v.b)));
    table.append(tr);
  }
}

async function diffPage() {
  const q = new URLSearchParams(location.search);
  const d = await getJSON("/api/diff", {a: q.get("a") || "", b: q.get("b") || ""});
  $("diff-view").hidden = false;
  const head = [];
  for (const side of ["a", "b"]) {
    const x = d[side], p = el("span", `${side.toUpperCase()}: `), a = el("a", x.execution_id);
    a.href = "/executions/" + encodeURIComponent(x.execution_id);
    p.append(a, ` ${x.playbook || ""} (${x.status})`);
    head.push(p);
  }
  $("summary").replaceChildren(...head);
  const f = d.first, box = $("divergence"), lines = [];
  if (!f) lines.push(el("div", `no divergence: ${d.compared_activations} step activations agree (arcs, status, retries, results)`));
  else {
    lines.push(el("div", `first divergence (${f.kind}) at step ${f.step}, activation ${f.activation}`, "kind"));
    lines.push(el("div", f.why || ""));
    lines.push(el("div", `events: A #${f.a_sequence}, B #${f.b_sequence}`));
    const line = d.lines.a[f.step] || d.lines.b[f.step];
    if (line) lines.push(el("div", `playbook line: ${d.a.file || d.b.file || ""}:${line}`));
    (f.when || []).forEach((w, i) => lines.push(el("div", `arc ${i} when: ${w === null ? "(always)" : w}`)));
    for (const side of ["a", "b"]) if (f[side + "_error"]) {
      const at = f[side + "_error_line"];
      lines.push(el("div", `${side.toUpperCase()} error: ${f[side + "_error"].message || ""}` + (at ? `  at ${d[side].file || ""}:${at}` : "")));
    }
  }
  box.replaceChildren(...lines);
  box.dataset.kind = f ? f.kind : "none";
  box.dataset.step = f ? f.step : "";
  const tb = el("table"), tr = el("tr");
  tr.append(el("th", "what decided it"), el("th", "A"), el("th", "B"));
  tb.append(tr);
  if (f) { kv(tb, "ctx", f.ctx_diff); kv(tb, "workload", f.workload_diff); kv(tb, "input", f.args_diff); }
  const parts = [tb];
  const ch = d.steps_changed;
  if (ch) parts.push(el("div", `steps changed between the playbook versions: added [${ch.added.join(", ")}], removed [${ch.removed.join(", ")}], changed [${ch.changed.join(", ")}]`));
  parts.push(el("div", `steps only in A: [${d.steps_only_in.a.join(", ")}]; only in B: [${d.steps_only_in.b.join(", ")}]`));
  $("diff-tables").replaceChildren(...parts);
}

(location.pathname === "/diff" ? diffPage() : executionPage())
  .then(() => { showError(""); document.body.dataset.ready = "1"; })
  .catch((e) => { showError(e.message); document.body.dataset.ready = "error"; });
