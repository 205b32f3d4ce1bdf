// Trellis admin page: polls this broker's /api/* documents and those of every broker whose
// admin address it learns (/api/topology's admin_peers, or ?peers=host:port,... in the URL),
// draws the overlay as an SVG, and stitches traces from every broker's answer.
"use strict";

const POLL_MS = 1000;
const FETCH_TIMEOUT_MS = 1500;
const SVG = "http://www.w3.org/2000/svg";

const admins = new Map(); // broker id (or "self") -> admin base URL
const latest = new Map(); // broker id -> {topology, reconfig, at}
const previousTraffic = new Map(); // link key -> {total, at}
let self = null;
let polls = 0;
let tracedVNs = [];
let tracedLinks = new Set();

function addAdmin(id, url) {
  if (url && !url.startsWith("http")) url = "http://" + url;
  if (url) admins.set(id, url.replace(/\/$/, ""));
}

async function getJSON(base, path) {
  const ctl = new AbortController();
  const timer = setTimeout(() => ctl.abort(), FETCH_TIMEOUT_MS);
  try {
    const resp = await fetch(base + path, { signal: ctl.signal, cache: "no-store" });
    if (!resp.ok) throw new Error(`${base}${path}: HTTP ${resp.status}`);
    return await resp.json();
  } finally {
    clearTimeout(timer);
  }
}

function linkKey(a, b) {
  return a < b ? `${a}|${b}` : `${b}|${a}`;
}

function el(tag, attrs, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  if (text !== undefined) node.textContent = text;
  return node;
}

function html(tag, text, attrs = {}) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  if (text !== undefined) node.textContent = text;
  return node;
}

// -- the model: what every answering broker says, merged --------------------------------

function model() {
  const vnOf = new Map();
  const answering = new Set(latest.keys());
  for (const { topology } of latest.values()) {
    vnOf.set(topology.id, topology.vn);
    for (const [b, s] of Object.entries(topology.overlay.brokers)) vnOf.set(b, s.vn);
    const members = topology.manifest && topology.manifest.members;
    if (members) for (const [vn, ids] of Object.entries(members)) ids.forEach((b) => vnOf.set(b, vn));
  }
  // Links as this page's broker knows them (link states both ends announce), plus the live
  // links of every answering broker.
  const links = new Set();
  if (self) for (const [a, b] of self.overlay.vn_links) links.add(linkKey(a, b));
  for (const { topology } of latest.values()) {
    for (const peer of topology.links) {
      const a = topology.vn, b = vnOf.get(peer);
      if (b && a !== b) links.add(linkKey(a, b));
    }
  }
  const vns = new Map();
  for (const [b, vn] of vnOf) {
    if (!vns.has(vn)) vns.set(vn, []);
    vns.get(vn).push(b);
  }
  for (const members of vns.values()) members.sort();
  const traffic = new Map();
  const blame = new Map(); // culprit -> {share, copy, by:Set}
  for (const { topology } of latest.values()) {
    for (const [toVN, count] of Object.entries(topology.traffic.forwarded)) {
      const key = linkKey(topology.vn, toVN);
      traffic.set(key, (traffic.get(key) || 0) + count);
    }
    const note = (culprit) => {
      if (!blame.has(culprit)) blame.set(culprit, { share: 0, copy: 0, by: new Set() });
      return blame.get(culprit);
    };
    for (const [culprit, count] of Object.entries(topology.blame.share)) {
      const b = note(culprit); b.share += count; b.by.add(topology.id);
    }
    for (const { culprit, fault, count } of topology.blame.copy) {
      const b = note(culprit); b.copy += count; b.by.add(`${topology.id} (${fault})`);
    }
  }
  return { vnOf, vns, links, traffic, blame, answering };
}

