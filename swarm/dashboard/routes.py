"""The dashboard's HTTP routes: the page at ``/dashboard`` and its JSON API under ``/dashboard/api``.

Reads need the same token as the pool read API (the admin token when one is configured); writes
(labels, saved curations, Parquet and chat-JSONL exports) need the admin token when one is configured. Filters are :class:`~swarm.pool.StepFilter` in the query string (or
JSON body), parsed exactly like ``/v1/pool/steps``. Charts come back as SVG strings inside the
JSON, rendered on the server. Errors use the app's JSON error shape (:mod:`swarm.web.errors`).
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from fastapi import APIRouter, Depends, Request
from fastapi.responses import FileResponse, HTMLResponse, Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.background import BackgroundTask

from swarm import loop
from swarm.dashboard import svg
from swarm.dashboard.lineage import router as lineage_router
from swarm.dashboard.merging import MAX_STEPS, merge_summary, tree_view
from swarm.dashboard.snapshot import Aggregates, MergeCache, RateCache
from swarm.errors import NotFoundError
from swarm.pool import StepFilter
from swarm.web.auth import Caller
from swarm.web.errors import ApiError
from swarm.web.pool_json import parse_filter, readable_response, split_query, step_json
from swarm.web.state import Service, ServiceState, admin_caller, get_state, reader_caller

__all__ = ["router", "DashboardState"]

router = APIRouter(tags=["dashboard"], include_in_schema=True)
router.include_router(lineage_router)  # the Lineage view's API (swarm.dashboard.lineage)
_HERE = Path(__file__).parent
_CONTROL = frozenset({"limit", "offset", "order", "exact", "cap", "window_s"})
_MAX_TOKENS_SHOWN = 8000


class DashboardState:
    """Per-app caches (see :mod:`swarm.dashboard.snapshot`)."""

    def __init__(self, service: ServiceState) -> None:
        self.aggregates = Aggregates(service.overview)
        self.rates = RateCache(service.overview)
        self.merges = MergeCache()


def _dash(request: Request) -> DashboardState:
    st = getattr(request.app.state, "dashboard", None)
    if st is None:
        st = request.app.state.dashboard = DashboardState(get_state(request))
    return st


def _code_version(raw: dict[str, Any]) -> dict[str, Any]:
    """``code_version=<hash>`` (the filter forms' field) as the episode-metadata condition it means:
    ``metadata={"code_version": <hash>}``, the task code that ran the episode (:mod:`swarm.client.task`)."""
    if "code_version" not in raw:
        return raw
    raw = dict(raw)
    value = raw.pop("code_version")
    meta = raw.get("metadata") or {}
    if isinstance(meta, str):
        meta = parse_filter({"metadata": meta}).metadata
    if value not in (None, ""):
        raw["metadata"] = {**meta, "code_version": value}
    return raw


def _split(request: Request, extra: frozenset[str] = frozenset()) -> tuple[dict[str, str], StepFilter]:
    """(control parameters, the StepFilter made of all other query parameters; ``code_version`` is
    a metadata condition, see :func:`_code_version`)."""
    control, raw = split_query(request, _CONTROL | extra)
    raw = {k: v for k, v in raw.items() if v != ""}
    if "group_ids" in raw:
        raw["group_ids"] = [g for g in raw["group_ids"].split(",") if g]
    return control, parse_filter(_code_version(raw))


def _num(control: dict[str, str], key: str, default: float, lo: float, hi: float) -> float:
    try:
        v = float(control.get(key, default))
    except ValueError:
        raise ApiError(400, f"{key} must be a number", param=key, code="invalid_value") from None
    if not lo <= v <= hi:
        raise ApiError(400, f"{key} must be in [{lo:g}, {hi:g}]", param=key, code="invalid_value")
    return v


# ------------------------------------------------------------------------------------------ page
@router.get("/dashboard", response_class=HTMLResponse, include_in_schema=False)
@router.get("/dashboard/", response_class=HTMLResponse, include_in_schema=False)
async def page(request: Request) -> HTMLResponse:
    """The single-page dashboard (five views, polling its JSON API)."""
    root = request.scope.get("root_path", "").rstrip("/") + "/dashboard"
    html = (_HERE / "templates" / "index.html").read_text(encoding="utf-8").replace("{{ root }}", root)
    return HTMLResponse(html, headers={"Cache-Control": "no-store"})


# ------------------------------------------------------------------------------------ collection
def _window_text(window_s: float) -> str:
    """600 -> '10 min', 86400 -> '24 h'."""
    if window_s >= 86400 * 2:
        return f"{window_s / 86400:g} days"
    if window_s >= 3600:
        return f"{window_s / 3600:g} h"
    return f"{window_s / 60:g} min"


@router.get("/dashboard/api/collection", dependencies=[Depends(reader_caller)])
async def collection(request: Request, state: ServiceState = Depends(Service)) -> dict[str, Any]:
    """Steps and episodes per source / task / policy / status, step rates, active clients.

    The rate window ends now while steps keep coming; when the newest step is older than the
    window (a finished run), it ends at that step instead (``rates.live`` false), so the chart
    shows the run's last window of data rather than an empty one.
    """
    control, _ = _split(request)
    window = _num(control, "window_s", 600, 60, 30 * 86400)
    dash = _dash(request)
    now = time.time()
    agg = await state.db(dash.aggregates.current)
    latest = await state.db(state.overview.last_step_at)
    live = latest is None or latest >= now - window
    end = now if live else latest
    rates = await state.db(dash.rates.series, window, 60, end)
    clients = await state.db(state.overview.open_by_client)
    recent = await state.db(state.overview.recent_episodes, 12)
    active, agreed = await state.db(state.agreements.sync_clients)
    known = {c["client_id"] for c in clients}
    for c in clients:
        c["idle_s"] = round(now - c.pop("last_seen"), 1)
        c["agreed"] = c["client_id"] in agreed
    clients += [{"client_id": c, "open_episodes": 0, "idle_s": None, "task": None, "agreed": c in agreed}
                for c in sorted(active - known)]
    if live:
        title = f"steps per second by source, last {_window_text(window)}"
    else:
        ended = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(latest))
        title = f"steps per second by source, the {_window_text(window)} up to the newest step ({ended})"
    chart = svg.line_chart({k: [tuple(p) for p in v] for k, v in rates["series"].items()}, title,
                           y_label="steps/s", empty="no steps yet")
    return {"as_of": now, "steps": agg["steps"], "episodes": agg["episodes"], "snapshot": agg["snapshot"],
            "rates": {"window_s": window, "bucket_s": rates["bucket_s"], "counts": rates["counts"],
                      "live": live, "end": end, "title": title},
            "clients": clients, "recent_episodes": recent, "charts": {"rates": chart}}


# -------------------------------------------------------------------------------- representation
@router.get("/dashboard/api/steps", dependencies=[Depends(reader_caller)])
async def steps(request: Request, state: ServiceState = Depends(Service)) -> Response:
    """One page of steps matching a filter, newest first by default; ``has_more`` instead of a total.

    A row holding text UTF-8 cannot encode (stored before the gateway refused it) is served escaped and
    named under ``unreadable``, as the pool read API does.
    """
    control, f = _split(request)
    limit = int(_num(control, "limit", 50, 1, 500))
    offset = int(_num(control, "offset", 0, 0, 10_000_000))
    order = control.get("order", "-created")
    if order not in ("-created", "created", "episode"):
        raise ApiError(400, "order must be '-created', 'created' or 'episode'", param="order", code="invalid_value")
    rows = await state.db(state.overview.step_rows, f, limit + 1, offset, order)
    return readable_response({"data": rows[:limit], "has_more": len(rows) > limit, "limit": limit, "offset": offset},
                             rows="data")


def _pieces(backend: Any, policy: str, ids: list[int]) -> list[str] | None:
    try:
        return [backend.decode(policy, [t]) for t in ids]
    except Exception:  # a backend without this policy's tokenizer: the view shows ids only
        return None


@router.get("/dashboard/api/steps/{step_id}", dependencies=[Depends(reader_caller)])
async def step_detail(step_id: str, state: ServiceState = Depends(Service)) -> Response:
    """One step with tokens, decoded pieces, labels, its episode and the episode's other steps.

    Text UTF-8 cannot encode (in the step, its episode or a sibling) is served escaped, its paths named
    under ``unreadable``, as the pool read API does.
    """
    step = await state.db(state.lookup.get_step, step_id, with_tokens=True)
    d = step_json(step, True)
    prompt, response = list(step.prompt_ids), list(step.response_ids)
    cut = max(0, len(prompt) + len(response) - _MAX_TOKENS_SHOWN)
    cut = min(cut, len(prompt))
    d["tokens_view"] = {"prompt_skipped": cut, "prompt": prompt[cut:], "response": response,
                        "prompt_pieces": await state.cpu(_pieces, state.backend, step.policy, prompt[cut:]),
                        "response_pieces": await state.cpu(_pieces, state.backend, step.policy, response)}
    ep = await state.db(state.lookup.get_episode, step.episode_id)
    siblings = await state.db(state.overview.step_rows, StepFilter(episode_id=step.episode_id,
                                                                        include_excluded=True), 500, 0, "episode")
    labels = await state.db(state.overview.labels_of, [step.step_id, step.episode_id])
    d["episode"] = ep.model_dump(mode="json")
    d["episode_steps"] = siblings
    d["labels"] = {"step": labels.get(step.step_id, []), "episode": labels.get(step.episode_id, [])}
    return readable_response(d)


# -------------------------------------------------------------------------------------- curation
@router.get("/dashboard/api/count", dependencies=[Depends(reader_caller)])
async def count(request: Request, state: ServiceState = Depends(Service)) -> dict[str, Any]:
    """Live counts for a filter: matching steps and episodes (capped unless ``exact=true``)."""
    control, f = _split(request)
    exact = control.get("exact", "false").lower() in ("1", "true", "yes")
    cap = None if exact else int(_num(control, "cap", 10_000, 1, 10_000_000))
    t0 = time.perf_counter()
    out = await state.db(state.overview.capped_count, f, cap)
    if f.consumed is None:
        avail = await state.db(state.overview.capped_count, f.model_copy(update={"consumed": False}), cap)
    else:
        avail = out if f.consumed is False else {"steps": 0, "steps_capped": False}
    out["unconsumed"] = avail["steps"]
    out["unconsumed_capped"] = avail["steps_capped"]
    out["elapsed_ms"] = round(1e3 * (time.perf_counter() - t0), 1)
    out["cap"] = cap
    out["filter"] = f.model_dump(mode="json", exclude_defaults=True)
    return out


async def _trainer_filter(state: ServiceState, policy: str | None, staleness: int) -> tuple[StepFilter, dict[str, Any]]:
    """The filter ``policy``'s trainer leases with next, from its published lease plan (the first plan's
    policy when none is named), and where it came from; with no plan, the default trainable filter at the
    latest version, labelled as such."""
    plans = await state.db(state.leases.lease_plans)
    plan = next((p for p in plans if policy in (None, p["policy"])), None)
    if plan is not None:
        what = f", curation {plan['curation']}" if plan["curation"] else ""
        return StepFilter.model_validate(plan["filter"]), {
            "kind": "lease_plan", "policy": plan["policy"], "curation": plan["curation"], "version": plan["version"],
            "updated_at": plan["updated_at"], "policies": [p["policy"] for p in plans],
            "text": f"the filter of {plan['policy']}'s trainer's next lease (published at version {plan['version']}"
                    f"{what})"}
    policy = policy or "default"
    version = await state.db(state.versions.latest_version, policy)
    return loop.trainable_filter(policy, version, staleness), {
        "kind": "default", "policy": policy, "curation": None, "version": version, "updated_at": None,
        "policies": [p["policy"] for p in plans],
        "text": f"no trainer of {policy} has published a lease plan: the default trainable filter "
                f"(StepFilter.trainable) at the latest version {version}, staleness {staleness}"}


@router.get("/dashboard/api/curation", dependencies=[Depends(reader_caller)])
async def curation(request: Request, state: ServiceState = Depends(Service)) -> dict[str, Any]:
    """The trainer's filter (what its next lease takes: its lease plan, ``trainer_policy`` choosing among
    several) with how many steps match it now, saved curations, known values and recent labels."""
    control, f = _split(request, frozenset({"staleness", "trainer_policy"}))
    staleness = int(_num(control, "staleness", 1, 0, 1_000_000))  # without a plan: flows' train.max_staleness default
    trainer, source = await _trainer_filter(state, control.get("trainer_policy") or f.policy, staleness)
    matching = await state.db(state.overview.capped_count, trainer, 10_000)
    source |= {"matching_steps": matching["steps"], "matching_capped": matching["steps_capped"]}
    version = await state.db(state.versions.latest_version, source["policy"])
    labels = await state.db(state.overview.recent_labels, 30)
    saved = await state.db(state.reader.curations)
    agg = await state.db(_dash(request).aggregates.current)
    return {"trainer_filter": trainer.model_dump(mode="json", exclude_defaults=True), "trainer": source,
            "latest_version": version, "recent_labels": labels, "curations": [c.to_json() for c in saved],
            "values": {"policy": sorted(agg["steps"]["by_policy"]), "task": sorted(agg["steps"]["by_task"]),
                       "source": sorted(agg["steps"]["by_source"])},
            "admin_token_required": state.settings.admin_token is not None}


class CurationSaveIn(BaseModel):
    """Save the form's filter (query-string values, parsed like ``/dashboard/api/count``) as a curation."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=256)
    filter: dict[str, Any] = Field(default_factory=dict)
    note: str = Field(default="", max_length=10_000)


