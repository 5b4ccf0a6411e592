// swarmpool dashboard: five views over /dashboard/api, polled live. Vanilla JS, no dependencies.
// Text from the pool is always set with textContent; only server-rendered SVG goes in as markup.
"use strict";

const ROOT = document.body.dataset.root;
const API = ROOT + "/api";
const POLL_MS = 2500;
const $ = (id) => document.getElementById(id);
const state = { view: null, busy: false, repOffset: 0, repLimit: 50, selected: new Set(), curRows: [],
  curExact: false, curExtra: {}, mrgLease: null, mrgGroup: null, step: null };

// ------------------------------------------------------------------------------------ helpers
function el(tag, attrs, ...kids) {
  const n = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") n.className = v;
    else if (k.startsWith("on")) n.addEventListener(k.slice(2), v);
    else n.setAttribute(k, v === true ? "" : v);
  }
  for (const k of kids.flat()) {
    if (k === null || k === undefined) continue;
    n.append(k instanceof Node ? k : document.createTextNode(String(k)));
  }
  return n;
}
const fmt = (v) => (v === null || v === undefined ? "–" : typeof v === "number" ? (Number.isInteger(v) ? v.toLocaleString("en-US") : v.toFixed(3)) : String(v));
const short = (id) => (id ? (id.length > 14 ? id.slice(0, 4) + "…" + id.slice(-6) : id) : "–");
const ago = (t) => { if (!t) return "–"; const s = Date.now() / 1000 - t; return s < 90 ? `${s.toFixed(0)}s ago` : s < 5400 ? `${(s / 60).toFixed(0)}m ago` : s < 172800 ? `${(s / 3600).toFixed(1)}h ago` : `${(s / 86400).toFixed(1)}d ago`; };
const badge = (text, cls) => el("span", { class: "badge " + (cls || text) }, text);

function table(cols, rows, opts = {}) {
  const head = el("tr", {}, cols.map((c) => el("th", { class: c.num ? "num" : null }, c.label)));
  const body = rows.map((r) => {
    const tr = el("tr", { class: opts.onclick ? "click" : null }, cols.map((c) => {
      const v = c.render ? c.render(r) : fmt(r[c.key]);
      return el("td", { class: c.num ? "num" : null, title: c.title ? c.title(r) : null }, v);
    }));
    if (opts.onclick) tr.addEventListener("click", (e) => opts.onclick(r, e));
    if (opts.rowClass) { const rc = opts.rowClass(r); if (rc) tr.classList.add(rc); }
    return tr;
  });
  if (!rows.length) body.push(el("tr", {}, el("td", { colspan: cols.length, class: "foot" }, opts.empty || "nothing yet")));
  return el("div", { class: "tablewrap" }, el("table", { class: opts.class || null }, el("thead", {}, head), el("tbody", {}, body)));
}
function put(id, node) { const n = $(id); n.replaceChildren(node); }
function setKids(node, ...kids) { node.replaceChildren(...kids.flat().filter((k) => k !== null && k !== undefined)); }
function putSvg(id, svg) { $(id).innerHTML = svg; } // server-rendered, escaped SVG
function cards(id, items) {
  put(id, el("div", { class: "cards" }, items.map(([k, v, t]) => el("div", { class: "card", title: t || null, "data-key": k },
    el("div", { class: "v" }, fmt(v)), el("div", { class: "k" }, k)))));
}
function countTable(obj, label) {
  const rows = Object.entries(obj || {}).sort((a, b) => b[1] - a[1]).map(([k, n]) => ({ k, n }));
  return table([{ label, key: "k" }, { label: "steps", key: "n", num: true }], rows);
}
function setStatus(kind, msg) { const s = $("status"); s.className = "status " + kind; s.title = msg || "live"; }

