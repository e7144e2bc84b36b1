// The queue (status, rows, charts, retry and purge) and the lifecycle (dry run, apply).
import { barChart, lineChart } from "./chart.js";
import {
  api,
  confirmDialog,
  el,
  field,
  guarded,
  heading,
  href,
  link,
  notify,
  number,
  pager,
  reload,
  select,
  table,
  tenantParam,
  text,
  when,
  seconds,
} from "./lib.js";

const STATES = [
  ["dead", "Dead"],
  ["pending", "Pending"],
  ["leased", "Leased"],
];
const ALL_TENANTS = "*";

function card(label, value) {
  return el("div", { class: "card" }, el("span", { class: "card-label" }, label), el("strong", {}, value));
}

async function deadAction(kind, ids) {
  const chosen = ids === null ? { all: true } : { ids };
  const what = ids === null ? "every dead conversation" : `${ids.length} dead conversation(s)`;
  let lines = [];
  if (kind === "purge") {
    const preview = await guarded(() => api("queue/purge-preview", { params: { ids: ids === null ? "" : ids.join(",") } }));
    if (!preview) return;
    lines = preview.conversations.map((row) => `${row.rows} conversation(s) of user ${row.user_id || "(none)"}`);
    lines.push("Their turns are given up for good: memory will not learn from them.");
  } else {
    lines = ["They are queued again, due now, with a full set of tries."];
  }
  const verb = kind === "purge" ? "Purge" : "Retry";
  if (!(await confirmDialog(`${verb} ${what}?`, lines, verb))) return;
  const done = await guarded(() => api(`queue/${kind}`, { method: "POST", body: chosen }));
  if (done) reload(kind === "purge" ? `Purged ${done.purged} conversation(s).` : `Queued ${done.retried} conversation(s) again.`);
}

export async function queuePage(ctx) {
  const state = ctx.params.get("state") || "dead";
  const offset = Number(ctx.params.get("offset") || 0);
  const queue = await api("queue", { params: { state, offset, limit: 50 } });
  const status = queue.status;
  const own = tenantParam(ctx);
  const tabs = el(
    "nav",
    { class: "tabs", "aria-label": "Queue states" },
    STATES.map(([value, label]) => {
      const tab = el("a", { href: href("/queue", { ...own, state: value }) }, label);
      if (value === state) tab.setAttribute("aria-current", "page");
      return tab;
    }),
  );
  const boxes = [];
  const rows = queue.page.rows.map((row) => {
    const cells = [];
    if (state === "dead") {
      const box = el("input", { type: "checkbox", value: String(row.id), "aria-label": `Select conversation ${row.id}` });
      boxes.push(box);
      cells.push(box);
    }
    cells.push(
      String(row.id),
      row.tenant_id,
      row.user_id ? link(row.user_id, `/user/${encodeURIComponent(row.user_id)}`, { tenant: row.tenant_id }) : "—",
      row.agent_name || "—",
      row.kind,
      String(row.attempts),
      when(row.pending_since),
      state === "leased" ? `${text(row.lease_owner)} until ${when(row.lease_expires_at)}` : when(state === "dead" ? row.updated_at : row.due_at),
      el("span", { class: "error-text" }, row.last_error || "—"),
    );
    return cells;
  });
  const headers = ["Id", "Tenant", "User", "Agent", "Kind", "Attempts", "Waiting since", state === "leased" ? "Lease" : state === "dead" ? "Died" : "Due", "Last error"];
  const selected = () => boxes.filter((box) => box.checked).map((box) => Number(box.value));
  const needSelection = (kind) => () => {
    const ids = selected();
    if (!ids.length) notify("Select at least one dead conversation first.");
    else deadAction(kind, ids);
  };
  const deadButtons =
    state === "dead"
      ? el(
          "div",
          { class: "actions" },
          el("button", { type: "button", onclick: needSelection("retry") }, "Retry selected"),
          el("button", { type: "button", class: "danger", onclick: needSelection("purge") }, "Purge selected"),
          el("button", { type: "button", disabled: !status.dead, onclick: () => deadAction("retry", null) }, "Retry all dead"),
          el("button", { type: "button", class: "danger", disabled: !status.dead, onclick: () => deadAction("purge", null) }, "Purge all dead"),
        )
      : null;
  const series = queue.series;
  return el(
    "section",
    {},
    heading("Queue"),
    el(
      "div",
      { class: "cards" },
      card("Pending", String(status.pending)),
      card("Due now", String(status.due)),
      card("Leased", String(status.leased)),
      card("Dead", String(status.dead)),
      card("Lag (oldest waiting)", seconds(status.oldest_pending_seconds)),
      card("Throughput", `${number(status.throughput_per_minute)} / min`),
    ),
    el(
      "div",
      { class: "charts" },
      el("figure", {}, barChart("Conversations completed per minute, last hour", series.map((m) => m.completed)), el("figcaption", {}, "Throughput: conversations completed per minute")),
      el("figure", {}, lineChart("Mean lag per minute in seconds, last hour", series.map((m) => m.mean_lag_seconds), " s"), el("figcaption", {}, "Lag: seconds from a turn's arrival to its completion")),
    ),
    tabs,
    deadButtons,
    table(`${state} conversations`, state === "dead" ? ["Select", ...headers] : headers, rows),
    pager("Queue rows", queue.page, (next) => {
      window.location.hash = href("/queue", { ...own, state, offset: next });
    }),
  );
}