// A layered tree layout: breadth first from the smallest VN id; a VN's depth is its column.
function layout(vns, links) {
  const adj = new Map([...vns.keys()].map((v) => [v, []]));
  for (const key of links) {
    const [a, b] = key.split("|");
    if (adj.has(a) && adj.has(b)) { adj.get(a).push(b); adj.get(b).push(a); }
  }
  const depth = new Map();
  const columns = [];
  for (const root of [...adj.keys()].sort()) {
    if (depth.has(root)) continue;
    const queue = [root];
    depth.set(root, 0);
    while (queue.length) {
      const v = queue.shift();
      const d = depth.get(v);
      (columns[d] = columns[d] || []).push(v);
      for (const w of adj.get(v).sort()) {
        if (!depth.has(w)) { depth.set(w, d + 1); queue.push(w); }
      }
    }
  }
  const pos = new Map();
  columns.forEach((col, d) => col.forEach((v, i) => pos.set(v, { x: 80 + d * 200, y: 60 + i * 110 })));
  const width = Math.max(900, 160 + columns.length * 200);
  const height = Math.max(360, 120 + Math.max(0, ...columns.map((c) => c.length)) * 110);
  return { pos, width, height };
}

function draw(m) {
  const svg = document.getElementById("overlay");
  const { pos, width, height } = layout(m.vns, m.links);
  svg.setAttribute("width", width);
  svg.setAttribute("height", height);
  svg.replaceChildren();
  const now = Date.now();
  for (const key of [...m.links].sort()) {
    const [a, b] = key.split("|");
    const pa = pos.get(a), pb = pos.get(b);
    if (!pa || !pb) continue;
    const cls = tracedLinks.has(key) ? "link traced" : "link";
    svg.append(el("line", { class: cls, "data-link": key, x1: pa.x, y1: pa.y, x2: pb.x, y2: pb.y }));
    const total = m.traffic.get(key) || 0;
    const prev = previousTraffic.get(key);
    const rate = prev && now > prev.at ? ((total - prev.total) * 1000) / (now - prev.at) : 0;
    previousTraffic.set(key, { total, at: now });
    svg.append(el("text", { class: "traffic", "data-link": key, "data-total": total,
      x: (pa.x + pb.x) / 2, y: (pa.y + pb.y) / 2 - 6, "text-anchor": "middle" },
      `${total} (${rate.toFixed(0)}/s)`));
  }
  for (const [vn, members] of [...m.vns].sort()) {
    const p = pos.get(vn);
    const traced = tracedVNs.includes(vn);
    const mine = self && self.vn === vn;
    const g = el("g", { class: `vn${traced ? " traced" : ""}${mine ? " mine" : ""}`, "data-vn": vn });
    const w = Math.max(70, 22 * members.length + 16);
    g.append(el("rect", { x: p.x - w / 2, y: p.y - 30, width: w, height: 60, rx: 8 }));
    g.append(el("text", { x: p.x - w / 2 + 6, y: p.y - 14 }, vn));
    members.forEach((b, i) => {
      const cx = p.x - w / 2 + 16 + i * 22, cy = p.y + 8;
      const up = m.answering.has(b) || latest.size === 0;
      const dot = el("circle", { class: "replica", "data-broker": b, "data-up": up, cx, cy, r: 8 });
      dot.append(el("title", {}, b));
      g.append(dot);
      const label = b.startsWith(vn + ".") ? b.slice(vn.length + 1) : "";
      if (label) g.append(el("text", { class: "replica-label", x: cx - 3, y: cy + 22 }, label));
      const blamed = m.blame.get(b);
      if (blamed) g.append(el("text", { class: "blame-count", "data-broker": b, x: cx + 5, y: cy - 9 },
        String(blamed.share + blamed.copy)));
    });
    svg.append(g);
  }
  const body = document.querySelector("#blame tbody");
  body.replaceChildren();
  for (const [culprit, b] of [...m.blame].sort()) {
    const tr = html("tr", undefined, { "data-culprit": culprit });
    [culprit, b.share, b.copy, [...b.by].sort().join(", ")].forEach((v) => tr.append(html("td", String(v))));
    body.append(tr);
  }
}

