// Tenants and users, one user's memory (summaries, facts, the <memory> block), a fact's history.
import {
  api,
  confirmDialog,
  el,
  field,
  guarded,
  heading,
  href,
  link,
  number,
  pager,
  reload,
  select,
  table,
  tenantParam,
  text,
  when,
} from "./lib.js";

const MEMORY_TYPES = ["episodic", "semantic", "procedural", "preference", "profile"];
const VISIBILITIES = ["private", "shared", "public"];
const ORDERS = [
  ["newest", "Newest"],
  ["score", "Retention score"],
  ["last_accessed", "Last accessed"],
  ["access_count", "Access count"],
];
const NO_AGENT = "_";
const PAGE = 50;

function go(path, params) {
  window.location.hash = href(path, params);
}

function formValues(form) {
  return Object.fromEntries([...new FormData(form).entries()].map(([name, value]) => [name, String(value).trim()]));
}

export async function usersPage(ctx) {
  const q = ctx.params.get("q") || "";
  const order = ctx.params.get("order") || "id";
  const offset = Number(ctx.params.get("offset") || 0);
  const [tenants, page] = await Promise.all([
    api("tenants"),
    api("users", { params: { tenant: ctx.tenant, q, order, offset, limit: PAGE } }),
  ]);
  const own = tenantParam(ctx);
  const search = el(
    "form",
    {
      class: "filters",
      role: "search",
      onsubmit: (event) => {
        event.preventDefault();
        go("/users", { ...own, ...formValues(event.target) });
      },
    },
    field("User id contains", el("input", { name: "q", type: "search", value: q, maxlength: "128" })),
    field("Order", select("order", [["id", "User id"], ["recent", "Most recent activity"]], order)),
    el("button", { type: "submit" }, "Search"),
  );
  return el(
    "section",
    {},
    heading("Tenants and users"),
    table(
      "Tenants",
      ["Tenant", "Users", "Scopes", "Last activity"],
      tenants.tenants.map((row) => [
        link(row.tenant_id, "/users", { tenant: row.tenant_id }),
        row.users.toLocaleString("en"),
        row.scopes.toLocaleString("en"),
        when(row.last_activity),
      ]),
    ),
    el("h2", {}, `Users of tenant ${ctx.tenant}`),
    search,
    table(
      `Users of tenant ${ctx.tenant}`,
      ["User", "Agents", "Live facts", "Last activity"],
      page.users.map((user) => [
        link(user.user_id, `/user/${encodeURIComponent(user.user_id)}`, own),
        String(user.agents),
        user.facts.toLocaleString("en"),
        when(user.last_activity),
      ]),
    ),
    pager("Users", page, (next) => go("/users", { ...own, q, order, offset: next })),
  );
}

function factFilters(ctx, userId, memory) {
  const p = ctx.params;
  const agents = [["", "Every agent"], [NO_AGENT, "No agent"], ...memory.agents.filter(Boolean).map((name) => [name, name])];
  return el(
    "form",
    {
      class: "filters",
      "aria-label": "Fact filters",
      onsubmit: (event) => {
        event.preventDefault();
        go(`/user/${encodeURIComponent(userId)}`, { ...tenantParam(ctx), ...formValues(event.target) });
      },
    },
    field("Agent", select("agent", agents, p.get("agent") || "")),
    field("Category", el("input", { name: "category", value: p.get("category") || "", maxlength: "64" })),
    field("Type", select("memory_type", [["", "Any"], ...MEMORY_TYPES.map((t) => [t, t])], p.get("memory_type") || "")),
    field("Visibility", select("visibility", [["", "Any"], ...VISIBILITIES.map((v) => [v, v])], p.get("visibility") || "")),
    field("Min confidence", el("input", { name: "min_confidence", type: "number", min: "0", max: "1", step: "0.05", value: p.get("min_confidence") || "" })),
    field("Min importance", el("input", { name: "min_importance", type: "number", min: "0", max: "1", step: "0.05", value: p.get("min_importance") || "" })),
    field("Tag", el("input", { name: "tag", value: p.get("tag") || "", maxlength: "64" })),
    field("Text contains", el("input", { name: "text", type: "search", value: p.get("text") || "" })),
    field("Order", select("order", ORDERS, p.get("order") || "newest")),
    el("button", { type: "submit" }, "Apply filters"),
  );
}

/** The categories a manual edit may choose, plus the fact's own (an extracted fact may carry another). */
function categoryOptions(ctx, current) {
  const names = ctx.me.categories.includes(current) ? ctx.me.categories : [current, ...ctx.me.categories];
  return names.map((name) => [name, name]);
}

