// The hpcgpu page: polls data.json beside itself every second and draws runs,
// diagnostics (SVG sparklines), partitions per worker and GPU readings.
// All text from the cluster goes in through textContent, never as HTML.
"use strict";
const base = location.pathname.replace(/\/+$/, "");
document.getElementById("status-link").href = base.replace(/hpcgpu$/, "status");
const SKIP = new Set(["step", "time", "wall_s"]);

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v; else node.setAttribute(k, v);
  }
  for (const c of children) {
    if (c === null || c === undefined) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}
function num(x, digits) {
  if (x === null || x === undefined || Number.isNaN(x)) return "-";
  if (typeof x !== "number") return String(x);
  const a = Math.abs(x);
  if (Number.isInteger(x) && a < 1e9) return x.toLocaleString("en-US");
  if (a !== 0 && (a >= 1e6 || a < 1e-3)) return x.toExponential(digits || 4);
  return x.toPrecision(digits || 5).replace(/\.?0+$/, "");
}
function duration(s) {
  if (s === null || s === undefined) return "-";
  if (s < 120) return num(s, 3) + " s";
  const d = Math.floor(s / 86400), h = Math.floor(s % 86400 / 3600), m = Math.floor(s % 3600 / 60);
  return (d ? d + "d " : "") + String(h).padStart(2, "0") + ":" + String(m).padStart(2, "0")
         + ":" + String(Math.floor(s % 60)).padStart(2, "0");
}
function bytes(b) {
  if (b === null || b === undefined) return "-";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"]; let i = 0;
  while (b >= 1024 && i < units.length - 1) { b /= 1024; i++; }
  return b.toFixed(i ? 1 : 0) + " " + units[i];
}
function stat(key, value, cls) {
  return el("div", {class: "stat"}, el("div", {class: "k"}, key), el("div", {class: "v " + (cls || "")}, value));
}
function sparkline(xs, ys) {
  const ns = "http://www.w3.org/2000/svg", W = 232, H = 46;
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  const pts = [];
  for (let i = 0; i < ys.length; i++) if (ys[i] !== null && xs[i] !== null) pts.push([xs[i], ys[i]]);
  if (pts.length) {
    let x0 = Math.min(...pts.map(p => p[0])), x1 = Math.max(...pts.map(p => p[0]));
    let y0 = Math.min(...pts.map(p => p[1])), y1 = Math.max(...pts.map(p => p[1]));
    if (x1 === x0) x1 = x0 + 1;
    // Rounding-level wiggles (a conserved mass) draw flat, not as full-height noise.
    const pad = Math.max(Math.abs(y0), Math.abs(y1), 1e-300) * 1e-9;
    if (y1 - y0 < pad) { const c = (y0 + y1) / 2; y0 = c - pad; y1 = c + pad; }
    const line = document.createElementNS(ns, "polyline");
    line.setAttribute("points", pts.map(([x, y]) =>
      (2 + (x - x0) / (x1 - x0) * (W - 4)).toFixed(1) + "," + (H - 3 - (y - y0) / (y1 - y0) * (H - 6)).toFixed(1)
    ).join(" "));
    svg.append(line);
  }
  return svg;
}
function runCard(run) {
  const status = run.status || "running";
  const card = el("section", {class: "run", "data-run": run.id});
  card.append(el("div", {class: "run-head"},
    el("span", {class: "run-name"}, run.name || run.id),
    el("span", {class: "badge " + status}, status),
    el("span", {class: "sub"}, "updated " + duration(run.age_s) + " ago")));
  card.append(el("div", {class: "run-model"}, run.model || ""));
  if (run.error) card.append(el("div", {class: "run-error"}, run.error));
  const stats = el("div", {class: "stats"});
  stats.append(stat("step", num(run.step), "run-step"));
  stats.append(stat("model time", num(run.time)));
  stats.append(stat("dt", num(run.dt)));
  stats.append(stat("steps/s", num(run.steps_per_s, 4), "run-rate"));
  stats.append(stat("wall time", duration(run.wall_s)));
  if (run.backend) stats.append(stat("backend", run.backend));
  if (run.partitions) stats.append(stat("partitions x steps/task", run.partitions + " x " + (run.steps_per_task || 1)));
  card.append(stats);
  const series = run.series || {};
  // the workload's declared diagnostics first (in its order), then the others by name
  const first = (run.plot_first || []).filter(k => k in series && !SKIP.has(k));
  const keys = first.concat(Object.keys(series).filter(k => !SKIP.has(k) && !first.includes(k)).sort());
  if (keys.length) {
    card.append(el("div", {class: "sub"}, "diagnostics (against step; " + (series.step || []).length + " points)"));
    const grid = el("div", {class: "grid"});
    for (const k of keys) {
      const ys = series[k], first = ys.find(y => y !== null), last = ys[ys.length - 1];
      let change = "";
      if (first && last !== null && last !== undefined && k !== "max_cfl") {
        change = " (" + ((last - first) / Math.abs(first) >= 0 ? "+" : "") + ((last - first) / Math.abs(first)).toExponential(1) + ")";
      }
      grid.append(el("div", {class: "spark", "data-diagnostic": k},
        el("div", {class: "k"}, el("span", {}, k), el("span", {class: "v"}, num(last) + change)),
        sparkline(series.step || [], ys)));
    }
    card.append(grid);
  }
  const workers = run.workers || {};
  const names = Object.keys(workers).sort();
  if (names.length) {
    const unit = run.unit || "items";
    const most = Math.max(1, ...names.map(w => workers[w][unit] || 0));
    card.append(el("div", {class: "sub"}, "partitions per worker"));
    const table = el("table", {class: "partitions"},
      el("tr", {}, el("th", {}, "worker"), el("th", {}, "partitions"), el("th", {}, unit), el("th", {}, "")));
    for (const w of names) {
      const n = workers[w][unit] || 0;
      table.append(el("tr", {}, el("td", {}, w), el("td", {}, num(workers[w].partitions)), el("td", {}, num(n)),
        el("td", {}, el("span", {class: "bartrack"}, el("span", {class: "bar", style: `width:${(120 * n / most).toFixed(0)}px`})))));
    }
    card.append(table);
  }
  return card;
}
function gpuTable(gpus) {
  if (!gpus || !gpus.available || !(gpus.devices || []).length) {
    return [el("p", {class: "empty"}, "not available" + (gpus && gpus.reason ? " (" + gpus.reason + ")" : ""))];
  }
  const table = el("table", {},
    el("tr", {}, ...["host", "GPU", "name", "workers", "utilisation", "memory", "power", "temperature"].map(h => el("th", {}, h))));
  for (const g of gpus.devices) {
    const util = g.utilization === null ? "-" : g.utilization + " %";
    const mem = bytes(g.memory_used) + " / " + bytes(g.memory_total);
    const power = g.power_w === null ? "-" : num(g.power_w, 3) + " W" + (g.power_limit_w ? " / " + num(g.power_limit_w, 3) + " W" : "");
    const temp = g.temperature_c === null ? "-" : num(g.temperature_c, 3) + " \u00b0C";
    table.append(el("tr", {}, el("td", {}, g.host || "-"), el("td", {}, num(g.index)), el("td", {}, g.name || "-"),
      el("td", {}, (g.workers || []).join(", ")), el("td", {}, util), el("td", {}, mem), el("td", {}, power), el("td", {}, temp)));
  }
  const out = [table];
  if (gpus.reason) out.push(el("p", {class: "sub"}, "some workers report no GPU: " + gpus.reason));
  return out;
}
function render(data) {
  const runs = data.runs || [];
  document.getElementById("runs").replaceChildren(...(runs.length ? runs.map(runCard)
    : [el("p", {class: "empty"}, "No hpcgpu simulation has run on this cluster yet.")]));
  document.getElementById("gpus").replaceChildren(...gpuTable(data.gpus));
  const workers = data.workers || [];
  const wt = el("table", {}, el("tr", {}, el("th", {}, "worker"), el("th", {}, "name"), el("th", {}, "threads"), el("th", {}, "memory limit")));
  for (const w of workers) wt.append(el("tr", {}, el("td", {}, w.address), el("td", {}, w.name), el("td", {}, num(w.nthreads)), el("td", {}, bytes(w.memory_limit))));
  document.getElementById("workers").replaceChildren(workers.length ? wt : el("p", {class: "empty"}, "no workers"));
  if (data.error) throw new Error(data.error);
}
async function poll() {
  const conn = document.getElementById("conn");
  try {
    const response = await fetch(base + "/data.json", {cache: "no-store"});
    if (!response.ok) throw new Error("HTTP " + response.status);
    render(await response.json());
    conn.textContent = "live \u00b7 " + new Date().toLocaleTimeString();
    conn.className = "";
  } catch (error) {
    conn.textContent = "no data: " + error.message;
    conn.className = "bad";
  }
  setTimeout(poll, 1000);
}
poll();