function drawRounds() {
  const seen = new Map();
  for (const { reconfig } of latest.values()) {
    for (const r of (reconfig && reconfig.rounds) || []) seen.set(r.round, r);
  }
  const rounds = [...seen.values()].sort((a, b) => b.time - a.time).slice(0, 10);
  const body = document.querySelector("#rounds tbody");
  body.replaceChildren();
  for (const r of rounds) {
    const tr = html("tr", undefined, { "data-round": r.round, "data-outcome": r.outcome });
    const links = (ls) => (ls || []).map((l) => (Array.isArray(l) ? l.join("-") : String(l))).join(" ");
    const hood = links(r.neighbourhood) + (r.new_neighbourhood ? " → " + links(r.new_neighbourhood) : "");
    [r.round, new Date(r.time * 1000).toLocaleTimeString(), r.outcome, hood]
      .forEach((v) => tr.append(html("td", String(v))));
    body.append(tr);
  }
}

async function poll() {
  try {
    self = await getJSON("", "/api/topology");
    document.getElementById("me").textContent = `— at ${self.id} (VN ${self.vn})`;
    for (const [id, url] of Object.entries(self.admin_peers)) addAdmin(id, url);
  } catch (err) {
    document.getElementById("status").textContent = `this broker does not answer: ${err}`;
    return;
  }
  admins.set(self.id, "");
  const answers = await Promise.allSettled([...admins].map(async ([id, base]) => {
    const [topology, reconfig] = await Promise.all([
      id === self.id ? self : getJSON(base, "/api/topology"),
      getJSON(base, "/api/reconfig").catch(() => null),
    ]);
    return { id, topology, reconfig };
  }));
  const now = Date.now();
  latest.clear();
  for (const a of answers) {
    if (a.status !== "fulfilled") continue;
    const { topology, reconfig } = a.value;
    latest.set(topology.id, { topology, reconfig, at: now });
    for (const [id, url] of Object.entries(topology.admin_peers)) if (!admins.has(id)) addAdmin(id, url);
  }
  const m = model();
  draw(m);
  drawRounds();
  fillBrokerChoice();
  polls += 1;
  document.body.dataset.polls = String(polls);
  document.getElementById("status").textContent =
    `${m.vns.size} VNs, ${m.vnOf.size} brokers (${latest.size} answering), ${m.links.size} links` +
    ` · updated ${new Date().toLocaleTimeString()}`;
}

// -- traces ---------------------------------------------------------------------------------

async function askEveryone(path) {
  const answers = await Promise.allSettled([...admins.values()].map((base) => getJSON(base, path)));
  return answers.filter((a) => a.status === "fulfilled").map((a) => a.value);
}

async function tracePublication(publisher, seq) {
  const q = `/api/trace?publisher=${encodeURIComponent(publisher)}&seq=${encodeURIComponent(seq)}`;
  const answers = (await askEveryone(q)).filter((a) => a.decisions.length || a.copies.length);
  const byVN = new Map();
  for (const a of answers) {
    if (!byVN.has(a.vn)) byVN.set(a.vn, []);
    byVN.get(a.vn).push(a);
  }
  // Walk from the VN where a client published, along each decision's next VNs.
  const start = answers.filter((a) => a.decisions.some((d) => d.from_client)).map((a) => a.vn);
  const order = [], edges = new Set(), seen = new Set(start);
  const queue = [...new Set(start)];
  while (queue.length) {
    const vn = queue.shift();
    order.push(vn);
    for (const a of byVN.get(vn) || []) {
      for (const d of a.decisions) for (const next of d.next) {
        edges.add(linkKey(vn, next));
        if (!seen.has(next)) { seen.add(next); queue.push(next); }
      }
    }
  }
  for (const vn of byVN.keys()) if (!seen.has(vn)) order.push(vn); // copies that went nowhere
  tracedVNs = order;
  tracedLinks = edges;
  const out = document.getElementById("trace-result");
  out.replaceChildren();
  out.dataset.path = order.join(",");
  out.dataset.kind = "publication";
  if (!answers.length) {
    out.append(html("p", `no broker remembers ${publisher} #${seq} (never published, or older than every ring)`));
  } else {
    out.append(html("p", `${publisher} #${seq}: ${order.join(" → ")}`, { class: "path" }));
    const ol = html("ol");
    for (const vn of order) {
      for (const a of (byVN.get(vn) || []).sort((x, y) => (x.id < y.id ? -1 : 1))) {
        const d = a.decisions[a.decisions.length - 1];
        const from = d ? (d.from_client ? `client ${d.sender}` : `VN ${d.prev}`) : "";
        const copies = a.copies.length ? `, copies from ${a.copies.map((c) => c.replica).join(", ")}` : "";
        const li = html("li", `${a.id} (VN ${vn}): ${a.verdict.what}: ${a.verdict.why}` +
          (from ? ` [from ${from}${copies}]` : copies), { "data-broker": a.id, "data-what": a.verdict.what });
        li.classList.add(`what-${a.verdict.what}`);
        ol.append(li);
      }
    }
    out.append(ol);
  }
  if (latest.size) draw(model());
}