function editDialog(ctx, userId, fact) {
  const form = el(
    "form",
    { class: "edit" },
    el("h2", { id: "edit-title" }, `Edit fact ${fact.fact_id}`),
    field("Content", el("textarea", { name: "content", rows: "4", required: true }, fact.content)),
    field("Category", select("category", categoryOptions(ctx, fact.category), fact.category)),
    field("Type", select("memory_type", MEMORY_TYPES.map((t) => [t, t]), fact.memory_type)),
    field("Visibility", select("visibility", VISIBILITIES.map((v) => [v, v]), fact.visibility)),
    field("Confidence", el("input", { name: "confidence", type: "number", min: "0", max: "1", step: "0.01", value: String(fact.confidence) })),
    field("Importance", el("input", { name: "importance", type: "number", min: "0", max: "1", step: "0.01", value: String(fact.importance) })),
    field("Tags", el("input", { name: "tags", value: fact.tags.join(", ") }), "comma-separated"),
  );
  const cancel = el("button", { type: "button" }, "Cancel");
  const save = el("button", { type: "submit", class: "primary" }, "Save");
  form.append(el("div", { class: "actions" }, cancel, save));
  const dialog = el("dialog", { class: "confirm", "aria-labelledby": "edit-title" }, form);
  const close = () => {
    dialog.close();
    dialog.remove();
  };
  cancel.addEventListener("click", close);
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const values = formValues(form);
    const edit = {};
    if (values.content !== fact.content) edit.content = values.content;
    if (values.category !== fact.category) edit.category = values.category;
    if (values.memory_type !== fact.memory_type) edit.memory_type = values.memory_type;
    if (values.visibility !== fact.visibility) edit.visibility = values.visibility;
    if (Number(values.confidence) !== fact.confidence) edit.confidence = Number(values.confidence);
    if (Number(values.importance) !== fact.importance) edit.importance = Number(values.importance);
    const tags = values.tags ? values.tags.split(",").map((tag) => tag.trim()).filter(Boolean) : [];
    if (tags.join(",") !== fact.tags.join(",")) edit.tags = tags;
    if (!Object.keys(edit).length) {
      close();
      return;
    }
    edit.version = fact.version; // a fact changed since this page was read is refused (409), not overwritten
    const changed = Object.keys(edit).filter((name) => name !== "version");
    const ok = await confirmDialog("Save this change?", [`Fact ${fact.fact_id} of ${fact.user_id}: ${changed.join(", ")}.`], "Save");
    if (!ok) return;
    const saved = await guarded(() =>
      api(`users/${encodeURIComponent(fact.user_id)}/facts/${encodeURIComponent(fact.fact_id)}`, {
        method: "PATCH",
        params: { tenant: ctx.tenant, agent: fact.agent_name || NO_AGENT },
        body: edit,
      }),
    );
    if (saved) {
      close();
      reload(`Fact ${fact.fact_id} saved.`);
    }
  });
  dialog.addEventListener("close", () => dialog.remove());
  document.body.append(dialog);
  dialog.showModal();
  form.querySelector("textarea").focus();
}

async function deleteFact(ctx, fact) {
  const ok = await confirmDialog("Delete this fact?", [`Fact ${fact.fact_id} of ${fact.user_id}:`, fact.content, "Its history is kept."], "Delete");
  if (!ok) return;
  const done = await guarded(() =>
    api(`users/${encodeURIComponent(fact.user_id)}/facts/${encodeURIComponent(fact.fact_id)}`, {
      method: "DELETE",
      params: { tenant: ctx.tenant, agent: fact.agent_name || NO_AGENT, version: fact.version },
    }),
  );
  if (done) reload(`Fact ${fact.fact_id} deleted.`);
}

function factRows(ctx, userId, facts) {
  return facts.map((fact) => {
    const owner = fact.user_id === userId ? null : el("span", { class: "badge" }, `shared by ${fact.user_id}`);
    const history = link("History", `/fact/${encodeURIComponent(fact.user_id)}/${encodeURIComponent(fact.fact_id)}`, {
      ...tenantParam(ctx),
      agent: fact.agent_name || NO_AGENT,
    });
    history.setAttribute("aria-label", `History of fact ${fact.fact_id}`);
    const actions = el("div", { class: "row-actions" }, history);
    if (fact.user_id === userId) {
      actions.append(
        el("button", { type: "button", "aria-label": `Edit fact ${fact.fact_id}`, onclick: () => editDialog(ctx, userId, fact) }, "Edit"),
        el("button", { type: "button", class: "danger", "aria-label": `Delete fact ${fact.fact_id}`, onclick: () => deleteFact(ctx, fact) }, "Delete"),
      );
    }
    return [
      el("span", { class: "content", "data-fact": fact.fact_id }, fact.content, owner),
      fact.category,
      fact.memory_type,
      fact.visibility,
      number(fact.confidence),
      number(fact.importance),
      fact.tags.join(", ") || "—",
      fact.agent_name || "—",
      when(fact.created_at),
      actions,
    ];
  });
}