async function api(path, params, init) {
  const url = new URL(API + path, location.origin);
  for (const [k, v] of Object.entries(params || {})) if (v !== "" && v !== null && v !== undefined) url.searchParams.set(k, v);
  const r = await fetch(url, init);
  if (!r.ok) {
    let msg = r.status + " " + r.statusText;
    try { const j = await r.json(); if (j.error) msg = j.error.message; } catch (e) { /* not JSON */ }
    throw new Error(msg);
  }
  return r;
}
const getJSON = async (path, params) => (await api(path, params, { headers: authHeaders() })).json();
function authHeaders() {
  const t = $("token").value.trim();
  return t ? { Authorization: "Bearer " + t } : {};
}
async function postJSON(path, body) {
  return api(path, null, { method: "POST", headers: { "Content-Type": "application/json", ...authHeaders() }, body: JSON.stringify(body) });
}
function formParams(form) {
  const out = {};
  for (const e of form.elements) {
    if (!e.name) continue;
    if (e.type === "checkbox") { if (e.checked) out[e.name] = "true"; }
    else if (e.value !== "") out[e.name] = e.value;
  }
  return out;
}
function fillForm(form, values) {
  for (const e of form.elements) {
    if (!e.name) continue;
    const v = values[e.name];
    if (e.type === "checkbox") e.checked = v === true || v === "true";
    else e.value = v === undefined || v === null ? "" : String(v);
  }
}

function snapText(s) {
  if (s.warming) return "Pool totals are being computed in the background (a large pool takes a few seconds); live numbers meanwhile." + (s.error ? " Last error: " + s.error : "");
  return `Totals: background snapshot ${s.age_s}s old (took ${s.took_s}s, refreshed every ≥${s.refresh_every_s}s) + ${s.live_delta_steps} steps created since, read live.`;
}

// --------------------------------------------------------------------------------- Collection
async function loadCollection() {
  const d = await getJSON("/collection", { window_s: $("col-window").value });
  const st = d.episodes.by_status;
  const rate = Object.values(d.rates.counts).reduce((a, b) => a + b, 0) / d.rates.window_s;
  cards("col-cards", [["steps", d.steps.total], ["episodes", d.episodes.total], ["open", st.open],
    ["finished", st.finished], ["abandoned", st.abandoned], ["failed", st.failed],
    ["active clients", d.clients.length], [d.rates.live ? "steps/s (window)" : "steps/s (last window with data)", Number(rate.toFixed(2))], ["consumed", d.steps.consumed]]);
  putSvg("col-rates", d.charts.rates);
  $("col-rates-note").textContent = d.rates.live ? "" :
    `No step in the last ${d.rates.window_s / 60} min: showing the window that ends at the newest step (${new Date(d.rates.end * 1000).toLocaleString()}).`;
  put("col-source", countTable(d.steps.by_source, "source"));
  put("col-task", countTable(d.steps.by_task, "task"));
  put("col-policy", countTable(d.steps.by_policy, "policy"));
  put("col-clients", table([{ label: "client", key: "client_id" }, { label: "open episodes", key: "open_episodes", num: true },
    { label: "task", key: "task" }, { label: "idle", render: (r) => (r.idle_s === null ? "–" : r.idle_s + " s") },
    { label: "agreed", render: (r) => (r.agreed ? "yes" : "") }], d.clients, { empty: "no client has an open episode" }));
  put("col-episodes", table([{ label: "episode", render: (r) => short(r.episode_id), title: (r) => r.episode_id },
    { label: "task", key: "task" }, { label: "client", render: (r) => short(r.client_id) }, { label: "type", key: "type" },
    { label: "status", render: (r) => badge(r.status) }, { label: "reward", key: "reward", num: true },
    ...(hasCode(d.recent_episodes) ? [codeCol] : []),
    { label: "created", render: (r) => ago(r.created_at) }], d.recent_episodes,
  { onclick: (r) => { location.hash = "#representation"; fillForm($("rep-filter"), { episode_id: r.episode_id, order: "episode" }); state.repOffset = 0; } }));
  $("col-foot").textContent = snapText(d.snapshot) + ` Rate buckets: ${d.rates.bucket_s}s.`;
}