async function traceSubscription(key) {
  const answers = (await askEveryone(`/api/trace?subscription=${encodeURIComponent(key)}`))
    .sort((a, b) => (a.id < b.id ? -1 : 1));
  const out = document.getElementById("trace-result");
  out.replaceChildren();
  out.dataset.kind = "subscription";
  const holders = answers.filter((a) => a.held.length);
  tracedVNs = [...new Set(holders.map((a) => a.vn))];
  tracedLinks = new Set();
  for (const a of holders) for (const e of a.held) if (!e.local) tracedLinks.add(linkKey(a.vn, e.from));
  out.dataset.path = tracedVNs.join(",");
  const ol = html("ol");
  for (const a of answers) {
    const sent = Object.keys(a.forwarded_to);
    const li = html("li", `${a.id} (VN ${a.vn}): ${a.verdict}` +
      (a.held.length ? ` — ${a.held.map((e) => `${e.key} [${e.filter}]`).join("; ")}` : "") +
      (sent.length ? `; forwarded to ${sent.join(", ")}` : ""), { "data-broker": a.id });
    ol.append(li);
  }
  out.append(ol);
  if (latest.size) draw(model());
}

// -- routing tables ----------------------------------------------------------------------

function fillBrokerChoice() {
  const select = document.getElementById("routing-broker");
  const ids = [...admins.keys()].sort();
  if (select.options.length === ids.length) return;
  const chosen = select.value || (self && self.id);
  select.replaceChildren(...ids.map((id) => html("option", id, { value: id })));
  select.value = chosen;
  showRouting();
}

async function showRouting() {
  const id = document.getElementById("routing-broker").value;
  const out = document.getElementById("routing");
  if (!admins.has(id)) return;
  let doc;
  try {
    doc = await getJSON(admins.get(id), "/api/routing");
  } catch (err) {
    out.textContent = `${id} does not answer: ${err}`;
    return;
  }
  out.replaceChildren();
  for (const [name, rows] of [["SRT (advertisements)", doc.srt], ["PRT (subscriptions)", doc.prt]]) {
    out.append(html("h3", `${name}: ${rows.length}`));
    const table = html("table");
    table.append(html("tr", undefined));
    table.lastChild.append(html("th", "key"), html("th", "filter"), html("th", "last hop"));
    for (const r of rows) {
      const tr = html("tr");
      tr.append(html("td", r.key), html("td", r.filter), html("td", r.local ? "local client" : `VN ${r.from}`));
      table.append(tr);
    }
    out.append(table);
  }
}

document.getElementById("trace-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  tracePublication(document.getElementById("trace-publisher").value,
    document.getElementById("trace-seq").value);
});
document.getElementById("sub-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  traceSubscription(document.getElementById("trace-sub").value);
});
document.getElementById("routing-broker").addEventListener("change", showRouting);

for (const peer of (new URLSearchParams(location.search).get("peers") || "").split(",")) {
  if (peer) addAdmin(peer, peer);
}
async function loop() {
  await poll();
  setTimeout(loop, POLL_MS);
}
loop();