function contextPanel(ctx, userId, agent) {
  const output = el("pre", { class: "block", "aria-live": "polite" }, "Press Show to render it.");
  const note = el("p", { class: "muted" });
  const form = el(
    "form",
    {
      class: "filters",
      "aria-label": "Memory block preview",
      onsubmit: async (event) => {
        event.preventDefault();
        const { query } = formValues(form);
        const preview = await guarded(() =>
          api(`users/${encodeURIComponent(userId)}/context`, { params: { tenant: ctx.tenant, agent, query } }),
        );
        if (!preview) return;
        output.textContent = preview.block || "(empty: nothing would be injected)";
        note.textContent = `${preview.fact_ids.length} own fact(s), ranked by ${preview.ranked_by}. Previewing counts as no access.`;
      },
    },
    field("Query (the user's next message)", el("input", { name: "query", type: "search", maxlength: "2000" })),
    el("button", { type: "submit" }, "Show"),
  );
  return el("section", { "aria-labelledby": "block-title" }, el("h2", { id: "block-title" }, "The <memory> block of the next prompt"), form, note, output);
}

export async function userPage(ctx, userId) {
  const p = ctx.params;
  const agent = p.get("agent") || "";
  const filters = ["category", "memory_type", "visibility", "min_confidence", "min_importance", "tag", "text", "order"];
  const params = { tenant: ctx.tenant, agent, offset: p.get("offset") || 0, limit: PAGE };
  for (const name of filters) params[name] = p.get(name) || "";
  const base = `users/${encodeURIComponent(userId)}`;
  const [memory, page] = await Promise.all([
    api(`${base}/memory`, { params: { tenant: ctx.tenant, agent: agent || NO_AGENT } }),
    api(`${base}/facts`, { params }),
  ]);
  const own = tenantParam(ctx);
  const summaries = memory.sections.filter((section) => section.summary);
  return el(
    "section",
    {},
    heading(`Memory of ${userId}`),
    el(
      "p",
      { class: "meta" },
      `Tenant ${memory.tenant_id} · scope ${memory.agent || "without agent"}: ${memory.facts} live facts · revision ${text(memory.revision)} · last updated ${when(memory.lastUpdated)} · `,
      link("Sessions", `/sessions/${encodeURIComponent(userId)}`, own),
      " · ",
      link("Agent documents", "/docs", { ...own, user: userId }),
      " · ",
      link("Search", "/search", { ...own, user: userId }),
    ),
    el("h2", {}, "Summaries"),
    summaries.length
      ? el("dl", { class: "summaries" }, summaries.map((section) => [el("dt", {}, `${section.name} (${when(section.updatedAt)})`), el("dd", {}, section.summary)]))
      : el("p", { class: "muted" }, "No summaries in this scope."),
    el("h2", {}, "Facts"),
    factFilters(ctx, userId, memory),
    table(
      `Facts of ${userId}`,
      ["Content", "Category", "Type", "Visibility", "Confidence", "Importance", "Tags", "Agent", "Created", "Actions"],
      factRows(ctx, userId, page.facts),
    ),
    pager("Facts", page, (next) => go(`/user/${encodeURIComponent(userId)}`, { ...own, ...Object.fromEntries(p.entries()), offset: next })),
    contextPanel(ctx, userId, agent || NO_AGENT),
  );
}

function diffView(runs) {
  return el(
    "p",
    { class: "diff" },
    runs.map(([op, words]) => (op === "=" ? words : el(op === "-" ? "del" : "ins", {}, words))),
  );
}

function changeRows(changes) {
  return changes.map((change) => [change.field, text(change.before), change.diff ? diffView(change.diff) : text(change.after)]);
}

export async function factHistoryPage(ctx, userId, factId) {
  const agent = ctx.params.get("agent") || NO_AGENT;
  const history = await api(`users/${encodeURIComponent(userId)}/facts/${encodeURIComponent(factId)}/history`, {
    params: { tenant: ctx.tenant, agent },
  });
  const versions = [...history.versions].reverse();
  return el(
    "section",
    {},
    heading(`History of fact ${factId}`),
    el(
      "p",
      { class: "meta" },
      "Owner ",
      link(userId, `/user/${encodeURIComponent(userId)}`, tenantParam(ctx)),
      ` · ${history.current ? "live, version " + history.current.version : "not live (deleted)"} · ${history.versions.length} change(s), newest first`,
    ),
    history.current ? el("blockquote", { class: "content" }, history.current.content) : null,
    versions.map((version) =>
      el(
        "article",
        { class: "version" },
        el("h2", {}, `${version.action} · version ${text(version.version)} · revision ${version.revision}`),
        el(
          "dl",
          { class: "facts" },
          el("dt", {}, "When"),
          el("dd", {}, when(version.changed_at)),
          el("dt", {}, "Who"),
          el("dd", {}, el("span", { class: `badge ${version.who.kind}` }, version.who.kind), " ", version.who.label),
          el("dt", {}, "Why"),
          el("dd", {}, version.why || "—"),
        ),
        table(`Changes in revision ${version.revision}`, ["Field", "Before", "After"], changeRows(version.changes)),
      ),
    ),
  );
}
