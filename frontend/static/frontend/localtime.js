/* Tessera portal: times in the viewer's own time zone (no build step).
 *
 * The server writes every time as <time datetime="ISO 8601">, its text in UTC. This script
 * rewrites each one's text in the browser's time zone, in the same shape (date and time, with or
 * without seconds, or the time alone: with its date too when that is not today), and puts the
 * full local time and the zone's name in its title; so a start estimate, a submit time and the dashboard's "ended at" all read in one zone.
 * Fragments swapped in later (a job's status, the list's rows) are caught by a MutationObserver.
 */
(function () {
  "use strict";

  const SHAPES = [
    [/^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d$/, true, true],
    [/^\d{4}-\d\d-\d\d \d\d:\d\d$/, true, false],
    [/^\d\d:\d\d:\d\d$/, false, true],
    [/^\d\d:\d\d$/, false, false],
  ];
  const parts = new Intl.DateTimeFormat("en-US", {
    year: "numeric", month: "2-digit", day: "2-digit", hour: "2-digit", minute: "2-digit",
    second: "2-digit", hourCycle: "h23", timeZoneName: "short",
  });

  function local(el) {
    if (el.dataset.local === el.dateTime) return; // done already (and unchanged)
    const at = new Date(el.dateTime);
    const text = el.textContent.trim();
    const shape = SHAPES.find(function (s) { return s[0].test(text); });
    if (isNaN(at.getTime()) || !shape) return;
    const p = {};
    for (const part of parts.formatToParts(at)) p[part.type] = part.value;
    const date = p.year + "-" + p.month + "-" + p.day;
    const time = p.hour + ":" + p.minute + (shape[2] ? ":" + p.second : "");
    el.dataset.local = el.dateTime;
    // A time alone (the list's "starts ~14:00") is only clear for today: another day is named.
    el.textContent = shape[1] || date !== today() ? date + " " + time : time;
    el.title = date + " " + p.hour + ":" + p.minute + ":" + p.second + " " + p.timeZoneName;
  }

  function today() {
    const p = {};
    for (const part of parts.formatToParts(new Date())) p[part.type] = part.value;
    return p.year + "-" + p.month + "-" + p.day;
  }

  function localAll(root) {
    if (root.nodeType !== 1) return;
    if (root.tagName === "TIME") local(root);
    for (const el of root.querySelectorAll("time[datetime]")) local(el);
  }

  localAll(document.body);
  // Only where server fragments are swapped in (a job's page, the list): the dashboard builds its
  // own nodes by the thousand and has no <time>, so it is not watched.
  if (document.querySelector("[data-fragment-url]")) {
    new MutationObserver(function (changes) {
      for (const change of changes) for (const node of change.addedNodes) localAll(node);
    }).observe(document.body, { childList: true, subtree: true });
  }
  window.TESSERA_LOCALTIME = { zone: Intl.DateTimeFormat().resolvedOptions().timeZone };
})();