// ----------------------------------------------------------------------------- Representation
const roleText = (r) => [r.role, r.seat === null || r.seat === undefined ? null : "seat " + r.seat].filter((x) => x !== null && x !== undefined).join(" · ");
const hasRoles = (rows) => rows.some((r) => (r.role !== null && r.role !== undefined) || (r.seat !== null && r.seat !== undefined));
// the task code that ran an episode (metadata code_version, set by the worker): shown when a row has one
const hasCode = (rows) => rows.some((r) => r.code_version);
const codeCol = { label: "code", render: (r) => r.code_version || "–", title: () => "code version (hash of the task package's files)" };
// multi-agent tasks (one episode per seat) record the seat's role in the episode's metadata: shown when a row has one
const stepCols = (extra, rows) => [
  ...(extra || []),
  { label: "created", render: (r) => ago(r.created_at), title: (r) => new Date(r.created_at * 1000).toISOString() },
  { label: "step", render: (r) => short(r.step_id), title: (r) => r.step_id },
  { label: "episode #", render: (r) => short(r.episode_id) + " #" + r.index, title: (r) => r.episode_id },
  { label: "task", key: "task" },
  ...(rows && hasRoles(rows) ? [{ label: "role / seat", render: (r) => roleText(r) || "–" }] : []),
  ...(rows && hasCode(rows) ? [codeCol] : []),
  { label: "policy", render: (r) => r.policy + " v" + r.policy_version },
  { label: "source", key: "source" }, { label: "prompt", key: "n_prompt", num: true }, { label: "resp", key: "n_response", num: true },
  { label: "reward", render: (r) => el("span", {}, fmt(r.reward), " ", badge(r.reward_status)) },
  { label: "episode", render: (r) => badge(r.episode_status) },
  { label: "consumed", render: (r) => (r.consumed_version === null ? "" : "by v" + r.consumed_version) },
];

async function loadRepresentation() {
  const p = formParams($("rep-filter"));
  const d = await getJSON("/steps", { ...p, limit: state.repLimit, offset: state.repOffset });
  put("rep-table", table(stepCols(null, d.data), d.data, { onclick: (r) => showStep(r.step_id), empty: "no matching steps",
    rowClass: (r) => (state.step === r.step_id ? "sel" : null) }));
  $("rep-page").textContent = `rows ${state.repOffset + 1}–${state.repOffset + d.data.length}${d.has_more ? " (more)" : ""}`;
  $("rep-prev").disabled = state.repOffset === 0;
  $("rep-next").disabled = !d.has_more;
}

function lpColor(lp) {
  const p = Math.exp(Math.max(-20, Math.min(0, lp)));
  return `hsl(${Math.round(120 * p)}, 75%, 78%)`;
}
function showPiece(s) { return s.replace(/\n/g, "↵\n").replace(/\t/g, "→"); }

function tokenView(tv, logprobs) {
  const box = el("div", { class: "tokens", id: "rep-tokens" });
  if (tv.prompt_skipped) box.append(el("span", { class: "tok p" }, `[${tv.prompt_skipped} earlier prompt tokens not shown] `));
  tv.prompt.forEach((id, i) => {
    const piece = tv.prompt_pieces ? showPiece(tv.prompt_pieces[i]) : id + " ";
    box.append(el("span", { class: "tok p", title: `prompt token ${tv.prompt_skipped + i}: id ${id}` }, piece));
  });
  tv.response.forEach((id, i) => {
    const lp = logprobs ? logprobs[i] : null;
    const piece = tv.response_pieces ? showPiece(tv.response_pieces[i]) : id + " ";
    const t = el("span", { class: "tok r", title: `response token ${i}: id ${id}` + (lp === null ? "" : `, logprob ${lp.toFixed(4)} (p=${Math.exp(lp).toFixed(3)})`), "data-lp": lp === null ? null : String(lp) }, piece);
    t.style.background = lp === null ? "#dde8f6" : lpColor(lp);
    box.append(t);
  });
  return box;
}

