// lockgate's web UI: vanilla JS, no build step, no dependency (queue_store/web_ui.py says why).
//
// Safety rules this file keeps:
// - The token lives in sessionStorage (this tab only) and goes out only in the Authorization
//   header of fetch() calls to this origin: never in a URL, a cookie or the DOM.
// - Every datum is put on the page with textContent / attributes (el() below), never innerHTML,
//   so a pod or queue name cannot inject markup.
// - Actions show for admin tokens only, but the API is what refuses a read-only token.
"use strict";

const POLL_MS = 3000;
const PAGE = 50;
const JOBSETS_PAGE = 20;
const TOKEN_KEY = "lockgate.token";

let me = null;          // {name, role, may_act} of the signed-in token
let timer = null;       // the current page's refresh
let generation = 0;     // bumps on every navigation: late answers of an old page are dropped
const pageState = {};   // offsets and filters per route, kept while navigating

// ---- DOM helpers --------------------------------------------------------------------------
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}
const svgNS = "http://www.w3.org/2000/svg";
function svg(tag, attrs, ...children) {
  const node = document.createElementNS(svgNS, tag);
  for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, String(value));
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}
const $ = (id) => document.getElementById(id);
// Children for replaceChildren(), without the nulls of optional parts (it would print "null").
const kids = (...children) => children.flat().filter((c) => c !== null && c !== undefined && c !== false);
const enc = encodeURIComponent;
const link = (href, text) => el("a", { href }, text);
const pill = (state) => el("span", { class: `pill state-${state}`, "data-state": state }, state);
const plural = (n, what) => `${n} ${what}${n === 1 ? "" : "s"}`;
const pct = (x) => (x === null || x === undefined ? "–" : `${(100 * x).toFixed(1)}%`);
function when(iso) {
  if (!iso) return "–";
  const d = new Date(iso);
  return d.toLocaleString(undefined, { hour12: false });
}
function since(iso) {
  if (!iso) return "";
  const s = Math.max(0, (Date.now() - new Date(iso).getTime()) / 1000);
  if (s < 90) return `${Math.round(s)}s`;
  if (s < 5400) return `${Math.round(s / 60)}m`;
  if (s < 129600) return `${Math.round(s / 3600)}h`;
  return `${Math.round(s / 86400)}d`;
}
const ago = (iso) => (iso ? `${since(iso)} ago` : "");
function amount(resource, value) {
  if (resource === "cpu") return `${+(value / 1000).toPrecision(4)}`;
  if (resource === "memory" || resource === "ephemeral-storage") {
    for (const [unit, size] of [["Ti", 2 ** 40], ["Gi", 2 ** 30], ["Mi", 2 ** 20], ["Ki", 2 ** 10]]) {
      if (Math.abs(value) >= size) return `${+(value / size).toPrecision(3)}${unit}`;
    }
  }
  return String(value);
}
const requests = (r) => Object.entries(r || {}).map(([k, v]) => `${k} ${amount(k, v)}`).join(", ");

// ---- API ----------------------------------------------------------------------------------
class ApiError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}
async function api(path, options = {}) {
  const token = sessionStorage.getItem(TOKEN_KEY);
  const headers = { Accept: "application/json", ...(options.headers || {}) };
  if (token) headers.Authorization = `Bearer ${token}`;
  const response = await fetch(path, { ...options, headers, credentials: "omit",
    cache: "no-store", redirect: "error" });
  let body = null;
  try { body = await response.json(); } catch (_) { body = null; }
  if (!response.ok) {
    if (response.status === 401) signOut("the token was refused: sign in again");
    throw new ApiError(response.status, (body && body.error) || `${response.status} ${response.statusText}`);
  }
  return body;
}
const query = (params) => {
  const parts = Object.entries(params).filter(([, v]) => v !== "" && v !== null && v !== undefined)
    .map(([k, v]) => `${enc(k)}=${enc(v)}`);
  return parts.length ? `?${parts.join("&")}` : "";
};

// ---- sign in ------------------------------------------------------------------------------
async function signIn(token) {
  sessionStorage.setItem(TOKEN_KEY, token);
  try {
    me = await api("/api/v1/whoami");
  } catch (error) {
    sessionStorage.removeItem(TOKEN_KEY);
    me = null;
    throw error;
  }
}
function signOut(message) {
  sessionStorage.removeItem(TOKEN_KEY);
  me = null;
  stopPolling();
  showSignIn(message || "");
}
function showSignIn(message) {
  $("signin").hidden = false;
  $("nav").hidden = $("who").hidden = $("signout").hidden = $("live").hidden = true;
  $("page").replaceChildren(...kids());
  $("error").hidden = true;
  $("signin-error").textContent = message;
  $("token").value = "";
  $("token").focus();
}
function showSignedIn() {
  $("signin").hidden = true;
  $("nav").hidden = $("who").hidden = $("signout").hidden = $("live").hidden = false;
  $("who").textContent = `${me.name} · ${me.role}`;
  $("who").dataset.role = me.role;
}