@router.post("/dashboard/api/curations")
async def save_curation(body: CurationSaveIn, caller: Caller = Depends(admin_caller),
                        state: ServiceState = Depends(Service)) -> dict[str, Any]:
    """Save the filter as curation ``name`` (a new version when it changed; see ``POST /v1/pool/curations``)."""
    f = parse_filter(_code_version({k: v for k, v in body.filter.items() if v != ""}))
    c = await state.write(state.reader.save_curation, body.name, f, note=body.note)
    return c.to_json()


class LabelsIn(BaseModel):
    """Label (and optionally exclude) steps or episodes."""

    model_config = ConfigDict(extra="forbid")
    target: Literal["step", "episode"]
    target_ids: list[str] = Field(min_length=1, max_length=1000)
    label: str = Field(min_length=1, max_length=256)
    exclude: bool = False
    note: str = Field(default="", max_length=10_000)


@router.post("/dashboard/api/labels")
async def add_labels(body: LabelsIn, caller: Caller = Depends(admin_caller),
                     state: ServiceState = Depends(Service)) -> dict[str, Any]:
    """Label each target; ``exclude: true`` keeps it out of every filter that does not ask for it,
    the trainer's lease included."""
    annotator = state.annotator

    def run() -> list[dict[str, Any]]:
        return [annotator.label(body.target, t, body.label, exclude=body.exclude, note=body.note).model_dump(mode="json")
                for t in dict.fromkeys(body.target_ids)]

    return {"labels": await state.write(run)}


class ExportIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    filter: dict[str, Any] = Field(default_factory=dict)
    with_tokens: bool = True


@router.post("/dashboard/api/export")
async def export(body: ExportIn, caller: Caller = Depends(admin_caller),
                 state: ServiceState = Depends(Service)) -> FileResponse:
    """The steps matching ``filter`` as a Parquet file (with exact token ids and logprobs by default)."""
    f = parse_filter(_code_version(body.filter))
    return await _download(state, lambda path: state.reader.export_parquet(f, path, with_tokens=body.with_tokens),
                           "swarm-steps-%Y%m%d-%H%M%S.parquet", "application/vnd.apache.parquet")


async def _download(state: ServiceState, write: Callable[[str], int], name_format: str, media_type: str) -> FileResponse:
    """``write(path)`` (returns the row count) into a temporary file, sent as a download named by
    ``name_format`` with an ``X-Rows`` header; the file is removed once sent, or at once on failure."""
    fd, path = tempfile.mkstemp(prefix="swarm-export-", suffix=os.path.splitext(name_format)[1])
    os.close(fd)
    try:
        n = await state.db(write, path)
    except BaseException:
        os.unlink(path)
        raise
    return FileResponse(path, media_type=media_type, filename=time.strftime(name_format),
                        headers={"X-Rows": str(n)}, background=BackgroundTask(os.unlink, path))


class ChatExportIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    filter: dict[str, Any] = Field(default_factory=dict)
    min_reward: float | None = Field(default=None, allow_inf_nan=False)


@router.post("/dashboard/api/export/jsonl")
async def export_jsonl(body: ChatExportIn, caller: Caller = Depends(admin_caller),
                       state: ServiceState = Depends(Service)) -> FileResponse:
    """The branches matching ``filter`` as chat-format JSONL for SFT (one row per branch; ``min_reward``)."""
    f = parse_filter(_code_version({k: v for k, v in body.filter.items() if v != ""}))
    return await _download(state, lambda path: state.reader.export_chat_jsonl(f, path, min_reward=body.min_reward),
                           "swarm-chat-%Y%m%d-%H%M%S.jsonl", "application/jsonl")


# -------------------------------------------------------------------------------- prefix merging
async def _batch_stats(state: ServiceState, dash: DashboardState, lease: dict[str, Any]) -> dict[str, Any]:
    cached = dash.merges.get(lease["lease_id"])
    if cached is not None:
        return cached
    seqs = await state.db(state.overview.sequences, lease_id=lease["lease_id"], limit=MAX_STEPS)
    stats = await state.cpu(merge_summary, seqs)
    if lease["state"] == "acked":  # a trained batch never changes
        dash.merges.put(lease["lease_id"], stats)
    return stats


