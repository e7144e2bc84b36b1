// Shared helpers of the console's pages. Stored text only ever becomes a Text node or an
// attribute value (textContent, setAttribute): nothing here parses a string as HTML.

const csrfMeta = document.querySelector('meta[name="memstore-csrf"]');
const CSRF_TOKEN = csrfMeta ? csrfMeta.getAttribute("content") : "";

export class ApiError extends Error {
  constructor(status, detail) {
    super(detail);
    this.status = status;
  }
}

function detailOf(data, status) {
  if (data && typeof data.detail === "string") return data.detail;
  if (data && Array.isArray(data.detail)) {
    return data.detail.map((item) => `${(item.loc || []).join(".")}: ${item.msg}`).join("; ");
  }
  return `request failed (HTTP ${status})`;
}

/** Calls /console/api/<path>; mutations carry the CSRF token. Throws ApiError on failure. */
export async function api(path, { method = "GET", body, params } = {}) {
  const url = new URL(`api/${path}`, document.baseURI);
  for (const [name, value] of Object.entries(params || {})) {
    if (value !== undefined && value !== null && value !== "") url.searchParams.set(name, String(value));
  }
  const init = { method, headers: { Accept: "application/json" }, credentials: "same-origin" };
  if (method !== "GET") {
    init.headers["Content-Type"] = "application/json";
    init.headers["X-CSRF-Token"] = CSRF_TOKEN;
    init.body = JSON.stringify(body || {});
  }
  const response = await fetch(url, init);
  const data = await response.json().catch(() => null);
  if (!response.ok) throw new ApiError(response.status, detailOf(data, response.status));
  return data;
}

/** An element: attributes by setAttribute (``on*`` functions become listeners), children as
 * nodes or text. */
export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith("on") && typeof value === "function") node.addEventListener(name.slice(2), value);
    else if (name === "value") node.value = value;
    else if (name === "checked") node.checked = Boolean(value);
    else node.setAttribute(name, value === true ? "" : String(value));
  }
  append(node, children);
  return node;
}