function messagesView(msgs) {
  if (!msgs || !msgs.length) return el("p", { class: "foot" }, "no messages recorded (white-box / completions step)");
  return el("div", { class: "msgs" }, msgs.map((m) => {
    const content = typeof m.content === "string" ? m.content : JSON.stringify(m.content, null, 1);
    const extra = m.tool_calls ? "\n" + JSON.stringify(m.tool_calls, null, 1) : "";
    return el("div", { class: "m " + (m.role || "") }, el("b", {}, m.role + (m.name ? " · " + m.name : "")), (content || "") + extra);
  }));
}

async function showStep(stepId) {
  state.step = stepId;
  const d = await getJSON("/steps/" + encodeURIComponent(stepId));
  const panel = $("rep-step");
  panel.hidden = false;
  const labels = [...d.labels.step.map((l) => ["step", l]), ...d.labels.episode.map((l) => ["episode", l])];
  const pc = d.prefix_consistent;
  const md = d.episode.metadata || {};
  const epRole = { role: md.role ?? null, seat: md.seat ?? md.player ?? null };
  const kv = el("dl", { class: "kv" },
    el("dt", {}, "step"), el("dd", {}, d.step_id), el("dt", {}, "episode"), el("dd", {}, `${d.episode_id} (#${d.index}, `, badge(d.episode.status), ")"),
    el("dt", {}, "task / group"), el("dd", {}, `${d.task} / ${d.group_id || "–"}`),
    ...(hasRoles([epRole]) ? [el("dt", {}, "role / seat"), el("dd", { id: "rep-role" }, roleText(epRole))] : []),
    ...(md.code_version ? [el("dt", {}, "code version"), el("dd", { id: "rep-code" }, String(md.code_version))] : []),
    el("dt", {}, "policy"), el("dd", {}, `${d.policy} version ${d.policy_version}`),
    el("dt", {}, "source"), el("dd", {}, d.source),
    el("dt", {}, "reward"), el("dd", {}, fmt(d.reward), " ", badge(d.reward_status)),
    el("dt", {}, "prefix consistent"), el("dd", { id: "rep-prefix" }, pc === null ? "n/a" : pc ? badge("yes", "ok") : badge("no", "bad")),
    el("dt", {}, "finish reason"), el("dd", {}, d.finish_reason || "–"),
    el("dt", {}, "tokens"), el("dd", {}, `${d.prompt_ids.length} prompt + ${d.response_ids.length} response (trainable span highlighted)`),
    el("dt", {}, "labels"), el("dd", {}, labels.length ? labels.map(([t, l]) => badge(`${t}: ${l.label}${l.exclude ? " (excluded)" : ""}`, l.exclude ? "excluded" : "")) : "none"),
    el("dt", {}, "lineage"), el("dd", {}, el("button", { type: "button", id: "rep-lineage", onclick: () => openLineage({ step: d.step_id }) }, "trace: lease, update, version, evals →")));
  const lps = d.response_logprobs;
  const meanLp = lps && lps.length ? lps.reduce((a, b) => a + b, 0) / lps.length : null;
  setKids(panel,
    el("div", { class: "panel-head" }, el("h2", {}, "Step"), el("button", { type: "button", onclick: () => { panel.hidden = true; state.step = null; } }, "close")),
    kv,
    el("h2", {}, "Messages (the prompt the agent sent) and the reply"), messagesView(d.prompt_messages),
    d.response_text !== null ? el("div", { class: "m assistant" }, el("b", {}, "reply"), d.response_text) : null,
    el("h2", {}, "Exact token sequence"),
    el("div", { class: "legend" }, el("span", {}, "prompt (context)"), el("span", { class: "tok r", style: "background:#dde8f6" }, "response = trainable"),
      el("span", {}, "logprob colour: p=0"), el("span", { class: "sw" }), el("span", {}, "p=1"),
      meanLp === null ? null : el("span", {}, `mean logprob ${meanLp.toFixed(3)}`)),
    tokenView(d.tokens_view, lps),
    el("h2", {}, "The episode's steps, in order"),
    table(stepCols(null, d.episode_steps), d.episode_steps, { onclick: (r) => showStep(r.step_id), rowClass: (r) => (r.step_id === d.step_id ? "sel" : null) }));
  panel.scrollIntoView({ block: "nearest" });
}

