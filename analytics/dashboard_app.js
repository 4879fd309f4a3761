// The cost dashboard's client: filters over the allocation rollup rows, Plotly charts, drill-down.
const S = {tenant: "", project: "", playbook: "", step: "", data: null};
const $ = (id) => document.getElementById(id);
const sum = (rows, k) => rows.reduce((a, r) => a + (+r[k] || 0), 0);
function groupBy(rows, keyf) {
  const m = new Map();
  for (const r of rows) { const k = keyf(r); if (!m.has(k)) m.set(k, []); m.get(k).push(r); }
  return m;
}
function fill(sel, values, current) {
  const el = $(sel);
  el.innerHTML = '<option value="">(all)</option>' + values.map((v) => `<option${v === current ? " selected" : ""}>${v}</option>`).join("");
}
function filtered(ignore) {
  const st = $("f-start").value, en = $("f-end").value;
  return S.data.rows.filter((r) => (!S.tenant || ignore === "tenant" || r.tenant === S.tenant)
    && (!S.project || ignore === "project" || r.project === S.project)
    && (!S.playbook || ignore === "playbook" || r.playbook === S.playbook)
    && (!st || r.day >= st) && (!en || r.day <= en));
}
function uniq(rows, k) { return [...new Set(rows.map((r) => r[k]))].sort(); }
const layout = (title, extra) => Object.assign({title: {text: title, font: {size: 14}}, margin: {l: 60, r: 10, t: 36, b: 80}, barmode: "stack", legend: {orientation: "h"}}, extra || {});
function render() {
  const d = S.data, cur = d.currency || "";
  $("banner").style.display = d.synthetic ? "block" : "none";
  $("meta").textContent = `${d.start} .. ${d.end}, prices ${d.price_version} (${cur})`;
  fill("f-tenant", uniq(filtered("tenant"), "tenant"), S.tenant);
  fill("f-project", uniq(filtered("project"), "project"), S.project);
  fill("f-playbook", uniq(filtered("playbook"), "playbook"), S.playbook);
  const rows = filtered();
  const days = uniq(rows, "day");
  // 1. cost per day per tenant
  const byTenant = groupBy(rows, (r) => r.tenant);
  const ts = [...byTenant].map(([t, rs]) => {
    const byDay = groupBy(rs, (r) => r.day);
    return {type: "bar", name: t, x: days, y: days.map((x) => sum(byDay.get(x) || [], "cost"))};
  });
  Plotly.react("ts", ts, layout(`cost per day per tenant (${cur})`));
  // 2. allocated / unallocated / storage / idle per day (whole cluster: not filtered by tenant)
  const st = $("f-start").value, en = $("f-end").value;
  const sm = d.summary.filter((r) => (!st || r.day >= st) && (!en || r.day <= en));
  Plotly.react("idle", ["allocated", "unallocated", "storage", "idle"].map((k) => ({type: "bar", name: k, x: sm.map((r) => r.day), y: sm.map((r) => r[k])})),
    layout(`allocated, unallocated and idle per day (${cur}, all tenants)`));
  // 3. top N playbooks
  const n = Math.max(1, +$("f-topn").value || 10);
  const top = [...groupBy(rows, (r) => r.tenant + " / " + r.playbook)].map(([k, rs]) => [k, sum(rs, "cost")]).sort((a, b) => b[1] - a[1]).slice(0, n).reverse();
  Plotly.react("topn", [{type: "bar", orientation: "h", x: top.map((t) => t[1]), y: top.map((t) => t[0]), name: "cost"}],
    layout(`top ${n} playbooks by cost (click to drill down)`, {margin: {l: 220, r: 10, t: 36, b: 40}}));
  // 4. drill-down: tenants -> playbooks -> steps
  const level = S.playbook ? "step" : S.tenant ? "playbook" : "tenant";
  const parts = [...groupBy(rows, (r) => r[level])].map(([k, rs]) => [k, sum(rs, "cost"), sum(rs, "cpu_core_hours")]).sort((a, b) => b[1] - a[1]);
  Plotly.react("steps", [{type: "bar", x: parts.map((p) => p[0]), y: parts.map((p) => p[1]), name: "cost", customdata: parts.map((p) => p[2]),
    hovertemplate: "%{x}: %{y:.4f} " + cur + "<br>%{customdata:.4f} CPU core-hours<extra></extra>"}],
    layout(`cost per ${level} (click to drill down)`));
  // 5. error and retry rates per playbook
  const rates = [...groupBy(rows, (r) => r.playbook)].map(([k, rs]) => [k, sum(rs, "failed") / Math.max(sum(rs, "attempts"), 1), sum(rs, "retries") / Math.max(sum(rs, "attempts"), 1)]);
  Plotly.react("rates", [
    {type: "bar", name: "error rate", x: rates.map((r) => r[0]), y: rates.map((r) => r[1])},
    {type: "bar", name: "retry rate", x: rates.map((r) => r[0]), y: rates.map((r) => r[2])},
  ], layout("error and retry rate per playbook (task attempts)", {barmode: "group", yaxis: {tickformat: ".1%"}}));
  crumbs();
}
function crumbs() {
  const c = [['all', () => { S.tenant = S.playbook = S.step = ""; }]];
  if (S.tenant) c.push([S.tenant, () => { S.playbook = S.step = ""; }]);
  if (S.playbook) c.push([S.playbook, () => { S.step = ""; }]);
  if (S.step) c.push([S.step, () => {}]);
  $("crumbs").innerHTML = "";
  c.forEach(([label, f], i) => {
    const a = document.createElement("a"); a.textContent = label;
    a.onclick = () => { f(); render(); };
    $("crumbs").append(a); if (i < c.length - 1) $("crumbs").append(" > ");
  });
}
async function showExecutions() {
  $("exec-title").textContent = `${S.tenant} / ${S.playbook} / ${S.step}`;
  if (INLINE) { $("executions").textContent = "per-execution drill-down needs `noetl-dagster dashboard serve`"; return; }
  const q = new URLSearchParams({tenant: S.tenant, playbook: S.playbook, step: S.step, start: $("f-start").value, end: $("f-end").value});
  const rows = await (await fetch("/api/executions?" + q)).json();
  const cols = ["execution_id", "started", "attempts", "failed", "cpu_core_hours", "seconds"];
  $("executions").innerHTML = "<table><tr>" + cols.map((c) => `<th>${c}</th>`).join("") + "</tr>"
    + rows.map((r) => "<tr>" + cols.map((c) => `<td>${r[c]}</td>`).join("") + "</tr>").join("") + "</table>";
}
async function fetchData() {
  const q = new URLSearchParams({start: $("f-start").value, end: $("f-end").value});
  S.data = await (await fetch("/api/data?" + q)).json();
}
async function main() {
  if (INLINE) S.data = INLINE; else S.data = await (await fetch("/api/data")).json();
  for (const k of ["start", "end"]) { const el = $("f-" + k); el.value = S.data[k]; el.min = S.data.min_day; el.max = S.data.max_day; }
  for (const k of ["tenant", "project", "playbook"]) $("f-" + k).onchange = (e) => { S[k] = e.target.value; S.step = ""; render(); };
  for (const k of ["start", "end"]) $("f-" + k).onchange = async () => { if (!INLINE) await fetchData(); render(); };
  $("f-topn").onchange = render;
  render();
  $("topn").on("plotly_click", (ev) => { const [t, ...p] = ev.points[0].y.split(" / "); S.tenant = t; S.playbook = p.join(" / "); S.step = ""; render(); });
  $("steps").on("plotly_click", (ev) => {
    const v = ev.points[0].x;
    if (!S.tenant) S.tenant = v; else if (!S.playbook) S.playbook = v; else { S.step = v; showExecutions(); }
    render();
  });
  document.body.dataset.ready = "1";
}
main();
