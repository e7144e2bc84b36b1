// Search across users, a user's sessions, and the agents' own documents.
import { api, el, field, heading, href, link, number, pager, select, table, tenantParam, text, when } from "./lib.js";

const NO_AGENT = "_";

export async function searchPage(ctx) {
  const p = ctx.params;
  const q = p.get("q") || "";
  const mode = p.get("mode") || "fulltext";
  const user = p.get("user") || "";
  const match = p.get("match") || "";
  const own = tenantParam(ctx);
  const modes = [["fulltext", "Full text"]];
  if (ctx.me.semantic_search) modes.push(["semantic", "Semantic"], ["hybrid", "Hybrid"]);
  const form = el(
    "form",
    {
      class: "filters",
      role: "search",
      onsubmit: (event) => {
        event.preventDefault();
        const values = Object.fromEntries(new FormData(event.target).entries());
        window.location.hash = href("/search", { ...own, ...values });
      },
    },
    field("Search facts", el("input", { name: "q", type: "search", value: q, required: true, maxlength: "2000" })),
    field("Mode", select("mode", modes, mode), ctx.me.semantic_search ? null : "semantic search needs embedding_provider"),
    field("Words", select("match", [["", "Default"], ["any", "Any word"], ["all", "Every word"]], match)),
    field("User (optional)", el("input", { name: "user", value: user, maxlength: "128" })),
    el("button", { type: "submit" }, "Search"),
  );
  const page = el("section", {}, heading("Search across users"), form);
  if (!q) return page;
  const offset = Number(p.get("offset") || 0);
  const found = await api("search", { params: { tenant: ctx.tenant, q, mode, match, user, offset, limit: 20 } });
  page.append(
    el("p", { class: "muted" }, `${found.total} match(es) · served by ${found.search_mode}`),
    table(
      "Matching facts",
      ["User", "Agent", "Content", "Category", "Confidence", "Rank", "History"],
      found.facts.map((fact) => [
        fact.user_id ? link(fact.user_id, `/user/${encodeURIComponent(fact.user_id)}`, own) : "—",
        fact.agent_name || "—",
        el("span", { class: "content" }, fact.content),
        fact.category,
        number(fact.confidence),
        number(fact.rank, 4),
        fact.user_id
          ? link("History", `/fact/${encodeURIComponent(fact.user_id)}/${encodeURIComponent(fact.fact_id)}`, { ...own, agent: fact.agent_name || NO_AGENT })
          : "—",
      ]),
    ),
    pager("Search results", found, (next) => {
      window.location.hash = href("/search", { ...own, q, mode, match, user, offset: next });
    }),
  );
  return page;
}

export async function sessionsPage(ctx, userId) {
  const offset = Number(ctx.params.get("offset") || 0);
  const own = tenantParam(ctx);
  const listed = await api(`users/${encodeURIComponent(userId)}/sessions`, { params: { tenant: ctx.tenant, offset, limit: 50 } });
  return el(
    "section",
    {},
    heading(`Sessions of ${userId}`),
    el("p", { class: "meta" }, link(`Memory of ${userId}`, `/user/${encodeURIComponent(userId)}`, own), ` · backend ${ctx.me.session_backend}`),
    table(
      "Live sessions, most recently active first",
      ["Session", "Agent", "Raw turns", "Tokens", "Compressions", "Updated", "Expires"],
      listed.sessions.map((session) => [
        link(session.sessionId, `/session/${encodeURIComponent(userId)}/${encodeURIComponent(session.sessionId)}`, {
          ...own,
          agent: session.agentName || NO_AGENT,
        }),
        session.agentName || "—",
        String(session.turnCount),
        String(session.tokenCount),
        String(session.compressions),
        when(session.updatedAt),
        when(session.expiresAt),
      ]),
    ),
    pager("Sessions", { ...listed, limit: 50 }, (next) => {
      window.location.hash = href(`/sessions/${encodeURIComponent(userId)}`, { ...own, offset: next });
    }),
  );
}