function expiringRows(report) {
  return report.expiring.map((fact) => [
    fact.tenant_id,
    fact.user_id ? link(fact.user_id, `/user/${encodeURIComponent(fact.user_id)}`, { tenant: fact.tenant_id }) : "—",
    fact.agent_name || "—",
    fact.fact_id,
    fact.category,
    el("span", { class: "content" }, fact.content),
    number(fact.decay, 4),
    number(fact.importance),
  ]);
}

function reportView(report) {
  return el(
    "div",
    { class: "report" },
    el(
      "div",
      { class: "cards" },
      card("Scopes scanned", String(report.scopes_scanned)),
      card("Live facts", String(report.live_facts)),
      card(report.dry_run ? "Would expire" : "Expired", String(report.dry_run ? report.expiring_count : report.removed)),
      card("Protected", String(report.protected.facts)),
      card("Over the cap", `${report.cap.facts_over} (max_facts ${report.cap.max_facts})`),
    ),
    el(
      "p",
      { class: "muted" },
      `Threshold ${text(report.threshold)} · evaluated at ${when(report.evaluated_at)} · protected categories: ${report.protected.categories.join(", ") || "none"}`,
    ),
    table(
      report.dry_run ? "Facts the next run would expire (lowest decay first)" : "Facts expired",
      ["Tenant", "User", "Agent", "Fact", "Category", "Content", "Decay", "Importance"],
      expiringRows(report),
    ),
  );
}

export async function lifecyclePage(ctx) {
  const p = ctx.params;
  const scope = p.get("scope") || ctx.tenant;
  const user = p.get("user") || "";
  const below = p.get("below") || (ctx.me.expire_below ?? "");
  const own = tenantParam(ctx);
  const scopes = [[ctx.tenant, `Tenant ${ctx.tenant}`]];
  if (ctx.me.crosses_tenants) scopes.push([ALL_TENANTS, "Every tenant"]);
  const form = el(
    "form",
    {
      class: "filters",
      "aria-label": "Lifecycle dry run",
      onsubmit: (event) => {
        event.preventDefault();
        const values = Object.fromEntries(new FormData(event.target).entries());
        window.location.hash = href("/lifecycle", { ...own, ...values, run: "1" });
      },
    },
    field("Scope", select("scope", scopes, scope)),
    field("User (optional)", el("input", { name: "user", value: user, maxlength: "128" })),
    field("Expire below (decay)", el("input", { name: "below", type: "number", min: "0", max: "1", step: "0.01", value: String(below) }), `expire_below is ${text(ctx.me.expire_below)}`),
    el("button", { type: "submit" }, "Dry run"),
  );
  const page = el("section", {}, heading("Lifecycle"), el("p", { class: "muted" }, "A dry run scores every live fact of the scope now and lists what a run would expire; nothing changes until you apply it."), form);
  if (p.get("run") !== "1") return page;
  const report = await api("lifecycle", { params: { tenant: scope, user, below } });
  page.append(reportView(report));
  if (report.expiring_count && report.threshold !== null) {
    const apply = el("button", { type: "button", class: "danger" }, `Apply: expire ${report.expiring_count} fact(s)`);
    apply.addEventListener("click", async () => {
      const ok = await confirmDialog(
        `Expire ${report.expiring_count} fact(s)?`,
        [`Facts under decay ${report.threshold} in ${scope === ALL_TENANTS ? "every tenant" : "tenant " + scope}${user ? ", user " + user : ""}, scored as of this dry run.`, "Each removal is audited (origin lifecycle)."],
        "Expire",
      );
      if (!ok) return;
      const done = await guarded(() =>
        api("lifecycle/apply", {
          method: "POST",
          body: { tenant: scope, user: user || null, below: Number(report.threshold), evaluated_at: report.evaluated_at, expiring: report.expiring_count },
        }),
      );
      if (!done) return;
      page.querySelector(".report").replaceWith(reportView(done));
      apply.remove();
      notify(`Expired ${done.removed} fact(s).`, "ok");
    });
    page.append(el("div", { class: "actions" }, apply));
  }
  return page;
}
