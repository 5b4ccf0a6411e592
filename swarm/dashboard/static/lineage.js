// swarmpool dashboard, Lineage view: step -> episode (reward history) -> group -> lease -> update / version
// -> eval results, and a version back to the data that made it. Loaded after app.js and uses its helpers
// (el, table, fmt, badge, getJSON, ...). Pool text is always set with textContent; only server SVG is markup.
"use strict";

const lin = { step: null, policy: null, version: null, offset: 0, limit: 25, shown: { chain: "", version: "" } };

// open the view on a step ({step}) or a version ({policy, version}); Representation and Consumption link here
function openLineage(target) {
  if (target.step) { lin.step = target.step; fillForm($("lin-step-form"), { step_id: target.step }); }
  if (target.policy !== undefined && target.version !== undefined) {
    lin.policy = target.policy; lin.version = Number(target.version); lin.offset = 0;
    fillForm($("lin-version-form"), { policy: target.policy, version: target.version });
  }
  if (location.hash !== "#lineage") location.hash = "#lineage"; else refresh();
}

const linKv = (pairs) => el("dl", { class: "kv" }, pairs.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]));
const linNode = (name, title, ...kids) => el("div", { class: "panel lin-node", "data-node": name }, el("h2", {}, title), ...kids);
const linArrow = () => el("div", { class: "foot", style: "text-align:center" }, "↓");
// a lease's filter without its unset keys (null, empty metadata): what the trainer actually asked for
const linJson = (obj) => el("pre", { class: "json" }, JSON.stringify(Object.fromEntries(Object.entries(obj || {}).filter(([, v]) =>
  v !== null && !(typeof v === "object" && !Array.isArray(v) && !Object.keys(v).length))), null, 1));
const linVersionLink = (policy, version) => el("a", { href: "#lineage", "data-version": version,
  onclick: (e) => { e.preventDefault(); openLineage({ policy, version }); } }, `${policy} v${version}`);
const linStepLink = (id) => el("a", { href: "#lineage", title: id, onclick: (e) => { e.preventDefault(); openLineage({ step: id }); } }, short(id));

function evalTables(evals) {
  return [
    table([{ label: "task", key: "task" }, { label: "source", key: "source" }, { label: "episodes", key: "episodes", num: true },
      { label: "mean reward", key: "reward", num: true },
      { label: "metrics", render: (r) => Object.entries(r.metrics).map(([k, v]) => `${k} ${fmt(v)}`).join(" · ") || "–" },
      { label: "rows", key: "rows", num: true }], evals.summary, { empty: "no eval results for this version", class: "lin-evals" }),
    el("p", { class: "foot" }, "Run evals: the training run's held-out eval episodes played entirely by this version, recorded after each update; pinned: an evaluation of this version by itself."),
  ];
}

// a judge verdict: score on its scale, the judge's recorded step (traceable), cached or not; a failure: its reason
function judgeOrCorrection(r) {
  const p = r.payload || {};
  if (r.name === "judge_failed") return `judge failed: ${p.reason || "?"}`;
  if (r.name !== "judge") return r.correction || "–";
  const scale = Array.isArray(p.scale) ? ` of ${p.scale[0]}..${p.scale[1]}` : "";
  return el("span", {}, `${p.judge_policy || "judge"} scored ${p.score}${scale}${p.cached ? " (cached)" : ""}`,
    p.task_reward != null ? ` · task reward ${fmt(p.task_reward)}` : "", p.applied === false ? ` · not applied: ${p.reason}` : "",
    p.judge_step_id ? el("span", {}, " · judge step ", linStepLink(p.judge_step_id)) : "");
}

