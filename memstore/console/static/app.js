// The console's entry module: who the caller is, the tenant picker, and the hash router.
import { api, ApiError, el, notify, takeNotice } from "./lib.js";
import { factHistoryPage, userPage, usersPage } from "./memory.js";
import { lifecyclePage, queuePage } from "./operations.js";
import { agentDocsPage, documentPage, searchPage, sessionPage, sessionsPage } from "./more.js";

const routes = [
  [/^\/?$/, usersPage],
  [/^\/users$/, usersPage],
  [/^\/user\/([^/]+)$/, userPage],
  [/^\/fact\/([^/]+)\/([^/]+)$/, factHistoryPage],
  [/^\/search$/, searchPage],
  [/^\/queue$/, queuePage],
  [/^\/lifecycle$/, lifecyclePage],
  [/^\/sessions\/([^/]+)$/, sessionsPage],
  [/^\/session\/([^/]+)\/([^/]+)$/, sessionPage],
  [/^\/docs$/, agentDocsPage],
  [/^\/doc$/, documentPage],
];

/** What every page gets: the caller (``me``), the tenant in use, and the route's query. */
const context = { me: null, tenant: "", params: new URLSearchParams() };

function parseHash() {
  const raw = window.location.hash.replace(/^#/, "") || "/users";
  const [path, query = ""] = raw.split("?", 2);
  return { path, params: new URLSearchParams(query) };
}

let renders = 0;

async function render() {
  renders += 1;
  const generation = renders;
  const { path, params } = parseHash();
  const main = document.getElementById("main");
  context.params = params;
  context.tenant = params.get("tenant") || context.me.tenant_id;
  syncTenantPicker();
  markCurrentNav(path);
  const notice = takeNotice();
  notify("");
  const found = routes.find(([pattern]) => pattern.test(path));
  if (!found) {
    main.replaceChildren(el("h1", { tabindex: "-1" }, "Not found"), el("p", {}, "No console page has that address."));
    return;
  }
  const args = path.match(found[0]).slice(1).map(decodeURIComponent);
  let content;
  try {
    content = await found[1](context, ...args);
  } catch (error) {
    const message = error instanceof ApiError ? error.message : String(error);
    content = [el("h1", { tabindex: "-1" }, "Could not load this page"), el("p", { class: "error" }, message)];
  }
  if (generation !== renders) return; // the operator went on to another page meanwhile
  main.replaceChildren(...[content].flat());
  const title = main.querySelector("h1");
  if (title) {
    document.title = `${title.textContent} · memstore console`;
    // After a tenant change keep the keyboard on the picker: arrowing through its options fires
    // a change per step, and moving focus away would stop that walk at the first step.
    if (document.activeElement?.id !== "tenant") title.focus();
  }
  if (notice) notify(notice, "ok");
}

function markCurrentNav(path) {
  for (const anchor of document.querySelectorAll("#nav a")) {
    const target = anchor.getAttribute("href").slice(1);
    const current = path === target || (target === "/users" && (path === "/" || path.startsWith("/user")));
    if (current) anchor.setAttribute("aria-current", "page");
    else anchor.removeAttribute("aria-current");
  }
}

async function setUpTenantPicker() {
  const picker = document.getElementById("tenant");
  let tenants = [context.me.tenant_id];
  if (context.me.crosses_tenants) {
    const listed = await api("tenants");
    tenants = [...new Set([context.me.tenant_id, ...listed.tenants.map((row) => row.tenant_id)])];
  } else {
    picker.disabled = true;
  }
  picker.replaceChildren(...tenants.map((tenant) => el("option", { value: tenant }, tenant)));
  picker.addEventListener("change", () => {
    window.location.hash = `#/users?tenant=${encodeURIComponent(picker.value)}`;
  });
}

function syncTenantPicker() {
  const picker = document.getElementById("tenant");
  if (![...picker.options].some((option) => option.value === context.tenant)) {
    picker.append(el("option", { value: context.tenant }, context.tenant));
  }
  picker.value = context.tenant;
}

async function start() {
  const main = document.getElementById("main");
  try {
    context.me = await api("me");
  } catch (error) {
    const refused = error instanceof ApiError && (error.status === 401 || error.status === 403);
    main.replaceChildren(
      el("h1", { tabindex: "-1" }, refused ? "Access refused" : "The console is unavailable"),
      el("p", { class: "error" }, error.message),
      refused ? el("p", {}, "The console is for callers with the admin role.") : null,
    );
    document.getElementById("tenant").disabled = true;
    return;
  }
  document.getElementById("who").textContent = `${context.me.user_id} (${context.me.roles.join(", ")})`;
  await setUpTenantPicker().catch((error) => notify(error.message));
  window.addEventListener("hashchange", render);
  await render();
}

start();