// -------------------------------------------------------------------------------- Curation
// a loaded filter's keys the form has no field for (metadata, since, ...) ride along until "clear"
function curFilter() {
  const out = formParams($("cur-filter"));
  for (const [k, v] of Object.entries(state.curExtra || {})) out[k] = typeof v === "object" ? (Array.isArray(v) ? v.join(",") : JSON.stringify(v)) : String(v);
  return out;
}
function loadFilter(filter) {
  const names = new Set([...$("cur-filter").elements].map((e) => e.name).filter(Boolean));
  state.curExtra = Object.fromEntries(Object.entries(filter).filter(([k]) => !names.has(k)));
  fillForm($("cur-filter"), filter);
  refresh();
}
function showTrainer(meta) {
  const t = meta.trainer;
  const sel = $("cur-plan-policy");
  sel.hidden = t.policies.length < 2;
  if (t.policies.join() !== [...sel.options].map((o) => o.value).join()) sel.replaceChildren(...t.policies.map((p) => el("option", { value: p }, p)));
  sel.value = t.policy;
  const n = (t.matching_capped ? "≥" : "") + t.matching_steps.toLocaleString("en-US");
  $("cur-trainer-note").textContent = `trainer's filter: ${t.text}; ${n} steps match it now.`;
}
async function loadCuration(opts = {}) {
  const f = curFilter();
  const [c, rows, meta] = await Promise.all([
    getJSON("/count", { ...f, exact: state.curExact ? "true" : "" }),
    getJSON("/steps", { ...f, limit: 25 }),
    getJSON("/curation", { policy: f.policy || "", trainer_policy: $("cur-plan-policy").value || "" }),
  ]);
  state.curExact = false;
  $("cur-json").textContent = "StepFilter(" + JSON.stringify(c.filter) + ")  # as parsed by the pool: what a lease with it takes";
  const plus = (n, capped) => (capped ? "≥" + n.toLocaleString("en-US") : n);
  cards("cur-cards", [["matching steps", plus(c.steps, c.steps_capped)], ["episodes", plus(c.episodes, c.episodes_capped)],
    ["not yet consumed", plus(c.unconsumed, c.unconsumed_capped)], ["query ms", c.elapsed_ms.toFixed(1)]]);
  state.curRows = rows.data;
  const ids = new Set(rows.data.map((r) => r.step_id));
  for (const s of [...state.selected]) if (!ids.has(s)) state.selected.delete(s);
  const check = { label: "", render: (r) => el("input", { type: "checkbox", class: "sel-step", "data-step": r.step_id, checked: state.selected.has(r.step_id),
    onchange: (e) => { e.target.checked ? state.selected.add(r.step_id) : state.selected.delete(r.step_id); } }) };
  put("cur-table", table(stepCols([check], rows.data), rows.data, { empty: "no matching steps" }));
  put("cur-labels", table([{ label: "when", render: (r) => ago(r.created_at) }, { label: "target", key: "target" },
    { label: "id", render: (r) => short(r.target_id), title: (r) => r.target_id }, { label: "label", key: "label" },
    { label: "excluded", render: (r) => (r.exclude ? badge("excluded") : "") }, { label: "note", key: "note" }], meta.recent_labels, { empty: "no labels yet" }));
  state.trainerFilter = meta.trainer_filter;
  showTrainer(meta);
  put("cur-saved", table([{ label: "name", key: "name" }, { label: "version", key: "version", num: true },
    { label: "filter", render: (r) => JSON.stringify(r.filter) }, { label: "note", key: "note" }, { label: "saved", render: (r) => ago(r.created_at) }],
    meta.curations, { empty: "no saved curation yet", onclick: (r) => loadFilter(r.filter) }));
}