function renderChain(d) {
  const s = d.step, e = d.episode, g = d.group, ls = d.lease, u = d.update;
  const rewardCols = [{ label: "when", render: (r) => ago(r.created_at) }, { label: "target", render: (r) => (r.step_id ? "step " + short(r.step_id) : "episode") },
    { label: "source", key: "source" }, { label: "value", key: "value", num: true }, { label: "final", render: (r) => (r.final ? "yes" : "no") },
    { label: "applied", render: (r) => (r.applied ? badge("applied", "ok") : badge("not applied", "bad")) }, { label: "why", key: "reason" }];
  const fbCols = [{ label: "when", render: (r) => ago(r.created_at) }, { label: "kind", render: (r) => (r.kind === "event" ? r.name : r.kind) },
    { label: "rating", key: "rating", num: true }, { label: "value", key: "value", num: true },
    { label: "correction / judge", render: judgeOrCorrection }];
  return [
    linNode("step", "Step", linKv([["step", s.step_id], ["episode #", `${short(s.episode_id)} #${s.index}`], ["policy", `${s.policy} v${s.policy_version}`],
      ["source", s.source], ["response id", s.response_id || "–"], ["reward", el("span", {}, fmt(s.reward), " ", badge(s.reward_final ? "final" : "pending"))],
      ["tokens", `${s.n_prompt} prompt + ${s.length - s.n_prompt} response`], ["created", ago(s.created_at)]])),
    linArrow(),
    linNode("episode", "Episode: why this reward", linKv([["episode", e.episode_id], ["task / type", `${e.task} / ${e.type}`], ["status", badge(e.status)],
      ["reward", el("span", {}, fmt(e.reward), " ", badge(e.reward_status))], ["code version", e.code_version || "–"],
      ["metrics", Object.entries(e.metrics || {}).map(([k, v]) => `${k} ${fmt(v)}`).join(" · ") || "–"]]),
    el("h2", {}, "Reward history (who gave what; a lower authority never supersedes a higher one)"),
    table(rewardCols, e.reward_history, { empty: "no reward reports recorded (a reward set at the end of the episode or directly counts as the agent's)" }),
    el("h2", {}, "Feedback and judge"), table(fbCols, e.feedback, { empty: "no feedback or judge verdict" }),
    e.labels.length ? el("p", {}, e.labels.map((l) => badge(`${l.label}${l.exclude ? " (excluded)" : ""}`, l.exclude ? "excluded" : ""))) : null),
    linArrow(),
    linNode("group", `Group ${g.group_id || "(none: the episode alone)"}`,
      el("p", { class: "foot" }, `${g.members.length}${g.more ? "+" : ""} episodes · mean reward ${fmt(g.reward_mean)} · std ${fmt(g.reward_std)}`),
      table([{ label: "episode", render: (r) => short(r.episode_id), title: (r) => r.episode_id }, { label: "status", render: (r) => badge(r.status) },
        { label: "reward", key: "reward", num: true }, { label: "reward status", render: (r) => badge(r.reward_status) }], g.members,
      { rowClass: (r) => (r.episode_id === e.episode_id ? "sel" : null) })),
    linArrow(),
    linNode("lease", "Lease", ls ? linKv([["lease", ls.lease_id], ["state", badge(ls.state, ls.state === "acked" ? "ok" : "")], ["steps", fmt(ls.n_steps)],
      ["created", ago(ls.created_at)], ["filter", linJson(ls.filter)]]) : el("p", { class: "foot" }, "not leased (or its lease was released)")),
    linArrow(),
    linNode("update", "Update: the version it produced", u ? linKv([["consumed into", linVersionLink(s.policy, u.consumed_version)],
      ["trained from", `v${u.trained_from}`], ["consumed", ago(u.consumed_at)],
      ["adapter", u.version ? u.version.adapter_path || "–" : "(no version record yet)"]]) : el("p", { class: "foot" }, "not consumed by any update yet")),
    linArrow(),
    linNode("evals", u ? `Eval results of ${s.policy} v${u.consumed_version}` : "Eval results", ...(u ? evalTables(d.evals) : [el("p", { class: "foot" }, "–")])),
  ];
}

