// The cost dashboard's client: filters over the allocation rollup rows, Plotly charts, drill-down.
// Every string from the data is text: DOM nodes get it through textContent / new Option, Plotly
// through esc() (its labels read a little HTML: <b>, <a href>, <span style>); raw values ride in
// customdata for the clicks. No innerHTML anywhere.
"use strict";
const S = {tenant: "", project: "", playbook: "", step: "", data: null, cluster: null};
const $ = (id) => document.getElementById(id);
const INLINE = (() => { const el = $("noetl-data"); return el ? JSON.parse(el.textContent) : null; })();
const esc = (v) => String(v).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
const sum = (rows, k) => rows.reduce((a, r) => a + (+r[k] || 0), 0);
function groupBy(rows, keyf) {
  const m = new Map();
  for (const r of rows) { const k = keyf(r); if (!m.has(k)) m.set(k, []); m.get(k).push(r); }
  return m;
}
function fill(sel, values, current) {
  $(sel).replaceChildren(new Option("(all)", ""), ...values.map((v) => new Option(v, v, false, v === current)));
}
function filtered(ignore) {
  const st = $("f-start").value, en = $("f-end").value;
  return S.data.rows.filter((r) => (!S.tenant || ignore === "tenant" || r.tenant === S.tenant)
    && (!S.project || ignore === "project" || r.project === S.project)
    && (!S.playbook || ignore === "playbook" || r.playbook === S.playbook)
    && (!st || r.day >= st) && (!en || r.day <= en));
}
function uniq(rows, k) { return [...new Set(rows.map((r) => r[k]))].sort(); }
const layout = (title, extra) => Object.assign({title: {text: esc(title), font: {size: 14}}, margin: {l: 60, r: 10, t: 36, b: 80}, barmode: "stack", legend: {orientation: "h"}}, extra || {});
const category = {type: "category"};
function render() {
  const d = S.data, cur = d.currency || "";
  $("banner").hidden = !d.synthetic;
  $("meta").textContent = `${d.start} .. ${d.end}, prices ${d.price_version} (${cur})`;
  $("who").textContent = d.viewer ? (d.viewer.admin ? `${d.viewer.name}: all tenants` : `tenant ${d.viewer.name}`) : "";
  fill("f-tenant", uniq(filtered("tenant"), "tenant"), S.tenant);
  fill("f-project", uniq(filtered("project"), "project"), S.project);
  fill("f-playbook", uniq(filtered("playbook"), "playbook"), S.playbook);
  const rows = filtered();
  const days = uniq(rows, "day");
  // 1. cost per day per tenant
  const byTenant = groupBy(rows, (r) => r.tenant);
  const ts = [...byTenant].map(([t, rs]) => {
    const byDay = groupBy(rs, (r) => r.day);
    return {type: "bar", name: esc(t), x: days, y: days.map((x) => sum(byDay.get(x) || [], "cost"))};
  });
  // a few days read better as one bar group each than on a time axis ticking hours
  Plotly.react("ts", ts, layout(`cost per day per tenant (${cur})`, days.length < 8 ? {xaxis: category} : {}));
  // 2. allocated / unallocated / storage / idle per day: the whole cluster, admin keys only
  $("idle").hidden = !S.cluster;
  if (S.cluster) {
    const st = $("f-start").value, en = $("f-end").value;
    const sm = S.cluster.filter((r) => (!st || r.day >= st) && (!en || r.day <= en));
    Plotly.react("idle", ["allocated", "unallocated", "storage", "idle"].map((k) => ({type: "bar", name: k, x: sm.map((r) => r.day), y: sm.map((r) => r[k])})),
      layout(`allocated, unallocated and idle per day (${cur}, all tenants)`, sm.length < 8 ? {xaxis: category} : {}));
  }
  // 3. top N playbooks
  const n = Math.max(1, +$("f-topn").value || 10);
  const top = [...groupBy(rows, (r) => JSON.stringify([r.tenant, r.playbook]))].map(([k, rs]) => [JSON.parse(k), sum(rs, "cost")])
    .sort((a, b) => b[1] - a[1]).slice(0, n).reverse();
  Plotly.react("topn", [{type: "bar", orientation: "h", x: top.map((t) => t[1]), y: top.map((t) => esc(t[0].join(" / "))),
    customdata: top.map((t) => t[0]), name: "cost"}],
    layout(`top ${n} playbooks by cost (click to drill down)`, {margin: {l: 60, r: 10, t: 36, b: 40}, yaxis: {...category, automargin: true}}));
  // 4. drill-down: tenants -> playbooks -> steps
  const level = S.level = S.playbook ? "step" : S.tenant ? "playbook" : "tenant";
  const parts = [...groupBy(rows, (r) => r[level])].map(([k, rs]) => [k, sum(rs, "cost"), sum(rs, "cpu_core_hours")]).sort((a, b) => b[1] - a[1]);
  Plotly.react("steps", [{type: "bar", x: parts.map((p) => esc(p[0])), y: parts.map((p) => p[1]), name: "cost",
    customdata: parts.map((p) => [p[0], p[2]]),
    hovertemplate: "%{x}: %{y:.4f} " + esc(cur) + "<br>%{customdata[1]:.4f} CPU core-hours<extra></extra>"}],
    layout(`cost per ${level} (click to drill down)`, {xaxis: category}));
  // 5. error and retry rates per playbook
  const rates = [...groupBy(rows, (r) => r.playbook)].map(([k, rs]) => [esc(k), sum(rs, "failed") / Math.max(sum(rs, "attempts"), 1), sum(rs, "retries") / Math.max(sum(rs, "attempts"), 1)]);
  // horizontal: playbook paths are long
  Plotly.react("rates", [
    {type: "bar", orientation: "h", name: "error rate", y: rates.map((r) => r[0]), x: rates.map((r) => r[1])},
    {type: "bar", orientation: "h", name: "retry rate", y: rates.map((r) => r[0]), x: rates.map((r) => r[2])},
  ], layout("error and retry rate per playbook (task attempts)", {barmode: "group", xaxis: {tickformat: ".1%"},
    yaxis: {...category, automargin: true}, margin: {l: 60, r: 10, t: 36, b: 40}}));
  crumbs();
}
function crumbs() {
  const c = [["all", () => { S.tenant = S.playbook = S.step = ""; }]];
  if (S.tenant) c.push([S.tenant, () => { S.playbook = S.step = ""; }]);
  if (S.playbook) c.push([S.playbook, () => { S.step = ""; }]);
  if (S.step) c.push([S.step, () => {}]);
  $("crumbs").replaceChildren();
  c.forEach(([label, f], i) => {
    const a = document.createElement("a"); a.textContent = label;
    a.onclick = () => { f(); render(); };
    $("crumbs").append(a); if (i < c.length - 1) $("crumbs").append(" > ");
  });
}
function showError(message) { $("error").textContent = message; $("error").hidden = !message; }
async function getJSON(path, params) {
  const r = await fetch(path + "?" + new URLSearchParams(params), {credentials: "same-origin"});
  const body = await r.json().catch(() => ({}));
  if (r.status === 401) throw new Error("signed out (" + (body.error || "401") + "): reload the page to sign in again");
  if (!r.ok) throw new Error(body.error || r.statusText);
  return body;
}
function table(cols, rows) {
  const t = document.createElement("table"), head = t.insertRow();
  for (const c of cols) { const th = document.createElement("th"); th.textContent = c; head.append(th); }
  for (const r of rows) { const tr = t.insertRow(); for (const c of cols) tr.insertCell().textContent = r[c] ?? ""; }
  return t;
}
async function showExecutions() {
  const tenants = uniq(filtered(), "tenant"), tenant = S.tenant || (tenants.length === 1 ? tenants[0] : "");
  $("exec-title").textContent = `${tenant} / ${S.playbook} / ${S.step}`;
  if (INLINE) { $("executions").textContent = "per-execution drill-down needs `noetl-dagster dashboard serve`"; return; }
  try {
    const rows = await getJSON("/api/executions", {tenant, playbook: S.playbook, step: S.step, start: $("f-start").value, end: $("f-end").value});
    $("executions").replaceChildren(table(["execution_id", "started", "attempts", "failed", "cpu_core_hours", "seconds"], rows));
  } catch (e) { showError(e.message); }
}
async function fetchData(range) {
  S.data = await getJSON("/api/data", range);
  S.cluster = S.data.viewer && S.data.viewer.admin ? await getJSON("/api/cluster", {start: S.data.start, end: S.data.end}) : null;
}
async function main() {
  if (INLINE) { S.data = INLINE; S.cluster = INLINE.cluster || null; } else await fetchData({});
  for (const k of ["start", "end"]) { const el = $("f-" + k); el.value = S.data[k]; el.min = S.data.min_day; el.max = S.data.max_day; }
  for (const k of ["tenant", "project", "playbook"]) $("f-" + k).onchange = (e) => { S[k] = e.target.value; S.step = ""; render(); };
  for (const k of ["start", "end"]) {
    $("f-" + k).onchange = async () => {
      try { if (!INLINE) await fetchData({start: $("f-start").value, end: $("f-end").value}); showError(""); } catch (e) { showError(e.message); }
      render();
    };
  }
  $("f-topn").onchange = render;
  render();
  $("topn").on("plotly_click", (ev) => { [S.tenant, S.playbook] = ev.points[0].customdata; S.step = ""; render(); });
  $("steps").on("plotly_click", (ev) => {
    const v = ev.points[0].customdata[0];
    if (S.level === "tenant") S.tenant = v; else if (S.level === "playbook") S.playbook = v; else { S.step = v; showExecutions(); }
    render();
  });
  document.body.dataset.ready = "1";
}
main().catch((e) => { showError(e.message); document.body.dataset.ready = "error"; });
