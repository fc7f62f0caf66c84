/* Tessera portal pages: the jobs list and a job's page follow changes live (no build step).
 *
 * Both listen on the dashboard's websocket (/ws/dashboard/: the viewer's own tenant's
 * job.update messages only) and, when a job they show changes, fetch their server-rendered
 * fragment again and swap it in: the server escapes everything, the page never builds HTML from
 * data. After each "ready" (the socket has joined: from then on no change is missed) they fetch
 * it again, since the page or the last fragment may predate the join: a drop loses nothing.
 * A job's page also tails its output through the API's logs endpoint (session auth), from the
 * byte offset it has read so far, until the job has ended and the log is complete.
 */
(function () {
  "use strict";

  const P = (window.TESSERA_PORTAL = { loadedAt: Date.now(), refreshes: 0, connected: false });

  function setLive(on, text) {
    P.connected = on;
    const badge = document.getElementById("live");
    if (!badge) return;
    badge.textContent = text;
    badge.className = "live " + (on ? "live-on" : "live-off");
  }

  /* Open the socket; call onReady after each (re)connect, onJob for each job.update. */
  function listen(onReady, onJob) {
    let retryMs = 500;
    function connect() {
      const scheme = window.location.protocol === "https:" ? "wss://" : "ws://";
      const socket = P.socket = new WebSocket(scheme + window.location.host + "/ws/dashboard/");
      socket.onmessage = function (event) {
        let msg;
        try { msg = JSON.parse(event.data); } catch (e) { return; }
        if (msg.type === "ready") { retryMs = 500; setLive(true, "live"); onReady(); }
        else if (msg.type === "job.update" && msg.job) onJob(msg.job);
      };
      socket.onclose = function (event) {
        // 4401: the session was signed out (in another tab): the server closed its sockets.
        if (event.code === 4401) { toSignIn(); return; }
        setLive(false, "reconnecting…");
        window.setTimeout(connect, retryMs);
        retryMs = Math.min(retryMs * 2, 15000);
      };
    }
    connect();
  }

  /* The session has ended (signed out in another tab, or expired): a fragment's fetch was sent
   * to the sign-in page, or the API refused. Go there, to come back to this page after signing
   * in, rather than paste the sign-in page into the box (as the dashboard does on a 401). */
  function signedOut(response) {
    const toLogin = response.redirected && new URL(response.url).pathname === "/login/";
    if (!toLogin && response.status !== 401) return false;
    toSignIn();
    return true;
  }

  function toSignIn() {
    window.location.assign("/login/?next=" + encodeURIComponent(window.location.pathname + window.location.search));
  }

  /* Fetch url's HTML into box, at most once per `gap` ms (changes in a burst cost one fetch). */
  function refresher(box, url, gap, after) {
    let timer = null, running = false, again = false;
    async function run() {
      timer = null;
      if (running) { again = true; return; }
      running = true;
      try {
        const response = await fetch(url(), { credentials: "same-origin", headers: { Accept: "text/html" } });
        if (signedOut(response)) return;
        if (response.status === 404) { box.textContent = "This job is no longer visible."; return; }
        if (response.ok) {
          const focused = document.activeElement && box.contains(document.activeElement) ? document.activeElement.id : null;
          box.innerHTML = await response.text(); // server-rendered and escaped by Django's templates
          P.refreshes += 1;
          if (focused && document.getElementById(focused)) document.getElementById(focused).focus();
          if (after) after();
        }
      } finally {
        running = false;
        if (again) { again = false; schedule(); }
      }
    }
    function schedule() { if (timer === null) timer = window.setTimeout(run, gap); }
    return schedule;
  }

  // ---- the jobs list ----------------------------------------------------------------------------

  const list = document.querySelector("[data-live-list]");
  if (list) {
    const refresh = refresher(list, function () { return list.dataset.fragmentUrl; }, 300, keepChecks);
    let checked = new Set();
    list.addEventListener("change", function (e) {
      if (e.target.name === "job") { if (e.target.checked) checked.add(e.target.value); else checked.delete(e.target.value); }
    });
    function keepChecks() {
      for (const box of list.querySelectorAll("input[name=job]")) box.checked = checked.has(box.value);
    }
    // The page was rendered before the socket joined its groups: fetch once more after "ready".
    listen(refresh, function () { refresh(); });
  }

  // ---- one job ----------------------------------------------------------------------------------

  const page = document.getElementById("job-page");
  if (page) {
    const jobId = Number(page.dataset.jobId);
    const status = document.getElementById("job-status");
    const refresh = refresher(status, function () { return page.dataset.fragmentUrl; }, 150, function () {
      if (logs) logs.wake();
    });
    listen(refresh, function (job) { if (job.id === jobId) refresh(); });
    const logs = tailLogs(page);
    P.logs = logs;
  }

  function currentState() {
    const chip = document.getElementById("job-state");
    return chip ? chip.textContent.trim() : "";
  }

  /* Output as a terminal shows it, as text (never HTML): colour and other escape sequences
   * (CSI, OSC; "Download" keeps them) are left out, and a carriage return not followed by a
   * newline starts its line again, so a progress bar redrawn a thousand times is one line, not a
   * thousand glued together. An escape cut between two reads is held until the next. */
  const ESCAPES = /\x1b(?:\[[0-?]*[ -\/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[@-Z\\-_])/g;
  const PARTIAL = /\x1b(?:\[[0-?]*[ -\/]*|\][^\x07\x1b]*\x1b?)?$/;
  function terminal(box) {
    let held = "", line = document.createTextNode(""), pendingCR = false;
    box.appendChild(line);
    return {
      write: function (data) {
        let text = held + data;
        const cut = text.match(PARTIAL);
        held = cut && cut[0].length <= 256 ? cut[0] : ""; // an escape never ended is shown as text
        if (held) text = text.slice(0, text.length - held.length);
        text = text.replace(ESCAPES, "");
        let done = "";
        for (let i = 0; i < text.length; i++) {
          const c = text[i];
          if (pendingCR && c !== "\n") { done = ""; line.data = ""; } // the line is drawn again
          pendingCR = false;
          if (c === "\r") { pendingCR = true; continue; }
          done += c;
          if (c === "\n") { // a finished line: keep it, and start the next one
            line.data += done; done = "";
            line = box.appendChild(document.createTextNode(""));
          }
        }
        line.data += done;
      },
    };
  }

  function tailLogs(page) {
    const out = document.getElementById("log");
    const note = document.getElementById("log-state");
    const follow = document.getElementById("log-follow");
    const replicaBox = document.getElementById("log-replica");
    const download = document.getElementById("log-download");
    let offset = 0, replica = 0, timer = null, busy = false, started = false, screen = null;
    // Bumped when another replica is chosen: a read begun for the one before is then dropped.
    let generation = 0;

    async function poll() {
      timer = null;
      if (busy) return;
      busy = true;
      const gen = generation;
      let eof = false, wait = 1000;
      try {
        for (;;) { // read on at once while pages come full: more may be waiting
          const url = page.dataset.logUrl + "?offset=" + offset + "&replica=" + replica;
          const response = await fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } });
          if (gen !== generation) break; // another replica was chosen meanwhile
          if (signedOut(response)) return;
          if (!response.ok) { note.textContent = "Output unavailable (" + response.status + ")."; wait = 5000; break; }
          const chunk = await response.json();
          if (gen !== generation) break;
          if (!started && (chunk.data || chunk.eof)) { out.textContent = ""; screen = terminal(out); started = true; }
          if (chunk.data) {
            screen.write(chunk.data);
            if (follow.checked) out.scrollTop = out.scrollHeight;
          }
          offset = chunk.next_offset;
          eof = chunk.eof;
          note.textContent = (eof ? "Complete: the job has ended." : "Following…") +
            (chunk.truncated ? " Output was cut at the per-job cap." : "");
          if (eof && !out.textContent) out.textContent = "(no output)";
          if (eof || !chunk.data) break;
        }
      } catch (e) {
        if (gen === generation) { note.textContent = "Output: connection lost, retrying…"; wait = 3000; }
      } finally {
        busy = false;
      }
      if (gen !== generation) { poll(); return; } // read the chosen replica from its start
      P.logPolls = (P.logPolls || 0) + 1;
      if (!eof && follow.checked && timer === null) timer = window.setTimeout(poll, currentState() === "pending" ? 2 * wait : wait);
    }
    function wake() { if (timer !== null) window.clearTimeout(timer); timer = null; poll(); }
    follow.addEventListener("change", function () { if (follow.checked) wake(); });
    if (replicaBox) replicaBox.addEventListener("change", function () {
      replica = Number(replicaBox.value);
      generation += 1;
      offset = 0; started = false;
      out.textContent = "";
      download.href = download.href.replace(/replica=\d+/, "replica=" + replica);
      wake();
    });
    poll();
    return { wake: wake };
  }
})();