function renderVersion(d) {
  const m = d.made_of;
  const countRows = (obj) => Object.entries(obj).map(([k, n]) => ({ k, n }));
  const cardsNode = el("div", { class: "cards" }, [["steps trained", m.steps], ["episodes", m.episodes], ["groups", m.groups], ["tokens", m.tokens],
    ["leases", d.leases.length], ["steps it generated", d.generated.steps]].map(([k, v]) => el("div", { class: "card", "data-key": k },
    el("div", { class: "v" }, fmt(v)), el("div", { class: "k" }, k))));
  const page = d.steps;
  return [
    el("div", { class: "panel-head" }, el("h2", {}, `${d.policy} v${d.version}: the data that made it`),
      d.trained_from ? el("span", {}, "trained from ", linVersionLink(d.policy, d.trained_from.version)) : null),
    cardsNode,
    linKv([["adapter", d.record ? d.record.adapter_path || "–" : "(no version record)"], ["published", d.record ? ago(d.record.created_at) : "–"],
      ["generated steps consumed", `${fmt(d.generated.consumed)} of ${fmt(d.generated.steps)}`]]),
    el("div", { class: "grid3" },
      el("div", {}, el("h2", {}, "Tasks"), table([{ label: "task", key: "k" }, { label: "steps", key: "n", num: true }], countRows(m.tasks))),
      el("div", {}, el("h2", {}, "Code versions"), table([{ label: "code", key: "k" }, { label: "episodes", key: "n", num: true }], countRows(m.code_versions))),
      el("div", {}, el("h2", {}, "Staleness"), table([{ label: "versions behind", key: "k" }, { label: "steps", key: "n", num: true }], countRows(m.staleness)))),
    el("h2", {}, "Leases acked into it"),
    table([{ label: "lease", render: (r) => short(r.lease_id), title: (r) => r.lease_id }, { label: "state", render: (r) => badge(r.state, "ok") },
      { label: "steps", key: "steps_of_policy", num: true }, { label: "created", render: (r) => ago(r.created_at) }], d.leases, { empty: "no lease was acked into this version" }),
    el("h2", {}, `Steps trained into it (${page.offset + 1}–${page.offset + page.data.length} of ${fmt(page.total)})`),
    table([{ label: "step", render: (r) => linStepLink(r.step_id) }, { label: "task", key: "task" }, { label: "made by", render: (r) => "v" + r.policy_version },
      { label: "reward", key: "reward", num: true }, { label: "tokens", key: "length", num: true }, { label: "created", render: (r) => ago(r.created_at) }],
    page.data, { empty: "none", class: "lin-steps" }),
    el("div", { class: "pager" },
      el("button", { type: "button", disabled: page.offset === 0, onclick: () => { lin.offset = Math.max(0, lin.offset - lin.limit); refresh(); } }, "◀"),
      el("button", { type: "button", disabled: page.offset + page.data.length >= page.total, onclick: () => { lin.offset += lin.limit; refresh(); } }, "▶")),
    el("h2", {}, "Eval results (forward)"), ...evalTables(d.evals),
    el("div", { class: "chartbox lin-chart" }),
  ];
}

async function loadLineage() {
  const vs = await getJSON("/lineage/versions");
  put("lin-versions", table([{ label: "policy", key: "policy" }, { label: "version", key: "version", num: true },
    { label: "published", render: (r) => ago(r.created_at) }], vs.data.slice(0, 10),
  { onclick: (r) => openLineage({ policy: r.policy, version: r.version }), empty: "no published versions yet" }));
  const chain = $("lin-chain"), ver = $("lin-version");
  if (lin.step) {
    let d = null, msg = null;
    try { d = await getJSON("/lineage/steps/" + encodeURIComponent(lin.step)); } catch (e) { msg = e.message; }
    const key = JSON.stringify(d) + msg;
    if (key !== lin.shown.chain) { // re-render only on change: polling must not reset what the reader scrolled
      lin.shown.chain = key;
      chain.hidden = false;
      setKids(chain, msg ? el("p", { class: "msg err" }, msg) : renderChain(d));
    }
  } else chain.hidden = true;
  if (lin.policy !== null && lin.version !== null && !Number.isNaN(lin.version)) {
    let d = null, msg = null;
    try { d = await getJSON(`/lineage/versions/${encodeURIComponent(lin.policy)}/${lin.version}`, { limit: lin.limit, offset: lin.offset }); }
    catch (e) { msg = e.message; }
    const key = JSON.stringify(d) + msg;
    if (key !== lin.shown.version) {
      lin.shown.version = key;
      ver.hidden = false;
      setKids(ver, msg ? el("p", { class: "msg err" }, msg) : renderVersion(d));
      if (d) ver.querySelector(".lin-chart").innerHTML = d.chart; // server-rendered, escaped SVG
    }
  } else ver.hidden = true;
}

VIEWS.lineage = loadLineage;
$("lin-step-form").addEventListener("submit", (e) => { e.preventDefault(); const id = formParams(e.target).step_id; if (id) openLineage({ step: id }); });
$("lin-version-form").addEventListener("submit", (e) => {
  e.preventDefault();
  const p = formParams(e.target);
  if (p.policy && p.version !== undefined) openLineage({ policy: p.policy, version: p.version });
});
if (location.hash === "#lineage") route(); // app.js routed before this view existed