async function saveCuration(ev) {
  ev.preventDefault();
  const p = formParams($("cur-save"));
  const msg = $("cur-save-msg");
  try {
    const r = await (await postJSON("/curations", { name: p.name, note: p.note || "", filter: curFilter() })).json();
    msg.className = "msg"; msg.textContent = `saved ${r.ref}: train on it with train.curation=${r.ref}`;
    await loadCuration();
  } catch (e) { msg.className = "msg err"; msg.textContent = "save failed: " + e.message; }
}

async function labelSelected(ev) {
  ev.preventDefault();
  const form = $("cur-label");
  const p = formParams(form);
  const msg = $("cur-label-msg");
  const steps = state.curRows.filter((r) => state.selected.has(r.step_id));
  if (!steps.length) { msg.className = "msg err"; msg.textContent = "select steps in the table first"; return; }
  const ids = p.target === "episode" ? [...new Set(steps.map((r) => r.episode_id))] : steps.map((r) => r.step_id);
  try {
    const r = await (await postJSON("/labels", { target: p.target, target_ids: ids, label: p.label, exclude: p.exclude === "true", note: p.note || "" })).json();
    msg.className = "msg"; msg.textContent = `labelled ${r.labels.length} ${p.target}(s) "${p.label}"${p.exclude === "true" ? " and excluded them from training" : ""}`;
    state.selected.clear();
    await loadCuration();
  } catch (e) { msg.className = "msg err"; msg.textContent = "label failed: " + e.message; }
}

async function exportSelection(format) {
  const msg = $("cur-export-msg");
  msg.className = "msg"; msg.textContent = "exporting…";
  const filter = curFilter(); // strings: the server parses them into a StepFilter like a query string
  const jsonl = format === "jsonl";
  const minReward = $("cur-min-reward").value;
  try {
    const r = jsonl ? await postJSON("/export/jsonl", { filter, min_reward: minReward === "" ? null : Number(minReward) })
      : await postJSON("/export", { filter, with_tokens: $("cur-tokens").checked });
    const blob = await r.blob();
    const fallback = jsonl ? "chat.jsonl" : "steps.parquet";
    const name = (r.headers.get("Content-Disposition") || "").match(/filename="?([^";]+)/);
    const a = el("a", { href: URL.createObjectURL(blob), download: name ? name[1] : fallback, id: "cur-download" }, "download " + (name ? name[1] : fallback));
    msg.replaceChildren(`exported ${r.headers.get("X-Rows")} ${jsonl ? "branches" : "steps"} (${(blob.size / 1024).toFixed(1)} KiB): `, a);
  } catch (e) { msg.className = "msg err"; msg.textContent = "export failed: " + e.message; }
}

