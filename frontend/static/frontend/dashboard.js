/* Tessera dashboard: a snapshot over REST, then deltas over the websocket (no reload, no build).
 *
 * 1. Fetch state.json (the snapshot) and open /ws/dashboard/ at once, side by side; the snapshot
 *    is drawn as soon as it comes. The server answers "ready" once it has joined this viewer's
 *    groups, so from then on no delta is missed; deltas that arrive before the snapshot are
 *    buffered.
 * 2. Reconcile by the live sequence numbers (docs/websockets.md): a frame numbered at most the
 *    snapshot's is shown by it already and dropped; a snapshot numbered below the socket's
 *    "ready" may have missed a change made while the socket joined, and is fetched again.
 * 3. Apply each delta by replacing the row with the same key (device: node + index; job: id;
 *    a node's own fields: name); a finished job leaves the live list. A device of an unknown node means the cluster changed
 *    shape: fetch the snapshot again.
 * 4. On a lost connection, reconnect with backoff; the next "ready" refetches the snapshot.
 *
 * Everything that comes from users (job names, node names) is set with textContent, never HTML.
 */
(function () {
  "use strict";

  const root = document.getElementById("dashboard");
  if (!root) return;

  const T = (window.TESSERA = {
    loadedAt: Date.now(), // a marker that a reload would reset (the browser test checks it)
    model: null,
    deltas: 0,
    lastDeltaAt: 0,
    snapshots: 0,
    connected: false,
  });

  let terminal = new Set(["succeeded", "failed", "cancelled"]);
  const ENDED_KEPT = 20;
  let queueOrder = {}; // job id -> place in the whole queue, as the scheduler orders it
  let queueTimer = null;
  let buffered = [];
  let socket = null;
  let retryMs = 500;
  let renderTimer = null;

  // ---- the model ------------------------------------------------------------------------------

  function buildModel(snapshot) {
    if (snapshot.states && snapshot.states.terminal) terminal = new Set(snapshot.states.terminal);
    const nodes = {};
    const defaults = snapshot.device_defaults || {};
    for (const node of snapshot.nodes) {
      const devices = {};
      const model = node.models.length === 1 ? node.models[0] : undefined;
      for (const d of node.devices) devices[d.index] = expandDevice(d, node.name, model, defaults);
      nodes[node.name] = Object.assign({}, node, { devices: devices });
    }
    const jobs = {};
    for (const job of snapshot.jobs) jobs[job.id] = job;
    return {
      seq: typeof snapshot.seq === "number" ? snapshot.seq : -1, // the live sequence number it shows
      viewer: snapshot.viewer, nodes: nodes, jobs: jobs, truncated: !!snapshot.jobs_truncated,
      ended: (snapshot.ended || []).slice(), // newest first: a finished or failed job keeps a trace
    };
  }

  /* A snapshot's device row with what it leaves out put back (frontend/state.py, DEVICE_DEFAULTS):
   * its node, its node's one model, and the default fields; then it is the row a gpu.update sends. */
  function expandDevice(d, nodeName, model, defaults) {
    d.node = nodeName;
    if (d.model === undefined) d.model = model;
    for (const key in defaults) if (!(key in d)) d[key] = Array.isArray(defaults[key]) ? [] : defaults[key];
    return d;
  }

  /* Apply one delta to a model; returns false if only a fresh snapshot can bring it up to date. */
  function applyDelta(model, msg) {
    if (msg.type === "job.update") {
      const job = msg.job;
      if (terminal.has(job.state)) {
        delete model.jobs[job.id];
        model.ended = [job].concat(model.ended.filter(function (j) { return j.id !== job.id; })).slice(0, ENDED_KEPT);
      } else model.jobs[job.id] = job;
      return true;
    }
    if (msg.type === "node.update") {
      const node = model.nodes[msg.node.name];
      if (!node) return false;
      Object.assign(node, msg.node); // its own fields; its devices come with gpu.update
      return true;
    }
    if (msg.type === "gpu.update") {
      for (const d of msg.devices) {
        const node = model.nodes[d.node];
        if (!node) return false;
        node.devices[d.index] = d;
      }
      return true;
    }
    return true;
  }

  /* A plain, ordered copy of a model: what "equal" means between deltas and a fresh fetch. */
  function normalize(model) {
    const nodes = Object.keys(model.nodes).sort().map(function (name) {
      const node = model.nodes[name];
      const devices = Object.keys(node.devices)
        .map(Number)
        .sort(function (a, b) { return a - b; })
        .map(function (i) { return node.devices[i]; });
      return Object.assign({}, node, { devices: devices });
    });
    const jobs = Object.keys(model.jobs)
      .map(Number)
      .sort(function (a, b) { return a - b; })
      .map(function (id) { return model.jobs[id]; });
    return { nodes: nodes, jobs: jobs };
  }

  async function fetchSnapshot() {
    const response = await fetch(root.dataset.stateUrl, {
      credentials: "same-origin",
      headers: { Accept: "application/json" },
    });
    if (response.status === 401 || response.status === 403) {
      window.location.assign("/login/?next=/");
      throw new Error("signed out");
    }
    if (!response.ok) throw new Error("state.json answered " + response.status);
    return response.json();
  }

  // The adjustment pass could not read utilisation at its last run: said in a banner (from the
  // page's render, and again with every snapshot the page fetches).
  function showUtilisationProblem(problem) {
    const banner = document.getElementById("utilisation-banner");
    if (!banner) return;
    document.getElementById("utilisation-problem").textContent = problem;
    banner.hidden = !problem;
  }

  /* Whether a frame is newer than what a model shows (an unnumbered one is taken as newer). */
  function newer(msg, model) { return typeof msg.seq !== "number" || msg.seq > model.seq; }

  async function resync() {
    install(await fetchSnapshot());
  }

  function install(snapshot) {
    showUtilisationProblem(snapshot.utilisation_problem || "");
    const model = buildModel(snapshot);
    const pending = buffered || [];
    buffered = null;
    for (const msg of pending) if (newer(msg, model)) applyDelta(model, msg);
    T.model = model;
    T.snapshots += 1;
    dirty.full = true;
    queueKey = ""; // the queue's order is fetched again with the snapshot
    scheduleRender();
  }

  T.normalize = normalize;
  T.fetchNormalized = async function () { return normalize(buildModel(await fetchSnapshot())); };
  T.currentNormalized = function () { return T.model ? normalize(T.model) : null; };

  // ---- the socket -----------------------------------------------------------------------------

  function setLive(on, text) {
    T.connected = on;
    const badge = document.getElementById("live");
    badge.textContent = text;
    badge.className = "live " + (on ? "live-on" : "live-off");
  }

  function connect() {
    const scheme = window.location.protocol === "https:" ? "wss://" : "ws://";
    socket = new WebSocket(scheme + window.location.host + root.dataset.wsPath);
    buffered = [];
    socket.onmessage = function (event) {
      const began = performance.now();
      onMessage(event);
      const took = performance.now() - began; // the frame handler's time: the benchmark reads it
      T.handlerMsTotal = (T.handlerMsTotal || 0) + took;
      T.handlerMsMax = Math.max(T.handlerMsMax || 0, took);
    };
    const onMessage = function (event) {
      let msg;
      try { msg = JSON.parse(event.data); } catch (e) { return; }
      if (msg.type === "ready") {
        retryMs = 500;
        setLive(true, "live");
        const first = early;
        early = null;
        const joined = typeof msg.seq === "number" ? msg.seq : Infinity;
        // The page's first snapshot, asked for while this socket joined, is complete if it is
        // numbered at least as the socket's "ready"; a later "ready" (a reconnect) fetches anew.
        (first ? first.then(function () {
          if (T.model.seq >= joined) return null;
          buffered = [];
          return resync();
        }, function () { buffered = buffered || []; return resync(); }) : resync())
          .catch(function (err) { console.error(err); socket.close(); });
        return;
      }
      if (["job.update", "gpu.update", "node.update"].indexOf(msg.type) < 0) return;
      T.deltas += 1;
      T.lastDeltaAt = Date.now();
      if (buffered !== null || !T.model) { (buffered = buffered || []).push(msg); return; }
      if (!newer(msg, T.model)) return; // the snapshot shows it already
      if (!applyDelta(T.model, msg)) {
        buffered = [];
        resync().catch(function (err) { console.error(err); socket.close(); });
        return;
      }
      noteChange(msg);
      scheduleRender();
    };
    socket.onclose = function (event) {
      // 4401: the session was signed out (in another tab): the server closed its sockets.
      if (event.code === 4401) { window.location.assign("/login/?next=/"); return; }
      setLive(false, "reconnecting…");
      window.setTimeout(connect, retryMs);
      retryMs = Math.min(retryMs * 2, 15000);
    };
  }

  // ---- rendering ------------------------------------------------------------------------------

  function el(tag, attrs, children) {
    const node = document.createElement(tag);
    for (const key in attrs || {}) {
      if (key === "text") node.textContent = attrs[key];
      else if (key === "class") node.className = attrs[key];
      else node.setAttribute(key, attrs[key]);
    }
    for (const child of children || []) if (child) node.appendChild(child);
    return node;
  }

  let laterTimer = null; // a render put off (the lists, after GPU churn), apart from the next frame's
  function scheduleRenderIn(ms) {
    if (laterTimer !== null) return;
    laterTimer = window.setTimeout(function () { laterTimer = null; render(); }, Math.max(16, ms));
  }

  /* Renders go in animation frames: every delta that arrived since the last frame is drawn
   * together, just before the browser paints, and none while the tab is hidden. A timer backs the
   * frame up, so a page the browser does not paint (hidden) still keeps its counts current. */
  function scheduleRender() {
    if (renderTimer !== null) return;
    let done = false;
    const run = function () {
      if (done) return;
      done = true;
      window.clearTimeout(backup);
      renderTimer = null;
      render();
    };
    const backup = window.setTimeout(run, 1000);
    renderTimer = window.requestAnimationFrame(run);
  }

  // Shares are thousandths of a GPU (the allocation's unit): 0.125 is 12.5%, 0.001 is 0.1%, not 0%.
  function pct(share) { return Math.round(share * 1000) / 10 + "%"; }

  function jobLabel(id) {
    const job = T.model.jobs[id];
    return "job " + id + (job ? " " + job.name : "");
  }

  /* The cell's look (colour and shape) and its words, as this viewer may see them. */
  function describeCell(node, d) {
    const words = [node.name, "GPU " + d.index, d.model];
    const classes = ["cell"];
    const operator = T.model.viewer.operator;
    if (d.state === "unhealthy") classes.push("unhealthy");
    else if (d.state === "free") classes.push("free");
    else if (!operator && d.jobs.length === 0) classes.push("in-use");
    else classes.push(d.state);
    if (!operator && d.jobs.length > 0) classes.push("mine");
    if (d.state === "unhealthy") words.push("unhealthy");
    else if (d.state === "free") words.push("free");
    for (const j of d.jobs) {
      let line = jobLabel(j.job_id) + " " + pct(j.share);
      if (j.tenant) line += " " + j.tenant;
      words.push(line);
    }
    if (d.others > 0) words.push("in use by another team " + pct(d.others));
    // Utilisation where the adjustment pass read it (sent only to the GPU's own team and to
    // operators): a colour band, and an idle GPU marked by a shape too (dashed ring, "z").
    if (d.util !== undefined && (d.state === "allocated" || d.state === "shared")) {
      classes.push("util-" + utilBand(d.util));
      words.push("utilisation " + pct(d.util));
      if (d.idle) { classes.push("idle"); words.push("idle"); }
    }
    if (node.state !== "ready") words.push("node " + node.state);
    return { classes: classes.join(" "), label: words.join(", ") };
  }

  function utilBand(util) { return util < 0.05 ? 0 : util < 0.35 ? 1 : util < 0.7 ? 2 : 3; }

  function nodeReady(node) { return node.state === "ready"; }

  // What changed since the last render: a full rebuild (a snapshot, a node's own fields), or only
  // some cells and the queue. At 8,000 GPUs with a tenth of them changing each second, rebuilding
  // every cell on every delta was the page's whole cost; a changed cell is now updated in place.
  const dirty = { full: true, cells: new Set(), queue: true, placements: false };
  let queueRenderedAt = 0;
  const PLACEMENTS_EVERY_MS = 1000; // GPU churn alone redraws the lists at most once a second
  // Script time one task may take, at most: changed cells in view are painted in animation frames
  // (the browser's style and paint work for them follows in the same task), changed cells off
  // screen in idle time, and a rebuilt map is added rack by rack, each part in its own task.
  const SLICE_MS = 4;
  const cellEls = new Map(); // "node/index" -> its element
  const jobCells = new Map(); // job id -> the keys of the cells it holds (for its label and placement)
  const held = new Map(); // "node/index" -> [state, job ids], as counted in counts and jobCells
  // Racks the browser skips (content-visibility: auto, away from the viewport), and the cells that
  // changed in them since: painted in idle time, or in the next frame when the rack comes into
  // view or one of its cells takes focus.
  const skippedRacks = new Set();
  const stale = new Map(); // rack -> Set of keys
  let idleHandle = null;

  function nodeOfKey(key) { return T.model.nodes[key.slice(0, key.lastIndexOf("/"))]; }

  function markDirty(node, key) {
    if (node && skippedRacks.has(node.rack)) {
      if (!stale.has(node.rack)) stale.set(node.rack, new Set());
      stale.get(node.rack).add(key);
      scheduleIdle();
    } else dirty.cells.add(key);
  }

  function noteChange(msg) {
    if (msg.type === "node.update") dirty.full = true;
    else if (msg.type === "gpu.update") {
      for (const d of msg.devices) {
        const node = T.model.nodes[d.node];
        const key = d.node + "/" + d.index;
        account(node, key, d);
        markDirty(node, key);
      }
      dirty.placements = true; // where a running job is shown to run may have changed
    } else if (msg.type === "job.update") {
      dirty.queue = true;
      for (const key of jobCells.get(msg.job.id) || []) markDirty(nodeOfKey(key), key); // its name in the labels
    }
  }

  const counts = { total: 0, free: 0, freeElsewhere: 0 }; // kept up to date by account

  function count(node, state, sign) {
    if (state === undefined) return;
    counts.total += sign;
    if (state === "free") { if (nodeReady(node)) counts.free += sign; else counts.freeElsewhere += sign; }
  }

  /* The counts and a job's cells follow the model at once, whether or not the cell is painted yet. */
  function account(node, key, d) {
    const before = held.get(key);
    if (before) {
      count(node, before[0], -1);
      for (const id of before[1]) {
        const keys = jobCells.get(id);
        if (keys) { keys.delete(key); if (!keys.size) jobCells.delete(id); }
      }
    }
    count(node, d.state, +1);
    const ids = d.jobs.map(function (j) { return j.job_id; });
    for (const id of ids) {
      if (!jobCells.has(id)) jobCells.set(id, new Set());
      jobCells.get(id).add(key);
    }
    held.set(key, [d.state, ids]);
  }

  function paintCell(cell, node, d) {
    const look = describeCell(node, d);
    // Only what differs is written, compared with what was written last (kept on the element, so
    // no attribute is read back): every write makes the browser look at the cell's style again.
    const w = cell._written || (cell._written = { classes: "", label: "", state: "", jobs: "", fill: "" });
    const classes = look.classes + (filteredOut(d) ? " dim" : "");
    if (w.classes !== classes) cell.className = w.classes = classes;
    if (w.label !== look.label) {
      w.label = look.label;
      cell.title = look.label;
      cell.setAttribute("aria-label", look.label);
    }
    if (w.state !== d.state) cell.setAttribute("data-state", (w.state = d.state));
    const ids = d.jobs.length ? d.jobs.map(function (j) { return j.job_id; }).join(" ") : "";
    if (w.jobs !== ids) {
      w.jobs = ids;
      if (ids) cell.setAttribute("data-jobs", ids);
      else cell.removeAttribute("data-jobs");
    }
    // A partly used GPU fills from the bottom in proportion to its share.
    const fill = d.state === "shared" && d.used > 0 && d.used < 1 ? pct(d.used) : "";
    if (w.fill !== fill) {
      w.fill = fill;
      if (fill) { cell.style.setProperty("--fill", fill); cell.setAttribute("data-fill", fill); }
      else { cell.style.removeProperty("--fill"); cell.removeAttribute("data-fill"); }
    }
  }

  function paintKey(key) {
    const cell = cellEls.get(key);
    if (!cell) return; // not built yet: it is built from the model as it is then
    const node = nodeOfKey(key);
    const d = node && node.devices[Number(key.slice(key.lastIndexOf("/") + 1))];
    if (d) paintCell(cell, node, d);
  }

  /* Paints keys (removing them from the set) for at most ms of script; true when all are done. */
  function paintSome(keys, until) {
    let painted = 0;
    for (const key of keys) {
      keys.delete(key);
      paintKey(key);
      if (++painted % 10 === 0 && performance.now() > until) return false;
    }
    return true;
  }

  function scheduleIdle() {
    if (idleHandle !== null) return;
    idleHandle = window.requestIdleCallback
      ? window.requestIdleCallback(paintStale, { timeout: 1000 })
      : window.setTimeout(paintStale, 100);
  }

  function paintStale() {
    idleHandle = null;
    const until = performance.now() + SLICE_MS;
    for (const [rack, keys] of stale) {
      const done = paintSome(keys, until);
      if (!keys.size) stale.delete(rack);
      if (!done) break;
    }
    if (stale.size) scheduleIdle();
  }

  function onRackVisibility(event) {
    const rackEl = event.target;
    if (!rackEl.isConnected || !rackEl.classList.contains("rack")) return;
    const rack = rackEl.dataset.rack;
    if (event.skipped) { skippedRacks.add(rack); return; }
    skippedRacks.delete(rack);
    const keys = stale.get(rack);
    if (!keys) return;
    stale.delete(rack);
    for (const key of keys) dirty.cells.add(key);
    scheduleRender();
  }

  function onHeatmapFocus(event) {
    const cell = event.target.closest && event.target.closest(".cell");
    const node = cell && T.model && T.model.nodes[cell.dataset.node];
    const keys = node && stale.get(node.rack);
    const key = cell && cell.dataset.node + "/" + cell.dataset.index;
    if (keys && keys.delete(key)) paintKey(key); // its label is read out now
  }

  /* The heatmap: one keyboard stop (a roving tabindex over the cells; arrows move, Enter opens),
   * NVLink islands kept whole when a row wraps, and no live region: a person reads it by moving
   * through it, not by having every update announced. Built rack by rack, each part at most
   * SLICE_MS of script (the first racks, those in view, first). */
  let build = null; // the map being built: {racks, byRack, next, focused, stop}

  function buildHeatmap() {
    const model = T.model;
    const byRack = {};
    for (const name of Object.keys(model.nodes).sort()) {
      const node = model.nodes[name];
      (byRack[node.rack] = byRack[node.rack] || []).push(node);
    }
    const box = document.getElementById("heatmap");
    const racks = Object.keys(byRack).sort();
    cellEls.clear();
    jobCells.clear();
    held.clear();
    skippedRacks.clear();
    stale.clear();
    counts.total = counts.free = counts.freeElsewhere = 0;
    for (const name in model.nodes) {
      const node = model.nodes[name];
      for (const i in node.devices) account(node, name + "/" + i, node.devices[i]);
    }
    updateFilters(racks);
    build = null;
    if (racks.length === 0) {
      box.replaceChildren(el("p", { class: "muted", text: "No nodes have joined yet." }));
      return;
    }
    const focused = document.activeElement && document.activeElement.classList.contains("cell") && box.contains(document.activeElement)
      ? document.activeElement.dataset.node + "/" + document.activeElement.dataset.index : null;
    box.replaceChildren();
    build = { racks: racks, byRack: byRack, next: 0, focused: focused, stop: null };
    buildSome(build, 2);
  }

  function buildSome(b, atLeast) {
    if (build !== b) return; // a newer build replaced this one
    const box = document.getElementById("heatmap");
    const until = performance.now() + SLICE_MS;
    let built = 0;
    while (b.next < b.racks.length && (built < atLeast || performance.now() < until)) {
      const rack = b.racks[b.next++];
      const section = buildRack(rack, b.byRack[rack]);
      box.appendChild(section);
      applyRowFilters(section);
      built += 1;
    }
    placeStop(b, box);
    if (b.next < b.racks.length) window.setTimeout(function () { buildSome(b, 1); }, 0);
    else {
      build = null;
      if (!T.mapBuiltMs) T.mapBuiltMs = performance.now(); // the benchmark reads it
    }
  }

  function buildRack(rack, nodes) {
    const rows = nodes.map(function (node) {
      const indexes = Object.keys(node.devices).map(Number).sort(function (a, b) { return a - b; });
      const island = Math.max(1, node.nvlink_domain || 1);
      const islands = [];
      for (const i of indexes) {
        const cell = el("button", { type: "button", tabindex: "-1", "data-node": node.name, "data-index": String(i) });
        paintCell(cell, node, node.devices[i]);
        cellEls.set(node.name + "/" + i, cell);
        const k = Math.floor(i / island);
        (islands[k] = islands[k] || el("span", { class: "island" })).appendChild(cell);
      }
      return el("div", { class: "node-row node-" + node.state, "data-rack": node.rack, "data-models": node.models.join(" ") }, [
        el("div", { class: "node-name" }, [
          el("span", { text: node.name }),
          el("span", { class: "node-meta", text: node.models.join("/") + (node.state !== "ready" ? " · " + node.state : "") }),
        ]),
        el("div", { class: "cells" }, islands.filter(Boolean)),
      ]);
    });
    return el("div", { class: "rack", "data-rack": rack }, [el("h2", { class: "rack-name", text: "rack " + rack })].concat(rows));
  }

  /* The map's one Tab stop: the cell that had focus (or was last used), once it is built, or the
   * first shown cell. */
  function placeStop(b, box) {
    if (b.stop) return;
    const wanted = b.focused || (T.stop ? T.stop[0] + "/" + T.stop[1] : null);
    let stop = wanted ? cellEls.get(wanted) : null;
    if (!stop && wanted && b.next < b.racks.length) return; // it may be in a rack not built yet
    stop = stop || box.querySelector(".node-row:not([hidden]) .cell");
    if (!stop) return;
    b.stop = stop;
    stop.tabIndex = 0;
    if (b.focused) stop.focus();
  }

  function renderHeatmap() {
    if (dirty.full) {
      buildHeatmap();
      dirty.cells.clear();
      dirty.full = false;
    } else if (!paintSome(dirty.cells, performance.now() + SLICE_MS)) {
      scheduleRender(); // the rest in the next animation frame
    }
    renderTotals();
  }

  let totalsText = null;
  function renderTotals() {
    const text = counts.total ? counts.total + " GPUs · " + counts.free + " free" +
      (counts.freeElsewhere ? " (" + counts.freeElsewhere + " more on nodes not taking work)" : "") : "";
    if (text !== totalsText) document.getElementById("totals").textContent = totalsText = text;
  }

  // ---- filters: by rack and model (rows hidden), by tenant for operators (other cells dimmed) ----

  const filters = { rack: "", model: "", tenant: "" };

  function updateFilters(racks) {
    const models = new Set(), tenants = new Set();
    for (const name in T.model.nodes) {
      const node = T.model.nodes[name];
      for (const m of node.models) models.add(m);
      for (const i in node.devices) for (const j of node.devices[i].jobs) if (j.tenant) tenants.add(j.tenant);
    }
    fillSelect("filter-rack", racks, filters.rack);
    fillSelect("filter-model", Array.from(models).sort(), filters.model);
    if (T.model.viewer.operator) fillSelect("filter-tenant", Array.from(tenants).sort(), filters.tenant);
  }

  function fillSelect(id, values, chosen) {
    const select = document.getElementById(id);
    if (!select) return;
    const first = select.options[0];
    select.replaceChildren(first);
    for (const v of values) {
      const option = el("option", { value: v, text: v });
      if (v === chosen) option.selected = true;
      select.appendChild(option);
    }
  }

  function filteredOut(d) {
    return !!filters.tenant && !d.jobs.some(function (j) { return j.tenant === filters.tenant; });
  }

  function applyRowFilters(rack) {
    if (!filters.rack && !filters.model) return; // rows are built shown
    for (const row of rack.querySelectorAll(".node-row")) {
      row.hidden = (filters.rack && row.dataset.rack !== filters.rack) ||
        (filters.model && row.dataset.models.split(" ").indexOf(filters.model) < 0);
    }
    rack.hidden = !rack.querySelector(".node-row:not([hidden])");
  }

  for (const name of ["rack", "model", "tenant"]) {
    const select = document.getElementById("filter-" + name);
    if (!select) continue;
    select.addEventListener("change", function () {
      filters[name] = select.value;
      dirty.full = true;
      scheduleRender();
    });
  }

  function moveFocus(from, to) {
    if (!to) return;
    from.tabIndex = -1;
    to.tabIndex = 0;
    T.stop = [to.dataset.node, to.dataset.index];
    to.focus();
  }

  function onHeatmapKey(event) {
    const cell = event.target.closest(".cell");
    if (!cell) return;
    const row = cell.closest(".node-row");
    const inRow = Array.from(row.querySelectorAll(".cell"));
    const at = inRow.indexOf(cell);
    const rows = Array.from(document.querySelectorAll("#heatmap .node-row:not([hidden])"));
    const r = rows.indexOf(row);
    let to = null;
    if (event.key === "ArrowRight") to = inRow[at + 1];
    else if (event.key === "ArrowLeft") to = inRow[at - 1];
    else if (event.key === "Home") to = inRow[0];
    else if (event.key === "End") to = inRow[inRow.length - 1];
    else if (event.key === "ArrowDown" || event.key === "ArrowUp") {
      const next = rows[r + (event.key === "ArrowDown" ? 1 : -1)];
      if (next) { const cs = next.querySelectorAll(".cell"); to = cs[Math.min(at, cs.length - 1)]; }
    } else return;
    event.preventDefault();
    moveFocus(cell, to);
  }

  /* A click (or Enter, or a tap) on a GPU: its own job's page at once when it holds one job the
   * viewer may see; otherwise what is known of it, with a link to each job, beside the map. */
  function onHeatmapClick(event) {
    const cell = event.target.closest(".cell");
    if (!cell) return;
    const box = document.getElementById("heatmap");
    const current = box.querySelector(".cell[tabindex='0']");
    if (current && current !== cell) { current.tabIndex = -1; cell.tabIndex = 0; }
    T.stop = [cell.dataset.node, cell.dataset.index];
    const node = T.model.nodes[cell.dataset.node];
    const d = node && node.devices[Number(cell.dataset.index)];
    if (!d) return;
    if (d.jobs.length === 1) { window.location.assign(jobUrl(d.jobs[0].job_id)); return; }
    showCell(node, d);
  }

  function jobUrl(id) { return "/jobs/" + encodeURIComponent(id) + "/"; }

  function showCell(node, d) {
    const panel = document.getElementById("cell-detail");
    const look = describeCell(node, d);
    const items = d.jobs.map(function (j) {
      return el("li", {}, [el("a", { href: jobUrl(j.job_id), text: jobLabel(j.job_id) }), el("span", { text: " · " + pct(j.share) })]);
    });
    const parts = [el("h3", { text: node.name + " · GPU " + d.index + " · " + d.model }), el("p", { text: look.label })];
    if (items.length) parts.push(el("ul", { class: "jobs" }, items));
    else if (d.others > 0) parts.push(el("p", { class: "muted", text: "Used by another team's job: only its share is shown." }));
    panel.replaceChildren.apply(panel, parts);
    panel.hidden = false;
  }

  function jobItem(job, showState) {
    const meta = [job.kind, job.gpus + " GPU" + (job.gpus === 1 ? "" : "s")];
    if (model().viewer.operator) meta.push(job.tenant);
    if (job.priority) meta.push("priority " + job.priority);
    const place = queueOrder[job.id];
    const head = el("div", { class: "job-head" }, [
      el("span", { class: "job-id", text: "#" + job.id }),
      el("a", { class: "job-name", href: jobUrl(job.id), text: job.name }),
      showState ? el("span", { class: "chip chip-" + job.state, text: job.state }) : null,
      !showState && place ? el("span", { class: "chip", text: "place " + place + " of " + queueTotal }) : null,
    ]);
    const where = placementOf(job.id);
    if (where) meta.push("on " + where);
    if (terminal.has(job.state)) {
      if (job.exit_code !== null && job.exit_code !== undefined) meta.push("exit " + job.exit_code);
      if (job.finished_at) {
        // The time alone only for today: the last 20 may have ended days ago.
        const ended = new Date(job.finished_at);
        const today = ended.toDateString() === new Date().toDateString();
        meta.push("ended " + (today ? ended.toLocaleTimeString() : ended.toLocaleString()));
      }
    }
    const children = [head, el("div", { class: "job-meta muted", text: meta.join(" · ") })];
    if (job.state === "pending" && job.pending_reason) {
      // The scheduler's sentence mostly begins with its code already: say the code once.
      const code = job.pending_code ? job.pending_code + ": " : "";
      const said = code && job.pending_reason.indexOf(job.pending_code + ":") === 0;
      children.push(el("div", { class: "job-reason", text: (said ? "" : code) + job.pending_reason }));
    }
    return el("li", { class: "job", "data-job-id": String(job.id), "data-state": job.state }, children);
  }

  function model() { return T.model; }

  /* Where a job runs, from the cells it holds (kept by paintCell): "n01 [0-3], n02 [0]". */
  function placementOf(jobId) {
    const keys = jobCells.get(jobId);
    if (!keys || keys.size === 0) return "";
    const byNode = {};
    for (const key of keys) {
      const slash = key.lastIndexOf("/");
      (byNode[key.slice(0, slash)] = byNode[key.slice(0, slash)] || []).push(Number(key.slice(slash + 1)));
    }
    return Object.keys(byNode).sort().map(function (name) {
      return name + " [" + ranges(byNode[name].sort(function (a, b) { return a - b; })) + "]";
    }).join(", ");
  }

  function ranges(indexes) {
    const out = [];
    let start = indexes[0], prev = indexes[0];
    for (const i of indexes.slice(1).concat([null])) {
      if (i !== null && i === prev + 1) { prev = i; continue; }
      out.push(start === prev ? String(start) : start + "-" + prev);
      start = prev = i;
    }
    return out.join(",");
  }

  // ---- the queue's order: the scheduler's own, fetched after the queue changes ------------------

  let queueTotal = 0;
  let queueKey = "";

  function pendingKey() {
    return Object.keys(T.model.jobs).filter(function (id) { return T.model.jobs[id].state === "pending"; }).sort().join(",");
  }

  function refreshQueueOrder() {
    if (queueTimer !== null) return;
    queueTimer = window.setTimeout(async function () {
      queueTimer = null;
      try {
        const response = await fetch(root.dataset.queueUrl, { credentials: "same-origin", headers: { Accept: "application/json" } });
        if (!response.ok) return;
        const body = await response.json();
        queueOrder = {};
        for (const row of body.order) queueOrder[row.id] = row.position;
        queueTotal = body.total;
        T.queueFetches = (T.queueFetches || 0) + 1;
        dirty.queue = true;
        scheduleRender();
      } catch (e) { /* the next change asks again */ }
    }, 800);
  }

  function renderQueue() {
    const jobs = Object.keys(T.model.jobs).map(function (id) { return T.model.jobs[id]; });
    const key = pendingKey();
    if (key !== queueKey) { queueKey = key; if (key) refreshQueueOrder(); }
    const fallback = function (a, b) {
      return a.queue_level - b.queue_level || b.priority - a.priority || a.id - b.id;
    };
    // The scheduler's order where known; a job it has not ranked yet (just submitted) goes last.
    const order = function (a, b) {
      const pa = queueOrder[a.id], pb = queueOrder[b.id];
      if (pa && pb) return pa - pb;
      if (pa || pb) return pa ? -1 : 1;
      return fallback(a, b);
    };
    const pending = jobs.filter(function (j) { return j.state === "pending"; }).sort(order);
    const running = jobs.filter(function (j) { return j.state !== "pending"; }).sort(fallback);
    const queue = document.getElementById("queue");
    queue.replaceChildren(pending.length
      ? el("ol", { class: "jobs" }, pending.map(function (j) { return jobItem(j, false); }))
      : el("p", { class: "muted", text: "Nothing is waiting." }));
    const run = document.getElementById("running");
    run.replaceChildren(running.length
      ? el("ul", { class: "jobs" }, running.map(function (j) { return jobItem(j, true); }))
      : el("p", { class: "muted", text: "Nothing is running." }));
    const ended = document.getElementById("ended");
    ended.replaceChildren(T.model.ended.length
      ? el("ul", { class: "jobs" }, T.model.ended.map(function (j) { return jobItem(j, true); }))
      : el("p", { class: "muted", text: "Nothing has ended lately." }));
    document.getElementById("queue-count").textContent = pending.length + " pending" + (T.model.truncated ? " (list cut)" : "");
    document.getElementById("running-count").textContent = String(running.length);
  }

  function render() {
    if (!T.model) return;
    const started = performance.now();
    const full = dirty.full;
    renderHeatmap();
    if (full || dirty.queue || (dirty.placements && started - queueRenderedAt >= PLACEMENTS_EVERY_MS)) {
      dirty.queue = dirty.placements = false;
      queueRenderedAt = started;
      renderQueue();
    } else if (dirty.placements) scheduleRenderIn(PLACEMENTS_EVERY_MS - (started - queueRenderedAt));
    T.renders = (T.renders || 0) + 1;
    T.lastRenderMs = performance.now() - started;
    if (!T.firstPaintMs) {
      T.firstPaintMs = performance.now(); // since navigation started: the benchmark reads it
      T.firstRenderMs = T.lastRenderMs;
    }
    T.renderMsTotal = (T.renderMsTotal || 0) + T.lastRenderMs;
  }

  const heatmap = document.getElementById("heatmap");
  heatmap.addEventListener("keydown", onHeatmapKey);
  heatmap.addEventListener("click", onHeatmapClick);
  heatmap.addEventListener("focusin", onHeatmapFocus);
  // Fired on each rack as it starts or stops being skipped; caught on its way down to the rack.
  heatmap.addEventListener("contentvisibilityautostatechange", onRackVisibility, true);

  // The first snapshot is asked for with the page, while the socket joins: drawn as soon as it
  // comes (reconciled with the socket on its "ready", above).
  let early = fetchSnapshot().then(function (snapshot) { if (!T.model) install(snapshot); });
  early.catch(function () { /* fetched again on "ready" */ });
  connect();
})();