// ---- routing and refresh ------------------------------------------------------------------
const ROUTES = [
  [/^#?\/?$/, "overview", overviewPage],
  [/^#\/queues\/([^/]+)$/, "overview", queuePage],
  [/^#\/jobsets\/([^/]+)\/([^/]+)$/, "overview", jobsetPage],
  [/^#\/pods\/([^/]+)\/([^/]+)\/([^/]+)$/, "overview", podPage],
  [/^#\/namespaces$/, "namespaces", namespacesPage],
  [/^#\/namespaces\/([^/]+)\/([^/]+)$/, "namespaces", namespacePage],
  [/^#\/evictions$/, "evictions", evictionsPage],
];
function stopPolling() {
  if (timer) clearTimeout(timer);
  timer = null;
  generation += 1;
}
function route() {
  stopPolling();
  if (!me) return;
  const hash = location.hash || "#/";
  for (const [pattern, nav, page] of ROUTES) {
    const match = hash.match(pattern);
    if (!match) continue;
    for (const a of document.querySelectorAll("[data-nav]")) {
      a.classList.toggle("active", a.dataset.nav === nav);
    }
    const args = match.slice(1).map(decodeURIComponent);
    const key = hash;
    pageState[key] = pageState[key] || {};
    const view = { root: el("div", { "data-page": page.name }), state: pageState[key] };
    $("page").replaceChildren(...kids(view.root));
    const mine = generation;
    const tick = async () => {
      try {
        await page(view, ...args);
        if (mine !== generation) return;
        $("error").hidden = true;
        $("live").classList.remove("stale");
        $("live").textContent = `live · ${new Date().toLocaleTimeString(undefined, { hour12: false })}`;
      } catch (error) {
        if (mine !== generation) return;
        $("error").hidden = false;
        $("error").textContent = error.message;
        $("live").classList.add("stale");
      }
      if (mine === generation && me) timer = setTimeout(tick, POLL_MS);
    };
    view.refresh = () => { if (timer) clearTimeout(timer); tick(); };
    tick();
    return;
  }
  $("page").replaceChildren(...kids(el("div", { class: "card" }, "No such page. ", link("#/", "Overview"))));
}
// Re-render one region of a page without touching the rest (filters keep their focus).
function region(view, name) {
  let node = view.root.querySelector(`[data-region="${name}"]`);
  if (!node) {
    node = el("div", { "data-region": name });
    view.root.append(node);
  }
  return node;
}
function pager(view, total, onMove) {
  const offset = view.state.offset || 0;
  const last = Math.max(0, Math.floor((total - 1) / PAGE) * PAGE);
  const move = (to) => () => { view.state.offset = Math.max(0, Math.min(last, to)); onMove(); };
  return el("div", { class: "pager" },
    el("button", { class: "quiet", onclick: move(0), disabled: offset === 0 }, "« First"),
    el("button", { class: "quiet", onclick: move(offset - PAGE), disabled: offset === 0 }, "‹ Prev"),
    el("span", { class: "muted", "data-pager": "" },
      total ? `${offset + 1}–${Math.min(total, offset + PAGE)} of ${total}` : "none"),
    el("button", { class: "quiet", onclick: move(offset + PAGE), disabled: offset + PAGE >= total }, "Next ›"),
    el("button", { class: "quiet", onclick: move(last), disabled: offset + PAGE >= total }, "Last »"));
}
function filterInput(view, key, placeholder, onChange) {
  const input = el("input", { placeholder, value: view.state[key] || "", "data-filter": key });
  let pending = null;
  input.addEventListener("input", () => {
    clearTimeout(pending);
    pending = setTimeout(() => { view.state[key] = input.value.trim(); view.state.offset = 0; onChange(); }, 300);
  });
  return input;
}
function table(headers, rows, attrs) {
  return el("table", attrs || {},
    el("thead", {}, el("tr", {}, headers.map((h) => el("th", { class: h.startsWith("#") ? "num" : "" }, h.replace(/^#/, ""))))),
    el("tbody", {}, rows));
}
const num = (value) => el("td", { class: "num" }, value === undefined || value === null ? "–" : String(value));
const podHref = (p) => `#/pods/${enc(p.cluster)}/${enc(p.namespace)}/${enc(p.name)}`;
// A queue keeps its colour whatever other queues come and go: its hue is a hash of its name
// (a palette of ten gave two of four queues the same colour).
const colorOf = () => (name) => {
  let h = 5381;
  for (const c of name) h = ((h * 33) ^ c.codePointAt(0)) >>> 0;
  return `hsl(${(h * 137.508) % 360 | 0}, ${55 + (h >>> 9) % 25}%, ${38 + (h >>> 17) % 14}%)`;
};

// ---- overview -----------------------------------------------------------------------------
async function overviewPage(view) {
  const [fairness, history, clusters, queues] = await Promise.all([
    api("/api/v1/fairness").catch((e) => ({ error: e.message })),
    api("/api/v1/fairness/history").catch(() => ({ samples: [] })),
    api("/api/v1/clusters"),
    api("/api/v1/queues"),
  ]);
  if (!view.root.querySelector("h1")) view.root.prepend(el("h1", {}, "Overview"));
  const report = (fairness && fairness.report) || { queues: [] };
  const reported = new Map(report.queues.map((q) => [q.name, q]));
  const names = new Set([...queues.queues.map((q) => q.name), ...reported.keys()]);
  const color = colorOf(names);
  const waitingByQueue = {};
  for (const c of clusters.clusters) for (const q of c.queues) {
    waitingByQueue[q.queue] = (waitingByQueue[q.queue] || 0) + q.queued;
  }
  const defined = new Map(queues.queues.map((q) => [q.name, q]));
  // The headline is what matters: each queue's fair target against what it holds, overall and
  // per cluster. The fair and adjusted shares are in the detail below, with what each means.
  // The queue tree, from the leader's picture (the same as `lockgate status --tree`). A flat
  // installation (every queue a child of the root) has no inner node: the overview is as ever.
  const tree = treeOf(report.tree || []);
  const selected = tree.inner && tree.byName.has(view.state.node) ? view.state.node : null;
  // With a tree, the queue table lists the leaves under the picked node (the root: all), at
  // most LEAF_ROWS of them, so 1,000 leaves stay a page a person can read.
  // Busiest first (what they hold, then what waits), so the few leaves with work are on top
  // of a thousand idle ones.
  const busy = (name) => [(reported.get(name) || {}).actual_share || 0, (reported.get(name) || {}).queued ?? waitingByQueue[name] ?? 0];
  const leafNames = tree.inner ? subtreeLeaves(tree, selected).filter((n) => names.has(n))
    .sort((a, b) => busy(b)[0] - busy(a)[0] || busy(b)[1] - busy(a)[1] || byName(a, b)) : [...names].sort();
  const shownLeaves = tree.inner ? leafNames.slice(0, LEAF_ROWS) : leafNames;
  const rows = shownLeaves.map((name) => {
    const r = reported.get(name) || {};
    const spec = defined.get(name);
    return el("tr", { "data-queue": name },
      el("td", {}, el("i", { class: "swatch" }), link(`#/queues/${enc(name)}`, name),
        spec ? (spec.cordoned ? el("span", { class: "pill state-failed" }, " cordoned") : null)
          : el("span", { class: "pill state-failed" }, " undefined"),
        r.skipped_gate ? el("span", { class: "pill state-failed", "data-skipped-gate": r.skipped_gate,
          title: "pods of this queue ran without lockgate's gate" }, ` ${r.skipped_gate} skipped the gate`) : null),
      num(spec ? +spec.weight.toPrecision(4) : r.weight),
      el("td", { class: "num", "data-target": r.fair_target ?? "" }, pct(r.fair_target)),
      el("td", { class: "num", "data-actual": r.actual_share ?? "" }, pct(r.actual_share)),
      el("td", {}, targetBar(r.actual_share, r.fair_target)),
      el("td", { class: "num", "data-waiting": "" }, String(r.queued ?? waitingByQueue[name] ?? 0)), num(r.released), num(r.running));
  });
  const detailRows = shownLeaves.map((name) => {
    const r = reported.get(name) || {};
    return el("tr", { "data-queue-detail": name }, el("td", {}, name), num(pct(r.fair_share)),
      num(pct(r.adjusted_fair_share)), num(pct(r.fair_target)), num(pct(r.actual_share)));
  });
  const source = fairness.error ? `no fairness report: ${fairness.error}`
    : fairness.source === "postgres" ? `no shares: ${fairness.reasons_unavailable} (the counts are Postgres's)`
      : `from the scheduler leader, round ${report.last_round ? ago(report.last_round.at) : "–"}`;
  // Pods that ran without lockgate's gate skipped the queue: say so first, by queue.
  const skipped = [...reported.values()].filter((r) => r.skipped_gate > 0);
  const skippedBanner = skipped.length ? el("div", { class: "banner", "data-warning": "skipped-gate" },
    el("b", {}, "Pods skipped the queue: "),
    skipped.map((r, i) => [i ? "; " : "", link(`#/queues/${enc(r.name)}`, r.name), ` ${r.skipped_gate} pod${r.skipped_gate === 1 ? "" : "s"}`]).flat(),
    ". They run without lockgate's gate (the webhook did not serve their namespace); they count as the queue's use. `lockgate explain` on one says why.") : null;
  const queuesCard = el("div", { class: "card" },
    skippedBanner,
    el("h2", {}, tree.inner ? `Queues under ${selected || "the root"}` : "Queues"),
    tree.inner && leafNames.length > shownLeaves.length ? el("p", { class: "small muted", "data-leaves-shown": shownLeaves.length },
      `${shownLeaves.length} of ${leafNames.length} leaves shown: pick a node in the tree above to narrow.`) : null,
    table(["Queue", "#Weight", "#Fair target", "#Holds", "Holds / target", "#Waiting", "#Released", "#Running"], rows, { "data-table": "queues" }),
    el("p", { class: fairness.source === "leader" ? "small muted" : "small error", "data-source": fairness.source || "error" }, source),
    el("details", { "data-detail": "shares" }, el("summary", { class: "small" }, "Fair and adjusted shares, and what each means"),
      el("dl", { class: "facts small" },
        el("dt", {}, "Fair share"), el("dd", {}, "the queue's weight over the weights of the queues with work: what it gets if every queue could use anything."),
        el("dt", {}, "Adjusted fair share"), el("dd", {}, "the fair share with what queues cannot use (they ask for less) given to the others; over the whole pool, not where pods may run."),
        el("dt", {}, "Fair target"), el("dd", {}, "what the scheduler aims at: the adjusted share constrained by where each queue's pods can run (their cluster, node filters). This is the number to compare with what the queue holds."),
        el("dt", {}, "Holds"), el("dd", {}, "the queue's dominant share of the pool now (released, bound and running pods).")),
      table(["Queue", "#Fair share", "#Adjusted fair share", "#Fair target", "#Holds"], detailRows, { "data-table": "shares" })));
  for (const tr of queuesCard.querySelectorAll("tr[data-queue] .swatch")) {
    tr.style.cssText = `display:inline-block;width:10px;height:10px;border-radius:2px;margin-right:6px;background:${color(tr.closest("tr").dataset.queue)}`;
  }
  region(view, "tree").replaceChildren(...kids(tree.inner
    ? treeCard(view, tree, selected, reported, waitingByQueue, color) : null));
  region(view, "queues").replaceChildren(...kids(queuesCard));
  // The chart: every queue (flat), or the picked node's children, leaves and inner nodes alike.
  const charted = tree.inner ? chartedChildren(tree, selected, reported) : { names: [...names].sort(), more: 0 };
  region(view, "chart").replaceChildren(...kids(el("div", { class: "card" },
    el("h2", { "data-chart-of": tree.inner ? (selected || "") : null },
      tree.inner ? `Children of ${selected || "the root"} over time` : "Shares over time"),
    el("div", { class: "legend", "data-legend": "" }, charted.names.map((name) => {
      // Through the CSSOM: the page's Content-Security-Policy refuses inline style attributes.
      const swatch = el("i");
      swatch.style.background = color(name);
      return el("span", { "data-legend-queue": name }, swatch, name);
    })),
    shareChart(history.samples || [], color, tree.inner ? new Set(charted.names) : null),
    el("p", { class: "small muted" }, charted.more ? `the ${charted.names.length} children holding most; ${charted.more} more not drawn · ` : "",
      tree.inner ? "solid: what the node holds (its leaves' shares added) · dashed: its fair target · sampled every "
        : "solid: what the queue holds · dashed: its fair target · sampled every ",
      `${history.interval_seconds || "?"} s`))));
  region(view, "clusters").replaceChildren(...kids(el("div", { class: "card" },
    el("h2", {}, "Clusters"), ...growthBanners(clusters.clusters), clustersTable(clusters.clusters, color),
    growthTable(clusters.clusters, clusters.growth_unavailable))));
}
// A cluster whose growth stalled is said first, in a banner: its pods released for growth wait
// for nodes that are not coming (docs/autoscaling.md).
function growthBanners(clusters) {
  return clusters.filter((c) => c.growth && c.growth.stalled).map((c) =>
    el("div", { class: "banner", "data-warning": "growth-stalled", "data-cluster": c.name },
      el("b", {}, `${c.name}: `), c.growth.stalled));
}
// "cpu 48, memory 96Gi" (canonical amounts: cpu in millicores, bytes).
const amountsText = (values) => Object.keys(values || {}).sort()
  .map((r) => `${r} ${amount(r, values[r])}`).join(", ") || "–";
// What a person sizes a cluster by (as the clusters table): cpu, memory and GPUs.
const headline = (values) => Object.fromEntries(Object.entries(values || {})
  .filter(([r]) => r === "cpu" || r === "memory" || r.includes("gpu")));
// The clusters that grow (an autoscaler makes their nodes): what exists, what each NodePool may
// still add (its headroom), the NodeClaims in flight, and what their growth is doing. The
// leader's figures, from its last round.
function growthTable(clusters, unavailable) {
  const growing = clusters.filter((c) => c.growth);
  if (!growing.length) {
    return unavailable ? el("p", { class: "small muted", "data-growth-unavailable": "" },
      `Clusters that grow: unavailable (${unavailable}).`) : null;
  }
  const rows = growing.map((c) => {
    const g = c.growth;
    const pools = (g.node_pools || []).map((p) => el("div", { "data-pool": p.name },
      el("b", {}, p.name), p.why_none ? el("span", { class: "muted" }, `: none (${p.why_none})`)
        : `: ${p.headroom_nodes} more node${p.headroom_nodes === 1 ? "" : "s"}` +
          (Object.keys(p.headroom || {}).length ? ` (${amountsText(p.headroom)} left)` : " (no limit)") +
          (p.node_shape ? `, each ${amountsText(p.node_shape)}` : "")));
    const state = g.stalled ? el("span", { class: "error" }, g.stalled)
      : g.waiting ? el("span", { class: "warn" }, g.waiting) : el("span", { class: "ok" }, "growing as needed");
    return el("tr", { "data-growth": c.name },
      el("td", { class: "nowrap" }, c.name), el("td", { class: "num", "data-nodes": g.nodes }, String(g.nodes)),
      el("td", { "data-capacity": "" }, amountsText(headline(g.capacity))),
      el("td", { "data-headroom": "" }, pools.length ? pools : "–"),
      el("td", { class: "small", "data-claims": (g.claims_in_flight || []).length },
        (g.claims_in_flight || []).join(", ") || "–"),
      el("td", { class: "num", "data-released-unbound": g.released_unbound }, String(g.released_unbound)),
      el("td", { "data-growth-state": g.stalled ? "stalled" : g.waiting ? "waiting" : "ok" }, state));
  });
  return el("div", { class: "growth" }, el("h2", {}, "Clusters that grow"),
    table(["Cluster", "#Nodes", "Capacity", "Headroom (what its NodePools may still add)",
      "NodeClaims in flight", "#Released, waiting for a node", "Growth"], rows, { "data-table": "growth" }));
}
// What a queue holds against its fair target: the fill is what it holds, the tick its target
// (each scaled to the larger of the two, so a queue owed 0.7% reads as clearly as one owed 40%).
function targetBar(actual, target) {
  if (typeof actual !== "number" || typeof target !== "number") return el("span", { class: "muted" }, "–");
  const scale = Math.max(actual, target, 1e-9) * 1.15;
  const short = actual < target * 0.95;
  const bar = el("div", { class: "bar target-bar", "data-holds": short ? "below" : "at-or-above",
    title: `holds ${pct(actual)} of the pool; its fair target is ${pct(target)}` });
  const fill = el("span", { class: short ? "below" : "met" });
  fill.style.width = `${(100 * actual / scale).toFixed(1)}%`;
  const tick = el("b", { class: "tick" });
  tick.style.left = `${(100 * target / scale).toFixed(1)}%`;
  bar.append(fill, tick);
  return bar;
}
// ---- the queue tree (overview) -------------------------------------------------------------
const LEAF_ROWS = 30;        // leaves listed in the queue table under the picked node
// Names as a person counts them: team2 before team10.
const byName = new Intl.Collator(undefined, { numeric: true }).compare;
const CHILD_ROWS = 50;       // children of one node listed before "… n more"
const CHART_SERIES = 12;     // children drawn in the chart of the picked node
const OPEN_ALL_UP_TO = 40;   // a tree of at most this many nodes opens whole; a larger one shows
                             // the root's children and opens as a person clicks
function treeOf(nodes) {
  const byName = new Map(nodes.map((n) => [n.name, n]));
  const children = new Map();
  for (const n of nodes) {
    const parent = n.parent && byName.has(n.parent) ? n.parent : null;
    if (!children.has(parent)) children.set(parent, []);
    children.get(parent).push(n.name);
  }
  const leaves = new Map();  // node -> leaves under it (a leaf: itself)
  const count = (name) => {
    const own = children.get(name) || [];
    const total = own.length ? own.reduce((sum, child) => sum + count(child), 0) : 1;
    leaves.set(name, total);
    return total;
  };
  for (const top of children.get(null) || []) count(top);
  return { byName, children, leaves, size: nodes.length, inner: nodes.some((n) => !n.leaf && (children.get(n.name) || []).length) };
}
function subtreeLeaves(tree, name) {
  const found = [];
  const walk = (at) => {
    const own = tree.children.get(at) || [];
    if (at !== null && !own.length) { found.push(at); return; }
    for (const child of [...own].sort(byName)) walk(child);
  };
  walk(name);
  return found;
}
function chartedChildren(tree, selected, reported) {
  const own = tree.children.get(selected) || [];
  const held = (name) => (tree.byName.get(name) || {}).actual_share || 0;
  const names = [...own].sort((a, b) => held(b) - held(a) || byName(a, b)).slice(0, CHART_SERIES).sort(byName);
  return { names, more: own.length - names.length };
}
const leafCount = (n) => `${n} ${n === 1 ? "leaf" : "leaves"}`;
const guaranteeText = (g) => Object.entries(g || {}).map(([k, v]) => `${k} ${v}`).join(", ");
function treeCard(view, tree, selected, reported, waitingByQueue, color) {
  const st = view.state;
  st.open = st.open || {};
  const isOpen = (name) => (name in st.open ? st.open[name] : tree.size <= OPEN_ALL_UP_TO || name === selected
    || (selected !== null && isAncestor(tree, name, selected)));
  const waiting = new Map();
  const leafWaiting = (name) => {
    const r = reported.get(name) || {};
    return r.queued ?? waitingByQueue[name] ?? 0;
  };
  const sumWaiting = (name) => {
    if (waiting.has(name)) return waiting.get(name);
    const own = tree.children.get(name) || [];
    const total = own.length ? own.reduce((sum, child) => sum + sumWaiting(child), 0) : leafWaiting(name);
    waiting.set(name, total);
    return total;
  };
  const anyDecay = [...tree.byName.values()].some((n) => n.decayed_usage !== null && n.decayed_usage !== undefined);
  const pick = (name) => () => { st.node = name; st.offset = 0; view.refresh(); };
  const toggle = (name, open) => () => { st.open[name] = !open; view.refresh(); };
  const rows = [];
  const top = tree.children.get(null) || [];
  const sumOf = (key) => top.reduce((sum, name) => sum + ((tree.byName.get(name) || {})[key] || 0), 0);
  rows.push(el("tr", { "data-node": "", "data-depth": -1, class: selected === null ? "picked" : null },
    el("td", {}, el("button", { class: "node-name", onclick: pick(null), "data-pick": "" }, "root"),
      el("span", { class: "small muted" }, ` ${top.length} ${top.length === 1 ? "child" : "children"}, ${leafCount(subtreeLeaves(tree, null).length)}`)),
    el("td", {}), el("td", {}), el("td", {}),
    el("td", { class: "num", "data-target": sumOf("fair_target") }, pct(sumOf("fair_target"))),
    el("td", { class: "num", "data-actual": sumOf("actual_share") }, pct(sumOf("actual_share"))),
    el("td", {}, targetBar(sumOf("actual_share"), sumOf("fair_target"))),
    anyDecay ? el("td", {}) : null,
    el("td", { class: "num" }, String(top.reduce((sum, name) => sum + sumWaiting(name), 0)))));
  const walk = (parent, depth) => {
    const own = [...(tree.children.get(parent) || [])].sort(byName);
    const showAll = st.open[`${parent}\u0000all`];
    const shown = showAll ? own : own.slice(0, CHILD_ROWS);
    for (const name of shown) {
      const n = tree.byName.get(name);
      const inner = (tree.children.get(name) || []).length > 0;
      const open = inner && isOpen(name);
      const swatch = el("i", { class: "swatch" });
      swatch.style.background = color(name);
      const indent = el("span", { class: "indent" });
      indent.style.width = `${depth * 18}px`;
      rows.push(el("tr", { "data-node": name, "data-depth": depth, "data-leaf": inner ? "false" : "true",
        "data-standing": n.standing, class: selected === name ? "picked" : null },
      el("td", { class: "node" }, indent,
        inner ? el("button", { class: "twisty", "data-toggle": name, "aria-expanded": open ? "true" : "false",
          title: open ? "collapse" : "expand", onclick: toggle(name, open) }, open ? "▾" : "▸") : el("span", { class: "twisty" }),
        swatch,
        inner ? el("button", { class: "node-name", onclick: pick(name), "data-pick": name }, name)
          : link(`#/queues/${enc(name)}`, name),
        inner ? el("span", { class: "small muted", "data-leaves": tree.leaves.get(name) },
          ` ${leafCount(tree.leaves.get(name))}`) : null),
      el("td", { class: "num", title: "its weight, and its weight over its siblings'" },
        `${+n.weight.toPrecision(4)}`, el("span", { class: "small muted" }, ` (${pct(n.weight_among_siblings)})`)),
      el("td", { class: "small", "data-guarantee": "" }, guaranteeText(n.guarantee) || "–"),
      el("td", { class: "small", "data-limit": "" }, guaranteeText(n.limit) || "–"),
      el("td", { class: "num", "data-target": n.fair_target }, pct(n.fair_target)),
      el("td", { class: "num", "data-actual": n.actual_share }, pct(n.actual_share)),
      el("td", {}, targetBar(n.actual_share, n.fair_target)),
      anyDecay ? el("td", { class: "num", "data-decayed": n.decayed_usage ?? "" },
        n.decayed_usage === null || n.decayed_usage === undefined ? "–" : (+n.decayed_usage).toPrecision(3)) : null,
      el("td", { class: "num", "data-waiting": "" }, String(sumWaiting(name)))));
      if (open) walk(name, depth + 1);
    }
    if (own.length > shown.length) {
      const indent = el("span", { class: "indent" });
      indent.style.width = `${depth * 18 + 22}px`;
      rows.push(el("tr", { "data-more": parent || "" }, el("td", { colspan: anyDecay ? 9 : 8 }, indent,
        el("button", { class: "quiet small", onclick: () => { st.open[`${parent}\u0000all`] = true; view.refresh(); } },
          `… ${own.length - shown.length} more of ${parent || "the root"}'s children`))));
    }
  };
  walk(null, 0);
  return el("div", { class: "card", "data-card": "tree" },
    el("h2", {}, "Queue tree"),
    el("p", { class: "small muted" }, "Each node's weight among its siblings, its guarantee and limit, its fair target and what it holds ",
      "(a node's: its leaves' shares of the pool, added). Pick a node to see its children over time; ▸ opens a subtree."),
    table(["Node", "#Weight", "Guarantee", "Limit", "#Fair target", "#Holds", "Holds / target",
      ...(anyDecay ? ["#Decayed usage"] : []), "#Waiting"], rows, { "data-table": "tree", class: "tree" }));
}
function isAncestor(tree, name, of) {
  for (let at = (tree.byName.get(of) || {}).parent; at; at = (tree.byName.get(at) || {}).parent) {
    if (at === name) return true;
  }
  return false;
}
function shareChart(samples, color, only) {
  const W = 900, H = 240, L = 40, R = 10, T = 10, B = 24;
  const box = svg("svg", { class: "chart", viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: "none",
    role: "img", "aria-label": "shares over time", "data-samples": samples.length });
  if (samples.length < 2) {
    box.append(svg("text", { x: W / 2, y: H / 2, "text-anchor": "middle" },
      samples.length ? "collecting samples…" : "no samples yet"));
    return box;
  }
  const t0 = new Date(samples[0].at).getTime(), t1 = new Date(samples[samples.length - 1].at).getTime();
  let top = 0.05;
  // A sample's series: its queues (leaves), and with a tree its inner nodes too (`nodes`). The
  // leader's queue list names inner nodes as well, holding nothing of their own: a node's
  // figures are its entry in `nodes` (its leaves' added).
  const seriesOf = (s) => ({ ...s.queues, ...(s.nodes || {}) });
  const drawn = (name) => only === null || only === undefined || only.has(name);
  for (const s of samples) for (const [name, q] of Object.entries(seriesOf(s))) {
    if (drawn(name)) top = Math.max(top, q.actual || 0, q.target ?? q.adjusted_fair ?? 0);
  }
  top = Math.min(1, Math.ceil(top * 10) / 10);
  const x = (t) => L + ((t - t0) / Math.max(1, t1 - t0)) * (W - L - R);
  const y = (v) => T + (1 - v / top) * (H - T - B);
  for (let i = 0; i <= 4; i++) {
    const v = (top * i) / 4;
    box.append(svg("line", { class: "axis", x1: L, x2: W - R, y1: y(v), y2: y(v), "stroke-opacity": i ? 0.35 : 1 }),
      svg("text", { x: L - 4, y: y(v) + 4, "text-anchor": "end" }, `${+(v * 100).toFixed(1)}%`));
  }
  box.append(svg("text", { x: L, y: H - 6 }, new Date(t0).toLocaleTimeString(undefined, { hour12: false })),
    svg("text", { x: W - R, y: H - 6, "text-anchor": "end" }, new Date(t1).toLocaleTimeString(undefined, { hour12: false })));
  const names = new Set();
  for (const s of samples) for (const n of Object.keys(seriesOf(s))) if (drawn(n)) names.add(n);
  for (const name of names) {
    for (const [field, dash] of [["target", "5 4"], ["actual", ""]]) {
      const of = (s) => ((s.nodes || {})[name] || s.queues[name]);
      const value = (s) => (of(s) ? (of(s)[field] ?? (field === "target" ? of(s).adjusted_fair : null)) : null);
      const points = samples.filter((s) => value(s) !== null && value(s) !== undefined)
        .map((s) => `${x(new Date(s.at).getTime()).toFixed(1)},${y(value(s)).toFixed(1)}`);
      if (points.length < 2) continue;
      box.append(svg("polyline", { points: points.join(" "), fill: "none", stroke: color(name),
        "stroke-width": field === "actual" ? 2 : 1.4, "stroke-dasharray": dash, "data-series": `${name}:${field}` },
      svg("title", {}, `${name} ${field.replace("_", " ")} share`)));
    }
  }
  return box;
}
function clustersTable(clusters, color) {
  if (!clusters.length) return el("p", { class: "muted" }, "No cluster has reported yet.");
  const rows = [];
  for (const c of clusters) {
    const resources = Object.keys(c.capacity).filter((r) => r === "cpu" || r === "memory" || r.includes("gpu"))
      .sort((x, y) => (x === "cpu" ? -1 : y === "cpu" ? 1 : x.localeCompare(y)));
    for (const resource of resources.length ? resources : ["cpu"]) {
      const total = c.capacity[resource] || 0;
      const bar = el("div", { class: "bar", title: `${resource} in ${c.name}` });
      const unmanaged = c.unmanaged[resource] || 0;
      if (total && unmanaged) bar.append(el("span", { title: `not lockgate's: ${amount(resource, unmanaged)}` }));
      for (const q of c.queues) {
        const held = q.holding[resource] || 0;
        if (!total || !held) continue;
        bar.append(el("span", { title: `${q.queue}: ${amount(resource, held)}`, "data-queue": q.queue }));
      }
      // Widths set through CSSOM (the style-src policy allows no inline style attributes).
      let i = 0;
      for (const span of bar.children) {
        const isUnmanaged = !span.dataset.queue;
        const held = isUnmanaged ? unmanaged : (c.queues.find((q) => q.queue === span.dataset.queue).holding[resource] || 0);
        span.style.width = `${Math.min(100, (100 * held) / total)}%`;
        span.style.background = isUnmanaged ? "#9aa5b5" : color(span.dataset.queue);
        i += 1;
      }
      const used = c.queues.reduce((sum, q) => sum + (q.holding[resource] || 0), 0);
      rows.push(el("tr", { "data-cluster": c.name },
        el("td", {}, c.name), el("td", { class: "small" }, `${c.schedulable_nodes}/${c.nodes} nodes`),
        el("td", {}, resource), num(amount(resource, total)), num(amount(resource, used)),
        el("td", {}, bar),
        el("td", { class: "small" }, c.queues.filter((q) => q.pods || q.queued).map((q) =>
          el("div", {}, link(`#/queues/${enc(q.queue)}`, q.queue),
            ` ${q.pods} running/released, ${q.queued} waiting` +
            (q.holding[resource] ? `, ${amount(resource, q.holding[resource])} ${resource}` : ""))))));
    }
  }
  return table(["Cluster", "Nodes", "Resource", "#Capacity", "#Held by lockgate's pods", "Use by queue", "Queues"], rows,
    { "data-table": "clusters" });
}

// ---- queue --------------------------------------------------------------------------------
async function queuePage(view, name) {
  const st = view.state;
  if (!view.root.querySelector("h1")) {
    view.root.append(el("h1", {}, "Queue ", el("span", { "data-name": name }, name)));
    region(view, "spec");
    const waiting = region(view, "waiting-card");
    waiting.append(el("div", { class: "card" }, el("h2", {}, "Waiting pods"),
      el("div", { class: "filters" }, filterInput(view, "cluster", "cluster", view.refresh),
        filterInput(view, "namespace", "namespace", view.refresh)),
      el("div", { "data-region": "waiting" })));
    region(view, "jobsets");
  }
  // Job sets page by JOBSETS_PAGE, asked for one more to know whether a next page exists.
  const jobsetOffset = st.jobsetOffset || 0;
  const [spec, jobsets, waiting, fairness] = await Promise.all([
    api(`/api/v1/queues/${enc(name)}`).catch((e) => (e.status === 404 ? null : Promise.reject(e))),
    api(`/api/v1/jobsets${query({ queue: name, limit: JOBSETS_PAGE + 1, offset: jobsetOffset })}`),
    api(`/api/v1/queues/${enc(name)}/waiting${query({ cluster: st.cluster, namespace: st.namespace, offset: st.offset || 0, limit: PAGE })}`),
    // Its target and share in each cluster: the leader's, asked for this queue alone (the
    // overview leaves them out: every queue in every cluster is queues x clusters numbers).
    api(`/api/v1/fairness${query({ clusters: 1, queue: name })}`).catch((e) => ({ error: e.message })),
  ]);
  const more = jobsets.jobsets.length > JOBSETS_PAGE;
  jobsets.jobsets = jobsets.jobsets.slice(0, JOBSETS_PAGE);
  const moveJobsets = (to) => () => { st.jobsetOffset = Math.max(0, to); view.refresh(); };
  // The per-cluster line goes in the same list as the queue's facts (one grid, one column).
  const facts = spec ? queueFacts(spec) : el("dl", { class: "facts" });
  facts.append(...perClusterFacts(fairness));
  region(view, "spec").replaceChildren(...kids(el("div", { class: "card" }, spec ? null
    : el("p", { class: "error" }, `Queue ${name} is not defined: its pods wait until it is created.`), facts)));
  region(view, "jobsets").replaceChildren(...kids(el("div", { class: "card" }, el("h2", {}, "Job sets with unfinished pods"),
    jobsets.jobsets.length || jobsetOffset ? table(["Job set", "Clusters", "#Pods", "#Unfinished", "By state", "Oldest queued"],
      jobsets.jobsets.map((j) => el("tr", { "data-jobset": j.jobset },
        el("td", {}, link(`#/jobsets/${enc(name)}/${enc(j.jobset)}`, j.jobset)),
        el("td", {}, j.clusters.join(", ")), num(j.pods), num(j.unfinished),
        el("td", {}, Object.entries(j.by_state).map(([s, n]) => el("span", {}, pill(s), ` ${n} `))),
        el("td", { class: "small" }, j.oldest_queued_at ? ago(j.oldest_queued_at) : "–"))), { "data-table": "jobsets" })
      : el("p", { class: "muted" }, "None."),
    jobsetOffset || more ? el("div", { class: "pager" },
      el("button", { class: "quiet", onclick: moveJobsets(jobsetOffset - JOBSETS_PAGE), disabled: !jobsetOffset }, "‹ Prev"),
      el("span", { class: "muted" }, `job sets ${jobsetOffset + 1}–${jobsetOffset + jobsets.jobsets.length}`),
      el("button", { class: "quiet", onclick: moveJobsets(jobsetOffset + JOBSETS_PAGE), disabled: !more }, "Next ›")) : null)));
  view.root.querySelector('[data-region="waiting"]').replaceChildren(...kids(
    el("p", { class: waiting.leader ? "small muted" : "small error", "data-reasons": waiting.leader ? "leader" : "unavailable" },
      `${waiting.queued_in_queue} queued in the queue; ` + (waiting.leader
        ? `reasons from the scheduler leader's round ${waiting.leader.round ? ago(waiting.leader.round.at) : "–"}`
        : `no reasons: ${waiting.reasons_unavailable}`)),
    // One line per pod, as a team lead scans it: the short reason, the whole sentence on expand
    // (and on the pod's page).
    table(["#Position", "Pod", "Cluster", "#Waiting", "Reason"],
      waiting.pods.map((p) => el("tr", { "data-pod": `${p.cluster}/${p.namespace}/${p.name}` },
        num(p.position ?? "…"),
        el("td", { class: "name", title: `${p.namespace}/${p.name} · job set ${p.jobset} · priority ${p.priority} · ${requests(p.requests)}` },
          link(podHref(p), p.name)),
        el("td", {}, p.cluster), el("td", { class: "num", title: "in line since " + when(p.in_line_since) }, since(p.in_line_since)),
        el("td", { class: "reason" }, p.message
          ? el("details", {}, el("summary", { "data-reason": p.reason || "" }, p.summary || p.reason || "–"),
            el("div", { class: "muted small" }, p.message))
          : el("span", { "data-reason": p.reason || "" }, p.summary || p.reason || "–")))),
      { "data-table": "waiting", class: "oneline" }),
    pager(view, waiting.total, view.refresh)));
}
// Its share and fair target in each cluster, one line of the facts (a card of its own pushed
// the page of a crowded queue past a screen's height): "cluster 25.0% of 25.0%" per cluster.
function perClusterFacts(fairness) {
  const facts = (...body) => [el("dt", {}, "In each cluster"), el("dd", { "data-field": "per-cluster" }, ...body)];
  if (fairness.error) return facts(el("span", { class: "error" }, `no fairness report: ${fairness.error}`));
  if (fairness.source !== "leader") return facts(el("span", { class: "error" }, `no shares: ${fairness.reasons_unavailable}`));
  const mine = (fairness.report.queues || [])[0];
  const clusters = mine && mine.clusters ? Object.entries(mine.clusters) : [];
  if (!clusters.length) return facts(el("span", { class: "muted" }, "nothing held or owed"));
  return facts(...clusters.map(([cluster, c], i) => el("span", {
    "data-cluster": cluster, "data-actual": c.actual, "data-target": c.target,
    title: "its share of the cluster's pool (dominant resource) / its fair target there, from the leader's last round" },
  i ? " · " : "", `${cluster} holds ${pct(c.actual)} of a fair ${pct(c.target)}`)));
}
function queueFacts(spec) {
  const ns = spec.namespaces.length ? spec.namespaces.map((n) => el("div", {},
    `${n.cluster}: `, (n.names || []).join(", ") || "", n.selector ? ` selector ${JSON.stringify(n.selector)}` : ""))
    : el("span", { class: "error" }, "none: no pod may use this queue");
  const limits = Object.entries(spec.resource_limits).map(([k, v]) => `${k} ${v}`).join(", ") || "none";
  return el("dl", { class: "facts", "data-facts": "queue" },
    el("dt", {}, "Weight"), el("dd", {}, `${+spec.weight.toPrecision(4)} (priority factor ${spec.priority_factor})`),
    el("dt", {}, "Cordoned"), el("dd", {}, spec.cordoned ? "yes: none of its pods are released" : "no"),
    el("dt", {}, "Bound namespaces"), el("dd", { "data-field": "namespaces" }, ns),
    el("dt", {}, "Allowed kinds"), el("dd", { "data-field": "allowed_kinds" },
      spec.allowed_kinds.join(", "), spec.allowed_kinds_default ? el("span", { class: "muted" }, " (default)") : null),
    el("dt", {}, "Limits"), el("dd", { "data-field": "limits" }, limits),
    el("dt", {}, "Max time queued"), el("dd", {}, spec.max_queued ? `${spec.max_queued.seconds} s, then ${spec.max_queued.action}` : "none"),
    el("dt", {}, "Pod group timeout"), el("dd", {}, spec.group_timeout_seconds ? `${spec.group_timeout_seconds} s, then ${spec.group_timeout_action}` : "none"));
}

// ---- job set ------------------------------------------------------------------------------
async function jobsetPage(view, queue, jobset) {
  const st = view.state;
  if (!view.root.querySelector("h1")) {
    view.root.append(el("h1", {}, "Job set ", link(`#/queues/${enc(queue)}`, queue), ` / ${jobset}`));
    region(view, "actions");
    region(view, "counts");
    view.root.append(el("div", { class: "card" }, el("h2", {}, "Pods"),
      el("div", { class: "filters" }, filterInput(view, "cluster", "cluster", view.refresh),
        stateSelect(view)), el("div", { "data-region": "pods" })));
  }
  // The page says whether the job set was cancelled (a separate ask of /cancellation answered
  // 404 for one never cancelled, an error in the browser's console).
  const page = await api(`/api/v1/jobsets/${enc(queue)}/${enc(jobset)}/pods${query({ cluster: st.cluster, state: st.state, offset: st.offset || 0, limit: PAGE })}`);
  const cancellation = page.cancellation;
  const actions = region(view, "actions");
  const unfinished = Object.values(page.counts).reduce((sum, states) => sum + Object.entries(states)
    .filter(([s]) => ["queued", "released", "ungated", "bound", "running"].includes(s)).reduce((a, [, n]) => a + n, 0), 0);
  actions.replaceChildren(...kids(el("div", { class: "card" },
    cancellation ? el("p", { "data-cancelled": "" }, `Cancelled by ${cancellation.requested_by} at ${when(cancellation.applied_at || cancellation.requested_at)}: ${cancellation.reason} (${cancellation.jobs_cancelled} pods cancelled)`)
      : el("p", { class: "muted" }, `${plural(unfinished, "unfinished pod")}.`),
    me.may_act && !cancellation ? el("button", { class: "danger", "data-action": "cancel-jobset",
      onclick: () => confirmCancel(view, queue, jobset, unfinished) }, "Cancel job set…") : null)));
  const clusters = Object.keys(page.counts).sort();
  const states = [...new Set(clusters.flatMap((c) => Object.keys(page.counts[c])))].sort();
  region(view, "counts").replaceChildren(...kids(el("div", { class: "card" }, el("h2", {}, "Pods per cluster and state"),
    table(["Cluster", ...states.map((s) => `#${s}`)], clusters.map((c) => el("tr", { "data-cluster": c },
      el("td", {}, c), states.map((s) => num(page.counts[c][s] || 0)))), { "data-table": "counts" }))));
  view.root.querySelector('[data-region="pods"]').replaceChildren(...kids(
    table(["Pod", "Cluster", "State", "Node", "Requests", "Created", "Last reason"],
      page.pods.map((p) => el("tr", { "data-pod": `${p.cluster}/${p.namespace}/${p.name}` },
        el("td", {}, link(podHref(p), `${p.namespace}/${p.name}`)), el("td", {}, p.cluster), el("td", {}, pill(p.state)),
        el("td", {}, p.node_name || "–"), el("td", { class: "small" }, requests(p.requests)),
        el("td", { class: "small" }, ago(p.created_at)), el("td", { class: "small" }, p.last_reason || ""))), { "data-table": "pods" }),
    pager(view, page.total, view.refresh)));
}
function stateSelect(view) {
  const select = el("select", { "data-filter": "state" }, el("option", { value: "" }, "any state"),
    ["queued", "released", "ungated", "bound", "running", "succeeded", "failed", "deleted", "cancelled"]
      .map((s) => el("option", { value: s, selected: view.state.state === s }, s)));
  select.addEventListener("change", () => { view.state.state = select.value; view.state.offset = 0; view.refresh(); });
  return select;
}
function confirmCancel(view, queue, jobset, unfinished) {
  const dialog = $("confirm");
  $("confirm-title").textContent = `Cancel job set ${queue}/${jobset}?`;
  $("confirm-text").textContent = `Its ${plural(unfinished, "unfinished pod")} are cancelled and deleted in every cluster, ` +
    "and its ephemeral namespaces are collected. This cannot be undone.";
  $("confirm-reason").value = `cancelled from the web UI by ${me.name}`;
  dialog.returnValue = "";
  dialog.onclose = async () => {
    if (dialog.returnValue !== "ok") return;
    try {
      await api(`/api/v1/jobsets/${enc(queue)}/${enc(jobset)}/cancel`, {
        method: "POST", headers: { "Content-Type": "application/json" },
        body: JSON.stringify({ reason: $("confirm-reason").value.trim() || "cancelled from the web UI" }) });
      view.refresh();
    } catch (error) {
      $("error").hidden = false;
      $("error").textContent = `cancel refused: ${error.message}`;
    }
  };
  dialog.showModal();
}

// ---- pod ----------------------------------------------------------------------------------
async function podPage(view, cluster, namespace, name) {
  const path = `/api/v1/pods/${enc(cluster)}/${enc(namespace)}/${enc(name)}`;
  const [body, trace] = await Promise.all([api(path),
    api(`${path}/trace`).catch((error) => ({ spans: [], message: `no trace: ${error.message}` }))]);
  const p = body.pod;
  view.root.replaceChildren(...kids(
    el("h1", {}, "Pod ", el("span", {}, `${cluster}/${namespace}/${name}`), " ", pill(p.state)),
    el("div", { class: "card" }, el("h2", {}, "Journey"),
      el("div", { class: "journey", "data-journey": "" }, body.journey.map((s) =>
        el("div", { class: `step${s.reached ? " reached" : ""}${s.current ? " current" : ""}`, "data-step": s.step,
          "data-reached": s.reached ? "true" : "false" },
        el("b", {}, s.step), el("span", { class: "small" }, s.at ? when(s.at) : (s.reached ? "" : "not yet")),
        s.detail ? el("div", { class: "small muted" }, s.detail) : null))),
      p.skipped_gate ? el("div", { class: "banner", "data-warning": "skipped-gate" },
        el("b", {}, "This pod skipped the queue: "), "it runs without lockgate's gate, so no fair-share decision let it run. It counts as its queue's use.") : null,
      el("h2", {}, "Why"), el("div", { class: "explain", "data-explain": "", "data-reasons": body.reasons_unavailable ? "unavailable" : "leader" }, body.message || ""),
      body.eviction ? el("p", { class: "error", "data-eviction": "" },
        `Evicted (${body.eviction.kind}, ${body.eviction.action}) ${ago(body.eviction.decided_at)}: ${body.eviction.message}`) : null),
    el("div", { class: "card" }, el("dl", { class: "facts" },
      el("dt", {}, "Queue"), el("dd", {}, link(`#/queues/${enc(p.queue)}`, p.queue)),
      el("dt", {}, "Job set"), el("dd", {}, link(`#/jobsets/${enc(p.queue)}/${enc(p.jobset)}`, p.jobset)),
      el("dt", {}, "UID"), el("dd", {}, el("code", {}, p.uid)),
      el("dt", {}, "Requests"), el("dd", {}, requests(p.requests)),
      el("dt", {}, "Priority"), el("dd", {}, `${p.priority}${p.priority_class ? ` (${p.priority_class})` : ""}`),
      el("dt", {}, "Node"), el("dd", {}, p.node_name || "–"),
      el("dt", {}, "Release attempts"), el("dd", {}, String(p.release_attempts)),
      p.unschedulable_message ? [el("dt", {}, "kube-scheduler"), el("dd", {}, p.unschedulable_message)] : null,
      el("dt", {}, "Trace"), el("dd", { "data-trace": "" }, body.trace_url
        ? el("a", { href: body.trace_url, target: "_blank", rel: "noopener noreferrer" }, `trace ${body.trace_id}`)
        : el("span", { class: "muted" }, body.trace_id ? `trace id ${body.trace_id}` : "none")))),
    traceCard(trace)));
}

// The pod's spans as a waterfall: the rows `lockgate trace` prints, each bar placed in time.
function micros(us) {
  if (us < 1000) return `${us}µs`;
  if (us < 1e6) { const ms = us / 1000; return ms < 100 ? `${Number(ms.toPrecision(3))}ms` : `${Math.round(ms)}ms`; }
  const s = us / 1e6;
  if (s < 60) return `${Number(s.toPrecision(3))}s`;
  const m = Math.floor(s / 60);
  return m < 60 ? `${m}m${Math.floor(s) % 60}s` : `${Math.floor(m / 60)}h${m % 60}m`;
}
function traceCard(trace) {
  const spans = trace.spans || [];
  const total = Math.max(1, trace.total_us || 0);
  const recorded = spans.filter((r) => !r.wait).length;
  const head = spans.length
    ? `${recorded} spans from ${(trace.services || []).length} services over ${micros(trace.total_us || 0)}`
    : (trace.message || "no spans");
  return el("div", { class: "card", "data-waterfall": "" }, el("h2", {}, "Trace"),
    el("p", { class: "small muted" }, head),
    spans.length ? el("table", { class: "waterfall" },
      el("thead", {}, el("tr", {}, el("th", {}, "Service"), el("th", {}, "Span"),
        el("th", { class: "num" }, "Start"), el("th", { class: "num" }, "Duration"), el("th", {}, ""))),
      el("tbody", {}, spans.map((r) => el("tr", { "data-span": r.name, "data-wait": r.wait ? "" : null,
        class: r.wait ? "wait" : r.linked ? "linked" : null },
        el("td", {}, r.wait ? "–" : r.service),
        el("td", { title: Object.entries(r.attributes || {}).map(([k, v]) => `${k}=${v}`).join("\n") },
          "\u00a0\u00a0".repeat(r.depth) + (r.linked ? "~" : "") + r.name + (r.error ? " (error)" : "")),
        el("td", { class: "num" }, r.offset_us ? micros(r.offset_us) : "0s"),
        el("td", { class: "num" }, micros(r.duration_us)),
        el("td", { class: "span-bar" }, svg("svg", { viewBox: "0 0 1000 10", preserveAspectRatio: "none" },
          svg("rect", { x: Math.min(999, 1000 * r.offset_us / total), y: 1, height: 8,
            width: Math.max(2, 1000 * r.duration_us / total), class: r.error ? "error" : r.wait ? "wait" : "" }))))))) : null,
    spans.some((r) => r.wait) ? el("p", { class: "small muted" },
      "waiting in line: no service's span, the time from the pod stored to its release decided") : null,
    spans.some((r) => r.linked) ? el("p", { class: "small muted" },
      "~ a span of another trace the pod's spans link to (its admission review, the round that released it); hover a span for its attributes") : null);
}

// ---- ephemeral namespaces and evictions ---------------------------------------------------
async function namespacesPage(view) {
  const st = view.state;
  if (!view.root.querySelector("h1")) {
    view.root.append(el("h1", {}, "Ephemeral namespaces"), el("div", { class: "card" },
      el("div", { class: "filters" }, filterInput(view, "queue", "queue", view.refresh),
        filterInput(view, "state", "state (active, expiring, …)", view.refresh)),
      el("div", { "data-region": "namespaces" })));
  }
  const body = await api(`/api/v1/namespaces${query({ queue: st.queue, state: st.state, offset: st.offset || 0, limit: PAGE })}`);
  view.root.querySelector('[data-region="namespaces"]').replaceChildren(...kids(
    table(["Namespace", "Cluster", "Queue", "Job set", "State", "Trigger", "Created", "Expires", "Attempts"],
      body.namespaces.map((n) => el("tr", { "data-namespace": `${n.cluster}/${n.name}` },
        el("td", {}, link(`#/namespaces/${enc(n.cluster)}/${enc(n.name)}`, n.name)), el("td", {}, n.cluster),
        el("td", {}, link(`#/queues/${enc(n.queue)}`, n.queue)), el("td", {}, link(`#/jobsets/${enc(n.queue)}/${enc(n.jobset)}`, n.jobset)),
        el("td", {}, pill(n.state), n.failure_reason ? el("div", { class: "small error" }, n.failure_reason) : null),
        el("td", {}, n.trigger || "–"), el("td", { class: "small" }, ago(n.created_at)),
        el("td", { class: "small" }, n.expires_at ? when(n.expires_at) : "–"), num(n.attempts))), { "data-table": "namespaces" }),
    pager(view, body.total ?? body.namespaces.length, view.refresh)));
}
async function namespacePage(view, cluster, name) {
  const body = await api(`/api/v1/namespaces/${enc(cluster)}/${enc(name)}/transitions`);
  const n = body.namespace;
  view.root.replaceChildren(...kids(el("h1", {}, `Namespace ${cluster}/${name} `, pill(n.state)),
    el("div", { class: "card" }, el("dl", { class: "facts" },
      el("dt", {}, "Queue / job set"), el("dd", {}, link(`#/jobsets/${enc(n.queue)}/${enc(n.jobset)}`, `${n.queue} / ${n.jobset}`)),
      el("dt", {}, "TTL"), el("dd", {}, n.ttl_seconds ? `${n.ttl_seconds} s (expires ${when(n.expires_at)})` : "none"),
      el("dt", {}, "Trigger"), el("dd", {}, n.trigger || "–"),
      el("dt", {}, "Failure"), el("dd", {}, n.failure_reason || "–"))),
    el("div", { class: "card" }, el("h2", {}, "Transitions"),
      table(["At", "From", "To", "Cause"], body.transitions.map((t) => el("tr", { "data-transition": t.to_state },
        el("td", { class: "small" }, when(t.at)), el("td", {}, t.from_state ? pill(t.from_state) : "–"),
        el("td", {}, pill(t.to_state)), el("td", {}, t.cause))), { "data-table": "transitions" }))));
}
async function evictionsPage(view) {
  const st = view.state;
  if (!view.root.querySelector("h1")) {
    view.root.append(el("h1", {}, "Evictions"), el("div", { class: "card" },
      el("div", { class: "filters" }, filterInput(view, "queue", "queue of the evicted pod", view.refresh),
        filterInput(view, "cluster", "cluster", view.refresh)),
      el("div", { "data-region": "evictions" })));
  }
  const body = await api(`/api/v1/evictions${query({ queue: st.queue, cluster: st.cluster, offset: st.offset || 0, limit: PAGE })}`);
  view.root.querySelector('[data-region="evictions"]').replaceChildren(...kids(
    table(["Decided", "Pod", "Queue", "Kind", "Action", "For queue", "Reason"],
      body.evictions.map((e) => el("tr", { "data-eviction": e.eviction_id },
        el("td", { class: "small" }, when(e.decided_at)),
        el("td", {}, link(podHref(e), `${e.cluster}/${e.namespace}/${e.name}`)),
        el("td", {}, link(`#/queues/${enc(e.queue)}`, e.queue)), el("td", {}, e.kind), el("td", {}, e.action),
        el("td", {}, e.for_queue || "–"), el("td", { class: "small" }, e.message))), { "data-table": "evictions" }),
    body.evictions.length ? null : el("p", { class: "muted" }, "No evictions."),
    pager(view, body.total, view.refresh)));
}

// ---- start --------------------------------------------------------------------------------
document.addEventListener("DOMContentLoaded", async () => {
  $("signin-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    const token = $("token").value.trim();
    $("token").value = "";
    try {
      await signIn(token);
      showSignedIn();
      route();
    } catch (error) {
      showSignIn(error.status === 401 ? "That token is not valid." : `Sign-in failed: ${error.message}`);
    }
  });
  $("signout").addEventListener("click", () => signOut(""));
  window.addEventListener("hashchange", route);
  if (sessionStorage.getItem(TOKEN_KEY)) {
    try {
      me = await api("/api/v1/whoami");
      showSignedIn();
      route();
      return;
    } catch (_) { /* fall through to the sign-in form */ }
  }
  showSignIn("");
});