// -------------------------------------------------------------------------- Prefix merging
async function loadMerging() {
  const d = await getJSON("/merging", { lease_id: state.mrgLease || "", group_id: state.mrgGroup || "" });
  putSvg("mrg-saving", d.charts.saving);
  putSvg("mrg-tokens", d.charts.tokens);
  const sel = d.selected;
  put("mrg-batches", table([{ label: "lease", render: (r) => short(r.lease_id), title: (r) => r.lease_id },
    { label: "state", render: (r) => badge(r.state, r.state === "acked" ? "ok" : "") }, { label: "when", render: (r) => ago(r.created_at) },
    { label: "→ version", key: "consumed_version", num: true }, { label: "steps", key: "steps", num: true },
    { label: "tokens before", render: (r) => fmt(r.none.tokens_before), num: true },
    { label: "after timeline", render: (r) => fmt(r.timeline.tokens_after), num: true },
    { label: "after tree", render: (r) => fmt(r.tree.tokens_after), num: true },
    { label: "saving (tree)", render: (r) => r.tree.saving_pct + " %", num: true }], d.batches,
  { onclick: (r) => { state.mrgLease = r.lease_id; state.mrgGroup = null; loadMerging(); },
    rowClass: (r) => (sel && sel.lease_id === r.lease_id ? "sel" : null), empty: "no training batch yet (leases appear when a trainer runs)" }));
  const box = $("mrg-selected");
  if (!sel) { box.replaceChildren(el("p", { class: "foot" }, "Select a batch or enter a group id.")); return; }
  const m = sel.merge;
  const modes = ["none", "timeline", "tree"].map((k) => ({ mode: k, ...m[k] }));
  const maxTok = Math.max(1, ...sel.tree.nodes.map((n) => n.tokens));
  setKids(box,
    el("h2", {}, sel.lease_id ? `Batch ${sel.lease_id}` : `Group ${sel.group_id}`, ` · ${m.steps} steps`),
    table([{ label: "merge mode", key: "mode" }, { label: "tokens before", key: "tokens_before", num: true },
      { label: "tokens after", key: "tokens_after", num: true }, { label: "rows", key: "rows", num: true },
      { label: "saving", render: (r) => r.saving_pct + " %", num: true }, { label: "ratio", key: "ratio", num: true }], modes),
    el("h2", {}, `Prefix tree: ${sel.tree.n_nodes} nodes, ${sel.tree.tokens_in_tree} tokens stored once, ${sel.tree.shared_tokens} in shared spans`),
    el("div", { class: "chartbox", id: "mrg-icicle" }),
    table([{ label: "node", render: (n) => "· ".repeat(n.level - 1) + n.id }, { label: "start", key: "start", num: true },
      { label: "tokens", key: "tokens", num: true },
      { label: "", render: (n) => el("span", { class: "bar" + (n.sequences > 1 ? "" : " one"), style: `width:${Math.max(2, (60 * n.tokens) / maxTok)}px` }) },
      { label: "shared by", key: "sequences", num: true }, { label: "trainable", key: "trainable", num: true },
      { label: "text", render: (n) => (n.text === null ? n.ids_head.join(" ") : showPiece(n.text)) }], sel.tree.nodes, { class: "tree" }),
    sel.tree.truncated ? el("p", { class: "foot" }, "first nodes only") : null);
  $("mrg-icicle").innerHTML = sel.tree.svg; // server-rendered, escaped SVG
}

// ----------------------------------------------------------------------------- Consumption
function epText(r, f) {
  const e = Object.entries(r.episode_rewards || {});
  if (!e.length) return "–";
  return e.length === 1 ? f(e[0][1]) : e.map(([t, v]) => `${f(v)} ${t}`).join(" · ");
}
async function loadConsumption() {
  const d = await getJSON("/consumption");
  const t = d.lease_totals;
  cards("con-cards", [["leases acked", t.acked || 0], ["active", t.active || 0], ["released", t.released || 0], ["expired", t.expired || 0],
    ["steps consumed", d.steps.consumed], ["policy versions", d.policy_versions.length]]);
  putSvg("con-leases", d.charts.leases);
  putSvg("con-reward", d.charts.reward);
  $("con-reward-note").textContent = d.reward_note;
  putSvg("con-consumed", d.charts.consumed);
  putSvg("con-staleness", d.charts.staleness);
  putSvg("con-generated", d.charts.generated);
  put("con-versions", table([{ label: "policy", key: "policy" }, { label: "version", key: "version", num: true },
    { label: "steps generated", key: "steps", num: true },
    { label: "one-version episodes", render: (r) => epText(r, (e) => fmt(e.episodes)), num: true, title: () => "finished episodes with a final reward whose steps all came from this version" },
    { label: "mean episode reward", render: (r) => epText(r, (e) => e.reward_mean.toFixed(3)), num: true },
    { label: "steps trained into it", key: "consumed_by_this_update", num: true }],
  d.versions.slice().reverse(), { onclick: (r) => openLineage({ policy: r.policy, version: r.version }) })); // lineage.js
  put("con-recent", table([{ label: "lease", render: (r) => short(r.lease_id), title: (r) => r.lease_id },
    { label: "state", render: (r) => badge(r.state, r.state === "acked" ? "ok" : "") }, { label: "steps", key: "n_steps", num: true },
    { label: "→ version", key: "consumed_version", num: true }, { label: "when", render: (r) => ago(r.created_at) }], d.recent_leases));
  $("con-foot").textContent = snapText(d.snapshot) + " Staleness = trainer version at lease time − the step's policy version.";
}