export async function sessionPage(ctx, userId, sessionId) {
  const agent = ctx.params.get("agent") || NO_AGENT;
  const shown = await api(`users/${encodeURIComponent(userId)}/sessions/${encodeURIComponent(sessionId)}`, {
    params: { tenant: ctx.tenant, agent },
  });
  const own = tenantParam(ctx);
  return el(
    "section",
    {},
    heading(`Session ${sessionId}`),
    el(
      "p",
      { class: "meta" },
      link(`Sessions of ${userId}`, `/sessions/${encodeURIComponent(userId)}`, own),
      ` · agent ${shown.session.agentName || "none"} · ${shown.session.turnCount} raw turn(s) · ${shown.session.compressions} compression(s)`,
    ),
    el(
      "ol",
      { class: "turns" },
      shown.turns.map((turn) =>
        el(
          "li",
          { class: turn.summary ? "turn summary" : "turn" },
          el("span", { class: "badge" }, turn.summary ? "summary" : turn.role),
          " ",
          el("span", { class: "muted" }, when(turn.createdAt)),
          el("p", { class: "content" }, text(turn.content)),
        ),
      ),
    ),
  );
}

export async function agentDocsPage(ctx) {
  const user = ctx.params.get("user") || "";
  const offset = Number(ctx.params.get("offset") || 0);
  const own = tenantParam(ctx);
  const listed = await api("agent-docs", { params: { tenant: ctx.tenant, user, offset, limit: 50 } });
  return el(
    "section",
    {},
    heading(user ? `Agent documents of ${user}` : "Agent documents"),
    el("p", { class: "muted" }, `${listed.total} scope(s) with documents in tenant ${ctx.tenant}, most recently changed first.`),
    table(
      "Scopes with documents",
      ["Agent", "User", "Documents", "Characters", "Updated"],
      listed.scopes.map((scope) => [
        link(scope.agent_name || "(no agent)", "/doc", { ...own, agent: scope.agent_name || NO_AGENT, user: scope.user_id || "" }),
        scope.user_id || "(the agent's own)",
        String(scope.documents),
        String(scope.chars),
        when(scope.updatedAt),
      ]),
    ),
    pager("Document scopes", listed, (next) => {
      window.location.hash = href("/docs", { ...own, user, offset: next });
    }),
  );
}

export async function documentPage(ctx) {
  const p = ctx.params;
  const agent = p.get("agent") || NO_AGENT;
  const user = p.get("user") || "";
  const path = p.get("path");
  const own = tenantParam(ctx);
  const label = `${agent === NO_AGENT ? "(no agent)" : agent}${user ? ` for ${user}` : ""}`;
  const listed = await api("agent-docs/documents", { params: { tenant: ctx.tenant, agent, user } });
  const page = el(
    "section",
    {},
    heading(path ? `${path} · ${label}` : `Documents of ${label}`),
    table(
      "Documents",
      ["Path", "Version", "Characters", "Author", "Updated"],
      listed.documents.map((doc) => [
        link(doc.path, "/doc", { ...own, agent, user, path: doc.path }),
        String(doc.version),
        String(doc.chars),
        `${doc.author}${doc.actor ? ` (${doc.actor})` : ""}`,
        when(doc.updatedAt),
      ]),
    ),
  );
  if (!path) return page;
  const shown = await api("agent-docs/document", { params: { tenant: ctx.tenant, agent, user, path } });
  page.append(
    el("h2", {}, `${shown.document.path}, version ${shown.document.version}`),
    el("pre", { class: "block" }, shown.document.content || ""),
    el("h2", {}, "Versions"),
    ...shown.versions.map((version) =>
      el(
        "details",
        {},
        el("summary", {}, `Version ${version.version} · ${version.action} · ${version.author}${version.actor ? ` (${version.actor})` : ""} · ${when(version.createdAt)}`),
        el("pre", { class: "block" }, version.content ?? "(deleted)"),
      ),
    ),
  );
  return page;
}