@router.get("/dashboard/api/merging", dependencies=[Depends(reader_caller)])
@router.get("/dashboard/api/optimization", dependencies=[Depends(reader_caller)], include_in_schema=False)
async def merging(request: Request, state: ServiceState = Depends(Service)) -> dict[str, Any]:
    """Prefix merging: savings per batch (lease) over time, and the prefix tree of one batch or group.

    ``/dashboard/api/optimization`` is the same route under the view's former name.
    """
    control, _ = _split(request, frozenset({"lease_id", "group_id"}))
    dash = _dash(request)
    leases = await state.db(state.overview.recent_leases, 30)
    batches = []
    for ls in leases:
        st = await _batch_stats(state, dash, ls)
        batches.append({"lease_id": ls["lease_id"], "state": ls["state"], "created_at": ls["created_at"],
                        "consumed_version": ls["consumed_version"], "steps": st["steps"],
                        **{m: st[m] for m in ("none", "timeline", "tree")}})
    series = {f"{m} saving %": [(b["created_at"], b[m]["saving_pct"]) for b in batches if b["steps"]]
              for m in ("timeline", "tree")}
    tokens = {"before": [(b["created_at"], b["tree"]["tokens_before"]) for b in batches if b["steps"]],
              "after (tree)": [(b["created_at"], b["tree"]["tokens_after"]) for b in batches if b["steps"]]}
    lease_id, group_id = control.get("lease_id") or None, control.get("group_id") or None
    if lease_id is None and group_id is None:
        lease_id = next((b["lease_id"] for b in batches if b["steps"]), None)
    selected = None
    if lease_id is not None or group_id is not None:
        seqs = await state.db(state.overview.sequences, lease_id=lease_id, group_id=group_id,
                              limit=MAX_STEPS)
        if not seqs:
            raise NotFoundError("no steps in this batch or group", lease_id=lease_id, group_id=group_id)
        selected = {"lease_id": lease_id, "group_id": group_id,
                    "merge": await state.cpu(merge_summary, seqs),
                    "tree": await state.cpu(tree_view, seqs, state.backend.decode)}
    return {"batches": batches, "selected": selected,
            "charts": {"saving": svg.line_chart(series, "saving per batch", y_label="% tokens saved"),
                       "tokens": svg.line_chart(tokens, "tokens per batch", y_label="tokens", y_integer=True)}}


# ----------------------------------------------------------------------------------- consumption
def _several_types(vers: list[dict[str, Any]]) -> bool:
    return len({t for v in vers for t in v["episode_rewards"]}) > 1