// ---------------------------------------------------------------------------------- routing
const VIEWS = { collection: loadCollection, representation: loadRepresentation, curation: loadCuration,
  merging: loadMerging, consumption: loadConsumption };
const ALIASES = { optimization: "merging" }; // the view's former name: old links keep working

async function refresh() {
  if (document.hidden) return;
  if (state.busy) { state.again = true; return; } // run once more when the current load ends
  state.busy = true;
  state.again = false;
  const view = state.view;
  setStatus("busy", "loading");
  try {
    await VIEWS[view]();
    setStatus("", "live · updated " + new Date().toLocaleTimeString());
    if (state.view === view) document.body.dataset.loaded = view;
  } catch (e) { setStatus("err", e.message); }
  finally {
    state.busy = false;
    if (state.again || state.view !== view) refresh();
  }
}

function route() {
  const h = (location.hash || "#collection").slice(1);
  if (ALIASES[h]) { location.replace("#" + ALIASES[h]); return; } // fires hashchange -> route()
  const v = h;
  state.view = VIEWS[v] ? v : "collection";
  for (const s of document.querySelectorAll(".view")) s.hidden = s.id !== "view-" + state.view;
  for (const a of document.querySelectorAll("#tabs a")) a.classList.toggle("active", a.dataset.view === state.view);
  delete document.body.dataset.loaded;
  refresh();
}

let debounce = null;
function soon() { clearTimeout(debounce); debounce = setTimeout(refresh, 250); }

function init() {
  $("token").value = localStorage.getItem("swarm-admin-token") || "";
  $("token").addEventListener("change", () => localStorage.setItem("swarm-admin-token", $("token").value));
  $("col-window").addEventListener("change", refresh);
  $("rep-filter").addEventListener("input", () => { state.repOffset = 0; soon(); });
  $("rep-filter").addEventListener("submit", (e) => e.preventDefault());
  $("rep-prev").addEventListener("click", () => { state.repOffset = Math.max(0, state.repOffset - state.repLimit); refresh(); });
  $("rep-next").addEventListener("click", () => { state.repOffset += state.repLimit; refresh(); });
  $("cur-filter").addEventListener("input", soon);
  $("cur-filter").addEventListener("submit", (e) => e.preventDefault());
  $("cur-trainer").addEventListener("click", () => { if (state.trainerFilter) loadFilter(state.trainerFilter); });
  $("cur-plan-policy").addEventListener("change", refresh);
  $("cur-clear").addEventListener("click", () => { state.curExtra = {}; fillForm($("cur-filter"), {}); refresh(); });
  $("cur-save").addEventListener("submit", saveCuration);
  $("cur-exact").addEventListener("click", () => { state.curExact = true; refresh(); });
  $("cur-all").addEventListener("change", (e) => { for (const r of state.curRows) e.target.checked ? state.selected.add(r.step_id) : state.selected.delete(r.step_id);
    for (const c of document.querySelectorAll(".sel-step")) c.checked = e.target.checked; });
  $("cur-label").addEventListener("submit", labelSelected);
  $("cur-export").addEventListener("click", () => exportSelection("parquet"));
  $("cur-export-jsonl").addEventListener("click", () => exportSelection("jsonl"));
  $("mrg-group").addEventListener("submit", (e) => { e.preventDefault(); state.mrgGroup = formParams(e.target).group_id || null; state.mrgLease = null; refresh(); });
  window.addEventListener("hashchange", route);
  document.addEventListener("visibilitychange", refresh);
  setInterval(refresh, POLL_MS);
  route();
}
init();