export function append(node, children) {
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

/** The text of a value, never markup: null/undefined show as an em dash. */
export function text(value) {
  if (value === undefined || value === null || value === "") return "—";
  if (typeof value === "object") return JSON.stringify(value);
  return String(value);
}

export function number(value, digits = 2) {
  return typeof value === "number" ? value.toFixed(digits) : "—";
}

export function when(iso) {
  if (!iso) return "—";
  const date = new Date(iso);
  return Number.isNaN(date.getTime()) ? String(iso) : date.toISOString().replace("T", " ").slice(0, 19) + " UTC";
}

export function seconds(value) {
  if (typeof value !== "number") return "—";
  if (value < 120) return `${value.toFixed(1)} s`;
  if (value < 7200) return `${(value / 60).toFixed(1)} min`;
  return `${(value / 3600).toFixed(1)} h`;
}

let fieldCount = 0;

/** A labelled control: ``<label for>`` + the control, wrapped in a .field div. */
export function field(label, control, hint) {
  fieldCount += 1;
  const id = control.id || `f${fieldCount}`;
  control.id = id;
  const parts = [el("label", { for: id }, label), control];
  if (hint) {
    const hintId = `${id}-hint`;
    control.setAttribute("aria-describedby", hintId);
    parts.push(el("span", { class: "hint", id: hintId }, hint));
  }
  return el("div", { class: "field" }, parts);
}

export function select(name, options, chosen) {
  return el(
    "select",
    { name },
    options.map(([value, label]) => el("option", { value, selected: value === (chosen ?? "") }, label)),
  );
}

/** A table in a scrolling wrapper; ``rows`` are arrays of cells (nodes or text). */
export function table(caption, headers, rows) {
  return el(
    "div",
    { class: "table-wrap", tabindex: "0", role: "region", "aria-label": caption },
    el(
      "table",
      {},
      el("caption", {}, caption),
      el("thead", {}, el("tr", {}, headers.map((name) => el("th", { scope: "col" }, name)))),
      el(
        "tbody",
        {},
        rows.length
          ? rows.map((cells) => el("tr", {}, cells.map((cell) => el("td", {}, cell))))
          : el("tr", {}, el("td", { colspan: String(headers.length), class: "muted" }, "Nothing here.")),
      ),
    ),
  );
}

/** "1–50 of 5,000" with Previous and Next buttons that call ``go(offset)``. */
export function pager(label, page, go) {
  const shown = page.rows ?? page.facts ?? page.users ?? page.sessions ?? page.scopes ?? [];
  const first = shown.length ? page.offset + 1 : 0;
  const last = page.offset + shown.length;
  const total = page.total === undefined ? "" : ` of ${page.total.toLocaleString("en")}`;
  const previous = Math.max(0, page.offset - (page.limit || shown.length || 50));
  return el(
    "nav",
    { class: "pager", "aria-label": `${label} pages` },
    el("button", { type: "button", disabled: page.offset === 0, onclick: () => go(previous) }, "Previous"),
    el("span", { "aria-live": "polite" }, `${first}–${last}${total}`),
    el(
      "button",
      { type: "button", disabled: page.next_offset === null || page.next_offset === undefined, onclick: () => go(page.next_offset) },
      "Next",
    ),
  );
}

/** A modal confirmation; resolves true only when the operator presses the confirm button. */
export function confirmDialog(title, lines, action = "Confirm") {
  return new Promise((resolve) => {
    const cancel = el("button", { type: "button" }, "Cancel");
    const ok = el("button", { type: "button", class: "danger" }, action);
    const dialog = el(
      "dialog",
      { class: "confirm", "aria-labelledby": "confirm-title" },
      el("h2", { id: "confirm-title" }, title),
      lines.map((line) => el("p", {}, line)),
      el("div", { class: "actions" }, cancel, ok),
    );
    const close = (answer) => {
      dialog.close();
      dialog.remove();
      resolve(answer);
    };
    cancel.addEventListener("click", () => close(false));
    ok.addEventListener("click", () => close(true));
    dialog.addEventListener("cancel", (event) => {
      event.preventDefault();
      close(false);
    });
    document.body.append(dialog);
    dialog.showModal();
    cancel.focus();
  });
}

let pendingNotice = "";

/** Renders the current page again, then shows ``message`` (after a mutation). */
export function reload(message) {
  pendingNotice = message || "";
  window.dispatchEvent(new HashChangeEvent("hashchange"));
}

/** The message ``reload`` left for the next render ("" when none). */
export function takeNotice() {
  const message = pendingNotice;
  pendingNotice = "";
  return message;
}

/** Shows a message in the status bar (role=alert); an empty message hides it. */
export function notify(message, kind = "error") {
  const bar = document.getElementById("status");
  bar.textContent = message || "";
  bar.className = `status ${kind}`;
  bar.hidden = !message;
}

/** Runs ``work``; an API error lands in the status bar instead of the console. */
export async function guarded(work) {
  try {
    return await work();
  } catch (error) {
    notify(error instanceof ApiError ? error.message : `Unexpected error: ${error}`);
    return undefined;
  }
}

/** The route's location hash for ``path`` and its query (empty values dropped). */
export function href(path, params = {}) {
  const query = new URLSearchParams();
  for (const [name, value] of Object.entries(params)) {
    if (value !== undefined && value !== null && value !== "") query.set(name, String(value));
  }
  const tail = query.toString();
  return `#${path}${tail ? `?${tail}` : ""}`;
}

export function link(label, path, params) {
  return el("a", { href: href(path, params) }, label);
}

/** A page heading that takes focus after navigation, so keyboard and screen reader users land on it. */
export function heading(title) {
  return el("h1", { tabindex: "-1" }, title);
}

/** Links inside pages carry the tenant: the picker's choice applies to every page. */
export function tenantParam(ctx) {
  return ctx.tenant === ctx.me.tenant_id ? {} : { tenant: ctx.tenant };
}