def _reward_series(vers: list[dict[str, Any]]) -> dict[str, list[tuple[float, float, str]]]:
    """Per policy (and episode type, when there are several): (version, mean episode reward, note)."""
    several = _several_types(vers)
    out: dict[str, list[tuple[float, float, str]]] = {}
    for v in vers:
        for typ, e in v["episode_rewards"].items():
            name = f"{v['policy']} ({typ})" if several else v["policy"]
            out.setdefault(name, []).append((v["version"], e["reward_mean"], f"{e['episodes']} episodes"))
    return dict(sorted(out.items()))


@router.get("/dashboard/api/consumption", dependencies=[Depends(reader_caller)])
async def consumption(request: Request, state: ServiceState = Depends(Service)) -> dict[str, Any]:
    """Leases and acks over time, steps consumed per version, staleness, reward per version."""
    dash = _dash(request)
    agg = await state.db(dash.aggregates.current)
    now = time.time()
    leases = await state.db(state.overview.recent_leases, 500)
    totals = await state.db(state.overview.lease_totals, now)
    versions = await state.db(state.overview.versions, 200)
    cum_leased, cum_acked, a, b = [], [], 0, 0
    for ls in sorted(leases, key=lambda x: x["created_at"]):
        a += ls["n_steps"]
        cum_leased.append((ls["created_at"], a))
        if ls["state"] == "acked":
            b += ls["n_steps"]
            cum_acked.append((ls["created_at"], b))
    vers = agg["versions"]
    policies = sorted({v["policy"] for v in vers})
    reward = _reward_series(vers)
    consumed_versions = sorted({v["version"] for v in vers if v["consumed_by_this_update"]})
    consumed = {p: [next((v["consumed_by_this_update"] for v in vers if v["policy"] == p and v["version"] == cv), 0)
                    for cv in consumed_versions] for p in policies}
    made = sorted({v["version"] for v in vers if v["steps"]})
    generated = {p: [next((v["steps"] for v in vers if v["policy"] == p and v["version"] == mv), 0) for mv in made]
                 for p in policies}
    stale = agg["staleness"]
    mixed = sum(agg["mixed_episodes"].values())
    reward_note = (f"Mean final reward of finished episodes whose steps were all generated by that policy "
                   f"version (one line per policy{', and per episode type' if _several_types(vers) else ''}). "
                   + ("No finished episode spans versions." if mixed == 0 else
                      f"{mixed} finished episode{'s' if mixed != 1 else ''} spanning versions "
                      f"{'are' if mixed != 1 else 'is'} left out."))
    charts = {
        "leases": svg.line_chart({"steps leased": cum_leased, "steps acked": cum_acked},
                                 "leases and acks over time", y_label="steps (cumulative, recent leases)",
                                 y_integer=True),
        "consumed": svg.bar_chart([f"v{v}" for v in consumed_versions], consumed,
                                  "steps consumed by the update that made each version", y_label="steps",
                                  x_label="policy version made by the update"),
        "generated": svg.bar_chart([f"v{v}" for v in made], generated, "steps generated per policy version",
                                   y_label="steps", x_label="policy version that generated the steps"),
        "staleness": svg.bar_chart([str(k) for k in stale], {"steps": list(stale.values())},
                                   "staleness of consumed steps (versions behind the trainer)", y_label="steps",
                                   x_label="versions behind the trainer"),
        "reward": svg.line_chart(reward, "mean final reward of episodes generated by one policy version",
                                 time_axis=False, y_min=None, y_label="mean episode reward",
                                 x_label="policy version (every step of the episode)", x_integer=True,
                                 empty="no finished episode with a final reward played by one version yet"),
    }
    return {"as_of": now, "lease_totals": totals, "versions": vers, "staleness": stale,
            "mixed_episodes": agg["mixed_episodes"], "reward_note": reward_note,
            "steps": agg["steps"], "snapshot": agg["snapshot"],
            "recent_leases": [{k: v for k, v in ls.items() if k != "filter"} for ls in leases[:20]],
            "policy_versions": versions[:50], "charts": charts}
