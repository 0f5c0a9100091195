"""The self-contained HTML page of gpurt.memviz: CSS, markup and the script that draws the
stacked-allocations timeline as SVG from the embedded JSON (no network, no libraries)."""

PAGE = r"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>__TITLE__</title>
<style>
body { font: 13px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0;
       color: #222; background: #fafafa; }
header { padding: 14px 22px 6px; }
h1 { font-size: 19px; margin: 0 0 4px; }
h2 { font-size: 15px; margin: 18px 0 6px; }
.explain { color: #555; max-width: 1100px; margin: 2px 0 0; }
.device { background: #fff; border: 1px solid #ddd; border-radius: 6px; margin: 12px 22px;
          padding: 10px 14px 14px; }
.cards { display: flex; flex-wrap: wrap; gap: 8px; margin: 6px 0 8px; }
.card { border: 1px solid #e3e3e3; border-radius: 5px; padding: 5px 10px; background: #fcfcfc; }
.card b { display: block; font-size: 16px; }
.card.alarm { border-color: #d62728; background: #fff3f3; color: #a00; }
.controls { margin: 4px 0; color: #444; }
.controls button { font: inherit; padding: 1px 8px; margin-right: 4px; }
.controls button.on { background: #333; color: #fff; border-color: #333; }
svg.chart { width: 100%; height: auto; display: block; user-select: none; cursor: crosshair; }
svg .band { stroke: rgba(255,255,255,0.55); stroke-width: 0.5; }
svg .band.hl { stroke: #000; stroke-width: 1.6; }
svg.dim .band:not(.hl) { opacity: 0.22; }
svg .axis text { font-size: 11px; fill: #444; }
svg .axis line, svg .axis path { stroke: #999; }
svg .grid { stroke: #eee; }
.tables { display: flex; flex-wrap: wrap; gap: 26px; }
table { border-collapse: collapse; font-size: 12px; }
th { text-align: left; border-bottom: 1px solid #bbb; padding: 2px 8px; font-weight: 600; }
td { padding: 2px 8px; border-bottom: 1px solid #f0f0f0; vertical-align: top; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.row:hover { background: #f1f5ff; cursor: default; }
.sw { display: inline-block; width: 11px; height: 11px; border-radius: 2px;
      vertical-align: -1px; margin-right: 5px; border: 1px solid rgba(0,0,0,0.15); }
.leak { color: #c00; font-weight: 600; }
.pending { color: #b26b00; }
#tip { position: fixed; pointer-events: none; background: rgba(255,255,255,0.97);
       border: 1px solid #999; border-radius: 4px; padding: 6px 9px; font-size: 12px;
       max-width: 560px; box-shadow: 0 2px 8px rgba(0,0,0,0.18); display: none; z-index: 5; }
#tip .frames { font-family: ui-monospace, Menlo, monospace; font-size: 11px; color: #333;
               margin-top: 4px; white-space: pre; }
.notice { color: #a00; }
</style>
</head>
<body>
<header>
<h1>__TITLE__</h1>
<p class="explain">Each coloured band is one allocation, from the moment it was allocated to the
moment it was freed; its height is its size. Bands are stacked in allocation order, so the top
edge is the total allocated memory and a freed band lets everything above it slide down.
Colour = the line of code that allocated it; faded bands were allocated before recording
began. <span class="leak">Red-hatched bands were still
allocated when the trace ended</span>: leak suspects. Dashed line: memory reserved by the
caching allocator. Scroll to zoom, drag to pan, double-click to reset; hover for details.</p>
</header>
<div id="devices"></div>
<div id="tip"></div>
<script type="application/json" id="memviz-data">__DATA__</script>
<script>
"use strict";
const DATA = JSON.parse(document.getElementById("memviz-data").textContent);
const NS = "http://www.w3.org/2000/svg";
const W = 1240, H = 520, M = {l: 78, r: 150, t: 14, b: 42};
const tip = document.getElementById("tip");

function fmtBytes(n) {
  const u = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (Math.abs(n) >= 1024 && i < u.length - 1) { n /= 1024; i++; }
  return i === 0 ? n.toFixed(0) + " B" : n.toFixed(n >= 100 ? 0 : n >= 10 ? 1 : 2) + " " + u[i];
}
function fmtMs(us) {
  const ms = us / 1000, digits = Math.abs(ms) >= 100 ? 0 : Math.abs(ms) >= 10 ? 1 : 3;
  return parseFloat(ms.toFixed(digits)) + " ms";
}
function el(name, attrs, parent) {
  const e = document.createElementNS(NS, name);
  for (const k in attrs) e.setAttribute(k, attrs[k]);
  if (parent) parent.appendChild(e);
  return e;
}
function html(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined) e.textContent = text;
  if (cls) e.className = cls;
  return e;
}
function niceTicks(lo, hi, n) {
  const span = hi - lo;
  if (!(span > 0)) return [lo];
  const raw = span / n, mag = Math.pow(10, Math.floor(Math.log10(raw)));
  const step = [1, 2, 5, 10].map(m => m * mag).find(s => span / s <= n) || 10 * mag;
  const out = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + 1e-9; v += step) out.push(v);
  return out;
}
function byteTicks(hi) {  // [bytes, label] in one unit: 0, 0.5, 1, 1.5 GiB ...
  const names = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (hi / Math.pow(1024, i) >= 2 * 1024 && i < names.length - 1) i++;
  const unit = Math.pow(1024, i);
  return niceTicks(0, hi / unit, 6).map(v => [v * unit, parseFloat(v.toFixed(3)) + " " + names[i]]);
}

function Chart(tl, root) {
  const self = this;
  this.tl = tl;
  this.mode = location.hash === "#time" ? "time" : "events";
  this.showReserved = true;
  const xmax = tl.steps + 1;
  this.view = [0, xmax];
  let ytop = Math.max(1, ...tl.envelope.map(p => p[2]));
  if (tl.reserved) ytop = Math.max(ytop, ...tl.reserved.map(p => p[1]));
  this.ytop = ytop * 1.06;

  const controls = html("div", undefined, "controls");
  controls.append("x axis: ");
  const bEvents = html("button", "allocation events"), bTime = html("button", "time");
  const bReset = html("button", "reset zoom");
  const cbLabel = html("label");
  const cb = document.createElement("input");
  cb.type = "checkbox"; cb.checked = true;
  cbLabel.append(cb, " reserved memory line");
  controls.append(bEvents, bTime, " ", bReset, " ", cbLabel);
  root.appendChild(controls);
  bEvents.onclick = () => { self.mode = "events"; self.draw(); };
  bTime.onclick = () => { self.mode = "time"; self.draw(); };
  bReset.onclick = () => { self.view = [0, xmax]; self.draw(); };
  cb.onchange = () => { self.showReserved = cb.checked; self.draw(); };
  this.buttons = {events: bEvents, time: bTime};

  const svg = el("svg", {viewBox: `0 0 ${W} ${H}`, class: "chart"}, root);
  this.svg = svg;
  const defs = el("defs", {}, svg);
  const pat = el("pattern", {id: "hatch" + tl.device, width: 7, height: 7,
                             patternUnits: "userSpaceOnUse", patternTransform: "rotate(45)"}, defs);
  el("rect", {width: 7, height: 7, fill: "rgba(214,39,40,0.16)"}, pat);
  el("line", {x1: 0, y1: 0, x2: 0, y2: 7, stroke: "#d62728", "stroke-width": 3}, pat);
  const clip = el("clipPath", {id: "clip" + tl.device}, defs);
  el("rect", {x: M.l, y: M.t, width: W - M.l - M.r, height: H - M.t - M.b}, clip);

  // wheel zoom, drag pan, double-click reset
  const toData = ev => {
    const r = svg.getBoundingClientRect();
    const px = (ev.clientX - r.left) * W / r.width;
    return self.invX(px);
  };
  svg.addEventListener("wheel", ev => {
    ev.preventDefault();
    const s = toData(ev), f = ev.deltaY > 0 ? 1.25 : 0.8;
    let [a, b] = self.view;
    a = s - (s - a) * f; b = s + (b - s) * f;
    if (b - a > xmax) { a = 0; b = xmax; }
    if (b - a < 2) return;
    self.view = [Math.max(0, a), Math.min(xmax, b)];
    self.draw();
  }, {passive: false});
  let drag = null;
  svg.addEventListener("mousedown", ev => { drag = {x: toData(ev)}; });
  window.addEventListener("mouseup", () => { drag = null; });
  svg.addEventListener("mousemove", ev => {
    if (!drag) return;  // keep the data point grabbed under the pointer
    const [a, b] = self.view;
    const d = Math.max(-a, Math.min(drag.x - toData(ev), xmax - b));
    if (d === 0) return;
    self.view = [a + d, b + d];
    self.draw();
  });
  svg.addEventListener("dblclick", () => { self.view = [0, xmax]; self.draw(); });
  this.draw();
}

// x: the step axis (0 .. steps + 1) is the data axis; in time mode it is warped by times.
Chart.prototype.stepToT = function (x) {
  const t = this.tl.times, i = Math.max(0, Math.min(t.length - 2, Math.floor(x)));
  return t[i] + (t[i + 1] - t[i]) * (x - i);
};
Chart.prototype.tToStep = function (v) {
  const t = this.tl.times;
  let lo = 0, hi = t.length - 1;
  if (v <= t[0]) return 0;
  if (v >= t[hi]) return hi;
  while (hi - lo > 1) { const mid = (lo + hi) >> 1; if (t[mid] <= v) lo = mid; else hi = mid; }
  return lo + (t[hi] > t[lo] ? (v - t[lo]) / (t[hi] - t[lo]) : 0);
};
Chart.prototype.X = function (x) {
  const [a, b] = this.view;
  if (this.mode === "time") {
    const ta = this.stepToT(a), tb = this.stepToT(b);
    return M.l + (this.stepToT(x) - ta) / (tb - ta) * (W - M.l - M.r);
  }
  return M.l + (x - a) / (b - a) * (W - M.l - M.r);
};
Chart.prototype.invX = function (px) {
  const [a, b] = this.view, f = (px - M.l) / (W - M.l - M.r);
  if (this.mode === "time") {
    const ta = this.stepToT(a), tb = this.stepToT(b);
    return this.tToStep(ta + f * (tb - ta));
  }
  return a + f * (b - a);
};
Chart.prototype.Y = function (v) { return H - M.b - v / this.ytop * (H - M.t - M.b); };

Chart.prototype.bandPath = function (band) {
  const p = band.p, pts = [];
  for (let i = 0; i < p.length; i += 2) pts.push([this.X(p[i]), this.Y(p[i + 1])]);
  const top = [];
  for (let i = p.length - 2; i >= 0; i -= 2) top.push([this.X(p[i]), this.Y(p[i + 1] + band.s)]);
  return "M" + pts.concat(top).map(q => q[0].toFixed(1) + "," + q[1].toFixed(1)).join("L") + "Z";
};

Chart.prototype.draw = function () {
  const tl = this.tl, svg = this.svg, self = this;
  this.buttons.events.className = this.mode === "events" ? "on" : "";
  this.buttons.time.className = this.mode === "time" ? "on" : "";
  for (const old of svg.querySelectorAll("g")) old.remove();
  const grid = el("g", {}, svg), axes = el("g", {class: "axis"}, svg);
  const plot = el("g", {"clip-path": `url(#clip${tl.device})`}, svg), notes = el("g", {}, svg);
  const x0 = M.l, x1 = W - M.r, y0 = H - M.b;

  for (const [v, label] of byteTicks(this.ytop)) {
    const y = this.Y(v);
    el("line", {x1: x0, x2: x1, y1: y, y2: y, class: "grid"}, grid);
    el("text", {x: x0 - 6, y: y + 4, "text-anchor": "end"}, axes).textContent = label;
  }
  const [a, b] = this.view;
  if (this.mode === "time") {
    const ta = this.stepToT(a), tb = this.stepToT(b), t0 = tl.times[1] || tl.times[0];
    for (const v of niceTicks(ta - t0, tb - t0, 8)) {
      const px = x0 + (v + t0 - ta) / (tb - ta) * (x1 - x0);
      el("line", {x1: px, x2: px, y1: y0, y2: y0 + 4}, axes);
      el("text", {x: px, y: y0 + 17, "text-anchor": "middle"}, axes).textContent = fmtMs(v);
    }
  } else {
    for (const v of niceTicks(a, b, 10)) {
      const px = this.X(v);
      el("line", {x1: px, x2: px, y1: y0, y2: y0 + 4}, axes);
      const label = el("text", {x: px, y: y0 + 17, "text-anchor": "middle"}, axes);
      label.textContent = String(Math.round(v));
    }
  }
  el("text", {x: (x0 + x1) / 2, y: H - 6, "text-anchor": "middle"}, axes).textContent =
    this.mode === "time" ? "time since the first event" : "allocation and free events (in order)";
  el("path", {d: `M${x0},${M.t}V${y0}H${x1}`, fill: "none"}, axes);

  // bands, the merged small allocations, the total and reserved lines
  this.paths = [];
  for (const band of tl.bands) {
    const color = tl.callsites[band.c].color;
    const path = el("path", {d: this.bandPath(band), fill: color, class: "band"}, plot);
    if (band.t0 === null) path.setAttribute("fill-opacity", "0.5");  // from before the trace
    path.dataset.band = band.i;
    this.paths.push(path);
    const outline = {d: path.getAttribute("d"), "pointer-events": "none"};
    if (band.leak) {
      el("path", {...outline, fill: `url(#hatch${tl.device})`, stroke: "#d62728",
                  "stroke-width": 1}, plot);
    } else if (band.pend) {
      el("path", {...outline, fill: "none", stroke: "#e08a00", "stroke-width": 1.2,
                  "stroke-dasharray": "3,2"}, plot);
    }
  }
  const env = tl.envelope;
  if (tl.merged_count > 0) {
    const lower = env.map(p => `${this.X(p[0]).toFixed(1)},${this.Y(p[1]).toFixed(1)}`);
    const upper = env.map(p => `${this.X(p[0]).toFixed(1)},${this.Y(p[2]).toFixed(1)}`).reverse();
    const o = el("path", {d: "M" + lower.concat(upper).join("L") + "Z", fill: "#c9c9c9",
                          class: "band"}, plot);
    o.dataset.band = "merged";
  }
  const line = (points, y) => "M" + points.map(
    p => `${this.X(p[0]).toFixed(1)},${this.Y(p[y]).toFixed(1)}`).join("L");
  el("path", {d: line(env, 2), fill: "none", stroke: "#222", "stroke-width": 1.1,
              "pointer-events": "none"}, plot);
  if (tl.reserved && this.showReserved) {
    el("path", {d: line(tl.reserved, 1), fill: "none", stroke: "#555", "stroke-width": 1.3,
                "stroke-dasharray": "6,4", "pointer-events": "none"}, plot);
  }
  const labels = [];  // [x, row] of marker labels drawn, so close ones stack downwards
  for (const [x, t, kind] of tl.markers) {
    const px = this.X(this.mode === "time" ? this.tToStep(t) : x);
    if (px < x0 || px > x1) continue;
    const color = kind === "oom" ? "#d62728" : "#777";
    el("line", {x1: px, x2: px, y1: M.t, y2: y0, stroke: color, "stroke-width": 1.2,
                "stroke-dasharray": kind === "oom" ? "" : "2,3"}, plot);
    let row = 0;
    while (labels.some(([lx, r]) => r === row && Math.abs(lx - px) < 90)) row++;
    labels.push([px, row]);
    const label = el("text", {x: px + 3, y: M.t + 11 + 13 * row, fill: color, "font-size": 11},
                     plot);
    label.textContent = kind === "oom" ? "out of memory" : "empty_cache";
  }
  // right margin: what is still allocated at the end
  if (b >= tl.steps + 0.5) {
    const end = env[env.length - 1], gx = x1 + 8;
    const leaks = tl.bands.filter(bd => bd.leak);
    if (leaks.length) {  // a bracket over the leak suspects' span at the right edge
      const lo = Math.min(...leaks.map(bd => bd.p[bd.p.length - 1]));
      const hi = Math.max(...leaks.map(bd => bd.p[bd.p.length - 1] + bd.s));
      const mid = (this.Y(lo) + this.Y(hi)) / 2;
      el("path", {d: `M${gx},${this.Y(lo)}h5V${this.Y(hi)}h-5`, fill: "none", stroke: "#d62728",
                  "stroke-width": 2}, notes);
      el("text", {x: gx + 10, y: mid - 2, fill: "#c00", "font-weight": 600, "font-size": 12},
         notes).textContent = "never freed";
      el("text", {x: gx + 10, y: mid + 12, fill: "#c00", "font-size": 11}, notes).textContent =
        `${tl.leak_count} allocs, ${fmtBytes(tl.leak_bytes)}`;
    }
    const tt = el("text", {x: gx, y: this.Y(end[2]) - 6, fill: "#222", "font-size": 11}, notes);
    tt.textContent = "total " + fmtBytes(end[2]);
  }
  const peak = tl.peak;
  if (peak.step >= a && peak.step <= b) {
    const px = this.X(peak.step), py = this.Y(peak.bytes);
    el("circle", {cx: px, cy: py, r: 3.5, fill: "#222"}, plot);
    const t = el("text", {x: px + 5, y: py - 6, "font-size": 11, fill: "#222"}, plot);
    t.textContent = "peak " + fmtBytes(peak.bytes);
  }

  plot.addEventListener("mousemove", ev => self.hover(ev));
  plot.addEventListener("mouseleave", () => { tip.style.display = "none"; self.highlight(null); });
};

Chart.prototype.highlight = function (test) {
  this.svg.classList.toggle("dim", test !== null);
  for (const p of this.paths) {
    const band = this.tl.bandIndex[p.dataset.band];
    p.classList.toggle("hl", test !== null && test(band));
  }
};

Chart.prototype.hover = function (ev) {
  const id = ev.target.dataset ? ev.target.dataset.band : undefined;
  if (id === undefined) { tip.style.display = "none"; return; }
  const tl = this.tl;
  let text;
  if (id === "merged") {
    text = `<b>${tl.merged_count} smaller allocations</b> merged into one grey band (only the ` +
           `${tl.bands.length} largest are drawn one by one)`;
    this.highlight(null);
  } else {
    const b = tl.bandIndex[id];
    this.highlight(x => x === b);
    const life = b.t0 === null ? "allocated before the trace began"
      : `allocated at ${fmtMs(b.t0 - tl.t0)} (event ${b.st})`;
    let end;
    if (b.leak) {
      end = `<span class="leak">never freed: still allocated at the end of the trace</span>`;
    } else if (b.pend) {
      end = `<span class="pending">freed by the program, release still pending at the end</span>`;
    }
    else if (b.en === null) end = "still allocated at the end";
    else end = `freed at ${fmtMs(b.t1 - tl.t0)} (event ${b.en})`;
    const frames = b.f.map(i => tl.frames[i]).join("\n") || "(no stack recorded)";
    text = `<b>${fmtBytes(b.s)}</b> at ${b.a} · stream ${b.stream}<br>${life}<br>${end}` +
           `<div class="frames">${frames.replace(/&/g, "&amp;").replace(/</g, "&lt;")}</div>`;
  }
  tip.innerHTML = text;
  tip.style.display = "block";
  const x = ev.clientX + 14, y = ev.clientY + 14;
  tip.style.left = Math.min(x, window.innerWidth - tip.offsetWidth - 8) + "px";
  tip.style.top = Math.min(y, window.innerHeight - tip.offsetHeight - 8) + "px";
};

function table(headers, rows, onHover, chart) {
  const t = html("table"), head = html("tr");
  for (const h of headers) head.appendChild(html("th", h));
  t.appendChild(head);
  for (const r of rows) {
    const tr = html("tr", undefined, "row");
    for (const c of r.cells) {
      const td = html("td", undefined, c.cls || "");
      if (c.swatch) {
        const swatch = html("span", undefined, "sw");
        swatch.style.background = c.swatch;
        td.appendChild(swatch);
      }
      td.append(c.text);
      tr.appendChild(td);
    }
    tr.onmouseenter = () => chart.highlight(r.test);
    tr.onmouseleave = () => chart.highlight(null);
    t.appendChild(tr);
  }
  return t;
}

for (const tl of DATA.timelines) {
  tl.bandIndex = {};
  for (const b of tl.bands) tl.bandIndex[b.i] = b;
  const root = html("section", undefined, "device");
  document.getElementById("devices").appendChild(root);
  root.appendChild(html("h2", `cuda:${tl.device}`));
  const cards = html("div", undefined, "cards");
  const card = (label, value, alarm) => {
    const c = html("div", undefined, "card" + (alarm ? " alarm" : ""));
    c.appendChild(html("b", value)); c.append(label); cards.appendChild(c);
  };
  card("allocations in the trace", String(tl.count));
  card("peak allocated", fmtBytes(tl.peak.bytes));
  card("allocated at the end", fmtBytes(tl.end_bytes));
  if (tl.reserved) card("reserved at the end", fmtBytes(tl.reserved[tl.reserved.length - 1][1]));
  card("never freed (leak suspects)", `${tl.leak_count} · ${fmtBytes(tl.leak_bytes)}`,
       tl.leak_count > 0);
  if (tl.oom_count) card("out-of-memory events", String(tl.oom_count), true);
  root.appendChild(cards);
  for (const n of tl.notices) root.appendChild(html("p", n, "notice"));
  const chart = new Chart(tl, root);
  const tables = html("div", undefined, "tables");
  root.appendChild(tables);

  const leakSites = tl.callsites.filter(c => c.leak_count > 0)
    .sort((p, q) => q.leak_bytes - p.leak_bytes);
  if (leakSites.length) {
    const box = html("div");
    box.appendChild(html("h2", "Never freed, by the line that allocated it", "leak"));
    box.appendChild(table(["where", "allocations", "bytes"], leakSites.map(c => ({
      cells: [{text: c.name, swatch: c.color}, {text: String(c.leak_count), cls: "num"},
              {text: fmtBytes(c.leak_bytes), cls: "num leak"}],
      test: b => b.leak && tl.callsites[b.c] === c})), null, chart));
    tables.appendChild(box);
  }
  const box2 = html("div");
  box2.appendChild(html("h2", "Largest allocations"));
  box2.appendChild(table(["size", "where", "lifetime"], tl.largest.map(i => {
    const b = tl.bandIndex[i], c = tl.callsites[b.c];
    const life = b.leak ? "never freed" : b.pend ? "free pending at end" :
      b.en === null ? "before trace → end" :
      (b.t0 === null ? "before trace" : "event " + b.st) + " → " + b.en;
    return {cells: [{text: fmtBytes(b.s), cls: "num", swatch: c.color}, {text: c.name},
                    {text: life, cls: b.leak ? "leak" : ""}], test: x => x === b};
  }), null, chart));
  tables.appendChild(box2);
  const box3 = html("div");
  box3.appendChild(html("h2", "Colours: where allocations come from"));
  box3.appendChild(table(["where", "allocations", "bytes allocated", "largest"],
    tl.callsites.slice(0, 16).map(c => ({
      cells: [{text: c.name, swatch: c.color}, {text: String(c.count), cls: "num"},
              {text: fmtBytes(c.bytes), cls: "num"}, {text: fmtBytes(c.largest), cls: "num"}],
      test: b => tl.callsites[b.c] === c})), null, chart));
  tables.appendChild(box3);
}
</script>
</body>
</html>
"""
