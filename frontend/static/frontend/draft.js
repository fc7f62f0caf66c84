/* The submit form's draft, kept in this tab (sessionStorage) until the job is submitted.
 *
 * A person whose session ends while they type (it expired, or they signed out in another tab)
 * is sent to the sign-in page when they press Submit, and comes back to an empty form: what they
 * typed was posted to a server that no longer knew them. So the form's text fields are kept as
 * they are typed, and put back when the form is next shown empty in this tab, with a note and a
 * way to clear them. The draft is dropped once a job page says the form's job was submitted, and
 * when the person signs out here; it is kept per person. Nothing leaves the browser; a file chosen
 * for upload is not kept.
 */
(function () {
  "use strict";

  // One draft per person: someone else signing in at this tab later does not see it.
  const who = document.querySelector(".who .user");
  if (!who) return;
  const KEY = "tessera.submit-draft." + who.textContent.trim();
  const SKIP = { csrfmiddlewaretoken: true, submit_key: true, upload: true };

  function store() { try { return window.sessionStorage; } catch (e) { return null; } }
  const storage = store();
  if (!storage) return;

  function drop() { storage.removeItem(KEY); }

  // Signed out here: the next person at this tab must not find the draft.
  document.querySelectorAll("form[data-sign-out]").forEach(function (f) { f.addEventListener("submit", drop); });
  // The job was submitted (the job page's message): nothing left to keep.
  if (document.querySelector("[data-job-submitted]")) drop();

  const form = document.getElementById("job-form");
  if (!form) return;

  function fields() {
    return Array.prototype.filter.call(form.elements, function (el) {
      return el.name && !SKIP[el.name] && /^(INPUT|TEXTAREA|SELECT)$/.test(el.tagName) && el.type !== "file";
    });
  }

  function save() {
    const values = {};
    let any = false;
    fields().forEach(function (el) { values[el.name] = el.value; any = any || el.value !== ""; });
    if (!any) { drop(); return; }
    try { storage.setItem(KEY, JSON.stringify(values)); } catch (e) { drop(); } // past the tab's quota: none kept
  }

  // Put the draft back only into a form shown empty (not a copy, a preset, or the server's answer
  // with what was posted), so that nothing the server filled in is overwritten.
  let draft = null;
  try { draft = JSON.parse(storage.getItem(KEY) || "null"); } catch (e) { draft = null; }
  const blank = form.dataset.blank === "true" && fields().every(function (el) { return el.value === "" || el.tagName === "SELECT"; });
  if (draft && typeof draft === "object" && blank) {
    let restored = 0;
    fields().forEach(function (el) {
      const value = draft[el.name];
      if (typeof value === "string" && value !== el.value) { el.value = value; restored += 1; }
    });
    const note = document.getElementById("draft-note");
    if (restored && note) {
      note.hidden = false;
      document.getElementById("draft-clear").addEventListener("click", function () {
        drop();
        fields().forEach(function (el) { el.value = el.tagName === "SELECT" ? el.options[0].value : ""; });
        note.hidden = true;
        form.elements[0].focus();
      });
    }
  }
  form.addEventListener("input", save);
  form.addEventListener("change", save);
  form.addEventListener("submit", save);
})();
